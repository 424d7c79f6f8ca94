"""Rounded features (a learned step on a dataset's mostly-zero features): their dropout and
linear transform give the step and ranges the gradients of the plain path, without the
dense product, and anything else sees a plain tensor."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn.dense.linear import Linear as PygLinear

import fxquant
from fxquant.quant import lsq
from fxquant.quant.lsq import RoundedFeatures, lsq_round, lsq_round_features


def features(rows: int = 300, cols: int = 400, seed: int = 0,
             negative_zero: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(rows, cols, generator=g) * (torch.rand(rows, cols, generator=g) < 0.02)
    x[0, :4] = torch.tensor([5.0, -5.0, 0.01, -0.0])  # clipped both ways, small, -0.0
    if not negative_zero:  # (a -0.0 among the features takes a path that keeps its sign)
        x[0, 3] = 0.0
    return x


def run(fn, x, consume, seed: int = 0, per_row: bool = True):
    """Round ``x`` with ``fn`` (a learned step, per-row bit-widths), ``consume`` it, and
    return the output and the gradients of the step, the bit-widths and the weights."""
    torch.manual_seed(seed)
    s = torch.tensor(0.05, requires_grad=True)
    bits = torch.full((x.shape[0], 1) if per_row else (), 4.0, requires_grad=True)
    qmax = 2 ** (bits - 1) - 1
    lin = torch.nn.Linear(x.shape[1], 8)
    torch.nn.init.normal_(lin.weight)
    y = fn(x, s, -qmax, qmax, 0.3)
    out = consume(y, lin)
    grad = torch.randn_like(out, generator=torch.Generator().manual_seed(1))
    out.backward(grad)
    return out.detach(), s.grad, bits.grad, lin.weight.grad, lin.bias.grad


def plain(x, s, qmin, qmax, gain):
    return lsq_round(x, s, qmin, qmax, gain)


CONSUMERS = {
    "linear": lambda y, lin: lin(y),
    "dropout-linear": lambda y, lin: lin(F.dropout(y, 0.5, True)),
    "module-dropout-linear": lambda y, lin: lin(torch.nn.Dropout(0.3)(y)),
    "two-dropouts": lambda y, lin: lin(F.dropout(F.dropout(y, 0.5), 0.2)),
    "pyg-linear": lambda y, lin: F.linear(y, lin.weight, lin.bias),
    "also-summed": lambda y, lin: lin(F.dropout(y, 0.5)) + y.sum(1, keepdim=True),
    "eval-dropout": lambda y, lin: lin(F.dropout(y, 0.5, training=False)),
}


@pytest.mark.parametrize("per_row", [True, False])
@pytest.mark.parametrize("consumer", list(CONSUMERS))
def test_values_and_gradients_equal_the_plain_path(consumer, per_row):
    """The same output (bit for bit: the same dropout draws) and the same gradients of the
    step, the per-row bit-widths and the weights, whether the linear transform takes the
    non-zero entries' path or the plain one; a second consumer adds its own share."""
    x = features()
    fused = run(lsq_round_features, x, CONSUMERS[consumer], per_row=per_row)
    want = run(plain, x, CONSUMERS[consumer], per_row=per_row)
    assert torch.equal(fused[0], want[0])
    for got, expected in zip(fused[1:], want[1:], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert fused[1].abs() > 0 and fused[2].abs().sum() > 0


def test_the_linear_takes_the_entries_path(monkeypatch):
    """Through a dropout to an ``nn.Linear`` and to PyG's ``Linear``: the gradient never
    goes through the dense product (no ``_LsqRound`` backward runs)."""
    x = features()
    for layer in (torch.nn.Linear(400, 8), PygLinear(400, 8)):
        s = torch.tensor(0.05, requires_grad=True)
        y = lsq_round_features(x, s, -7.0, 7.0)
        assert type(y) is RoundedFeatures
        dropped = torch.nn.Dropout(0.5)(y)
        assert type(dropped) is RoundedFeatures
        out = layer(dropped)
        assert type(out) is torch.Tensor and type(out.grad_fn).__name__ == "_FeaturesLinearBackward"
        out.sum().backward()
        assert s.grad is not None and s.grad != 0


def test_changed_in_place_falls_back_to_the_plain_path():
    """Values changed in place after rounding: the linear transform takes the plain path,
    whose gradients follow the change."""
    x = features()

    def consume(y, lin):
        y.mul_(2)
        return lin(y)

    fused = run(lsq_round_features, x, consume)
    want = run(plain, x, consume)
    for got, expected in zip(fused, want, strict=True):
        torch.testing.assert_close(got, expected)


def test_plain_tensor_where_it_cannot_help():
    """No gradient wanted (evaluation, ``no_grad``, a fixed step), a dense input or one
    that needs a gradient, or one dimension: a plain tensor."""
    x = features()
    s = torch.tensor(0.05, requires_grad=True)
    with torch.no_grad():
        assert type(lsq_round_features(x, s, -7.0, 7.0)) is torch.Tensor
    assert type(lsq_round_features(x, s.detach(), -7.0, 7.0)) is torch.Tensor
    assert type(lsq_round_features(torch.randn(300, 400), s, -7.0, 7.0)) is torch.Tensor
    assert type(lsq_round_features(x.clone().requires_grad_(), s, -7.0, 7.0)) is torch.Tensor
    assert type(lsq_round_features(x.view(-1), s, -7.0, 7.0)) is torch.Tensor


def test_looks_and_acts_like_a_tensor():
    """Its repr is a tensor's, and ops other than dropout and linear return plain tensors."""
    x = features()
    s = torch.tensor(0.05, requires_grad=True)
    y = lsq_round_features(x, s, -7.0, 7.0)
    want = lsq_round(x, s, -7.0, 7.0)
    assert repr(y) == repr(want)
    assert type(y * 2) is torch.Tensor and type(y[:3]) is torch.Tensor
    assert y.to(torch.float32) is y  # a no-op stays the same tensor
    assert torch.equal(y.sum(0), want.sum(0))


@pytest.mark.parametrize("reused", [False, True])
def test_transformed_gcn_trains_the_same(monkeypatch, request, reused):
    """A GCN with learned per-node bits at every activation site on sparse features: the
    gradients of every parameter equal the plain path's, and the first layer's linear
    transform takes the entries' path (also where the features' outputs reuse memory from
    step to step, as they do from 1 MiB on)."""
    from tests.support.models import PygGCN as GCN

    if reused:
        request.getfixturevalue("scratch")

    torch.manual_seed(0)
    num_nodes, feats = 200, 500
    x = features(num_nodes, feats, negative_zero=not reused)
    edge_index = torch.randint(0, num_nodes, (2, 1200), generator=torch.Generator().manual_seed(2))
    mapping = fxquant.QuantMapping()
    for site in ("input", "message", "aggregate", "output"):
        mapping.set_global(fxquant.QuantConfig(
            "int8", scale="tensor", range="lsq",
            node_bits=fxquant.NodeBits.learned_init(num_nodes, 4.0)), site=site)
    model = fxquant.transform(GCN(feats, 16, 3), mapping)
    torch.manual_seed(0)  # the same weights (a loaded state would keep the unfitted steps)
    reference = fxquant.transform(GCN(feats, 16, 3), mapping)
    seen = []
    real = lsq._FeaturesLinear.apply

    def spy(*args):
        seen.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(lsq._FeaturesLinear, "apply", spy)
    grads = []
    for gm, fused in ((model, True), (reference, False)):
        if not fused:
            monkeypatch.setattr("fxquant.quant.points.lsq_round_features",
                                lambda x, s, lo, hi, gain: lsq_round(x, s, lo, hi, gain))
        gm.train()
        for _ in range(2):  # the second step with fitted steps
            torch.manual_seed(3)
            gm.zero_grad()
            gm(x, edge_index).square().sum().backward()
        grads.append({n: p.grad for n, p in gm.named_parameters()})
    assert seen and seen[0] == (num_nodes, feats)
    assert len(seen) == 2  # the model's two steps; none for the reference
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-6,
                                   msg=lambda m, n=name: f"{n}: {m}")


