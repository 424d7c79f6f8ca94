"""Reentrant ``torch.utils.checkpoint`` segments around dropout: legal where the segment
keeps the RNG state (the default), so backward re-draws the forward's masks; no false
error from check, which re-runs the forward. Without the RNG state the gradients belong
to other masks: an error at the checkpoint's line."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import fxquant


class _Checkpointed(nn.Module):
    def __init__(self, p: float, how: str, segments: int, outside: bool, keep_rng: bool) -> None:
        super().__init__()
        self.p, self.how, self.segments, self.outside = p, how, segments, outside
        self.keep_rng = keep_rng
        self.stem = nn.Linear(4, 8)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(p), nn.Linear(16, 8))
            for _ in range(segments))
        self.head = nn.Linear(8, 1)

    def _functional(self, h: torch.Tensor) -> torch.Tensor:
        return F.dropout(torch.tanh(h), self.p, self.training) * 2

    def forward(self, x):
        h = self.stem(x)
        if self.outside:
            h = F.dropout(h, self.p, self.training)
        for block in self.blocks:
            if self.how == "module":
                h = h + checkpoint(block, h, use_reentrant=True,
                                   preserve_rng_state=self.keep_rng)  # CHECKPOINT
            elif self.how == "function":
                h = checkpoint(self._functional, h, use_reentrant=True,
                               preserve_rng_state=self.keep_rng)
            else:
                h = checkpoint_sequential(block, 2, h, use_reentrant=True,
                                          preserve_rng_state=self.keep_rng)
        if self.outside:
            h = F.dropout(h, self.p, self.training)
        return self.head(h)


@settings(max_examples=25)
@given(p=st.sampled_from([0.1, 0.5, 0.9]), how=st.sampled_from(["module", "function",
                                                                 "sequential"]),
       segments=st.integers(1, 2), outside=st.booleans(), rows=st.integers(1, 6))
def test_checkpointed_dropout_that_keeps_the_rng_state_is_clean(p, how, segments, outside,
                                                                 rows):
    """Wherever the dropout is (a module, a function, a sequential segment, also before and
    after the checkpoint), however many segments: no error from lint or check."""
    torch.manual_seed(0)
    model = _Checkpointed(p, how, segments, outside, keep_rng=True)
    x = torch.randn(rows, 4, generator=torch.Generator().manual_seed(rows))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lint, check = fxquant.lint(model, x), fxquant.check(model, x)
    assert not lint.errors and not check.errors, (lint.errors, check.errors)


def test_checkpointed_dropout_without_the_rng_state_is_an_error_at_the_checkpoint():
    torch.manual_seed(0)
    model = _Checkpointed(0.5, "module", 1, False, keep_rng=False)
    report = fxquant.check(model, torch.randn(6, 4))
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1)
                if text.endswith("# CHECKPOINT"))
    assert [(f.rule, f.line) for f in report.errors] == [("FXQ012", line - 1)]
    assert "preserve_rng_state=False" in report.errors[0].message
