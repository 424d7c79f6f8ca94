"""Per-node settings keyed by global node id: the same node gets the same treatment in the
full graph and in any mini-batch that contains it (``node_ids=batch.n_id``)."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader, NeighborLoader, RandomNodeLoader
from torch_geometric.utils import add_remaining_self_loops, subgraph

import fxquant
from tests.quant import TwoGCN
from tests.support.extras import require

N = 60
HUBS = torch.tensor([3, 7, 20, 41])


class RowWise(nn.Module):
    """Rows never mix, so a batch's rows must equal the full graph's rows of its nodes."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x, edge_index):
        return self.out(self.lin(x).relu())


Net = TwoGCN


def graph(seed=0):
    g = torch.Generator().manual_seed(seed)
    return Data(x=torch.randn(N, 4, generator=g), edge_index=torch.randint(0, N, (2, 240), generator=g))


def row_wise_model():
    torch.manual_seed(0)
    mapping = fxquant.QuantMapping().set_name("lin", fxquant.QuantConfig(4, "nearest"))
    mapping.set_nodes("lin", HUBS, 16)
    return fxquant.transform(RowWise(), mapping)


def test_same_node_same_rounding_in_full_graph_and_batches():
    """Bit for bit: inputs on a grid of 1/4 and weights on a grid of 1/8 make every
    matmul exact whatever order the CPU's kernel sums in (a kernel may pick another order
    for 4 rows than for 60), so any difference is the rounding's."""
    gm = row_wise_model()
    with torch.no_grad():
        for param in gm.parameters():
            param.copy_((param * 8).round() / 8)
    data = graph()
    x = (data.x * 4).round() / 4
    full = gm(x, data.edge_index)
    for n_id in (torch.tensor([20, 3, 5, 9]), torch.tensor([41, 0, 1]), torch.randperm(N)[:17]):
        batch = gm(x[n_id], data.edge_index[:, :0], node_ids=n_id)
        torch.testing.assert_close(batch, full[n_id], rtol=0, atol=0)
    # without node_ids the rows of a batch are taken for nodes 0..k-1: hub 41 is not there
    with pytest.raises(IndexError, match=r"names node 41.*node_ids="):
        gm(data.x[:4], data.edge_index[:, :0])


def test_messages_follow_their_global_target():
    """An inner site (messages, keyed by target) on a node-induced batch: the overridden
    messages are exactly those whose target is a hub."""
    torch.manual_seed(0)
    mapping = fxquant.QuantMapping().set_name("conv1", fxquant.QuantConfig(3, "nearest"),
                                              site="message")
    mapping.set_nodes("conv1", HUBS, 20, site="message")
    gm = fxquant.transform(Net(), mapping)
    point = gm.get_submodule("conv1_message_quant")
    seen = {}
    point.register_forward_hook(lambda m, args, out: seen.update(x=args[0], y=out))
    data = graph()
    n_id = torch.tensor([7, 2, 20, 11, 3, 50])
    sub, _ = subgraph(n_id, data.edge_index, relabel_nodes=True, num_nodes=N)
    gm(data.x[n_id], sub, node_ids=n_id)
    target = sub[1]
    # GCNConv adds self-loops: the message rows are the edges plus one loop per node
    targets = torch.cat([target, torch.arange(len(n_id))])
    hub_rows = torch.isin(n_id[targets], HUBS)
    exact = torch.isclose(seen["y"], fxquant.truncate(seen["x"], 20, "nearest")).all(1)
    coarse = torch.isclose(seen["y"], fxquant.truncate(seen["x"], 3, "nearest")).all(1)
    assert exact[hub_rows].all() and coarse[~hub_rows].all()
    assert not coarse[hub_rows].all()  # the hub rows really differ from the 3-bit grid


