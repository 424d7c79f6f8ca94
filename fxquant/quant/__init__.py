"""The quantization wing: configs and mapping, the quantization point and its parts, the
insertion pass, the public calls that round tensors and models, and the summary of what a
model rounds where.

Modules, one concept each: :mod:`~fxquant.quant.config` (``QuantConfig``),
:mod:`~fxquant.quant.site`, :mod:`~fxquant.quant.protection`,
:mod:`~fxquant.quant.node_bits` and :mod:`~fxquant.quant.override` (what a config says),
:mod:`~fxquant.quant.mapping` (which point gets which config); the point
(:mod:`~fxquant.quant.points`) and its parts (:mod:`~fxquant.quant.observers`,
:mod:`~fxquant.quant.learned_step`, :mod:`~fxquant.quant.node_widths`,
:mod:`~fxquant.quant.override_mask`, :mod:`~fxquant.quant.protective_mask`), its read
interface (:mod:`~fxquant.quant.grid`); the pass (:mod:`~fxquant.quant.insert`,
:mod:`~fxquant.quant.sites`), :mod:`~fxquant.quant.api` (``transform``),
:mod:`~fxquant.quant.sharing`, :mod:`~fxquant.quant.bits`, :mod:`~fxquant.quant.describe`,
:mod:`~fxquant.quant.persist`.
"""

from fxquant.quant.api import transform
from fxquant.quant.bits import BitReport, bit_penalty, bit_report
from fxquant.quant.config import QuantConfig
from fxquant.quant.describe import quantization_points, summary
from fxquant.quant.functional import quantize, truncate
from fxquant.quant.grid import IntegerGrid
from fxquant.quant.mapping import QuantMapping
from fxquant.quant.node_bits import NodeBits
from fxquant.quant.nodes import top_degree_nodes
from fxquant.quant.observers import RangeObserver
from fxquant.quant.override import NodeOverride
from fxquant.quant.persist import load, save
from fxquant.quant.points import QuantPoint
from fxquant.quant.protection import Protection
from fxquant.quant.sharing import refit_steps, share_bits, share_step
from fxquant.quant.site import Site, SiteKind, register_site

__all__ = [
    "BitReport",
    "IntegerGrid",
    "NodeBits",
    "NodeOverride",
    "Protection",
    "QuantConfig",
    "QuantMapping",
    "QuantPoint",
    "RangeObserver",
    "Site",
    "SiteKind",
    "bit_penalty",
    "bit_report",
    "load",
    "quantization_points",
    "quantize",
    "refit_steps",
    "register_site",
    "save",
    "share_bits",
    "share_step",
    "summary",
    "top_degree_nodes",
    "transform",
    "truncate",
]
