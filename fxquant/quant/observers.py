"""Observers: modules that watch what flows through a quantization point and hand its op a
range (today a running amax for eval-time scaling)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fxquant._ops.quantize import amax_of

__all__ = ["RunningAmax"]


class RunningAmax(nn.Module):
    """Tracks the per-tensor amax of what flows through it, for eval-time scaling.

    In training mode it returns the current amax and updates
    ``running_amax = momentum * running_amax + (1 - momentum) * amax`` (the first batch sets
    it); in eval mode it returns ``running_amax``. The buffer is saved in ``state_dict``.

    Args:
        momentum (float): weight of the history, in ``[0, 1)``.

    Example:
        >>> obs = RunningAmax(0.5)
        >>> obs(torch.tensor([1.0, -4.0])), obs(torch.tensor([2.0])), obs.running_amax
        (tensor(4.), tensor(2.), tensor(3.))
        >>> obs.eval()(torch.tensor([100.0]))
        tensor(3.)
    """

    running_amax: Tensor

    def __init__(self, momentum: float = 0.9) -> None:
        super().__init__()
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
            raise ValueError(f"momentum must be a number in [0, 1), got {momentum!r}")
        self.momentum = float(momentum)
        self.register_buffer("running_amax", torch.zeros(()))

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            return self.running_amax
        amax = amax_of(x.detach(), "tensor").to(self.running_amax.dtype)
        with torch.no_grad():
            fresh = self.running_amax == 0
            blended = self.momentum * self.running_amax + (1 - self.momentum) * amax
            self.running_amax.copy_(torch.where(fresh, amax, blended))
        return amax

    def extra_repr(self) -> str:
        return f"momentum={self.momentum}"
