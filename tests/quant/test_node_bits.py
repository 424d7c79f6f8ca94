"""Per-node bit-widths (fixed and learned), the bit accounting and the bit penalty."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch_geometric.nn import GCNConv

import fxquant
from fxquant import NodeBits, QuantConfig, QuantMapping
from fxquant.quant.points import QuantPoint
from tests.support.models import TwoLayers, penalty_steps


def test_rows_land_on_their_own_grids_with_a_range():
    """Row r: codes in [-(2^(b_r-1)-1), 2^(b_r-1)-1], step max|x| / qmax_r."""
    bits = torch.tensor([2, 3, 4, 8, 5])
    point = QuantPoint(QuantConfig("int8", scale="tensor", node_bits=NodeBits(bits)), "lin")
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
    y = point(x)
    amax = x.abs().max()
    for r, b in enumerate(bits.tolist()):
        qmax = 2 ** (b - 1) - 1
        step = amax / qmax
        codes = y[r] / step
        torch.testing.assert_close(codes, codes.round(), atol=1e-4, rtol=0)
        assert codes.abs().max() <= qmax + 1e-4
        torch.testing.assert_close(y[r], (x[r] / step).round().clamp(-qmax, qmax) * step)


def test_unsigned_rows_and_a_shared_learned_step():
    """uint rows with a learned step: codes in [0, 2^b - 1], the step shared, so bits set
    each row's range."""
    bits = torch.tensor([1, 2, 3])
    config = QuantConfig("uint8", scale="tensor", range="lsq", node_bits=NodeBits(bits, min_bits=1))
    point = QuantPoint(config, "lin")
    x = torch.rand(3, 50, generator=torch.Generator().manual_seed(1)) * 4
    y = point(x)
    s = point.step.detach()
    for r, b in enumerate(bits.tolist()):
        codes = y[r].detach() / s
        torch.testing.assert_close(codes, codes.round(), atol=1e-4, rtol=0)
        assert codes.min() >= 0 and codes.max() <= 2**b - 1 + 1e-4
    assert y[0].detach().unique().numel() <= 2  # one bit: 0 or s


def test_learned_bits_get_gradient_where_values_clip():
    config = QuantConfig("int8", scale="tensor", range="lsq",
                         node_bits=NodeBits.learned_init(4, 2.0))
    point = QuantPoint(config, "lin")
    x = torch.cat([torch.randn(2, 8) * 0.01, torch.randn(2, 8) * 10])  # two rows clip hard
    point(x).pow(2).sum().backward()
    grad = point.node_widths.bits.grad
    assert grad[2:].abs().min() > grad[:2].abs().max()


def test_penalty_drives_the_average_to_the_target():
    """A toy problem: only the penalty and a reconstruction loss; the average bits of the
    learned rows goes from 6 to the target of 3."""
    torch.manual_seed(0)
    config = QuantConfig("int8", scale="tensor", range="lsq",
                         node_bits=NodeBits.learned_init(32, 6.0))
    mapping = QuantMapping().set_name("0", config)
    gm = fxquant.transform(nn.Sequential(nn.Linear(8, 8)), mapping)
    optimizer = torch.optim.Adam([gm.get_submodule("_0_quant").node_widths.bits], lr=0.05)
    x = torch.randn(32, 8)
    target = gm.get_submodule("0")(x).detach()
    for _ in range(300):
        optimizer.zero_grad()
        out = gm(x)
        loss = 0.01 * (out - target).pow(2).mean() + fxquant.bit_penalty(gm, 3.0)
        loss.backward()
        optimizer.step()
    gm(x)
    assert fxquant.bit_report(gm).avg_bits == pytest.approx(3.0, abs=0.35)


