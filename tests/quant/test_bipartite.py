"""Layers called with a (source, target) pair of node sets: each value follows the degrees
of the nodes it belongs to (out-degree for sources and the messages that follow them,
in-degree for targets and aggregations), counted by hand here on graphs with more sources
than targets and with fewer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch_geometric.nn import GraphConv, SAGEConv

import fxquant
from fxquant import NodeBits, Protection, QuantConfig, QuantMapping
from fxquant.fx.degree import node_degree

DATA = Path(__file__).parent / "data"
SIZES = [(9, 4), (3, 7)]
IDS = ["more-sources", "fewer-sources"]


def graph(num_src: int, num_dst: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x_src, x_dst = torch.randn(num_src, 6, generator=g), torch.randn(num_dst, 6, generator=g)
    # every source sends and every target receives; source 0 and target 0 most of all
    src = torch.cat([torch.arange(num_src), torch.zeros(5, dtype=torch.long),
                     torch.randint(0, num_src, (10,), generator=g)])
    dst = torch.cat([torch.arange(num_src) % num_dst, torch.zeros(5, dtype=torch.long),
                     torch.randint(0, num_dst, (10,), generator=g)])
    return x_src, x_dst, torch.stack([src, dst])


def by_hand(edge_index: torch.Tensor, num_src: int, num_dst: int):
    """(out-degree of each source, in-degree of each target), counted edge by edge."""
    out_deg, in_deg = [0.0] * num_src, [0.0] * num_dst
    for s, t in edge_index.t().tolist():
        out_deg[s] += 1
        in_deg[t] += 1
    return torch.tensor(out_deg), torch.tensor(in_deg)


class Bipartite(nn.Module):
    def __init__(self, cls=GraphConv):
        super().__init__()
        self.conv = cls((6, 6), 5)

    def forward(self, x_src, x_dst, edge_index, edge_weight=None):
        if edge_weight is None:
            return self.conv((x_src, x_dst), edge_index)
        return self.conv((x_src, x_dst), edge_index, edge_weight)


def record_degrees(gm: nn.Module) -> dict[tuple[str, str], torch.Tensor]:
    """Every degree vector a point's protection draws from, by (point, side)."""
    seen: dict[tuple[str, str], torch.Tensor] = {}
    for name, point in fxquant.quantization_points(gm):
        protection = point.protection
        original = protection.mask

        def mask(degree, side="target", name=name, original=original):
            if degree is not None:
                seen[(name, side)] = degree
            return original(degree, side)

        protection.mask = mask
    return seen


@pytest.mark.parametrize(("num_src", "num_dst"), SIZES, ids=IDS)
def test_node_degree_counts_each_side(num_src, num_dst):
    _, _, edge_index = graph(num_src, num_dst)
    out_deg, in_deg = by_hand(edge_index, num_src, num_dst)
    assert torch.equal(node_degree(edge_index, num_src, side="source"), out_deg)
    assert torch.equal(node_degree(edge_index, num_dst), in_deg)
    flipped = edge_index.flip(0)
    assert torch.equal(node_degree(flipped, num_src, side="source", flow="target_to_source"),
                       out_deg)
    assert torch.equal(node_degree(flipped, num_dst, flow="target_to_source"), in_deg)
    with pytest.raises(ValueError, match="side='sources' is not one of"):
        node_degree(edge_index, num_src, side="sources")


@pytest.mark.parametrize(("num_src", "num_dst"), SIZES, ids=IDS)
@pytest.mark.parametrize("share", ["point", "layer"])
def test_every_site_draws_from_its_own_nodes_degrees(num_src, num_dst, share):
    """Input parts, messages following their source, per-edge weights and the output of
    a bipartite GraphConv: sources drawn by out-degree over the sources, targets (and
    the aggregation, the output) by in-degree over the targets."""
    x_src, x_dst, edge_index = graph(num_src, num_dst)
    out_deg, in_deg = by_hand(edge_index, num_src, num_dst)
    protect = Protection(0.0, 0.5, share=share, messages="source")
    config = QuantConfig("int8", scale="tensor", protect=protect)
    mapping = QuantMapping()
    for site in ("input", "message", "aggregate", "output", "edge"):
        if share == "layer" or site != "edge":
            mapping.set_name("conv", config, site=site)
    gm = fxquant.transform(Bipartite(), mapping, lint="off").train()
    seen = record_degrees(gm)
    weight = torch.rand(edge_index.shape[1])
    out = gm(x_src, x_dst, edge_index, weight)
    assert out.shape == (num_dst, 5)
    sources = [v for (name, side), v in seen.items() if side == "source"]
    targets = [v for (name, side), v in seen.items() if side == "target"]
    assert sources and targets
    assert all(torch.equal(v, out_deg) for v in sources)
    assert all(torch.equal(v, in_deg) for v in targets)
    if share == "layer":  # one draw per side, shared by every point of the layer
        assert {k: tuple(v.shape) for k, v in gm.fxquant_masks.masks.items()} == \
            {"conv": (num_dst,), ("conv", "source"): (num_src,)}
    else:
        assert ("conv_message_quant", "source") in seen
        assert ("conv_input_source_quant", "target") not in seen


