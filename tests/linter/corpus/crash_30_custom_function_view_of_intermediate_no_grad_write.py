"""A custom `autograd.Function` computes its result on a detached copy (a quantizer with a
straight-through backward) and returns a flattened *view* of that intermediate; the model then
masks the padded positions of the result under `torch.no_grad()`. Autograd cannot replay a
custom backward for a view: the write goes through, and the next use of the tensor raises
"Output 0 of ... is a view and its base or another view of its base has been modified inplace.
This view was created inside a custom Function ...". The traceback names the line that uses
the tensor, not the write. The thread's own example (`Mul3ThenFlatten`, `output.fill_(1)` under
no_grad) once skipped the custom backward silently; PyTorch then forbade the pattern (a
deprecation warning first, an error since).

Source: https://github.com/pytorch/pytorch/issues/14707
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "crash"
FIXABLE = False
SOURCE = "https://github.com/pytorch/pytorch/issues/14707"
CATEGORY = "custom function views"


class QuantizeFlatten(torch.autograd.Function):
    """Round to a grid of 1/4 and flatten the last two dimensions; the backward passes the
    gradient straight through."""

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
        q = QuantizeFlatten.apply(self.proj(x))
        with torch.no_grad():
            q[:, -4:] = 0  # CULPRIT
        return self.head(q)


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return PaddedEncoder(), (torch.randn(2, 3, 4, generator=g),)
