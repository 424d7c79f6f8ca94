"""A comment in the thread: `x11[:, :, 0:w/2, 0:h/2] = x11[:, :, 0:w/2, 0:h/2] * xx1[0]` on an autograd
variable raises "modified by an inplace operation", while `x11 = x11 * xx1[0]` works. The multiplication by
a learnable factor saves its input (the slice of x11), which the slice assignment then overwrites.

Source: https://github.com/pytorch/pytorch/issues/1321
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/1321"


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)
        self.xx1 = nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x11 = self.conv(x)
        w_f, h_f = x11.shape[2], x11.shape[3]
        hw, hh = int(w_f / 2), int(h_f / 2)
        xx1 = self.xx1
        x11[:, :, 0:hw, 0:hh] = x11[:, :, 0:hw, 0:hh] * xx1[0]  # CULPRIT
        return x11


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(1, 2, 4, 4, generator=g),)
