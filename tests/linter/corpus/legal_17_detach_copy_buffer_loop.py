"""The reporter re-uses one tensor across the steps of a loop: `x.detach_()`, then `x.copy_(new_calc)` with
`new_calc = torch.exp(mu)`, then `loss += (x * 2).sum()`. It raised "modified by an inplace operation"
under PyTorch 1.0; it runs and gives the right gradients today (mul by a number saves nothing, and `copy_`
records the write). Here `x` is a buffer of the module, as state carried across the loop.

Source: https://github.com/pytorch/pytorch/issues/15115
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/15115"
CATEGORY = "instruments"


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mu = nn.Parameter(torch.ones(3))
        self.register_buffer("x", torch.randn(3))

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        loss = torch.zeros(())
        for _ in range(3):
            self.x.detach_()
            new_calc = torch.exp(self.mu * inp)
            self.x.copy_(new_calc)
            loss = loss + (self.x * 2).sum()
        return loss


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.rand(3, generator=g),)
