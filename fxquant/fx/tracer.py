"""A torch.fx tracer that sees a PyG model the way its author wrote it.

Plain :func:`torch.fx.symbolic_trace` walks into ``MessagePassing.propagate`` and fails
("``propagate`` only supports integer tensors of shape ``[2, num_messages]``"). The
:class:`GNNTracer` keeps every ``MessagePassing`` module (GCNConv, SAGEConv, GATConv, ...)
as one leaf ``call_module`` node, like PyG's own tests do, and records where each node
came from in ``node.meta["stack_trace"]``.

Tracing runs the forward's Python while torch.fx patches ``nn.Module`` for the whole
process, so it runs behind :data:`fxquant.fx.serial.PROCESS_LOCK`. Buffers are read as
graph values, so that updates a forward makes to them (``self.count += 1``, an EMA) are
recorded and run when the traced model runs (:mod:`fxquant.fx.module_state`), and the
model is put back as it was after every trace.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.fx import Graph, GraphModule, Tracer
from torch_geometric.nn import Linear as PygLinear
from torch_geometric.nn import MessagePassing
from torch_geometric.nn.aggr import Aggregation
from torch_geometric.nn.pool import glob as _glob
from torch_geometric.utils import scatter as _scatter

from fxquant.errors import FxquantError, FxquantTypeError, FxquantValueError
from fxquant.fx.graph_utils import attr_of, free_name
from fxquant.fx.guards import FixedArguments
from fxquant.fx.lazy import refuse_lazy
from fxquant.fx.locations import traceback_location
from fxquant.fx.module_state import ModuleState, Rebound, write_buffer
from fxquant.fx.serial import PROCESS_LOCK
from fxquant.fx.standardize import functional_dropout_to_module

__all__ = ["GNNTracer", "LeafSpec", "TraceError", "trace"]

#: What ``leaf_modules=`` accepts: module classes or qualified submodule names.
LeafSpec = str | type[nn.Module]

_ASSERT_IS_NONE = getattr(torch.fx._symbolic_trace, "_assert_is_none", None)


class TraceError(FxquantError, RuntimeError):
    """A model could not be traced symbolically; the message names the user's source line."""


def check_leaf_modules(leaf_modules: object) -> tuple[LeafSpec, ...]:
    """``leaf_modules`` as a tuple of classes and names, or a TypeError naming the entry."""
    if isinstance(leaf_modules, (str, type)) or not isinstance(leaf_modules, Iterable):
        raise FxquantTypeError(
            "leaf_modules must be a list of module classes or qualified names, e.g. "
            f"leaf_modules=[torch.nn.LSTM] or ['encoder.block0'], got {leaf_modules!r}"
        )
    specs = tuple(leaf_modules)
    for spec in specs:
        if not (isinstance(spec, str) or (isinstance(spec, type) and issubclass(spec, nn.Module))):
            raise FxquantTypeError(
                f"leaf_modules entries must be module classes or qualified names, got {spec!r}"
            )
    return specs


class _Proxy(torch.fx.Proxy):
    """A proxy that records index assignment, ``x[idx] = v``, as an ``operator.setitem``
    node (plain torch.fx raises "'Proxy' object does not support item assignment")."""

    def __setitem__(self, key: Any, value: Any) -> None:
        self.tracer.create_proxy("call_function", operator.setitem, (self, key, value), {})


#: PyG functions recorded as one call each (their node count comes from the data, e.g.
#: ``int(batch.max()) + 1``, which a symbolic trace cannot read), when the traced code calls
#: them by a global name (``from torch_geometric.nn import global_mean_pool``)
PYG_CALLS = (_glob.global_add_pool, _glob.global_mean_pool, _glob.global_max_pool, _scatter)


