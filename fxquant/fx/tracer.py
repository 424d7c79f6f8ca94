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
import typing
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.fx import Graph, GraphModule, Tracer
from torch_geometric.nn import Linear as PygLinear
from torch_geometric.nn import MessagePassing
from torch_geometric.nn.aggr import Aggregation
from torch_geometric.nn.norm import GraphNorm, GraphSizeNorm, InstanceNorm, LayerNorm
from torch_geometric.nn.pool import glob as _glob
from torch_geometric.utils import scatter as _scatter

from fxquant.errors import FxquantError, FxquantTypeError, FxquantValueError
from fxquant.fx.graph_utils import attr_of, free_name
from fxquant.fx.guards import FixedArguments, StructureGuard
from fxquant.fx.hetero import TYPES_KEY, module_types
from fxquant.fx.lazy import refuse_lazy
from fxquant.fx.locations import traceback_location
from fxquant.fx.module_state import ModuleState, Rebound, write_buffer
from fxquant.fx.serial import PROCESS_LOCK
from fxquant.fx.standardize import functional_dropout_to_module
from fxquant.fx.structure import ExampleStructure, as_one_value, has_placeholders

__all__ = ["PYG_GRAPH_NORMS", "STRUCTURE_KEY", "GNNTracer", "LeafSpec", "TraceError", "trace"]

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

#: PyG normalization layers that count the graphs of a mini-batch from its ``batch``
#: vector (``int(batch.max()) + 1``), which a symbolic trace cannot read: kept as leaves,
#: like the message-passing layers (``GraphNorm``, ``InstanceNorm``, ``LayerNorm``,
#: ``GraphSizeNorm``). PyG's ``BatchNorm``, ``PairNorm``, ``MeanSubtractionNorm`` and
#: ``DiffGroupNorm`` trace as they are.
PYG_GRAPH_NORMS = (GraphNorm, InstanceNorm, LayerNorm, GraphSizeNorm)


