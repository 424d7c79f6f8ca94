"""The reporter zeroes a product through its detached alias, `x = a * b; x.detach().zero_()`, then computes
`out = (x * y).sum()` and calls backward: no error, and `a.grad`, `b.grad` are `b`, `a` although the output
no longer depends on them. `detach()` shares the version counter, but nothing saved `x` before the write
(mul saved `a` and `b`), so autograd has nothing to check; `x * y` then records the zeroed `x`.

Source: https://github.com/pytorch/pytorch/issues/7860
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "silent"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/7860"


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin_a = nn.Linear(2, 2)
        self.lin_b = nn.Linear(2, 2)
        self.y = nn.Parameter(torch.ones(2))

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        a = self.lin_a(inp)
        b = self.lin_b(inp)
        x = a * b
        x_detach = x.detach()
        x_detach.zero_()  # CULPRIT
        out = (x * self.y).sum()
        return out


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(3, 2, generator=g),)
