"""Spectral normalization done by hand, without the clone that pytorch/pytorch#62293 put
before the power iteration: in training, a step under `torch.no_grad()` writes the
singular-vector estimates into their buffers in place (`F.normalize(..., out=self.u)`), and
sigma is computed from the buffers themselves, so `dot` and `mv` save them for backward. A
discriminator applies the layer twice per step (real and fake batch): the second call's
in-place update overwrites the buffers the first call saved, and backward raises "one of the
variables needed for gradient computation has been modified by an inplace operation".

Source: https://github.com/pytorch/pytorch/pull/62293
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/pull/62293"


class SNLinear(nn.Module):
    def __init__(self, n_in: int = 4, n_out: int = 3) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) * 0.5)
        self.bias = nn.Parameter(torch.zeros(n_out))
        self.register_buffer("u", F.normalize(torch.randn(n_out), dim=0))
        self.register_buffer("v", F.normalize(torch.randn(n_in), dim=0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                F.normalize(torch.mv(self.weight.t(), self.u), dim=0, out=self.v)  # CULPRIT
                F.normalize(torch.mv(self.weight, self.v), dim=0, out=self.u)
        sigma = torch.dot(self.u, torch.mv(self.weight, self.v))
        return F.linear(x, self.weight / sigma, self.bias)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sn = SNLinear()
        self.out = nn.Linear(3, 1)

    def forward(self, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
        d_real = self.out(torch.relu(self.sn(real)))
        d_fake = self.out(torch.relu(self.sn(fake)))
        return (F.softplus(-d_real) + F.softplus(d_fake)).mean()


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Discriminator(), (torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g))


def fixed_by_hand() -> nn.Module:
    """The fix of the PR: clone the buffers before sigma (forward mode cannot be the reference:
    it differentiates through the `no_grad` power iteration)."""
    model, _ = make()
    sn = model.sn

    def forward(x: torch.Tensor) -> torch.Tensor:
        if sn.training:
            with torch.no_grad():
                F.normalize(torch.mv(sn.weight.t(), sn.u), dim=0, out=sn.v)
                F.normalize(torch.mv(sn.weight, sn.v), dim=0, out=sn.u)
        sigma = torch.dot(sn.u.clone(), torch.mv(sn.weight, sn.v.clone()))
        return F.linear(x, sn.weight / sigma, sn.bias)

    sn.forward = forward
    return model
