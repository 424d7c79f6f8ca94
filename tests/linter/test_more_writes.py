"""Writes the recording follows beyond plain in-place calls: a reentrant checkpoint's saved
inputs, ``detach_()`` of saved values, RReLU's noise; legal and buggy variants."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import fxquant


def _errors(report):
    return [(f.rule, f.line) for f in report.errors]


class WriteAfterCheckpoint(nn.Module):
    """A reentrant checkpoint saves its inputs; writing one after the call breaks backward,
    though nothing inside the segment saved it."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(4, 4)

    def forward(self, x):
        h = self.stem(x)
        y = checkpoint(lambda t: torch.tanh(t * 2.0), h, use_reentrant=True)
        h += 1  # the write
        return y + h


def test_a_write_into_what_a_reentrant_checkpoint_saved_is_named():
    line = WriteAfterCheckpoint.forward.__code__.co_firstlineno + 3
    x = torch.randn(3, 4)
    assert _errors(fxquant.lint(WriteAfterCheckpoint(), x)) == [("FXQ001", line)]
    assert _errors(fxquant.check(WriteAfterCheckpoint(), x)) == [("FXQ001", line)]


class DetachSavedOutput(nn.Module):
    """``detach_()`` of an op's saved *output* is legal (autograd re-attaches it to its own
    node); of a saved *input* it is not."""

    def __init__(self, saved_input):
        super().__init__()
        self.lin, self.w = nn.Linear(4, 4), nn.Parameter(torch.rand(4))
        self.saved_input = saved_input

    def forward(self, x):
        if self.saved_input:
            weight = self.w * 1.0
            out = (weight * self.lin(x)).sum()
            weight.detach_()
            return out
        act = torch.tanh(self.lin(x))  # tanh saves its output
        out = act.sum()
        act.detach_()
        return out


def test_detach_in_place_is_an_error_for_saved_inputs_only():
    x = torch.randn(3, 4)
    assert not fxquant.check(DetachSavedOutput(saved_input=False), x).errors
    assert not fxquant.lint(DetachSavedOutput(saved_input=False), x).errors
    assert [f.rule for f in fxquant.lint(DetachSavedOutput(saved_input=True), x).errors] == \
        ["FXQ001"]


def test_rrelu_in_place_in_training_is_legal():
    """RReLU writes its noise tensor without a version bump, on purpose: no error."""
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.RReLU(inplace=True),
                          nn.Linear(4, 2)).train()
    assert not [f for f in fxquant.lint(model, torch.randn(8, 4)).errors if f.rule == "FXQ001"]
