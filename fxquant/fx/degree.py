"""Degrees: how many edges point at (or leave) each node of a graph, computed in one place.

Degree-Quant's protection, per-node bit-widths by degree (``NodeBits.by_degree``),
:func:`~fxquant.quant.nodes.top_degree_nodes` and the recipes all ask for it. An edge
``(j, i)`` of ``edge_index`` points from its source ``j`` (row 0) at its target ``i``
(row 1), PyG's default ``flow="source_to_target"``: a node's in-degree is how many messages
it aggregates. ``num_nodes`` is the number of **target** nodes: in a bipartite graph
(a ``(source, target)`` pair of node sets, as ``SAGEConv((x_src, x_dst), edge_index)``
takes it) that is the target side's size, whatever the source side's.

On a layer called with a ``(source, target)`` pair the two sides are different node sets
(authors and papers): the sources aggregate nothing in that layer, so the degree that
says how much a source's value travels is its **out-degree** (how many messages it sends).
:func:`node_degree` is the one function that takes the sides into account: ``side=
"target"`` counts in-degrees, ``side="source"`` out-degrees. A layer over one node set
(``conv(x, edge_index)``) has one side: every node's degree is its in-degree.

The count is a fixed-size scatter (no value is read back to the host), so it compiles
without data-dependent shapes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fxquant.errors import FxquantValueError

__all__ = ["SIDES", "in_degree", "index_degree", "node_degree"]

_FLOWS = ("source_to_target", "target_to_source")

#: The two sides of a layer's edges: the nodes that send messages and those that receive.
SIDES = ("source", "target")


def index_degree(index: Tensor, num_nodes: int, *, dtype: torch.dtype = torch.float32
                 ) -> Tensor:
    """How often each of ``0 .. num_nodes - 1`` occurs in the 1-D ``index`` (the target of
    each edge, or of each message), as ``dtype`` on ``index``'s device.

    Example:
        >>> index_degree(torch.tensor([1, 1, 0]), 3)
        tensor([1., 2., 0.])
    """
    if index.dtype not in (torch.int32, torch.int64):
        index = index.to(torch.int64)  # (uint8 would index as a mask; int16 not at all)
    ones = torch.ones(index.shape[0], dtype=dtype, device=index.device)
    return torch.zeros(num_nodes, dtype=dtype, device=index.device).index_add(0, index, ones)


def in_degree(edge_index: Tensor, num_nodes: int, *, flow: str = "source_to_target",
              dtype: torch.dtype = torch.float32) -> Tensor:
    """The in-degree of each of the ``num_nodes`` target nodes of ``edge_index``.

    Args:
        edge_index (Tensor): ``[2, num_edges]`` integer node ids.
        num_nodes (int): the number of target nodes (a bipartite graph's target side);
            every target id must be smaller.
        flow (str, optional): PyG's ``"source_to_target"`` (targets in row 1) or
            ``"target_to_source"`` (row 0). (default: ``"source_to_target"``)
        dtype (torch.dtype, optional): of the counts. (default: ``torch.float32``)

    Example:
        >>> edge_index = torch.tensor([[0, 1, 2, 2], [1, 0, 0, 1]])
        >>> in_degree(edge_index, 3)
        tensor([2., 2., 0.])
        >>> in_degree(torch.tensor([[0, 1, 4], [1, 1, 0]]), 2)  # 5 sources, 2 targets
        tensor([1., 2.])
    """
    if flow not in _FLOWS:
        raise FxquantValueError(f"flow={flow!r} is not one of {list(_FLOWS)}")
    return index_degree(edge_index[1 if flow == "source_to_target" else 0], num_nodes,
                        dtype=dtype)


def node_degree(edge_index: Tensor, num_nodes: int, *, side: str = "target",
                flow: str = "source_to_target", dtype: torch.dtype = torch.float32) -> Tensor:
    """The degree of each of the ``num_nodes`` nodes on one side of ``edge_index``'s edges:
    the in-degree of the targets (``side="target"``: how many messages each aggregates) or
    the out-degree of the sources (``side="source"``: how many messages each sends).

    Use ``side="source"`` for the source nodes of a bipartite layer (a ``(source,
    target)`` pair of node sets, e.g. authors sending to papers): their values and the
    messages that follow them. On a graph of one node set both sides are the same nodes,
    whose degree is the in-degree (Degree-Quant's).

    Args:
        edge_index (Tensor): ``[2, num_edges]`` integer node ids.
        num_nodes (int): the number of nodes on that side (a bipartite graph's source or
            target count); every id on that side must be smaller.
        side (str, optional): ``"target"`` or ``"source"``. (default: ``"target"``)
        flow (str, optional): PyG's ``"source_to_target"`` (sources in row 0, targets in
            row 1) or ``"target_to_source"``. (default: ``"source_to_target"``)
        dtype (torch.dtype, optional): of the counts. (default: ``torch.float32``)

    Example:
        >>> edge_index = torch.tensor([[0, 0, 0, 1], [1, 2, 0, 0]])  # 2 sources, 3 targets
        >>> node_degree(edge_index, 3)                   # how many messages each target gets
        tensor([2., 1., 1.])
        >>> node_degree(edge_index, 2, side="source")    # how many each source sends
        tensor([3., 1.])
    """
    if flow not in _FLOWS:
        raise FxquantValueError(f"flow={flow!r} is not one of {list(_FLOWS)}")
    if side not in SIDES:
        raise FxquantValueError(f"side={side!r} is not one of {list(SIDES)}")
    target_row = 1 if flow == "source_to_target" else 0
    row = target_row if side == "target" else 1 - target_row
    return index_degree(edge_index[row], num_nodes, dtype=dtype)
