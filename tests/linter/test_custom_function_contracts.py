"""Custom ``autograd.Function`` contracts: the views a Function returns must not be changed
(under no_grad the write goes through and the next read raises: named at the write), and an
input its forward writes in place needs ``ctx.mark_dirty`` (a warning; an error where the
input is read again and the gradients are wrong)."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import fxquant
from fxquant.linter import FunctionalizeError

# -- the views a custom Function returns ---------------------------------------------------


class _ViewOfIntermediate(torch.autograd.Function):
    """Round on a detached copy, return a flat view of it (straight-through backward)."""

    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        return torch.round(x.detach() * 4).div(4).view(x.shape[0], -1)

    @staticmethod
    def backward(ctx, g):
        return g.reshape(ctx.shape)


class _ViewOfInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        return x.view(x.shape[0], -1)

    @staticmethod
    def backward(ctx, g):
        return g.reshape(ctx.shape)


class _InputAsIs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        return x

    @staticmethod
    def backward(ctx, g):
        return g


#: Writes into a view, each on a line of its own (the line a finding must name).
VIEW_WRITES = {
    "slice": lambda q: q.__setitem__((slice(None), slice(-1, None)), 0.0),
    "clamp_": lambda q: q.clamp_(-0.5, 0.5),
    "mul_": lambda q: q.mul_(2),
    "zero_": lambda q: q.zero_(),
    "fill_": lambda q: q.fill_(1.0),
    "copy_": lambda q: q.copy_(torch.ones_like(q)),
}
FUNCTIONS = {"view of its intermediate": _ViewOfIntermediate, "view of its input": _ViewOfInput,
             "input as it is": _InputAsIs}


class _WritesView(nn.Module):
    def __init__(self, function, write, features: int, read: bool) -> None:
        super().__init__()
        self.function, self.write, self.read = function, write, read
        self.proj = nn.Linear(features, features)
        self.head = nn.Linear(features, 2)

    def forward(self, x):
        q = self.function.apply(self.proj(x))
        with torch.no_grad():
            self.write(q)
        return self.head(torch.tanh(q)) if self.read else q  # (returned: the loss reads it)


def _line(fn) -> int:
    return fn.__code__.co_firstlineno


@pytest.mark.parametrize("tool", ["lint", "check"])
def test_a_no_grad_write_into_a_custom_function_view_is_named_at_the_write(tool):
    """torch raises at the next use of the view; lint and check name the write (FXQ013)."""
    model = _WritesView(_ViewOfIntermediate, VIEW_WRITES["slice"], 4, read=True)
    report = getattr(fxquant, tool)(model, torch.randn(3, 4))
    assert [(f.rule, f.line) for f in report.errors] == [("FXQ013", _line(VIEW_WRITES["slice"]))]
    (error,) = report.errors
    assert "_ViewOfIntermediate" in error.message and ".clone()" in error.hint
    assert not report.by_rule("FXQ009") and not report.by_rule("FXQ008")


def test_functionalize_refuses_a_no_grad_write_into_a_custom_function_view_naming_it():
    model = _WritesView(_ViewOfInput, VIEW_WRITES["clamp_"], 4, read=True)
    with pytest.raises(FunctionalizeError, match=rf":{_line(VIEW_WRITES['clamp_'])}: .*custom "
                                                 r"Function.*clone"):
        fxquant.functionalize_inplace(model, torch.randn(3, 4))


def test_the_cloned_view_written_with_autograd_on_is_clean():
    """The fix torch's error message gives: clone the Function's output, write into it."""

    class Cloned(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj, self.head = nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x):
            q = _ViewOfIntermediate.apply(self.proj(x)).clone()
            q[:, -1:] = 0
            return self.head(q)

    for tool in (fxquant.lint, fxquant.check):
        assert not tool(Cloned(), torch.randn(3, 4)).errors


@settings(max_examples=25)
@given(function=st.sampled_from(sorted(FUNCTIONS)), write=st.sampled_from(sorted(VIEW_WRITES)),
       rows=st.integers(1, 4), features=st.integers(2, 5), read=st.booleans(),
       tool=st.sampled_from(["lint", "check"]))
def test_every_no_grad_write_into_a_custom_function_output_is_named_there(
        function, write, rows, features, read, tool):
    """Whichever view (of an intermediate, of the input, the input as it is), whichever
    write and shape, read in forward or returned: exactly one error, FXQ013 at the write."""
    model = _WritesView(FUNCTIONS[function], VIEW_WRITES[write], features, read)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = getattr(fxquant, tool)(model, torch.randn(rows, features))
    assert [(f.rule, f.line) for f in report.errors] == [("FXQ013", _line(VIEW_WRITES[write]))]


# -- inputs written without ctx.mark_dirty -------------------------------------------------

#: In-place writes a Function's forward makes into its input ``x`` (with a parameter ``b``),
#: each on a line of its own, and the gradient it means for ``x`` (its backward's factor).
INPUT_WRITES = {
    "add_": (lambda x, b: x.add_(b), 1.0),
    "mul_": (lambda x, b: x.mul_(2.0), 2.0),
    "setitem": (lambda x, b: x.__setitem__((slice(None), 0), b[0]), 1.0),
    "copy_": (lambda x, b: x.copy_(x * 3.0), 3.0),
    "sub_": (lambda x, b: x.sub_(b), 1.0),
}


def _function(write: str, mark: bool) -> type:
    fn, factor = INPUT_WRITES[write]

    class Writes(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, b):
            fn(x, b)
            if mark:
                ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g * factor, g.sum(0)

    return Writes


class _WritesInput(nn.Module):
    def __init__(self, function: type, features: int, reuse: bool) -> None:
        super().__init__()
        self.function, self.reuse = function, reuse
        self.lin = nn.Linear(features, features, bias=False)
        self.bias = nn.Parameter(torch.linspace(-0.3, 0.3, features))
        self.out = nn.Linear(features, 1)

    def forward(self, x):
        h = self.lin(x)
        y = self.function.apply(h, self.bias)
        return self.out(torch.tanh(y) + 2 * h) if self.reuse else self.out(torch.tanh(y))


def test_an_input_written_without_mark_dirty_is_a_warning_naming_it():
    """Gradients right by luck (the input is not read again): a warning, never an error;
    functionalize_inplace returns the model with the same warning."""
    model, x = _WritesInput(_function("add_", mark=False), 3, reuse=False), torch.randn(4, 3)
    line = _line(INPUT_WRITES["add_"][0])
    for tool in (fxquant.lint, fxquant.check):
        report = tool(model, x)
        assert not report.errors
        assert [(f.rule, f.line) for f in report.warnings] == [("FXQ018", line)]
        assert "ctx.mark_dirty" in report.warnings[0].message
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        returned = fxquant.functionalize_inplace(model, x)
    assert isinstance(returned, nn.Module)
    assert any(f":{line}: " in str(w.message) and "ctx.mark_dirty" in str(w.message)
               for w in caught)


def test_an_input_written_without_mark_dirty_and_read_again_is_an_error():
    """The skip path reads the overwritten input: its gradient goes past the Function, so
    the gradients are wrong: check's FXQ012 at the write; functionalize_inplace refuses."""
    model, x = _WritesInput(_function("add_", mark=False), 3, reuse=True), torch.randn(4, 3)
    line = _line(INPUT_WRITES["add_"][0])
    report = fxquant.check(model, x)
    assert [(f.rule, f.line) for f in report.errors] == [("FXQ012", line)]
    assert "mark_dirty" in report.errors[0].hint
    assert ("FXQ018", line) in [(f.rule, f.line) for f in fxquant.lint(model, x).warnings]
    with pytest.raises(FunctionalizeError, match=rf":{line}: .*mark_dirty"):
        fxquant.functionalize_inplace(model, x)


