"""The user bifurcates the data flow: `x = self.conv1(input)`, a side branch `x_p = self.conv1_p(x)`, then
`x += some_layer` on the main branch. conv1_p saved `x` as its input, so the in-place add makes backward
raise; `x = x + some_layer` works. The answer contrasts this with ResNet's `out += residual` after a
BatchNorm, which does not save its output (legal_01).

Source: https://discuss.pytorch.org/t/when-would-the-error-one-of-the-variables-needed-for-gradient-computation-has-been-modified-occur/11976/2
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://discuss.pytorch.org/t/when-would-the-error-one-of-the-variables-needed-for-gradient-computation-has-been-modified-occur/11976/2"


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 2, 3, padding=1)
        self.conv1_p = nn.Conv2d(2, 2, 3, padding=1)
        self.some = nn.Conv2d(2, 2, 1)

    def forward(self, input: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.conv1(input)  # main branch
        x_p = self.conv1_p(x)  # another branch
        some_layer = self.some(input)
        x += some_layer  # CULPRIT
        return x, x_p


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(1, 2, 4, 4, generator=g),)
