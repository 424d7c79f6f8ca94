"""Node ids of every integer dtype mean the same nodes (``uint8`` is not a mask); a bool
mask is taken where it is documented (overrides) and refused as ``node_ids=``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch_geometric.nn import GCNConv

import fxquant
from fxquant.quant.config import NodeBits
from fxquant.quant.nodes import lookup, top_degree_nodes

DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
#: node ids every dtype above can hold
MAX_ID = 127


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.lin = GCNConv(4, 6), nn.Linear(6, 3)

    def forward(self, x, edge_index):
        return self.lin(self.conv(x, edge_index).relu())


def _model(feature: str, hubs: torch.Tensor) -> torch.fx.GraphModule:
    torch.manual_seed(0)
    mapping = fxquant.QuantMapping()
    if feature == "override":
        mapping.set_name("lin", fxquant.QuantConfig(4, "nearest")).set_nodes("lin", hubs, 16)
    elif feature == "fixed bits":
        bits = (torch.arange(MAX_ID + 1) % 7 + 2).float()
        mapping.set_name("lin", fxquant.QuantConfig("int8", scale="tensor",
                                                    node_bits=NodeBits(bits)))
    elif feature == "learned bits":
        mapping.set_name("lin", fxquant.QuantConfig(
            "int8", scale="tensor", range="lsq",
            node_bits=NodeBits.learned_init(MAX_ID + 1, 3.0)))
    else:  # messages keyed by their target's global id
        mapping.set_name("conv", fxquant.QuantConfig(3, "nearest"), site="message")
        mapping.set_nodes("conv", hubs, 20, site="message")
    return fxquant.transform(Net(), mapping, lint="off")


@settings(max_examples=25)
@given(feature=st.sampled_from(["override", "fixed bits", "learned bits", "messages"]),
       dtype=st.sampled_from(DTYPES),
       ids=st.lists(st.integers(0, MAX_ID), min_size=2, max_size=12, unique=True),
       hubs=st.lists(st.integers(0, MAX_ID), min_size=1, max_size=5, unique=True),
       seed=st.integers(0, 2**16))
def test_every_integer_dtype_names_the_same_nodes(feature, dtype, ids, hubs, seed):
    """Training and evaluation forwards with node ids (and override ids) of any integer
    dtype give what int64 ids give, outputs and state."""
    g = torch.Generator().manual_seed(seed)
    n = len(ids)
    x = torch.randn(n, 4, generator=g)
    edge_index = torch.randint(0, n, (2, 3 * n), generator=g)
    results = []
    for kind in (torch.int64, dtype):
        gm = _model(feature, torch.tensor(hubs, dtype=kind))
        node_ids = torch.tensor(ids, dtype=kind)
        train = gm(x, edge_index, node_ids=node_ids)
        gm.eval()
        evaluation = gm(x, edge_index, node_ids=node_ids)
        results.append((train, evaluation, gm.state_dict()))
    (t0, e0, s0), (t1, e1, s1) = results
    assert torch.equal(t0, t1) and torch.equal(e0, e1)
    assert s0.keys() == s1.keys()
    for key in s0:
        if key.endswith("override.nodes"):
            continue  # stored as given
        assert torch.equal(s0[key], s1[key]), key


def test_uint8_ids_are_not_a_mask():
    """The reported case: uint8 node ids were read as a mask (wrong bit-widths or an
    IndexError), int8/int16 ids crashed."""
    table = torch.arange(300.0)
    ids = torch.tensor([200, 3, 255], dtype=torch.uint8)
    assert lookup(table, ids).tolist() == [200.0, 3.0, 255.0]
    for dtype in (torch.int8, torch.int16):
        assert lookup(table, torch.tensor([5, 1], dtype=dtype)).tolist() == [5.0, 1.0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_degree_helpers_take_any_integer_dtype(dtype):
    """top_degree_nodes and NodeBits.by_degree read edge_index of any integer dtype."""
    edge_index = torch.tensor([[1, 2, 3, 0, 0], [0, 0, 0, 1, 2]])
    assert top_degree_nodes(edge_index.to(dtype), 0.25).tolist() == [0]
    bits = NodeBits.by_degree(edge_index.to(dtype), [0.5], [2, 4], num_nodes=4).bits
    assert bits.tolist() == NodeBits.by_degree(edge_index, [0.5], [2, 4], num_nodes=4).bits.tolist()


def test_bool_node_ids_of_a_forward_are_refused_with_the_fix():
    """node_ids= names each row's node: a bool mask there is an error that says what to
    pass instead; as an override's nodes a mask is taken (documented)."""
    mask = torch.zeros(MAX_ID + 1, dtype=torch.bool)
    mask[[3, 7]] = True
    gm = _model("override", mask)
    x, edge_index = torch.randn(4, 4), torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(TypeError, match=r"bool.*mask.nonzero\(\)"):
        gm(x, edge_index, node_ids=torch.ones(4, dtype=torch.bool))
    by_ids = _model("override", torch.tensor([3, 7]))
    ids = torch.tensor([3, 0, 7, 9])
    assert torch.equal(gm(x, edge_index, node_ids=ids), by_ids(x, edge_index, node_ids=ids))
