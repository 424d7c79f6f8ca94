"""Batches without edges (isolated nodes) or without nodes run at every site kind and range
mode, in training and evaluation, forward and backward; a point that sees no values keeps
its statistics."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch_geometric.nn import GCNConv, SAGEConv

import fxquant
from fxquant.quant.config import NodeBits, QuantConfig
from fxquant.quant.points import QuantPoint

SITES = ("input", "weight", "message", "aggregate", "output")
RANGES = ("minmax", "percentile", "running", "lsq", "learned_bits", "fixed_bits", "row",
          "block32", "protect", "top_bits")
NUM_NODES = 16


def config(kind: str, site: str) -> QuantConfig:
    if kind == "minmax":
        return QuantConfig("int4", scale="tensor")
    if kind == "percentile":
        return QuantConfig("int4", scale="tensor", range="percentile:99")
    if kind == "running":
        return QuantConfig("int4", scale="tensor", decay=0.9)
    if kind == "lsq":
        return QuantConfig("int4", scale="tensor", range="lsq")
    if kind == "learned_bits" and site != "weight":
        return QuantConfig("int8", scale="tensor", range="lsq",
                           node_bits=NodeBits.learned_init(NUM_NODES, 3.0))
    if kind == "fixed_bits" and site != "weight":
        bits = (torch.arange(NUM_NODES) % 3 + 2).float()
        return QuantConfig("int8", scale="tensor", node_bits=NodeBits(bits))
    if kind == "row":
        return QuantConfig("int4", scale="row")
    if kind == "block32":
        return QuantConfig("e2m1", scale="block32")
    if kind == "protect" and site != "weight":
        return QuantConfig("int4", scale="tensor", protect=(0.1, 0.8))
    return QuantConfig(6, "nearest")  # weights have no nodes: kept bits for the per-node kinds


class Net(nn.Module):
    def __init__(self, conv: type[nn.Module]):
        super().__init__()
        kwargs = {"add_self_loops": False} if conv is GCNConv else {}
        self.conv1 = conv(4, 8, **kwargs)
        self.conv2 = conv(8, 3, **kwargs)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def _model(conv, site: str, kind: str) -> torch.fx.GraphModule:
    torch.manual_seed(0)
    mapping = fxquant.QuantMapping().set_name("conv1", config(kind, site), site=site)
    mapping.set_name("conv2", config(kind, site), site=site)
    return fxquant.transform(Net(conv), mapping, lint="off")


def _points(gm) -> dict[str, QuantPoint]:
    return {n: m for n, m in gm.named_modules() if isinstance(m, QuantPoint)}


def _batch(kind: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    n = 0 if kind == "no_nodes" else 5
    x = torch.randn(n, 4, generator=g).requires_grad_()
    return x, torch.zeros(2, 0, dtype=torch.long), torch.randperm(NUM_NODES, generator=g)[:n]


@settings(max_examples=80)
@given(site=st.sampled_from(SITES), kind=st.sampled_from(RANGES),
       batch=st.sampled_from(["no_edges", "no_nodes"]), conv=st.sampled_from([GCNConv, SAGEConv]),
       warm=st.booleans(), seed=st.integers(0, 2**16))
def test_empty_and_edgeless_batches_run_everywhere(site, kind, batch, conv, warm, seed):
    """Training forward and backward, then evaluation, on a batch without edges or
    without nodes (after a normal batch or as the very first): outputs of the right
    shape, finite gradients, and every point that saw no values keeps its state."""
    gm = _model(conv, site, kind)
    if warm:  # a normal batch first
        g = torch.Generator().manual_seed(seed)
        gm(torch.randn(8, 4, generator=g), torch.randint(0, 8, (2, 20), generator=g),
           node_ids=torch.arange(8)).sum().backward()
        gm.zero_grad()
    x, edge_index, ids = _batch(batch, seed)
    empty_points = {n for n, p in _points(gm).items()
                    if p.site.value == "message" or (batch == "no_nodes" and p.site.value != "weight")}
    before = {n: {k: v.detach().clone() for k, v in p.state_dict().items()}
              for n, p in _points(gm).items() if n in empty_points}
    out = gm(x, edge_index, node_ids=ids)
    assert out.shape == (x.shape[0], 3) and bool(torch.isfinite(out).all())
    (out.sum() + sum(p.sum() for p in gm.parameters()) * 0).backward()
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())
    for p in gm.parameters():
        assert p.grad is None or bool(torch.isfinite(p.grad).all())
    for name, state in before.items():
        now = _points(gm)[name].state_dict()
        for key, value in state.items():
            assert torch.equal(now[key].detach(), value), (name, key)
    gm.eval()
    with torch.no_grad():
        again = gm(x, edge_index, node_ids=ids)
    assert again.shape == out.shape and bool(torch.isfinite(again).all())


@pytest.mark.parametrize("kind", ["lsq", "learned_bits"])
def test_reported_isolated_nodes_and_empty_batch(kind):
    """The reported cases: LSQ message points crashed in backward on a batch without
    edges, percentile message points in forward; LSQ and learned bits on a batch without
    nodes."""
    for site, batch in (("message", "no_edges"), ("output", "no_nodes")):
        gm = _model(SAGEConv, site, kind)
        x, edge_index, ids = _batch(batch, 0)
        gm(x, edge_index, node_ids=ids).sum().backward()
    gm = _model(SAGEConv, "message", "percentile")
    x, edge_index, ids = _batch("no_edges", 0)
    assert gm(x, edge_index).shape == (5, 3)


def test_point_on_an_empty_tensor_keeps_its_step_unfitted():
    """A learned step first meets an empty tensor: nothing to fit, it is fitted on the
    next one."""
    point = QuantPoint(QuantConfig("int4", scale="tensor", range="lsq"), "lin").train()
    point(torch.empty(0, 3))
    assert not point.learned_step.step_ready and float(point.log_step) == 0.0
    point(torch.linspace(-8, 8, 30).view(10, 3))
    assert point.learned_step.step_ready and math.isfinite(float(point.step))
