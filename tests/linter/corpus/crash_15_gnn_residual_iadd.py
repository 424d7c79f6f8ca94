"""GNN-AK's inner GNN: each layer does conv, BatchNorm, `F.relu`, `F.dropout` and then the residual
`x += previous_x`. With dropout 0 (the default) `F.dropout` returns its input unchanged, so `x` is still
the ReLU output that autograd saved, and backward raises; anomaly mode points at `x = F.relu(x)`. The
repository's GCNConv wrapper around torch_geometric is reproduced; the output encoder is the identity.

Source: https://github.com/LingxiaoShawn/GNNAsKernel/issues/3
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch_geometric.nn as gnn
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/LingxiaoShawn/GNNAsKernel/issues/3"


class GCNConv(nn.Module):
    def __init__(self, nin: int, nout: int, bias: bool = True) -> None:
        super().__init__()
        self.layer = gnn.GCNConv(nin, nout, bias=bias)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor) -> torch.Tensor:
        return self.layer(x, edge_index)


class GNN(nn.Module):
    def __init__(
        self, nin: int, nout: int, nlayer: int, dropout: float = 0, bn: bool = True, res: bool = True
    ) -> None:
        super().__init__()
        self.convs = nn.ModuleList([GCNConv(nin, nin, bias=not bn) for _ in range(nlayer)])
        self.norms = nn.ModuleList([nn.BatchNorm1d(nin) if bn else nn.Identity() for _ in range(nlayer)])
        self.output_encoder = nn.Identity()
        self.dropout = dropout
        self.res = res

    def forward(
        self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor, batch: torch.Tensor
    ) -> torch.Tensor:
        previous_x = x
        for layer, norm in zip(self.convs, self.norms, strict=True):
            x = layer(x, edge_index, edge_attr)
            x = norm(x)
            x = F.relu(x)
            x = F.dropout(x, self.dropout, training=self.training)
            if self.res:
                x += previous_x  # CULPRIT
                previous_x = x

        x = self.output_encoder(x)
        return x


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, generator=g)
    edge_index = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
    edge_attr = torch.zeros(6, 1)
    batch = torch.zeros(4, dtype=torch.long)
    return GNN(3, 3, 2), (x, edge_index, edge_attr, batch)
