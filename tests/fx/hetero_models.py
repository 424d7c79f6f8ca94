"""Small heterogeneous graphs and the dict-taking models users write (shared by the
hetero tests)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import HeteroData
from torch_geometric.nn import HANConv, HeteroConv, HGTConv, Linear, SAGEConv, to_hetero

EDGE_TYPES = [("author", "writes", "paper"), ("paper", "rev_writes", "author"),
              ("paper", "cites", "paper")]


def hetero_graph(seed: int = 0, papers: int = 6, authors: int = 5) -> HeteroData:
    """Two node types of different widths, three edge types (one within papers)."""
    gen = torch.Generator().manual_seed(seed)
    data = HeteroData()
    data["paper"].x = torch.randn(papers, 4, generator=gen)
    data["author"].x = torch.randn(authors, 3, generator=gen)
    writes = torch.tensor([[0, 1, 2, 3, 4, 0], [0, 1, 2, 3, papers - 1, 2]])
    data["author", "writes", "paper"].edge_index = writes
    data["paper", "rev_writes", "author"].edge_index = writes.flip(0)
    data["paper", "cites", "paper"].edge_index = torch.tensor([[0, 1, 2, 4], [1, 2, 3, 1]])
    return data


def inputs(data: HeteroData) -> tuple[dict, dict]:
    return data.x_dict, data.edge_index_dict


class HeteroConvNet(nn.Module):
    """Two HeteroConv layers of SAGEConvs, a dict comprehension between, a per-type head."""

    def __init__(self, hidden: int = 8, out: int = 2):
        super().__init__()
        self.conv1 = HeteroConv({("author", "writes", "paper"): SAGEConv((3, 4), hidden),
                                 ("paper", "rev_writes", "author"): SAGEConv((4, 3), hidden),
                                 ("paper", "cites", "paper"): SAGEConv(4, hidden)}, aggr="sum")
        self.conv2 = HeteroConv({et: SAGEConv(hidden, hidden) for et in EDGE_TYPES}, aggr="mean")
        self.head = nn.Linear(hidden, out)

    def forward(self, x_dict, edge_index_dict):
        x_dict = self.conv1(x_dict, edge_index_dict)
        x_dict = {key: F.dropout(x.relu(), 0.5, self.training) for key, x in x_dict.items()}
        x_dict = self.conv2(x_dict, edge_index_dict)
        return self.head(x_dict["paper"])


class HGT(nn.Module):
    """HGTConv (one layer for all types, a leaf that returns a dict) and a head."""

    def __init__(self, metadata, hidden: int = 8):
        super().__init__()
        self.lin = nn.ModuleDict({"paper": Linear(4, hidden), "author": Linear(3, hidden)})
        self.conv = HGTConv(hidden, hidden, metadata, heads=2)
        self.head = nn.Linear(hidden, 2)

    def forward(self, x_dict, edge_index_dict):
        x_dict = {key: self.lin[key](x).relu() for key, x in x_dict.items()}
        x_dict = self.conv(x_dict, edge_index_dict)
        return self.head(x_dict["paper"])


class HAN(nn.Module):
    """HANConv returns None for node types that receive no edge: code filters them."""

    def __init__(self, metadata, hidden: int = 8):
        super().__init__()
        self.conv = HANConv({"paper": 4, "author": 3}, hidden, metadata, heads=2)
        self.head = nn.Linear(hidden, 2)

    def forward(self, x_dict, edge_index_dict):
        out = self.conv(x_dict, edge_index_dict)
        return {key: self.head(x) for key, x in out.items() if x is not None}


class Sage(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = SAGEConv((-1, -1), 8)
        self.conv2 = SAGEConv((-1, -1), 2)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def to_hetero_sage(data: HeteroData) -> nn.Module:
    """PyG's to_hetero(GraphSAGE), its lazy layers initialised."""
    torch.manual_seed(0)
    model = to_hetero(Sage(), data.metadata(), aggr="sum")
    model(*inputs(data))
    return model
