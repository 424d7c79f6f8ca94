"""functionalize_inplace keeps module state: counters, EMAs read after their update,
buffers the forward never touches, persistence; and the model it is given is unchanged."""

from __future__ import annotations

import torch
from torch.fx import GraphModule

import fxquant
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
