"""PyG's global pooling, ``scatter`` and ``Aggregation`` modules in a top-level forward
(graph classification): traced as one call each, where the number of graphs they read from
the data stopped the symbolic trace."""

from __future__ import annotations

import torch
from torch_geometric.nn import GCNConv, aggr, global_add_pool, global_max_pool, global_mean_pool
from torch_geometric.utils import scatter

import fxquant


class GraphClassifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = GCNConv(8, 4)
        self.pool = aggr.SumAggregation()
        self.lin = torch.nn.Linear(20, 2)

    def forward(self, x, edge_index, batch):
        h = self.conv(x, edge_index).relu()
        pooled = [global_mean_pool(h, batch), global_max_pool(h, batch),
                  global_add_pool(h, batch), self.pool(h, batch),
                  scatter(h, batch, dim=0, reduce="mean")]
        return self.lin(torch.cat(pooled, -1))


def _graphs(size):
    g = torch.Generator().manual_seed(size)
    x, edge_index = torch.randn(20, 8, generator=g), torch.randint(0, 20, (2, 60), generator=g)
    return x, edge_index, torch.arange(20) // size


def test_graph_classifiers_with_pyg_pooling_trace_and_train():
    torch.manual_seed(0)
    model = GraphClassifier()
    gm = fxquant.transform(model, bits=23, rounding="nearest", lint="off")
    targets = {str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_module")}
    assert "pool" in targets
    assert "__call__" in vars(aggr.Aggregation)  # (restored after the trace)
    # bits= rounds the convolution, the pooling calls and the head after them
    assert [p.layer for _, p in fxquant.quantization_points(gm)] == \
        ["conv", "global_mean_pool", "global_max_pool", "global_add_pool", "pool", "lin"]
    for size in (7, 4):  # another number of graphs: read at run time, not frozen
        x, edge_index, batch = _graphs(size)
        torch.testing.assert_close(gm(x, edge_index, batch), model(x, edge_index, batch),
                                   rtol=1e-4, atol=1e-4)  # (23 bits: 14 of the mantissa)
    gm(*_graphs(4)).sum().backward()
    assert gm.get_submodule("conv").lin.weight.grad is not None


def test_a_pyg_function_called_through_its_module_is_named_with_the_fix():
    import torch_geometric.nn as pyg_nn

    class ByAttribute(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GCNConv(8, 4)

        def forward(self, x, edge_index, batch):
            return pyg_nn.global_mean_pool(self.conv(x, edge_index), batch)

    try:
        fxquant.transform(ByAttribute(), bits=8, lint="off")
    except fxquant.FxquantError as e:
        message = str(e)
    assert "global_mean_pool" in message and "from torch_geometric.nn import" in message
