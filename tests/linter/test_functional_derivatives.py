"""In-place writes inside a function given to ``torch.autograd.functional`` (vjp, jvp,
jacobian, hessian, vhp, hvp) into its argument: the derivative is then taken with respect
to the tensor the write produced. Lint warns at the write (FXQ016); check takes the
derivative as the function is written and reports an error there (FXQ012) exactly where
the results change."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.autograd.functional as AF
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import fxquant
from fxquant.linter import FunctionalizeError
from fxquant.linter.checking import protected_run
from fxquant.linter.report import LintReport

#: Writes into the argument ``z`` (each on a line of its own) and the same, out of place.
WRITES = {
    "sin_": (lambda z: z.sin_(), lambda z: z.sin()),
    "mul_": (lambda z: z.mul_(2.0), lambda z: z * 2.0),
    "pin": (lambda z: z.__setitem__(slice(0, 1), 0.5),
            lambda z: torch.cat([z.new_full((1,), 0.5), z[1:]])),
    "exp_": (lambda z: z.exp_(), lambda z: z.exp()),
    "add_": (lambda z: z.add_(1.0), lambda z: z + 1.0),  # (a shift: the derivative is the same)
}
SCALAR = ("hessian", "hvp", "vhp")  # (functions of a scalar output)
APIS = ("vjp", "jvp", "jacobian", "hessian", "hvp", "vhp")


class _Differentiates(nn.Module):
    def __init__(self, api: str, write: str, fixed: bool, n: int) -> None:
        super().__init__()
        self.api, self.fixed = api, fixed
        self.write = WRITES[write][1 if fixed else 0]
        self.enc, self.head = nn.Linear(n, n), nn.Linear(n, 1)

    def f(self, z: torch.Tensor) -> torch.Tensor:
        if self.fixed:
            z = self.write(z)
        else:
            self.write(z)
        return (z ** 3).sum() if self.api in SCALAR else z.sin()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.enc(x)
        v = torch.ones_like(h)
        if self.api == "jacobian":
            r = AF.jacobian(self.f, h, create_graph=True).sum(0)
        elif self.api == "hessian":
            r = AF.hessian(self.f, h, create_graph=True).sum(0)
        else:
            r = getattr(AF, self.api)(self.f, h, v, create_graph=True)[1]
        return self.head(r)


def _line(write: str) -> int:
    return WRITES[write][0].__code__.co_firstlineno


def _grads(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor | None]:
    model.zero_grad()
    model(x).sum().backward()
    return {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


def _same(a: dict, b: dict) -> bool:
    """The same gradients (None, no gradient at all, as zeros)."""
    def value(grads: dict, name: str, like: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(like) if grads[name] is None else grads[name]

    return all((a[n] is None and b[n] is None) or torch.allclose(
        value(a, n, b[n] if a[n] is None else a[n]), value(b, n, a[n] if b[n] is None else b[n]),
        atol=1e-5) for n in a)


def _pair(api: str, write: str, n: int) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    model = _Differentiates(api, write, False, n)
    fixed = _Differentiates(api, write, True, n)
    fixed.load_state_dict(model.state_dict())
    return model, fixed


def test_vjp_of_a_function_writing_its_argument_is_an_error_at_the_write():
    model, _ = _pair("vjp", "sin_", 3)
    x = torch.randn(3)
    lint, check = fxquant.lint(model, x), fxquant.check(model, x)
    assert [(f.rule, f.line) for f in lint.findings] == [("FXQ016", _line("sin_"))]
    assert [(f.rule, f.line) for f in check.errors] == [("FXQ012", _line("sin_"))]
    assert "torch.autograd.functional.vjp" in check.errors[0].message


def test_a_write_that_leaves_the_derivative_alone_is_only_a_warning():
    """`z += 1` before `sin`: the derivative with respect to the written tensor is the one
    meant; check tells (a warning, no error)."""
    model, _ = _pair("vjp", "add_", 3)
    check = fxquant.check(model, torch.randn(3))
    assert not check.errors
    assert [(f.rule, f.line) for f in check.warnings] == [("FXQ016", _line("add_"))]


def test_functionalize_refuses_for_that_reason():
    """Not 'the original forward raises even with autograd off': it does not."""
    model, _ = _pair("jacobian", "pin", 3)
    with pytest.raises(FunctionalizeError) as raised:
        fxquant.functionalize_inplace(model, torch.randn(3))
    message = str(raised.value)
    assert f":{_line('pin')}: " in message and "torch.autograd.functional" in message
    assert "raises even with autograd off" not in message


def test_a_function_writing_only_its_own_values_is_clean():
    class Own(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc, self.head = nn.Linear(3, 3), nn.Linear(3, 1)

        @staticmethod
        def f(z):
            y = 2 * z
            y += 1
            return torch.sin(y)

        def forward(self, x):
            h = self.enc(x)
            return self.head(AF.vjp(self.f, h, torch.ones_like(h), create_graph=True)[1])

    for tool in (fxquant.lint, fxquant.check):
        assert not tool(Own(), torch.randn(2, 3)).findings


@settings(max_examples=30)
@given(api=st.sampled_from(APIS), write=st.sampled_from(sorted(WRITES)), n=st.integers(1, 4))
def test_check_takes_the_derivative_the_function_means(api, write, n):
    """For every api, write and size: lint warns at the write; check's own backward gives the
    gradients of the function written out of place, and it reports an error at the write
    exactly where the real gradients differ from those (else the warning)."""
    model, fixed = _pair(api, write, n)
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lint = fxquant.lint(model, x)
        check = fxquant.check(model, x)
        run = protected_run(model, (x,), lambda out: out.sum(), torch.get_rng_state(),
                            LintReport(mode="check"))
        want = _grads(fixed, x)
        wrong = not _same(_grads(model, x), want)
    assert ("FXQ016", _line(write)) in [(f.rule, f.line) for f in lint.warnings]
    assert not lint.errors
    assert run.grads is not None and _same(run.grads, want)
    found = [(f.rule, f.line) for f in check.findings if f.rule in ("FXQ012", "FXQ016")]
    assert found == ([("FXQ012", _line(write))] if wrong else [("FXQ016", _line(write))])
    assert not [f for f in check.errors if f.line != _line(write)]
    assert wrong or write == "add_"  # (a shift can leave the derivative as it is)
