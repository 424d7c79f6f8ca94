"""Quantization inside an unmodified layer: its weights, its messages, its aggregation.

PyG's message and aggregate hooks do not run under ``torch.compile`` (PyG switches to a
generated ``propagate`` without the hook loops), and ``torch.nn.utils.parametrize``
modules cannot be pickled. So on the transformed copy of a layer (never its class, never
the user's instance) fxquant sets small callable objects as instance attributes, which
Python finds before the class's methods, and which the generated ``propagate`` calls like
any method (it calls ``self.aggregate(...)`` and ``self.message_and_aggregate(...)`` by
attribute):

- ``layer.forward``: a :class:`QuantizedForward` that rounds every weight (floating
  parameters with at least two dims: weight matrices, GAT's attention vectors; biases and
  scalars stay float32) and runs the layer's own forward on them with
  :func:`torch.func.functional_call`; the weight of a ``torch.nn.Linear`` / PyG ``Linear``
  child is rounded where the child is called instead (its :class:`QuantizedLinear`, as
  torch.ao's QAT ``Linear`` rounds its own weight), which keeps a compiled layer in one
  graph. The optimizer keeps updating the float32 master
  weights (the rounding's gradient is straight-through), and ``state_dict`` keys are the
  original ones.
- ``layer.aggregate``: a :class:`QuantizedAggregate` that rounds what it receives (the
  messages: ``message()``'s output, one row per edge) and what it returns (the
  aggregation, one row per node, before ``update()``). It knows each message's target
  node (``index``), so per-node settings of messages follow their target.
- ``layer.propagate`` (the ``edge`` site, or messages protected by their source): a
  :class:`QuantizedPropagate` that rounds the per-edge arguments ``message()`` receives
  (those without an ``_i``/``_j`` suffix) and tells the message point each message's
  source node.
- each linear child's ``forward`` (the ``linear`` site): a :class:`QuantizedLinear` that
  rounds what the ``torch.nn.Linear`` / PyG ``Linear`` returns (``X W``).
- ``layer.message_and_aggregate``: a :class:`NoFusedPath` that raises: a fused path
  (a ``SparseTensor`` adjacency) has no per-edge messages to round.

Layers that compute per relation (``RGCNConv``, ``FastRGCNConv``, ``HGTConv``) round
their messages with one point per relation (:mod:`fxquant.quant.parts`), and both RGCN
layers round the same tensors there: each relation's messages ``x_j W_r``.
``FastRGCNConv`` computes them per edge and hands ``aggregate`` each message's relation;
``RGCNConv`` aggregates each relation's raw features and multiplies by ``W_r`` after, so
its ``forward`` object runs the same computation in the other order (``x W_r`` first,
then one ``propagate`` per relation, as PyG's own ``RGCNConv`` does for featureless
nodes; the sum is linear, so the float result is the same up to rounding);
``HGTConv``'s messages come in one call, grouped by edge type, which its ``forward``
object tells ``aggregate``. A per-relation weight (``RGCNConv.weight[r]``, ``HGTConv``'s
``k_rel``/``v_rel`` rows of an edge type) is rounded slice by slice, each by its
relation's point.

With ``Protection(share="layer")`` the layer's ``forward`` object also draws the layer's
protective mask at the start of each training call (from the call's ``edge_index``), so
that every point inside shares it.

The objects hold their :class:`~fxquant.quant.points.QuantPoint` modules, which are also
registered on the GraphModule (so ``print(gm)``, ``.to()`` and ``state_dict`` see them).
All of it pickles by reference to this module, survives ``deepcopy`` (identities are
kept), and compiles: dynamo inlines the objects like methods, so compiled == eager.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils.stateless import _reparametrize_module
from torch_geometric.nn import FastRGCNConv, HGTConv, MessagePassing, RGCNConv
from torch_geometric.nn.dense.linear import Linear as PygLinear

from fxquant.errors import FxquantRuntimeError, FxquantValueError
from fxquant.fx.degree import index_degree, node_degree
from fxquant.quant.parts import weight_relation_rows
from fxquant.quant.points import QuantPoint

__all__ = [
    "NoFusedPath",
    "QuantizedAggregate",
    "QuantizedForward",
    "QuantizedLinear",
    "QuantizedPropagate",
    "check_install",
    "edge_arguments",
    "hgt_relations",
    "install",
    "linears_of",
    "patched_children",
    "rgcn_by_relation",
    "weights_of",
]

#: the linear transforms the ``linear`` site rounds the output of
LINEARS: tuple[type[nn.Module], ...] = (nn.Linear, PygLinear)


def weights_of(module: nn.Module) -> list[str]:
    """The names of the parameters the weight site rounds: floating, at least 2-D."""
    return [name for name, p in module.named_parameters()
            if p.is_floating_point() and p.dim() >= 2]


def linears_of(module: nn.Module) -> list[str]:
    """The names of the linear transforms inside ``module`` the linear site rounds (these
    exact classes: a subclass such as ``MultiheadAttention``'s ``out_proj`` may be used
    without calling it)."""
    return [name for name, m in module.named_modules() if name and type(m) in LINEARS]


def edge_arguments(module: MessagePassing) -> list[str]:
    """The arguments of ``module.message()`` the edge site rounds: those PyG passes through
    from ``propagate`` unchanged (no ``_i``/``_j`` suffix), which are per-edge tensors."""
    names = module.inspector.get_param_names("message")
    return [n for n in names if not n.endswith(("_i", "_j"))
            and n not in ("index", "ptr", "size", "size_i", "size_j", "dim_size")]


#: a weight rounded slice by slice: each relation's rows of it and that relation's point
RelationSlices = dict[Any, tuple[list[int], QuantPoint]]


class QuantizedForward:
    """``layer.forward`` with every weight rounded by its point (see the module docs), and
    the layer's protective mask drawn at the start of a training call (``drawer``: a point
    of the layer with ``Protection(share="layer")``). ``relations``: weights rounded per
    relation (tensor name -> each relation's rows and point); ``messages``: the layer's
    :class:`QuantizedAggregate` where it rounds messages per relation (``RGCNConv``,
    ``HGTConv``: see the module docs)."""

    def __init__(self, owner: nn.Module, points: dict[str, QuantPoint],
                 drawer: QuantPoint | None = None,
                 relations: dict[str, RelationSlices] | None = None,
                 messages: QuantizedAggregate | None = None) -> None:
        self.owner = owner
        self.points = points
        self.drawer = drawer
        self.relations = dict(relations or {})
        self.messages = messages
        self.lock = threading.RLock()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("relations", {})  # (pickled before weights per relation)
        state.setdefault("messages", None)
        self.__dict__.update(state)
        self.lock = threading.RLock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.drawer is not None and self.drawer.training and not self.drawer.has_mask:
            self._draw(args, kwargs)
        if not self.points and not self.relations:
            return self._layer_call(args, kwargs)
        if torch.compiler.is_compiling():
            return self._rounded_call(args, kwargs)
        with self.lock:  # (one call at a time swaps the layer's parameters)
            return self._rounded_call(args, kwargs)

    def _rounded_call(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        params = dict(self.owner.named_parameters())
        rounded = {name: point(params[name]) for name, point in self.points.items()}
        for name, slices in self.relations.items():
            weight: Tensor = params[name]
            for rows, point in slices.values():
                index = torch.tensor(rows, dtype=torch.long, device=weight.device)
                weight = weight.index_copy(0, index, point(params[name].index_select(0, index)))
            rounded[name] = weight
        # the rounded weights in place of the parameters for this call only (what
        # torch.func.functional_call does, without calling the module again, which would
        # run its hooks a second time); restored on exit, also on error
        with _reparametrize_module(self.owner, rounded):
            return self._layer_call(args, kwargs)

    def _layer_call(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        """The layer's own forward; for messages rounded per relation, the computation
        that hands each message's relation to the aggregation (see the module docs)."""
        owner, messages = self.owner, self.messages
        if messages is None or isinstance(owner, FastRGCNConv):
            return type(owner).forward(owner, *args, **kwargs)
        if isinstance(owner, RGCNConv):
            return rgcn_by_relation(owner, messages, *args, **kwargs)
        assert isinstance(owner, HGTConv)
        edges = args[1] if len(args) > 1 else kwargs.get("edge_index_dict")
        messages.row_relations = hgt_relations(owner, edges)
        try:
            return type(owner).forward(owner, *args, **kwargs)
        finally:
            messages.row_relations = None

    def _draw(self, args: tuple, kwargs: dict[str, Any]) -> None:
        """Draw the layer's mask over its nodes (the in-degree of this call's graph); on a
        ``(source, target)`` pair one over each side (the sources by out-degree)."""
        assert self.drawer is not None and self.drawer.protection is not None
        x = args[0] if args else next(iter(kwargs.values()), None)
        edge_index = args[1] if len(args) > 1 else kwargs.get("edge_index")
        if not (isinstance(edge_index, Tensor) and not edge_index.is_sparse
                and edge_index.dim() == 2):
            return
        protection = self.drawer.protection
        if isinstance(x, (tuple, list)) and len(x) == 2 and x[0] is not x[1]:
            source, target = x
            if isinstance(target, Tensor) and protection.shared("target") is None:
                protection.mask(node_degree(edge_index, target.shape[0]))
            if isinstance(source, Tensor) and protection.shared("source") is None:
                protection.mask(node_degree(edge_index, source.shape[0], side="source"),
                                side="source")
            return
        if isinstance(x, (tuple, list)) and x:
            x = x[0]
        if isinstance(x, Tensor):
            protection.mask(node_degree(edge_index, x.shape[0]))


def rgcn_by_relation(owner: RGCNConv, messages: QuantizedAggregate, x: Any,
                     edge_index: Any, edge_type: Tensor | None = None) -> Tensor:
    """``RGCNConv.forward`` computing each relation's messages ``x_j W_r`` (what
    ``FastRGCNConv`` computes), one ``propagate`` per relation, so that ``messages``
    rounds them with relation ``r``'s point; otherwise PyG's code (the basis and block
    decompositions, featureless nodes given as indices, ``root``, ``bias``)."""
    x_l = x[0] if isinstance(x, tuple) else x
    if x_l is None:
        x_l = torch.arange(owner.in_channels_l, device=owner.weight.device)
    x_r = x[1] if isinstance(x, tuple) else x_l
    if not isinstance(edge_index, Tensor) or edge_index.is_sparse or edge_type is None:
        raise FxquantRuntimeError(
            f"fxquant: layer {messages.layer!r} (RGCNConv) rounds its messages per relation, "
            "which needs an edge_index tensor and an edge_type tensor; please pass them "
            "(not a SparseTensor adjacency)")
    size = (x_l.size(0), x_r.size(0))
    weight = owner.weight
    if owner.num_bases is not None:
        weight = (owner.comp @ weight.view(owner.num_bases, -1)).view(
            owner.num_relations, owner.in_channels_l, owner.out_channels)
    if owner.num_blocks is not None and not x_r.is_floating_point():
        raise FxquantValueError(
            f"fxquant: layer {messages.layer!r} (RGCNConv with num_blocks) takes float node "
            "features: its block-diagonal weights cannot index by node id, as RGCNConv "
            "itself refuses; please pass float features (e.g. an embedding's output)")
    dtype = x_l.dtype if x_l.is_floating_point() else weight.dtype
    out = torch.zeros(x_r.size(0), owner.out_channels, device=x_r.device, dtype=dtype)
    for i in range(owner.num_relations):
        tmp = edge_index[:, edge_type == i]
        if not x_l.is_floating_point():
            h = weight[i, x_l]
        elif owner.num_blocks is not None:
            h = torch.einsum("abc,bcd->abd", x_l.view(-1, weight.size(1), weight.size(2)),
                             weight[i]).reshape(-1, owner.out_channels)
        else:
            h = x_l @ weight[i]
        messages.current = i
        try:
            out = out + owner.propagate(tmp, x=h, edge_type_ptr=None, size=size)
        finally:
            messages.current = None
    root = owner.root
    if root is not None:
        out = out + (root[x_r] if not x_r.is_floating_point() else x_r @ root)
    if owner.bias is not None:
        out = out + owner.bias
    return out


def hgt_relations(owner: HGTConv, edge_index_dict: Any) -> Tensor:
    """The relation (index into ``owner.edge_types``) of each message of an ``HGTConv``
    call: its ``propagate`` concatenates the edges of ``edge_index_dict``'s edge types in
    that dict's order."""
    if not isinstance(edge_index_dict, dict) or not all(
            isinstance(e, Tensor) and not e.is_sparse for e in edge_index_dict.values()):
        raise FxquantRuntimeError(
            "fxquant: an HGTConv layer rounds its messages per relation, which needs "
            "edge_index_dict to hold [2, num_edges] tensors (not SparseTensor adjacencies)")
    counts = [int(e.size(1)) for e in edge_index_dict.values()]
    kinds = [owner.edge_types_map[tuple(et)] for et in edge_index_dict]
    device = next(iter(edge_index_dict.values())).device if counts else None
    return torch.repeat_interleave(torch.tensor(kinds, dtype=torch.long, device=device),
                                   torch.tensor(counts, dtype=torch.long, device=device))


class QuantizedLinear:
    """A linear child's ``forward`` that rounds its weight (the ``weight`` site's point of
    that weight) and its output (``X W``, one row per node: the ``linear`` site)."""

    def __init__(self, owner: nn.Module, point: QuantPoint | None,
                 weight: QuantPoint | None = None) -> None:
        self.owner = owner
        self.point = point
        self.weight = weight

    def __call__(self, x: Tensor) -> Tensor:
        owner = self.owner
        if self.weight is None:
            out = type(owner).forward(owner, x)
        else:
            bias = owner.bias if isinstance(owner.bias, Tensor) else None
            out = torch.nn.functional.linear(x, self.weight(owner.weight), bias)
        return out if self.point is None else self.point(out)


class QuantizedPropagate:
    """``layer.propagate`` that rounds the per-edge arguments of ``message()`` (the ``edge``
    site) and records each message's source node for the message point."""

    def __init__(self, owner: MessagePassing, edge: QuantPoint | None,
                 aggregate: QuantizedAggregate | None) -> None:
        self.owner = owner
        self.edge = edge
        self.aggregate = aggregate
        self.names = edge_arguments(owner)

    def __call__(self, edge_index: Any, size: Any = None, **kwargs: Any) -> Tensor:
        plain = isinstance(edge_index, Tensor) and not edge_index.is_sparse \
            and edge_index.dim() == 2 and not edge_index.is_floating_point()
        i, j = (1, 0) if self.owner.flow == "source_to_target" else (0, 1)
        if self.aggregate is not None:
            self.aggregate.sources = edge_index[j] if plain else None
            self.aggregate.source_count = self._source_count(size, kwargs, j) if plain else None
        if self.edge is not None:
            if not plain:
                raise FxquantRuntimeError(
                    f"fxquant: the edge site of layer {self.edge.layer!r} rounds the per-edge "
                    "arguments of message(), but this call passes an adjacency that is not a "
                    "[2, num_edges] edge_index tensor (e.g. a SparseTensor, whose values are "
                    "inside it); please pass an edge_index tensor")
            found = [n for n in self.names if isinstance(kwargs.get(n), Tensor)
                     and kwargs[n].is_floating_point()]
            if not found and not torch.compiler.is_compiling():
                warnings.warn(
                    f"fxquant: the edge site of layer {self.edge.layer!r} found no floating "
                    f"per-edge argument ({', '.join(self.names)}) in this call, so it rounded "
                    "nothing; pass edge weights, or drop the edge site of this layer",
                    UserWarning, stacklevel=2)
            degree = source_degree = None
            if self.edge.needs_nodes:  # per-node settings: each edge follows its target
                targets = self._target_nodes(edge_index, size, kwargs, i, j)
                degree = index_degree(edge_index[i], targets)
                sources = self._source_count(size, kwargs, j)
                if sources is not None:  # (source, target): the sources' out-degrees
                    source_degree = index_degree(edge_index[j], sources)
            for name in found:
                kwargs[name] = self.edge(kwargs[name], node_degree=degree,
                                         row_nodes=edge_index[i], row_sources=edge_index[j],
                                         source_degree=source_degree)
        return type(self.owner).propagate(self.owner, edge_index, size=size, **kwargs)

    def _source_count(self, size: Any, kwargs: dict[str, Any], j: int) -> int | None:
        """How many source nodes a ``(source, target)`` call has (``size``, else the source
        tensor of a pair ``message()`` reads as ``x_j``); None on a graph of one node set
        (one tensor, or a pair of the same tensor), whose sources are its nodes."""
        if size is not None and size[0] is not None and size[1] is not None \
                and int(size[0]) != int(size[1]):
            return int(size[j])
        for name in self.owner.inspector.get_param_names("message"):
            data = kwargs.get(name[:-2]) if name[-2:] in ("_i", "_j") else None
            if isinstance(data, tuple | list) and len(data) == 2 and data[0] is not data[1] \
                    and isinstance(data[j], Tensor):
                return int(data[j].size(self.owner.node_dim))
        return None

    def _target_nodes(self, edge_index: Tensor, size: Any, kwargs: dict[str, Any], i: int,
                      j: int) -> int:
        """How many target nodes this call has, as ``propagate`` finds it: ``size``, else
        the node tensors ``message()`` reads as ``x_i`` / ``x_j`` (a pair: both sides);
        where neither says, the batch's ``node_ids``, else one more than the largest target
        (the aggregation's own default)."""
        sizes: list[int | None] = list(size) if size is not None else [None, None]
        for name in self.owner.inspector.get_param_names("message"):
            if name[-2:] not in ("_i", "_j") or sizes[i] is not None:
                continue
            dim = i if name.endswith("_i") else j
            data = kwargs.get(name[:-2])
            if isinstance(data, tuple | list) and len(data) == 2:
                if isinstance(data[i], Tensor):
                    sizes[i] = data[i].size(self.owner.node_dim)
                data = data[dim]
            if isinstance(data, Tensor) and sizes[dim] is None:
                sizes[dim] = data.size(self.owner.node_dim)
        found = sizes[i] if sizes[i] is not None else sizes[j]
        if found is not None:
            return int(found)
        assert self.edge is not None
        context = self.edge.__dict__.get("_node_ids")
        if context is not None and context.ids is not None:
            return int(context.ids.shape[0])
        return int(edge_index[i].max()) + 1 if edge_index.numel() else 0


class QuantizedAggregate:
    """``layer.aggregate`` with the messages rounded on the way in and the aggregation on
    the way out (see the module docs); ``relations``: the message points of a layer that
    computes per relation (relation -> point; ``keys``: the relations by index)."""

    #: (objects pickled before messages per relation)
    relations: dict[Any, QuantPoint] | None = None
    keys: list[Any] | None = None
    layer: str = ""

    def __init__(self, owner: MessagePassing, message: QuantPoint | None,
                 aggregate: QuantPoint | None, relations: dict[Any, QuantPoint] | None = None,
                 keys: list[Any] | None = None, layer: str = "") -> None:
        self.owner = owner
        self.message = message
        self.aggregate = aggregate
        self.relations = relations or None
        self.keys = keys
        self.layer = layer
        #: each message's source node in the current call (set by QuantizedPropagate),
        #: and how many sources a (source, target) call has (None: one node set)
        self.sources: Tensor | None = None
        self.source_count: int | None = None
        #: the relation of this call's messages (RGCNConv: one propagate per relation) or
        #: of each message (HGTConv: by edge type), set by the layer's forward object
        self.current: Any = None
        self.row_relations: Tensor | None = None

    def __getstate__(self) -> dict[str, Any]:  # the last call's, not state
        return {**self.__dict__, "sources": None, "source_count": None, "current": None,
                "row_relations": None}

    def __call__(self, inputs: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        index = kwargs.get("index", args[0] if args else None)
        dim_size = kwargs.get("dim_size")
        degree = nodes = source_degree = None
        points = [self.message, self.aggregate, *(self.relations or {}).values()]
        per_node = any(p is not None and p.needs_nodes for p in points)
        if per_node and isinstance(index, Tensor) and isinstance(dim_size, int):
            degree = index_degree(index, dim_size)  # the messages' targets
            nodes = index
            count = self.__dict__.get("source_count")
            sources = self.__dict__.get("sources")
            if count is not None and sources is not None:  # (source, target): out-degrees
                source_degree = index_degree(sources, count)
        sources = self.__dict__.get("sources")
        if self.message is not None:
            inputs = self.message(inputs, node_degree=degree, row_nodes=nodes,
                                  row_sources=sources, source_degree=source_degree)
        if self.relations:
            inputs = self._by_relation(inputs, kwargs, degree, nodes, sources, source_degree)
        out = type(self.owner).aggregate(self.owner, inputs, *args, **kwargs)
        if self.aggregate is not None:
            out = self.aggregate(out, node_degree=degree)
        return out

    def _by_relation(self, inputs: Tensor, kwargs: dict[str, Any], degree: Tensor | None,
                     nodes: Tensor | None, sources: Tensor | None,
                     source_degree: Tensor | None) -> Tensor:
        """Each relation's messages rounded by its point (a relation without one stays as
        it is)."""
        assert self.relations is not None and self.keys is not None
        current = self.__dict__.get("current")
        if current is not None:  # RGCNConv: this call's messages are one relation's
            point = self.relations.get(current)
            return inputs if point is None else point(
                inputs, node_degree=degree, row_nodes=nodes, row_sources=sources,
                source_degree=source_degree)
        kinds = kwargs.get("edge_type") if isinstance(self.owner, FastRGCNConv) \
            else self.__dict__.get("row_relations")
        if not isinstance(kinds, Tensor) or kinds.shape[0] != inputs.shape[0]:
            raise FxquantRuntimeError(
                f"fxquant: the messages of layer {self.layer!r} are rounded per relation, but "
                "this call does not say which relation each message belongs to; please call "
                "the layer with an edge_index tensor (and its edge_type)")
        out = inputs
        for i, key in enumerate(self.keys):
            point = self.relations.get(key)
            if point is None:
                continue
            rows = (kinds == i).nonzero().view(-1)
            out = out.index_copy(0, rows, point(
                inputs.index_select(0, rows), node_degree=degree,
                row_nodes=None if nodes is None else nodes.index_select(0, rows),
                row_sources=None if sources is None else sources.index_select(0, rows),
                source_degree=source_degree))
        return out


class NoFusedPath:
    """``layer.message_and_aggregate``: the fused path has no messages to round."""

    def __init__(self, owner: MessagePassing, layer: str, sites: list[str]) -> None:
        self.owner = owner
        self.layer = layer
        self.sites = sites

    def __call__(self, *args: Any, **kwargs: Any) -> Tensor:
        raise FxquantRuntimeError(
            f"fxquant: layer {self.layer!r} ({type(self.owner).__name__}) took PyG's fused "
            f"message_and_aggregate path (a SparseTensor or sorted EdgeIndex adjacency), "
            f"which computes no per-edge messages, so its {' and '.join(self.sites)} "
            "site cannot be rounded. Please pass a plain edge_index tensor, or quantize "
            "its 'input'/'output' sites instead."
        )


#: the objects :func:`install` sets on a layer
SITE_OBJECTS = (QuantizedForward, QuantizedLinear, QuantizedPropagate, QuantizedAggregate,
                NoFusedPath)


def _free(owner: nn.Module, attribute: str, where: str, what: str) -> None:
    """Raise unless ``owner`` (``where``: ``"layer 'conv1'"``) has no instance attribute
    ``attribute`` to be replaced."""
    current = vars(owner).get(attribute)
    if current is None:
        return
    if isinstance(current, SITE_OBJECTS):
        raise FxquantValueError(
            f"{where} already rounds inside: its {attribute} was set by an earlier "
            f"fxquant.transform, and rounding {what} again would silently drop those points. "
            "Please transform the original model once, with every site in one QuantMapping")
    raise FxquantValueError(f"{where} already has its own {attribute} attribute "
                            f"({type(current).__name__}); fxquant cannot round {what}")


def _split_weights(module: nn.Module, weights: list[str]) -> tuple[list[str], list[str]]:
    """``weights`` as (the layer's own, the linear children whose ``weight`` they are)."""
    children = set(linears_of(module))
    by_child = [name.rpartition(".")[0] for name in weights
                if name.rpartition(".")[0] in children and name.endswith(".weight")]
    own = [name for name in weights
           if not (name.rpartition(".")[0] in children and name.endswith(".weight"))]
    return own, by_child


def patched_children(module: nn.Module, weights: list[str], linear: list[str] | None
                     ) -> list[str]:
    """The linear children of ``module`` whose ``forward`` :func:`install` sets for these
    ``weights`` and ``linear`` sites."""
    return sorted(set(linear or []) | set(_split_weights(module, weights)[1]))


def check_install(layer_name: str, module: nn.Module, weights: list[str], message: bool,
                  aggregate: bool, linear: list[str] | None = None, edge: bool = False,
                  sources: bool = False, draws: bool = False, relational: bool = False
                  ) -> None:
    """Raise, changing nothing, where :func:`install` could not set the objects of these
    sites on ``module``: ``weights`` and ``linear`` name the tensors and children rounded,
    ``sources``: messages protected by their source node, ``draws``: the layer's forward
    draws a ``Protection(share="layer")`` mask. A layer that already carries fxquant's
    objects (a model transformed before) is refused: replacing them would drop its points."""
    own, by_child = _split_weights(module, weights)
    where = f"layer {layer_name!r}"
    if own or draws or relational:
        _free(module, "forward", where, "its weights")
    for name in sorted(set(linear or []) | set(by_child)):
        _free(module.get_submodule(name), "forward", f"the linear {name!r} of {where}",
              "its weight or output")
    if not (message or aggregate or edge):
        return
    if not isinstance(module, MessagePassing):
        raise FxquantValueError(f"the message and aggregate sites need a PyG MessagePassing layer; "
                         f"{layer_name!r} is {type(module).__name__}")
    if getattr(module, "explain", False) or getattr(module, "decomposed_layers", 1) > 1:
        raise FxquantValueError(f"layer {layer_name!r} runs PyG's explain or decomposed_layers mode, "
                         "whose propagate fxquant does not round inside; please switch it off")
    if message or aggregate:
        for attribute in ("aggregate", "message_and_aggregate"):
            _free(module, attribute, where, "its messages and aggregation")
    if edge or sources:
        _free(module, "propagate", where, "its per-edge arguments")


def install(layer_name: str, module: nn.Module, weights: dict[str, QuantPoint] | None,
            message: QuantPoint | None, aggregate: QuantPoint | None,
            linear: dict[str, QuantPoint] | None = None, edge: QuantPoint | None = None,
            drawer: QuantPoint | None = None,
            weight_relations: dict[str, dict[Any, QuantPoint]] | None = None,
            message_relations: dict[Any, QuantPoint] | None = None,
            relations: list[Any] | None = None) -> None:
    """Set the site objects on ``module`` (the transformed copy), checked first by
    :func:`check_install` (nothing is set on error). ``drawer``: a point of the layer whose
    ``Protection(share="layer")`` mask the layer's forward draws at the start of each
    training call. ``weight_relations`` (weight name -> relation -> point) and
    ``message_relations`` (relation -> point): the points per relation of a layer that
    computes per relation, whose relations are ``relations`` (in their order)."""
    weights, linear = dict(weights or {}), dict(linear or {})
    weight_relations = {k: v for k, v in (weight_relations or {}).items() if v}
    message_relations = dict(message_relations or {})
    per_message = [p for p in (message, *message_relations.values()) if p is not None]
    sources = any(p.config.protect is not None and p.config.protect.messages == "source"
                  for p in per_message)
    check_install(layer_name, module, [*weights, *weight_relations], bool(per_message),
                  aggregate is not None, list(linear), edge is not None, sources,
                  drawer is not None, bool(message_relations))
    _, children = _split_weights(module, list(weights))
    by_child = {name: weights.pop(f"{name}.weight") for name in children}
    slices: dict[str, RelationSlices] = {}
    for name, points in weight_relations.items():
        rows = weight_relation_rows(module, name)
        assert rows is not None  # (the parts came from it)
        slices[name] = {key: (rows[key], point) for key, point in points.items()}
    rounds = None
    if per_message or aggregate is not None:
        assert isinstance(module, MessagePassing)  # (check_install)
        rounds = QuantizedAggregate(module, message, aggregate, message_relations,
                                    relations, layer_name)
    if weights or slices or drawer is not None or message_relations:
        module.forward = QuantizedForward(module, weights, drawer, slices,
                                          rounds if message_relations else None)
    for name in sorted(set(linear) | set(by_child)):
        child = module.get_submodule(name)
        child.forward = QuantizedLinear(child, linear.get(name), by_child.get(name))
    if not per_message and aggregate is None and edge is None:
        return
    assert isinstance(module, MessagePassing)  # (check_install)
    if rounds is not None:
        module.aggregate = rounds
    if edge is not None or sources:
        module.propagate = QuantizedPropagate(module, edge, rounds)
    sites = [site for site, on in (("message", bool(per_message)),
                                   ("aggregate", aggregate is not None)) if on]
    if sites:
        module.message_and_aggregate = NoFusedPath(module, layer_name, sites)
