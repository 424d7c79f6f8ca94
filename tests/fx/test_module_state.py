"""Buffers a forward updates: tracing leaves the user's model as it was, and the traced
model reproduces the updates (eager, copies, save/load, torch.compile)."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch_geometric.nn import GCNConv
from torch_geometric.nn.norm import InstanceNorm

import fxquant
from fxquant.errors import FxquantRuntimeError
from fxquant.fx.module_state import ModuleState, write_buffer
from tests.support.copies import python_copy

#: the ways forward updates a registered buffer, and the buffer each one updates
UPDATES = {"iadd": "count", "inplace_ema": "ema", "copy": "last", "rebind_ema": "hidden",
           "rebind_read": "scale", "nested": "stats.mean"}


class _Stats(nn.Module):
    """A submodule traced through (not a leaf) that keeps its own running mean."""

    def __init__(self, m: float) -> None:
        super().__init__()
        self.m = m
        self.register_buffer("mean", torch.zeros(4))

    def forward(self, x):
        self.mean = self.m * self.mean + (1 - self.m) * x.detach().mean(0)
        return x - self.mean


class Updates(nn.Module):
    """A GCN whose forward updates buffers in the ways of ``kinds``."""

    def __init__(self, kinds: tuple[str, ...], m: float = 0.9) -> None:
        super().__init__()
        self.kinds, self.m = kinds, m
        self.conv = GCNConv(4, 4)
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        self.register_buffer("ema", torch.ones(()))
        self.register_buffer("last", torch.zeros(4))
        self.register_buffer("scale", torch.ones(4))
        self.register_buffer("hidden", torch.zeros(()), persistent=False)
        self.stats = _Stats(m)

    def forward(self, x, edge_index):
        h = self.conv(x, edge_index)
        m = self.m
        if "iadd" in self.kinds:
            self.count += 1
        if "inplace_ema" in self.kinds:
            self.ema.mul_(m).add_(h.detach().mean() * (1 - m))
        if "copy" in self.kinds:
            self.last.copy_(h.detach().mean(0))
        if "rebind_ema" in self.kinds:
            self.hidden = m * self.hidden + (1 - m) * h.detach().abs().mean()
        if "rebind_read" in self.kinds:  # reads the old value, then replaces it
            out = h * self.scale
            self.scale = m * self.scale + (1 - m) * h.detach().std(0)
            h = out
        if "nested" in self.kinds:
            h = self.stats(h)
        return h * self.ema


def _bits(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer (persistent or not), cloned."""
    return {**{k: v.detach().clone() for k, v in model.named_parameters()},
            **{k: v.detach().clone() for k, v in model.named_buffers()}}


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _buffers(model: nn.Module, kinds: tuple[str, ...] = tuple(UPDATES)) -> dict[str, torch.Tensor]:
    """The buffers ``kinds`` update."""
    named = dict(model.named_buffers())
    return {UPDATES[k]: named[UPDATES[k]] for k in kinds}


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(6, 4, generator=g), torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])


