"""The second half of the report: with sigmoid written by hand, `b = 1/((-a).exp()+1); b[1] = 2`, backward
runs and gives `a.grad = [0.1966, 0.0000, 0.0452]`. `1 / t` is computed as `t.reciprocal() * 1`: the
reciprocal's saved output is an intermediate and `b` itself is saved by nothing (unlike the output of
`a.sigmoid()`, see crash_03), so the assignment is legal and the gradients are correct.

Source: https://github.com/pytorch/pytorch/issues/9391
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/9391"


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.lin(x)
        b = 1 / ((-a).exp() + 1)
        b[:, 1] = 2
        return b


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(2, 3, generator=g),)
