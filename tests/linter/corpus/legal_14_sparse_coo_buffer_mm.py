"""A module keeps a sparse COO matrix as a buffer, `self.register_buffer("x", s)`, and multiplies by it in
forward, `torch.mm(self.x, y)`; the thread is about saving it (TorchScript cannot), the Python module works.
A graph layer built this way adds its bias in place, `out += self.bias`: legal, `torch.mm` saves its
inputs, not its output.

Source: https://github.com/pytorch/pytorch/issues/58883
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/58883"
CATEGORY = "sparse"


class M(nn.Module):
    def __init__(self, x: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("x", x)
        self.lin = nn.Linear(3, 3, bias=False)
        self.bias = nn.Parameter(torch.zeros(3))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        out = torch.mm(self.x, self.lin(y))
        out += self.bias
        return out


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    i = [[0, 1, 1], [2, 0, 2]]
    v = [3.0, 4.0, 5.0]
    s = torch.sparse_coo_tensor(i, v, (2, 3))
    return M(s), (torch.randn(3, 3, generator=g),)
