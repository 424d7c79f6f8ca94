"""Lazy layers (``GCNConv(-1, 16)``, ``nn.LazyLinear``) before their first forward:
``fxquant.trace``, ``transform`` and every recipe's ``prepare`` say to run the model once,
naming the tensor, before anything runs (trace and prepare failed with torch's
``ValueError`` from inside fxquant)."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch_geometric.data import Data
from torch_geometric.nn import GATConv, GCNConv, SAGEConv

import fxquant
from fxquant.errors import FxquantValueError

LAYERS = {"GCNConv": GCNConv, "SAGEConv": SAGEConv, "GATConv": GATConv}


class Net(nn.Module):
    """Two convolutions and a linear head; ``lazy`` says which of them is lazy."""

    def __init__(self, kind: str = "GCNConv", lazy: str = "first") -> None:
        super().__init__()
        conv = LAYERS[kind]
        self.conv1 = conv(-1 if lazy == "first" else 4, 8)
        self.conv2 = conv(-1 if lazy == "second" else 8, 8)
        self.head = nn.LazyLinear(2) if lazy == "head" else nn.Linear(8, 2)

    def forward(self, x, edge_index):
        return self.head(self.conv2(self.conv1(x, edge_index).relu(), edge_index))


def _graph() -> Data:
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 2], [1, 2, 3, 4, 5, 0, 0, 0]])
    return Data(x=torch.rand(6, 4), edge_index=edge_index, num_nodes=6)


#: each entry, as the message names it
ENTRIES = {
    "trace": lambda model: fxquant.trace(model),
    "transform": lambda model: fxquant.transform(model, bits=8, lint="off"),
    **{f"recipes.{type(fxquant.recipes.get(name)).__name__}.prepare":
       (lambda model, name=name: fxquant.recipes.get(name).prepare(model, _graph(), lint="off"))
       for name in fxquant.recipes.available()},
}


def test_the_reported_cases_say_to_run_the_model_once():
    for entry in ("trace", "recipes.LsqProtect.prepare", "recipes.HubMessages.prepare"):
        with pytest.raises(FxquantValueError, match=rf"fxquant\.{entry}: the tensor "
                           r"'conv1\.lin\.weight' is not initialized yet.*run the model once"):
            ENTRIES[entry](Net())


@settings(max_examples=60)
@given(kind=st.sampled_from(sorted(LAYERS)), lazy=st.sampled_from(["first", "second", "head"]),
       entry=st.sampled_from(sorted(ENTRIES)))
def test_every_entry_refuses_a_lazy_model_and_works_after_one_forward(kind, lazy, entry):
    """Every lazy layer (a PyG convolution first or second, a LazyLinear head) and every
    entry (trace, transform, each recipe's prepare): a clear error naming the entry, the
    model untouched; after one forward the same call works."""
    torch.manual_seed(0)
    model = Net(kind, lazy)
    names = [n for n, p in model.named_parameters() if nn.parameter.is_lazy(p)]
    with pytest.raises(FxquantValueError, match=rf"fxquant\.{entry}: the tensor "
                       rf"'{names[0]}' is not initialized yet.*run the model once"):
        ENTRIES[entry](model)
    assert [n for n, p in model.named_parameters() if nn.parameter.is_lazy(p)] == names
    model(_graph().x, _graph().edge_index)  # the first forward gives the shapes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ENTRIES[entry](model)
