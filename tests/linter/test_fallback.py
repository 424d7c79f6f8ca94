"""fxquant's own failures are never reported as errors of the model: where its recording
fails on a forward that runs without it, it checks again with fewer instruments and says
what it could not check; an error inside its analysis is a note, not an exception."""

from __future__ import annotations

import pytest
import torch

import fxquant
from fxquant.linter import recorder, torch_modes
from tests.support.lint_models import NoHooksBlock, Raises

TOOLS = [fxquant.lint, fxquant.check]


def _note(report):
    (note,) = [f for f in report.findings if f.rule == "FXQ010" and f.node == "instruments"]
    return note


@pytest.mark.parametrize("tool", TOOLS, ids=["lint", "check"])
def test_a_forward_that_refuses_saved_tensor_hooks(tool):
    """disable_saved_tensors_hooks raises under fxquant's hooks: no FXQ009, a note naming
    what was lost (which op saved what); the in-place-safe model has no error."""
    report = tool(NoHooksBlock(), torch.randn(2, 3))
    assert not report.errors
    note = _note(report)
    assert "no hooks in this block" in note.message and "not an error in the model" in note.message
    assert "which op saved which tensor" in note.message


def test_shapes_lint_falls_back_too():
    report = fxquant.lint(NoHooksBlock(), fxquant.ShapeSpec((2, 3)))
    assert not report.errors and _note(report)


@pytest.mark.parametrize("tool", TOOLS, ids=["lint", "check"])
def test_a_failing_instrument_is_dropped(monkeypatch, tool):
    """The dispatch mode itself fails (as fxquant's instruments did on some models): the
    forward is checked with the function mode alone, and the note says what that costs."""

    def broken(self, func, types, args=(), kwargs=None):
        raise RuntimeError("an instrument of fxquant failed")

    monkeypatch.setattr(torch_modes.DispatchMode, "__torch_dispatch__", broken)
    report = tool(torch.nn.Linear(3, 3), torch.randn(2, 3))
    assert not report.errors
    note = _note(report)
    assert "an instrument of fxquant failed" in note.message and "ATen ops" in note.message


@pytest.mark.parametrize("tool", TOOLS, ids=["lint", "check"])
def test_an_error_in_the_analysis_is_a_note(monkeypatch, tool):
    def broken(self, out):
        raise TypeError("analysis bug")

    monkeypatch.setattr(recorder.Recorder, "report_zero_grad", broken)
    report = tool(torch.nn.Linear(3, 3), torch.randn(2, 3))
    assert not report.errors
    (note,) = report.findings
    assert note.rule == "FXQ010" and note.node in ("fxquant", "instruments")
    assert "analysis bug" in note.message and "not an error in the model" in note.message


@pytest.mark.parametrize("tool", TOOLS, ids=["lint", "check"])
def test_a_forward_that_really_raises_is_still_an_error(tool):
    """The rule covers models whose plain run works: this one's forward raises plainly."""
    assert "FXQ009" in [f.rule for f in tool(Raises(), torch.randn(2, 4)).errors]


def test_detach_then_copy_into_a_buffer_is_legal():
    """A buffer detached in place and refilled from a value that requires grad, in a loop:
    autograd records the copy, so it is not a hidden write (and nothing asserts)."""

    class Loop(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mu = torch.nn.Parameter(torch.ones(3))
            self.register_buffer("x", torch.zeros(3))

        def forward(self, inp):
            loss = torch.zeros(())
            for _ in range(3):
                self.x.detach_()
                self.x.copy_(torch.exp(self.mu * inp))
                loss = loss + (self.x * 2).sum()
            return loss

    for tool in TOOLS:
        assert tool(Loop(), torch.rand(3)).findings == []