def test_accounting_matches_a_hand_count():
    """5 nodes, 4 edges (+5 self loops = 9 messages). conv1: input int8 per tensor (raw
    input: reported apart), messages with node bits [2,2,4,4,8] (a stored table: 3 bits per
    node, for the seven widths 2..8) and a per-tensor scale (32 bits); conv2 output e2m1
    with a per-row scale."""
    x = torch.randn(5, 3)
    edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    bits = torch.tensor([2, 2, 4, 4, 8])
    mapping = QuantMapping()
    mapping.set_name("conv1", QuantConfig("int8", scale="tensor"), site="input")
    mapping.set_name("conv1", QuantConfig("int8", scale="tensor", node_bits=NodeBits(bits)),
                     site="message")
    mapping.set_name("conv2", QuantConfig("e2m1", scale="row"))
    gm = fxquant.transform(TwoLayers(), mapping)
    report = fxquant.bit_report(gm, x, edge_index)
    by_site = {(s.layer, s.site): s for s in report.sites}
    # messages: targets are edge_index[1] plus one self loop per node
    targets = torch.cat([edge_index[1], torch.arange(5)])
    message_bits = int(bits[targets].sum()) * 4 + 3 * 5 + 32
    assert by_site[("conv1", "message")].values == 9 * 4
    assert by_site[("conv1", "message")].avg_bits == pytest.approx(message_bits / 36)
    assert by_site[("conv1", "message")].histogram == {2: 3, 4: 4, 8: 2}
    output_bits = 4 * 5 * 2 + 32 * 5
    assert by_site[("conv2", "output")].avg_bits == pytest.approx(output_bits / 10)
    assert by_site[("conv1", "input")].raw_input
    assert report.input_bits == pytest.approx((8 * 15 + 32) / 15)
    assert report.avg_bits == pytest.approx((message_bits + output_bits) / (36 + 10))
    assert report.avg_bits_with_input == pytest.approx(
        (message_bits + output_bits + 8 * 15 + 32) / (36 + 10 + 15))
    assert "avg_bits" in str(report)


def test_a_stored_bit_width_costs_a_fixed_length_code():
    """ceil(log2(widths allowed)) bits per node: 3 for 2..8 and 1..8, 1 for one width."""
    from fxquant.quant.bits import bitwidth_bits
    bits = torch.tensor([2, 3])
    assert bitwidth_bits(NodeBits(bits)) == 3
    assert bitwidth_bits(NodeBits(bits, min_bits=1)) == 3
    assert bitwidth_bits(NodeBits(bits, min_bits=2, max_bits=3)) == 1
    assert bitwidth_bits(NodeBits(torch.tensor([3, 3]), min_bits=3, max_bits=3)) == 1
    assert bitwidth_bits(NodeBits(bits, min_bits=1, max_bits=16)) == 4


def test_degree_rule_follows_in_degree_and_needs_no_storage():
    edge_index = torch.tensor([[1, 2, 3, 4, 0, 0], [0, 0, 0, 0, 1, 2]])
    rb = NodeBits.by_degree(edge_index, [0.75], [2, 6], num_nodes=5)
    assert rb.bits.tolist() == [6.0, 2.0, 2.0, 2.0, 2.0] and not rb.stored


def learned_gcn():
    torch.manual_seed(0)
    config = QuantConfig("int8", scale="tensor", range="lsq", node_bits=NodeBits.learned_init(30, 4.0))
    mapping = QuantMapping().set_global(config, site="output").set_global(config, site="message")
    return fxquant.transform(TwoLayers(), mapping)


@pytest.mark.slow
def test_learned_bits_save_load_and_compile(tmp_path):
    gm = learned_gcn()
    x, edge_index = torch.randn(30, 3), torch.randint(0, 30, (2, 90))
    penalty_steps(gm, x, edge_index, steps=5, lr=0.05)
    gm.eval()
    expected = gm(x, edge_index)
    path = tmp_path / "gm.pt"
    fxquant.save(gm, path)
    torch.manual_seed(0)
    loaded = fxquant.load(path, TwoLayers()).eval()
    torch.testing.assert_close(loaded(x, edge_index), expected)
    compiled = torch.compile(gm, fullgraph=True)
    torch.testing.assert_close(compiled(x, edge_index), expected)


