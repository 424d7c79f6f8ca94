"""torch.compile(fullgraph=True) of LSQ message points: the step is fitted inside the
compiled graph under dynamic shapes, also where the number of messages is known only from
the data (GCNConv's self-loops), and again after refit_steps when batch sizes change."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn
from torch_geometric.nn import GCNConv, SAGEConv

import fxquant

pytestmark = pytest.mark.slow  # every case compiles (tens of seconds)


class Net(nn.Module):
    def __init__(self, conv: type[nn.Module]):
        super().__init__()
        self.conv1, self.conv2 = conv(4, 8), conv(8, 3)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def _model(conv) -> torch.fx.GraphModule:
    torch.manual_seed(0)
    config = fxquant.QuantConfig("int4", scale="tensor", range="lsq")
    mapping = fxquant.QuantMapping().set_global(config, site="message")
    return fxquant.transform(Net(conv), mapping, lint="off")


def _batches():
    g = torch.Generator().manual_seed(0)
    for n, e in ((10, 30), (14, 50), (23, 80)):
        yield torch.randn(n, 4, generator=g) * n, torch.randint(0, n, (2, e), generator=g)


def _compiled_pair(seed: int):
    """A SAGEConv model, its eager copy, the model compiled, and a batch of 12 nodes."""
    gm = _model(SAGEConv)
    eager = copy.deepcopy(gm)
    compiled = torch.compile(gm, fullgraph=True, dynamic=True)
    g = torch.Generator().manual_seed(seed)
    batch = torch.randn(12, 4, generator=g), torch.randint(0, 12, (2, 40), generator=g)
    return gm, eager, compiled, batch


def _steps(gm) -> list[torch.Tensor]:
    return [m.step.detach() for m in gm.modules() if isinstance(m, fxquant.QuantPoint)]


@pytest.mark.parametrize("dynamic", [True, None])
def test_steps_fit_in_a_compiled_forward_where_message_counts_are_data(dynamic):
    """GCNConv adds self-loops, so compiled code knows the number of messages only from
    the data: fitting the step there raised a data-dependent guard. Calibration forwards
    (training mode, no gradient) after refit_steps, on batches of changing size, fit the
    steps the eager model fits."""
    gm = _model(GCNConv)
    eager = copy.deepcopy(gm)
    compiled = torch.compile(gm, fullgraph=True, dynamic=dynamic)
    for x, edge_index in _batches():
        fxquant.refit_steps(gm)
        fxquant.refit_steps(eager)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x, edge_index), eager(x, edge_index))
        for got, want in zip(_steps(gm), _steps(eager), strict=True):
            torch.testing.assert_close(got, want)


@pytest.mark.slow
@pytest.mark.parametrize("conv", [SAGEConv, GCNConv])
def test_compiled_training_with_refit_and_changing_batch_sizes(conv):
    """Training steps (forward and backward) of the compiled model with dynamic shapes,
    refitting the steps on each batch, follow the eager model. (GCNConv: with torch's
    common-subexpression pass off, which otherwise drops the size binding of its second
    layer's self-loops from the backward graph: an inductor error in torch itself.)"""
    gm = _model(conv)
    eager = copy.deepcopy(gm)
    compiled = torch.compile(gm, fullgraph=True, dynamic=True)
    with torch._functorch.config.patch(cse=conv is not GCNConv):
        for x, edge_index in _batches():
            for model, run in ((gm, compiled), (eager, eager)):
                fxquant.refit_steps(model)
                model.zero_grad()
                run(x, edge_index).square().mean().backward()
            for a, b in zip(gm.parameters(), eager.parameters(), strict=True):
                torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
            for got, want in zip(_steps(gm), _steps(eager), strict=True):
                torch.testing.assert_close(got, want)


def test_compiled_widening_refits_follow_eager():
    """refit_steps(widen=True) inside a compiled forward: a batch of smaller values leaves
    the steps, a larger one widens them, as in eager mode."""
    gm, eager, compiled, (x, edge_index) = _compiled_pair(1)
    history = []
    for scale in (10.0, 0.1, 30.0):
        for model, run in ((gm, compiled), (eager, eager)):
            fxquant.refit_steps(model, widen=True)
            with torch.no_grad():
                run(scale * x, edge_index)
        for got, want in zip(_steps(gm), _steps(eager), strict=True):
            torch.testing.assert_close(got, want)
        history.append([float(s) for s in _steps(gm)])
    assert history[1] == history[0]
    assert all(b > a for a, b in zip(history[1], history[2], strict=True))


def _settle_by_train(model):
    model.train()


def _settle_by_refit(model):
    fxquant.refit_steps(model, widen=True)


def _settle_by_start_epoch(model):
    fxquant.recipes.QuantTraining(model).start_epoch(1)


@pytest.mark.parametrize("settle", [_settle_by_train, _settle_by_refit, _settle_by_start_epoch])
def test_compiled_fit_on_a_batch_without_finite_values_fits_on_the_next(settle):
    """A first training batch with no finite value leaves the steps unfitted, compiled as
    in eager mode (compiled code cannot branch on it: the mode change, refit_steps or
    QuantTraining.start_epoch notices it): the next batch fits them, and a widening refit
    does not keep the placeholder step (1) over the smaller step that batch fits."""
    gm, eager, compiled, (x, edge_index) = _compiled_pair(2)
    for model, run in ((gm, compiled), (eager, eager)):
        with torch.no_grad():
            run(torch.full_like(x, float("nan")), edge_index)
        settle(model)
        with torch.no_grad():
            run(0.01 * x, edge_index)
    steps = _steps(gm)
    assert all(float(s) < 0.5 for s in steps)  # fitted, not the placeholder
    for got, want in zip(steps, _steps(eager), strict=True):
        torch.testing.assert_close(got, want)
    gm.eval()  # settles the second fit
    assert all(p.learned_step.step_fitted for p in gm.modules() if isinstance(p, fxquant.QuantPoint))


def test_compiled_nan_batch_in_a_widening_refit_keeps_the_widening():
    """A widening refit of a fitted step whose compiled batch holds no finite value is
    still a widening refit on the next batch: a batch of smaller values keeps the step."""
    gm, eager, compiled, (x, edge_index) = _compiled_pair(3)
    for model, run in ((gm, compiled), (eager, eager)):
        with torch.no_grad():
            run(10 * x, edge_index)
            fxquant.refit_steps(model, widen=True)
            run(torch.full_like(x, float("inf")), edge_index)
            model.train()
            run(0.1 * x, edge_index)
    fitted = _steps(gm)
    for got, want in zip(fitted, _steps(eager), strict=True):
        torch.testing.assert_close(got, want)
    assert all(float(s) > 0.5 for s in fitted)  # kept the step of the 10x batch


def test_compiled_fit_without_finite_values_warns_at_evaluation():
    """Evaluating after a compiled fit that found no finite value warns: the step is
    still the placeholder (eager code would have fitted it on a later training batch);
    after a finite batch, nothing is said."""
    gm = _model(SAGEConv)
    compiled = torch.compile(gm, fullgraph=True, dynamic=True)
    x, edge_index = next(_batches())
    with torch.no_grad():
        compiled(torch.full_like(x, float("nan")), edge_index)
    with pytest.warns(UserWarning, match="no finite nonzero value"):
        gm.eval()
    gm.train()
    with torch.no_grad():
        compiled(x, edge_index)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gm.eval()
    assert all(p.learned_step.step_fitted for p in gm.modules() if isinstance(p, fxquant.QuantPoint))


def test_mode_changes_and_refits_may_run_inside_a_compiled_function():
    """``model.train()`` and ``refit_steps`` inside a ``fullgraph`` compiled function:
    settling a fit is left to eager code, so it adds no data-dependent branch."""
    gm = _model(SAGEConv)

    @torch.compile(backend="aot_eager", fullgraph=True, dynamic=True)
    def step(x, edge_index):
        fxquant.refit_steps(gm)
        gm.train()
        return gm(x, edge_index)

    for x, edge_index in _batches():
        step(x, edge_index).square().mean().backward()
    gm.eval()  # settled here
    assert all(p.learned_step.step_fitted for p in gm.modules() if isinstance(p, fxquant.QuantPoint))


def test_settling_fits_adds_no_compiled_graph():
    """One graph per combination of the flags the forward reads (fitting, fitting to
    widen, not fitting), however often the steps are refitted and the mode changes: the
    traced fit neither reads nor sets the flags that eager code settles."""
    from torch._dynamo.testing import CompileCounter

    gm = _model(SAGEConv)
    counter = CompileCounter()
    run = torch.compile(gm, backend=counter, fullgraph=True, dynamic=True)
    g = torch.Generator().manual_seed(0)
    for widen in (False, False, True, True):
        for n in (10, 14):
            x, e = torch.randn(n, 4, generator=g), torch.randint(0, n, (2, 3 * n), generator=g)
            fxquant.refit_steps(gm, widen=widen)
            gm.train()
            run(x, e).square().mean().backward()
            gm.eval()
            with torch.no_grad():
                run(x, e)
    assert counter.frame_count == 3


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_fixed_per_node_bits_compile_without_a_graph_break(rounding):
    """A fixed per-node bit-width table (HubMessages' points: no ranges recorded) with a
    learned step compiles as one graph without a break (no ``float()`` of a tensor in the
    forward: not the table's mean, not LSQ's gradient scale), forward and backward, to
    nearest and stochastically; to nearest it equals eager, the step's gradient too."""
    bits = fxquant.NodeBits(torch.full((64,), 2), min_bits=1)
    config = fxquant.QuantConfig("int8:midrise", rounding, scale="tensor", range="lsq",
                                 node_bits=bits)
    point = fxquant.QuantPoint(config, "conv", "message").train()
    x = torch.randn(64, 8, requires_grad=True)
    point(x)  # fits the step
    torch._dynamo.reset()
    assert torch._dynamo.explain(point)(x).graph_break_count == 0
    point.log_step.grad = None
    compiled = torch.compile(point)
    y = compiled(x)
    y.sum().backward()
    assert x.grad is not None and point.log_step.grad is not None
    if rounding == "nearest":
        step_grad = point.log_step.grad.clone()
        point.log_step.grad = None
        eager = point(x)
        eager.sum().backward()
        assert torch.equal(y, eager)
        assert torch.allclose(point.log_step.grad, step_grad, rtol=1e-5)


@pytest.mark.parametrize("learned", [True, False])
def test_per_node_bits_fit_their_step_inside_a_compiled_graph(learned):
    """A learned step with per-node bits is fitted at the table's mean width; the first
    compiled training forward (and the first after refit_steps, as QuantTraining's
    refit and float epochs make) raised a data-dependent guard under fullgraph=True. The
    compiled fit now picks the step eager code picks."""
    n = 30
    bits = fxquant.NodeBits.learned_init(n, 4.0) if learned else \
        fxquant.NodeBits(torch.arange(n) % 3 + 2.0, learned=False)
    config = fxquant.QuantConfig("int8", scale="tensor", range="lsq", node_bits=bits)
    gm = fxquant.transform(nn.Sequential(nn.Linear(4, 4)),
                           fxquant.QuantMapping().set_name("0", config), lint="off")
    eager = copy.deepcopy(gm)
    compiled = torch.compile(gm, fullgraph=True)
    g = torch.Generator().manual_seed(0)
    for scale in (1.0, 5.0):
        x = torch.randn(n, 4, generator=g) * scale
        out = compiled(x)
        out.sum().backward()
        want = eager(x)
        want.sum().backward()
        torch.testing.assert_close(out, want)
        for got, expected in zip(_steps(gm), _steps(eager), strict=True):
            torch.testing.assert_close(got, expected)
        fxquant.refit_steps(gm)
        fxquant.refit_steps(eager)
