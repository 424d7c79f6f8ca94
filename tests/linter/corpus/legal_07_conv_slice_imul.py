"""The reporter's working version: `x[0, :, 0, 0] *= var` on the output of a convolution. The convolution
does not save its output, and the in-place multiplication keeps what it needs for `var`'s gradient, so
backward runs with correct gradients. (The "equivalent" `x[0, :, 0, 0] = x[0, :, 0, 0] * var` raises, see
crash_06; the maintainer's fix for that form is `x[0, :, 0, 0].clone() * var`.)

Source: https://github.com/pytorch/pytorch/issues/55980
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "legal"
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
        x[0, :, 0, 0] *= var
        loss = torch.mean(x)
        return loss


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    return Model(), (torch.ones(1, 2, 3, 3), torch.ones(1, 2, 3, 3))
