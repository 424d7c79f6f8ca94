"""A torch.fx tracer that sees a PyG model the way its author wrote it.

Plain :func:`torch.fx.symbolic_trace` walks into ``MessagePassing.propagate`` and fails
("``propagate`` only supports integer tensors of shape ``[2, num_messages]``"). The
:class:`GNNTracer` keeps every ``MessagePassing`` module (GCNConv, SAGEConv, GATConv, ...)
as one leaf ``call_module`` node, like PyG's own tests do, and records where each node
came from in ``node.meta["stack_trace"]``.
"""

from __future__ import annotations

import inspect
import os
import traceback
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx import Graph, GraphModule, Node, Tracer, map_arg
from torch.fx.operator_schemas import normalize_function
from torch_geometric.nn import MessagePassing

__all__ = ["GNNTracer", "TraceError", "trace"]

LeafSpec = str | type[nn.Module]


class TraceError(RuntimeError):
    """A model could not be traced symbolically; the message names the user's source line."""


class GNNTracer(Tracer):
    """:class:`torch.fx.Tracer` that keeps PyG ``MessagePassing`` modules as leaves.

    Args:
        leaf_modules (iterable, optional): more modules to keep opaque, as classes or
            qualified names (``"encoder.block0"``). (default: :obj:`()`)

    Example:
        >>> from torch_geometric.nn import GCNConv
        >>> class GCN(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.conv1, self.conv2 = GCNConv(4, 8), GCNConv(8, 2)
        ...     def forward(self, x, edge_index):
        ...         return self.conv2(self.conv1(x, edge_index).relu(), edge_index)
        >>> graph = GNNTracer().trace(GCN())
        >>> [n.op for n in graph.nodes]
        ['placeholder', 'placeholder', 'call_module', 'call_method', 'call_module', 'output']
    """

    def __init__(self, leaf_modules: Iterable[LeafSpec] = ()) -> None:
        super().__init__()
        self.record_stack_traces = True
        specs = tuple(leaf_modules)
        for spec in specs:
            if not (isinstance(spec, str) or (isinstance(spec, type) and issubclass(spec, nn.Module))):
                raise TypeError(
                    f"leaf_modules entries must be module classes or qualified names, got {spec!r}"
                )
        self._leaf_names = {s for s in specs if isinstance(s, str)}
        self._leaf_types = tuple(s for s in specs if isinstance(s, type))

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if isinstance(m, (MessagePassing, *self._leaf_types)):
            return True
        if module_qualified_name in self._leaf_names:
            return True
        return super().is_leaf_module(m, module_qualified_name)


def _user_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of the traceback that is not torch's, fxquant's or Python's."""
    internal = (
        *(os.path.dirname(m.__file__) + os.sep for m in (torch, inspect) if m.__file__),
        os.path.dirname(__file__) + os.sep,
    )
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith(internal) and not f.filename.startswith("<")
    ]
    return frames[-1] if frames else None