def _grads(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model(x).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@settings(max_examples=25)
@given(write=st.sampled_from(sorted(INPUT_WRITES)), mark=st.booleans(), reuse=st.booleans(),
       rows=st.integers(1, 4), features=st.integers(1, 4))
def test_inputs_written_in_a_custom_forward(write, mark, reuse, rows, features):
    """With mark_dirty: clean. Without: FXQ018 at the write; an FXQ012 error there exactly
    where the input is read again and the gradients differ from the marked Function's."""
    torch.manual_seed(0)
    model = _WritesInput(_function(write, mark), features, reuse)
    x = torch.randn(rows, features)
    line = _line(INPUT_WRITES[write][0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lint, check = fxquant.lint(model, x), fxquant.check(model, x)
    assert not lint.errors
    if mark:
        assert not check.findings and not lint.findings
        return
    assert ("FXQ018", line) in [(f.rule, f.line) for f in lint.warnings]
    marked = _WritesInput(_function(write, True), features, reuse)
    marked.load_state_dict(model.state_dict())
    wrong = any(not torch.allclose(a, b, atol=1e-6)
                for a, b in zip(_grads(model, x).values(), _grads(marked, x).values(),
                                strict=True))
    assert [(f.rule, f.line) for f in check.errors] == ([("FXQ012", line)] if wrong else [])
    assert wrong <= reuse  # (not read again: the gradients are right)
