"""Lazy layers not initialized yet (their shapes come from the first forward): lint, check
and functionalize_inplace say to run the model once first, as transform does, instead of
failing inside torch or calling torch's error one of their own."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_geometric.nn import GCNConv, SAGEConv

import fxquant
from fxquant.errors import FxquantValueError

EDGES = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
LAYERS = {
    "GCNConv(-1, 8)": lambda: GCNConv(-1, 8),
    "SAGEConv(-1, 8)": lambda: SAGEConv(-1, 8),
    "LazyLinear": lambda: nn.LazyLinear(8),
}
TOOLS = {
    "lint": lambda m, x: fxquant.lint(m, x, EDGES),
    "lint (symbolic)": lambda m, x: fxquant.lint(m),
    "check": lambda m, x: fxquant.check(m, x, EDGES),
    "functionalize_inplace": lambda m, x: fxquant.functionalize_inplace(m, x, EDGES),
}


class _Lazy(nn.Module):
    def __init__(self, layer: str) -> None:
        super().__init__()
        self.layer, self.graph = LAYERS[layer](), "Conv" in layer
        self.out = nn.Linear(8, 2)

    def forward(self, x, edge_index):
        h = self.layer(x, edge_index) if self.graph else self.layer(x)
        return self.out(h.relu())


@pytest.mark.parametrize("tool", sorted(TOOLS))
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_a_lazy_layer_not_initialized_yet_says_to_run_the_model_once(layer, tool):
    model = _Lazy(layer)
    with pytest.raises(FxquantValueError, match=r"not initialized yet.*run the model once"):
        TOOLS[tool](model, torch.randn(4, 3))
    assert any(nn.parameter.is_lazy(p) for p in model.parameters())  # (left as it was)


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_once_run_the_model_lints(layer):
    model, x = _Lazy(layer), torch.randn(4, 3)
    model(x, EDGES)
    assert not fxquant.lint(model, x, EDGES).errors
    assert not fxquant.check(model, x, EDGES).errors
