"""Custom autograd.Function backwards that write into the gradient they receive."""

from __future__ import annotations

import inspect

import pytest
import torch

import fxquant
from fxquant.linter.backward import gradient_writes
from fxquant.testing import assert_backward_safe
from tests.support.lint_models import AddOne, SharedGradient


def _line(obj, text):
    lines, start = inspect.getsourcelines(obj)
    return start + next(i for i, line in enumerate(lines) if text in line)


LINE = _line(AddOne.backward, "g += 1")


def test_the_write_is_read_from_the_source_through_an_alias():
    (write,) = gradient_writes(AddOne)
    assert (write.function, write.where.line, write.code) == ("AddOne", LINE, "g += 1")


def test_lint_warns_at_the_line_without_running_backward():
    report = fxquant.lint(SharedGradient(), torch.randn(2, 3))
    (warning,) = report.warnings
    assert (warning.rule, warning.line) == ("FXQ015", LINE) and not report.errors
    assert "`g = g + 1`" in warning.hint


def test_check_calls_it_an_error_where_a_shared_gradient_changes():
    """`y + other`: AddBackward hands one tensor to both branches; the other's gradient
    changes, and check compares with the gradients the forward implies."""
    (error,) = fxquant.check(SharedGradient(), torch.randn(2, 3)).errors
    assert (error.rule, error.line, error.node) == ("FXQ012", LINE, "AddOne")
    with pytest.raises(AssertionError, match="FXQ012"):
        assert_backward_safe(SharedGradient(), torch.randn(2, 3))


def test_check_warns_where_no_other_branch_shares_the_gradient():
    report = fxquant.check(SharedGradient(shared=False), torch.randn(2, 3))
    assert not report.errors
    assert [(f.rule, f.line) for f in report.warnings] == [("FXQ015", LINE)]


def test_the_protected_gradients_are_those_the_forward_implies():
    """What check compares against: AddOne is the identity, so the gradient of `b` is that
    of `head(a(x) + b(x))` written out of place."""
    model, x = SharedGradient(), torch.randn(2, 3)
    model(x).sum().backward()
    wrong = model.b.weight.grad.clone()
    model.zero_grad()
    model.head(model.a(x) + model.b(x)).sum().backward()
    assert not torch.allclose(wrong, model.b.weight.grad)
