"""AngularPenaltySMLoss meant to L2-normalize the classifier weights in forward, but
`for W in self.fc.parameters(): W = F.normalize(W, p=2, dim=1)` only rebinds a name. The fix proposed and
upvoted in the thread writes the normalized weights through `.data`, `module.weight.data =
F.normalize(module.weight, p=2, dim=1)`. The forward value is then right, but autograd never sees the
normalization, so the weight gradient lacks its Jacobian and differs silently from that of
`F.linear(x, F.normalize(W))` (what the thread's later `weight_norm` suggestion computes). The loss type
is cosface.

Source: https://github.com/cvqluu/Angular-Penalty-Softmax-Losses-Pytorch/issues/3
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

KIND = "silent"
FIXABLE = True
SOURCE = "https://github.com/cvqluu/Angular-Penalty-Softmax-Losses-Pytorch/issues/3"


class AngularPenaltySMLoss(nn.Module):
    def __init__(self, in_features: int, out_features: int, s: float = 30.0, m: float = 0.4) -> None:
        super().__init__()
        self.s = s
        self.m = m
        self.in_features = in_features
        self.out_features = out_features
        self.fc = nn.Linear(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        for _, module in self.fc.named_modules():
            if isinstance(module, nn.Linear):
                module.weight.data = F.normalize(module.weight, p=2, dim=1)  # CULPRIT

        x = F.normalize(x, p=2, dim=1)

        wf = self.fc(x)
        numerator = self.s * (torch.diagonal(wf.transpose(0, 1)[labels]) - self.m)
        excl = torch.cat(
            [torch.cat((wf[i, :y], wf[i, y + 1 :])).unsqueeze(0) for i, y in enumerate(labels)], dim=0
        )
        denominator = torch.exp(numerator) + torch.sum(torch.exp(self.s * excl), dim=1)
        L = numerator - torch.log(denominator)
        return -torch.mean(L)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 3)
        self.loss = AngularPenaltySMLoss(3, 5)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss(self.embed(x), labels)


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(4, 4, generator=g), torch.tensor([0, 2, 4, 1]))
