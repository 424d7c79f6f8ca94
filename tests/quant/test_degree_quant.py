"""Degree-Quant's switches as general features: one protective mask per layer, messages
following their source, ranges over unprotected rows, the widening stored range, the
clipped gradient, the linear and edge sites, and the recipe that turns them all on."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch_geometric.nn import GATConv, GCNConv, GINConv, GraphConv, SimpleConv
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.nn.models import GAT, GCN, GIN
from torch_geometric.utils import add_self_loops, remove_self_loops, scatter

import fxquant
from fxquant import QuantConfig, QuantMapping
from fxquant.quant.config import Protection
from fxquant.quant.observers import RangeObserver
from fxquant.quant.points import QuantPoint
from tests.quant.test_sites import One, graph_data
from tests.support.copies import python_copy
from tests.support.models import tiny_graph

SEVEN = ["input", "weight", "linear", "edge", "message", "aggregate", "output"]


def star_graph(num_nodes: int = 40, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Node 0 receives from everyone (the highest in-degree: protected with probability
    ``p_max``); the others form a ring."""
    g = torch.Generator().manual_seed(seed)
    src = list(range(1, num_nodes)) + list(range(num_nodes))
    dst = [0] * (num_nodes - 1) + [(i + 1) % num_nodes for i in range(num_nodes)]
    return torch.randn(num_nodes, 6, generator=g), torch.tensor([src, dst])


def protected_rows(point: QuantPoint, gm: nn.Module, *args: object) -> torch.Tensor:
    """The rows ``point`` left unrounded in one training forward (an int2 grid changes
    every row of random values)."""
    seen = {}

    def hook(module, inputs, out):
        seen["rows"] = (inputs[0] == out).flatten(1).all(1)

    handle = point.register_forward_hook(hook)
    try:
        gm(*args)
    finally:
        handle.remove()
    return seen["rows"]


# -- Protection --------------------------------------------------------------------------


def test_protection_reads_and_writes_like_the_tuple():
    p = Protection(0.0, 0.2)
    assert p == (0.0, 0.2) and tuple(p) == (0.0, 0.2) and p[1] == 0.2 and len(p) == 2
    assert QuantConfig("int8", scale="tensor", protect=(0, 0.2)).protect == p
    assert p.to_dict() == [0.0, 0.2]
    full = Protection(0.1, 0.3, share="layer", messages="source", ranges="unprotected")
    assert Protection.from_dict(full.to_dict()) == full and full != p
    config = QuantConfig("int8:asym", scale="tensor", protect=full)
    assert QuantConfig.from_dict(config.to_dict()) == config
    assert pickle.loads(pickle.dumps(config)) == config
    assert "layer mask, messages by source, ranges over unprotected rows" in config.describe()
    old = {"format": "int8", "scale": "tensor", "protect": [0.0, 0.2]}  # an older file
    assert QuantConfig.from_dict(old).protect == Protection(0.0, 0.2, "point", "target", "all")


@pytest.mark.parametrize("kwargs, match", [
    ({"share": "graph"}, "share='graph' is not one of"),
    ({"messages": "both"}, "messages='both'"),
    ({"ranges": "some"}, "ranges='some'"),
    ({"p_max": 1.5}, "0 <= p_min <= p_max <= 1"),
])
def test_protection_refuses_bad_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Protection(**{"p_min": 0.0, "p_max": 0.2, **kwargs})


def test_unprotected_ranges_need_a_range_to_take():
    with pytest.raises(ValueError, match="ranges='unprotected'"):
        QuantConfig("int4", scale="tensor", range="lsq",
                    protect=Protection(0, 0.2, ranges="unprotected"))


def _io_model(share: str) -> tuple[nn.Module, QuantPoint, QuantPoint]:
    config = QuantConfig("int2:asym", scale="tensor", protect=Protection(0.5, 0.5, share=share))
    mapping = QuantMapping().set_name("layer", config, site="input") \
        .set_name("layer", config, site="output")
    gm = fxquant.transform(One(GraphConv(6, 6)), mapping)
    return gm, gm.get_submodule("layer_input_quant"), gm.get_submodule("layer_quant")


