"""The user's `func(t, value)`: `a = t * t; a[0] = value; return a.sum()`, and asks why `t.grad` is
`[0., 4., 6., 8.]` rather than `2 * t`. The maintainer: in-place operations are taken into account, the
gradient is that of the value the function computed. The multiplication saves `t`, not `a`, so overwriting
`a[0]` is legal and the zero is the correct gradient.

Source: https://github.com/pytorch/pytorch/issues/61946
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/61946"


def func(t: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    a = t * t
    a[0] = value
    return a.sum()


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tt = nn.Parameter(torch.tensor([1.0, 2.0, 3.0, 4.0]))
        self.tvalue = nn.Parameter(torch.tensor([5.0]))

    def forward(self, scale: torch.Tensor) -> torch.Tensor:
        return func(self.tt * scale, self.tvalue)


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    return Model(), (torch.ones(4),)
