"""Per-row selections handed to the ops: a bool mask over dim 0, checked by shape only.

Range and dtype checks on node ids happen where they enter (the config, or the call that
hands a batch's node ids in), never here: a check that reads tensor values would stop
``torch.compile(fullgraph=True)`` with a data-dependent guard.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fxquant.errors import FxquantTypeError, FxquantValueError

__all__ = ["row_mask"]


def row_mask(rows: Tensor, x: Tensor, where: str) -> Tensor:
    """``rows`` (a bool mask of shape ``(x.shape[0],)``) shaped to broadcast against ``x``."""
    if x.dim() == 0:
        raise FxquantValueError(f"{where}: a row selection needs a tensor with rows (dim >= 1), got a "
                         "0-dim tensor")
    n = x.shape[0]
    if rows.dtype != torch.bool:
        raise FxquantTypeError(f"{where}: the row selection must be a bool mask, got {rows.dtype}")
    if rows.dim() != 1 or rows.shape[0] != n:
        raise FxquantValueError(
            f"{where}: the row mask has shape {tuple(rows.shape)}, but the tensor has {n} rows; "
            f"please pass a bool mask of shape ({n},)."
        )
    return rows.view((n,) + (1,) * (x.dim() - 1))
