"""The maintainer's reduction of the reporter's example (which assigned an activation's output into
`b[:, 1]`): `a[0] = a[1].sin()`. sin saves its input, the view `a[1]`; writing `a[0]` touches another
region, but autograd keeps one version counter for the whole storage, so backward raises.

Source: https://github.com/pytorch/pytorch/issues/114505
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/114505"


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.lin(x)
        a[0] = a[1].sin()  # CULPRIT
        return a


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(2, generator=g),)
