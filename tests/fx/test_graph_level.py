"""Graph-level models: PyG's per-graph normalizations and GIN's options trace without
extra arguments, and classifiers over mini-batches of many small graphs transform."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GINConv, global_add_pool, global_mean_pool
from torch_geometric.nn.models import GIN
from torch_geometric.nn.norm import GraphNorm, GraphSizeNorm, InstanceNorm, LayerNorm

import fxquant
from fxquant.planted import planted_motifs


def _batch(n: int = 4, seed: int = 0):
    return next(iter(DataLoader(planted_motifs(num_graphs=n, seed=seed), batch_size=n)))


class Normed(nn.Module):
    def __init__(self, norm: nn.Module):
        super().__init__()
        self.conv = GINConv(nn.Linear(8, 8))
        self.norm = norm

    def forward(self, x, edge_index, batch):
        return global_mean_pool(self.norm(self.conv(x, edge_index), batch), batch)


@pytest.mark.parametrize("norm", [GraphNorm(8), InstanceNorm(8), LayerNorm(8),
                                  LayerNorm(8, mode="node"), GraphSizeNorm()],
                         ids=["graph", "instance", "layer", "layer-node", "graph-size"])
def test_per_graph_norms_trace_without_leaf_modules(norm):
    """They count graphs with int(batch.max()) + 1, which tracing cannot read: the tracer
    keeps them whole (one layer), and the traced model matches eager per batch."""
    model = Normed(norm).eval()
    gm = fxquant.trace(model)
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == ["conv", "norm"]
    for seed in (0, 1):
        b = _batch(seed=seed)
        torch.testing.assert_close(gm(b.x, b.edge_index, b.batch),
                                   model(b.x, b.edge_index, b.batch))


OPTIONS = [{}, {"jk": "cat"}, {"jk": "max"}, {"jk": "lstm"}, {"norm": "batch_norm"},
           {"norm": "graph_norm"}, {"norm": "layer_norm"}, {"norm": "instance_norm"},
           {"norm": "graph_norm", "jk": "cat"}, {"norm": "batch_norm", "train_eps": True}]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(map(str, o.values()))
                         or "plain")
def test_gin_options_trace_and_take_batch(options):
    """PyG's models.GIN with each option traces with no argument but the model, takes
    batch= as the model does (used by the per-graph norms, ignored otherwise), and
    matches eager in training and evaluation."""
    torch.manual_seed(0)
    model = GIN(8, 16, num_layers=3, out_channels=4, **options)
    gm = fxquant.trace(model)
    b = _batch()
    for training in (True, False):
        model.train(training)
        gm.train(training)
        torch.manual_seed(1)
        expected = model(b.x, b.edge_index, batch=b.batch)
        torch.manual_seed(1)
        torch.testing.assert_close(gm(b.x, b.edge_index, batch=b.batch), expected)
    with pytest.raises(TypeError, match="num_sampled_nodes_per_hop=None fixed"):
        gm(b.x, b.edge_index, num_sampled_nodes_per_hop=[1, 1, 1])


def test_an_unused_argument_that_steers_python_stays_fixed():
    """An argument the graph does not read but whose presence changed the traced branch
    (`if scale is not None`) is still fixed and refused, tensor or not."""

    class Steered(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GINConv(nn.Linear(8, 8))

        def forward(self, x, edge_index, scale: Tensor | None = None):
            if scale is not None:
                x = x * 2
            return self.conv(x, edge_index)

    gm = fxquant.trace(Steered())
    b = _batch()
    with pytest.raises(TypeError, match="scale=None fixed"):
        gm(b.x, b.edge_index, scale=torch.ones(1))


class GINClassifier(nn.Module):
    """GIN node embeddings, sum pooling per graph, a linear head."""

    def __init__(self, **options):
        super().__init__()
        self.gnn = GIN(8, 16, num_layers=3, **options)
        self.head = nn.Linear(16, 4)

    def forward(self, x, edge_index, batch):
        return self.head(global_add_pool(self.gnn(x, edge_index, batch=batch), batch))


CONFIGS = {
    "batch": fxquant.QuantConfig("int8", scale="tensor"),
    "ema": fxquant.QuantConfig("int8", scale="tensor", decay=0.9),
    "widen": fxquant.QuantConfig("int8", scale="tensor", observe="widen"),
    "percentile": fxquant.QuantConfig("int8", scale="tensor", range="percentile:99",
                                      decay=0.9),
    "percentile-batch": fxquant.QuantConfig("int8", scale="tensor", range="percentile:99"),
    "percentile-widen": fxquant.QuantConfig("int8:asym", scale="tensor",
                                            range="percentile:99.9", observe="widen"),
    "pow2": fxquant.QuantConfig("int8", scale="tensor-pow2", decay=0.9),
    "row": fxquant.QuantConfig("int8", scale="row"),
    "row-pow2": fxquant.QuantConfig("int8", scale="row-pow2"),
    "block32": fxquant.QuantConfig("e4m3", scale="block32"),
    "lsq": fxquant.QuantConfig("int4", scale="tensor", range="lsq"),
    "protect": fxquant.QuantConfig("int4", scale="tensor", decay=0.9, protect=(0.0, 0.2)),
    "lsq-protect": fxquant.QuantConfig("int4", scale="tensor", range="lsq",
                                       protect=(0.0, 0.2)),
    "degree-quant": fxquant.QuantConfig(
        "int4:asym", scale="tensor", range="percentile:99", observe="widen", grad="clipped",
        protect=fxquant.Protection(0.0, 0.2, share="layer", messages="source",
                                   ranges="unprotected")),
}
#: the modes whose range comes from each batch in evaluation too (observe="batch")
PER_BATCH = ("batch", "percentile-batch")


@pytest.mark.parametrize("mode", list(CONFIGS))
def test_classifier_trains_on_mini_batches_of_graphs(mode):
    """Every GINConv, the pooling and the head rounded (set_global covers the readout;
    protection stays on the GNN layers): training over a DataLoader of small graphs runs
    and learns
    (finite loss, every parameter moved); evaluation of a batch is one graph's own result
    where the range does not come from the batch, and depends on the batch where it does
    (observe="batch", the documented per-batch statistics)."""
    torch.manual_seed(0)
    # (batch_norm: in evaluation PyG's graph_norm inside GIN's MLPs, called without the
    # batch vector, normalizes over the whole batch, so the float model depends on it)
    model = GINClassifier(norm="batch_norm")
    gm = fxquant.transform(model, CONFIGS[mode], lint="off")
    points = fxquant.quantization_points(gm)
    assert [p.layer for _, p in points] == ["gnn.convs.0", "gnn.convs.1", "gnn.convs.2",
                                            "global_add_pool", "head"]
    assert [p.config.protect is not None for _, p in points] == \
        [CONFIGS[mode].protect is not None] * 3 + [False] * 2
    before = {k: v.detach().clone() for k, v in gm.named_parameters()}
    opt = torch.optim.Adam(gm.parameters(), lr=0.01)
    loader = DataLoader(planted_motifs(num_graphs=24, seed=1), batch_size=8, shuffle=True)
    gm.train()
    for b in loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(gm(b.x, b.edge_index, b.batch), b.y)
        assert torch.isfinite(loss)
        loss.backward()
        opt.step()
    assert all(not torch.equal(before[k], v) for k, v in gm.named_parameters())
    gm.eval()
    b = _batch(8, seed=2)
    together = gm(b.x, b.edge_index, b.batch)
    alone = torch.cat([gm(g.x, g.edge_index, torch.zeros(g.num_nodes, dtype=torch.long))
                       for g in b.to_data_list()])
    assert together.shape == (8, 4)
    if mode in PER_BATCH:
        assert not torch.allclose(together, alone)
    else:
        torch.testing.assert_close(together, alone)


def test_float_transform_of_the_classifier_is_the_model():
    """At 32 kept bits the transformed classifier is bit-equal to the model on a batch."""
    model = GINClassifier(norm="graph_norm", jk="cat").eval()
    gm = fxquant.transform(model, bits=32, lint="off").eval()
    b = _batch(6)
    assert torch.equal(gm(b.x, b.edge_index, b.batch), model(b.x, b.edge_index, b.batch))
