"""The same checkpointed dropout block with `preserve_rng_state=False` (set for speed): the
re-run in backward draws a fresh dropout mask, so the gradients belong to another sample than
the forward's output and loss. Nothing raises. The PR's author: "if preserve_rng_state=False,
the dropout will definitely not work, because gradient flows into wrong input cells".

Source: https://github.com/ankanbhunia/PIDM/pull/66
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

KIND = "silent"
FIXABLE = False
SOURCE = "https://github.com/ankanbhunia/PIDM/pull/66"
CATEGORY = "checkpoint"


class CheckpointedFeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(4, 8)
        self.block = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(0.5), nn.Linear(16, 8))
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = h + checkpoint(self.block, h, use_reentrant=True, preserve_rng_state=False)  # CULPRIT
        return self.head(h)


def make() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return CheckpointedFeedForward(), (torch.randn(6, 4, generator=g),)


def fixed_by_hand() -> nn.Module:
    """The fix: keep the RNG state (the default)."""
    model, _ = make()

    def forward(x: torch.Tensor) -> torch.Tensor:
        h = model.stem(x)
        h = h + checkpoint(model.block, h, use_reentrant=True)
        return model.head(h)

    model.forward = forward
    return model
