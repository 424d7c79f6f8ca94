"""The user splits a predicted flow field with `u, v = flow.chunk(2, dim=1)` and rescales it in place with
`v *= v_scale`. chunk returns several views of one tensor, and autograd forbids in-place writes to such
views: the forward raises "Output 1 of Split... is a view and is being modified inplace" (a deprecation
warning in 1.7, an error since). The thread's fix is `v = v_scale * v`.

Source: https://github.com/pytorch/pytorch/issues/46820
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/46820"


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3, padding=1)
        self.v_scale = 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flow = self.conv(x)
        u, v = flow.chunk(2, dim=1)
        v *= self.v_scale  # CULPRIT
        return torch.cat([u, v], dim=1)


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(1, 3, 4, 4, generator=g),)
