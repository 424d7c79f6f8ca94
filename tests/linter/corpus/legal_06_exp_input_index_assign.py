"""From the forum answer's examples: `u = 2 * t; uexp = u.exp()` and then `u[0] = 666` before backward,
which works. exp saves its output, not its input, so overwriting the input `u` does not affect the
gradient (contrast crash_04, which overwrites `uexp`, and crash_08, where pow saves its input).

Source: https://discuss.pytorch.org/t/when-inplace-operation-are-allowed-and-when-not/169583/3
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://discuss.pytorch.org/t/when-inplace-operation-are-allowed-and-when-not/169583/3"


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = self.lin(x)
        u = 2 * t
        uexp = u.exp()
        u[:, 0] = 666
        return uexp, u


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(2, 3, generator=g),)