@pytest.mark.parametrize("share", ["layer", "point"])
def test_one_mask_per_layer_is_shared_by_its_points(share):
    """share='layer': the input and output points of a layer protect the same nodes in a
    forward (and a new set in the next one); share='point': each draws its own."""
    torch.manual_seed(0)
    x, ei = star_graph()
    gm, inp, out = _io_model(share)
    draws = []
    for _ in range(3):
        seen = {}
        hooks = [p.register_forward_hook(lambda m, a, o, p=p, seen=seen: seen.__setitem__(
            p, (a[0] == o).flatten(1).all(1))) for p in (inp, out)]
        gm(x, ei)
        for h in hooks:
            h.remove()
        draws.append(seen)
        assert 0 < int(seen[inp].sum()) < x.shape[0]
    same = [torch.equal(d[inp], d[out]) for d in draws]
    assert all(same) if share == "layer" else not any(same)
    assert not torch.equal(draws[0][inp], draws[1][inp])  # a new draw per forward
    if share == "layer":
        masks = gm.get_submodule("fxquant_masks")
        assert list(masks.masks) == ["layer"]
        assert not copy.deepcopy(gm).get_submodule("fxquant_masks").masks  # not state
        gm.eval()
        gm(x, ei)  # evaluation: nothing protected, nothing drawn
        assert protected_rows(inp, gm, x, ei).sum() == 0


class Held(nn.Module):
    """A forward without arguments: the graph, held in buffers."""

    def __init__(self):
        super().__init__()
        self.layer = GraphConv(6, 6)
        x, ei = star_graph()
        self.register_buffer("x", x)
        self.register_buffer("ei", ei)

    def forward(self):
        return self.layer(self.x, self.ei)


@pytest.mark.parametrize("route", ["pickle", "torch.save", "deepcopy", "no-arguments"])
def test_a_copy_draws_a_new_layer_mask_every_forward(route):
    """A pickled GraphModule is re-traced; the call that empties the layer masks at the
    start of a forward must survive it (it vanished, and every later training forward
    reused the first forward's mask), also for a forward without arguments."""
    x, ei = star_graph()
    gm, _, _ = _io_model("layer")
    if route == "no-arguments":
        config = QuantConfig("int2:asym", scale="tensor", protect=Protection(0.5, 0.5, share="layer"))
        gm = fxquant.transform(Held(), QuantMapping().set_name("layer", config, site="input")
                               .set_name("layer", config), lint="off")
        x, ei, route = (), None, "pickle"
    again = python_copy(gm, route)
    assert "new_masks" in again.code
    args = (x, ei) if ei is not None else ()
    for seed in (1, 2, 3):
        torch.manual_seed(seed)
        expected = gm(*args)
        torch.manual_seed(seed)
        assert torch.equal(again(*args), expected)


class SumConv(nn.Module):
    """GraphConv's messages without self-loops: message ``e`` is ``x[edge_index[0, e]]``."""

    def __init__(self):
        super().__init__()
        self.conv = GraphConv(6, 6, aggr="add")

    def forward(self, x, edge_index):
        return self.conv(x, edge_index)


@pytest.mark.parametrize("messages", ["source", "target"])
def test_messages_follow_the_node_their_protection_says(messages):
    torch.manual_seed(1)
    x, ei = star_graph()
    protect = Protection(0.5, 0.5, share="layer", messages=messages)
    config = QuantConfig("int2:asym", scale="tensor", protect=protect)
    mapping = QuantMapping().set_name("conv", config, site="output") \
        .set_name("conv", config, site="message")
    gm = fxquant.transform(SumConv(), mapping)
    seen = {}
    for name in ("conv_quant", "conv_message_quant"):
        gm.get_submodule(name).register_forward_hook(
            lambda m, a, o, name=name: seen.__setitem__(name, (a[0] == o).flatten(1).all(1)))
    gm(x, ei)
    nodes = seen["conv_quant"]  # the layer's mask, at its output
    by = ei[0] if messages == "source" else ei[1]
    assert torch.equal(seen["conv_message_quant"], nodes[by])
    assert not torch.equal(nodes[ei[0]], nodes[ei[1]])  # the two rules differ here


