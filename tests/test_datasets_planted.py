"""fxquant.planted: seeded synthetic graphs with planted labels (heterogeneous, and
graph classification with motifs)."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.loader import DataLoader
from torch_geometric.utils import degree, is_undirected

from fxquant.errors import FxquantValueError
from fxquant.planted import HETERO_EDGE_TYPES, MOTIFS, planted_hetero, planted_motifs

SMALL = dict(num_papers=300, num_authors=120, num_fields=12)


def _same(a, b) -> bool:
    """Every tensor of two HeteroData equal, keys too."""
    da, db = a.to_dict(), b.to_dict()
    return da.keys() == db.keys() and all(
        sa.keys() == db[k].keys() and all(torch.equal(v, db[k][n]) for n, v in sa.items())
        for k, sa in da.items())


def test_hetero_has_three_node_types_and_four_edge_types():
    """The schema is the documented one, every node type receives messages, and indices
    lie within their node types."""
    data = planted_hetero(**SMALL)
    assert data.node_types == ["author", "paper", "field"]
    assert tuple(data.edge_types) == HETERO_EDGE_TYPES
    assert {dst for _, _, dst in data.edge_types} == set(data.node_types)
    for (src, _, dst), store in zip(data.edge_types, data.edge_stores, strict=True):
        ei = store.edge_index
        assert ei.dtype == torch.long and ei.shape[0] == 2 and ei.shape[1] > 0
        assert int(ei[0].max()) < data[src].num_nodes and int(ei[1].max()) < data[dst].num_nodes
    writes = data["author", "writes", "paper"].edge_index
    assert torch.equal(data["paper", "rev_writes", "author"].edge_index.flip(0).sort(dim=1)[0],
                       writes.sort(dim=1)[0])
    cites = data["paper", "cites", "paper"].edge_index
    assert not bool((cites[0] == cites[1]).any())


def test_hetero_is_deterministic_in_its_seed():
    """The same seed gives the same graph bit for bit; another seed another graph."""
    assert _same(planted_hetero(**SMALL, seed=3), planted_hetero(**SMALL, seed=3))
    assert not _same(planted_hetero(**SMALL, seed=3), planted_hetero(**SMALL, seed=4))


def test_hetero_splits_and_labels():
    """Papers have balanced classes and disjoint 60/20/20 masks covering them all."""
    data = planted_hetero(**SMALL, num_classes=3)
    paper = data["paper"]
    assert paper.y.bincount().tolist() == [100, 100, 100]
    masks = torch.stack([paper.train_mask, paper.val_mask, paper.test_mask])
    assert masks.sum(0).eq(1).all()
    assert masks.sum(1).tolist() == [180, 60, 60]


def test_hetero_has_a_degree_tail():
    """A few authors write far more papers than the mean (heavy tail), and a lighter tail
    parameter makes it lighter."""
    def author_ratio(tail):
        data = planted_hetero(**SMALL, tail=tail)
        d = degree(data["author", "writes", "paper"].edge_index[0], data["author"].num_nodes)
        return float(d.max() / d.mean())
    assert author_ratio(1.2) > 8
    assert author_ratio(1.2) > author_ratio(20.0)


def test_hetero_edges_follow_classes_as_homophily_says():
    """With homophily 1 every citation stays within its class; with 0 about 1/classes do."""
    def within(h):
        data = planted_hetero(**SMALL, homophily=h)
        y, ei = data["paper"].y, data["paper", "cites", "paper"].edge_index
        return float((y[ei[0]] == y[ei[1]]).float().mean())
    assert within(1.0) == 1.0
    assert within(0.0) < 0.45


def test_hetero_channels_and_errors():
    """channels sets widths per node type; unknown types and bad values are refused."""
    data = planted_hetero(**SMALL, channels={"paper": 5})
    assert data["paper"].x.shape[1] == 5 and data["author"].x.shape[1] == 16
    with pytest.raises(FxquantValueError, match=r"channels names node types \['venue'\]"):
        planted_hetero(**SMALL, channels={"venue": 3})
    with pytest.raises(FxquantValueError, match="homophily must lie in"):
        planted_hetero(**SMALL, homophily=1.5)
    with pytest.raises(FxquantValueError, match="num_papers must be an int"):
        planted_hetero(num_papers=2)


def test_motifs_are_balanced_undirected_and_deterministic():
    """Classes are balanced, graphs undirected with the motif's nodes added, and the same
    seed gives the same set."""
    ds = planted_motifs(num_graphs=40, seed=5)
    assert ds.num_classes == len(MOTIFS) and ds.num_features == 8
    assert torch.cat([d.y for d in ds]).bincount().tolist() == [10] * 4
    for d in ds:
        assert is_undirected(d.edge_index) and 10 + 4 <= d.num_nodes <= 30 + 6
        assert torch.equal(d.x[:, 0], torch.ones(d.num_nodes))
    again = planted_motifs(num_graphs=40, seed=5)
    assert all(torch.equal(a.edge_index, b.edge_index) and torch.equal(a.x, b.x)
               for a, b in zip(ds, again, strict=True))
    assert not all(torch.equal(a.x, b.x) for a, b in zip(ds, planted_motifs(40, seed=6),
                                                          strict=True))


@pytest.mark.parametrize(("motif", "cycles"), [("house", 2), ("cycle6", 1), ("clique4", 3),
                                               ("path5", 0)])
def test_each_graph_carries_exactly_its_motifs_cycles(motif, cycles):
    """A tree plus the motif: the cycle rank |E| - |V| + 1 is the motif's own."""
    ds = planted_motifs(num_graphs=6, motifs=(motif, "path5" if motif != "path5" else "house"))
    for d in ds:
        if ds.motifs[int(d.y)] == motif:
            assert d.edge_index.shape[1] // 2 - d.num_nodes + 1 == cycles


def test_motifs_batch_with_pyg_dataloader():
    """A DataLoader of many small graphs gives a batch vector over its graphs."""
    batch = next(iter(DataLoader(planted_motifs(num_graphs=10), batch_size=4)))
    assert batch.num_graphs == 4 and int(batch.batch.max()) == 3 and batch.y.shape == (4,)


def test_motifs_errors():
    """Unknown or repeated motifs, bad sizes and widths are refused by name."""
    with pytest.raises(FxquantValueError, match="motifs must name"):
        planted_motifs(motifs=("house", "star"))
    with pytest.raises(FxquantValueError, match="motifs must name"):
        planted_motifs(motifs=("house", "house"))
    with pytest.raises(FxquantValueError, match="nodes must be"):
        planted_motifs(nodes=(5, 2))
    with pytest.raises(FxquantValueError, match="channels must be"):
        planted_motifs(channels=0)
