"""mlcolvar's `FeedForward` builds its network in `__init__`, appending per layer a `Linear`, the activation
(`ReLU`) and `torch.nn.Dropout(p=drop, inplace=True)`, and runs it as
`self.nn = torch.nn.Sequential(*modules)`; with dropout switched on, backward raises "output 0 of
ReluBackward0 ... is at version 2". No line of the user's forward writes in place: the Sequential runs the
Dropout, and the line to fix is the one that built it.

Source: https://github.com/luigibonati/mlcolvar/issues/118
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/luigibonati/mlcolvar/issues/118"
CATEGORY = "container"


class FeedForward(nn.Module):
    def __init__(self, layers: list[int], dropout: float = 0.5) -> None:
        super().__init__()
        modules: list[nn.Module] = []
        for i in range(len(layers) - 1):
            modules.append(torch.nn.Linear(layers[i], layers[i + 1]))
            modules.append(torch.nn.ReLU(True))
            modules.append(torch.nn.Dropout(p=dropout, inplace=True))  # CULPRIT
        self.nn = torch.nn.Sequential(*modules)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.nn(x)


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return FeedForward([3, 4, 2]), (torch.randn(5, 3, generator=g),)