@settings(max_examples=15)
@given(kinds=st.sets(st.sampled_from(sorted(UPDATES)), min_size=1).map(lambda s: tuple(sorted(s))),
       m=st.floats(0.0, 0.99), steps=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_transform_reproduces_buffer_updates_and_leaves_the_model(kinds, m, steps, seed):
    """Any mix of `+=`, `mul_`/`add_`, `copy_`, EMA rebinding (also of a buffer read
    before, and in a submodule traced through): transform and lint change nothing of the
    model, and the transformed model's buffers follow the original's forward by forward."""
    torch.manual_seed(seed)
    model = Updates(kinds, m)
    before = _bits(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm = fxquant.transform(model, bits=32)
        fxquant.lint(model)
    _assert_same(_bits(model), before)
    x, edge_index = _inputs(seed)
    for _ in range(steps):
        out = gm(x, edge_index)
        assert torch.equal(out, model(x, edge_index))
        out.sum().backward()
    _assert_same(_buffers(gm, kinds), _buffers(model, kinds))


def test_counter_and_ema_example():
    """The reported case: count 0 -> 2 and EMA 1.0 -> 0.81 on the user's model after
    transform, and a transformed model that drops the update."""
    model = Updates(("iadd", "inplace_ema"), 0.9)
    gm = fxquant.transform(model, bits=32, lint="off")
    assert int(model.count) == 0 and float(model.ema) == 1.0
    x, edge_index = _inputs(0)
    for _ in range(2):
        gm(x, edge_index)
    assert int(gm.count) == 2 and float(gm.ema) != 1.0


@pytest.mark.parametrize("route", ["deepcopy", "pickle", "torch.save", "fxquant.save"])
def test_copies_keep_updating_buffers(route, tmp_path):
    """A copy made any way runs the same updates as the original model."""
    kinds = ("copy", "iadd", "inplace_ema", "nested", "rebind_ema", "rebind_read")
    model = Updates(kinds)
    gm = fxquant.transform(model, bits=32, lint="off")
    x, edge_index = _inputs(1)
    gm(x, edge_index)
    model(x, edge_index)
    if route == "fxquant.save":
        fxquant.save(gm, tmp_path / "gm.pt")
        again = fxquant.load(tmp_path / "gm.pt", Updates(kinds))
    else:
        again = python_copy(gm, route)
    for _ in range(2):
        assert torch.equal(again(x, edge_index), model(x, edge_index))
    if route == "fxquant.save":  # a non-persistent buffer is not in a saved state_dict
        kinds = tuple(k for k in kinds if k != "rebind_ema")
    _assert_same(_buffers(again, kinds), _buffers(model, kinds))


def test_state_dict_keys_and_persistence_are_the_models():
    """The traced model's state_dict has the model's keys (a non-persistent buffer stays
    out of it)."""
    model = Updates(tuple(UPDATES))
    gm = fxquant.trace(model)
    assert set(gm.state_dict()) == set(model.state_dict())


@pytest.mark.slow
def test_compiled_model_keeps_buffer_updates():
    """torch.compile(fullgraph=True) of the transformed model updates the buffers too."""
    model = Updates(("copy", "iadd", "inplace_ema", "nested", "rebind_ema", "rebind_read"))
    gm = fxquant.transform(model, bits=32, lint="off")
    compiled = torch.compile(gm, fullgraph=True)
    x, edge_index = _inputs(2)
    for _ in range(2):
        torch.testing.assert_close(compiled(x, edge_index), model(x, edge_index))
    for key, value in _buffers(model).items():
        torch.testing.assert_close(gm.get_buffer(key), value)


def test_pyg_instance_norm_running_statistics():
    """PyG's InstanceNorm(track_running_stats=True) of a batch of graphs rebinds its
    running statistics in forward: the transformed model keeps them, the model is left as
    it was."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.norm = GCNConv(4, 8), InstanceNorm(8, track_running_stats=True)

        def forward(self, x, edge_index, batch):
            return self.norm(self.conv(x, edge_index), batch, batch_size=2).relu()

    model = Net()
    before = _bits(model)
    gm = fxquant.transform(model, bits=32, lint="off")
    _assert_same(_bits(model), before)
    assert all(isinstance(b, torch.Tensor) for b in model.buffers())
    x, edge_index = _inputs(3)
    batch = torch.tensor([0, 0, 0, 1, 1, 1])
    for _ in range(3):
        gm(x, edge_index, batch)
        model(x, edge_index, batch)
    assert torch.equal(gm.norm.running_mean, model.norm.running_mean)
    assert torch.equal(gm.norm.running_var, model.norm.running_var)


def test_failed_trace_restores_buffers_changed_through_any_path():
    """A forward that changes buffers outside the traced graph and then fails leaves
    them as they were."""

    class Fails(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GCNConv(4, 4)
            self.register_buffer("count", torch.zeros(()))

        def forward(self, x, edge_index):
            for b in self.buffers():
                b.add_(1)
            if x.sum() > 0:  # not traceable
                return x
            return self.conv(x, edge_index)

    model = Fails()
    with pytest.raises(fxquant.TraceError):
        fxquant.transform(model, bits=16)
    assert float(model.count) == 0


def test_update_through_an_untraced_path_is_refused():
    """A buffer changed where tracing cannot see (through ``self.buffers()``) is an error
    naming it, never a silently lost update."""

    class Hidden(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GCNConv(4, 4)
            self.register_buffer("count", torch.zeros(()))

        def forward(self, x, edge_index):
            for b in self.buffers():
                b.add_(1)
            return self.conv(x, edge_index)

    model = Hidden()
    with pytest.raises(fxquant.TraceError, match=r"count.*in place"):
        fxquant.transform(model, bits=16)
    assert float(model.count) == 0


def test_branch_on_an_updated_buffer_is_refused_with_the_line():
    """Python control flow on a buffer it also updates cannot be recorded: an error names
    the buffer and the line; a buffer only read in a branch still traces, as before."""

    class Warmup(nn.Module):
        def __init__(self, update: bool):
            super().__init__()
            self.conv, self.update = GCNConv(4, 4), update
            self.register_buffer("steps", torch.zeros((), dtype=torch.long))

        def forward(self, x, edge_index):
            if self.update:
                self.steps += 1
            if self.steps > 10:
                x = x * 2
            return self.conv(x, edge_index)

    model = Warmup(True)
    with pytest.raises(fxquant.TraceError, match=r"steps.*self\.steps > 10"):
        fxquant.transform(model, bits=16)
    assert int(model.steps) == 0
    reads = Warmup(False)
    gm = fxquant.transform(reads, bits=32, lint="off")
    x, edge_index = _inputs(4)
    assert torch.equal(gm(x, edge_index), reads(x, edge_index))


def test_rebinding_to_another_dtype_is_an_error_at_run_time():
    """The traced model writes updates in place: a new value of another dtype (which the
    rebinding would have given the buffer) raises, naming shape and dtype."""

    class Promotes(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GCNConv(4, 4)
            self.register_buffer("ema", torch.zeros(()))

        def forward(self, x, edge_index):
            self.ema = 0.5 * self.ema + x.double().mean()
            return self.conv(x, edge_index)

    gm = fxquant.transform(Promotes(), bits=32, lint="off")
    x, edge_index = _inputs(5)
    with pytest.raises(FxquantRuntimeError, match=r"torch\.float64.*shape, dtype"):
        gm(x, edge_index)


def test_write_buffer_writes_in_place():
    """write_buffer keeps the buffer object and copies the value."""
    buf = torch.zeros(3)
    assert write_buffer(buf, torch.ones(3)) is buf
    assert torch.equal(buf, torch.ones(3))


def test_module_state_restores_tables_by_identity():
    """A forward's rebinding, registering and deleting of buffers and parameters is put
    back by identity, values included."""
    lin = nn.Linear(2, 2)
    lin.register_buffer("b", torch.ones(2))
    weight, b = lin.weight, lin.b
    state = ModuleState(lin)
    lin.b = torch.zeros(2)
    lin.register_buffer("new", torch.ones(1))
    del lin.bias
    with torch.no_grad():
        weight.mul_(3)
    changes = state.restore()
    assert lin.weight is weight and lin.b is b and "new" not in lin._buffers
    assert isinstance(lin.bias, nn.Parameter)
    assert torch.equal(weight, state.tensors[id(weight)][4])
    assert [r.qualname for r in changes.rebound] == ["b"] and changes.written == ["weight"]


def test_symbolic_lint_leaves_buffers_as_they_were():
    """fxquant.lint(model) (symbolic: fxquant's tracer) changes no buffer, however
    forward updates them."""
    model = Updates(tuple(UPDATES))
    before = _bits(model)
    fxquant.lint(model)
    _assert_same(_bits(model), before)