@pytest.mark.parametrize(("num_src", "num_dst"), SIZES, ids=IDS)
@pytest.mark.parametrize("cls", [SAGEConv, GraphConv])
def test_degree_quant_recipe_trains_a_bipartite_layer(cls, num_src, num_dst):
    """Degree-Quant's recipe on a bipartite layer (any MessagePassing model, as its docs
    promise): its first forward runs, trains and evaluates, with every mask over the
    nodes of its own side."""
    torch.manual_seed(0)
    run = fxquant.recipes.get("degree-quant", bits=4).prepare(Bipartite(cls))
    x_src, x_dst, edge_index = graph(num_src, num_dst)
    gm = run.model.train()
    out = gm(x_src, x_dst, edge_index)
    out.square().mean().backward()
    assert gm.get_parameter("conv.lin_rel.weight" if cls is GraphConv
                            else "conv.lin_l.weight").grad is not None
    masks = {k: tuple(v.shape) for k, v in gm.fxquant_masks.masks.items()}
    assert masks == {"conv": (num_dst,), ("conv", "source"): (num_src,)}
    assert gm.eval()(x_src, x_dst, edge_index).shape == (num_dst, 5)


@pytest.mark.parametrize(("num_src", "num_dst"), SIZES, ids=IDS)
def test_high_degree_nodes_and_widths_of_each_side(num_src, num_dst):
    """top_degree_nodes and NodeBits.by_degree rank a bipartite graph's sources by
    out-degree with side='source' (and its targets by in-degree, the default)."""
    _, _, edge_index = graph(num_src, num_dst)
    out_deg, in_deg = by_hand(edge_index, num_src, num_dst)
    assert fxquant.top_degree_nodes(edge_index, 0.01, num_src, side="source").tolist() == \
        [int(out_deg.argmax())]
    assert fxquant.top_degree_nodes(edge_index, 0.01, num_dst).tolist() == \
        [int(in_deg.argmax())]
    bits = NodeBits.by_degree(edge_index, [0.5], [2, 4], num_nodes=num_src, side="source")
    cut = torch.quantile(out_deg, 0.5)
    assert torch.equal(bits.bits, torch.where(out_deg > cut, 4.0, 2.0))
    with pytest.raises(ValueError, match="side="):
        fxquant.top_degree_nodes(edge_index, 0.5, side="both")


class SavedBipartite(nn.Module):
    """The model of ``data/make_bipartite.py``."""

    def __init__(self):
        super().__init__()
        self.conv = SAGEConv((4, 3), 8)

    def forward(self, x_src, x_dst, edge_index):
        return self.conv((x_src, x_dst), edge_index)


def test_a_file_saved_with_one_input_point_per_pair_loads():
    """A file written when the input site of a (source, target) pair had one point for
    both parts: both parts start from its state (one learned step), and the model gives
    the outputs it gave then."""
    saved = torch.load(DATA / "sage-bipartite-0.9.8-expected.pt", weights_only=True)
    gm = fxquant.load(DATA / "sage-bipartite-0.9.8.pt", SavedBipartite())
    points = dict(fxquant.quantization_points(gm))
    assert sorted(points) == ["conv_input_quant", "conv_input_source_quant", "conv_quant"]
    assert torch.equal(points["conv_input_quant"].step, points["conv_input_source_quant"].step)
    with torch.no_grad():
        assert torch.equal(gm.eval()(*saved["inputs"]), saved["eval"])


def test_each_part_of_a_pair_learns_its_own_step(tmp_path):
    """Two node types of different scales: each part fits and keeps its own step, saved
    and loaded with the part it belongs to."""
    x_src, x_dst, edge_index = graph(9, 4)
    x_src = x_src * 100
    config = QuantConfig("int4", scale="tensor", range="lsq")
    gm = fxquant.transform(Bipartite(SAGEConv), QuantMapping().set_name("conv", config,
                                                                         site="input"),
                           lint="off").train()
    gm(x_src, x_dst, edge_index)
    points = dict(fxquant.quantization_points(gm))
    source, target = points["conv_input_source_quant"], points["conv_input_quant"]
    assert float(source.step.detach()) > 10 * float(target.step.detach())
    fxquant.save(gm.eval(), tmp_path / "gm.pt")
    again = fxquant.load(tmp_path / "gm.pt", Bipartite(SAGEConv))
    assert torch.equal(dict(fxquant.quantization_points(again))["conv_input_source_quant"].step,
                       source.step)
    assert torch.equal(again(x_src, x_dst, edge_index), gm(x_src, x_dst, edge_index))
