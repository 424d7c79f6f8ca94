"""The thread's bug: a custom `autograd.Function` adds into its (non-leaf) input in place,
`x.add_(bias)`, without `ctx.mark_dirty(x)`, and the model reads the input again after the call
(a skip connection from the same tensor). Without `mark_dirty` autograd does not move the
input's history onto the Function: the skip path sees the new values (bias included) but its
gradient goes to the old history (`lin`), so the bias misses the gradient of the skip path.
Nothing raises; the bias gradient is silently too small. With `ctx.mark_dirty(x)` it is right.

Source: https://github.com/pytorch/pytorch/issues/5871
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "silent"
FIXABLE = False
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
        h = self.lin(x)
        y = AddBiasInplace.apply(h, self.bias)
        return self.out(torch.relu(y) + 2 * h)


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(4, 3, generator=g),)


def fixed_by_hand() -> nn.Module:
    """The fix: the same Function with `ctx.mark_dirty(x)`."""
    model, _ = make()

    class Marked(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, bias):  # type: ignore[override]
            x.add_(bias)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):  # type: ignore[override]
            return g, g.sum(0)

    def forward(x: torch.Tensor) -> torch.Tensor:
        h = model.lin(x)
        y = Marked.apply(h, model.bias)
        return model.out(torch.relu(y) + 2 * h)

    model.forward = forward
    return model
