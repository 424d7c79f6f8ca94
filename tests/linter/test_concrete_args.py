"""``concrete_args``, forward arguments fixed by name, mean the same in lint, check and
functionalize_inplace: with example inputs, the forward runs with them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fxquant
from fxquant.errors import FxquantTypeError


class _Branches(nn.Module):
    """Breaks backward only on the branch ``twice=True`` takes."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x, scale=1.0, twice=False):
        y = torch.sigmoid(self.lin(x) * scale)
        if twice:
            y *= 2  # sigmoid saved y
        return y


BROKEN_LINE = _Branches.forward.__code__.co_firstlineno + 3
TOOLS = {
    "lint": lambda m, *a, **k: fxquant.lint(m, *a, **k),
    "check": lambda m, *a, **k: fxquant.check(m, *a, **k),
}


@pytest.mark.parametrize("tool", sorted(TOOLS))
@pytest.mark.parametrize(("inputs", "fixed", "broken"), [
    ((), None, False),
    ((), {"twice": True}, True),
    ((), {"twice": False, "scale": 3.0}, False),
    ((2.0,), {"twice": True}, True),
    ((2.0, True), None, True),
])
def test_the_forward_runs_with_the_arguments_fixed(tool, inputs, fixed, broken):
    """The branch the fixed arguments take is the one linted and checked."""
    report = TOOLS[tool](_Branches(), torch.randn(2, 3), *inputs, concrete_args=fixed)
    assert [(f.rule, f.line) for f in report.errors] == (
        [("FXQ001", BROKEN_LINE)] if broken else [])


def test_functionalize_inplace_runs_and_traces_with_them():
    model, x = _Branches(), torch.randn(2, 3)
    gm = fxquant.functionalize_inplace(model, x, concrete_args={"twice": True})
    assert torch.allclose(gm(x, 1.0, True), torch.sigmoid(model.lin(x)) * 2)
    gm(x, 1.0, True).sum().backward()


@pytest.mark.parametrize("tool", ["lint", "check", "functionalize_inplace"])
@pytest.mark.parametrize(("inputs", "fixed", "says"), [
    ((), {"thrice": True}, "thrice"),
    ((2.0,), {"scale": 3.0}, "multiple values for argument 'scale'"),
    ((), [("twice", True)], "must be a dict"),
])
def test_arguments_that_do_not_fit_are_refused_by_name(tool, inputs, fixed, says):
    with pytest.raises(FxquantTypeError, match=says):
        getattr(fxquant, tool)(_Branches(), torch.randn(2, 3), *inputs, concrete_args=fixed)
