# ruff: noqa: RUF005  (the seed model is written the way the user's code writes it)
"""Small models in the three styles users write, shared by the tests: hand-made graphs,
PyG's ``examples/gcn.py`` GCN, and the seed model, a user's float -> bit-planes -> float
GCN with every problem fxquant exists to find (the linter's tests locate its lines)."""

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


class PygGCN(nn.Module):
    """PyG's ``examples/gcn.py`` model: dropout 0.5 on the input and the hidden layer,
    ``GCNConv(cached=True)``."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden_channels, cached=True)
        self.conv2 = GCNConv(hidden_channels, out_channels, cached=True)

    def forward(self, x, edge_index, edge_weight=None):
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, edge_index, edge_weight).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index, edge_weight)


# -- the seed model: a user's float -> bit-planes -> float rounding between layers ----------
# (rewritten from a user's report: ``out *= ...`` into a saved pow result, factories without
# ``device=``, anomaly mode in forward, zero gradient, a ``[..., 135]`` float per value, and
# out-of-range indices for zeros and tiny values; the lint tests find each at its line)


def integer2bit(integer, num_bits=8):
    """Integer-valued float tensor -> its lowest ``num_bits`` bits, most significant first."""
    exponent_bits = -torch.arange(-(num_bits - 1), 1).type(integer.type())
    exponent_bits = exponent_bits.repeat(integer.shape + (1,))
    out = integer.unsqueeze(-1) / 2**exponent_bits
    return (out - (out % 1)) % 2


def remainder2bit(remainder, num_bits=127):
    """Fractions in [0, 1) -> their first ``num_bits`` binary digits."""
    dtype = remainder.type()
    exponent_bits = torch.arange(num_bits).type(dtype)
    exponent_bits = exponent_bits.repeat(remainder.shape + (1,))
    out = (remainder.unsqueeze(-1) * 2**exponent_bits) % 1
    return torch.floor(2 * out)


def float2bit(f, num_e_bits=8, num_m_bits=23, bias=127.0, dtype=torch.float32):
    """float -> [..., 1 + num_e_bits + num_m_bits] bit-planes (the user's code)."""
    s = torch.sign(f)
    f = f * s
    s = (s * (-1) + 1.0) * 0.5
    s = s.unsqueeze(-1)
    e_scientific = torch.floor(torch.log2(f))
    e_decimal = e_scientific + bias
    e = integer2bit(e_decimal, num_bits=num_e_bits)
    m1 = integer2bit(f - f % 1, num_bits=num_e_bits)
    m2 = remainder2bit(f % 1, num_bits=bias)
    m = torch.cat([m1, m2], dim=-1)
    dtype = f.type()
    idx = torch.arange(num_m_bits).unsqueeze(0).type(dtype) + (8.0 - e_scientific).unsqueeze(-1)
    idx = idx.long()
    m = torch.gather(m, dim=-1, index=idx)
    return torch.cat([s, e, m], dim=-1).type(dtype)


def bit2float(b, num_e_bits=8, num_m_bits=23, bias=127.0):
    """bit-planes -> float (the user's code: `out *=` twice into a view of pow's output)."""
    dtype = torch.float32
    s = torch.index_select(b, -1, torch.arange(0, 1))
    e = torch.index_select(b, -1, torch.arange(1, 1 + num_e_bits))
    m = torch.index_select(b, -1, torch.arange(1 + num_e_bits, 1 + num_e_bits + num_m_bits))
    out = ((-1) ** s).squeeze(-1).type(dtype)
    exponents = -torch.arange(-(num_e_bits - 1.0), 1.0)
    exponents = exponents.repeat(b.shape[:-1] + (1,))
    e_decimal = torch.sum(e * 2**exponents, dim=-1) - bias
    out *= 2**e_decimal
    matissa = (torch.Tensor([2.0]) ** (-torch.arange(1.0, num_m_bits + 1.0))).repeat(m.shape[:-1] + (1,))
    out *= 1.0 + torch.sum(m * matissa, dim=-1)
    return out


def bitplane_roundtrip(x):
    """What the model does between layers: float -> bit-planes -> float."""
    return bit2float(float2bit(x))


class SeedGCN(torch.nn.Module):
    """The user's 2-layer GCN: bit-plane round trips after each layer, super-node masking.

    Super nodes keep 12 bits (the user's code keeps 2, which collapses values to ~2**-127 and makes
    the next ``float2bit`` index out of range).
    """

    def __init__(self, in_channels=4, hidden=8, out_channels=2, super_node=(0,)):
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden)
        self.conv2 = GCNConv(hidden, out_channels)
        self.super_node = torch.tensor(super_node)

    def forward(self, data):
        torch.autograd.set_detect_anomaly(True)
        x, edge_index = data.x, data.edge_index
        x = self.conv1(x, edge_index)
        bit_x = float2bit(x)
        float_x = bit2float(bit_x)
        x = torch.sigmoid(float_x)
        bit_x = float2bit(x)
        bit_x[self.super_node, :, 12:] = 0
        float_x = bit2float(bit_x)
        x = self.conv2(float_x, edge_index)
        bit_x = float2bit(x)
        float_x = bit2float(bit_x)
        return F.log_softmax(float_x, dim=1)


def seed() -> tuple[SeedGCN, tuple[Data]]:
    """(model, example inputs): the 2-layer GCN with bit-plane round trips, on 20 nodes."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(20, 8, generator=g)
    edge_index = torch.randint(0, 20, (2, 60), generator=g)
    return SeedGCN(in_channels=8, hidden=16, out_channels=3), (Data(x=x, edge_index=edge_index),)