@pytest.mark.parametrize("how", ["set_nodes", "node_bits"])
def test_per_edge_arguments_follow_their_global_target(how):
    """The edge site (GCNConv's normalized edge weights) with per-node settings: its rows
    were counted as nodes ("node_ids has 6 entries, but the edge ... has 20 nodes", also
    for a full batch); each edge now follows its target, as a message does."""
    torch.manual_seed(0)
    if how == "set_nodes":
        mapping = fxquant.QuantMapping().set_name("conv1", fxquant.QuantConfig(3, "nearest"),
                                                  site="edge")
        mapping.set_nodes("conv1", HUBS, 20, site="edge")
    else:
        widths = torch.full((N,), 2.0)
        widths[HUBS] = 8.0
        mapping = fxquant.QuantMapping().set_name("conv1", fxquant.QuantConfig(
            "int8", scale="tensor", node_bits=fxquant.NodeBits(widths)), site="edge")
    gm = fxquant.transform(Net(), mapping)
    point = gm.get_submodule("conv1_edge_quant")
    seen = {}
    point.register_forward_hook(lambda m, args, out: seen.update(x=args[0], y=out))
    data = graph()
    n_id = torch.tensor([7, 2, 20, 11, 3, 50])
    sub, _ = subgraph(n_id, data.edge_index, relabel_nodes=True, num_nodes=N)
    for x, edge_index, ids, nodes in ((data.x[n_id], sub, n_id, n_id),
                                      (data.x, data.edge_index, None, torch.arange(N))):
        gm(x, edge_index, node_ids=ids)
        targets = add_remaining_self_loops(edge_index, num_nodes=len(nodes))[0][1]  # gcn_norm's
        hub_rows = torch.isin(nodes[targets], HUBS)
        assert seen["x"].shape[0] == len(targets) and hub_rows.any() and (~hub_rows).any()
        if how == "set_nodes":
            exact = seen["y"] == fxquant.truncate(seen["x"], 20, "nearest")
            coarse = seen["y"] == fxquant.truncate(seen["x"], 3, "nearest")
            assert exact[hub_rows].all() and coarse[~hub_rows].all()
            assert not coarse[hub_rows].all()
        else:  # 8 bits: within half a step of one per-tensor grid; 2 bits: 0 or +-step
            step = seen["x"].abs().max() / 127
            assert ((seen["y"] - seen["x"])[hub_rows].abs() <= step / 2 + 1e-7).all()
            assert seen["y"][~hub_rows].unique().numel() <= 2


def test_per_edge_arguments_follow_their_target_when_message_reads_no_nodes():
    """A layer whose message() reads only a per-edge argument (no x_i / x_j, no size=):
    the number of targets comes from node_ids, else from the largest target, as the
    aggregation finds it; the edge rows were taken for nodes (a full batch silently gave
    the override to the wrong edges, a batch with node_ids raised)."""
    from torch_geometric.nn import MessagePassing

    class EdgeOnly(MessagePassing):
        def forward(self, x, edge_index, w):
            return self.propagate(edge_index, w=w) + x

        def message(self, w):
            return w.view(-1, 1).expand(-1, 4)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = EdgeOnly()

        def forward(self, x, edge_index, w):
            return self.conv(x, edge_index, w)

    mapping = fxquant.QuantMapping().set_name("conv", fxquant.QuantConfig(3, "nearest"),
                                              site="edge")
    mapping.set_nodes("conv", torch.tensor([5]), 20, site="edge")
    gm = fxquant.transform(Model(), mapping)
    seen = {}
    gm.get_submodule("conv_edge_quant").register_forward_hook(
        lambda m, args, out: seen.update(x=args[0], y=out))
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 1, 2], [1, 2, 3, 4, 5, 5, 0]])
    w = torch.rand(7) + 0.1
    for ids in (None, torch.tensor([5, 11, 12, 13, 14, 15])):
        gm(torch.randn(6, 4), edge_index, w, node_ids=ids)
        hub = torch.tensor([False] * 4 + [True] * 2 + [False]) if ids is None \
            else edge_index[1] == 0
        assert torch.equal(seen["y"][hub], fxquant.truncate(seen["x"], 20, "nearest")[hub])
        assert torch.equal(seen["y"][~hub], fxquant.truncate(seen["x"], 3, "nearest")[~hub])
        assert not torch.equal(seen["y"][hub], fxquant.truncate(seen["x"], 3, "nearest")[hub])


