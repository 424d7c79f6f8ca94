"""The user's `reduce` helper copies x, y, z into slots of a zeros buffer and writes intermediate results to
further slots, `tensor[2] = op(tensor[0], tensor[1])`, `tensor[4] = op(tensor[2], tensor[3])`. With
`op=torch.add` backward works and the gradients are right: addition saves nothing, so the later slot writes
invalidate no saved tensor. (With `op=torch.mul` it raises, because mul saves its inputs.)

Source: https://github.com/pytorch/pytorch/issues/74874
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/74874"


def reduce(x: Tensor, y: Tensor, z: Tensor, op: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    tensor = torch.zeros((5,), dtype=torch.float32, requires_grad=False)
    tensor[0] = x
    tensor[1] = y
    tensor[3] = z

    tensor[2] = op(tensor[0], tensor[1])
    tensor[4] = op(tensor[2], tensor[3])
    return tensor[4]


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(2, 3)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        x, y, z = self.proj(inp).unbind(-1)
        return reduce(x, y, z, op=torch.add)


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(2, generator=g),)
