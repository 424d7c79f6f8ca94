"""Weights swapped inside ``torch.autocast``: autocast keeps the low-precision cast of each
parameter for the whole region, and a write through ``.data`` or under no_grad does not
reach it. check reports an error where a stale cast is read (naming autocast's weight
cache), lint a warning there; the fixes (one region per forward, ``cache_enabled=False``,
the weights put back before they are read again) get no error."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import fxquant
from fxquant.linter import FunctionalizeError


def _swap_data_copy(w: torch.Tensor, new: torch.Tensor) -> None:
    w.data.copy_(new)


def _swap_no_grad_copy(w: torch.Tensor, new: torch.Tensor) -> None:
    with torch.no_grad():
        w.copy_(new)


def _swap_data_assign(w: torch.Tensor, new: torch.Tensor) -> None:
    w.data = new.clone()


#: How the weights are swapped, and the line that writes.
SWAPS = {"data.copy_": (_swap_data_copy, 24), "no_grad copy_": (_swap_no_grad_copy, 29),
         "data =": (_swap_data_assign, 33)}
LAYERS = {"linear": lambda: nn.Linear(4, 3), "conv1d": lambda: nn.Conv1d(4, 3, 1)}
#: one region (stale), a region per forward, the cache off, the weights put back before
#: the next read, regions nested inside one that stays open (stale: the cache stays)
VARIANTS = ("one region", "region per forward", "cache off", "put back", "nested")


class _Swaps(nn.Module):
    """A KL penalty against reference weights swapped into the policy's own layer."""

    def __init__(self, layer: str, swap: str, variant: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.policy = LAYERS[layer]()
        self.register_buffer("ref", torch.randn_like(self.policy.weight) * 0.5)
        self.swap, self.variant, self.dtype = SWAPS[swap][0], variant, dtype

    def _region(self, **kwargs) -> contextlib.AbstractContextManager:
        return torch.autocast("cpu", dtype=self.dtype, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.policy.weight
        current = w.detach().clone()
        if self.variant == "region per forward":
            with self._region():
                logits = self.policy(x)
            self.swap(w, self.ref)
            with self._region(), torch.no_grad():
                ref_logits = self.policy(x)
            self.swap(w, current)
        elif self.variant == "nested":
            with self._region():
                with self._region():
                    logits = self.policy(x)
                self.swap(w, self.ref)
                with self._region(), torch.no_grad():
                    ref_logits = self.policy(x)
                self.swap(w, current)
        else:
            with self._region(cache_enabled=self.variant != "cache off"):
                logits = self.policy(x)
                self.swap(w, self.ref)
                if self.variant == "put back":
                    self.swap(w, current)
                with torch.no_grad():
                    ref_logits = self.policy(x)
                self.swap(w, current)
        logp = F.log_softmax(logits.float().flatten(1), dim=-1)
        ref_logp = F.log_softmax(ref_logits.float().flatten(1), dim=-1)
        return (logp.exp() * (logp - ref_logp)).sum(-1).mean()


def _inputs(layer: str, rows: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rows)
    return torch.randn(rows, 4, generator=g) if layer == "linear" \
        else torch.randn(rows, 4, 2, generator=g)


def test_the_stale_cast_is_an_error_naming_autocasts_weight_cache():
    model, x = _Swaps("linear", "data.copy_", "one region", torch.bfloat16), _inputs("linear", 5)
    check = fxquant.check(model, x)
    assert [(f.rule, f.line) for f in check.errors] == [("FXQ012", 24)]
    assert "weight cache" in check.errors[0].message
    assert "cache_enabled=False" in check.errors[0].hint
    lint = fxquant.lint(model, x)
    assert not lint.errors and ("FXQ017", 24) in [(f.rule, f.line) for f in lint.warnings]
    with pytest.raises(FunctionalizeError, match=r":24: .*weight cache"):
        fxquant.functionalize_inplace(model, x)


@pytest.mark.parametrize("variant", ["region per forward", "cache off", "put back"])
def test_the_fixes_get_no_error(variant):
    """The swaps change no value autograd saved (it saved the cast) and no stale cast is
    read: no error from lint or check, and the rewrite returns a model."""
    model, x = _Swaps("linear", "data.copy_", variant, torch.bfloat16), _inputs("linear", 5)
    for tool in (fxquant.lint, fxquant.check):
        report = tool(model, x)
        assert not report.errors and not report.by_rule("FXQ017")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert isinstance(fxquant.functionalize_inplace(model, x), nn.Module)


@settings(max_examples=30)
@given(layer=st.sampled_from(sorted(LAYERS)), swap=st.sampled_from(sorted(SWAPS)),
       variant=st.sampled_from(VARIANTS), dtype=st.sampled_from([torch.bfloat16, torch.float16]),
       rows=st.integers(1, 5))
def test_check_tells_the_stale_cast_from_the_fix(layer, swap, variant, dtype, rows):
    """An error (at the swap that made the cast stale) exactly where the reference forward
    reads autocast's kept cast of the policy's weights though they were swapped: one
    region, or regions nested in one left open; none for the fixes. Running the model as it
    is shows the bug: no KL penalty."""
    model, x = _Swaps(layer, swap, variant, dtype), _inputs(layer, rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check, lint = fxquant.check(model, x), fxquant.lint(model, x)
    stale = variant in ("one region", "nested")
    line = SWAPS[swap][1]
    assert [(f.rule, f.line) for f in check.errors] == ([("FXQ012", line)] if stale else [])
    assert [(f.rule, f.line) for f in lint.by_rule("FXQ017")] == ([("FXQ017", line)]
                                                                 if stale else [])
    assert not lint.errors
    with torch.no_grad():
        kl = float(model(x))
    # the reference forward computes with the policy's weights (no penalty) where the cast
    # is stale, and where the weights were put back before it, on purpose
    assert (kl == 0.0) == (stale or variant == "put back")
