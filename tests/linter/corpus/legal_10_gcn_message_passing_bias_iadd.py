"""The GCNConv from PyG's "Creating Message Passing Networks" tutorial: it zeroes infinite entries of the
degree normalization in place, `deg_inv_sqrt[deg_inv_sqrt == float('inf')] = 0`, and adds the bias in place
after propagation, `out += self.bias`. The issue reports that the `+=` "makes torch fail in some cases" and
the docs were changed to `out = out + self.bias`; with the tutorial's sum aggregation both in-place ops are
legal: the degree tensor does not require grad, and scatter-add does not save its output.

Source: https://github.com/pyg-team/pytorch_geometric/issues/8953
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import MessagePassing
from torch_geometric.utils import add_self_loops, degree

KIND = "legal"
FIXABLE = True
SOURCE = "https://github.com/pyg-team/pytorch_geometric/issues/8953"


class GCNConv(MessagePassing):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(aggr="add")  # "Add" aggregation (Step 5).
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.empty(out_channels))

        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.lin.reset_parameters()
        self.bias.data.zero_()

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        # Step 1: Add self-loops to the adjacency matrix.
        edge_index, _ = add_self_loops(edge_index, num_nodes=x.size(0))

        # Step 2: Linearly transform node feature matrix.
        x = self.lin(x)

        # Step 3: Compute normalization.
        row, col = edge_index
        deg = degree(col, x.size(0), dtype=x.dtype)
        deg_inv_sqrt = deg.pow(-0.5)
        deg_inv_sqrt[deg_inv_sqrt == float("inf")] = 0
        norm = deg_inv_sqrt[row] * deg_inv_sqrt[col]

        # Step 4-5: Start propagating messages.
        out = self.propagate(edge_index, x=x, norm=norm)

        # Step 6: Apply a final bias vector.
        out += self.bias

        return out

    def message(self, x_j: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
        # x_j has shape [E, out_channels]

        # Step 4: Normalize node features.
        return norm.view(-1, 1) * x_j


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = GCNConv(3, 2)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv(x, edge_index)


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    return Model(), (torch.randn(4, 3, generator=g), edge_index)
