"""What the recipes read off a traced model: its GNN layers in order, which values are
non-negative (after a ReLU), the raw input features, and which layers are chained through a
ReLU (to share a step)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx import GraphModule, Node
from torch_geometric.nn import MessagePassing

from fxquant.errors import FxquantValueError
from fxquant.fx.degree import check_edge_index
from fxquant.fx.selectors import layer_name
from fxquant.quant import QuantPoint, share_step

__all__ = ["chained", "gnn_layers", "input_after_relu", "is_raw_input", "num_nodes",
           "output_feeds_relu", "point_named", "points_of", "tie_steps"]


_RELUS: tuple[Any, ...] = (torch.relu, F.relu, torch.nn.ReLU)
_DROPOUTS: tuple[Any, ...] = (F.dropout, torch.dropout)


def _target_is(gm: GraphModule, node: Node, kinds: tuple[Any, ...], method: str) -> bool:
    if node.op == "call_function":
        return node.target in kinds
    if node.op == "call_method":
        return node.target == method
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        return isinstance(module, tuple(k for k in kinds if isinstance(k, type)))
    return False


def _passes_through(gm: GraphModule, node: Node) -> bool:
    """A dropout, an identity or a quantization point: the value's sign survives it."""
    if node.op == "call_module":
        return isinstance(gm.get_submodule(str(node.target)),
                          torch.nn.modules.dropout._DropoutNd | torch.nn.Identity | QuantPoint)
    return _target_is(gm, node, _DROPOUTS, "dropout")


def _source(gm: GraphModule, node: Any) -> Any:
    """``node``, or what the dropouts and identities right before it receive."""
    while isinstance(node, Node) and _passes_through(gm, node) and node.args:
        node = node.args[0]
    return node


def _consumers(gm: GraphModule, node: Node) -> list[Node]:
    """The users of ``node``, looking past dropouts and identities."""
    found: list[Node] = []
    for user in node.users:
        found += _consumers(gm, user) if _passes_through(gm, user) else [user]
    return found


def gnn_layers(gm: GraphModule) -> list[Node]:
    layers = [n for n in gm.graph.nodes if n.op == "call_module"
              and isinstance(gm.get_submodule(str(n.target)), MessagePassing)]
    if not layers:
        raise FxquantValueError("this recipe quantizes PyG MessagePassing layers, and the model "
                                "calls none; please build a QuantMapping for it instead")
    return layers


def _first_arg(layer: Node) -> Any:
    return layer.args[0] if layer.args else None


def input_after_relu(gm: GraphModule, layer: Node) -> bool:
    """The layer's input comes from a ReLU: it is non-negative."""
    source = _source(gm, _first_arg(layer))
    return isinstance(source, Node) and _target_is(gm, source, _RELUS, "relu")


def output_feeds_relu(gm: GraphModule, layer: Node) -> bool:
    """Every consumer of the layer's output is a ReLU: its negative values are zeroed."""
    users = _consumers(gm, layer)
    return bool(users) and all(_target_is(gm, u, _RELUS, "relu") for u in users)


def is_raw_input(layer: Node, gm: GraphModule) -> bool:
    source = _source(gm, _first_arg(layer))
    if not isinstance(source, Node):
        return False
    return source.op == "placeholder" or (
        source.op == "call_function" and source.target is getattr and bool(source.args)
        and isinstance(source.args[0], Node) and source.args[0].op == "placeholder")


def chained(gm: GraphModule, layer: Node, nxt: Node) -> bool:
    """``nxt``'s input is ``layer``'s output through one ReLU (and dropouts or identities),
    and nothing else reads that output."""
    relu = _source(gm, _first_arg(nxt))
    return isinstance(relu, Node) and _target_is(gm, relu, _RELUS, "relu") \
        and bool(relu.args) and _source(gm, relu.args[0]) is layer \
        and _consumers(gm, layer) == [relu]


def points_of(gm: nn.Module) -> Iterator[tuple[str, QuantPoint]]:
    for name, module in gm.named_modules():
        if isinstance(module, QuantPoint):
            yield name, module


def point_named(gm: nn.Module, layer: str, site: str) -> str | None:
    return next((name for name, p in points_of(gm) if p.layer == layer and p.site.value == site),
                None)


def tie_steps(gm: GraphModule) -> None:
    """Round each layer's input with the previous layer's output step where the value
    only passes a ReLU between them (:func:`fxquant.share_step`)."""
    graph_layers = {layer_name(n): n for n in gm.graph.nodes if n.op == "call_module"
                    and isinstance(gm.get_submodule(str(n.target)), MessagePassing)}
    names = list(graph_layers)
    for first, second in itertools.pairwise(names):
        if not chained(gm, graph_layers[first], graph_layers[second]):
            continue
        target, source = point_named(gm, second, "input"), point_named(gm, first, "output")
        if target is not None and source is not None \
                and gm.get_submodule(target).log_step is not None \
                and gm.get_submodule(source).log_step is not None:
            share_step(gm, target, source)



def num_nodes(data: Any, recipe: str) -> int:
    """The graph's node count, after the check of ``data.edge_index``
    (:func:`~fxquant.fx.degree.check_edge_index`)."""
    n = getattr(data, "num_nodes", None)
    if not isinstance(n, int) or getattr(data, "edge_index", None) is None:
        raise FxquantValueError(f"{recipe}: per-node bit-widths are keyed by node, so prepare() "
                                "needs the graph: prepare(model, data) with data.edge_index and "
                                "data.num_nodes (the whole graph in mini-batch training)")
    return check_edge_index(data.edge_index, n, where=f"{recipe}.prepare",
                            arg="data.edge_index")
