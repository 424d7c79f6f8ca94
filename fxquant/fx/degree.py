"""In-degree: how many edges point at each node of a graph, computed in one place.

Degree-Quant's protection, per-node bit-widths by degree (``NodeBits.by_degree``),
:func:`~fxquant.quant.nodes.top_degree_nodes` and the recipes all ask for it. An edge
``(j, i)`` of ``edge_index`` points from its source ``j`` (row 0) at its target ``i``
(row 1), PyG's default ``flow="source_to_target"``: a node's in-degree is how many messages
it aggregates. ``num_nodes`` is the number of **target** nodes: in a bipartite graph
(a ``(source, target)`` pair of node sets, as ``SAGEConv((x_src, x_dst), edge_index)``
takes it) that is the target side's size, whatever the source side's.

The count is a fixed-size scatter (no value is read back to the host), so it compiles
without data-dependent shapes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fxquant.errors import FxquantValueError

__all__ = ["in_degree", "index_degree"]

_FLOWS = ("source_to_target", "target_to_source")


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
