"""The contract of pytorch/pytorch#5871's in-place custom Function: the forward adds into its
input in place and calls `ctx.mark_dirty(x)`. Autograd then moves the input's history onto the
Function, so a later read of the same tensor (a skip connection) also sends its gradient
through the Function's backward, and the bias gets the gradient of both paths. Must stay clean.

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
        x.add_(bias)
        ctx.mark_dirty(x)
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
        h = self.lin(x)
        y = AddBiasInplace.apply(h, self.bias)
        return self.out(torch.relu(y) + 2 * h)


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(4, 3, generator=g),)
