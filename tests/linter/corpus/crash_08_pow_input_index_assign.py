"""From the forum answer's examples: the derivative of `x**2` is `2*x`, so pow saves its input, and
"modifying x itself will now trigger an inplace error". Here `u` is squared and then `u[0]` is overwritten.

Source: https://discuss.pytorch.org/t/when-inplace-operation-are-allowed-and-when-not/169583/3
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://discuss.pytorch.org/t/when-inplace-operation-are-allowed-and-when-not/169583/3"


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.lin(x)
        u = 2 * t
        usq = u**2
        u[:, 0] = 666  # CULPRIT
        return usq


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(2, 3, generator=g),)
