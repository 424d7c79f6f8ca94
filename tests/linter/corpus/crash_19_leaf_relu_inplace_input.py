"""The reporter applies `F.relu(x, inplace=True)` (followed by an in-place dropout) directly to a Variable
created with `requires_grad=True`. The maintainer's answer: in-place operations on leaf Variables are not
allowed; current PyTorch raises "a leaf Variable that requires grad is being used in an in-place operation"
already in the forward. The in-place dropout is left out (it would add randomness and a second culprit),
and a linear layer gives the example a parameter.

Source: https://github.com/pytorch/pytorch/issues/727
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

KIND = "crash"
FIXABLE = False
SOURCE = "https://github.com/pytorch/pytorch/issues/727"


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(x, inplace=True)  # CULPRIT
        return self.lin(x)


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(3, 4, generator=g).requires_grad_(),)
