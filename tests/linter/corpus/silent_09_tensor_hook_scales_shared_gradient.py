"""A tensor hook registered in forward that scales its gradient in place (`g.mul_(0.1)`, to damp one
branch). For `a + b` autograd hands the same gradient tensor to both operands ("A common case where the
gradients are views is z=x+y ... gradients of x and y would be referencing the same storage"), so the
hook on `b` also scales `a`'s gradient: backward runs, the gradients of the other branch are wrong.

Source: https://github.com/pytorch/pytorch/issues/46168
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "silent"
FIXABLE = False
SOURCE = "https://github.com/pytorch/pytorch/issues/46168"


class TwoBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l0, self.l1, self.l2 = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.l0(x)
        a, b = self.l1(h), self.l2(h)
        b.register_hook(lambda g: g.mul_(0.1))  # CULPRIT
        return torch.tanh(a + b)


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return TwoBranch(), (torch.randn(3, 4, generator=g),)