def test_entries_are_found_once_across_evaluations(monkeypatch):
    """Training steps with an evaluation after each (as a training loop runs): the
    features' non-zero entries are found once, though other tensors pass in between."""
    found = []
    real = lsq._nonzero_entries

    def spy(x):
        found.append(x)
        return real(x)

    monkeypatch.setattr(lsq, "_nonzero_entries", spy)
    lsq._ENTRIES.clear()
    x = features()
    s = torch.tensor(0.05, requires_grad=True)
    for _ in range(3):
        lsq_round_features(x, s, -7.0, 7.0)
        with torch.no_grad():
            for other in (torch.randn(300, 400), torch.randn(500, 200)):
                lsq_round(other, s, -7.0, 7.0)
    assert sum(f is x for f in found) == 1


@pytest.fixture
def scratch(monkeypatch):
    """A fresh pool of scratch memory that serves every size (the library's serves
    tensors of 1 MiB and more)."""
    pool = lsq._Scratch(min_bytes=0)
    monkeypatch.setattr(lsq, "_SCRATCH", pool)
    lsq._ENTRIES.clear()
    return pool


def _step(x, s, lin, seed):
    """Round ``x``, drop out, transform: the rounded features, their dropout and the output."""
    y = lsq_round_features(x, s, -7.0, 7.0)
    torch.manual_seed(seed)
    dropped = F.dropout(y, 0.5)
    return y, dropped, lin(dropped)


