"""fxquant: simulate reduced float precision between the layers of PyTorch / PyG models.

Importing fxquant registers the ``torch.ops.fxquant.truncate`` and ``quantize`` ops, which
transformed GraphModules call (import it before ``torch.load`` of a saved one).
"""

from fxquant.formats import Format
from fxquant.numerics import truncate
from fxquant.passes.functionalize import functionalize_inplace
from fxquant.passes.insert_truncation import transform
from fxquant.passes.lint import lint
from fxquant.quantize import quantize
from fxquant.report import Finding, LintError, LintReport, summary
from fxquant.sanitizer import check
from fxquant.selection import top_degree_nodes
from fxquant.tracer import TraceError, trace

__version__ = "0.1.0"

__all__ = [
    "Finding",
    "Format",
    "LintError",
    "LintReport",
    "TraceError",
    "check",
    "functionalize_inplace",
    "lint",
    "quantize",
    "summary",
    "top_degree_nodes",
    "trace",
    "transform",
    "truncate",
]
