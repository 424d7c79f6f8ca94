"""Saved-tensor hooks whose pack hook passes small tensors through unchanged (`return x, "not_packed"`)
and compresses the rest, as offloading or compression policies do. Autograd checks no version of a
tensor saved through hooks, so `y += 1` after `exp` (which saves its output) is not an error any more:
backward runs and computes with the written value (the gradient is 2 * (exp(h) + 1) instead of
2 * exp(h)). Without the hooks the same model raises.

Source: https://github.com/pytorch/pytorch/issues/64729
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "silent"
FIXABLE = False
SOURCE = "https://github.com/pytorch/pytorch/issues/64729"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    @staticmethod
    def pack_hook(x: torch.Tensor) -> tuple[torch.Tensor, str]:
        if x.numel() < 1024:  # small tensors: kept as they are
            return x, "not_packed"
        return x.to(torch.bfloat16), "packed"

    @staticmethod
    def unpack_hook(packed: tuple[torch.Tensor, str]) -> torch.Tensor:
        x, status = packed
        return x if status == "not_packed" else x.float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autograd.graph.saved_tensors_hooks(self.pack_hook, self.unpack_hook):
            y = torch.exp(self.lin(x))
        y += 1  # CULPRIT
        return y * 2


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Net(), (torch.randn(3, 4, generator=g),)