def _expected(x, s, seed):
    y = lsq_round(x, s, -7.0, 7.0).detach()
    torch.manual_seed(seed)
    return y, F.dropout(y, 0.5)


def test_scratch_memory_is_reused_and_zeroed_in_full(scratch):
    """A training step's rounded features and their dropout reuse the memory of the step
    before once nothing refers to it, and hold exactly the plain path's values even where
    a caller wrote into the earlier tensors before letting them go."""
    x, lin = features(negative_zero=False), torch.nn.Linear(400, 8)
    s = torch.tensor(0.05, requires_grad=True)
    y, dropped, out = _step(x, s, lin, seed=1)
    first = {y.data_ptr(), dropped.data_ptr()}
    assert len(first) == 2 and len(scratch._blocks) == 2
    out.sum().backward()
    with torch.no_grad():
        y.fill_(3.0)
        dropped.fill_(-1.0)
    del y, dropped, out
    for seed in (2, 3):
        y, dropped, out = _step(x, s, lin, seed)
        assert {y.data_ptr(), dropped.data_ptr()} == first
        want_y, want_dropped = _expected(x, s, seed)
        assert torch.equal(y, want_y) and torch.equal(dropped, want_dropped)
        out.sum().backward()
        del y, dropped, out


@pytest.mark.parametrize("holder", ["tensor", "view", "detached", "numpy", "graph"])
def test_scratch_memory_in_use_is_never_reused(scratch, holder):
    """While anything still refers to a step's tensors (the tensor, a view of it, a
    detached tensor, a NumPy array, an autograd graph not yet run backward, which holds
    the dropout's output), the next step writes elsewhere and the held values stay as they
    were."""
    x, lin = features(negative_zero=False), torch.nn.Linear(400, 8)
    s = torch.tensor(0.05, requires_grad=True)
    y, dropped, out = _step(x, s, lin, seed=1)
    held: list = [out] if holder == "graph" else [
        t if holder == "tensor" else t[1:] if holder == "view" else t.detach()
        if holder == "detached" else t.detach().numpy() for t in (y, dropped)]
    kept = {dropped.data_ptr()} if holder == "graph" else {y.data_ptr(), dropped.data_ptr()}
    before = [t.detach().clone()[1 if holder == "view" else 0:] for t in (y, dropped)]
    del y, dropped, out
    y2, dropped2, _ = _step(x, s, lin, seed=2)
    assert not kept & {y2.data_ptr(), dropped2.data_ptr()}
    want_y, want_dropped = _expected(x, s, 2)
    assert torch.equal(y2, want_y) and torch.equal(dropped2, want_dropped)
    if holder != "graph":
        for t, was in zip(held, before, strict=True):
            assert torch.equal(torch.as_tensor(t), was)
        return
    held[0].sum().backward()  # the first step's gradients, as the plain path gives them
    got = (s.grad.clone(), lin.weight.grad.clone())
    s.grad = lin.weight.grad = None
    torch.manual_seed(1)
    lin(F.dropout(lsq_round(x, s, -7.0, 7.0), 0.5)).sum().backward()
    torch.testing.assert_close(got[0], s.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got[1], lin.weight.grad)


def test_scratch_memory_follows_the_features(scratch):
    """Other features let the earlier blocks go, and so do features that are freed."""
    lin = torch.nn.Linear(400, 8)
    s = torch.tensor(0.05, requires_grad=True)
    x = features(negative_zero=False)
    _step(x, s, lin, seed=1)[2].sum().backward()
    before = list(scratch._blocks)
    assert len(before) == 2
    x2 = features(seed=1, negative_zero=False)
    _step(x2, s, lin, seed=1)[2].sum().backward()
    assert len(scratch._blocks) == 2 and not any(b is a for b in scratch._blocks for a in before)
    del x, x2
    lsq._ENTRIES.clear()  # (the cache of non-zero entries holds the features' positions)
    gc.collect()
    assert scratch._blocks == []
