"""Fix hints are code that means what the original line means: checked with ``ast``."""

from __future__ import annotations

import ast
import re

import pytest
import torch

import fxquant
from fxquant.linter.rules import hint_for_inplace, out_of_place, split_augmented, strip_comment

OPERATORS = ["+", "-", "*", "/", "//", "%", "**", "@", "&", "|", "^", "<<", ">>"]
VALUES = [
    "y",
    "2",
    "1.0 + torch.sum(m * x, dim=-1)",
    "a - b",
    "a * b",
    "a ** b",
    "-y",
    "~mask",
    "not flag",
    "a if c else b",
    "a < b",
    "a and b",
    "lambda t: t",
    "f(a, b)[0]",
    "self.scale",
    "w.T @ v",
    "(a + b)",
    "a | b",
    "a << 2",
    "x @ y",
    "2**e",
    "torch.sum(x, dim=-1) * 0.5",
]
TARGETS = ["out", "self.h", "x[idx]", "h[:, 0]"]


def _suggested(hint: str) -> str:
    """The assignment quoted in a hint (the last backticked `a = b`)."""
    quoted = [q for q in re.findall(r"`([^`]*)`", hint) if re.search(r"(?<![=!<>])=(?!=)", q)]
    return quoted[-1]


def _as_binop(target: str, op: str, value: str) -> str:
    """``ast.dump`` of what ``target op= value`` computes."""
    aug = ast.parse(f"{target} {op}= {value}").body[0]
    assert isinstance(aug, ast.AugAssign)
    left = ast.parse(target, mode="eval").body
    return ast.dump(ast.BinOp(left=left, op=aug.op, right=aug.value))


@pytest.mark.parametrize("op", OPERATORS)
@pytest.mark.parametrize("value", VALUES)
def test_augmented_hint_means_the_original(op, value):
    """For every augmented operator, the hint's right side parses to the same expression
    as `target op value`, the value of `target op= value`."""
    for target in TARGETS:
        code = f"{target} {op}= {value}  # the comment is not code"
        suggested = _suggested(hint_for_inplace(code))
        assign = ast.parse(suggested).body[0]
        assert isinstance(assign, ast.Assign), suggested
        assert ast.dump(assign.value) == _as_binop(target, op, value), suggested
        assert "#" not in suggested


def test_the_reported_hint_is_parenthesized():
    """The hint the lint gave for `out *= 1.0 + sum` computed (out * 1.0) + sum."""
    hint = hint_for_inplace("out *= 1.0 + torch.sum(m * x, dim=-1)")
    assert "`out = out * (1.0 + torch.sum(m * x, dim=-1))`" in hint


@pytest.mark.parametrize(("code", "expected"), [
    ("h += self.bias", "h = h + self.bias"),
    ("h += f(h)", "h = h + f(h)"),
    ("h *= 2", "h = h * 2"),
    ("h -= a - b", "h = h - (a - b)"),
    ("h **= -1", "h = h ** (-1)"),
])
def test_atoms_stay_bare_and_the_rest_is_parenthesized(code, expected):
    assert out_of_place(code) == expected


def test_comments_are_dropped_from_every_kind_of_hint():
    assert strip_comment("x += y  # exp saved x") == "x += y"
    assert strip_comment("s = '#' + t") == "s = '#' + t"
    assert "#" not in hint_for_inplace("h = F.relu(h, inplace=True)  # saves memory")
    assert "#" not in hint_for_inplace("y.clamp_(0, 1)  # clip")
    assert split_augmented("out += f(a,  # continues") == ("out", "+", "f(a,")


def test_lint_reports_the_parenthesized_hint():
    """End to end: the finding's hint for a `*=` after exp is the equivalent statement."""

    class Gate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x, m):
            out = torch.exp(self.lin(x))
            out *= 1.0 + torch.sum(m * x, dim=-1, keepdim=True)  # gate
            return out

    report = fxquant.lint(Gate(), torch.randn(2, 3), torch.randn(2, 3))
    (error,) = report.errors
    assert "`out = out * (1.0 + torch.sum(m * x, dim=-1, keepdim=True))`" in error.hint
