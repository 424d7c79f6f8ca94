"""``fxquant.summary`` and ``fxquant.bit_report`` on example inputs run one forward that
leaves no trace: the record of the last training forward (which ``bit_penalty`` reads),
a cached layer's graph, the random generators and the modes are as they were."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
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


# -- a forward that writes the model's own state ---------------------------------------


class Stateful(torch.nn.Module):
    """A GNN whose forward writes its own state in every mode: a call counter (rebound:
    ``self.count += 1``), an EMA of its inputs (in place), and a BatchNorm (which updates
    its statistics and its own counter in training)."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.conv1, self.conv2 = GCNConv(channels, 8), GCNConv(8, 3)
        self.norm = torch.nn.BatchNorm1d(8)
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        self.register_buffer("ema", torch.zeros(channels))

    def forward(self, x, edge_index):
        self.count += 1
        self.ema.mul_(0.9).add_(0.1 * x.mean(0))
        return self.conv2(self.norm(self.conv1(x, edge_index)).relu(), edge_index)


#: points whose learned or kept state a training forward writes: a running range (decay),
#: a widening range, learned per-node bit-widths with a learned step, stochastic rounding
CONFIGS = {
    "running": lambda n: QuantConfig("int8", scale="tensor", decay=0.9),
    "widen": lambda n: QuantConfig("int8:asym", scale="tensor", observe="widen"),
    "learned": lambda n: QuantConfig("int8", scale="tensor", range="lsq",
                                     node_bits=NodeBits.learned_init(n, 4.0)),
    "stochastic": lambda n: QuantConfig("e4m3", "stochastic", scale="tensor"),
}


def _snapshot(gm):
    """Everything a report must leave as it was: the values and identity of every
    parameter and buffer, each module's mode and attributes (by identity), the RNG."""
    return {
        "state": {k: v.clone() for k, v in gm.state_dict(keep_vars=True).items()},
        "ids": {k: id(v) for k, v in (*gm.named_parameters(), *gm.named_buffers())},
        "modes": {name: m.training for name, m in gm.named_modules()},
        "attributes": {name: {k: id(v) for k, v in vars(m).items()}
                       for name, m in gm.named_modules()},
        "grad": [p.requires_grad for p in gm.parameters()],
        "rng": torch.get_rng_state(),
    }


def _same(before, after):
    assert before["ids"] == after["ids"]
    for key, value in before["state"].items():
        now = after["state"][key]
        assert value.dtype == now.dtype and torch.equal(
            value.detach().reshape(-1).view(torch.uint8),
            now.detach().reshape(-1).view(torch.uint8)), key
    for key in ("modes", "attributes", "grad"):
        assert before[key] == after[key], key
    assert torch.equal(before["rng"], after["rng"])


@pytest.mark.parametrize("probe", ["bit_report", "summary"])
def test_a_report_leaves_a_forward_that_counts_and_averages_as_it_was(probe):
    """The reported case: a counter buffer went 1 -> 3 and an EMA buffer took the report's
    inputs; after bit_report and summary the model is exactly as before."""
    torch.manual_seed(0)
    x, ei = _graph(10, 0)
    gm = fxquant.transform(Stateful(), bits=8, lint="off")
    gm(x, ei)
    assert int(gm.count) == 1
    before = _snapshot(gm)
    getattr(fxquant, probe)(gm, *_graph(6, 1))
    assert int(gm.count) == 1
    _same(before, _snapshot(gm))


@settings(max_examples=30)
@given(config=st.sampled_from(sorted(CONFIGS)), probe=st.sampled_from(["bit_report", "summary"]),
       training=st.booleans(), steps=st.integers(0, 2), nodes=st.integers(1, 12),
       seed=st.integers(0, 3))
def test_reports_leave_every_model_state_as_it_was(config, probe, training, steps, nodes, seed):
    """Whatever the points keep (running, widening, learned ranges and widths, stochastic
    rounding), whatever the model's mode and how far it trained, and whatever inputs the
    report runs on: every parameter and buffer (the model's counter, EMA and BatchNorm
    statistics, fxquant's ranges and learned state), every mode and attribute and the
    random generators are as they were."""
    torch.manual_seed(seed)
    x, ei = _graph(10, seed)
    mapping = fxquant.QuantMapping()
    for site in ("input", "aggregate", "output"):
        mapping.set_global(CONFIGS[config](10), site=site)
    gm = fxquant.transform(Stateful(), mapping, lint="off")
    optimizer = torch.optim.SGD(gm.parameters(), lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        gm.train()(x, ei).sum().backward()
        optimizer.step()
    gm.train(training)
    before = _snapshot(gm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a learned step not fitted yet says so)
        getattr(fxquant, probe)(gm, *_graph(nodes, seed + 1))
    _same(before, _snapshot(gm))
