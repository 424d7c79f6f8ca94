"""Small models in the three styles users write, shared by the tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv


def tiny_graph(num_nodes: int = 6, in_channels: int = 4, seed: int = 0) -> Data:
    """A hand-made graph: a ring plus a hub (node 0), random features, two classes."""
    g = torch.Generator().manual_seed(seed)
    src = list(range(num_nodes)) + [0] * (num_nodes - 1)
    dst = [(i + 1) % num_nodes for i in range(num_nodes)] + list(range(1, num_nodes))
    edge_index = torch.tensor([src + dst, dst + src])
    x = torch.randn(num_nodes, in_channels, generator=g)
    y = torch.arange(num_nodes) % 2
    return Data(x=x, edge_index=edge_index, y=y)


class GCN(nn.Module):
    """The seed's model, unmodified: ``forward(x, edge_index)``."""

    def __init__(self, in_channels: int = 4, hidden: int = 8, out_channels: int = 2, **conv_kw):
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden, **conv_kw)
        self.conv2 = GCNConv(hidden, out_channels, **conv_kw)

    def forward(self, x, edge_index):
        x = self.conv1(x, edge_index)
        x = torch.sigmoid(x)
        x = self.conv2(x, edge_index)
        return F.log_softmax(x, dim=1)


class TwoLayers(nn.Module):
    """Two ``GCNConv`` with a ReLU between (3 -> 4 -> 2 channels)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = GCNConv(3, 4), GCNConv(4, 2)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def penalty_steps(gm: nn.Module, x: torch.Tensor, edge_index: torch.Tensor, steps: int,
                  lr: float, target_bits: float = 2.0) -> None:
    """A few Adam steps on the output's sum plus ``fxquant.bit_penalty`` (learned bits)."""
    import fxquant

    optimizer = torch.optim.Adam(gm.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        (gm(x, edge_index).sum() + fxquant.bit_penalty(gm, target_bits)).backward()
        optimizer.step()


class DataGCN(GCN):
    """The same model reading a PyG ``Data`` object: ``forward(data)``."""

    def forward(self, data):  # type: ignore[override]
        x, edge_index = data.x, data.edge_index
        return super().forward(x, edge_index)


class MLPGCN(nn.Module):
    """Mixed layers: Linear, functional ReLU, a conv, and a method call."""

    def __init__(self, in_channels: int = 4, hidden: int = 8, out_channels: int = 2):
        super().__init__()
        self.lin = nn.Linear(in_channels, hidden)
        self.conv = GCNConv(hidden, out_channels)

    def forward(self, x, edge_index):
        h = F.relu(self.lin(x))
        return self.conv(h, edge_index).log_softmax(dim=-1)


class Block(nn.Module):
    """Data-dependent Python: traceable only as a leaf."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:
            return self.lin(x)
        return -x


class WithBlock(nn.Module):
    """A GCN behind a block that symbolic tracing cannot follow."""

    def __init__(self):
        super().__init__()
        self.block = Block()
        self.conv = GCNConv(4, 2)

    def forward(self, x, edge_index):
        return self.conv(self.block(x), edge_index)
