"""A custom Function's backward changes the gradient it receives in place, `x += 1; return x` (the issue
asks PyTorch to detect this, because "modifying the grad_input during the backward pass ... can produce
silently incorrect gradients"). When the Function's output is added to another branch, `AddBackward` hands
the same gradient tensor to both sides, and the other branch's gradient changes too.

Source: https://github.com/pytorch/pytorch/issues/81417
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "silent"
FIXABLE = False
SOURCE = "https://github.com/pytorch/pytorch/issues/81417"
CATEGORY = "custom backward"


class Func(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        x += 1  # CULPRIT
        return x


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.branch = nn.Linear(3, 3)
        self.skip = nn.Linear(3, 3)
        self.head = nn.Linear(3, 1)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        other = self.skip(a)
        out = Func.apply(self.branch(a))
        return self.head(out + other)


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.rand(2, 3, generator=g),)
