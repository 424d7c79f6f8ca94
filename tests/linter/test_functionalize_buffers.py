"""functionalize_inplace keeps module state: counters, EMAs read after their update,
buffers the forward never touches, persistence; buffers updated under no_grad hold no
autograd history, so training takes step after step; and the model it is given is
unchanged."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.fx import GraphModule

import fxquant
from fxquant.linter.functionalize.diagnose import reference
from fxquant.linter.functionalize.verify import verify
from tests.support.lint_models import CountsAndBreaks


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_state_comes_back_and_loads_both_ways():
    model, x = CountsAndBreaks(), torch.randn(4, 3)
    before = _state(model)
    gm = fxquant.functionalize_inplace(model, x)
    assert isinstance(gm, GraphModule)
    assert set(gm.state_dict()) == set(model.state_dict())
    assert "scratch" not in gm.state_dict() and "version" in gm.state_dict()
    CountsAndBreaks().load_state_dict(gm.state_dict())
    gm.load_state_dict(model.state_dict())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert int(model.n) == 0


def test_one_forward_updates_the_same_buffers_the_same_way():
    model, x = CountsAndBreaks(), torch.randn(4, 3)
    gm = fxquant.functionalize_inplace(model, x)
    reference = CountsAndBreaks()
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        gm(x)
        reference(x)
    got = dict(gm.named_buffers())
    for name, want in reference.named_buffers():
        assert torch.allclose(got[name].double(), want.double()), name
    assert int(gm.n) == 1


def test_the_ema_read_after_its_update_passes_no_gradient():
    """`with torch.no_grad(): self.ema += ...` then `exp(h - self.ema)`: tracing does not
    record no_grad; the rewrite detaches what the original computed without autograd."""
    model, x = CountsAndBreaks(), torch.randn(4, 3)
    gm = fxquant.functionalize_inplace(model, x)
    w = torch.randn(4, 3)
    (gm(x) * w).sum().backward()
    h = model.lin(x)
    ema = (0.5 * h.mean(0)).detach()
    (torch.exp(h - ema) * w).sum().backward()
    assert torch.allclose(gm.lin.weight.grad, model.lin.weight.grad, atol=1e-6)


# -- buffers written under no_grad: no autograd history, and training takes many steps ----

#: How the forward updates its buffer under no_grad, from ``m`` (computed with autograd on).
UPDATES = {
    "copy_": lambda state, m, idx: state.copy_(m),
    "ema": lambda state, m, idx: state.mul_(0.9).add_(0.1 * m),
    "index_copy_": lambda state, m, idx: state.index_copy_(0, idx, m[idx]),
    "setitem": lambda state, m, idx: state.__setitem__(idx, m[idx]),
}


class _Tracks(nn.Module):
    """Reads a running state (before or after updating it under no_grad) in its output."""

    def __init__(self, update: str, read_after: bool, source_inside: bool, n: int) -> None:
        super().__init__()
        self.update, self.read_after, self.source_inside = update, read_after, source_inside
        self.lin = nn.Linear(n, n)
        self.register_buffer("state", torch.zeros(n))

    def forward(self, x):
        y = self.lin(x)
        out = y * (1 + self.state) if not self.read_after else y
        m = y.mean(0)
        idx = torch.arange(0, m.shape[0], 2, device=m.device)
        with torch.no_grad():
            UPDATES[self.update](self.state, y.mean(0) if self.source_inside else m, idx)
        return out * (1 + self.state) if self.read_after else out


def test_a_buffer_copied_into_under_no_grad_carries_no_history():
    """The rewrite's buffer holds no autograd history, so training runs step after step
    (it raised 'backward through the graph a second time' on the first step of the user's)."""
    model, x = _Tracks("copy_", read_after=False, source_inside=False, n=3), torch.randn(4, 3)
    gm = fxquant.functionalize_inplace(model, x)
    for _ in range(3):
        gm(x).sum().backward()
        assert not gm.state.requires_grad and gm.state.grad_fn is None


@settings(max_examples=25)
@given(update=st.sampled_from(sorted(UPDATES)), read_after=st.booleans(),
       source_inside=st.booleans(), n=st.integers(1, 4), steps=st.integers(2, 3))
def test_buffers_updated_under_no_grad_train_as_the_original(update, read_after, source_inside,
                                                             n, steps):
    """Step after step, the rewrite's outputs, gradients and buffers are the original's,
    and its buffers never hold autograd history."""
    torch.manual_seed(0)
    model, x = _Tracks(update, read_after, source_inside, n), torch.randn(3, n)
    gm = fxquant.functionalize_inplace(model, x)
    original = copy.deepcopy(model)
    for _ in range(steps):
        for m in (gm, original):
            m.zero_grad()
            m(x).sum().backward()
        assert gm.state.grad_fn is None and not gm.state.requires_grad
        assert torch.allclose(gm.state, original.state)
        for name, p in original.named_parameters():
            assert torch.allclose(gm.get_parameter(name).grad, p.grad, atol=1e-6), name


def test_verify_refuses_a_candidate_whose_buffer_carries_history():
    """A rewrite that lets autograd record the buffer's update is never returned, although
    its first forward and backward match."""

    class RecordsTheUpdate(nn.Module):
        def __init__(self, original: nn.Module) -> None:
            super().__init__()
            self.lin = copy.deepcopy(original.lin)
            self.register_buffer("state", original.state.clone())

        def forward(self, x):
            y = self.lin(x)
            out = y * (1 + self.state)
            self.state.copy_(y.mean(0))  # (autograd on: the buffer gets the step's graph)
            return out

    model, x = _Tracks("copy_", read_after=False, source_inside=False, n=3), torch.randn(4, 3)
    rng = torch.get_rng_state()
    ref = reference(model, (x,), rng)
    problem = verify(RecordsTheUpdate(model), model, ref, (x,), rng, 1e-5, 1e-6)
    assert problem is not None and "'state' carries autograd history" in problem


class _SpectralNorm(nn.Module):
    """Power iteration into the buffers under no_grad (``out=``), sigma from the buffers
    themselves; ``clone``: read through copies, as the fix does."""

    def __init__(self, clone: bool) -> None:
        super().__init__()
        self.clone = clone
        self.weight = nn.Parameter(torch.randn(3, 4) * 0.5)
        self.register_buffer("u", F.normalize(torch.randn(3), dim=0))
        self.register_buffer("v", F.normalize(torch.randn(4), dim=0))

    def forward(self, x):
        with torch.no_grad():
            F.normalize(torch.mv(self.weight.t(), self.u), dim=0, out=self.v)
            F.normalize(torch.mv(self.weight, self.v), dim=0, out=self.u)
        u, v = (self.u.clone(), self.v.clone()) if self.clone else (self.u, self.v)
        return F.linear(x, self.weight / torch.dot(u, torch.mv(self.weight, v)))


class _AppliedTwice(nn.Module):
    def __init__(self, clone: bool) -> None:
        super().__init__()
        self.sn = _SpectralNorm(clone)

    def forward(self, a, b):
        return self.sn(a).relu().sum() + self.sn(b).sigmoid().sum()


def test_a_power_iteration_that_overwrites_what_the_first_call_saved_is_fixed():
    """Applied twice per step, the second call's update overwrites the buffers the first
    call's ops saved: fixed (the state read through copies), with the gradients of the
    clone-before-use fix, and the buffers updated as the original updates them."""
    torch.manual_seed(0)
    model, a, b = _AppliedTwice(clone=False), torch.randn(2, 4), torch.randn(2, 4)
    fixed = _AppliedTwice(clone=True)
    fixed.load_state_dict(model.state_dict())
    gm = fxquant.functionalize_inplace(model, a, b)
    for _ in range(2):
        for m in (gm, fixed):
            m.zero_grad()
            m(a, b).backward()
        assert torch.allclose(gm.sn.weight.grad, fixed.sn.weight.grad, atol=1e-6)
        assert torch.allclose(gm.sn.u, fixed.sn.u) and torch.allclose(gm.sn.v, fixed.sn.v)
