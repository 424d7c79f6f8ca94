"""Nodes of the user's graph: choosing them for per-node settings, and telling the model
which global node each row of a mini-batch is.

Per-node settings (node overrides, per-node bit-widths) are keyed by **global node id**. In
a full-batch forward row ``i`` of a node-level tensor is node ``i``; a mini-batch names its
nodes with the transformed model's ``node_ids`` argument (PyG's ``batch.n_id``)::

    out = gm(batch.x, batch.edge_index, node_ids=batch.n_id)

Node ids may have any integer dtype (``uint8`` to ``int64``); a ``bool`` mask is refused
there (it says which nodes, not which node each row is). Per-node overrides
(``node_formats=``, :meth:`~fxquant.quant.mapping.QuantMapping.set_nodes`) take ids of any
integer dtype or a bool mask over all nodes.

The argument feeds one :class:`NodeIds` module on the GraphModule, which every quantization
point reads (points inside layers too), so one tensor reaches all of them without changing
any layer's signature. Under ``torch.compile(dynamic=True)`` it is a graph input like the
features: batches of changing size compile once.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from fxquant.errors import FxquantTypeError, FxquantValueError
from fxquant.fx.degree import check_edge_index, node_degree

__all__ = ["LayerMasks", "NodeIds", "as_index", "check_node_ids", "lookup", "new_masks",
           "set_node_ids", "top_degree_nodes"]


class NodeIds(nn.Module):
    """Holds the global node ids of the current forward's rows (None: row ``i`` is node
    ``i``). Set by :func:`set_node_ids` at the start of every forward; no state."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: Tensor | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["ids"] = None  # the last forward's, not state: a copy does not carry them
        return state

    def extra_repr(self) -> str:
        return "forward(..., node_ids=batch.n_id) names the global node of each row"


def set_node_ids(context: NodeIds, ids: Tensor | None) -> Any:
    """Record ``ids`` for this forward, after checks that need no values (so they compile).
    Traced symbolically (a GraphModule is re-traced when unpickled) it records itself."""
    if isinstance(ids, torch.fx.Proxy):
        return ids.tracer.create_proxy("call_function", set_node_ids, (context, ids), {})
    context.ids = None if ids is None else check_node_ids(ids)
    return None


def check_node_ids(ids: object, name: str = "node_ids") -> Tensor:
    """``ids``, the global node id of each row, as ``int64`` (:func:`as_index`): a 1-D
    tensor of any integer dtype; a bool mask, a float tensor or a list is an error naming
    ``name``. The values are not read (so it compiles); a caller with a table checks them.

    Example:
        >>> check_node_ids(torch.tensor([7, 2], dtype=torch.int16))
        tensor([7, 2])
    """
    if isinstance(ids, Tensor) and ids.dtype == torch.bool:
        raise FxquantTypeError(
            f"{name} must be the global node id of each row (PyG's batch.n_id), got a bool "
            f"tensor of shape {tuple(ids.shape)}: a mask says which nodes, not which node each "
            "row is. Please pass mask.nonzero().view(-1) for the rows of the masked nodes.")
    if not isinstance(ids, Tensor) or ids.dim() != 1 or ids.is_floating_point() \
            or ids.is_complex():
        got = f"{ids.dtype} tensor of shape {tuple(ids.shape)}" if isinstance(ids, Tensor) \
            else type(ids).__name__
        raise FxquantTypeError(f"{name} must be a 1-D integer tensor of global node ids (PyG's "
                               f"batch.n_id), got a {got}")
    return as_index(ids)


class LayerMasks(nn.Module):
    """Holds each layer's protective mask of the current forward (Degree-Quant's one mask
    per layer, ``Protection(share="layer")``): the first of a layer's points to run draws
    it, the others read it. Emptied by :func:`new_masks` at the start of every forward;
    no state."""

    def __init__(self) -> None:
        super().__init__()
        #: layer -> its target nodes' mask; (layer, "source") -> its source nodes'
        self.masks: dict[Any, Tensor] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["masks"] = {}  # the last forward's draws, not state
        return state

    def extra_repr(self) -> str:
        return "one protective mask per layer and forward"


