"""Non-finite values never poison a statistic: learned steps, running and percentile
ranges and per-node recorded ranges are fitted from finite values only, stay finite and
positive, and a batch with no finite value leaves them as they were."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

import fxquant
from fxquant.quant.config import NodeBits, QuantConfig
from fxquant.quant.observers import RangeObserver
from fxquant.quant.points import QuantPoint

#: grids whose level 0 is a code: a 0 value adds no rounding error and no gradient
ZERO_GRIDS = ("int2", "int3", "int4", "int8", "uint2", "uint4", "uint8")
BAD = (math.nan, math.inf, -math.inf)


@st.composite
def batches(draw, rows=None, cols=None, none_finite=False):
    """A batch with non-finite values (NaN, +inf, -inf) at drawn places; the mask says
    where."""
    n = draw(st.integers(1, 12)) if rows is None else rows
    m = draw(st.integers(1, 6)) if cols is None else cols
    seed = draw(st.integers(0, 2**16))
    scale = draw(st.sampled_from([1e-3, 1.0, 50.0, 1e4]))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, m, generator=g) * scale
    if none_finite:
        bad = torch.ones(n, m, dtype=torch.bool)
    else:
        bad = torch.rand(n, m, generator=g) < draw(st.floats(0.0, 0.5))
    kinds = torch.tensor(BAD)[torch.randint(0, 3, (n, m), generator=g)]
    return torch.where(bad, kinds, x), bad


def _lsq_point(fmt: str) -> QuantPoint:
    return QuantPoint(QuantConfig(fmt, scale="tensor", range="lsq"), "lin").train()


@settings(max_examples=60)
@given(fmt=st.sampled_from(ZERO_GRIDS), batch=batches())
def test_learned_step_is_fitted_from_finite_values_only(fmt, batch):
    """The first training batch fits the same step as the batch with its non-finite
    values made 0 (which adds no error on these grids); the step is finite, positive."""
    x, bad = batch
    assume(not bool(bad.all()))  # (nothing finite: the next test)
    point, reference = _lsq_point(fmt), _lsq_point(fmt)
    point(x)
    reference(torch.where(bad, 0.0, x))
    assert torch.equal(point.log_step, reference.log_step)
    assert point.learned_step.step_ready == reference.learned_step.step_ready
    assert torch.isfinite(point.step) and point.step > 0


@settings(max_examples=30)
@given(fmt=st.sampled_from((*ZERO_GRIDS, "int4:midrise")), batch=batches(none_finite=True))
def test_batch_without_finite_values_leaves_the_step_to_the_next(fmt, batch):
    """A first batch with nothing finite leaves the step as it was and unfitted: the
    next batch fits it."""
    x, _ = batch
    point = _lsq_point(fmt)
    before = point.log_step.detach().clone()
    point(x)
    assert torch.equal(point.log_step, before) and not point.learned_step.step_ready
    point(torch.linspace(-1000, 1000, 64).view(16, 4))
    assert point.learned_step.step_ready and point.step > 1


@settings(max_examples=40)
@given(percentile=st.sampled_from([None, 99.0, 90.0]), decay=st.floats(0.0, 0.95),
       data=st.data())
def test_running_range_skips_non_finite_values_and_empty_batches(percentile, decay, data):
    """A running range (min/max or percentile) after batches with non-finite values
    equals the one after the same batches with those values removed, batches with
    nothing finite left out; it stays finite."""
    observer = RangeObserver(decay=decay, percentile=percentile).train()
    reference = RangeObserver(decay=decay, percentile=percentile).train()
    for _ in range(data.draw(st.integers(1, 4))):
        x, bad = data.draw(batches(none_finite=data.draw(st.booleans())))
        observer(x)
        if not bool(bad.all()):
            reference(x[~bad])
    assert torch.equal(observer.running, reference.running)
    assert torch.equal(observer.seen, reference.seen)
    assert bool(torch.isfinite(observer.running).all())


def _learned_point(num_nodes: int) -> QuantPoint:
    config = QuantConfig("int8", scale="tensor", range="lsq",
                         node_bits=NodeBits.learned_init(num_nodes, 4.0))
    return QuantPoint(config, "lin").train()


def _expected_ranges(x: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    return torch.where(bad, -math.inf, x.abs()).amax(1)


@settings(max_examples=40)
@given(batch=batches(rows=8), again=batches(rows=8))
def test_recorded_node_ranges_count_finite_values_only(batch, again):
    """Each node's recorded range is the largest finite |value| of its rows (-inf: none
    yet), over every training batch; never NaN or +inf."""
    point = _learned_point(8)
    expected = torch.full((8,), -math.inf)
    for x, bad in (batch, again):
        point(x)
        expected = torch.maximum(expected, _expected_ranges(x, bad))
    assert torch.equal(point.node_widths.seen_range, expected)
    seen = point.node_widths.seen_range
    assert not bool(torch.isnan(seen).any() | (seen == math.inf).any())


@settings(max_examples=30)
@given(batch=batches(rows=10, cols=3))
def test_recorded_ranges_of_messages_count_finite_messages_only(batch):
    """At a message site a node's range is the largest finite |value| of the messages it
    receives; a node that receives none (or only non-finite ones) stays unseen."""
    x, bad = batch
    target = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3, 3, 3])
    point = _learned_point(5)
    point(x, row_nodes=target)
    per_message = _expected_ranges(x, bad)
    expected = torch.full((5,), -math.inf).scatter_reduce(0, target, per_message, "amax")
    assert torch.equal(point.node_widths.seen_range, expected)


@settings(max_examples=30)
@given(fmt=st.sampled_from(ZERO_GRIDS), batch=batches(), learned=st.booleans())
def test_nan_values_add_nothing_to_the_step_and_bit_gradients(fmt, batch, learned):
    """The gradients of the learned step and bit-widths with NaN values equal those with
    the NaN values made 0 (no rounding error there), so they stay finite."""
    x, bad = batch
    nan = bad & torch.isnan(x)
    grads = []
    for values in (x, torch.where(nan, 0.0, x)):
        torch.manual_seed(0)
        if learned:
            point = QuantPoint(QuantConfig(fmt if fmt.startswith("int") else "int4",
                                           scale="tensor", range="lsq",
                                           node_bits=NodeBits.learned_init(x.shape[0], 3.0)),
                               "lin").train()
        else:
            point = _lsq_point(fmt)
        point.learned_step.step_ready = True  # the same step for both
        out = point(values.clone().requires_grad_())
        out.nan_to_num(0.0, 0.0, 0.0).mul(torch.linspace(-1, 1, out.numel()).view_as(out)) \
            .sum().backward()
        grads.append([p.grad.clone() for p in point.parameters()])
    for got, want in zip(*grads, strict=True):
        assert torch.equal(got, want) and bool(torch.isfinite(got).all())


@settings(max_examples=15)
@given(lr=st.sampled_from([1e2, 1e4, 1e7]), sign=st.sampled_from([-1.0, 1.0]),
       learned=st.booleans())
def test_huge_learning_rates_keep_steps_finite_and_positive(lr, sign, learned):
    """Whatever an optimizer does to log_step, the step used stays finite and positive,
    an exact 0 rounds to 0, and the step can come back."""
    node_bits = NodeBits.learned_init(6, 4.0) if learned else None
    config = QuantConfig("int4", scale="tensor", range="lsq", node_bits=node_bits)
    gm = fxquant.transform(nn.Sequential(nn.Linear(3, 3)),
                           fxquant.QuantMapping().set_name("0", config), lint="off")
    point = gm.get_submodule("_0_quant")
    optimizer = torch.optim.SGD(gm.parameters(), lr=lr)
    for _ in range(3):
        optimizer.zero_grad()
        (sign * gm(torch.randn(6, 3)).square().sum()).backward()
        optimizer.step()
    with torch.no_grad():
        point.log_step.fill_(sign * 1e5)
    assert torch.isfinite(point.step) and point.step > 0
    zero = point(torch.zeros(6, 3))
    assert torch.equal(zero, torch.zeros(6, 3))
    out = point(torch.randn(6, 3, requires_grad=True))
    assert bool(torch.isfinite(out).all())
    out.sum().backward()
    assert bool(torch.isfinite(point.log_step.grad))


def test_reported_first_batch_with_inf_or_nan():
    """One inf in the first training batch made the step inf (every later output NaN);
    one NaN pinned it at 0.001 whatever the data's scale."""
    config = QuantConfig("int8", scale="tensor", range="lsq")
    torch.manual_seed(0)
    x = torch.randn(32, 4) * 100
    clean = _lsq_point("int8")
    clean(x)
    for value in (math.inf, math.nan):
        point = QuantPoint(config, "lin").train()
        x_bad = x.clone()
        x_bad[3, 1] = value
        point(x_bad)
        assert math.isfinite(float(point.step)) and float(point.step) > 0.1
        assert bool(torch.isfinite(point(torch.randn(8, 4))).all())
    assert float(clean.step) > 0.1


