"""``num_nodes`` comes after the graph's own arguments, as in PyG's utils
(``degree(index, num_nodes=None)``, ``to_undirected(edge_index, edge_attr=None,
num_nodes=None)``): ``top_degree_nodes(edge_index, fraction, num_nodes=None)`` and
``NodeBits.by_degree(edge_index, quantiles, bits, num_nodes=None, ...)``. The order of
earlier releases, ``by_degree(edge_index, num_nodes, quantiles, bits)``, keeps working with
a FutureWarning at the caller's line."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fxquant
from fxquant import NodeBits

EDGES = torch.tensor([[1, 2, 3, 4, 0, 0], [0, 0, 0, 0, 1, 2]])


def test_num_nodes_comes_after_the_graphs_arguments_in_both():
    for params in (inspect.signature(fxquant.top_degree_nodes).parameters,
                   inspect.signature(NodeBits.by_degree).parameters):
        names = list(params)
        assert names.index("num_nodes") > names.index("edge_index")
        assert params["num_nodes"].default is None
    assert NodeBits.by_degree(EDGES, [0.75], [2, 6]).bits.tolist() == [6.0, 2.0, 2.0, 2.0, 2.0]


def test_the_old_order_warns_at_the_callers_line_and_gives_the_same():
    new = NodeBits.by_degree(EDGES, [0.75], [2, 6], num_nodes=5).bits
    with pytest.warns(FutureWarning, match=r"num_nodes after the graph's own arguments") as w:
        old = NodeBits.by_degree(EDGES, 5, [0.75], [2, 6]).bits
    assert w[0].filename == __file__ and torch.equal(old, new)
    with pytest.warns(FutureWarning):  # as the docs wrote it
        mixed = NodeBits.by_degree(EDGES, 5, quantiles=[0.75], bits=[2, 6]).bits
    assert torch.equal(mixed, new)


def _graph(data, n):
    m = data.draw(st.integers(0, 30))
    src = data.draw(st.lists(st.integers(0, n - 1), min_size=m, max_size=m))
    dst = data.draw(st.lists(st.integers(0, n - 1), min_size=m, max_size=m))
    return torch.tensor([src, dst], dtype=torch.long).reshape(2, m)


@settings(max_examples=150)
@given(data=st.data(), n=st.integers(1, 12),
       form=st.sampled_from(["new positional", "new keywords", "new default", "old positional",
                             "old mixed", "old keywords", "old with min_bits"]))
def test_every_way_of_calling_by_degree_gives_the_same_widths(data, n, form):
    """Every graph, quantiles and widths, every way of writing the call (the new order by
    position or keyword, the old order by position, mixed, or with min_bits): the same
    widths; the old orders warn once, at the caller's line, the new ones never."""
    edge_index = _graph(data, n)
    k = data.draw(st.integers(1, 3))
    quantiles = sorted(data.draw(st.lists(st.floats(0.05, 0.95), min_size=k, max_size=k,
                                          unique=True)))
    bits = sorted(data.draw(st.lists(st.integers(2, 8), min_size=k + 1, max_size=k + 1)))
    calls = {
        "new positional": lambda: NodeBits.by_degree(edge_index, quantiles, bits, n, 2, 8),
        "new keywords": lambda: NodeBits.by_degree(edge_index, quantiles=quantiles, bits=bits,
                                                   num_nodes=n),
        "new default": lambda: NodeBits.by_degree(edge_index, quantiles, bits, num_nodes=n),
        "old positional": lambda: NodeBits.by_degree(edge_index, n, quantiles, bits),
        "old mixed": lambda: NodeBits.by_degree(edge_index, n, quantiles=quantiles, bits=bits),
        "old keywords": lambda: NodeBits.by_degree(edge_index, num_nodes=n,
                                                   quantiles=quantiles, bits=bits),
        "old with min_bits": lambda: NodeBits.by_degree(edge_index, n, quantiles, bits, 2),
    }
    expected = NodeBits.by_degree(edge_index, quantiles, bits, num_nodes=n).bits
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = calls[form]().bits
    future = [w for w in caught if issubclass(w.category, FutureWarning)]
    assert torch.equal(got, expected)
    old = form.startswith("old") and form != "old keywords"  # (keywords read in both orders)
    assert len(future) == int(old) and all(w.filename == __file__ for w in future)
    assert torch.equal(fxquant.top_degree_nodes(edge_index, 0.5, n),
                       fxquant.top_degree_nodes(edge_index, 0.5, num_nodes=n))
