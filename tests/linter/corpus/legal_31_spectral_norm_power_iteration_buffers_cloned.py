"""Spectral normalization done by hand, as `torch.nn.utils.parametrizations.spectral_norm`
does it: in training, a power-iteration step under `torch.no_grad()` writes the singular-vector
estimates into their buffers in place (`F.normalize(..., out=self.u)`), then the forward
*clones* them before computing sigma, so the tensors `dot`/`mv` save are never the buffers the
next call overwrites. A discriminator applies the layer twice per step (real and fake batch);
with the clones backward runs and the gradients are right. The PR moved the clone to where it
protects the saved tensors. An out-of-place rewrite must keep the buffer updates, keep the
buffers free of autograd history, and leave the gradients as they are.

Source: https://github.com/pytorch/pytorch/pull/62293
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/pytorch/pytorch/pull/62293"
CATEGORY = "buffers"


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
                F.normalize(torch.mv(self.weight.t(), self.u), dim=0, out=self.v)
                F.normalize(torch.mv(self.weight, self.v), dim=0, out=self.u)
        u = self.u.clone()
        v = self.v.clone()
        sigma = torch.dot(u, torch.mv(self.weight, v))
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