def test_reported_nan_batch_keeps_node_ranges_and_eval_bits():
    """One NaN batch made a node's recorded range NaN for good, so in evaluation it took
    another node's width."""
    point = _learned_point(4)
    with torch.no_grad():
        point.node_widths.bits.copy_(torch.tensor([2.0, 3.0, 5.0, 8.0]))
    point(torch.tensor([[1.0], [2.0], [3.0], [4.0]]))
    point(torch.tensor([[math.nan], [1.0], [math.nan], [1.0]]))
    assert torch.equal(point.node_widths.seen_range, torch.tensor([1.0, 2.0, 3.0, 4.0]))
    point.eval()
    point(torch.tensor([[1.0], [2.0], [3.0], [4.0]]))
    bits, _ = point.__dict__["last_widths"]
    assert bits.tolist() == [2.0, 3.0, 5.0, 8.0]


def test_reported_step_of_zero_keeps_zero_inputs_zero():
    """A step driven to 0 turned an exact 0 input into NaN."""
    point = _lsq_point("int4")
    point(torch.randn(8, 3))
    with torch.no_grad():
        point.log_step.fill_(-1e4)
    assert torch.equal(point(torch.zeros(2, 3)), torch.zeros(2, 3))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_fp16_activations_with_overflow(dtype):
    """Half-precision activations that overflowed to inf in the first batch still fit a
    finite step on the finite ones."""
    x = (torch.randn(64, 8) * 10).to(dtype)
    x[0, 0] = math.inf
    point = _lsq_point("int8")
    y = point(x)
    assert torch.isfinite(point.step) and point.step > 0
    assert bool(torch.isfinite(y[1:]).all())


