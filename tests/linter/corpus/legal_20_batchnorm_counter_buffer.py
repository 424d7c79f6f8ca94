"""Since PyTorch 0.4.1 BatchNorm counts its updates in a zero-initialised buffer, `num_batches_tracked`;
a state dict without that entry no longer loads ("Missing key(s) in state_dict: bn.num_batches_tracked").
A hand-written batch norm keeps the same state: the counter `self.num_batches_tracked += 1` and the running
statistics, updated in forward under `no_grad` by `mul_`/`add_` and `+=` (EMAs). A rewrite that drops the
zero counter, or computes the statistics with autograd on, is not the same model.

Source: https://github.com/pytorch/pytorch/issues/8430
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/8430"
CATEGORY = "buffers"


class MyBatchNorm(nn.Module):
    def __init__(self, num_features: int = 3, momentum: float = 0.1, eps: float = 1e-5) -> None:
        super().__init__()
        self.momentum = momentum
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(0)
        var = x.var(0, unbiased=False)
        with torch.no_grad():
            self.num_batches_tracked += 1
            self.running_mean.mul_(1 - self.momentum).add_(self.momentum * mean)
            self.running_var += self.momentum * (var - self.running_var)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.bn = MyBatchNorm(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.lin(x))


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(5, 3, generator=g),)
