"""BDRAR builds its layers with plain `nn.ReLU()` and `nn.Dropout(0.1)` inside `nn.Sequential` blocks, then
switches them to in-place at the end of `__init__`: `for m in self.modules(): if isinstance(m, nn.ReLU) or
isinstance(m, nn.Dropout): m.inplace = True`. Under PyTorch 0.4 and later backward raises "modified by an
inplace operation"; the maintainer's fix is to leave the Dropout out of that loop. The Dropout runs inside
the Sequential, and the line that made it in-place is the loop's assignment.

Source: https://github.com/zijundeng/BDRAR/issues/2
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/zijundeng/BDRAR/issues/2"
CATEGORY = "container"


class Refine(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.refine = nn.Sequential(
            nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.1),
            nn.Conv2d(4, 1, 1),
        )
        for m in self.modules():
            if isinstance(m, nn.ReLU) or isinstance(m, nn.Dropout):  # noqa: SIM101
                m.inplace = True  # CULPRIT

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.refine(x))


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Refine(), (torch.randn(2, 2, 4, 4, generator=g),)