def test_ranges_leave_the_protected_rows_out():
    """The hub holds a huge value; in a forward where it is protected, a range over every
    row includes it and rounds the other rows on a coarse grid, a range over the
    unprotected rows does not."""
    x, ei = star_graph()
    x[0] = 1000.0
    for seed in range(50):
        errors = {}
        for rows in ("all", "unprotected"):
            protect = Protection(0.5, 0.5, share="layer", ranges=rows)
            config = QuantConfig("int8:asym", scale="tensor", protect=protect)
            gm = fxquant.transform(One(GraphConv(6, 6)), QuantMapping().set_name(
                "layer", config, site="input"))
            got = []
            gm.get_submodule("layer_input_quant").register_forward_hook(
                lambda m, a, o, got=got: got.append(o.detach()))
            torch.manual_seed(seed)
            gm(x, ei)
            kept = (got[0] == x).all(1)
            rounded = ~kept
            errors[rows] = (bool(kept[0]), float((got[0] - x)[rounded].abs().max()),
                            float(x[rounded].max() - x[rounded].min()) / 255)
        if errors["all"][0]:  # the hub was protected (the same draw on both sides)
            assert errors["unprotected"][0]
            assert errors["unprotected"][1] <= errors["unprotected"][2] / 2 + 1e-6
            assert errors["all"][1] > 1000 / 255 / 4
            return
    pytest.fail("the hub was never protected")


def test_a_pair_of_one_tensor_draws_one_layer_mask():
    """conv((x, x), edge_index) is a layer over one node set: Protection(share="layer")
    draws one mask over its nodes, which the messages follow."""
    torch.manual_seed(0)
    protect = Protection(0.0, 0.2, share="layer")

    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GraphConv((6, 6), 6)

        def forward(self, x, edge_index):
            return self.conv((x, x), edge_index)

    config = QuantConfig("int8:asym", scale="tensor", protect=protect)
    gm = fxquant.transform(Pair(), QuantMapping().set_name("conv", config, site="message"))
    assert gm(*star_graph()).shape == (40, 6)
    assert list(gm.fxquant_masks.masks) == ["conv"]


