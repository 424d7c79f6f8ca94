"""The reporter wraps Conv3d to clip fp16 overflow in place, `return torch.clamp_(super().forward(input),
-65504, 65504)`, and asks why backward uses as much memory as with `clamp`. The in-place clamp is correct:
the convolution saves its input and weight, not its output, and autograd keeps the values clamp_ needs;
the thread is about memory, not about wrong gradients.

Source: https://github.com/pytorch/pytorch/issues/33373
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/33373"

_conv3d = nn.Conv3d


class Conv3dWrapper(_conv3d):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return torch.clamp_(super().forward(input), -65504, 65504)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = Conv3dWrapper(1, 2, 3, padding=1)
        self.head = nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.head(y.mean((2, 3, 4)))


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(1, 1, 3, 3, 3, generator=g) * 1e5,)
