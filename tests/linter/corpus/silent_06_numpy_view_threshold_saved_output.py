"""A tensor and the array `.numpy()` returns share memory ("tensor shares memory with numpy array", closed
as expected behaviour): writing into the array changes the tensor, and autograd's version counter does not
move. A gating layer thresholds its sigmoid in NumPy, `arr = y.detach().numpy(); arr[arr < 0.5] = 0.0`, the
way code hands tensors to NumPy helpers (or fused kernels store into their inputs). Sigmoid saved `y` for its
backward, which now runs with the thresholded values: no error, wrong gradients for the layer before.

Source: https://github.com/pytorch/pytorch/issues/97586
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "silent"
FIXABLE = False
SOURCE = "https://github.com/pytorch/pytorch/issues/97586"
CATEGORY = "unseen"


def hard_gate(y: torch.Tensor) -> torch.Tensor:
    arr = y.detach().numpy()
    arr[arr < 0.5] = 0.0  # CULPRIT
    return y


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.out = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(self.lin(x))
        y = hard_gate(y)
        return self.out(y)


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Gate(), (torch.randn(4, 3, generator=g),)
