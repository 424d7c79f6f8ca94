"""What a traced heterogeneous or graph-level model says about its layers: which node type
or edge type a layer serves, which values are dicts keyed by node type, which nodes are
plumbing (lookups of the forward's arguments), and which calls pool a graph's nodes.

Node and edge types are read off the model as PyG builds it:

- ``HeteroConv`` keeps each edge type's convolution in a PyG ``ModuleDict`` under
  ``convs.<src___rel___dst>``, whose ``keys()`` give the edge types back;
- ``to_hetero`` copies each module once per node type or edge type into a
  ``torch.nn.ModuleDict`` under PyG's ``key2str`` spelling (``conv1.author__writes__paper``,
  ``lin.paper``); a ``ModuleDict`` of one's own keyed by node type (``self.lin =
  ModuleDict({"paper": ..., "author": ...})``) reads the same way.

A key of a ``torch.nn.ModuleDict`` with three ``__``-separated parts is read as an edge
type, any other key as a node type.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

from torch import nn
from torch.fx import GraphModule, Node
from torch_geometric.nn.aggr import Aggregation
from torch_geometric.nn.module_dict import ModuleDict as PygModuleDict

from fxquant.fx.guards import FixedArguments, StructureGuard

__all__ = [
    "POOLING_CALLS",
    "TYPES_KEY",
    "dict_input",
    "dict_output_keys",
    "is_plumbing",
    "key2str",
    "layer_type",
    "model_types",
    "module_types",
    "pooling_nodes",
    "readout_nodes",
]

#: A node type (``"paper"``) or an edge type (``("author", "writes", "paper")``).
TypeKey = str | tuple[str, ...]


def key2str(key: Any) -> str:
    """PyG's ``to_hetero`` spelling of a node or edge type as a module name
    (``torch_geometric.nn.to_hetero_transformer.key2str``).

    Example:
        >>> key2str(("author", "writes", "paper")), key2str("field of study")
        ('author__writes__paper', 'field_of_study')
    """
    text = "__".join(key) if isinstance(key, tuple) else str(key)
    return text.replace(" ", "_").replace("-", "_").replace(":", "_")


def _child_key(parent: nn.Module, name: str) -> TypeKey | None:
    """The node or edge type a child ``name`` of a module dict stands for."""
    if isinstance(parent, PygModuleDict):
        key = PygModuleDict.to_external_key(name)
        return key if isinstance(key, (str, tuple)) else None
    if isinstance(parent, nn.ModuleDict):
        parts = name.split("__")
        return tuple(parts) if len(parts) == 3 and all(parts) else name
    return None


#: The key of ``GraphModule.meta`` where :func:`fxquant.trace` records the node or edge
#: type of each layer that is a module dict's entry (a trace keeps the layers, not the
#: module dicts that held them): qualified name -> ``("edge" | "node", key)``.
TYPES_KEY = "fxquant_types"


def module_types(model: nn.Module, targets: Iterable[str]) -> dict[str, tuple[str, TypeKey]]:
    """The node or edge type of each module of ``model`` named in ``targets`` that is an
    entry of a module dict (see the module docs)."""
    found: dict[str, tuple[str, TypeKey]] = {}
    for target in targets:
        parent_name, _, name = target.rpartition(".")
        if not parent_name:
            continue
        try:
            parent = model.get_submodule(parent_name)
        except AttributeError:
            continue
        key = _child_key(parent, name)
        if key is not None:
            found[target] = ("edge", key) if isinstance(key, tuple) else ("node", key)
    return found


def layer_type(gm: GraphModule, node: Node) -> tuple[str, TypeKey] | None:
    """``("edge", edge_type)`` or ``("node", node_type)`` for a layer that is one node or
    edge type's copy of a module (``HeteroConv``'s, ``to_hetero``'s, a ``ModuleDict`` of
    one's own), else None.

    Example:
        >>> import torch, fxquant
        >>> from torch_geometric.nn import HeteroConv, SAGEConv
        >>> class Net(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.conv = HeteroConv({("a", "to", "b"): SAGEConv((2, 2), 2)})
        ...     def forward(self, x_dict, edge_index_dict):
        ...         return self.conv(x_dict, edge_index_dict)["b"]
        >>> x = {"a": torch.zeros(2, 2), "b": torch.zeros(1, 2)}
        >>> edges = {("a", "to", "b"): torch.tensor([[0, 1], [0, 0]])}
        >>> gm = fxquant.trace(Net(), example_inputs=(x, edges))
        >>> [layer_type(gm, n) for n in gm.graph.nodes if n.op == "call_module"]
        [None, ('edge', ('a', 'to', 'b'))]
    """
    if node.op != "call_module":
        return None
    recorded = gm.meta.get(TYPES_KEY)
    if recorded is not None:
        return recorded.get(str(node.target))
    return module_types(gm, [str(node.target)]).get(str(node.target))


def model_types(gm: GraphModule, nodes: Iterable[Node]) -> tuple[list[str], list[tuple[str, ...]]]:
    """The node types and edge types the layers among ``nodes`` serve (in graph order,
    each once), and the keys of dicts layers take and return (node types)."""
    node_types: dict[str, None] = {}
    edge_types: dict[tuple[str, ...], None] = {}
    for n in nodes:
        found = layer_type(gm, n)
        if found is not None and found[0] == "edge":
            key = found[1]
            assert isinstance(key, tuple)
            edge_types[key] = None
            node_types[key[0]] = node_types[key[-1]] = None
        elif found is not None:
            node_types[str(found[1])] = None
        for key in [*dict_output_keys(n), *(dict_input(n) or {})]:
            if isinstance(key, str):
                node_types[key] = None
    return list(node_types), list(edge_types)


def _lookup_key(node: Node) -> tuple[Node, Any] | None:
    """``(container, key)`` where ``node`` looks a constant key up in another node:
    ``x_dict["paper"]``, ``x_dict.get("paper", None)``, ``data.edge_index``."""
    if node.op == "call_function" and node.target in (operator.getitem, getattr) \
            and len(node.args) >= 2 and isinstance(node.args[0], Node):
        return node.args[0], node.args[1]
    if node.op == "call_method" and node.target == "get" and len(node.args) >= 2 \
            and isinstance(node.args[0], Node):
        return node.args[0], node.args[1]
    return None


def _is_dict_key(key: Any) -> bool:
    return isinstance(key, str) or (isinstance(key, tuple) and bool(key)
                                    and all(isinstance(k, str) for k in key))


def is_plumbing(gm: GraphModule, node: Node) -> bool:
    """Whether ``node`` only carries the forward's arguments along, holding no value of
    its own to round: a lookup by name or by node or edge type in a forward argument
    (``x_dict["paper"]``, ``edge_index_dict.get(("a", "to", "b"))``, ``data.edge_index``,
    PyG ``to_hetero``'s getters), a chain of such lookups, or a check fxquant's trace
    inserted (the structure guard)."""
    if node.op == "call_module":
        return isinstance(gm.get_submodule(str(node.target)), (StructureGuard, FixedArguments))
    if node.op == "call_function" and getattr(node.target, "__name__", "") == "get_dict" \
            and getattr(node.target, "__module__", "").startswith("torch_geometric"):
        source = node.args[0] if node.args else None  # to_hetero's get_dict(x)
        return isinstance(source, Node) and (source.op == "placeholder"
                                             or is_plumbing(gm, source))
    found = _lookup_key(node)
    if found is None:
        return False
    container, key = found
    if not _is_dict_key(key):
        return False
    return container.op == "placeholder" or is_plumbing(gm, container)


def dict_output_keys(node: Node) -> list[Any]:
    """The keys ``node``'s value is looked up by, where it is a dict of node types (every
    user a ``value["paper"]`` lookup, as a traced ``HGTConv``'s output): those lookups
    whose values are used, in graph order; ``[]`` where it is not such a dict."""
    users = list(node.users)
    if node.op != "call_module" or not users:
        return []
    keys: list[Any] = []
    for user in users:
        if not (user.op == "call_function" and user.target is operator.getitem
                and len(user.args) == 2 and user.args[0] is node
                and _is_dict_key(user.args[1])):
            return []
        if user.users and user.args[1] not in keys:
            keys.append(user.args[1])
    return keys


def dict_input(node: Node) -> dict[Any, Node] | None:
    """The dict of traced values a layer call passes as its first argument
    (``conv({"paper": h_paper, "author": h_author}, edge_index_dict)``): key -> node,
    those entries that are nodes; None where the first argument is not such a dict."""
    first = node.args[0] if node.args else None
    if not isinstance(first, dict) or not first:
        return None
    found = {k: v for k, v in first.items() if isinstance(v, Node)}
    return found if found and all(_is_dict_key(k) for k in first) else None


#: The pooling functions of PyG whose output has one row per graph of a mini-batch.
POOLING_CALLS = ("global_add_pool", "global_mean_pool", "global_max_pool")


def _is_pooling(gm: GraphModule, node: Node) -> bool:
    if node.op == "call_function":
        return getattr(node.target, "__name__", "") in POOLING_CALLS \
            and getattr(node.target, "__module__", "").startswith("torch_geometric")
    if node.op == "call_module":
        return isinstance(gm.get_submodule(str(node.target)), Aggregation)
    return False


def pooling_nodes(gm: GraphModule) -> list[Node]:
    """The calls that pool each graph's nodes into one row (PyG's ``global_add_pool``,
    ``global_mean_pool``, ``global_max_pool``, or an aggregation module such as
    ``SumAggregation`` called in the model's own graph), in graph order."""
    return [n for n in gm.graph.nodes if _is_pooling(gm, n)]


def readout_nodes(gm: GraphModule, readout: tuple[type[nn.Module], ...]) -> list[Node]:
    """The calls of modules of the ``readout`` classes that read a pooled value (the
    head of a graph classifier: the linear layers after the pooling), in graph order."""
    after: set[Node] = set()
    frontier = pooling_nodes(gm)
    while frontier:
        node = frontier.pop()
        for user in node.users:
            if user not in after:
                after.add(user)
                frontier.append(user)
    return [n for n in gm.graph.nodes if n in after and n.op == "call_module"
            and isinstance(gm.get_submodule(str(n.target)), readout)]
