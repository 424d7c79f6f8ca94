"""The one place the two wings meet: ``transform`` that lints what it returns.

:func:`fxquant.quant.transform` inserts quantization points; this wrapper hands the result
to :func:`fxquant.linter.lint_graph` (``lint="warn"`` by default). ``quant`` and
``linter`` never import each other.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn
from torch.fx import GraphModule

from fxquant import quant
from fxquant.errors import FxquantValueError
from fxquant.linter import LintError, lint_graph

__all__ = ["transform"]

_LINT_MODES = ("warn", "raise", "off")


def transform(model: nn.Module, mapping: Any = None, *, lint: str = "warn",
              **kwargs: Any) -> GraphModule:
    """:func:`fxquant.quant.transform`, then lint the graph it returns.

    Args:
        model, mapping, **kwargs: as :func:`fxquant.quant.transform` (``bits=``,
            ``format=``, ``layers=``, ``node_bits=``, ...).
        lint (str, optional): ``"warn"`` turns findings into warnings (default),
            ``"raise"`` raises :class:`fxquant.LintError` on errors, ``"off"`` skips it.

    Example:
        >>> import warnings
        >>> from torch_geometric.nn.models import GCN
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     gm = transform(GCN(4, 8, num_layers=2, out_channels=2), bits=10, grad="zero")
        >>> [str(w.message).split(":")[0] for w in caught]
        ['fxquant lint FXQ007 (warning) at convs_0_quant', 'fxquant lint FXQ007 (warning) at convs_1_quant']
    """
    if lint not in _LINT_MODES:
        raise FxquantValueError(f"fxquant.transform: lint={lint!r} is not one of {list(_LINT_MODES)}")
    gm = quant.transform(model, mapping, **kwargs)
    if lint != "off":
        report = lint_graph(gm, note=False)
        if lint == "raise" and report.errors:
            raise LintError(report)
        for f in report.findings:
            if f.severity != "info":
                warnings.warn(f"fxquant lint {f.rule} ({f.severity}) at {f.where or f.node}: "
                              f"{f.message} Hint: {f.hint}", stacklevel=2)
    return gm

