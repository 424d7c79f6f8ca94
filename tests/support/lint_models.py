"""Models with autograd traps, one per case, for the lint and check tests.

The tests find lines by their text, so keep each statement on one line.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GCNConv


class _WithX(nn.Module):
    def __init__(self):
        super().__init__()
        self.X = nn.Parameter(torch.rand(3, 4))


class FillLeaf(_WithX):
    """Seed 2, case 1: `X.fill_(0)` on a leaf that requires grad."""

    def forward(self, x):
        self.X.fill_(0)
        return (self.X * x).sum()


class DataScale(_WithX):
    """Seed 2, case 2: `X.data *= 2` after Y = X ** 2: silently wrong gradient."""

    def forward(self, x):
        y = self.X**2
        self.X.data *= 2
        return y.sum() + x.sum()


class DetachAdd(_WithX):
    """Seed 2, case 3: `X.detach().add_(100)` after Y = X ** 2: backward fails."""

    def forward(self, x):
        y = self.X**2
        self.X.detach().add_(100)
        return y.sum() + x.sum()


class LegalInplace(nn.Module):
    """In-place ops that are fine: nothing saved what they write."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.conv = GCNConv(4, 4)

    def forward(self, x, edge_index):
        h = torch.relu_(self.lin(x))
        h = F.relu(self.conv(h, edge_index), inplace=True)
        z = torch.zeros(h.shape, device=h.device, dtype=h.dtype)
        z[:, 0] = h[:, 0]
        return z + h


class Raises(nn.Module):
    """A forward that switches anomaly mode on and then fails."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        torch.autograd.set_detect_anomaly(True)
        self.lin.weight.data.mul_(3)
        return self.lin(x)[:, 99]


class SymbolicTraps(nn.Module):
    """What a symbolic graph can show: in-place methods, .data, constants, floor."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, x):
        y = torch.exp(self.lin(x))
        y.add_(1)
        h = F.relu(self.lin(x), inplace=True)
        d = self.w.data
        q = torch.floor(self.lin(x))
        return y + h + d + q + torch.arange(3)


class ParamWrite(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, x):
        self.w.mul_(2)
        return x * self.w
