"""Tests of quantization: formats, points, sites, per-node precision, save/load."""

from torch import nn
from torch_geometric.nn import GCNConv


class TwoGCN(nn.Module):
    """Two GCNConv layers (4 -> 8 -> 3 channels) with a ReLU between them."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = GCNConv(4, 8), GCNConv(8, 3)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)