class GNNTracer(Tracer):
    """:class:`torch.fx.Tracer` that keeps PyG ``MessagePassing`` modules, its
    ``Aggregation`` modules (``aggr.MeanAggregation()``) and its ``Linear`` (a layer like
    ``torch.nn.Linear``) as leaves, records PyG's global pooling functions and ``scatter``
    as one call each (:data:`PYG_CALLS`), records ``x[idx] = v`` as an
    ``operator.setitem`` node, reads buffers as graph values (``get_attr`` nodes, so that
    ``self.ema.mul_(m)`` is recorded rather than run on the real buffer while tracing),
    and stores NumPy scalars as Python numbers (so the generated code runs).

    Args:
        leaf_modules (iterable, optional): more modules to keep opaque, as classes or
            qualified names (``"encoder.block0"``). (default: :obj:`()`)
        proxy_buffers (bool, optional): read buffers as graph values; :obj:`False` reads
            their values (Python control flow on a buffer's value then works, frozen at
            its value while tracing). (default: :obj:`True`)

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

    #: a class attribute, so that a GraphModule re-traced when it is unpickled (torch.fx
    #: re-traces with a subclass of the tracer that made it) reads buffers the same way
    proxy_buffer_attributes = True

    def __init__(self, leaf_modules: Iterable[LeafSpec] = (), proxy_buffers: bool = True) -> None:
        super().__init__(autowrap_functions=PYG_CALLS)
        self.proxy_buffer_attributes = proxy_buffers
        self.record_stack_traces = True
        specs = check_leaf_modules(leaf_modules)
        self._leaf_names = {s for s in specs if isinstance(s, str)}
        self._leaf_types = tuple(s for s in specs if isinstance(s, type))
        self._stack: list[str] = []

    def proxy(self, node: torch.fx.Node) -> torch.fx.Proxy:
        return _Proxy(node, self)

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> Graph:
        """:meth:`torch.fx.Tracer.trace`, with PyG's ``Aggregation.__call__`` (which reads
        ``int(index.max())`` before calling the module) out of the way while tracing: an
        aggregation is recorded as one module call, and runs its own ``__call__`` in the
        traced model. Restored by identity."""
        owners = [c for c in (Aggregation, *_subclasses(Aggregation)) if "__call__" in vars(c)]
        saved = [(c, vars(c)["__call__"]) for c in owners]
        for c, _ in saved:
            delattr(c, "__call__")
        try:
            return super().trace(root, concrete_args)
        finally:
            for c, call in saved:
                if "__call__" not in vars(c):
                    c.__call__ = call

    def create_arg(self, a: Any) -> Any:
        if isinstance(a, np.generic):  # np.float64(2.0) in generated code: NameError np
            return a.item()
        return super().create_arg(a)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if isinstance(m, (MessagePassing, Aggregation, PygLinear, *self._leaf_types)):
            return True
        if module_qualified_name in self._leaf_names:
            return True
        return super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m: nn.Module, forward: Any, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        """Trace into (or record) a submodule; an error raised inside it is tagged with the
        innermost submodule's qualified name (``exc.fxquant_failed_in``) for the hint."""
        self._stack.append(self.path_of_module(m))
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception as e:
            if not hasattr(e, "fxquant_failed_in"):
                e.fxquant_failed_in = self._stack[-1]  # type: ignore[attr-defined]
            raise
        finally:
            self._stack.pop()


def _subclasses(cls: type) -> list[type]:
    """Every subclass of ``cls``, however deep."""
    found: list[type] = []
    sub: type
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def _default_args(model: nn.Module) -> dict[str, Any]:
    """forward's arguments that have defaults, at their default values, in order."""
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


def refuse_compiled(model: nn.Module, api: str) -> None:
    """A clear error for a ``torch.compile`` wrapper, whose forward is compiled code that
    cannot be traced or rewritten: the module it wraps can."""
    if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        raise FxquantTypeError(
            f"fxquant.{api} takes the module itself, not its torch.compile wrapper: please pass "
            "model._orig_mod (the module it compiles) and compile what fxquant returns")


