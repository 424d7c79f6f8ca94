"""Silent corruption that no instrument sees (a write through a NumPy view of a saved
tensor): check names the line that wrote, else the op and line that saved the value, and
never talks about `.data` when there is none."""

from __future__ import annotations

import contextlib
import inspect

import torch

import fxquant
import fxquant.linter.checking as checking
from fxquant.linter.locate import first_line_after
from tests.support import lint_models
from tests.support.lint_models import NumpyGate


def _line(obj, text):
    lines, start = inspect.getsourcelines(obj)
    return start + next(i for i, line in enumerate(lines) if text in line)


def test_check_names_the_numpy_write_in_a_helper():
    report = fxquant.check(NumpyGate(), torch.randn(4, 3))
    (error,) = report.errors
    assert (error.rule, error.line) == ("FXQ012", _line(lint_models.numpy_threshold, "arr[arr < 0.5]"))
    assert error.related == "sigmoid"
    assert error.related_location.line == _line(NumpyGate, "torch.sigmoid(self.lin(x))")
    assert ".data" not in error.hint and ".data" not in error.message
    assert "copy" in error.hint


def test_without_the_line_the_saving_op_is_named(monkeypatch):
    """Where the watched run finds no line (the write ran outside the user's Python), the
    finding names the op that saved the changed value, at its line."""

    @contextlib.contextmanager
    def finds_nothing(happened):
        yield []

    monkeypatch.setattr(checking, "first_line_after", finds_nothing)
    (error,) = fxquant.check(NumpyGate(), torch.randn(4, 3)).errors
    assert error.rule == "FXQ012" and error.node == "sigmoid"
    assert error.line == _line(NumpyGate, "torch.sigmoid(self.lin(x))")
    assert "no instrument sees" in error.message and ".data" not in error.hint


def test_the_numpy_write_is_not_there_when_the_helper_copies():
    """The same gate writing into a copy of the array: nothing to report."""

    class CopyGate(NumpyGate):
        def forward(self, x):
            y = torch.sigmoid(self.lin(x))
            arr = y.detach().numpy().copy()
            arr[arr < 0.5] = 0.0
            return self.out(y * torch.from_numpy(arr))

    assert not fxquant.check(CopyGate(), torch.randn(4, 3)).errors


def test_first_line_after_puts_the_previous_tracer_back():
    import sys

    def tracer(frame, event, arg):
        return None

    before = sys.gettrace()
    sys.settrace(tracer)
    try:
        t = torch.zeros(2)
        with first_line_after(lambda: bool(t[0] == 1)) as found:
            t.numpy()[0] = 1.0
        assert sys.gettrace() is tracer and found == []  # the block's own frame is not traced
    finally:
        sys.settrace(before)