def new_masks(context: LayerMasks, *anchor: Any) -> Any:
    """Forget the last forward's masks (each forward draws its own). Traced symbolically
    (a GraphModule is re-traced when unpickled) it records itself: ``context`` is then the
    module itself, so the graph passes a forward argument as ``anchor``, which is a proxy
    there (its value is not used)."""
    proxy = next((a for a in (context, *anchor) if isinstance(a, torch.fx.Proxy)), None)
    if proxy is not None:
        return proxy.tracer.create_proxy("call_function", new_masks, (context, *anchor), {})
    context.masks = {}
    return None


def as_index(ids: Tensor) -> Tensor:
    """Integer node ids of any dtype as ``int64`` (indexing reads a ``uint8`` tensor as a
    mask, and ``int8``/``int16`` not at all); ``int64`` ids are returned as they are.

    Example:
        >>> as_index(torch.tensor([3, 200], dtype=torch.uint8))
        tensor([  3, 200])
    """
    return ids if ids.dtype == torch.int64 else ids.to(torch.int64)


def lookup(table: Tensor, ids: Tensor) -> Tensor:
    """``table[ids]``, with ids outside the table (nodes it never saw) mapped to
    ``table``'s zero value; no value check, so it compiles."""
    ids = as_index(ids)
    size = table.shape[0]
    valid = (ids >= 0) & (ids < size)
    found = table[ids.clamp(0, max(size - 1, 0))] if size else torch.zeros(
        ids.shape, dtype=table.dtype, device=table.device)
    return torch.where(valid.view((-1,) + (1,) * (found.dim() - 1)), found,
                       torch.zeros((), dtype=table.dtype, device=table.device))


def top_degree_nodes(
    edge_index: Tensor, fraction: float, num_nodes: int | None = None, *,
    side: str = "target",
) -> Tensor:
    """Ids of the ``fraction`` of nodes with the highest in-degree (Degree-Quant's
    high-degree nodes), for a per-node override in ``node_bits``.

    In-degree counts ``edge_index[1]`` (PyG's default ``source_to_target`` flow: a node's
    in-degree is how many messages it aggregates). Ties are broken by node id. On a
    bipartite graph (authors writing papers) ``side="source"`` ranks the source nodes by
    their out-degree (how many messages each sends) instead.

    Args:
        edge_index (Tensor): ``[2, num_edges]`` tensor of node ids ``>= 0`` (any integer
            dtype; checked by :func:`~fxquant.fx.degree.check_edge_index`).
        fraction (float): in ``(0, 1]``; at least one node is returned.
        num_nodes (int, optional): the number of nodes on that side; every id there must
            be smaller. (default: the largest id plus one, of either row for the targets
            of a graph over one node set, of the sources' row for ``side="source"``; on a
            bipartite graph pass the target count, which the ids cannot tell)
        side (str, optional): ``"target"`` (in-degree) or ``"source"`` (out-degree).
            (default: ``"target"``)

    Example:
        >>> edge_index = torch.tensor([[0, 0, 1, 2, 3], [1, 2, 0, 0, 0]])
        >>> top_degree_nodes(edge_index, 0.25)
        tensor([0])
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise FxquantValueError(f"fraction must be a number in (0, 1], got {fraction!r}")
    if num_nodes is not None and (isinstance(num_nodes, bool) or not isinstance(num_nodes, int)
                                  or num_nodes < 0):
        raise FxquantValueError(f"num_nodes must be an int >= 0, got {num_nodes!r}")
    num_nodes = check_edge_index(edge_index, num_nodes, where="top_degree_nodes", side=side)
    if num_nodes == 0:
        return torch.empty(0, dtype=torch.long, device=edge_index.device)
    deg = node_degree(edge_index, num_nodes, side=side, dtype=torch.long)
    k = max(1, round(fraction * num_nodes))
    # A stable sort on -degree keeps lower ids first among equal degrees.
    order = torch.sort(-deg, stable=True).indices
    return order[:k].sort().values
