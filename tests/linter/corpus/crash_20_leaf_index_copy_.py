"""The poster lists in-place operations on `c = torch.randn(..., requires_grad=True)`; `c += 1`, `c.add_(1)`
and `c.index_copy_(3, torch.tensor(10), ...)` all raise "a leaf Variable that requires grad is being used in
an in-place operation". Here the leaf is the model input and the operation is the index_copy_; the
values copied in are a fixed buffer instead of a fresh `torch.randn`.

Source: https://discuss.pytorch.org/t/inplace-operation-changes-is-leaf-attribute/120297
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "crash"
FIXABLE = False
SOURCE = "https://discuss.pytorch.org/t/inplace-operation-changes-is-leaf-attribute/120297"


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.register_buffer("src", torch.linspace(-1, 1, 12).reshape(2, 3, 2, 1))

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        c.index_copy_(3, torch.tensor([1]), self.src)  # CULPRIT
        return self.lin(c)


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(2, 3, 2, 4, generator=g, requires_grad=True),)