class GNNTracer(Tracer):
    """:class:`torch.fx.Tracer` that keeps PyG ``MessagePassing`` modules, its
    ``Aggregation`` modules (``aggr.MeanAggregation()``), its ``Linear`` (a layer like
    ``torch.nn.Linear``) and its per-graph normalizations (:data:`PYG_GRAPH_NORMS`) as
    leaves, records PyG's global pooling functions and ``scatter``
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
        structure (ExampleStructure, optional): the keys of dict arguments, and of the
            dicts leaf layers return (:mod:`fxquant.fx.structure`): such an argument
            reaches the forward as a dict of ``x_dict[key]`` lookups. (default: none)

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

    def __init__(self, leaf_modules: Iterable[LeafSpec] = (), proxy_buffers: bool = True,
                 structure: ExampleStructure | None = None) -> None:
        super().__init__(autowrap_functions=PYG_CALLS)
        self.proxy_buffer_attributes = proxy_buffers
        self.record_stack_traces = True
        specs = check_leaf_modules(leaf_modules)
        self._leaf_names = {s for s in specs if isinstance(s, str)}
        self._leaf_types = tuple(s for s in specs if isinstance(s, type))
        self._stack: list[str] = []
        self.structure = structure if structure is not None else ExampleStructure()
        self._calls: dict[str, int] = {}

    def proxy(self, node: torch.fx.Node) -> torch.fx.Proxy:
        return _Proxy(node, self)

    def create_proxy(self, kind: str, target: Any, args: tuple[Any, ...],
                     kwargs: dict[str, Any], name: str | None = None,
                     type_expr: Any | None = None, proxy_factory_fn: Any = None) -> Any:
        """A forward argument with a known structure (a dict of node types, say) is one
        placeholder, and the forward receives a real dict of ``x_dict[key]`` lookups."""
        proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr,
                                     proxy_factory_fn)
        found = self.structure.inputs.get(str(target)) if kind == "placeholder" else None
        return proxy if found is None else found.build(proxy, self._getitem)

    def _getitem(self, parent: Any, key: Any) -> Any:
        return self.create_proxy("call_function", operator.getitem, (parent, key), {})

    def iter(self, obj: torch.fx.Proxy) -> Any:
        """Iterating over a traced value (``x_dict.items()``, ``key in x_dict``) cannot be
        traced: a :class:`torch.fx.proxy.TraceError` that names the value and says how to
        give its keys (``fxquant_hint`` on the exception)."""
        node = obj.node
        while node.op == "call_method" and node.target in ("items", "keys", "values") \
                and node.args and isinstance(node.args[0], torch.fx.Node):
            node = node.args[0]
        if node.op == "call_function" and node.target is getattr and len(node.args) == 2 \
                and isinstance(node.args[0], torch.fx.Node) and node.args[0].op == "placeholder":
            e = torch.fx.proxy.TraceError(
                f"forward iterates over {node.args[0].target}.{node.args[1]}, an attribute of "
                "an argument, whose keys a symbolic trace cannot know")
            e.fxquant_hint = (  # type: ignore[attr-defined]
                "fxquant traces dicts that forward takes as arguments: please give forward "
                "the dicts themselves (forward(self, x_dict, edge_index_dict), called as "
                "model(data.x_dict, data.edge_index_dict)) and pass example_inputs=(...).")
            raise e
        if node.op == "placeholder":
            what = f"the argument {str(node.target)!r}"
        elif node.op == "call_module":
            module = self.root.get_submodule(str(node.target))
            what = f"what layer {str(node.target)!r} ({type(module).__name__}) returns"
        else:
            what = f"the value of {node.format_node()}"
        e = torch.fx.proxy.TraceError(
            f"forward iterates over {what}, whose keys or length a symbolic trace cannot "
            "know")
        e.fxquant_hint = (  # type: ignore[attr-defined]
            "Please pass example inputs (forward's positional arguments as a tuple), e.g. "
            "example_inputs=(data.x_dict, data.edge_index_dict): the trace then knows the "
            "keys of the dicts among them and of the dicts leaf layers return, and unrolls "
            "each loop over them, one branch per key.")
        raise e

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> Graph:
        """:meth:`torch.fx.Tracer.trace`, with PyG's ``Aggregation.__call__`` (which reads
        ``int(index.max())`` before calling the module) out of the way while tracing: an
        aggregation is recorded as one module call, and runs its own ``__call__`` in the
        traced model. Restored by identity."""
        owners = [c for c in (Aggregation, *_subclasses(Aggregation)) if "__call__" in vars(c)]
        saved = [(c, vars(c)["__call__"]) for c in owners]
        for c, _ in saved:
            delattr(c, "__call__")
        self._calls = {}
        try:
            graph = super().trace(root, concrete_args)
        finally:
            for c, call in saved:
                if "__call__" not in vars(c):
                    c.__call__ = call
        _placeholders_first(graph)
        return graph

    def create_arg(self, a: Any) -> Any:
        if isinstance(a, np.generic):  # np.float64(2.0) in generated code: NameError np
            return a.item()
        return super().create_arg(a)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if isinstance(m, (MessagePassing, Aggregation, PygLinear, *PYG_GRAPH_NORMS,
                          *self._leaf_types)):
            return True
        if module_qualified_name in self._leaf_names:
            return True
        return super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m: nn.Module, forward: Any, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        """Trace into (or record) a submodule; an error raised inside it is tagged with the
        innermost submodule's qualified name (``exc.fxquant_failed_in``) for the hint."""
        qualname = self.path_of_module(m)
        self._stack.append(qualname)
        try:
            out = super().call_module(m, forward, args, kwargs)
            if self.structure.outputs and self.is_leaf_module(m, qualname):
                call = self._calls.get(qualname, 0)
                self._calls[qualname] = call + 1
                found = self.structure.output_of(qualname, call)
                if found is not None and isinstance(out, torch.fx.Proxy):
                    out = found.build(out, self._getitem)
            return out
        except Exception as e:
            if not hasattr(e, "fxquant_failed_in"):
                e.fxquant_failed_in = self._stack[-1]  # type: ignore[attr-defined]
            raise
        finally:
            self._stack.pop()


