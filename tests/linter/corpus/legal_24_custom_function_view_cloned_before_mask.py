"""The fix PyTorch's error message and the thread give for a write into a view returned by a
custom `autograd.Function`: clone the Function's output, and make the write where autograd
records it (both lines outside `torch.no_grad()`: "moving both lines either inside the no grad
block or both outside make the intent of the user clear"). The masked positions then pass no
gradient, the rest goes through the custom straight-through backward. Must stay clean.

Source: https://github.com/pytorch/pytorch/issues/14707
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/14707"
CATEGORY = "custom function views"


class QuantizeFlatten(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        ctx.shape = x.shape
        q = torch.round(x.detach() * 4) / 4
        return q.view(x.shape[0], -1)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor) -> torch.Tensor:
        return g.reshape(ctx.shape)


class PaddedEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.head = nn.Linear(12, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = QuantizeFlatten.apply(self.proj(x)).clone()
        q[:, -4:] = 0
        return self.head(q)


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return PaddedEncoder(), (torch.randn(2, 3, 4, generator=g),)
