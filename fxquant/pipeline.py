"""The one place the two wings meet: ``transform`` that lints what it returns.

:func:`fxquant.quant.transform` inserts quantization points; this wrapper hands the result
to :func:`fxquant.linter.lint_graph` (``lint="warn"`` by default). ``quant`` and
``linter`` never import each other.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn
from torch.fx import GraphModule

from fxquant import quant
from fxquant.errors import FxquantValueError
from fxquant.formats import Format
from fxquant.fx.selectors import LayerSpec
from fxquant.fx.tracer import LeafSpec
from fxquant.linter import LintError, lint_graph
from fxquant.quant.api import NodeFormats

__all__ = ["transform"]

_LINT_MODES = ("warn", "raise", "off")


def transform(
    model: nn.Module,
    mapping: quant.QuantMapping | quant.QuantConfig | int | Mapping[str, Any] | None = None,
    *,
    bits: int | Mapping[str, int | str | Format] | None = None,
    format: str | Format | tuple[int, int] | Mapping[str, int | str | Format] | None = None,
    scale: str | None = None,
    decay: float | None = None,
    layers: LayerSpec | Iterable[LayerSpec] | None = None,
    rounding: str | None = None,
    grad: str | None = None,
    grad_bits: int | None = None,
    grad_format: str | Format | tuple[int, int] | None = None,
    node_formats: Mapping[str, NodeFormats] | None = None,
    inplace: bool = False,
    concrete_args: dict[str, Any] | None = None,
    leaf_modules: Iterable[LeafSpec] = (),
    lint: str = "warn",
    momentum: float | None = None,
) -> GraphModule:
    """Trace ``model``, round values where ``mapping`` (or the keywords) say, and lint the
    result.

    The general form is ``transform(model, mapping)`` with a :class:`fxquant.QuantMapping`
    (which layer and site gets which :class:`fxquant.QuantConfig`) or one QuantConfig for
    every GNN layer. The keywords ``bits``, ``format``, ``scale``, ``decay``,
    ``rounding``, ``grad``, ``grad_bits`` and ``grad_format`` are a short way to build one
    config; given together with a config or mapping they are an error, never dropped.

    Args:
        model (torch.nn.Module): the unmodified model (a PyG GNN, any FX-traceable module, or
            a GraphModule). It is not changed: by default the pass works on a deep copy.
        mapping (QuantMapping or QuantConfig, optional): the general form. A QuantConfig
            applies to every ``MessagePassing`` layer (or to ``layers=``); with a
            QuantMapping, ``layers=`` keeps only its points on those layers. An ``int`` or a
            dict here means ``bits=``.
        bits (int or dict, optional): keep the top ``bits`` of each value's pattern
            (:func:`fxquant.truncate`) after every selected layer; or a dict
            ``{layer: bits_or_format}`` that handles exactly the listed layers.
        format (str, Format or tuple, optional): round to a format instead
            (:func:`fxquant.quantize`): ``"e4m3"``, ``"int8"``, ``(3, 2)``, ``"mxfp4"``, a
            format and its scale (``"int8:row"``), ...
        scale (str, optional): for formats: ``"none"`` (a plain cast), ``"tensor"``,
            ``"row"``, a ``"-pow2"`` variant or ``"block32"``. (default: :obj:`None`: left
            out, a plain cast; an integer format then warns, its grid having a step of 1)
        decay (float, optional): with ``scale="tensor"``, keep a running range
            ``decay * running + (1 - decay) * batch`` and use it in evaluation (``decay``:
            the old range's weight, e.g. ``0.9``; BatchNorm's ``momentum=0.1``).
            (default: :obj:`None`)
        layers (optional): which layers: submodule names (``"conv1"``), FX node names of
            functions (``"sigmoid"``), fnmatch patterns (``"conv*"``), module classes,
            predicates on the ``torch.fx.Node``, or a list of these. (default: every
            ``MessagePassing`` layer)
        rounding (str, optional): ``"toward_zero"``, ``"nearest"`` or ``"stochastic"``.
            (default: :obj:`None`: toward_zero for kept bits, nearest for formats)
        grad (str, optional): ``"ste"`` (straight-through) or ``"zero"`` (the true
            derivative). (default: :obj:`None`: ``"ste"``)
        grad_bits, grad_format (optional): also round the gradient flowing back through
            each point, to kept bits or a format. (default: :obj:`None`)
        node_formats (dict, optional): ``{layer: (node_ids, format)}``: rows of these nodes
            get another format (e.g. the hubs from :func:`fxquant.top_degree_nodes`).
            (default: :obj:`None`)
        inplace (bool, optional): share parameters and buffers with ``model`` instead of
            copying them; ``model`` itself computes as before (a layer rounded inside is
            replaced by a copy sharing its tensors), except that a ``GraphModule`` passed
            in is the one transformed. (default: :obj:`False`)
        concrete_args (dict, optional): arguments fixed while tracing (:func:`fxquant.trace`).
        leaf_modules (optional): module classes or qualified names traced as single calls.
        lint (str, optional): ``"warn"`` turns findings into warnings, ``"raise"`` raises
            :class:`fxquant.LintError` on errors, ``"off"`` skips it. (default: ``"warn"``)
        momentum (float, optional): the old name of ``decay`` (the same number: not
            BatchNorm's momentum); deprecated, with a :class:`FutureWarning`.

    Returns:
        torch.fx.GraphModule: the model with a :class:`fxquant.QuantPoint` at each
        quantization point; it also takes ``node_ids=`` (a mini-batch's global node ids).

    Example:
        >>> import warnings
        >>> from torch_geometric.nn.models import GCN
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     gm = transform(GCN(4, 8, num_layers=2, out_channels=2), bits=10, grad="zero")
        >>> [str(w.message).split(":")[0] for w in caught]
        ['fxquant lint FXQ007 (warning) at convs_0_quant', 'fxquant lint FXQ007 (warning) at convs_1_quant']
        >>> from fxquant import QuantConfig
        >>> transform(GCN(4, 8, num_layers=2, out_channels=2), QuantConfig(16), bits=8)
        Traceback (most recent call last):
        ...
        fxquant.errors.FxquantValueError: fxquant.transform: bits=8 and a QuantConfig were both \
given, and the QuantConfig already says how values are rounded; please put format= into it \
(e.g. QuantConfig(..., format=...)) or drop the QuantConfig.
    """
    if lint not in _LINT_MODES:
        raise FxquantValueError(f"fxquant.transform: lint={lint!r} is not one of {list(_LINT_MODES)}")
    gm = quant.transform(
        model, mapping, bits=bits, format=format, scale=scale, decay=decay, momentum=momentum,
        layers=layers,
        rounding=rounding, grad=grad, grad_bits=grad_bits, grad_format=grad_format,
        node_formats=node_formats, inplace=inplace, concrete_args=concrete_args,
        leaf_modules=leaf_modules)
    if lint != "off":
        report = lint_graph(gm, note=False)
        if lint == "raise" and report.errors:
            raise LintError(report)
        for f in report.findings:
            if f.severity != "info":
                warnings.warn(f"fxquant lint {f.rule} ({f.severity}) at {f.where or f.node}: "
                              f"{f.message} Hint: {f.hint}", stacklevel=2)
    return gm
