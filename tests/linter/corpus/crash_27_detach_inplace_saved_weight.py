"""`detach_()` in forward on a tensor an op saved for backward: a non-leaf class weight multiplies the
loss, then `weight = weight.detach_()`. `detach_` bumps no version counter; backward raises "Trying to
use a saved tensor that has been detached in-place" (an assertion failure before PyTorch turned it into
this error).

Source: https://github.com/pytorch/pytorch/issues/88809
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/issues/88809"


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.w = nn.Parameter(torch.rand(3))

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        inp = F.log_softmax(self.lin(x), dim=1)
        weight = self.w * 1.0  # a non-leaf copy (the thread's `.cuda()`)
        loss = F.nll_loss(inp, target)
        loss = torch.sum(weight * loss) * 0.25
        weight = weight.detach_()  # CULPRIT
        return loss


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g))
