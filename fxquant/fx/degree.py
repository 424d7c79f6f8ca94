"""In-degree: how many edges point at each node of a graph, computed in one place.

Degree-Quant's protection, per-node bit-widths by degree (``NodeBits.by_degree``),
:func:`~fxquant.quant.nodes.top_degree_nodes` and the recipes all ask for it. An edge
``(j, i)`` of ``edge_index`` points from its source ``j`` (row 0) at its target ``i``
(row 1), PyG's default ``flow="source_to_target"``: a node's in-degree is how many messages
it aggregates. ``num_nodes`` is the number of **target** nodes: in a bipartite graph
(a ``(source, target)`` pair of node sets, as ``SAGEConv((x_src, x_dst), edge_index)``
takes it) that is the target side's size, whatever the source side's.

The count is a fixed-size scatter (no value is read back to the host), so it compiles
without data-dependent shapes. :func:`check_edge_index` is the one validation of an
``edge_index`` a user hands fxquant outside a forward (``top_degree_nodes``,
``NodeBits.by_degree``, the per-node recipes' ``prepare``): it reads the ids, once.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fxquant.errors import FxquantTypeError, FxquantValueError

__all__ = ["check_edge_index", "in_degree", "index_degree"]

_FLOWS = ("source_to_target", "target_to_source")


def check_edge_index(edge_index: Tensor, num_nodes: int | None = None, *,
                     where: str = "", arg: str = "edge_index") -> int:
    """Check that ``edge_index`` is a dense ``[2, num_edges]`` tensor of integer node ids
    ``>= 0`` whose targets (row 1, the ids in-degree counts) are smaller than
    ``num_nodes``, and return ``num_nodes`` (default: the largest id plus one, as PyG's
    ``maybe_num_nodes``). Source ids (row 0) may reach beyond ``num_nodes``: a bipartite
    graph's source side has its own size. Errors name ``where`` and ``arg``.

    Args:
        edge_index (Tensor): the graph's edges, ids of any integer dtype.
        num_nodes (int, optional): the number of (target) nodes, an int ``>= 0`` already
            checked by the caller. (default: :obj:`None`: inferred)
        where (str, optional): the call, for messages (``"NodeBits.by_degree"``).
        arg (str, optional): the argument's name, for messages (``"data.edge_index"``).

    Example:
        >>> check_edge_index(torch.tensor([[0, 1, 2], [1, 2, 0]]))
        3
        >>> check_edge_index(torch.tensor([[0, 1], [1, 5]]), 4, where="top_degree_nodes")
        Traceback (most recent call last):
        ...
        fxquant.errors.FxquantValueError: top_degree_nodes: edge_index holds the target node id \
5, but num_nodes=4: every target id must be smaller; please pass the graph's num_nodes \
(data.num_nodes) or an edge_index of its nodes
    """
    at = f"{where}: " if where else ""
    if not isinstance(edge_index, Tensor):
        raise FxquantTypeError(f"{at}{arg} must be a [2, num_edges] tensor of node ids, got "
                               f"{type(edge_index).__name__}")
    if edge_index.layout != torch.strided:
        raise FxquantTypeError(f"{at}{arg} must be a dense [2, num_edges] tensor, got layout "
                               f"{edge_index.layout}; for a sparse adjacency pass its indices")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise FxquantValueError(f"{at}{arg} must be a [2, num_edges] tensor, got shape "
                                f"{tuple(edge_index.shape)}")
    if edge_index.is_floating_point() or edge_index.is_complex() \
            or edge_index.dtype == torch.bool:
        raise FxquantTypeError(f"{at}{arg} must hold integer node ids (any integer dtype), got "
                               f"{edge_index.dtype}; please pass {arg}.long() if its values "
                               "are whole node ids")
    if edge_index.is_meta or not edge_index.numel():
        return 0 if num_nodes is None else num_nodes
    lowest = int(edge_index.min())
    if lowest < 0:
        raise FxquantValueError(f"{at}{arg} holds the negative node id {lowest}; node ids "
                                "are >= 0")
    if num_nodes is None:
        return int(edge_index.max()) + 1
    top = int(edge_index[1].max())
    if top >= num_nodes:
        raise FxquantValueError(
            f"{at}{arg} holds the target node id {top}, but num_nodes={num_nodes}: every "
            "target id must be smaller; please pass the graph's num_nodes (data.num_nodes) "
            f"or an {arg} of its nodes")
    return num_nodes


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
