"""vector-quantize-pytorch updates its codebook by exponential moving averages in forward, on buffers and
through `.data` (`ema_inplace(self.cluster_size.data, cluster_size, self.decay)`, then the normalized
`embed_avg` copied into `self.embed.data`), with a straight-through estimator for the encoder. The thread
fixes buffers that stayed attached to the autograd graph; the EMA updates themselves are legal and must
survive a rewrite, and the codebook read after its update must pass no gradient.

Source: https://github.com/lucidrains/vector-quantize-pytorch/pull/57
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/lucidrains/vector-quantize-pytorch/pull/57"
CATEGORY = "buffers"


def ema_inplace(moving_avg: torch.Tensor, new: torch.Tensor, decay: float) -> None:
    moving_avg.mul_(decay).add_(new * (1 - decay))


class EuclideanCodebook(nn.Module):
    def __init__(self, dim: int = 3, codebook_size: int = 4, decay: float = 0.8,
                 eps: float = 1e-5) -> None:
        super().__init__()
        self.decay = decay
        self.eps = eps
        embed = torch.randn(codebook_size, dim)
        self.register_buffer("cluster_size", torch.zeros(codebook_size))
        self.register_buffer("embed", embed)
        self.register_buffer("embed_avg", embed.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dist = -torch.cdist(x, self.embed)
        embed_ind = dist.argmax(dim=-1)
        embed_onehot = F.one_hot(embed_ind, self.embed.shape[0]).type(x.dtype)
        quantize = F.embedding(embed_ind, self.embed)
        if self.training:
            cluster_size = embed_onehot.sum(0)
            ema_inplace(self.cluster_size.data, cluster_size, self.decay)
            embed_sum = embed_onehot.t() @ x.detach()
            ema_inplace(self.embed_avg.data, embed_sum, self.decay)
            n = self.cluster_size.sum()
            smoothed = (self.cluster_size + self.eps) / (n + self.embed.shape[0] * self.eps) * n
            self.embed.data.copy_(self.embed_avg / smoothed.unsqueeze(1))
        return quantize


class VectorQuantize(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.project_in = nn.Linear(5, 3)
        self._codebook = EuclideanCodebook()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.project_in(x)
        quantize = self._codebook(x)
        commit_loss = F.mse_loss(quantize.detach(), x)
        quantize = x + (quantize - x).detach()
        return quantize, commit_loss


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return VectorQuantize(), (torch.randn(6, 5, generator=g),)
