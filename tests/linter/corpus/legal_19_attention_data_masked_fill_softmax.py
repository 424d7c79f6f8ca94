"""The attention in "attention is all you need" masks padded keys through `.data`, `attn.data.masked_fill_
(attn_mask, -float('inf'))`, before the softmax; the issue asks whether that is correct, since autograd does
not see the write. Here it is: the masked scores become -inf, their softmax weights 0, and the softmax's
gradient is 0 there, so every gradient equals the out-of-place version's. (The author later moved to the
out-of-place `masked_fill`.)

Source: https://github.com/jadore801120/attention-is-all-you-need-pytorch/issues/16
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/jadore801120/attention-is-all-you-need-pytorch/issues/16"
CATEGORY = "data without effect"


class ScaledDotProductAttention(nn.Module):
    def __init__(self, d_model: int = 4) -> None:
        super().__init__()
        self.temper = d_model**0.5
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                attn_mask: torch.Tensor) -> torch.Tensor:
        attn = torch.bmm(self.w_q(q), self.w_k(k).transpose(1, 2)) / self.temper
        attn.data.masked_fill_(attn_mask, -float("inf"))
        attn = self.softmax(attn)
        return torch.bmm(attn, v)


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 4, generator=g) for _ in range(3))
    lengths = torch.tensor([3, 2])
    attn_mask = (torch.arange(3) >= lengths[:, None])[:, None, :].expand(2, 3, 3)
    return ScaledDotProductAttention(), (q, k, v, attn_mask)
