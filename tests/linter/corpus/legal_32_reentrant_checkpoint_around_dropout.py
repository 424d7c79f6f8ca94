"""A transformer-style feed-forward block with dropout run under a reentrant activation
checkpoint (`checkpoint(block, h, use_reentrant=True)`). Backward re-runs the block, and the
checkpoint restores the RNG state it saved before the forward (`preserve_rng_state=True`, the
default), so the re-run draws the same dropout mask and the gradients are those of the forward
that ran. The thread asks whether checkpointing layers with non-zero dropout is safe; it is.
Must stay clean (no error from a tool that re-runs the forward, either).

Source: https://github.com/lucidrains/enformer-pytorch/issues/33
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/lucidrains/enformer-pytorch/issues/33"
CATEGORY = "checkpoint"


class CheckpointedFeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(4, 8)
        self.block = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(0.5), nn.Linear(16, 8))
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = h + checkpoint(self.block, h, use_reentrant=True)
        return self.head(h)


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return CheckpointedFeedForward(), (torch.randn(6, 4, generator=g),)
