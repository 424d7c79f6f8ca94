"""lint and check leave nothing behind: stacks popped by identity, the model's state, the
process-wide switches, also when the forward misbehaves or threads race."""

from __future__ import annotations

import collections
import copy
import threading

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

import fxquant
from tests.support.lint_models import DataScale, DetachAdd, FillLeaf, LegalInplace, Raises
from tests.support.models import GCN, tiny_graph

RUNS = [fxquant.lint, fxquant.check]


class _LeavesHooksAndRaises(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        self.lin(x)
        torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t).__enter__()
        raise RuntimeError("boom")


class _LeavesModeAndRaises(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        TorchFunctionMode().__enter__()
        raise RuntimeError("boom")


def _inplace_bug_still_raises() -> None:
    """With no saved-tensor hook left installed, autograd catches this in-place bug."""
    w = torch.ones(2, requires_grad=True)
    y = w.exp()
    y.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("run", RUNS)
def test_leaked_saved_tensor_hooks_are_popped(run):
    """The reported repro: a forward that leaves a hooks context open and raises."""
    top = torch._C._autograd._top_saved_tensors_default_hooks(True)
    report = run(_LeavesHooksAndRaises(), torch.ones(3, 2))
    assert [f.rule for f in report.errors] == ["FXQ009"]
    assert torch._C._autograd._top_saved_tensors_default_hooks(True) is top
    _inplace_bug_still_raises()


@pytest.mark.parametrize("run", RUNS)
def test_leaked_function_mode_is_popped(run):
    stack = list(_get_current_function_mode_stack())
    run(_LeavesModeAndRaises(), torch.ones(3, 2))
    assert list(_get_current_function_mode_stack()) == stack


class _PassThrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _LeavesDispatchMode(nn.Module):
    """A forward that enters a dispatch mode and never leaves it (it runs on)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        _PassThrough().__enter__()
        return self.lin(x)


@pytest.mark.parametrize("run", RUNS)
def test_leaked_dispatch_mode_is_popped(run):
    """The mode is popped, and the forward (which runs) is clean: no note of fxquant's own
    failure, no exception."""
    stack = list(_get_current_dispatch_mode_stack())
    assert not run(_LeavesDispatchMode(), torch.ones(3, 2)).findings
    assert list(_get_current_dispatch_mode_stack()) == stack


class _Mutates(nn.Module):
    """A forward that changes everything the README promises to restore."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.extra = nn.Linear(3, 3)
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        self.lin.register_forward_hook(lambda m, i, o: o * 2)
        self.extra = nn.Linear(3, 3)  # a submodule replaced
        self.lin.bias = nn.Parameter(torch.zeros(3))  # a Parameter replaced
        self.register_buffer("fresh", torch.ones(1))  # a buffer registered
        del self.count  # a buffer deleted
        self.lin.weight.requires_grad_(False)
        torch.set_default_dtype(torch.float64)
        torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
        self.cached = "value"
        return self.lin(x).float()


@pytest.mark.parametrize("run", RUNS)
def test_model_and_process_state_are_restored(run):
    model = _Mutates()
    model.lin.weight.grad = torch.full((3, 3), 7.0)
    grad = model.lin.weight.grad
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    buffers = dict(model.named_buffers())
    values = copy.deepcopy(model.state_dict())
    global_hooks = dict(torch.nn.modules.module._global_forward_hooks)
    run(model, torch.ones(2, 3))
    assert torch.get_default_dtype() == torch.float32
    assert dict(torch.nn.modules.module._global_forward_hooks) == global_hooks
    assert dict(model.named_parameters()) == params  # the same objects
    assert dict(model.named_modules()) == modules
    assert dict(model.named_buffers()) == buffers
    assert not model.lin._forward_hooks and not hasattr(model, "cached")
    assert model.lin.weight.requires_grad
    assert model.lin.weight.grad is grad and torch.equal(grad, torch.full((3, 3), 7.0))
    assert all(torch.equal(v, values[k]) for k, v in model.state_dict().items())


class _Logs(nn.Module):
    """Appends to a bounded deque and counts into a defaultdict (a deque was left with the
    lint's entries; a defaultdict made the snapshot itself fail)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.recent = collections.deque([0], maxlen=3)
        self.counts = collections.defaultdict(int)

    def forward(self, x):
        self.recent.append(x.shape[0])
        self.counts["calls"] += 1
        return self.lin(x)


@pytest.mark.parametrize("run", [*RUNS, fxquant.functionalize_inplace])
def test_deques_and_defaultdicts_are_restored(run):
    model = _Logs()
    recent, counts = model.recent, model.counts
    run(model, torch.ones(2, 3))
    assert model.recent is recent and list(recent) == [0] and recent.maxlen == 3
    assert model.counts is counts and dict(counts) == {} and counts.default_factory is int


def test_lint_does_not_touch_grad_in_place():
    """A forward that accumulates into .grad (in place) gets it back as it was."""

    class Accumulates(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(2))

        def forward(self, x):
            with torch.no_grad():
                self.w.grad.add_(1)
            return self.w * x

    model = Accumulates()
    model.w.grad = torch.zeros(2)
    fxquant.lint(model, torch.ones(2))
    assert torch.equal(model.w.grad, torch.zeros(2))


def _models():
    g = tiny_graph()
    return [(DetachAdd(), (torch.rand(3, 4),)), (FillLeaf(), (torch.rand(3, 4),)),
            (Raises(), (torch.rand(2, 4),)), (LegalInplace(), (g.x, g.edge_index)),
            (DataScale(), (torch.rand(3, 4),)), (GCN(), (g.x, g.edge_index))]


def _summary(report):
    return sorted((f.rule, f.node, f.where, f.related) for f in report.findings)


@pytest.mark.parametrize("run", RUNS)
def test_threads_give_the_sequential_reports_and_a_clean_state(run):
    """4 threads x 4 models x many rounds: the same reports as one after another (no false
    FXQ006 from a neighbour's anomaly switch), and nothing global left changed."""
    torch.manual_seed(0)
    cases = _models()
    expected = [_summary(run(m, *inputs)) for m, inputs in cases]
    original = torch.set_anomaly_enabled
    rng = torch.get_rng_state()
    results: list[list] = [[] for _ in cases]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        model, inputs = cases[i]
        try:
            for _ in range(6):
                results[i].append(_summary(run(model, *inputs)))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, got in enumerate(results):
        assert all(r == expected[i] for r in got), (i, got[0], expected[i])
    assert torch.set_anomaly_enabled is original
    assert not torch.is_anomaly_enabled()
    assert torch.equal(torch.get_rng_state(), rng)
