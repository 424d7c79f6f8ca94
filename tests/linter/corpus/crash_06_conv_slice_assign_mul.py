"""The user's model: `x = self.conv(x); y = self.conv(y); var = y.flatten()` and then
`x[0, :, 0, 0] = x[0, :, 0, 0] * var`. The multiplication saves the slice `x[0, :, 0, 0]` for the gradient of
`var`, and the assignment overwrites it, so backward raises (the in-place `*=` form works, see legal_07).

Source: https://github.com/pytorch/pytorch/issues/55980
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/55980"


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        y = self.conv(y)
        var = y.flatten()
        x[0, :, 0, 0] = x[0, :, 0, 0] * var  # CULPRIT
        loss = torch.mean(x)
        return loss


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    return Model(), (torch.ones(1, 2, 3, 3), torch.ones(1, 2, 3, 3))