class _Bipartite(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = GraphConv((6, 6), 6)

    def forward(self, x_src, x_dst, edge_index):
        return self.conv((x_src, x_dst), edge_index)


@pytest.mark.parametrize(("num_src", "num_dst"), [(3, 7), (7, 3)])
def test_a_bipartite_input_protects_each_part_by_its_own_nodes(num_src, num_dst):
    """The input site of a (source, target) pair of node sets has a point per part: the
    target rows are drawn by the target side's in-degree, the source rows by the source
    side's out-degree (p = (0, 1): exactly the nodes with the highest degree on each side
    are sure to be kept; a node of degree 0 has p = 0 only where every node has it)."""
    config = QuantConfig(8, protect=(0.0, 1.0))
    gm = fxquant.transform(_Bipartite(), QuantMapping().set_name("conv", config, site="input"))
    points = dict(fxquant.quantization_points(gm))
    assert (points["conv_input_quant"].part, points["conv_input_source_quant"].part) == \
        ("target", "source")
    g = torch.Generator().manual_seed(0)
    x_src, x_dst = torch.randn(num_src, 6, generator=g), torch.randn(num_dst, 6, generator=g)
    edge_index = torch.stack([torch.randint(0, num_src, (12,), generator=g),
                              torch.randint(0, num_dst, (12,), generator=g)])
    seen = {}
    for name in ("conv_input_quant", "conv_input_source_quant"):
        protection = points[name].protection
        protection.draw = lambda degree, name=name, draw=protection.draw: (
            seen.setdefault(name, degree), draw(degree))[1]
    gm.train()(x_src, x_dst, edge_index)
    assert torch.equal(seen["conv_input_quant"],
                       torch.bincount(edge_index[1], minlength=num_dst).float())
    assert torch.equal(seen["conv_input_source_quant"],
                       torch.bincount(edge_index[0], minlength=num_src).float())


# -- the widening stored range ---------------------------------------------------------------


def test_widening_range_is_kept_and_used_in_evaluation():
    obs = RangeObserver(widen=True)
    assert torch.equal(obs(torch.tensor([1.0, -2.0])), torch.tensor([-2.0, 1.0]))
    assert torch.equal(obs(torch.tensor([3.0, 0.0])), torch.tensor([-2.0, 3.0]))  # widened
    assert torch.equal(obs(torch.tensor([0.5, 0.1])), torch.tensor([-2.0, 3.0]))  # kept
    assert torch.equal(obs(torch.tensor([float("nan"), 9.0, -1.0]),
                           exclude=torch.tensor([False, True, False])),
                       torch.tensor([-2.0, 3.0]))  # the excluded 9 is left out
    obs.eval()
    assert torch.equal(obs(torch.tensor([100.0])), torch.tensor([-2.0, 3.0]))
    fresh = RangeObserver(widen=True)
    fresh.load_state_dict(obs.state_dict())
    assert torch.equal(fresh.eval()(torch.tensor([7.0])), torch.tensor([-2.0, 3.0]))


@pytest.mark.parametrize("shape", [(3000, 700), (50, 7), (40, 3, 5), (9,)])
@pytest.mark.parametrize("percentile", [None, 99.0])
def test_excluded_rows_are_left_out_of_every_range(shape, percentile):
    """Leaving rows out is the same as making them NaN (which ranges skip), for sampled
    percentiles of large tensors too."""
    torch.manual_seed(0)
    exclude = torch.rand(shape[0]) < 0.3
    x = torch.randn(shape) * (1 + 9 * exclude.view((-1,) + (1,) * (len(shape) - 1)))
    nan = torch.where(exclude.view((-1,) + (1,) * (x.dim() - 1)), float("nan"), x)
    assert torch.equal(RangeObserver(percentile=percentile)(x, exclude),
                       RangeObserver(percentile=percentile)(nan))
    assert not torch.equal(RangeObserver(percentile=percentile)(x, exclude),
                           RangeObserver(percentile=percentile)(x))


@pytest.mark.parametrize("kwargs, match", [
    ({"observe": "ema"}, "give its decay"),
    ({"observe": "widen", "decay": 0.9}, "drop one of them"),
    ({"observe": "widen", "range": "lsq"}, "observe='widen'"),
    ({"observe": "sometimes"}, "not one of"),
])
def test_observe_refuses_what_it_cannot_keep(kwargs, match):
    with pytest.raises(ValueError, match=match):
        QuantConfig("int8", scale="tensor", **kwargs)


def test_observe_is_saved_and_old_configs_read_as_before():
    config = QuantConfig("int8", scale="tensor", observe="widen")
    assert QuantConfig.from_dict(config.to_dict()) == config
    assert "observe" not in QuantConfig("int8", scale="tensor").to_dict()
    assert QuantConfig("int8", scale="tensor", decay=0.9).observe == "ema"
    assert QuantConfig.from_dict({"format": "int8", "scale": "tensor"}).observe == "batch"


# -- the clipped gradient --------------------------------------------------------------------


def test_clipped_gradient_is_zero_on_and_beyond_the_end_codes():
    """Range [-1, 2] on int4:asym: step 0.2, zero point 5; -1 is code 0 and 2 code 15 (the
    end codes: no gradient), 3 lies beyond; the rest pass straight through."""
    point = QuantPoint(QuantConfig("int4:asym", scale="tensor", grad="clipped"), "layer")
    x = torch.tensor([-1.0, 0.0, 0.5, 1.5, 2.0], requires_grad=True)
    point(x).sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]
    ste = QuantPoint(QuantConfig("int4:asym", scale="tensor"), "layer")
    y = x.detach().clone().requires_grad_()
    out = ste(y)
    out.sum().backward()
    assert y.grad.tolist() == [1.0] * 5
    assert torch.equal(out, point(x.detach()))  # the same values