def _placeholders_first(graph: Graph) -> None:
    """Move every placeholder before the first other node, keeping their order (a
    structured argument's lookups are recorded as soon as its placeholder is)."""
    first = next((n for n in graph.nodes if n.op != "placeholder"), None)
    if first is None:
        return
    seen_other = False
    for node in list(graph.nodes):
        if node.op != "placeholder":
            seen_other = True
        elif seen_other:
            first.prepend(node)


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
    *,
    example_inputs: tuple[Any, ...] | None = None,
    structure: ExampleStructure | None = None,
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
    An argument with a default that the graph does not read is fixed too where it changed
    which branch the trace took (``if y is not None:``), and, where arguments had to be
    fixed, unless it is annotated as a tensor; one left free is ignored by the traced model
    as the original ignores it (BasicGNN's ``batch=`` without a per-graph normalization).
    A dict, list or tuple fixed in ``concrete_args`` is passed whole and checked by the same
    guard.

    Dicts of tensors (a heterogeneous GNN's ``forward(self, x_dict, edge_index_dict)``)
    need their keys, which a symbolic trace cannot see: give ``example_inputs`` (or mark
    the traced values with torch.fx's ``PH`` in ``concrete_args``). Each such argument
    stays one argument of the traced model, the forward sees a dict of ``x_dict[key]``
    lookups, and a loop over it is unrolled, one branch per key (see
    :mod:`fxquant.fx.structure`); a :class:`~fxquant.fx.guards.StructureGuard` checks
    the keys of every later call.

    Args:
        model (torch.nn.Module): the model, unmodified. It is not copied: the GraphModule
            shares its submodules and parameters.
        concrete_args (dict, optional): forward arguments to fix while tracing, as in
            :func:`torch.fx.symbolic_trace`; a dict, tuple or list holding ``torch.fx.PH``
            gives an argument's structure instead (``{"x_dict": {"paper": PH, ...}}``).
            (default: :obj:`None`: fixed as needed)
        leaf_modules (iterable, optional): more modules to keep as opaque calls, as classes
            or qualified names. (default: :obj:`()`)
        example_inputs (tuple, optional): forward's positional arguments, e.g.
            ``(data.x_dict, data.edge_index_dict)``. The model runs on them once (in
            evaluation mode, without gradient, its state and the random state put back),
            so that the keys of its dict arguments and of the dicts its leaf layers return
            (``HGTConv``, ``HANConv``) are known. (default: :obj:`None`)
        structure (ExampleStructure, optional): those structures as recorded before (what
            :func:`fxquant.load` passes). (default: :obj:`None`)

    Raises:
        TraceError: the model has code symbolic tracing cannot follow; the message names
            its source line and what helps there.

    Example:
        >>> from torch_geometric.nn.models import GCN
        >>> gm = trace(GCN(in_channels=4, hidden_channels=8, num_layers=2, out_channels=2))
        >>> [n.target for n in gm.graph.nodes if n.op == "call_module"]
        ['fixed_arguments', 'convs.0', 'norms.0', 'act', 'dropout', 'convs.1']
        >>> gm.fixed_arguments  # doctest: +NORMALIZE_WHITESPACE
        FixedArguments(batch_size=None, num_sampled_nodes_per_hop=None,
                       num_sampled_edges_per_hop=None)

        A model that takes dicts, traced with example inputs:

        >>> from torch_geometric.nn import HeteroConv, SAGEConv
        >>> class Hetero(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.conv = HeteroConv({("user", "rates", "item"): SAGEConv((4, 4), 8),
        ...                                 ("item", "rev_rates", "user"): SAGEConv((4, 4), 8)})
        ...     def forward(self, x_dict, edge_index_dict):
        ...         return {k: v.relu() for k, v in self.conv(x_dict, edge_index_dict).items()}
        >>> x_dict = {"user": torch.randn(3, 4), "item": torch.randn(2, 4)}
        >>> edge_index_dict = {("user", "rates", "item"): torch.tensor([[0, 2], [1, 0]]),
        ...                    ("item", "rev_rates", "user"): torch.tensor([[1, 0], [0, 2]])}
        >>> gm = trace(Hetero(), example_inputs=(x_dict, edge_index_dict))
        >>> [n.target for n in gm.graph.nodes if n.op == "call_module"]  # doctest: +NORMALIZE_WHITESPACE
        ['structure_guard', 'conv.convs.<user___rates___item>',
         'conv.convs.<item___rev_rates___user>']
        >>> sorted(gm(x_dict, edge_index_dict))
        ['item', 'user']
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
    concrete_args, structure = _structures(model, concrete_args, leaves, example_inputs,
                                           structure)
    # containers fixed in concrete_args: passed whole, checked by a FixedArguments guard
    containers = {k: v for k, v in (concrete_args or {}).items() if as_one_value(v) is not v}
    if containers:
        concrete_args = {k: as_one_value(v) for k, v in (concrete_args or {}).items()}
    with PROCESS_LOCK, warnings.catch_warnings():
        for name in containers:  # (torch.fx cannot check them: the guard does)
            warnings.filterwarnings("ignore", message=f"Was not able to add assertion to "
                                    f"guarantee correct input {name} to")
        modes = {name: m.training for name, m in model.named_modules()}
        # Tracing runs forward's Python: undo global switches it makes (set_detect_anomaly).
        anomaly = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
        grad_mode = torch.is_grad_enabled()
        # every trace puts the model back as it was (modes are set and restored here)
        state = ModuleState(model, keep=("training",))
        try:
            model.train(True)
            train_graph, train_consts, fixed, unused = _trace(model, concrete_args, leaves, structure, state)
            model.train(False)
            eval_graph, eval_consts = _trace_once(model, fixed, leaves, structure, state)
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
    if containers:
        _guard_fixed_arguments(gm, containers, frozenset(), type(model).__name__)
    if structure:
        _guard_structures(gm, structure, type(model).__name__)
    # which layers are one node or edge type's copy (the module dicts are not kept)
    gm.meta[TYPES_KEY] = module_types(model, [str(n.target) for n in gm.graph.nodes
                                              if n.op == "call_module"])
    _same_mode(model, gm)
    return gm


def _same_mode(model: nn.Module, gm: GraphModule) -> None:
    """The modules the GraphModule adds (torch.fx's containers for qualified names, the
    guards) take the model's mode: a model traced in evaluation is in evaluation."""
    own = {id(m) for m in model.modules()}
    for m in gm.modules():
        if id(m) not in own:
            m.training = model.training


#: The key of ``GraphModule.meta`` that holds the :class:`ExampleStructure` a model was
#: traced with (what :func:`fxquant.save` writes for dict inputs).
STRUCTURE_KEY = "fxquant_structure"


def _structures(model: nn.Module, concrete_args: dict[str, Any] | None,
                leaves: tuple[LeafSpec, ...], example_inputs: Any,
                structure: ExampleStructure | None,
                ) -> tuple[dict[str, Any] | None, ExampleStructure]:
    """``concrete_args`` without the entries that spell a structure with ``PH``, and the
    structures from those, ``example_inputs`` and ``structure`` together."""
    found = ExampleStructure() if structure is None else ExampleStructure(
        dict(structure.inputs), dict(structure.outputs), structure.source)
    if example_inputs is not None:
        refuse_lazy(model, "trace")
        with PROCESS_LOCK:  # (another thread's trace patches nn.Module while it runs)
            example = ExampleStructure.from_example(model, example_inputs,
                                                    GNNTracer(leaves).is_leaf_module)
        found.inputs.update(example.inputs)
        found.outputs.update(example.outputs)
    if concrete_args and any(has_placeholders(v) for v in concrete_args.values()):
        marked = ExampleStructure.from_concrete_args(concrete_args)
        found.inputs.update(marked.inputs)
        if example_inputs is None and structure is None:
            found.source = marked.source
        concrete_args = {k: v for k, v in concrete_args.items() if k not in marked.inputs}
        concrete_args = concrete_args or None
    return concrete_args, found


def _guard_structures(gm: GraphModule, structure: ExampleStructure, model: str) -> None:
    """A :class:`StructureGuard` call on the structured arguments, after the placeholders;
    the structures themselves go to ``gm.meta[STRUCTURE_KEY]``."""
    graph = gm.graph
    placeholders = {str(n.target): n for n in graph.nodes if n.op == "placeholder"}
    guarded = {k: s for k, s in structure.inputs.items() if k in placeholders and not s.is_leaf}
    gm.meta[STRUCTURE_KEY] = structure
    if not guarded:
        return
    name = free_name(gm, "structure_guard")
    gm.add_submodule(name, StructureGuard(guarded, model, structure.source))
    last = list(placeholders.values())[-1]
    with graph.inserting_after(last):
        graph.call_module(name, tuple(placeholders[k] for k in guarded))
    graph.lint()
    gm.recompile()


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
                leaves: tuple[LeafSpec, ...], structure: ExampleStructure,
                state: ModuleState) -> tuple[Graph, dict[str, Any]]:
    """One trace; returns the graph and the constants it captured.

    Buffers are read as graph values, so that updates of them are recorded. Where that
    fails (Python reads a buffer's value: ``if self.steps > 10:``) the model is traced
    again reading buffer values, as constants; a forward that then updates a buffer is
    refused, since the update could not be recorded.
    """
    try:
        return _trace_with(model, concrete_args, leaves, structure, state, proxy_buffers=True)
    except Exception as first:
        if next(model.buffers(), None) is None:
            raise
        try:
            return _trace_with(model, concrete_args, leaves, structure, state, proxy_buffers=False)
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
                leaves: tuple[LeafSpec, ...], structure: ExampleStructure, state: ModuleState,
                proxy_buffers: bool) -> tuple[Graph, dict[str, Any]]:
    """One trace with buffers read as graph values or not.

    torch.fx stores tensors created during tracing as attributes of the traced module
    (``_tensor_constant0``, ...). They are taken back off the user's model here, and
    ``state`` puts back everything else forward changed, so that tracing leaves the model
    as it was.
    """
    before = set(vars(model))
    try:
        graph = GNNTracer(leaves, proxy_buffers=proxy_buffers,
                          structure=structure).trace(model, concrete_args)
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
           leaves: tuple[LeafSpec, ...], structure: ExampleStructure,
           state: ModuleState) -> _Traced:
    """Trace, fixing as few defaulted arguments as it takes.

    Returns the graph, its constants, the arguments fixed and those of them fixed only
    because the graph does not read them.
    """
    defaults = _default_args(model) if concrete_args is None else {}
    try:
        graph, consts = _trace_once(model, concrete_args, leaves, structure, state)
    except Exception as first:
        if not defaults:
            raise _trace_error(model, first) from first
        fixed = dict(defaults)
        try:
            result = _trace_once(model, fixed, leaves, structure, state)
        except Exception:
            raise _trace_error(model, first) from first
        for name in defaults:
            trial = {k: v for k, v in fixed.items() if k != name}
            try:
                result = _trace_once(model, trial, leaves, structure, state)
            except Exception:
                continue
            fixed = trial
        graph, consts = result
        # BasicGNN reads num_sampled_edges_per_hop only when num_sampled_nodes_per_hop is
        # a list: of the arguments left unused, only tensors may stay free
        extra = _steering(model, graph, fixed, defaults, leaves, structure, state,
                          only_tensors=True)
    else:
        if not defaults:
            return graph, consts, concrete_args, frozenset()
        fixed = {}
        extra = _steering(model, graph, fixed, defaults, leaves, structure, state,
                          only_tensors=False)
        if not extra:
            return graph, consts, concrete_args, frozenset()
    if extra:
        fixed = {k: v for k, v in defaults.items() if k in fixed or k in extra}
        graph, consts = _trace_once(model, fixed, leaves, structure, state)
    return graph, consts, fixed, frozenset(extra)


def _steering(model: nn.Module, graph: Graph, fixed: dict[str, Any], defaults: dict[str, Any],
              leaves: tuple[LeafSpec, ...], structure: ExampleStructure, state: ModuleState,
              only_tensors: bool) -> dict[str, Any]:
    """The defaulted arguments ``graph`` does not read that must be fixed too.

    An argument the graph does not use may still have steered the forward's Python (``if
    y is not None:`` is true of a traced value): where the graph traced with it fixed to
    its default differs, it is fixed, so that the traced model computes what the model
    computes when it is left out, and another value raises instead of taking the traced
    branch. With ``only_tensors``, every unused argument not annotated as a tensor is
    fixed as well (a list, unlike a traced value, passes ``isinstance(v, list)``). An
    argument left free is one the traced model ignores as the original does (BasicGNN's
    ``batch=`` without a per-graph normalization).
    """
    unused = {str(n.target) for n in graph.nodes if n.op == "placeholder" and not n.users}
    tensors = _tensor_arguments(model)
    extra = {}
    for k, v in defaults.items():
        if k not in unused or k in fixed:
            continue
        if only_tensors and k not in tensors:
            extra[k] = v
            continue
        trial_graph, _ = _trace_once(model, {**fixed, k: v}, leaves, structure, state)
        if not _same_skeleton(trial_graph, {**fixed, k: v}, graph, fixed):
            extra[k] = v
    return extra


def _tensor_arguments(model: nn.Module) -> set[str]:
    """forward's arguments annotated as a tensor or an optional one (``OptTensor``)."""
    try:
        hints = typing.get_type_hints(model.forward)
    except Exception:  # unresolvable annotations: none is known to be a tensor
        return set()
    return {k for k, h in hints.items()
            if h is torch.Tensor or set(typing.get_args(h)) == {torch.Tensor, type(None)}}


def _same_skeleton(a: Graph, a_fixed: dict[str, Any], b: Graph, b_fixed: dict[str, Any]) -> bool:
    try:
        return bool(_skeleton(a, a_fixed) == _skeleton(b, b_fixed))
    except RuntimeError:  # a tensor among the arguments: compared as different
        return False


def _skeleton(graph: Graph, fixed: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What ``graph`` computes, independent of node names and of the ``_assert_is_none``
    checks and renamed placeholders (``batch_1``) that fixing arguments adds."""
    ids: dict[torch.fx.Node, Any] = {}
    rows: list[tuple[Any, ...]] = []
    for n in graph.nodes:
        if n.op == "placeholder":
            name = str(n.target)
            ids[n] = ("argument", name[:-2] if name.endswith("_1") and name[:-2] in fixed
                      else name)
        elif not (n.op == "call_function" and n.target is _ASSERT_IS_NONE):
            ids[n] = len(rows)
            rows.append((n.op, n.target,
                         torch.fx.node.map_arg((n.args, n.kwargs), lambda a: ids.get(a, a))))
    return rows


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

    def base(ph: torch.fx.Node) -> str:
        original = str(ph.target)
        return original[:-2] if original.endswith("_1") and original[:-2] in fixed else original

    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is _ASSERT_IS_NONE and node.args \
                and isinstance(node.args[0], torch.fx.Node) and base(node.args[0]) in fixed:
            graph.erase_node(node)
    by_name = {}
    for ph in placeholders:
        name = base(ph)
        if name in fixed:
            ph.target = name
            ph.name = name
            by_name[name] = ph
    guard = free_name(gm, "fixed_arguments")
    gm.add_submodule(guard, FixedArguments({k: fixed[k] for k in by_name}, model, unused))
    with graph.inserting_after(placeholders[-1]):
        graph.call_module(guard, tuple(by_name[k] for k in by_name))
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
    if getattr(exc, "fxquant_hint", None):
        where_in = f" (inside submodule {failed_in!r})" if failed_in else ""
        return TraceError(f"could not trace {type(model).__name__}.forward{at}{where_in}: "
                          f"{exc}\n{exc.fxquant_hint}")  # type: ignore[attr-defined]
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
