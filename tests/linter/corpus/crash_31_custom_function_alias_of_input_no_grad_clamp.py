"""A custom `autograd.Function` that returns a view of its input (`x[:]`, an alias with its
own backward), and a `torch.no_grad()` clamp of that view in the model's forward. The view
carries the custom backward, so autograd forbids rewriting its history: the clamp itself goes
through, and the next op that reads the view raises "Output 0 of Alias is a view and its base
or another view of its base has been modified inplace ... You can fix this by cloning the
output of the custom Function", pointing at that later line.

Source: https://github.com/pytorch/pytorch/issues/73604
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "crash"
FIXABLE = False
SOURCE = "https://github.com/pytorch/pytorch/issues/73604"
CATEGORY = "custom function views"


class Alias(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        return x[:]

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor) -> torch.Tensor:
        return g


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.out = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = Alias.apply(self.lin(x))
        with torch.no_grad():
            h.clamp_(min=-0.5, max=0.5)  # CULPRIT
        return self.out(torch.tanh(h))


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(4, 3, generator=g),)
