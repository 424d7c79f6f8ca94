"""NystromAttention derived q, k, v with `self.to_qkv(x).chunk(3, dim=-1)`, rearranged each to `b h n d`,
then scaled the queries in place with `q *= self.scale`. The rearranged q is still a view of a chunk
output, so the forward raises "Output 0 of PermuteBackward0 is a view and is being modified inplace" (here
the view comes from transpose); newer releases write `q = q * self.scale`. einops' rearrange is written as
reshape + transpose, and the landmark approximation is replaced by plain softmax attention.

Source: https://github.com/lucidrains/nystrom-attention/issues/13
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/lucidrains/nystrom-attention/issues/13"


class Attention(nn.Module):
    def __init__(self, dim: int, dim_head: int = 2, heads: int = 2) -> None:
        super().__init__()
        inner_dim = heads * dim_head
        self.heads = heads
        self.scale = dim_head**-0.5
        self.to_qkv = nn.Linear(dim, inner_dim * 3, bias=False)
        self.to_out = nn.Linear(inner_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        h = self.heads
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = map(lambda t: t.reshape(b, n, h, -1).transpose(1, 2), (q, k, v))
        q *= self.scale  # CULPRIT
        attn = (q @ k.transpose(-1, -2)).softmax(dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(b, n, -1)
        return self.to_out(out)


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Attention(4), (torch.randn(1, 3, 4, generator=g),)