def trace(
    model: nn.Module,
    concrete_args: dict[str, Any] | None = None,
    leaf_modules: Iterable[LeafSpec] = (),
) -> GraphModule:
    """Symbolically trace ``model`` into a :class:`~torch.fx.GraphModule`, GNN layers as leaves.

    Functional dropout written as ``F.dropout(x, p, training=self.training)`` (PyG's examples
    do this) would be frozen into the graph in the mode it was traced in. The model is
    therefore traced in both modes, and such calls become ``nn.Dropout`` submodules
    (:func:`fxquant.fx.standardize.functional_dropout_to_module`).

    When the plain trace fails and ``concrete_args`` is not given, forward's arguments
    with defaults are fixed to them, one at a time, until the trace succeeds (PyG's
    BasicGNN models branch in Python on ``num_sampled_nodes_per_hop``); every other
    argument stays an input of the graph, by its own name and position, so the traced
    model takes ``edge_weight=``, ``batch=`` and the like as the original does. A fixed
    argument is checked by a :class:`~fxquant.fx.guards.FixedArguments` module at run time.

    Args:
        model (torch.nn.Module): the model, unmodified. It is not copied: the GraphModule
            shares its submodules and parameters.
        concrete_args (dict, optional): forward arguments to fix while tracing, as in
            :func:`torch.fx.symbolic_trace`. (default: :obj:`None`: fixed as needed)
        leaf_modules (iterable, optional): more modules to keep as opaque calls, as classes
            or qualified names. (default: :obj:`()`)

    Raises:
        TraceError: the model has code symbolic tracing cannot follow; the message names
            its source line and what helps there.

    Example:
        >>> from torch_geometric.nn.models import GCN
        >>> gm = trace(GCN(in_channels=4, hidden_channels=8, num_layers=2, out_channels=2))
        >>> [n.target for n in gm.graph.nodes if n.op == "call_module"]
        ['fixed_arguments', 'convs.0', 'norms.0', 'act', 'dropout', 'convs.1']
        >>> gm.fixed_arguments  # doctest: +NORMALIZE_WHITESPACE
        FixedArguments(edge_attr=None, batch=None, batch_size=None,
                       num_sampled_nodes_per_hop=None, num_sampled_edges_per_hop=None)
    """
    if not isinstance(model, nn.Module):
        raise FxquantTypeError(f"fxquant.trace expects a torch.nn.Module, got {type(model).__name__}")
    refuse_compiled(model, "trace")
    refuse_lazy(model, "trace")
    if concrete_args is not None and not isinstance(concrete_args, dict):
        raise FxquantTypeError(
            "concrete_args must be a dict {argument name: value} of forward arguments to fix "
            f"while tracing, e.g. concrete_args={{'edge_weight': None}}; got {concrete_args!r}"
        )
    if concrete_args:
        known = _signature_names(model)
        unknown = [k for k in concrete_args if known is not None and k not in known]
        if unknown:
            raise FxquantValueError(f"concrete_args names {unknown}, which {type(model).__name__}.forward "
                             f"does not take; its arguments: {known}")
    leaves = check_leaf_modules(leaf_modules)
    with PROCESS_LOCK:
        modes = {name: m.training for name, m in model.named_modules()}
        # Tracing runs forward's Python: undo global switches it makes (set_detect_anomaly).
        anomaly = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
        grad_mode = torch.is_grad_enabled()
        # every trace puts the model back as it was (modes are set and restored here)
        state = ModuleState(model, keep=("training",))
        try:
            model.train(True)
            train_graph, train_consts, fixed, unused = _trace(model, concrete_args, leaves, state)
            model.train(False)
            eval_graph, eval_consts = _trace_once(model, fixed, leaves, state)
        finally:
            for name, m in model.named_modules():
                m.training = modes.get(name, m.training)
            torch.set_anomaly_enabled(*anomaly)
            torch.set_grad_enabled(grad_mode)
    graph, consts = (train_graph, train_consts) if model.training else (eval_graph, eval_consts)
    gm = GraphModule({**_attributes(model, graph), **consts}, graph, type(model).__name__)
    _keep_non_persistent(model, gm)
    gm.training = model.training
    functional_dropout_to_module(gm, train_graph, eval_graph)
    if concrete_args is None and fixed:
        _guard_fixed_arguments(gm, fixed, unused, type(model).__name__)
    return gm


