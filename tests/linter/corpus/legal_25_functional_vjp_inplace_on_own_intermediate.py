"""The legal twin of pytorch/pytorch#52390: the function given to
`torch.autograd.functional.vjp(..., create_graph=True)` still uses in-place ops, but on a
tensor it computed itself and that nothing saved (`y = 2 * z; y += 1; return torch.sin(y)`),
never on its argument. The vector-Jacobian product is right (`2 cos(2h + 1) v`) and the model
trains through it. Must stay clean.

Source: https://github.com/pytorch/pytorch/issues/52390
"""

from __future__ import annotations

import torch
import torch.autograd.functional as AF
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/52390"
CATEGORY = "functional derivatives"


class ForceField(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(3, 3)
        self.head = nn.Linear(3, 1)

    @staticmethod
    def potential(z: torch.Tensor) -> torch.Tensor:
        y = 2 * z
        y += 1
        return torch.sin(y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.enc(x)
        _, force = AF.vjp(self.potential, h, torch.ones_like(h), create_graph=True)
        return self.head(force)


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return ForceField(), (torch.randn(4, 3, generator=g),)
