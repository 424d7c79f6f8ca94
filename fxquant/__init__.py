"""fxquant: simulate reduced precision inside and between the layers of unmodified PyTorch /
PyG models, and find the autograd traps that break such experiments.

Architecture (imports flow one way, top to bottom; the two wings never import each other):

- floors: :mod:`fxquant.formats` (numbers), :mod:`fxquant.modes` (rounding / gradient /
  scale vocabulary), :mod:`fxquant._ops` (the registered ops and their kernels; no torch.fx)
- :mod:`fxquant.fx`: the GNN-aware tracer, standardisation passes, selectors, source
  locations, the process-wide lock
- wings: :mod:`fxquant.quant` (configs, mapping, observers, the insertion pass,
  ``truncate``/``quantize``/``transform``, ``summary``) and :mod:`fxquant.linter`
  (rules, reports, state restoration, symbolic and dynamic lint, ``check``,
  ``functionalize_inplace``)
- :mod:`fxquant.execution` (above the quant wing): ``convert`` a trained transformed model
  to integer kernels, check it against the simulation, save it, export it to ONNX
- top: :mod:`fxquant.pipeline` (``transform`` that lints its result), :mod:`fxquant.cli`,
  :mod:`fxquant.testing` (helpers for users' test suites), and this module, which only
  re-exports.

Importing fxquant registers the ``torch.ops.fxquant.*`` ops, which transformed models call
(import it before ``torch.load`` of a saved one).
"""

from fxquant import _safe_path  # noqa: F401  (first: `python -m fxquant` ignores the cwd)

# isort: split
from fxquant import datasets as datasets  # (reachable as fxquant.datasets, not re-exported)
from fxquant import execution, recipes, testing
from fxquant import planted as planted  # (reachable as fxquant.planted, not re-exported)
from fxquant._version import __version__ as __version__
from fxquant.errors import FxquantError
from fxquant.execution import ConversionError, ConvertedModel, convert
from fxquant.formats import CustomFormat, Format, IntFormat, TopN, register_format
from fxquant.fx import GNNTracer, TraceError, trace
from fxquant.fx.standardize import fast_dropout
from fxquant.linter import (
    Finding,
    FunctionalizeError,
    LintError,
    LintReport,
    ShapeSpec,
    check,
    functionalize_inplace,
    lint,
)
from fxquant.modes import Grad, Rounding, Scale, ScaleKind, register_scale
from fxquant.pipeline import load, transform
from fxquant.quant import (
    BitReport,
    NodeBits,
    NodeOverride,
    Protection,
    QuantConfig,
    QuantMapping,
    QuantPoint,
    Site,
    SiteKind,
    bit_penalty,
    bit_report,
    quantization_points,
    quantize,
    refit_steps,
    register_site,
    save,
    share_bits,
    share_step,
    summary,
    top_degree_nodes,
    truncate,
)

__all__ = [
    "BitReport",
    "ConversionError",
    "ConvertedModel",
    "CustomFormat",
    "Finding",
    "Format",
    "FunctionalizeError",
    "FxquantError",
    "GNNTracer",
    "Grad",
    "IntFormat",
    "LintError",
    "LintReport",
    "NodeBits",
    "NodeOverride",
    "Protection",
    "QuantConfig",
    "QuantMapping",
    "QuantPoint",
    "Rounding",
    "Scale",
    "ScaleKind",
    "ShapeSpec",
    "Site",
    "SiteKind",
    "TopN",
    "TraceError",
    "bit_penalty",
    "bit_report",
    "check",
    "convert",
    "execution",
    "fast_dropout",
    "functionalize_inplace",
    "lint",
    "load",
    "quantization_points",
    "quantize",
    "recipes",
    "refit_steps",
    "register_format",
    "register_scale",
    "register_site",
    "save",
    "share_bits",
    "share_step",
    "summary",
    "testing",
    "top_degree_nodes",
    "trace",
    "transform",
    "truncate",
]

