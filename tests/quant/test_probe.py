"""``fxquant.summary`` and ``fxquant.bit_report`` on example inputs run one forward that
leaves no trace: the record of the last training forward (which ``bit_penalty`` reads),
a cached layer's graph, the random generators and the modes are as they were."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch_geometric.nn import GCNConv
from torch_geometric.nn.models import GCN

import fxquant
from fxquant.quant.config import NodeBits, QuantConfig


def _graph(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randint(0, n, (2, 3 * n), generator=g)


@pytest.mark.parametrize("probe", ["bit_report", "summary"])
def test_a_probe_keeps_the_last_training_forward_for_the_penalty(probe):
    torch.manual_seed(0)
    x, ei = _graph(20, 0)
    config = QuantConfig("int8", scale="tensor", range="lsq",
                         node_bits=NodeBits.learned_init(20, 4.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm = fxquant.transform(GCN(8, 8, num_layers=2, out_channels=3), config).train()
    gm(x, ei)
    before = fxquant.bit_penalty(gm, 2.0)
    getattr(fxquant, probe)(gm, *_graph(7, 1))
    after = fxquant.bit_penalty(gm, 2.0)
    assert after.requires_grad and float(after) == float(before)
    assert gm.training and all(m.training for m in gm.modules())


class Cached(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = GCNConv(8, 4, cached=True)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index)


@pytest.mark.parametrize("probe", ["bit_report", "summary"])
def test_a_probe_leaves_a_cached_layer_with_its_own_graph(probe):
    import copy

    torch.manual_seed(0)
    x, ei = _graph(12, 0)
    gm = fxquant.transform(Cached(), bits=8)
    twin = copy.deepcopy(gm)
    getattr(fxquant, probe)(gm, x, _graph(12, 5)[1])  # another graph, same nodes
    assert torch.equal(gm(x, ei), twin(x, ei))


def test_a_probe_leaves_the_random_generators_as_they_were():
    torch.manual_seed(0)
    x, ei = _graph(12, 0)
    gm = fxquant.transform(GCN(8, 8, num_layers=2, out_channels=3),
                           QuantConfig("int4", rounding="stochastic", scale="tensor"))
    state = torch.get_rng_state()
    fxquant.bit_report(gm, x, ei)
    fxquant.summary(gm, x, ei)
    assert torch.equal(torch.get_rng_state(), state)
