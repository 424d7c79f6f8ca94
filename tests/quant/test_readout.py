"""A graph classifier's readout (global pooling and the head after it) is covered by the
global entry, as its message-passing layers are, so nothing is left in float silently."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_geometric.nn import GINConv, aggr, global_max_pool, global_mean_pool
from torch_geometric.nn.models import MLP

import fxquant
from fxquant import NodeBits, QuantConfig, QuantMapping


class Classifier(nn.Module):
    """Two poolings (a function and an aggregation module) and an MLP head (traced
    through: its two linear layers are the head's layers)."""

    def __init__(self):
        super().__init__()
        self.conv = GINConv(nn.Linear(4, 8))
        self.pool = aggr.SumAggregation()
        self.head = MLP([16, 8, 2])

    def forward(self, x, edge_index, batch):
        h = self.conv(x, edge_index).relu()
        return self.head(torch.cat([global_mean_pool(h, batch), self.pool(h, batch)], -1))


class NodeLevel(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = GINConv(nn.Linear(4, 8))
        self.lin = nn.Linear(8, 2)

    def forward(self, x, edge_index):
        return self.lin(self.conv(x, edge_index))


def _batch():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(10, 4, generator=g), torch.randint(0, 10, (2, 30), generator=g),
            torch.arange(10) // 5)


def _sites(gm):
    return sorted((p.layer, p.site.value, p.tensor) for _, p in fxquant.quantization_points(gm))


def test_global_covers_pooling_and_head_at_their_sites():
    int8 = QuantConfig("int8", scale="tensor")
    mapping = QuantMapping()
    for site in ("input", "output", "weight", "linear", "message"):
        mapping.set_global(int8, site=site)
    gm = fxquant.transform(Classifier(), mapping, lint="off")
    layers = {(layer, site) for layer, site, _ in _sites(gm)}
    head = ("head.lins.0", "head.lins.1")
    assert layers == {("conv", site) for site in ("input", "output", "weight", "linear",
                                                  "message")} | {
        (layer, site) for layer in ("global_mean_pool", "pool") for site in ("input", "output")
    } | {(layer, site) for layer in head for site in ("input", "output", "weight")}
    gm(*_batch()).sum().backward()


def test_node_level_models_keep_their_head_as_before():
    """Without a pooling the global entry covers the message-passing layers only."""
    gm = fxquant.transform(NodeLevel(), bits=8, lint="off")
    assert [p.layer for _, p in fxquant.quantization_points(gm)] == ["conv"]


def test_readout_takes_the_global_config_without_protection():
    config = QuantConfig("int8", scale="tensor", decay=0.9, protect=(0.0, 0.2))
    gm = fxquant.transform(Classifier(), config, lint="off")
    points = {p.layer: p.config for _, p in fxquant.quantization_points(gm)}
    assert points["conv"].protect is not None
    assert all(points[layer].protect is None
               for layer in ("global_mean_pool", "pool", "head.lins.0", "head.lins.1"))
    assert points["head.lins.1"].describe() == \
        "int8, nearest, scale tensor (running, decay 0.9), ste"
    gm.train()(*_batch())


def test_per_node_widths_leave_the_readout_with_a_warning():
    config = QuantConfig("int8", scale="tensor", node_bits=NodeBits.learned_init(10, 4.0),
                         range="lsq")
    with pytest.warns(UserWarning, match=r"readout of a graph classifier \(global_mean_pool, "
                                         r"pool, head.lins.0, head.lins.1") as caught:
        gm = fxquant.transform(Classifier(), config, lint="off")
    assert [p.layer for _, p in fxquant.quantization_points(gm)] == ["conv"]
    assert caught[0].filename == __file__  # (the user's line)


def test_a_readout_layer_can_be_left_out_by_name():
    mapping = (QuantMapping().set_global(QuantConfig(8))
               .set_name("global_mean_pool", None).set_name("pool", None))
    gm = fxquant.transform(Classifier(), mapping, lint="off")
    assert [p.layer for _, p in fxquant.quantization_points(gm)] == \
        ["conv", "head.lins.0", "head.lins.1"]


def test_max_pooling_counts_as_pooling():
    class MaxPooled(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GINConv(nn.Linear(4, 8))
            self.lin = nn.Linear(8, 2)

        def forward(self, x, edge_index, batch):
            return self.lin(global_max_pool(self.conv(x, edge_index), batch))

    gm = fxquant.transform(MaxPooled(), bits=8, lint="off")
    assert [p.layer for _, p in fxquant.quantization_points(gm)] == \
        ["conv", "global_max_pool", "lin"]


def test_no_warning_where_the_readout_has_a_config_of_its_own():
    import warnings

    config = QuantConfig("int8", scale="tensor", node_bits=NodeBits.learned_init(10, 4.0),
                         range="lsq")
    mapping = QuantMapping().set_global(config)
    for layer in ("global_mean_pool", "pool", "head.lins.0", "head.lins.1"):
        mapping.set_name(layer, QuantConfig(8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gm = fxquant.transform(Classifier(), mapping, lint="off")
    assert len(fxquant.quantization_points(gm)) == 5