def _signature_names(model: nn.Module) -> list[str] | None:
    try:
        return list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return None


def _attributes(model: nn.Module, graph: Graph) -> dict[str, Any]:
    """The submodules and tensors the graph refers to, by qualified name."""
    found: dict[str, Any] = {}
    for node in graph.nodes:
        if node.op in ("call_module", "get_attr"):
            obj = attr_of(model, str(node.target))
            if obj is not None:
                found[str(node.target)] = obj
    return found


def _keep_non_persistent(model: nn.Module, gm: GraphModule) -> None:
    """Buffers the model keeps out of its ``state_dict`` stay out of ``gm``'s (GraphModule
    registers every tensor it copies as a persistent buffer)."""
    for name, module in model.named_modules():
        for key in getattr(module, "_non_persistent_buffers_set", ()):
            target = f"{name}.{key}" if name else key
            owner_name, _, field = target.rpartition(".")
            owner = attr_of(gm, owner_name) if owner_name else gm
            if isinstance(owner, nn.Module) and field in owner._buffers \
                    and owner is not module:
                owner.register_buffer(field, owner._buffers[field], persistent=False)


def _trace_once(model: nn.Module, concrete_args: dict[str, Any] | None,
                leaves: tuple[LeafSpec, ...], state: ModuleState) -> tuple[Graph, dict[str, Any]]:
    """One trace; returns the graph and the constants it captured.

    Buffers are read as graph values, so that updates of them are recorded. Where that
    fails (Python reads a buffer's value: ``if self.steps > 10:``) the model is traced
    again reading buffer values, as constants; a forward that then updates a buffer is
    refused, since the update could not be recorded.
    """
    try:
        return _trace_with(model, concrete_args, leaves, state, proxy_buffers=True)
    except Exception as first:
        if next(model.buffers(), None) is None:
            raise
        try:
            return _trace_with(model, concrete_args, leaves, state, proxy_buffers=False)
        except _BuffersUpdated as e:
            where = traceback_location(first)
            at = f" at {where}" + (f" ({where.code!r})" if where.code else "") if where else ""
            raise _StateAssigned(
                f"forward updates buffer {', '.join(e.names)}, and its Python reads buffer "
                f"values{at}: {type(first).__name__}: {first}. Symbolic tracing records "
                "buffer updates only where buffers are used as tensors; please compute "
                "both branches and select with torch.where(...), or keep the submodule "
                "that holds the buffer opaque with leaf_modules=[...]") from first
        except Exception:
            raise first from None