def _default_args(model: nn.Module) -> dict[str, Any]:
    """forward's arguments that have defaults, at their default values."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    return {
        k: p.default
        for k, p in params.items()
        if p.default is not inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def trace(
    model: nn.Module,
    concrete_args: dict[str, Any] | None = None,
    leaf_modules: Iterable[LeafSpec] = (),
) -> GraphModule:
    """Symbolically trace ``model`` into a :class:`~torch.fx.GraphModule`, GNN layers as leaves.

    Functional dropout written as ``F.dropout(x, p, training=self.training)`` (PyG's examples
    do this) would be frozen into the graph in the mode it was traced in. The model is
    therefore traced in both modes; a dropout whose ``training`` flag follows the mode
    becomes an ``nn.Dropout`` submodule, so ``gm.train()`` / ``gm.eval()`` keep working.

    Args:
        model (torch.nn.Module): the model, unmodified. It is not copied: the GraphModule
            shares its submodules and parameters.
        concrete_args (dict, optional): forward arguments to fix while tracing, as in
            :func:`torch.fx.symbolic_trace`. When it is :obj:`None` and the plain trace fails,
            arguments that have a default (PyG's ``edge_weight=None``, ``batch=None``, ...)
            are fixed to it and tracing is tried once more; the GraphModule then checks at
            run time that they are left at their defaults. (default: :obj:`None`)
        leaf_modules (iterable, optional): more modules to keep as opaque calls, as classes
            or qualified names. (default: :obj:`()`)

    Raises:
        TraceError: the model has code symbolic tracing cannot follow; the message names
            its source line and suggests ``concrete_args`` or ``leaf_modules``.

    Example:
        >>> from torch_geometric.nn.models import GCN
        >>> gm = trace(GCN(in_channels=4, hidden_channels=8, num_layers=2, out_channels=2))
        >>> [n.target for n in gm.graph.nodes if n.op == "call_module"]
        ['convs.0', 'norms.0', 'act', 'dropout', 'convs.1']
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"fxquant.trace expects a torch.nn.Module, got {type(model).__name__}")
    modes = {name: m.training for name, m in model.named_modules()}
    # Tracing runs forward's Python: undo global switches it makes (set_detect_anomaly).
    anomaly = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
    grad_mode = torch.is_grad_enabled()
    try:
        model.train(True)
        train_graph, train_consts, concrete_args = _trace(model, concrete_args, leaf_modules)
        model.train(False)
        eval_graph, eval_consts, _ = _trace(model, concrete_args, leaf_modules)
    finally:
        for name, m in model.named_modules():
            m.training = modes.get(name, m.training)
        torch.set_anomaly_enabled(*anomaly)
        torch.set_grad_enabled(grad_mode)
    graph, consts = (train_graph, train_consts) if model.training else (eval_graph, eval_consts)
    gm = GraphModule({**_attributes(model, graph), **consts}, graph, type(model).__name__)
    gm.training = model.training
    _follow_training_flag(gm, train_graph, eval_graph)
    return gm


def _attributes(model: nn.Module, graph: Graph) -> dict[str, Any]:
    """The submodules and tensors the graph refers to, by qualified name."""
    found: dict[str, Any] = {}
    for node in graph.nodes:
        if node.op in ("call_module", "get_attr"):
            obj: Any = model
            try:
                for part in str(node.target).split("."):
                    obj = getattr(obj, part)
            except AttributeError:
                continue
            found[str(node.target)] = obj
    return found


def _trace(
    model: nn.Module, concrete_args: dict[str, Any] | None, leaf_modules: Iterable[LeafSpec]
) -> tuple[Graph, dict[str, Any], dict[str, Any] | None]:
    """Trace once; returns the graph, the constants it captured, and the concrete_args used.

    torch.fx stores tensors created during tracing as attributes of the traced module
    (``_tensor_constant0``, ...). They are taken back off the user's model here, so that
    tracing leaves it as it was.
    """
    before = set(vars(model))
    try:
        try:
            return GNNTracer(leaf_modules).trace(model, concrete_args), _taken(model, before), \
                concrete_args
        except Exception as first:
            _taken(model, before)
            retry = _default_args(model) if concrete_args is None else {}
            if not retry:
                raise _trace_error(type(model).__name__, first) from first
            try:
                return GNNTracer(leaf_modules).trace(model, retry), _taken(model, before), retry
            except Exception:
                raise _trace_error(type(model).__name__, first) from first
    finally:
        _taken(model, before)


def _taken(model: nn.Module, before: set[str]) -> dict[str, Any]:
    """Remove (and return) the attributes tracing added to ``model``."""
    added = {k: v for k, v in vars(model).items() if k not in before}
    for k in added:
        delattr(model, k)
    return added


