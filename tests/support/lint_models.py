"""Models with autograd traps, one per case, for the lint and check tests.

The tests find lines by their text, so keep each statement on one line.
"""

from __future__ import annotations

import functools

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


class SparseResidual(nn.Module):
    """A graph layer over a sparse adjacency buffer (COO, CSR or CSC) whose ReLU output is
    then added to in place: ReLU saved it, backward fails."""

    def __init__(self, layout=torch.sparse_coo):
        super().__init__()
        index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
        adj = torch.sparse_coo_tensor(index, torch.ones(4), (4, 4)).coalesce()
        if layout == torch.sparse_csr:
            adj = adj.to_sparse_csr()
        elif layout == torch.sparse_csc:
            adj = adj.to_sparse_csc()
        self.register_buffer("adj", adj)
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        h = torch.relu(self.lin(x))
        h += self.adj @ x
        return h


class SparseValuesScaled(SparseResidual):
    """Legal, but writes into the sparse buffer's values: lint and check must put them back."""

    def forward(self, x):
        self.adj.values().mul_(2)
        return torch.relu(self.lin(self.adj @ x))


class MLP(nn.Sequential):
    """An nn.Sequential subclass that appends ReLU(inplace=True) then Dropout(inplace=True)
    in __init__: the Dropout writes into what the ReLU saved."""

    def __init__(self, sizes=(3, 4, 2), inplace=True):
        layers = []
        for i in range(len(sizes) - 2):
            a, b = sizes[i], sizes[i + 1]
            layers.append(nn.Linear(a, b))
            layers.append(nn.ReLU(inplace=inplace))
            layers.append(nn.Dropout(0.5, inplace=inplace))
        layers.append(nn.Linear(sizes[-2], sizes[-1]))
        super().__init__(*layers)


class UsesMLP(nn.Module):
    """The same container, called from a forward."""

    def __init__(self):
        super().__init__()
        self.mlp = MLP()

    def forward(self, x):
        return self.mlp(x) * 2


class SwitchedInplace(nn.Module):
    """Modules built out of place, switched to in-place by a loop at the end of __init__."""

    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Dropout(0.5), nn.Linear(4, 1))
        for m in self.modules():
            if isinstance(m, (nn.ReLU, nn.Dropout)):
                m.inplace = True

    def forward(self, x):
        return self.block(x)


def numpy_threshold(y):
    arr = y.detach().numpy()
    arr[arr < 0.5] = 0.0
    return y


class NumpyGate(nn.Module):
    """A sigmoid thresholded through a NumPy view: sigmoid's saved output changes unseen."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.out = nn.Linear(3, 1)

    def forward(self, x):
        y = torch.sigmoid(self.lin(x))
        y = numpy_threshold(y)
        return self.out(y)


class AddOne(torch.autograd.Function):
    """A custom Function whose backward adds one to its incoming gradient in place."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        g = grad
        g += 1
        return g


class SharedGradient(nn.Module):
    """AddOne's output is added to another branch: both get the same gradient tensor."""

    def __init__(self, shared=True):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)
        self.head = nn.Linear(3, 1)
        self.shared = shared

    def forward(self, x):
        other = self.b(x)
        y = AddOne.apply(self.a(x))
        if self.shared:
            return self.head(y + other)
        return self.head(y) + self.head(other)


class NoHooksBlock(nn.Module):
    """Legal code that switches saved-tensor hooks off for a block (fxquant's hooks fail)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        with torch.autograd.graph.disable_saved_tensors_hooks("no hooks in this block"):
            h = self.lin(x) * 2
        return torch.exp(h)


class CountsAndBreaks(nn.Module):
    """A zero counter buffer, an EMA read after its update, a buffer the forward never
    touches, a non-persistent one, and an in-place bug (exp saved y)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("n", torch.zeros((), dtype=torch.long))
        self.register_buffer("ema", torch.zeros(3))
        self.register_buffer("version", torch.zeros(()))
        self.register_buffer("scratch", torch.zeros(3), persistent=False)

    def forward(self, x):
        self.n += 1
        h = self.lin(x)
        with torch.no_grad():
            self.ema += 0.5 * (h.mean(0) - self.ema)
        self.scratch.copy_(h[0].detach())
        y = torch.exp(h - self.ema)
        y += 1
        return y


def make_block(width, inplace=True):
    """A helper that builds the container (the construction line is here, not in the model's
    class): Tanh saves its output, Hardtanh(inplace=True) then writes into it."""
    return nn.Sequential(nn.Linear(width, width), nn.Tanh(),
                         nn.Hardtanh(inplace=inplace))


def make_tower(width):
    """A helper calling the helper above: two calls deep."""
    return nn.Sequential(make_block(width, inplace=False), make_block(width))


class HelperBuilt(nn.Module):
    """Two containers from helpers: ``head`` (clean) and ``body`` (the in-place one)."""

    def __init__(self, width=4):
        super().__init__()
        self.head = nn.Sequential(nn.Linear(width, width), nn.Hardtanh(inplace=False))
        self.body = make_block(width)

    def forward(self, x):
        return self.body(self.head(x))


class TowerBuilt(nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.tower = make_tower(width)

    def forward(self, x):
        return self.tower(x)


make_partial_block = functools.partial(make_block, inplace=True)


def _level3(width):
    return nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Hardtanh(inplace=True))


def _level2(width):
    return _level3(width)


def _level1(width):
    return _level2(width)


class _CleanHead(nn.Module):
    """A clean Hardtanh(inplace=False) in the class: not the culprit."""

    def __init__(self, width=4):
        super().__init__()
        self.head = nn.Sequential(nn.Linear(width, width), nn.Hardtanh(inplace=False))

    def forward(self, x):
        return self.body(self.head(x))


class ViaMethod(_CleanHead):
    def __init__(self, width=4):
        super().__init__(width)
        self.body = self._block(width)

    def _block(self, width):
        return nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Hardtanh(inplace=True))


class ViaPartial(_CleanHead):
    def __init__(self, width=4):
        super().__init__(width)
        self.body = make_partial_block(width)


class ViaThreeCalls(_CleanHead):
    def __init__(self, width=4):
        super().__init__(width)
        self.body = _level1(width)
