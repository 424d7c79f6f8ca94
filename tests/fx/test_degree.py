"""One check of a user's ``edge_index`` (:func:`fxquant.fx.degree.check_edge_index`) behind
every entry that takes one: ``top_degree_nodes``, ``NodeBits.by_degree`` and the per-node
recipes' ``prepare``. Ids out of range and float or bool ids are refused with a message
naming ``edge_index`` (``NodeBits.by_degree`` raised a bare ``IndexError``, or read them)."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.data import Data
from torch_geometric.nn.models import GCN

import fxquant
from fxquant import NodeBits
from fxquant.errors import FxquantTypeError, FxquantValueError
from fxquant.fx.degree import check_edge_index, in_degree

EDGES = torch.tensor([[1, 2, 3, 0, 4], [0, 0, 0, 1, 2]])  # 5 nodes, node 0 a hub
INTEGER = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
OTHER = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool,
         torch.complex64]

#: each entry, called with an edge_index and the graph's node count
ENTRIES = {
    "top_degree_nodes": lambda ei, n: fxquant.top_degree_nodes(ei, 0.4, n),
    "by_degree": lambda ei, n: NodeBits.by_degree(ei, [0.5], [2, 4], num_nodes=n).bits,
    "hub-messages": lambda ei, n: _prepare("hub-messages", ei, n),
    "learned-bits": lambda ei, n: _prepare("learned-bits", ei, n),
    "budget-bits": lambda ei, n: _prepare("budget-bits", ei, n),
}
#: each recipe's settings (the degree-ordered start of budget-bits reads in-degrees too)
SETTINGS = {"hub-messages": {"anneal_every": 0, "fit_budget": False},
            "learned-bits": {}, "budget-bits": {"anneal_every": 0, "init": "degree"}}


def _prepare(name: str, edge_index: torch.Tensor, n: int) -> torch.Tensor:
    """The per-node widths the recipe prepares on the graph."""
    data = Data(x=torch.rand(n, 4), edge_index=edge_index, num_nodes=n)
    recipe = fxquant.recipes.get(name, input_format=None, **SETTINGS[name])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = recipe.prepare(GCN(4, 8, num_layers=2, out_channels=2), data, lint="off")
    return torch.cat([p.config.node_bits.bits for _, p in fxquant.quantization_points(run.model)
                      if p.config.node_bits is not None])


@pytest.mark.parametrize("entry", ["by_degree", "hub-messages"])
def test_the_reported_ids_are_refused_naming_edge_index(entry):
    """An id >= num_nodes or negative gave a bare IndexError ('index out of range in
    self'); float and bool ids were read silently."""
    for bad in (torch.tensor([[0, 1], [1, 5]]), torch.tensor([[0, -1], [1, 2]])):
        with pytest.raises(FxquantValueError, match="edge_index holds"):
            ENTRIES[entry](bad, 5)
    for dtype in (torch.float32, torch.bool):
        with pytest.raises(FxquantTypeError, match=rf"edge_index must hold integer.*{dtype}"):
            ENTRIES[entry](EDGES.to(dtype), 5)


def test_a_bipartite_graph_counts_its_targets():
    """Source ids may reach beyond num_nodes (the target side's size), as in_degree counts
    a bipartite graph's targets; target ids may not."""
    edges = torch.tensor([[0, 6, 7], [1, 1, 0]])  # 8 sources, 2 targets
    assert check_edge_index(edges, 2) == 2
    assert fxquant.top_degree_nodes(edges, 0.5, 2).tolist() == [1]
    with pytest.raises(FxquantValueError, match="target node id 1, but num_nodes=1"):
        check_edge_index(edges, 1)


@settings(max_examples=120)
@given(entry=st.sampled_from(sorted(ENTRIES)), dtype=st.sampled_from(INTEGER + OTHER),
       fault=st.sampled_from(["none", "negative", "too large", "shape", "sparse", "list"]),
       position=st.integers(0, 4))
def test_every_entry_checks_edge_index_alike(entry, dtype, fault, position):
    """Every entry, every dtype, every fault (an id out of range on either side of it,
    a wrong shape or layout, no tensor): integer ids of any dtype give what int64 ids
    give, anything else is an fxquant error naming edge_index, before anything runs."""
    n = 5
    edges = EDGES.clone()
    if fault == "negative":
        if dtype == torch.uint8:
            return  # (no negative uint8)
        edges[position % 2, position] = -1 - position
    elif fault == "too large":
        edges[1, position] = n + position
    edges = (edges != 0) if dtype == torch.bool else edges.to(dtype)
    if fault == "shape":
        edges = edges.reshape(-1)
    elif fault == "sparse":
        edges = edges.to_sparse()
    elif fault == "list":
        edges = edges.tolist()
    if fault == "none" and dtype in INTEGER:
        assert torch.equal(ENTRIES[entry](edges, n), ENTRIES[entry](EDGES, n))
        return
    with pytest.raises((FxquantValueError, FxquantTypeError), match="edge_index"):
        ENTRIES[entry](edges, n)


def test_in_degree_is_unchanged_for_valid_ids():
    assert in_degree(EDGES, 5).tolist() == [3.0, 1.0, 1.0, 0.0, 0.0]
    assert check_edge_index(EDGES) == 5 and check_edge_index(EDGES[:, :0]) == 0
