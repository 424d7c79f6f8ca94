"""The issue asks why torchvision's AlexNet uses `nn.ReLU(inplace=True)` although in-place operations are
discouraged; the maintainer answers that it saves memory and that these uses are safe. Each in-place ReLU
follows a Conv2d or Linear, which saves its input rather than its output. Shrunk from the linked
alexnet.py (https://github.com/pytorch/vision/blob/693829121bdc3e26714691f70241c6c01a089457/torchvision/models/alexnet.py);
the classifier's Dropout layers are left out to keep the example deterministic.

Source: https://github.com/pytorch/vision/issues/807
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/pytorch/vision/issues/807"


class AlexNet(nn.Module):
    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 4, kernel_size=3, stride=1, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=2, stride=2),
            nn.Conv2d(4, 4, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=2, stride=2),
        )
        self.classifier = nn.Sequential(
            nn.Linear(4 * 2 * 2, 8),
            nn.ReLU(inplace=True),
            nn.Linear(8, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = x.view(x.size(0), 4 * 2 * 2)
        x = self.classifier(x)
        return x


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return AlexNet(), (torch.randn(2, 3, 8, 8, generator=g),)