def test_unseen_nodes_take_the_bits_of_the_nearest_seen_range():
    """Trained on nodes 0..3 (ranges 1, 2, 4, 8 with bits 2, 3, 5, 7): in eval, a new node
    with range 3.9 takes node 2's bits (5)."""
    config = QuantConfig("int8", scale="tensor", range="lsq",
                         node_bits=NodeBits(torch.tensor([2.0, 3.0, 5.0, 7.0, 4.0, 4.0]),
                                          learned=True))
    point = QuantPoint(config, "lin")
    train = torch.tensor([[1.0, 0.5], [2.0, 0.0], [4.0, -1.0], [8.0, 1.0]])
    context = fxquant.quant.nodes.NodeIds()
    point.attach(context)
    context.ids = torch.arange(4)
    point(train)
    point.eval()
    context.ids = torch.tensor([9, 1])  # node 9: outside the table, never seen
    point(torch.tensor([[3.9, 0.0], [2.0, 0.0]]))
    bits, _ = point.__dict__["last_widths"]
    assert bits.tolist() == [5.0, 3.0]


def test_ranges_of_an_unchanged_input_are_reused_and_follow_in_place_changes():
    """A dataset's features at an input site (the same tensor every step, no gradient): the
    per-node ranges are computed once and reused, also after an evaluation in between; an
    in-place change, another tensor, a NaN (finite values only while training) are seen in
    the next forward. Other sites' tensors are new every forward: never kept."""
    from fxquant.quant import node_widths as points

    config = QuantConfig("int8", scale="tensor", range="lsq",
                         node_bits=NodeBits.learned_init(4, 4.0))
    point = QuantPoint(config, "lin", "input")
    x = torch.tensor([[1.0, 0.5], [2.0, 0.0], [4.0, -1.0], [0.5, 0.25]])
    point(x)
    first = points._ROWS.value
    with torch.no_grad():  # an evaluation in between (its ranges: of all values)
        point.eval()(x)
        point(x * 3)
        point.train()
    point(x)
    assert points._ROWS.value is first  # reused
    points._ROWS.clear()
    QuantPoint(config, "lin", "output")(x)
    assert points._ROWS.value is None
    x[3, 1] = -16.0  # in place
    point(x)
    assert point.node_widths.seen_range.tolist() == [1.0, 2.0, 4.0, 16.0]
    point(x.clone() * 2)  # another tensor
    assert point.node_widths.seen_range.tolist() == [2.0, 4.0, 8.0, 32.0]
    x[0, 0] = float("nan")
    point(x)
    assert torch.equal(points._ROWS.value, torch.tensor([0.5, 2.0, 4.0, 16.0]))
    point.eval()
    with torch.no_grad():
        point(x)  # the range of every value now: NaN for node 0
    assert points._ROWS.value[0].isnan() and points._ROWS.key is False


def test_learned_bits_before_any_training_take_the_table_mean():
    """An eval forward (or a bit report) of a model with learned bit-widths that has not
    trained yet: no node was seen, every row takes the table's mean (it raised IndexError)."""
    gm = learned_gcn().eval()
    with torch.no_grad():
        for m in gm.modules():
            if isinstance(m, QuantPoint) and m.node_widths is not None and m.node_widths.learned:
                m.node_widths.bits.copy_(torch.linspace(2, 8, 30))  # mean 5
    x, edge_index = torch.randn(30, 3), torch.randint(0, 30, (2, 90))
    out = gm(x, edge_index)
    assert torch.isfinite(out).all()
    report = fxquant.bit_report(gm, x, edge_index)
    point = next(m for m in gm.modules()
                 if isinstance(m, QuantPoint) and m.node_widths is not None and m.node_widths.learned)
    bits, _ = point.__dict__["last_widths"]
    assert torch.allclose(bits, torch.full_like(bits, 5.0))
    assert report.avg_bits > 0


