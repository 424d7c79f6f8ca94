"""Which nodes of a traced model a pass acts on, and which graph nodes (rows) keep other bits.

A *layer* is a ``call_module``, ``call_function`` or ``call_method`` node. It is named by
its submodule's qualified name (``"conv1"``, ``"convs.0"``) or, for functions and methods,
by its FX node name (``"sigmoid"``, ``"relu_1"``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn
from torch.fx import GraphModule, Node
from torch_geometric.nn import MessagePassing
from torch_geometric.utils import degree

__all__ = ["LayerSpec", "layer_name", "layers_of", "select_layers", "top_degree_nodes"]

#: What ``layers=`` accepts: a name or fnmatch pattern, a module class, a node predicate,
#: or a list of these.
LayerSpec = str | type[nn.Module] | Callable[[Node], bool]

_LAYER_OPS = ("call_module", "call_function", "call_method")


def layer_name(node: Node) -> str:
    """The name a user gives a layer: the module's qualified name, else the node name."""
    return str(node.target) if node.op == "call_module" else node.name


def layers_of(gm: GraphModule, exclude: Callable[[Node], bool] = lambda n: False) -> list[Node]:
    """All layer nodes of ``gm`` in graph order, without those ``exclude`` rejects."""
    return [n for n in gm.graph.nodes if n.op in _LAYER_OPS and not exclude(n)]


def _names(node: Node) -> tuple[str, ...]:
    return (str(node.target), node.name) if node.op == "call_module" else (node.name,)


def _match_one(gm: GraphModule, nodes: list[Node], spec: LayerSpec, arg: str) -> list[Node]:
    if isinstance(spec, str):
        exact = [n for n in nodes if spec in _names(n)]
        if exact:
            return exact
        found = [n for n in nodes if any(fnmatch.fnmatchcase(s, spec) for s in _names(n))]
        if not found:
            known = sorted(dict.fromkeys(layer_name(n) for n in nodes))
            raise ValueError(
                f"unknown layer {spec!r} in {arg}; layers in this model: {known}. Please use a "
                "submodule name ('conv1'), a node name ('relu'), or a pattern ('conv*')."
            )
        return found
    if isinstance(spec, type) and issubclass(spec, nn.Module):
        found = [
            n
            for n in nodes
            if n.op == "call_module" and isinstance(gm.get_submodule(str(n.target)), spec)
        ]
        if not found:
            classes = sorted(
                {type(gm.get_submodule(str(n.target))).__name__ for n in nodes if n.op == "call_module"}
            )
            raise ValueError(
                f"no layer of class {spec.__name__} in {arg}; module classes called in this "
                f"model: {classes}"
            )
        return found
    if callable(spec):
        return [n for n in nodes if spec(n)]  # type: ignore[call-arg]
    raise TypeError(
        f"{arg} entries must be a name or pattern, a module class or a predicate on "
        f"torch.fx.Node, got {spec!r}"
    )


def select_layers(
    gm: GraphModule,
    spec: LayerSpec | Iterable[LayerSpec] | None,
    nodes: list[Node],
    arg: str = "layers",
) -> list[Node]:
    """The nodes among ``nodes`` that ``spec`` names, in graph order, each once.

    ``spec=None`` selects every PyG ``MessagePassing`` layer.

    Example:
        >>> from fxquant.tracer import trace
        >>> from torch_geometric.nn.models import GCN
        >>> gm = trace(GCN(4, 8, num_layers=2, out_channels=2))
        >>> [n.name for n in select_layers(gm, "convs.*", layers_of(gm))]
        ['convs_0', 'convs_1']
    """
    if spec is None:
        return [
            n
            for n in nodes
            if n.op == "call_module" and isinstance(gm.get_submodule(str(n.target)), MessagePassing)
        ]
    specs: list[LayerSpec]
    if isinstance(spec, (str, type)) or (callable(spec) and not isinstance(spec, Iterable)):
        specs = [spec]
    else:
        specs = list(spec)
    chosen: set[Node] = set()
    for s in specs:
        chosen.update(_match_one(gm, nodes, s, arg))
    return [n for n in nodes if n in chosen]


def top_degree_nodes(
    edge_index: Tensor, fraction: float, num_nodes: int | None = None
) -> Tensor:
    """Indices of the ``fraction`` of nodes with the highest in-degree (Degree-Quant's
    high-degree nodes), for a per-row override in ``node_bits``.

    In-degree counts ``edge_index[1]`` (PyG's default ``source_to_target`` flow: a node's
    in-degree is how many messages it aggregates). Ties are broken by node index.

    Args:
        edge_index (Tensor): ``[2, num_edges]`` integer tensor.
        fraction (float): in ``(0, 1]``; at least one node is returned.
        num_nodes (int, optional): defaults to ``edge_index.max() + 1``.

    Example:
        >>> edge_index = torch.tensor([[0, 0, 1, 2, 3], [1, 2, 0, 0, 0]])
        >>> top_degree_nodes(edge_index, 0.25)
        tensor([0])
    """
    if not (isinstance(edge_index, Tensor) and edge_index.dim() == 2 and edge_index.shape[0] == 2):
        shape = tuple(edge_index.shape) if isinstance(edge_index, Tensor) else type(edge_index)
        raise ValueError(f"edge_index must be a [2, num_edges] tensor, got {shape}")
    if edge_index.is_floating_point():
        raise TypeError(f"edge_index must hold integer node indices, got {edge_index.dtype}")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ValueError(f"fraction must be a number in (0, 1], got {fraction!r}")
    if num_nodes is None:
        num_nodes = int(edge_index.max()) + 1 if edge_index.numel() else 0
    if num_nodes == 0:
        return torch.empty(0, dtype=torch.long, device=edge_index.device)
    deg = degree(edge_index[1], num_nodes, dtype=torch.long)
    k = max(1, round(fraction * num_nodes))
    # A stable sort on -degree keeps lower indices first among equal degrees.
    order = torch.sort(-deg, stable=True).indices
    return order[:k].sort().values
