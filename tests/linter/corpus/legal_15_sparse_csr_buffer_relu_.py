"""The reporter multiplies a constant sparse CSR matrix with a tensor that requires grad, `torch.mm(M, x)`
with `M = torch.randn(3, 3).to_sparse_csr()`, and asks for the gradient with respect to `x` (it failed for
CSR on CUDA then; it works on the CPU here). As a layer: the CSR matrix is a buffer, and the product goes
through `relu_`, legal because `mm` with a constant sparse matrix saves that matrix, not its output.

Source: https://github.com/pytorch/pytorch/issues/68621
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/68621"
CATEGORY = "sparse"


class Model(nn.Module):
    def __init__(self, m: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("M", m)
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.mm(self.M, self.lin(x))
        y.relu_()
        return y


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    m = torch.randn(3, 3, generator=g).relu().to_sparse_csr()
    return Model(m), (torch.randn(3, 3, generator=g),)
