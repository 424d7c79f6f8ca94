"""Pre-activation variant of torchvision's BasicBlock from the maintainer's answer: the shared
`nn.ReLU(inplace=True)` is applied before the residual sum, `out = self.relu(out)` then `out += identity`.
ReLU saves its output for backward, so the in-place add makes backward raise.

Source: https://github.com/pytorch/vision/issues/807
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/pytorch/vision/issues/807"


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 2, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(2)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(2, 2, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        out = self.relu(out)
        out += identity  # CULPRIT
        return out


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(2, 2, 4, 4, generator=g),)