def test_clipped_gradient_per_row_and_symmetric():
    point = QuantPoint(QuantConfig("int8", scale="row", grad="clipped"), "layer")
    x = torch.tensor([[1.0, 0.5, -1.0], [4.0, -2.0, 0.0]], requires_grad=True)
    point(x).sum().backward()
    # symmetric int8: the row's max is code 127 (the last code), -max is -127 (not -128)
    assert x.grad.tolist() == [[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]]


@pytest.mark.parametrize("kwargs", [{"format": "e4m3", "scale": "tensor"},
                                    {"format": "int4", "scale": "tensor", "range": "lsq"},
                                    {"format": "int4"}])
def test_clipped_gradient_needs_an_integer_grid_with_a_range(kwargs):
    with pytest.raises(ValueError, match="grad='clipped'"):
        QuantConfig(grad="clipped", **kwargs)


def test_the_rounding_functions_refuse_the_clipped_rule():
    with pytest.raises(ValueError, match="rule of a quantization point"):
        fxquant.quantize(torch.ones(3), "int8", scale="tensor", grad="clipped")
    with pytest.raises(ValueError, match="rule of a quantization point"):
        fxquant.truncate(torch.ones(3), 8, grad="clipped")


# -- the linear and edge sites --------------------------------------------------------------


def _inputs_of(gm, names):
    seen = {}
    for name in names:
        gm.get_submodule(name).register_forward_hook(
            lambda m, a, o, name=name: seen.__setitem__(name, a[0].detach()))
    return seen


def test_linear_and_edge_sites_of_gcn_are_xw_and_the_coefficients():
    torch.manual_seed(0)
    x, ei = graph_data()
    conv = GCNConv(4, 8)
    config = QuantConfig("int8:asym", scale="tensor")
    mapping = QuantMapping().set_name("layer", config, site="linear") \
        .set_name("layer", config, site="edge")
    gm = fxquant.transform(One(conv), mapping)
    seen = _inputs_of(gm, ["layer_linear_lin_quant", "layer_edge_quant"])
    out = gm(x, ei)
    assert torch.allclose(seen["layer_linear_lin_quant"], x @ conv.lin.weight.T)
    _, weight = gcn_norm(ei, None, x.shape[0], add_self_loops=True)
    assert torch.allclose(seen["layer_edge_quant"], weight)
    assert not torch.allclose(out, One(conv)(x, ei))
    out.sum().backward()
    assert conv.lin.weight.grad is None and gm.layer.lin.weight.grad.abs().sum() > 0


def test_edge_site_of_gat_rounds_the_attention_coefficients():
    torch.manual_seed(0)
    x, ei = graph_data()
    gm = fxquant.transform(One(GATConv(4, 4, heads=2)), QuantMapping().set_name(
        "layer", QuantConfig("uint4", scale="tensor"), site="edge"))
    seen = _inputs_of(gm, ["layer_edge_quant"])
    gm.eval()
    gm(x, ei)
    alpha = seen["layer_edge_quant"]
    assert alpha.shape[1] == 2 and float(alpha.min()) >= 0 and float(alpha.max()) <= 1
    # a softmax over each target's incoming edges (self-loops added by GATConv)
    full, _ = add_self_loops(remove_self_loops(ei)[0], num_nodes=x.shape[0])
    assert torch.allclose(scatter(alpha, full[1], 0, reduce="sum"), torch.ones(x.shape[0], 2),
                          atol=1e-5)


