"""The poster's ResNet-like helper: `for r in residual: x += r` followed by `activation(x, inplace=inplace)`
with `F.relu`. The in-place sums modify a tensor nothing saved (here the output of a BatchNorm), and the
in-place ReLU is the last operation, so this is legal; the thread's confusion about the gradient of `x`
comes from `x` naming the ReLU output afterwards.

Source: https://discuss.pytorch.org/t/understanding-autograd-relu-inplace-true/89031
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://discuss.pytorch.org/t/understanding-autograd-relu-inplace-true/89031"


def residual_activation_inplace(
    x: torch.Tensor, residual: list[torch.Tensor], activation: Callable[..., torch.Tensor], inplace: bool
) -> torch.Tensor:
    for r in residual:
        x += r
    return activation(x, inplace=inplace)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(2)
        self.res1 = nn.Conv2d(2, 2, 1)
        self.res2 = nn.Conv2d(2, 2, 1)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        x = self.bn(self.conv(inp))
        residual = [self.res1(inp), self.res2(inp)]
        return residual_activation_inplace(x, residual, F.relu, inplace=True)


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(2, 2, 4, 4, generator=g),)
