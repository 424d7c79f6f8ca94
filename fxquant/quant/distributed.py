"""The reductions a quantization point's parts make under ``torch.distributed``, so that
every rank keeps the same state (SyncBatchNorm's habit): the learned step's first fit,
the ranges each node has shown, and the observers' ranges (:mod:`fxquant.quant.observers`).
"""

from __future__ import annotations

import torch.distributed as dist
from torch import Tensor

__all__ = ["all_reduce_", "distributed"]


def distributed() -> bool:
    """Whether a default process group with more than one rank is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_(tensor: Tensor, op: str = "max") -> Tensor:
    """``tensor`` reduced in place over every rank (``"max"`` or ``"sum"``), when
    :func:`distributed`; returned either way."""
    if distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return tensor
