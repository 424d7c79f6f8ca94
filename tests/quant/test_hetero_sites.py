"""Quantization sites of heterogeneous and graph-level models that need changes in
fxquant.quant (each test fails today and is marked so; its reason says what is wrong).

Dict models trace (tests/fx/test_hetero_trace.py); what is missing is rounding a layer
that takes or returns dicts, addressing node and edge types, bipartite degrees, integer
plumbing among pattern matches, the two RGCN layers, and pooling under set_global."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_geometric.nn import FastRGCNConv, GINConv, RGCNConv, SAGEConv, global_add_pool

import fxquant
from fxquant import QuantConfig, QuantMapping
from fxquant.errors import FxquantError
from tests.fx.hetero_models import HGT, hetero_graph, inputs, to_hetero_sage

INT8 = QuantConfig("int8", scale="tensor")


def _hgt():
    data = hetero_graph()
    torch.manual_seed(0)
    return HGT(data.metadata()).eval(), inputs(data)


def test_hgt_input_site_rounds_each_node_type():
    model, ex = _hgt()
    gm = fxquant.transform(model, QuantMapping().set_name("conv", QuantConfig(32), site="input"),
                           example_inputs=ex, lint="off")
    assert torch.equal(gm(*ex), model(*ex))


def test_hgt_default_transform_rounds_its_outputs():
    model, ex = _hgt()
    exact = fxquant.transform(model, bits=32, example_inputs=ex, lint="off")
    assert torch.equal(exact(*ex), model(*ex))
    gm = fxquant.transform(model, format="int4", scale="tensor", example_inputs=ex, lint="off")
    assert not torch.equal(gm(*ex), model(*ex))


class Bipartite(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = SAGEConv((4, 3), 8)

    def forward(self, x_src, x_dst, edge_index):
        return self.conv((x_src, x_dst), edge_index)


@pytest.mark.parametrize("sources", [3, 9], ids=["fewer-sources", "more-sources"])
def test_bipartite_protection_follows_each_nodes_own_degree(sources):
    """Protection (0, 1): the node of highest degree on each side is always kept (its row
    passes unrounded), by the degrees counted by hand: out-degree for sources (the
    messages they send), in-degree for targets."""
    targets = 6
    src = torch.tensor([0, 0, 0, 0, 1, 2, 1, 2])  # source 0 sends the most
    dst = torch.tensor([5, 4, 3, 2, 5, 5, 1, 5])  # target 5 receives the most
    edge_index = torch.stack([src, dst])
    by_hand_src = torch.bincount(src, minlength=sources)
    by_hand_dst = torch.bincount(dst, minlength=targets)
    assert int(by_hand_src.argmax()) == 0 and int(by_hand_dst.argmax()) == 5
    config = QuantConfig("int2", scale="tensor", protect=(0.0, 1.0))
    gm = fxquant.transform(Bipartite(), QuantMapping().set_global(config, site="input"),
                           lint="off").train()
    seen = []
    for _, point in fxquant.quantization_points(gm):
        point.register_forward_hook(lambda m, args, out: seen.append((args[0], out)))
    x_src, x_dst = torch.randn(sources, 4), torch.randn(targets, 3)
    for _ in range(5):
        gm(x_src, x_dst, edge_index)
    rounded_src = [out for x, out in seen if x.shape == x_src.shape]
    rounded_dst = [out for x, out in seen if x.shape == x_dst.shape]
    assert rounded_src and rounded_dst
    assert all(torch.equal(out[0], x_src[0]) for out in rounded_src)
    assert all(torch.equal(out[5], x_dst[5]) for out in rounded_dst)


@pytest.mark.parametrize("site", ["output", "message"])
def test_loose_pattern_selects_only_layers_with_float_values(site):
    data = hetero_graph()
    model = to_hetero_sage(data)
    gm = fxquant.transform(model, QuantMapping().set_pattern("*writes*", INT8, site=site),
                           lint="off")
    layers = {p.layer for _, p in fxquant.quantization_points(gm)}
    assert layers == {f"conv{i}.{r}" for i in (1, 2)
                      for r in ("author__writes__paper", "paper__rev_writes__author")}
    gm(*inputs(data))


def test_pattern_matching_nothing_roundable_is_refused():
    data = hetero_graph()
    with pytest.raises(FxquantError, match="edge_index__"):
        fxquant.transform(to_hetero_sage(data), QuantMapping().set_pattern("edge_index__*", INT8),
                          lint="off")


class Relational(nn.Module):
    def __init__(self, cls):
        super().__init__()
        self.conv = cls(4, 8, num_relations=3, aggr="add")

    def forward(self, x, edge_index, edge_type):
        return self.conv(x, edge_index, edge_type)


def test_both_rgcn_layers_round_the_same_tensors():
    torch.manual_seed(0)
    slow = Relational(RGCNConv)
    fast = Relational(FastRGCNConv)
    fast.load_state_dict(slow.state_dict())
    x = torch.randn(6, 4)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 0], [1, 2, 3, 4, 5, 0, 3]])
    edge_type = torch.tensor([0, 1, 2, 0, 1, 2, 2])
    torch.testing.assert_close(slow(x, edge_index, edge_type), fast(x, edge_index, edge_type))
    config = QuantMapping().set_global(QuantConfig("int4", scale="tensor"), site="message")
    outs = [fxquant.transform(m, config, lint="off")(x, edge_index, edge_type)
            for m in (slow, fast)]
    assert not torch.allclose(outs[0], slow(x, edge_index, edge_type))
    torch.testing.assert_close(outs[0], outs[1])


def test_mapping_addresses_an_edge_type():
    data = hetero_graph()
    mapping = QuantMapping()
    mapping.set_edge_type(("author", "writes", "paper"), INT8)
    gm = fxquant.transform(to_hetero_sage(data), mapping, lint="off")
    assert {p.layer for _, p in fxquant.quantization_points(gm)} == \
        {"conv1.author__writes__paper", "conv2.author__writes__paper"}


def test_set_global_covers_pooling():
    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GINConv(nn.Linear(4, 8))
            self.head = nn.Linear(8, 2)

        def forward(self, x, edge_index, batch):
            return self.head(global_add_pool(self.conv(x, edge_index), batch))

    gm = fxquant.transform(Classifier(), bits=8, lint="off")
    assert "global_add_pool" in {p.layer for _, p in fxquant.quantization_points(gm)}
