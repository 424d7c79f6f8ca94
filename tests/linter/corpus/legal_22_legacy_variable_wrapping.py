"""Code written for PyTorch 0.3 wraps tensors in `Variable(...)` (OpenNMT's port to 0.4 lists "remove all
the Variable calls"): an initial hidden state `Variable(emb.data.new(...).zero_(), requires_grad=False)`,
inputs wrapped again, and in-place updates on the wrapped values. `Variable(t)` returns `t` today; the model
is legal and must come back from a rewrite unchanged in meaning.

Source: https://github.com/OpenNMT/OpenNMT-py/issues/705
"""

from __future__ import annotations

import torch
from torch import nn
from torch.autograd import Variable

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/OpenNMT/OpenNMT-py/issues/705"
CATEGORY = "buffers"


class RNNEncoder(nn.Module):
    def __init__(self, vocab: int = 7, size: int = 3) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(vocab, size)
        self.rnn = nn.GRU(size, size)
        self.bridge = nn.Linear(size, size)

    def forward(self, src: torch.Tensor) -> torch.Tensor:
        emb = self.embeddings(Variable(src))
        h_0 = Variable(emb.data.new(1, emb.size(1), emb.size(2)).zero_(), requires_grad=False)
        h_0 += 0.1
        memory_bank, _ = self.rnn(emb, h_0)
        out = self.bridge(memory_bank)
        out += Variable(torch.ones(1))
        return out


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return RNNEncoder(), (torch.randint(0, 7, (4, 2), generator=g),)
