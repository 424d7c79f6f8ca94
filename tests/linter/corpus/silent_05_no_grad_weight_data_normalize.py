"""opensphere's CosFace head renormalizes its class weights at the top of every forward with
`with torch.no_grad(): self.w.data = F.normalize(self.w.data, dim=0)` and then computes
`F.normalize(x, dim=1).mm(self.w)`. The issue asks why the gradient skips the normalization: autograd
only sees `self.w` after it was overwritten, so the weight gradient lacks the Jacobian of the
normalization and differs silently from differentiating `x.mm(F.normalize(self.w, dim=0))`.

Source: https://github.com/ydwen/opensphere/issues/7
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

KIND = "silent"
FIXABLE = True
SOURCE = "https://github.com/ydwen/opensphere/issues/7"


class CosFace(nn.Module):
    """reference1: <CosFace: Large Margin Cosine Loss for Deep Face Recognition>
    reference2: <Additive Margin Softmax for Face Verification>
    """

    def __init__(self, feat_dim: int, num_class: int, s: float = 64.0, m: float = 0.35) -> None:
        super().__init__()
        self.feat_dim = feat_dim
        self.num_class = num_class
        self.s = s
        self.m = m
        self.w = nn.Parameter(torch.Tensor(feat_dim, num_class))
        nn.init.xavier_normal_(self.w)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.w.data = F.normalize(self.w.data, dim=0)  # CULPRIT

        cos_theta = F.normalize(x, dim=1).mm(self.w)
        with torch.no_grad():
            d_theta = torch.zeros_like(cos_theta)
            d_theta.scatter_(1, y.view(-1, 1), -self.m, reduce="add")

        logits = self.s * (cos_theta + d_theta)
        loss = F.cross_entropy(logits, y)

        return loss


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Linear(4, 3)
        self.head = CosFace(3, 5, s=8.0)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x), y)


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Model(), (torch.randn(4, 4, generator=g), torch.tensor([0, 2, 4, 1]))
