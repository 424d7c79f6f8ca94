"""A model that uses the Jacobian of a scalar function of its hidden features,
`torch.autograd.functional.jacobian(pinned, h, create_graph=True)`, where `pinned` first pins
one coordinate of its argument to a constant with a slice assignment (`z[:1] = 0.5`). The
pinned coordinate cannot influence the function, so its Jacobian entry must be 0; autograd
differentiates with respect to the argument the assignment overwrote and returns the
derivative at the pinned value instead. No error; the Jacobian, the output and the gradients
are wrong. The thread hit the same with a functorch Jacobian ("Get wrong jacobian from
copyslice operation"); `torch.func.jacfwd` now gets it right, `jacrev` raises, and
`torch.autograd.functional.jacobian(..., create_graph=True)` stays silently wrong.

Source: https://github.com/pytorch/functorch/issues/1007
"""

from __future__ import annotations

import torch
import torch.autograd.functional as AF
from torch import nn

KIND = "silent"
FIXABLE = True
SOURCE = "https://github.com/pytorch/functorch/issues/1007"
CATEGORY = "functional derivatives"


class PinnedSensitivity(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(3, 3)
        self.scale = nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))
        self.head = nn.Linear(3, 1)

    def pinned(self, z: torch.Tensor) -> torch.Tensor:
        z[:1] = 0.5  # CULPRIT
        return (self.scale * z ** 2).sum()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.enc(x)
        sens = AF.jacobian(self.pinned, h, create_graph=True)
        return self.head(sens)


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return PinnedSensitivity(), (torch.randn(3, generator=g),)


def fixed_by_hand() -> nn.Module:
    """The fix: pin out of place (forward mode cannot run through `jacobian`)."""
    model, _ = make()

    def pinned(z: torch.Tensor) -> torch.Tensor:
        z = torch.cat([z.new_full((1,), 0.5), z[1:]])
        return (model.scale * z ** 2).sum()

    model.pinned = pinned
    return model