class _BuffersUpdated(RuntimeError):
    """A trace that read buffers as constants saw forward update them."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(", ".join(names))
        self.names = names


def _trace_with(model: nn.Module, concrete_args: dict[str, Any] | None,
                leaves: tuple[LeafSpec, ...], state: ModuleState,
                proxy_buffers: bool) -> tuple[Graph, dict[str, Any]]:
    """One trace with buffers read as graph values or not.

    torch.fx stores tensors created during tracing as attributes of the traced module
    (``_tensor_constant0``, ...). They are taken back off the user's model here, and
    ``state`` puts back everything else forward changed, so that tracing leaves the model
    as it was.
    """
    before = set(vars(model))
    try:
        graph = GNNTracer(leaves, proxy_buffers=proxy_buffers).trace(model, concrete_args)
    finally:
        consts = _taken(model, before)
        changes = state.restore()
    if changes.plain:
        raise _StateAssigned(
            f"forward changes {', '.join(changes.plain)} in place, a plain tensor attribute "
            "that symbolic tracing reads as a constant (the change is lost); register it as "
            "a buffer, self.register_buffer(name, tensor), so the graph reads and writes it")
    if changes.assigned:
        raise _StateAssigned(
            f"forward assigns {', '.join(changes.assigned)} from traced values (e.g. "
            "`self.state += x`), a change of module state that symbolic tracing cannot "
            "record; keep such state in a buffer (self.register_buffer(name, tensor)), or "
            "keep that submodule opaque with leaf_modules=[...]")
    updated = [r.qualname for r in changes.rebound] + changes.written
    if updated and not proxy_buffers:
        raise _BuffersUpdated(updated)
    if changes.written:
        raise _StateAssigned(
            f"forward changes {', '.join(changes.written)} in place through a path that "
            "symbolic tracing does not see (e.g. self.buffers(), .data, a NumPy view), so "
            "the change is lost; please update it through the attribute, e.g. "
            "`self.buf.mul_(m)`, or keep that submodule opaque with leaf_modules=[...]")
    _write_back(model, graph, changes.rebound, consts)
    return graph, consts


def _write_back(model: nn.Module, graph: Graph, rebound: list[Rebound],
                consts: dict[str, Any]) -> None:
    """For each buffer forward rebound (``self.count += 1``), a :func:`write_buffer` node
    before the output writes the final value into the buffer; where the graph read the
    buffer's old value, it reads a clone made at that point, so that the write changes
    nothing autograd saved (the rebinding replaced the buffer, it did not change the old
    tensor)."""
    if not rebound:
        return
    names = {id(t): n for n, t in model.named_buffers()}
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    for r in rebound:
        target = names.get(id(r.original), r.qualname)
        if isinstance(r.value, torch.fx.Proxy) and r.value.node.graph is graph:
            value = r.value.node
        elif isinstance(r.value, torch.Tensor) and not isinstance(r.value, torch.fx.Proxy):
            name = free_name(model, f"_{target.replace('.', '_')}_assigned")
            while name in consts:
                name += "_"
            consts[name] = r.value
            with graph.inserting_before(output):
                value = graph.get_attr(name)
        else:
            raise _StateAssigned(
                f"forward sets buffer {r.qualname} to {type(r.value).__name__}, which the "
                "traced model cannot write into the buffer; please assign a tensor of the "
                "buffer's shape and dtype")
        readers = [n for n in graph.nodes if n.op == "get_attr" and n.target == target]
        if value in readers:  # self.buf = self.buf
            continue
        for reader in readers:
            if not reader.users:
                continue
            with graph.inserting_after(reader):
                old = graph.call_method("clone", (reader,))
            reader.replace_all_uses_with(old, delete_user_cb=lambda user, old=old: user is not old)
        with graph.inserting_before(output):
            holder = graph.get_attr(target)
            graph.call_function(write_buffer, (holder, value))
    graph.lint()


class _StateAssigned(RuntimeError):
    """Forward rebinds a module attribute to a traced value (its own message says how)."""


_Traced = tuple[Graph, dict[str, Any], dict[str, Any] | None, frozenset[str]]


def _trace(model: nn.Module, concrete_args: dict[str, Any] | None,
           leaves: tuple[LeafSpec, ...], state: ModuleState) -> _Traced:
    """Trace, fixing as few defaulted arguments as it takes.

    Returns the graph, its constants, the arguments fixed and those of them fixed only
    because the graph does not read them.
    """
    try:
        graph, consts = _trace_once(model, concrete_args, leaves, state)
        return graph, consts, concrete_args, frozenset()
    except Exception as first:
        defaults = _default_args(model) if concrete_args is None else {}
        if not defaults:
            raise _trace_error(model, first) from first
        fixed = dict(defaults)
        try:
            result = _trace_once(model, fixed, leaves, state)
        except Exception:
            raise _trace_error(model, first) from first
        for name in defaults:
            trial = {k: v for k, v in fixed.items() if k != name}
            try:
                result = _trace_once(model, trial, leaves, state)
            except Exception:
                continue
            fixed = trial
        graph, consts = result
        # An argument the graph does not use may still have steered the forward's Python
        # while the others were fixed (BasicGNN reads num_sampled_edges_per_hop only when
        # num_sampled_nodes_per_hop is given): fix it too, so that another value raises
        # instead of being silently ignored.
        unused = {str(n.target) for n in graph.nodes if n.op == "placeholder" and not n.users}
        extra = {k: v for k, v in defaults.items() if k in unused and k not in fixed}
        if extra:
            fixed = {k: v for k, v in defaults.items() if k in fixed or k in extra}
            graph, consts = _trace_once(model, fixed, leaves, state)
        return graph, consts, fixed, frozenset(extra)


def _taken(model: nn.Module, before: set[str]) -> dict[str, Any]:
    """Remove (and return) the attributes tracing added to ``model``."""
    added = {k: v for k, v in vars(model).items() if k not in before}
    for k in added:
        delattr(model, k)
    return added


def _guard_fixed_arguments(gm: GraphModule, fixed: dict[str, Any], unused: frozenset[str],
                           model: str) -> None:
    """Replace torch.fx's ``_assert_is_none`` guards by a :class:`FixedArguments` call.

    The placeholders keep the original argument names (torch.fx renames them ``name_1``)
    and positions, so the traced model is called exactly like the original.
    """
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is _ASSERT_IS_NONE:
            graph.erase_node(node)
    by_name = {}
    for ph in placeholders:
        original = str(ph.target)
        base = original[:-2] if original.endswith("_1") and original[:-2] in fixed else original
        if base in fixed:
            ph.target = base
            ph.name = base
            by_name[base] = ph
    name = free_name(gm, "fixed_arguments")
    gm.add_submodule(name, FixedArguments({k: fixed[k] for k in by_name}, model, unused))
    with graph.inserting_after(placeholders[-1]):
        graph.call_module(name, tuple(by_name[k] for k in by_name))
    graph.lint()
    gm.recompile()


def _library_function(exc: BaseException) -> str | None:
    """``torch_geometric.nn.pool.glob.global_mean_pool``: the first function of PyG that
    the traceback of ``exc`` runs after leaving the user's code, if it does."""
    tb = exc.__traceback__
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in frames:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("torch_geometric.") and frame.f_code.co_name != "wrapper":
            return f"{module}.{frame.f_code.co_name}"
    return None


