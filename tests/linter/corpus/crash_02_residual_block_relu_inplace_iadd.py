"""ResidualBlock whose left branch ends in `nn.ReLU(inplace=True)` inside an `nn.Sequential`, followed by
`out += residual`. In PyTorch 0.3 this silently trained badly; the maintainers' answer is that an in-place
add after an in-place ReLU is invalid, and current PyTorch raises in backward because ReLU saved its output.

Source: https://github.com/pytorch/pytorch/issues/5687
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/5687"


class ResidualBlock(nn.Module):
    def __init__(self, ch_in: int, ch_out: int, shortcut: nn.Module | None = None) -> None:
        super().__init__()
        self.left = nn.Sequential(
            nn.Conv2d(ch_in, 4, 3, 1, 1),
            nn.ReLU(inplace=True),
            nn.Conv2d(4, ch_out, 3, 1, 1),
            nn.ReLU(inplace=True),
        )
        self.right = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.left(x)
        residual = x if self.right is None else self.right(x)
        out += residual  # CULPRIT
        return F.relu(out, inplace=False)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = ResidualBlock(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(1, 2, 4, 4, generator=g),)