@pytest.mark.parametrize("layer, site, match", [
    (lambda: GINConv(nn.Sequential(nn.Linear(4, 4))), "edge", "takes no per-edge argument"),
    (lambda: SimpleConv(), "linear", "has no linear transform"),
])
def test_sites_with_nothing_to_round_are_errors(layer, site, match):
    with pytest.raises(ValueError, match=match):
        fxquant.transform(One(layer()), QuantMapping().set_name(
            "layer", QuantConfig("int8", scale="tensor"), site=site))


def test_protection_inside_a_layer_needs_the_layers_mask():
    config = QuantConfig("int8:asym", scale="tensor", protect=(0.0, 0.2))
    with pytest.raises(ValueError, match="share='layer'"):
        fxquant.transform(One(GCNConv(4, 8)), QuantMapping().set_name(
            "layer", config, site="linear"))


# -- the recipe ------------------------------------------------------------------------------


def _sites(gm):
    return {(p.layer, p.site.value) for _, p in fxquant.quantization_points(gm)}


@pytest.mark.parametrize("cls", [GCN, GAT, GIN])
def test_recipe_rounds_every_tensor_of_pyg_models(cls, tmp_path):
    torch.manual_seed(0)
    data = tiny_graph(num_nodes=10, in_channels=4, seed=3)
    run = fxquant.recipes.get("degree-quant", bits=4).prepare(
        cls(4, 8, num_layers=2, out_channels=3), data)
    gm = run.model
    expected = set(SEVEN) - ({"edge"} if cls is GIN else set())
    assert _sites(gm) == {(f"convs.{i}", s) for i in range(2) for s in expected}
    for _, point in fxquant.quantization_points(gm):
        c = point.config
        assert (c.format.spec(), c.range, c.observe, c.grad.value) == \
            ("int4:asym", "percentile:99.9", "widen", "clipped")
        assert (c.protect is None) == (point.site.value == "weight")
        if c.protect is not None:
            assert (c.protect.share, c.protect.messages, c.protect.ranges) == \
                ("layer", "source", "unprotected")
    out = gm(data.x, data.edge_index)
    out.sum().backward()
    gm.eval()
    first = gm(data.x, data.edge_index)
    assert torch.equal(first, gm(data.x, data.edge_index))  # the stored ranges: no drift
    fxquant.save(gm, tmp_path / "dq.pt")
    loaded = fxquant.load(tmp_path / "dq.pt", cls(4, 8, num_layers=2, out_channels=3)).eval()
    assert torch.equal(loaded(data.x, data.edge_index), first)
    assert torch.equal(pickle.loads(pickle.dumps(gm))(data.x, data.edge_index), first)


def test_recipe_settings_are_checked():
    with pytest.raises(ValueError, match="bits must be"):
        fxquant.recipes.DegreeQuant(bits=1)
    with pytest.raises(ValueError, match="grad must be"):
        fxquant.recipes.DegreeQuant(grad="zero")
    with pytest.raises(ValueError, match="p_min <= p_max"):
        fxquant.recipes.DegreeQuant(protect=(0.5, 0.1))
    recipe = fxquant.recipes.DegreeQuant(bits=8, protect=None, percentile=None)
    gm = recipe.prepare(GCN(4, 8, num_layers=2, out_channels=3)).model
    assert {p.config.range for _, p in fxquant.quantization_points(gm)} == {"minmax"}
    assert all(p.config.protect is None for _, p in fxquant.quantization_points(gm))


@pytest.mark.slow
def test_recipe_compiles_and_follows_eager():
    """torch.compile of the faithful recipe: evaluation equals eager, and training with a
    deterministic mask (p = 1: every node protected; p = 0: none) too."""
    torch.manual_seed(0)
    data = tiny_graph(num_nodes=12, in_channels=4, seed=3)
    for protect in ((0.0, 0.0), (1.0, 1.0)):
        torch.manual_seed(0)
        gm = fxquant.recipes.DegreeQuant(bits=4, protect=protect).prepare(
            GCN(4, 8, num_layers=2, out_channels=3), data).model
        twin = copy.deepcopy(gm)
        compiled = torch.compile(twin)
        for _ in range(2):
            eager_out = gm(data.x, data.edge_index)
            compiled_out = compiled(data.x, data.edge_index)
            assert torch.allclose(eager_out, compiled_out, atol=1e-5)
        gm.eval(), twin.eval()
        assert torch.allclose(gm(data.x, data.edge_index), compiled(data.x, data.edge_index),
                              atol=1e-5)


