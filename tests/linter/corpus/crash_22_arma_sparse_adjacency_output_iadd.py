"""DGL's ARMA example sums its K stacks in place: `output = feats` for the first stack, then
`output += feats` for the next, where `feats` is the output of the activation (`F.relu`), which ReLU saved
for its backward; backward raises "output 0 of ReluBackward0 ... is at version 1" on Cora's [2708, 7].
Here the graph's adjacency is kept as a sparse COO buffer, the way GNN code without a graph library
propagates (`torch.sparse.mm(self.adj, feats)` in place of `update_all(copy_u, sum)`); two stacks, one
layer each.

Source: https://github.com/dmlc/dgl/issues/4202
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

KIND = "crash"
FIXABLE = True
SOURCE = "https://github.com/dmlc/dgl/issues/4202"
CATEGORY = "sparse"


class ARMAConv(nn.Module):
    def __init__(self, adj: torch.Tensor, in_dim: int = 3, out_dim: int = 2, num_stacks: int = 2) -> None:
        super().__init__()
        self.K = num_stacks
        self.register_buffer("adj", adj)
        self.w_0 = nn.ModuleList([nn.Linear(in_dim, out_dim, bias=False) for _ in range(num_stacks)])
        self.v = nn.ModuleList([nn.Linear(in_dim, out_dim, bias=False) for _ in range(num_stacks)])

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        init_feats = feats
        output = None
        for k in range(self.K):
            feats = torch.sparse.mm(self.adj, init_feats)
            feats = self.w_0[k](feats)
            feats = feats + self.v[k](init_feats)
            feats = F.relu(feats)
            if output is None:
                output = feats
            else:
                output += feats  # CULPRIT
        return output / self.K


def make() -> tuple[nn.Module, tuple]:
    """The model and its example inputs (deterministic, tiny)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    index = torch.tensor([[0, 1, 1, 2, 2, 3, 3, 0], [1, 0, 2, 1, 3, 2, 0, 3]])
    adj = torch.sparse_coo_tensor(index, torch.full((8,), 0.5), (4, 4)).coalesce()
    return ARMAConv(adj), (torch.randn(4, 3, generator=g),)
