"""Which rows of a forward a node override applies to: the part of a quantization point
with a :class:`~fxquant.quant.override.NodeOverride` (``node_formats=``,
``QuantMapping.set_nodes``).

State: ``nodes``, the override's node ids or bool mask as given. The lookup table over
global node ids (``table``) is derived from it, and built again when it is loaded.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from fxquant.errors import FxquantIndexError, FxquantValueError
from fxquant.formats import AnyFormat
from fxquant.quant.nodes import lookup
from fxquant.quant.override import NodeOverride, describe_nodes

__all__ = ["OverrideMask"]


def _table(nodes: Tensor, max_index: int | None) -> Tensor:
    """A bool table over global node ids: True where the override (of ``nodes``: a mask,
    or ids up to ``max_index``) applies."""
    if nodes.dtype == torch.bool:
        return nodes.clone()
    size = (max_index + 1) if max_index is not None else 0
    return torch.zeros(size, dtype=torch.bool, device=nodes.device).index_fill(0, nodes, True)


class OverrideMask(nn.Module):
    """The rows of each forward that belong to the override's nodes.

    Example:
        >>> part = OverrideMask(NodeOverride(torch.tensor([0, 3]), "int8"))
        >>> part.rows(5, None, None, "output of 'conv1'")
        tensor([ True, False, False,  True, False])
        >>> part.format.spec(), part.describe()
        ('int8', '2 nodes -> int8')
    """

    nodes: Tensor
    table: Tensor

    def __init__(self, override: NodeOverride) -> None:
        super().__init__()
        #: what the override's rows are rounded to
        self.format: AnyFormat = override.format
        self.max_index = override.max_index
        self.register_buffer("nodes", override.nodes.clone())
        self.register_buffer("table", _table(override.nodes, override.max_index),
                             persistent=False)

    def rows(self, num_nodes: int, row_nodes: Tensor | None, ids: Tensor | None,
             where: str) -> Tensor:
        """The override as a bool mask over a forward's rows: looked up by global node id
        (``ids``), or (no ids) row ``i`` is node ``i``; ``row_nodes`` maps rows to nodes
        (messages to their target). Shape checks only, never a value check (it compiles).
        ``where`` names the point in errors."""
        table = self.table
        if ids is not None:
            mask = lookup(table, ids)
        else:
            if self.nodes.dtype == torch.bool and table.shape[0] != num_nodes:
                raise FxquantValueError(
                    f"fxquant: quantization point {where}: the override's row mask has "
                    f"shape ({table.shape[0]},), but the graph there has {num_nodes} nodes; "
                    "pass a mask over all nodes, or the batch's global ids as node_ids=.")
            if self.max_index is not None and self.max_index >= num_nodes:
                raise FxquantIndexError(
                    f"fxquant: the node override of quantization point {where} names node "
                    f"{self.max_index}, but the graph there has {num_nodes} nodes; "
                    f"please pass node ids in [0, {num_nodes}), or the batch's global ids "
                    "as node_ids=.")
            if table.shape[0] >= num_nodes:
                mask = table[:num_nodes]
            else:
                mask = torch.cat([table, table.new_zeros(num_nodes - table.shape[0])])
        return mask if row_nodes is None else mask[row_nodes]

    def describe(self) -> str:
        """``"20 nodes -> 9 bits"``."""
        return describe_nodes(self.nodes, self.format)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str,
                              *args: Any) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args)
        if prefix + "nodes" in state_dict:
            # derived, not saved: built again from what was loaded (a model made on the
            # meta device and loaded, or one whose memory to_empty() left unset)
            self.table = _table(self.nodes, self.max_index)

    def extra_repr(self) -> str:
        return self.describe()