@pytest.mark.parametrize("learned", [False, True], ids=["range", "lsq"])
def test_stochastic_rows_are_unbiased_and_stay_on_their_grids(learned):
    """``rounding="stochastic"`` with per-node bits: each row on its own grid, rounded up
    with probability its fraction (the mean error over many draws vanishes, where nearest
    rounding keeps a bias), and with a learned step LSQ's step gradient of the drawn grid
    point, ``q - x / s`` inside the range."""
    bits = torch.tensor([2, 3] * 2000)
    number = "int8:midrise"
    rng = "lsq" if learned else "minmax"
    point = QuantPoint(QuantConfig(number, "stochastic", scale="tensor", range=rng,
                                   node_bits=NodeBits(bits, min_bits=1)), "lin")
    nearest = QuantPoint(QuantConfig(number, scale="tensor", range=rng,
                                     node_bits=NodeBits(bits, min_bits=1)), "lin")
    x = torch.full((bits.numel(), 4), 0.3)
    x[0, 0] = 2.0  # the range (the learned step's start is fitted to it too)
    if learned:  # the step fitted on a first batch, then set where 0.3 lies off the grid
        for p in (point, nearest):
            p(x)
            with torch.no_grad():
                p.log_step.fill_(math.log(0.5))
    torch.manual_seed(0)
    y, y0 = point(x), nearest(x)
    s = (point.step if learned else 2.0 / (2 ** (bits - 1) - 0.5)[:, None]).detach()
    codes = (y.detach() / s - 0.5)[1:]
    torch.testing.assert_close(codes, codes.round(), atol=1e-4, rtol=0)
    err, err0 = (y - x)[1:].detach().mean(), (y0 - x)[1:].detach().mean()
    assert abs(err) < 0.02 < abs(err0)
    assert len(y[1:].detach().unique()) > len(y0[1:].detach().unique())
    if learned:  # both steps' gradients, from rows inside the range: gain * sum(q - x / s)
        y[1:].sum().backward()
        y0[1:].sum().backward()
        step = point.step.detach()
        ratio = ((y - x)[1:].detach() / step).sum() / ((y0 - x)[1:].detach() / step).sum()
        torch.testing.assert_close(point.log_step.grad / nearest.log_step.grad, ratio,
                                   rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("learned", [False, True], ids=["range", "lsq"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stochastic_rows_judge_the_range_before_the_draw(learned, dtype):
    """Near a bound, inside or outside the range is the value's, not the drawn one's: the
    input's gradient is 1 at 6.8 steps and 0 at 7.2 (int4: the largest code 7); a learned
    step's is ``q - x / s`` inside and the bound outside; bfloat16 inputs stay unbiased."""
    n = 4000
    rng = "lsq" if learned else "minmax"
    point = QuantPoint(QuantConfig("int8", "stochastic", scale="tensor", range=rng,
                                   node_bits=NodeBits(torch.full((n,), 4))), "lin")
    if learned:
        point(torch.ones(n, 1))
        with torch.no_grad():
            point.log_step.fill_(0.0)  # step 1 (the minmax step is max|x| / 7 = 1 below)
    # learned: step 1, -7.2 clips; min/max: the step is 7.2 / 7, and -7.1 does not clip
    x = torch.cat([torch.full((n // 2, 1), 6.8), torch.full((n // 2, 1), -7.2 if learned
                                                            else -7.1)])
    x[0, 0] = 7.0 if learned else 7.2
    x = x.to(dtype).requires_grad_()
    torch.manual_seed(0)
    y = point(x)
    y.sum().backward()
    inside, outside = slice(1, n // 2), slice(n // 2, n)
    step = 1.0 if learned else 7.2 / 7  # a range from min/max never clips
    assert abs(float(y[inside].detach().float().mean()) - 6.8) < 0.03 * step  # bfloat16 too
    assert bool((x.grad[inside] == 1).all())
    if not learned:
        assert bool((x.grad[outside] == 1).all())
    else:
        assert bool((x.grad[outside] == 0).all()) and bool((y[outside] == -7).all())
        # gain * (the sum of q - x / s inside and of the bound outside)
        q = y.detach().float()
        d = (q[inside] - x.detach().float()[inside]).sum() + (-7.0) * (n // 2)
        gain = 1.0 / math.sqrt(n * 7)
        torch.testing.assert_close(point.log_step.grad.float(), d * gain, rtol=2e-2,
                                   atol=1e-3)


def test_configuration_errors_name_the_fix():
    with pytest.raises(ValueError, match="integer format"):
        QuantConfig("e4m3", scale="tensor", node_bits=NodeBits(torch.tensor([2, 4])))
    with pytest.raises(ValueError, match="range='lsq'"):
        QuantConfig("int8", scale="tensor", node_bits=NodeBits.learned_init(3))
    with pytest.raises(ValueError, match="at least 2 bits"):
        QuantConfig("int8", scale="tensor", node_bits=NodeBits(torch.tensor([1, 2]), min_bits=1))
    with pytest.raises(ValueError, match="rounding='nearest' or 'stochastic'"):
        QuantConfig("int8", "toward_zero", scale="tensor", node_bits=NodeBits(torch.tensor([2])))
    with pytest.raises(ValueError, match="lie in"):
        NodeBits(torch.tensor([2, 9]))
    with pytest.raises(ValueError, match="whole numbers"):
        NodeBits(torch.tensor([2.5, 3.0]))
    with pytest.raises(ValueError, match="holds no node"):  # (a raw IndexError at forward)
        NodeBits.learned_init(0)
    with pytest.raises(ValueError, match="num_nodes must be >= 1"):  # (quantile() of nothing)
        NodeBits.by_degree(torch.empty(2, 0, dtype=torch.long), [0.9], [2, 4], num_nodes=0)
    config = QuantConfig("int8", scale="tensor", node_bits=NodeBits(torch.tensor([2, 4])))
    with pytest.raises(ValueError, match="weights belong to no node"):
        fxquant.transform(TwoLayers(), QuantMapping().set_name("conv1", config, site="weight"))
    with pytest.raises(ValueError, match="no point has learned"):
        gm = fxquant.transform(TwoLayers(), bits=8)
        gm(torch.randn(4, 3), torch.tensor([[0], [1]]))
        fxquant.bit_penalty(gm, 2.0)


def test_empty_inputs_other_dtypes_and_shared_layers():
    config = QuantConfig("int8", scale="tensor", node_bits=NodeBits(torch.tensor([2, 4, 8])))
    point = QuantPoint(config, "lin")
    assert point(torch.empty(0, 4)).shape == (0, 4)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        assert point(torch.randn(3, 4, dtype=dtype)).dtype == dtype

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GCNConv(3, 3)

        def forward(self, x, edge_index):
            return self.conv(self.conv(x, edge_index), edge_index)

    mapping = QuantMapping().set_global(QuantConfig("int8", scale="tensor"), site="message")
    gm = fxquant.transform(Twice(), mapping)
    points = [n for n, m in gm.named_modules() if isinstance(m, QuantPoint)]
    assert points == ["conv_message_quant"]  # one layer, one set of inner points
    assert fxquant.bit_report(gm, torch.randn(4, 3), torch.tensor([[0, 1], [1, 2]])).avg_bits > 0


def test_block32_storage_and_untrained_running_range():
    gm = fxquant.transform(nn.Sequential(nn.Linear(4, 16)),
                           QuantMapping().set_name("0", QuantConfig("e2m1", scale="block32")))
    report = fxquant.bit_report(gm, torch.randn(10, 4))
    assert report.avg_bits == pytest.approx(4 + 8 / 16)  # one 8-bit scale per row of 16
    point = QuantPoint(QuantConfig("int8", scale="tensor", decay=0.9), "lin").eval()
    x = torch.randn(5, 4)
    torch.testing.assert_close(point(x), fxquant.quantize(x, "int8", scale="tensor"))
    with pytest.raises(ValueError, match="one step per tensor"):
        QuantConfig("int4", scale="row", range="lsq")


@pytest.mark.parametrize("start, target, moves", [
    (1.2, 6.0, True),  # below min_bits, pulled up: back into the range
    (1.2, 2.0, False),  # below, pushed further down: no gradient (the forward is 2 already)
    (9.5, 2.0, True),  # above max_bits, pulled down
    (9.5, 8.0, False),
])
def test_learned_bits_outside_their_range_only_get_gradient_back_in(start, target, moves):
    """An optimizer's momentum can carry a learned bit-width past min_bits / max_bits; a
    plain clamp would then leave it there for good (no gradient), whatever the penalty."""
    config = QuantConfig("int8", scale="tensor", range="lsq",
                         node_bits=NodeBits.learned_init(4, 4.0, min_bits=2, max_bits=8))
    gm = fxquant.transform(nn.Sequential(nn.Linear(3, 64)), QuantMapping().set_name("0", config))
    bits = gm.get_submodule("_0_quant").node_widths.bits
    with torch.no_grad():
        bits[0] = start
    gm(torch.randn(4, 3))
    fxquant.bit_penalty(gm, target).backward()
    grad = float(bits.grad[0])
    assert (grad != 0) is moves
    if moves:  # a descent step moves it toward the range
        assert (start - grad - 5.0) ** 2 < (start - 5.0) ** 2


def test_bit_report_counts_every_call_of_a_point():
    """APPNP rounds its messages on each of its K propagation steps, and a layer called twice
    rounds its weight once but its output twice: the report counts every value rounded
    (each call's scale too), a weight once, and leaves nothing behind."""
    from torch_geometric.nn import APPNP, GCNConv

    class Propagate(torch.nn.Module):
        def __init__(self, k):
            super().__init__()
            self.prop = APPNP(K=k, alpha=0.1)

        def forward(self, x, edge_index):
            return self.prop(x, edge_index)

    x, edge_index = torch.randn(20, 8), torch.randint(0, 20, (2, 60))
    int4 = fxquant.QuantConfig("int4", scale="tensor")
    mapping = fxquant.QuantMapping().set_global(int4, site="message")
    reports = [fxquant.bit_report(fxquant.transform(Propagate(k), mapping, lint="off"),
                                  x, edge_index) for k in (1, 3)]
    one, three = (r.sites[0] for r in reports)
    assert three.values == 3 * one.values > 0
    assert three.value_bits == 3 * one.value_bits and three.storage_bits == 3 * 32
    point = fxquant.transform(Propagate(3), mapping, lint="off")
    fxquant.bit_report(point, x, edge_index)
    assert "calls" not in point.get_submodule("prop_message_quant").__dict__
    point(x, edge_index)
    assert fxquant.bit_report(point).sites[0].values == one.values  # no inputs: the last call

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GCNConv(8, 8)

        def forward(self, x, edge_index, y, other_edges):
            return self.conv(x, edge_index).sum() + self.conv(y, other_edges).sum()

    y, other_edges = torch.randn(7, 8), torch.randint(0, 7, (2, 10))
    gm = fxquant.transform(Twice(), fxquant.QuantMapping().set_global(int4, site="output")
                           .set_global(int4, site="weight"), lint="off")
    sites = fxquant.bit_report(gm, x, edge_index, y, other_edges).sites
    assert sorted(s.values for s in sites if s.site == "output") == [7 * 8, 20 * 8]  # a point a call
    assert [s.values for s in sites if s.site == "weight"] == [8 * 8]  # one tensor, used twice
