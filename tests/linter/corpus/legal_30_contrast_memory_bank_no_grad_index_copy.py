"""A contrastive-distillation memory bank (CRD/CMC style): forward scores each embedding
against a positive and a few negative entries gathered from a buffer (`index_select` makes a
copy, which `bmm` saves), then, under `torch.no_grad()`, moves the positive entries toward
the new embeddings in place (`mul_`, `add_`), renormalizes them and writes them back with
`memory.index_copy_`. The thread asks whether the update may come before the scores; as
written (scores first) it is legal. An out-of-place rewrite must keep the update, keep the
buffer free of autograd history, and leave the gradients as they are.

Source: https://github.com/HobbitLong/RepDistiller/issues/37
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/HobbitLong/RepDistiller/issues/37"
CATEGORY = "buffers"


class ContrastMemory(nn.Module):
    def __init__(self, size: int = 8, dim: int = 4, negatives: int = 3,
                 momentum: float = 0.5, temperature: float = 0.1) -> None:
        super().__init__()
        self.negatives = negatives
        self.momentum = momentum
        self.temperature = temperature
        self.register_buffer("memory", F.normalize(torch.randn(size, dim), dim=1))

    def forward(self, v: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        size = self.memory.shape[0]
        offsets = torch.arange(self.negatives + 1, device=idx.device)
        candidates = (idx.unsqueeze(1) + offsets) % size  # column 0: the positive
        weight = torch.index_select(self.memory, 0, candidates.reshape(-1))
        weight = weight.view(v.shape[0], self.negatives + 1, -1)
        scores = torch.bmm(weight, v.unsqueeze(2)).squeeze(2) / self.temperature
        with torch.no_grad():
            pos = torch.index_select(self.memory, 0, idx)
            pos.mul_(self.momentum)
            pos.add_(v * (1 - self.momentum))
            pos = pos / pos.norm(dim=1, keepdim=True)
            self.memory.index_copy_(0, idx, pos)
        return scores


class Student(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(5, 4)
        self.memory = ContrastMemory()

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        v = F.normalize(self.embed(x), dim=1)
        scores = self.memory(v, idx)
        target = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        return F.cross_entropy(scores, target)


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Student(), (torch.randn(3, 5, generator=g), torch.tensor([1, 4, 6]))
