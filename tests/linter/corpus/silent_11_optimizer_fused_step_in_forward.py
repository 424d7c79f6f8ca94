"""The GAN of pytorch/pytorch#39141, whose forward steps the discriminator's optimizer
(`opt_D.step()`) after the fake batch went through the discriminator, with the fused Adam
(`fused=True`, one kernel for the whole step). The step writes D's weights, which the
generator's graph saved; the fused kernel moves no version counter, so backward does not
raise as it does with the for-loop or multi-tensor step: it computes the generator's
gradients with the stepped weights, silently.

Source: https://github.com/pytorch/pytorch/issues/39141
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "silent"
FIXABLE = False
SOURCE = "https://github.com/pytorch/pytorch/issues/39141"


class GAN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.G = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 15))
        self.D = nn.Sequential(nn.Linear(15, 16), nn.ReLU(), nn.Linear(16, 1), nn.Sigmoid())
        self.opt_D = torch.optim.Adam(self.D.parameters(), lr=1e-2, fused=True)

    def forward(self, ideas: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        fake = self.G(ideas)
        prob_real = self.D(real)
        prob_fake = self.D(fake)
        d_loss = -torch.mean(torch.log(prob_real) + torch.log(1.0 - prob_fake))
        grads = torch.autograd.grad(d_loss, list(self.D.parameters()), retain_graph=True)
        for p, g in zip(self.D.parameters(), grads, strict=True):
            p.grad = g
        self.opt_D.step()  # CULPRIT
        return torch.mean(torch.log(1.0 - prob_fake))


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return GAN(), (torch.randn(8, 5, generator=g), torch.randn(8, 15, generator=g))
