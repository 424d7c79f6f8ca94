"""The quantization wing: configs and mapping, observers, the insertion pass, the public
calls that round tensors and models, and the summary of what a model rounds where."""

from fxquant.errors import warn_renamed
from fxquant.quant.api import transform
from fxquant.quant.bits import BitReport, bit_penalty, bit_report
from fxquant.quant.config import (
    NodeBits,
    NodeOverride,
    Protection,
    QuantConfig,
    QuantMapping,
    Site,
)
from fxquant.quant.describe import quantization_points, summary
from fxquant.quant.functional import quantize, truncate
from fxquant.quant.nodes import top_degree_nodes
from fxquant.quant.observers import RangeObserver
from fxquant.quant.persist import load, save
from fxquant.quant.points import QuantPoint, refit_steps, share_bits, share_step

__all__ = [
    "BitReport",
    "NodeBits",
    "NodeOverride",
    "Protection",
    "QuantConfig",
    "QuantMapping",
    "QuantPoint",
    "RangeObserver",
    "Site",
    "bit_penalty",
    "bit_report",
    "load",
    "quantization_points",
    "quantize",
    "refit_steps",
    "save",
    "share_bits",
    "share_step",
    "summary",
    "top_degree_nodes",
    "transform",
    "truncate",
]


def __getattr__(name: str) -> object:
    if name == "RowBits":  # the name NodeBits had before
        warn_renamed("fxquant.RowBits", "fxquant.NodeBits")
        return NodeBits
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
