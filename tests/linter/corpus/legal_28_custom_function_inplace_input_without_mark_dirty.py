"""A custom `autograd.Function` that adds a bias into its input in place to save memory
(`x.add_(bias)`, returning `x`) and never calls `ctx.mark_dirty(x)`, which PyTorch's contract
asks of every input a forward modifies in place. Here nothing else reads the input after the
call and nothing saved it, so backward (identity for `x`, a sum for the bias) gives the right
gradients: correct by luck, not by contract. The thread hit the unlucky form (the overwritten
input used again: see silent_15). The line deserves a warning that names `ctx.mark_dirty`, and
no error. (`# CULPRIT` marks the line the warning should name.)

Source: https://github.com/pytorch/pytorch/issues/5871
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/5871"
CATEGORY = "mark_dirty"


class AddBiasInplace(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor,
                bias: torch.Tensor) -> torch.Tensor:
        x.add_(bias)  # CULPRIT
        return x

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,
                 g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return g, g.sum(0)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3, bias=False)
        self.bias = nn.Parameter(torch.tensor([0.1, -0.2, 0.3]))
        self.out = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = AddBiasInplace.apply(self.lin(x), self.bias)
        return self.out(torch.relu(h))


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(4, 3, generator=g),)
