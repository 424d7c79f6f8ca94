"""The one place the two wings meet: ``transform`` that lints what it returns.

:func:`fxquant.quant.transform` inserts quantization points; this wrapper hands the result
to :func:`fxquant.linter.lint_graph` (``lint="warn"`` by default). ``quant`` and
``linter`` never import each other.

A model that takes dicts (a heterogeneous GNN) is traced here with its example inputs
(:func:`fxquant.trace`), and the structures of its dicts travel with the model:
:func:`fxquant.save` writes them beside the trace arguments, and :func:`load` traces the
user's model with them again.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.fx import GraphModule

from fxquant import quant
from fxquant.errors import FxquantValueError
from fxquant.formats import Format
from fxquant.fx.lazy import refuse_lazy
from fxquant.fx.selectors import LayerSpec
from fxquant.fx.structure import ExampleStructure, has_placeholders
from fxquant.fx.tracer import STRUCTURE_KEY, LeafSpec, refuse_compiled, trace
from fxquant.linter import LintError, lint_graph
from fxquant.quant.api import TRACE_KEY, NodeFormats

__all__ = ["load", "transform"]

#: The entry of a saved trace record that holds a dict model's structures.
_STRUCTURE_ENTRY = "structure"

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
    example_inputs: tuple[Any, ...] | None = None,
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
        example_inputs (tuple, optional): forward's positional arguments, e.g.
            ``(data.x_dict, data.edge_index_dict)``: a model that takes or returns dicts
            (a heterogeneous GNN) needs them for their keys (:func:`fxquant.trace`).
            (default: :obj:`None`)
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
    structured = example_inputs is not None or (isinstance(concrete_args, dict) and any(
        has_placeholders(v) for v in concrete_args.values()))
    if structured and not isinstance(model, GraphModule) and isinstance(model, nn.Module):
        # traced here, with its structures; quant.transform then rounds the GraphModule
        refuse_compiled(model, "transform")
        refuse_lazy(model, "transform")
        traced = trace(model, concrete_args, leaf_modules, example_inputs=example_inputs)
        kept = {k: v for k, v in (concrete_args or {}).items() if not has_placeholders(v)}
        model, concrete_args = traced, kept or None
    gm = quant.transform(
        model, mapping, bits=bits, format=format, scale=scale, decay=decay, momentum=momentum,
        layers=layers,
        rounding=rounding, grad=grad, grad_bits=grad_bits, grad_format=grad_format,
        node_formats=node_formats, inplace=inplace, concrete_args=concrete_args,
        leaf_modules=leaf_modules)
    _remember_structure(gm)
    _points_in_mode(gm)
    if lint != "off":
        report = lint_graph(gm, note=False)
        if lint == "raise" and report.errors:
            raise LintError(report)
        for f in report.findings:
            if f.severity != "info":
                warnings.warn(f"fxquant lint {f.rule} ({f.severity}) at {f.where or f.node}: "
                              f"{f.message} Hint: {f.hint}", stacklevel=2)
    return gm


def _remember_structure(gm: GraphModule) -> None:
    """Add the structures ``gm`` was traced with to the trace record :func:`fxquant.save`
    writes (JSON)."""
    structure = gm.meta.get(STRUCTURE_KEY)
    record = getattr(gm, TRACE_KEY, None)
    if isinstance(structure, ExampleStructure) and structure and isinstance(record, dict):
        record[_STRUCTURE_ENTRY] = structure.to_json()


def load(path: str | os.PathLike[str], model: nn.Module,
         leaf_modules: Iterable[LeafSpec] | None = None) -> GraphModule:
    """Rebuild a model written by :func:`fxquant.save` from the user's own (untransformed)
    ``model``, as :func:`fxquant.quant.load` does; a model that takes dicts is traced again
    with the keys saved with it, so no example inputs are needed.

    Args:
        path (str or Path): a file :func:`fxquant.save` wrote.
        model (torch.nn.Module): a fresh instance of the model that was transformed (its
            weights are replaced by the saved ones).
        leaf_modules (iterable, optional): the ``leaf_modules`` classes of the original
            transform, when the saved names cannot be found among ``model``'s submodules.

    Example:
        >>> import os, tempfile, fxquant
        >>> from torch_geometric.nn import HeteroConv, SAGEConv
        >>> def make():
        ...     torch.manual_seed(0)
        ...     return HeteroConv({("user", "rates", "item"): SAGEConv((4, 4), 8),
        ...                        ("item", "rev_rates", "user"): SAGEConv((4, 4), 8)})
        >>> class Model(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.conv = make()
        ...     def forward(self, x_dict, edge_index_dict):
        ...         return self.conv(x_dict, edge_index_dict)
        >>> x_dict = {"user": torch.randn(3, 4), "item": torch.randn(2, 4)}
        >>> edge_index_dict = {("user", "rates", "item"): torch.tensor([[0, 2], [1, 0]]),
        ...                    ("item", "rev_rates", "user"): torch.tensor([[1, 0], [0, 2]])}
        >>> gm = fxquant.transform(Model(), format="int8", scale="tensor",
        ...                        example_inputs=(x_dict, edge_index_dict))
        >>> path = os.path.join(tempfile.mkdtemp(), "hetero.pt")
        >>> fxquant.save(gm, path)
        >>> again = fxquant.load(path, Model())
        >>> torch.equal(again(x_dict, edge_index_dict)["item"], gm(x_dict, edge_index_dict)["item"])
        True
    """
    saved = _saved_structure(path)
    leaves = None
    if saved is not None:
        structure, record = saved
        leaves = list(leaf_modules) if leaf_modules is not None else _saved_leaves(model, record)
    if saved is None or leaves is None:  # (a saved class the model lacks: quant.load says)
        gm = quant.load(path, model, leaf_modules)
    else:
        traced = trace(model, record.get("concrete_args"), leaves, structure=structure)
        gm = quant.load(path, traced, leaves)
        _remember_structure(gm)
    _points_in_mode(gm)
    return gm


def _points_in_mode(gm: GraphModule) -> None:
    """The quantization points take the model's mode (a model transformed or loaded in
    evaluation rounds with its running ranges, and does not update them)."""
    for _, point in quant.quantization_points(gm):
        point.train(gm.training)


def _saved_structure(path: str | os.PathLike[str]) -> tuple[ExampleStructure, dict[str, Any]] | None:
    """The structures and trace record in a file :func:`fxquant.save` wrote, or None where
    it has none (or is no such file: :func:`fxquant.quant.load` then says why)."""
    try:
        blob = torch.load(path, weights_only=True)
        record = json.loads(blob["trace"])
        data = record[_STRUCTURE_ENTRY]
    except Exception:  # not readable, or no structure: quant.load reports or loads it
        return None
    try:
        return ExampleStructure.from_json(data), record
    except FxquantValueError as e:
        raise FxquantValueError(f"fxquant.load: {path}: its saved dict structures cannot be "
                                f"read ({e}); the file was edited, please save the model "
                                "again with fxquant.save") from e


def _saved_leaves(model: nn.Module, record: dict[str, Any]) -> list[LeafSpec] | None:
    """The saved leaf modules: names as they are, classes found among ``model``'s modules;
    None where a saved class is not among them."""
    classes = {f"{type(m).__module__}.{type(m).__qualname__}": type(m) for m in model.modules()}
    names = [n for n in record.get("leaf_names", []) if isinstance(n, str)]
    wanted = [c for c in record.get("leaf_classes", []) if isinstance(c, str)]
    if any(c not in classes for c in wanted):
        return None
    return [*names, *(classes[c] for c in wanted)]
