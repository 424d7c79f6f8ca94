"""OpenNMT-py's `GlobalAttention` (the thread's traceback passes through its softmax, `align_vectors =
self.sm(align.view(batch*targetL, sourceL))`) scores with an MLP whose output is reshaped,
`self.v(wquh.view(-1, dim)).view(tgt_batch, tgt_len, src_len)`, and masks padded source positions through
`.data`: `align.data.masked_fill_(1 - mask, -float('inf'))`. The masked scores are a view of the linear
layer's output, and both require grad; the softmax sends zero gradient to the masked places, so the write
changes no gradient: legal, though autograd does not see it.

Source: https://github.com/OpenNMT/OpenNMT-py/issues/403
"""

from __future__ import annotations

import torch
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/OpenNMT/OpenNMT-py/issues/403"
CATEGORY = "data without effect"


class GlobalAttention(nn.Module):
    def __init__(self, dim: int = 4) -> None:
        super().__init__()
        self.dim = dim
        self.linear_context = nn.Linear(dim, dim, bias=False)
        self.linear_query = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, 1, bias=False)
        self.sm = nn.Softmax(dim=-1)

    def score(self, h_t: torch.Tensor, h_s: torch.Tensor) -> torch.Tensor:
        tgt_batch, tgt_len, dim = h_t.size()
        src_len = h_s.size(1)
        shape = (tgt_batch, tgt_len, src_len, dim)
        wq = self.linear_query(h_t).view(tgt_batch, tgt_len, 1, dim).expand(shape)
        uh = self.linear_context(h_s).view(tgt_batch, 1, src_len, dim).expand(shape)
        wquh = torch.tanh(wq + uh)
        return self.v(wquh.view(-1, dim)).view(tgt_batch, tgt_len, src_len)

    def forward(self, source: torch.Tensor, memory_bank: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        batch, target_l, _ = source.size()
        source_l = memory_bank.size(1)
        align = self.score(source, memory_bank)
        align.data.masked_fill_(~mask, -float("inf"))
        align_vectors = self.sm(align.view(batch * target_l, source_l))
        align_vectors = align_vectors.view(batch, target_l, source_l)
        return torch.bmm(align_vectors, memory_bank)


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    source = torch.randn(2, 3, 4, generator=g)
    memory_bank = torch.randn(2, 5, 4, generator=g)
    mask = (torch.arange(5) < torch.tensor([5, 3])[:, None])[:, None, :]
    return GlobalAttention(), (source, memory_bank, mask)
