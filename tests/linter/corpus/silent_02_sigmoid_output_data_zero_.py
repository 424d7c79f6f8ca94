"""The maintainer's example of why `.data` is unsafe: `out = a.sigmoid(); c = out.data; c.zero_()`. The
write goes around the version counter, SigmoidBackward then computes `out * (1 - out)` from the zeroed
output, and `a.grad` comes back all zero ("very, very wrong because out changed") without any error.

Source: https://github.com/pytorch/pytorch/issues/6990
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "silent"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/6990"


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.lin(x)
        out = a.sigmoid()
        c = out.data
        c.zero_()  # CULPRIT
        return out


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(2, 3, generator=g),)
