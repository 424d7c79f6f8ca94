"""CircleLossLikeCE builds its per-class weights with in-place scatters on tensors that do not require
grad: `a = torch.clamp_min(inp + self.m, min=0).detach()` then `a.scatter_(...)`, and
`sigma = torch.ones_like(inp) * self.m` then `sigma.scatter_(...)`, before `self.loss(a * (inp - sigma) *
self.gamma, label)`. Nothing that autograd saved is modified, so the gradients equal those of the
out-of-place `scatter`. NormLinear is the repository's cosine classifier.

Source: https://github.com/TinyZeaMays/CircleLoss/blob/272ededb78f49c6a80f81544174d5b88fb90e12b/circle_loss.py
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/TinyZeaMays/CircleLoss/blob/272ededb78f49c6a80f81544174d5b88fb90e12b/circle_loss.py"


class NormLinear(nn.Linear):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features, bias=False)

    def forward(self, inp: Tensor) -> Tensor:
        return nn.functional.linear(nn.functional.normalize(inp), nn.functional.normalize(self.weight))


class CircleLossLikeCE(nn.Module):
    def __init__(self, m: float, gamma: float) -> None:
        super().__init__()
        self.m = m
        self.gamma = gamma
        self.loss = nn.CrossEntropyLoss()

    def forward(self, inp: Tensor, label: Tensor) -> Tensor:
        a = torch.clamp_min(inp + self.m, min=0).detach()
        src = torch.clamp_min(
            -inp.gather(dim=1, index=label.unsqueeze(1)) + 1 + self.m,
            min=0,
        ).detach()
        a.scatter_(dim=1, index=label.unsqueeze(1), src=src)

        sigma = torch.ones_like(inp, device=inp.device, dtype=inp.dtype) * self.m
        src = torch.ones_like(label.unsqueeze(1), dtype=inp.dtype, device=inp.device) - self.m
        sigma.scatter_(dim=1, index=label.unsqueeze(1), src=src)

        return self.loss(a * (inp - sigma) * self.gamma, label)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = NormLinear(4, 3)
        self.criterion = CircleLossLikeCE(m=0.25, gamma=8)

    def forward(self, x: Tensor, label: Tensor) -> Tensor:
        return self.criterion(self.fc(x), label)


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(4, 4, generator=g), torch.tensor([0, 2, 1, 2]))
