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
without data-dependent shapes. :func:`check_edge_index` is the one validation of an
``edge_index`` a user hands fxquant outside a forward (``top_degree_nodes``,
``NodeBits.by_degree``, the per-node recipes' ``prepare``): it reads the ids, once.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fxquant.errors import FxquantTypeError, FxquantValueError

__all__ = ["SIDES", "check_edge_index", "in_degree", "index_degree", "node_degree"]

_FLOWS = ("source_to_target", "target_to_source")

#: The two sides of a layer's edges: the nodes that send messages and those that receive.
SIDES = ("source", "target")


def check_edge_index(edge_index: Tensor, num_nodes: int | None = None, *,
                     where: str = "", arg: str = "edge_index", side: str = "target") -> int:
    """Check that ``edge_index`` is a dense ``[2, num_edges]`` tensor of integer node ids
    ``>= 0`` whose targets (row 1, the ids in-degree counts) are smaller than
    ``num_nodes``, and return ``num_nodes`` (default: the largest id plus one, as PyG's
    ``maybe_num_nodes``). Source ids (row 0) may reach beyond ``num_nodes``: a bipartite
    graph's source side has its own size. Errors name ``where`` and ``arg``.

    Args:
        edge_index (Tensor): the graph's edges, ids of any integer dtype.
        num_nodes (int, optional): the number of (target) nodes, an int ``>= 0`` already
            checked by the caller. (default: :obj:`None`: the largest id of either row
            plus one, as for a graph over one node set; a bipartite graph's caller passes
            its target count)
        where (str, optional): the call, for messages (``"NodeBits.by_degree"``).
        arg (str, optional): the argument's name, for messages (``"data.edge_index"``).
        side (str, optional): ``"source"`` checks the source ids (row 0) against
            ``num_nodes`` instead, a bipartite graph's source side (default ``num_nodes``:
            the largest source id plus one); the targets may then reach beyond it.
            (default: ``"target"``)

    Example:
        >>> check_edge_index(torch.tensor([[0, 1, 2], [1, 2, 0]]))
        3
        >>> check_edge_index(torch.tensor([[0, 1], [1, 5]]), 4, where="top_degree_nodes")
        Traceback (most recent call last):
        ...
        fxquant.errors.FxquantValueError: top_degree_nodes: edge_index holds the target node id \
5, but num_nodes=4: every target id must be smaller; please pass the number of target nodes \
(data.num_nodes, or x_dst.size(0) of a (source, target) pair) or an edge_index of those nodes
    """
    at = f"{where}: " if where else ""
    if side not in SIDES:
        raise FxquantValueError(f"{at}side={side!r} is not one of {list(SIDES)}")
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
    row = edge_index[0 if side == "source" else 1]
    if num_nodes is None:
        return int((row if side == "source" else edge_index).max()) + 1
    top = int(row.max())
    if top >= num_nodes:
        raise FxquantValueError(
            f"{at}{arg} holds the {side} node id {top}, but num_nodes={num_nodes}: every "
            f"{side} id must be smaller; please pass the number of {side} nodes ("
            + ("x_src.size(0) of a (source, target) pair" if side == "source" else
               "data.num_nodes, or x_dst.size(0) of a (source, target) pair")
            + f") or an {arg} of those nodes")
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