def test_node_ids_are_checked_where_they_enter():
    gm = row_wise_model()
    x = torch.randn(4, 4)
    with pytest.raises(TypeError, match="1-D integer tensor"):
        gm(x, None, node_ids=torch.tensor([0.0, 1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="node_ids has 3 entries"):
        gm(x, None, node_ids=torch.tensor([0, 1, 2]))
    # ids the override never names (or beyond it) are ordinary nodes; no value check
    assert gm(x, None, node_ids=torch.tensor([10_000, 5, 6, 8])).shape == (4, 3)


def test_full_batch_call_is_unchanged_and_state_survives_copies(tmp_path):
    gm = row_wise_model()
    x = graph().x
    expected = gm(x, None)
    for other in (copy.deepcopy(gm), pickle.loads(pickle.dumps(gm))):
        points = [m for m in other.modules() if isinstance(m, fxquant.QuantPoint)]
        context = other.get_submodule("fxquant_node_ids")
        assert all(p.__dict__["_node_ids"] is context for p in points if p.uses_node_ids)
        n_id = torch.tensor([20, 1, 7])
        torch.testing.assert_close(other(x[n_id], None, node_ids=n_id), expected[n_id])
    path = tmp_path / "gm.pt"
    fxquant.save(gm, path)
    torch.manual_seed(0)
    loaded = fxquant.load(path, RowWise())
    n_id = torch.tensor([41, 3])
    torch.testing.assert_close(loaded(x[n_id], None, node_ids=n_id), expected[n_id])


@pytest.mark.slow
def test_batches_of_changing_size_compile_once():
    gm = row_wise_model()
    frames = []

    def backend(graph_module, example_inputs):
        frames.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    compiled = torch.compile(gm, backend=backend, fullgraph=True, dynamic=True)
    data = graph()
    g = torch.Generator().manual_seed(1)
    for size in (5, 9, 17, 4, 30, 11, 6, 25, 8, 13):
        n_id = torch.randperm(N, generator=g)[:size]
        out = compiled(data.x[n_id], data.edge_index, node_ids=n_id)
        torch.testing.assert_close(out, gm(data.x[n_id], data.edge_index, node_ids=n_id))
    assert len(frames) == 1


def test_neighbor_loader_batches():
    """NeighborLoader (torch-sparse or pyg-lib): seed rows come out as in the full graph for
    a row-wise model, so the node-level settings followed the global ids."""
    require("scale", "torch_sparse")
    gm = row_wise_model()
    data = graph()
    full = gm(data.x, data.edge_index)
    with pytest.warns(UserWarning, match="pyg-lib") if _no_pyg_lib() else _nothing():
        loader = NeighborLoader(data, num_neighbors=[3, 3], batch_size=8, shuffle=True)
    for batch in loader:
        out = gm(batch.x, batch.edge_index, node_ids=batch.n_id)
        torch.testing.assert_close(out, full[batch.n_id])


def test_random_node_loader_with_added_ids():
    """RandomNodeLoader batches carry no n_id: add ``data.n_id = arange(N)`` first."""
    gm = row_wise_model()
    data = graph()
    full = gm(data.x, data.edge_index)
    data.n_id = torch.arange(N)
    for batch in RandomNodeLoader(data, num_parts=4, shuffle=True):
        torch.testing.assert_close(gm(batch.x, batch.edge_index, node_ids=batch.n_id),
                                   full[batch.n_id])


def test_graph_level_batches():
    """DataLoader over small graphs: node ids are each node's id in the whole collection."""
    gm = row_wise_model()
    graphs, offset = [], 0
    for i in range(6):
        g = graph(i)
        g = Data(x=g.x[:10], edge_index=g.edge_index[:, :0], n_id=torch.arange(offset, offset + 10))
        graphs.append(g)
        offset += 10
    everything = torch.cat([g.x for g in graphs])
    full = gm(everything, None)
    for batch in DataLoader(graphs, batch_size=2, shuffle=True):
        torch.testing.assert_close(gm(batch.x, batch.edge_index, node_ids=batch.n_id),
                                   full[batch.n_id])


def _no_pyg_lib():
    try:
        import pyg_lib  # noqa: F401
    except ImportError:
        return True
    return False


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
