"""The quantization wing: configs and mapping, observers, the insertion pass, the public
calls that round tensors and models, and the summary of what a model rounds where."""

from fxquant.quant.api import transform
from fxquant.quant.bits import BitReport, bit_penalty, bit_report
from fxquant.quant.config import NodeOverride, QuantConfig, QuantMapping, RowBits, Site
from fxquant.quant.describe import quantization_points, summary
from fxquant.quant.functional import quantize, truncate
from fxquant.quant.nodes import top_degree_nodes
from fxquant.quant.observers import RangeObserver
from fxquant.quant.persist import load, save
from fxquant.quant.points import QuantPoint, refit_steps, share_bits, share_step

__all__ = [
    "BitReport",
    "NodeOverride",
    "QuantConfig",
    "QuantMapping",
    "QuantPoint",
    "RangeObserver",
    "RowBits",
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
