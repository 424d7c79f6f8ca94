"""PyTorch can switch saved-tensor hooks off for a region, `torch.autograd.graph.disable_saved_tensors_hooks
(msg)`, for code that does not work with them (functorch transforms, at first); entering the region while
hooks are installed raises `msg`. A model that computes a block this way runs and trains normally, but under
any tool that installs saved-tensor hooks (fxquant's recording does) the forward raises.

Source: https://github.com/pytorch/pytorch/pull/85553
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/pull/85553"
CATEGORY = "instruments"


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.out = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autograd.graph.disable_saved_tensors_hooks("this block runs without hooks"):
            h = self.lin(x) * 2
        h += 1
        return self.out(torch.tanh(h))


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(4, 3, generator=g),)