def test_the_fit_flag_is_not_saved_and_older_pickles_get_it():
    """``step_found`` (what a compiled fit found) stays out of the state dict, so
    checkpoints load either way, and a point pickled before it existed gets it back."""
    import pickle

    point = _lsq_point("int4")
    assert not any(key.endswith("step_found") for key in point.state_dict())
    again = pickle.loads(pickle.dumps(point))
    assert float(again.learned_step.step_found) == 1.0
    assert not any(key.endswith("step_found") for key in again.state_dict())
    again(torch.randn(6, 3))
    assert again.learned_step.step_ready and again.learned_step.step_fitted
    plain = QuantPoint(QuantConfig("int4", scale="tensor"), "lin")
    assert pickle.loads(pickle.dumps(plain)).learned_step is None


@settings(max_examples=40)
@given(scale=st.sampled_from(["tensor", "row"]), bits=st.sampled_from([2.0, 4.0, 7.0]),
       batch=batches(rows=6, cols=5))
def test_per_node_bits_with_a_min_max_scale_keep_finite_values_finite(scale, bits, batch):
    """Per-node bit-widths with a min/max scale take the scale from finite values: an
    infinity or a NaN among the values turns no finite value NaN, and the finite values
    round as they would with the non-finite ones left out (made 0)."""
    x, bad = batch
    config = QuantConfig("int8", scale=scale, node_bits=NodeBits(torch.full((6,), bits)))
    point, reference = QuantPoint(config, "lin").eval(), QuantPoint(config, "lin").eval()
    y = point(x)
    assert not bool((torch.isnan(y) & ~bad).any())
    assert torch.equal(y[~bad], reference(torch.where(bad, 0.0, x))[~bad])
