"""The maintainer's example of why `.detach()` is safer than `.data`: `out = a.sigmoid(); c = out.detach();
c.zero_()`. `c` shares storage and the version counter with `out`, which sigmoid saved for backward, so
`out.sum().backward()` raises (the `.data` variant runs and silently returns zero gradients, see silent_02).

Source: https://github.com/pytorch/pytorch/issues/6990
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "crash"
FIXABLE = False  # zeroing through a .detach() alias: no gradient is defined for it
SOURCE = "https://github.com/pytorch/pytorch/issues/6990"


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.lin(x)
        out = a.sigmoid()
        c = out.detach()
        c.zero_()  # CULPRIT
        return out


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(2, 3, generator=g),)