def _trace_error(model: nn.Module, exc: BaseException) -> TraceError:
    where = traceback_location(exc)
    at = ""
    if where is not None:
        at = f" at {where}"
        if where.code:
            at += f" ({where.code!r})"
    failed_in = getattr(exc, "fxquant_failed_in", None)
    if isinstance(exc, _StateAssigned):
        return TraceError(f"could not trace {type(model).__name__}.forward: {exc}")
    library = _library_function(exc) if isinstance(exc, torch.fx.proxy.TraceError) else None
    if isinstance(model, MessagePassing):
        hint = (
            f"fxquant traces a model that calls its layers, and keeps each PyG layer whole: "
            f"please pass a module whose forward calls this {type(model).__name__}."
        )
    elif library is not None and not failed_in:
        hint = (
            f"The line calls {library}, which reads a tensor's value (the number of graphs "
            "or nodes, say), and symbolic tracing cannot. Call it by a global name, as in "
            "`from torch_geometric.nn import global_mean_pool`: the trace then records PyG's "
            "global pooling and scatter functions as one call each; for another function, "
            "declare it with torch.fx.wrap('its_name') at the top of the module that calls it."
        )
    elif failed_in:
        hint = (
            f"The line is inside submodule {failed_in!r}: keep it opaque with "
            f"leaf_modules=[{failed_in!r}] (it then runs as written, as one node of the graph)."
        )
    else:
        hint = (
            "The line is in the top-level forward, where symbolic tracing cannot follow "
            "Python control flow on tensor values: compute both branches and select with "
            "torch.where(condition, a, b), or move the branch into a submodule and keep that "
            "submodule opaque with leaf_modules=[...]."
        )
        if _default_args(model):
            hint += (" If the branch reads an optional argument, fix it while tracing with "
                     "concrete_args={...}.")
    return TraceError(
        f"could not trace {type(model).__name__}.forward{at}: {type(exc).__name__}: {exc}\n{hint}"
    )