def test_edge_site_without_edge_values_says_so():
    """A layer called without per-edge values, or with an adjacency that hides them: the
    edge site warns (nothing to round) or raises (cannot see them), never rounds nothing
    silently."""
    x, ei = graph_data()
    gm = fxquant.transform(One(GraphConv(4, 8)), QuantMapping().set_name(
        "layer", QuantConfig("int8", scale="tensor"), site="edge"))
    with pytest.warns(UserWarning, match="found no floating per-edge argument"):
        gm(x, ei)
    gcn = fxquant.transform(One(GCNConv(4, 8)), QuantMapping().set_name(
        "layer", QuantConfig("int8", scale="tensor"), site="edge"))
    adjacency = torch.sparse_coo_tensor(ei, torch.ones(ei.shape[1]), (10, 10))
    with pytest.raises(RuntimeError, match="not a \\[2, num_edges\\] edge_index"):
        gcn(x, adjacency)


@pytest.mark.parametrize("q", [50.5, 90.0, 99.0, 99.9, 100.0])
@pytest.mark.parametrize("n", [1, 2, 7, 1000, 70000, 200000])
@pytest.mark.parametrize("kind", ["normal", "ties", "nan", "all-nan"])
def test_percentile_bounds_are_nanquantile_of_the_sample(q, n, kind):
    """The bounds read off the ends of the sample equal torch.nanquantile (interpolation
    'lower') of the strided sample, bit for bit, with ties and non-finite values."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) if kind != "ties" else \
        torch.randint(0, 3, (n,), generator=g).float()
    if kind == "nan":
        x[torch.rand(n, generator=g) < 0.5] = float("nan")
        x[torch.rand(n, generator=g) < 0.1] = float("inf")
    if kind == "all-nan":
        x[:] = float("nan")
    sample = x[:: max(1, -(-n // (1 << 16)))]
    sample = torch.where(torch.isfinite(sample), sample, float("nan"))
    expected = torch.nanquantile(sample, torch.tensor([1 - q / 100, q / 100]),
                                 interpolation="lower").nan_to_num(0.0)
    assert torch.equal(fxquant.quant.observers.percentile_bounds(x, q), expected)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 5000), k_frac=st.floats(0.0, 0.05), values=st.sampled_from(
    ["normal", "ties", "inf"]), largest=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_top_values_are_topk_values(n, k_frac, values, largest, seed):
    """The grouped selection returns exactly topk's sorted values, with ties, infinities
    and sizes that do not divide into groups."""
    from fxquant.quant.observers import _top_values

    g = torch.Generator().manual_seed(seed)
    v = torch.randint(0, 4, (n,), generator=g).float() if values == "ties" else \
        torch.randn(n, generator=g)
    if values == "inf":
        v[torch.rand(n, generator=g) < 0.3] = -float("inf") if largest else float("inf")
        v[torch.rand(n, generator=g) < 0.01] = float("inf") if largest else -float("inf")
    k = max(1, min(n, int(k_frac * n)))
    assert torch.equal(_top_values(v, k, largest), v.topk(k, largest=largest).values)


def test_linear_site_skips_linears_used_without_being_called():
    """MultiheadAttention reads out_proj.weight without calling out_proj (a Linear
    subclass): neither its output nor its weight is rounded through a call that never
    happens; its weight stays with the layer's own forward."""
    from fxquant.quant.sites import linears_of

    assert linears_of(nn.MultiheadAttention(4, 2)) == []
    assert linears_of(GCNConv(4, 8)) == ["lin"]
