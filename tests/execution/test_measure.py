"""fxquant.execution.storage and bit_operations: counts checked by hand on small models."""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import GCNConv, GINConv

import fxquant
from fxquant.execution import bit_operations, storage

SITES = ("input", "weight", "message", "aggregate", "output")


class Two(nn.Module):
    def __init__(self, conv1: nn.Module, conv2: nn.Module) -> None:
        super().__init__()
        self.conv1, self.conv2 = conv1, conv2

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def _graph(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randint(0, n, (2, 30), generator=g)


def test_width_tables_take_half_a_byte_a_node_rounded_up():
    """Per-node widths are stored as a 4-bit width a node: 11 nodes take 6 bytes (44 bits),
    not 5."""
    n = 11
    x, edge_index = _graph(n)
    bits = torch.randint(2, 9, (n,), generator=torch.Generator().manual_seed(0))
    m = fxquant.QuantMapping()
    for site in SITES:
        m = m.set_global(fxquant.QuantConfig(
            "int8", scale="tensor",
            node_bits=None if site == "weight" else fxquant.NodeBits(bits)), site=site)
    torch.manual_seed(0)
    gm = fxquant.transform(Two(GCNConv(8, 16), GCNConv(16, 3)), m, lint="off")
    gm.train()
    gm(x, edge_index, node_ids=torch.arange(n))
    gm.eval()
    model = fxquant.convert(gm, strict=False)
    tables = sum(1 for p in model.modules()
                 if isinstance(p, fxquant.execution.quantizer.IntQuantizer)
                 and p.widths is not None and p.spec.site != "weight")
    counted = storage(model, x, edge_index, node_ids=torch.arange(n)).width_table_bytes
    assert tables and counted == tables * 6


def test_gin_float32_reference_runs_one_product_a_linear():
    """GIN's first linear runs two integer products (the aggregate's codes and the node's
    own, two grids) where the float32 model runs one on their sum: its float32 bit
    operations count that one product."""
    n = 11
    x, edge_index = _graph(n)
    m = fxquant.QuantMapping()
    for site in SITES:
        m = m.set_global(fxquant.QuantConfig("int8", scale="tensor"), site=site)
    torch.manual_seed(0)
    gm = fxquant.transform(Two(GINConv(nn.Linear(8, 16), eps=0.5), GINConv(nn.Linear(16, 3))),
                           m, lint="off")
    gm.train()
    gm(x, edge_index)
    gm.eval()
    ops = bit_operations(fxquant.convert(gm), x, edge_index)
    products = n * 8 * 16 + n * 16 * 3  # multiply-accumulates, one product a layer
    sums = edge_index.shape[1] * (8 + 16)  # additions of one message value each
    assert ops.float32_bitops == products * 32 * 32 + sums * 32
    assert ops.bitops == 2 * products * 8 * 8 + sums * 8
