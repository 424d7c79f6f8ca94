"""The user writes one element of a sigmoid output, `b = a.sigmoid(); b[1] = 2`, then sums and calls
backward. Sigmoid saves its output, so the index assignment makes backward raise (while the same code with
a hand-written `1/((-a).exp()+1)` runs, see legal_05).

Source: https://github.com/pytorch/pytorch/issues/9391
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/9391"


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.lin(x)
        b = a.sigmoid()
        b[:, 1] = 2  # CULPRIT
        return b


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(2, 3, generator=g),)
