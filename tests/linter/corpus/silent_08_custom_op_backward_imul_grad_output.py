"""A custom op whose backward scales the incoming gradient in place, `grad_output *= 2.0; return
grad_output`, inside a network with a learnable scale (the thread is about this backward "not being
called"). Here the op's output is summed with a residual branch: the residual's gradient is the same tensor,
doubled behind its back.

Source: https://github.com/pytorch/pytorch/issues/30454
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "silent"
FIXABLE = False
SOURCE = "https://github.com/pytorch/pytorch/issues/30454"
CATEGORY = "custom backward"


class CustomOp(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,
                 grad_output: torch.Tensor) -> torch.Tensor:
        grad_output *= 2.0  # CULPRIT
        return grad_output


def custom_op(x: torch.Tensor) -> torch.Tensor:
    return CustomOp.apply(x)


class Net(nn.Module):
    def __init__(self, in_channel: int = 4, out_channel: int = 3, scale: float = 4.0) -> None:
        super().__init__()
        self.fc = nn.Linear(in_channel, out_channel)
        self.residual = nn.Linear(in_channel, out_channel)
        self.s = nn.Parameter(torch.tensor(scale))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        res = self.residual(input)
        logits = custom_op(self.fc(input))
        return (logits + res) * self.s


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Net(), (torch.rand(5, 4, generator=g),)
