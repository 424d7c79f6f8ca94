"""A TorchScript helper (`@torch.jit.script`, as training code scripts its small fused ops) that adds a
bias in place to its input, which a sigmoid saved for its backward: backward raises "modified by an
inplace operation". No Python frame runs inside the scripted code, so the line to name is the one that
calls it; tools that look for in-place ops in TorchScript exist for this reason.

Source: https://github.com/pfnet/pytorch-pfn-extras/pull/603
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/pfnet/pytorch-pfn-extras/pull/603"


@torch.jit.script
def bias_act(y: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    y.add_(b)
    return y


class ScriptedHelper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.b = nn.Parameter(torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(self.lin(x))
        return bias_act(y, self.b)  # CULPRIT


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return ScriptedHelper(), (torch.randn(3, 4, generator=g),)
