"""A model whose output is a vector-Jacobian product, computed with
`torch.autograd.functional.vjp(potential, h, v, create_graph=True)` (create_graph so that the
model trains through it). The function given to `vjp` applies its nonlinearity in place to its
own argument, `z.sin_()`. `vjp` differentiates the returned tensor with respect to that same
argument, which the in-place op has just overwritten: the result is `v` (the derivative of the
identity) instead of `cos(h) * v`. Nothing raises; the output is wrong and the encoder gets no
gradient at all. The thread asks for at least a warning.

Source: https://github.com/pytorch/pytorch/issues/52390
"""

from __future__ import annotations

import torch
import torch.autograd.functional as AF
from torch import nn

KIND = "silent"
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
        return z.sin_()  # CULPRIT

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.enc(x)
        _, force = AF.vjp(self.potential, h, torch.ones_like(h), create_graph=True)
        return self.head(force)


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return ForceField(), (torch.randn(4, 3, generator=g),)


def fixed_by_hand() -> nn.Module:
    """The fix: `z.sin()` out of place (forward mode cannot run through `vjp`)."""
    model, _ = make()
    model.potential = lambda z: z.sin()
    return model