_DROPOUT_MODULES: dict[Callable[..., Any], type[nn.Module]] = {
    F.dropout: nn.Dropout,
    F.dropout1d: nn.Dropout1d,
    F.dropout2d: nn.Dropout2d,
    F.dropout3d: nn.Dropout3d,
    F.alpha_dropout: nn.AlphaDropout,
    F.feature_alpha_dropout: nn.FeatureAlphaDropout,
    torch.dropout: nn.Dropout,
}


def _by_name(args: Any) -> Any:
    return map_arg(args, lambda n: n.name)


def _normalized_kwargs(node: Node) -> dict[str, Any] | None:
    """All arguments of a call_function node by name, or None where torch cannot bind them."""
    try:
        pair = normalize_function(
            node.target,  # type: ignore[arg-type]
            tuple(node.args),
            dict(node.kwargs),
            normalize_to_only_use_kwargs=True,
        )
    except RuntimeError:  # ambiguous overloads
        return None
    if pair is None:
        return None
    return pair.kwargs


def _follow_training_flag(gm: GraphModule, train_graph: Graph, eval_graph: Graph) -> None:
    """Turn functional calls whose ``training`` flag was ``self.training`` into modules."""
    t_nodes, e_nodes = list(train_graph.nodes), list(eval_graph.nodes)
    same_shape = len(t_nodes) == len(e_nodes) and all(
        (a.op, a.target, a.name) == (b.op, b.target, b.name) for a, b in zip(t_nodes, e_nodes, strict=True)
    )
    if not same_shape:
        warnings.warn(
            f"{type(gm).__name__}.forward takes different paths in train and eval mode "
            f"(e.g. `if self.training:`); the GraphModule follows the mode the model was in "
            f"(training={gm.training}). Please move mode-dependent code into a submodule.",
            stacklevel=3,
        )
        return
    nodes = {n.name: n for n in gm.graph.nodes}
    changed = False
    for t, e in zip(t_nodes, e_nodes, strict=True):
        if t.op != "call_function" or _by_name((t.args, t.kwargs)) == _by_name((e.args, e.kwargs)):
            continue
        kw_t, kw_e = _normalized_kwargs(t), _normalized_kwargs(e)
        flag = "train" if t.target is torch.dropout else "training"
        if not kw_t or kw_t.get(flag) is not True or not kw_e or kw_e.get(flag) is not False:
            continue
        node = nodes[t.name]
        cls = _DROPOUT_MODULES.get(t.target)
        if cls is None or isinstance(kw_t.get("p"), Node):
            warnings.warn(
                f"node {t.name!r} ({getattr(t.target, '__name__', t.target)}) reads "
                f"self.training, which tracing freezes to training={gm.training}. Please use "
                "a module (e.g. torch.nn.Dropout) so that train()/eval() reach it.",
                stacklevel=3,
            )
            continue
        kwargs = {"p": kw_t["p"]}
        if "inplace" in kw_t:
            kwargs["inplace"] = kw_t["inplace"]
        name = _free_name(gm, t.name)
        gm.add_submodule(name, cls(**kwargs).train(gm.training))
        own = _normalized_kwargs(node) or {}  # the same call, in gm's own graph
        node.op, node.target = "call_module", name
        node.args, node.kwargs = (own["input"],), {}
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()


def _free_name(gm: GraphModule, base: str) -> str:
    name, i = base, 1
    while hasattr(gm, name):
        name, i = f"{base}_{i}", i + 1
    return name


def _trace_error(name: str, exc: BaseException) -> TraceError:
    frame = _user_frame(exc)
    where = ""
    if frame is not None:
        where = f" at {os.path.basename(frame.filename)}:{frame.lineno}"
        if frame.line:
            where += f" ({frame.line.strip()!r})"
    return TraceError(
        f"could not trace {name}.forward{where}: {type(exc).__name__}: {exc}\n"
        "Symbolic tracing cannot follow Python control flow on tensor values or calls it "
        "does not know. Please fix the arguments that decide such branches with "
        "`concrete_args={...}`, or keep the submodule that contains the line opaque with "
        "`leaf_modules=[...]`."
    )
