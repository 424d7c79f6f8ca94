"""fxquant.functionalize_inplace: no in-place ops left, same forward, working backward."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import fxquant
from examples.seed_model import SeedGCN
from fxquant.linter.functionalize import REWRITES_KEY
from tests.support.lint_models import LegalInplace, SymbolicTraps
from tests.support.models import GCN, tiny_graph


def inplace_nodes(gm):
    """Nodes that write in place, by schema (ATen) or by name/flag (symbolic)."""
    found = []
    for n in gm.graph.nodes:
        schema = getattr(n.target, "_schema", None)
        by_schema = schema is not None and any(
            a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        by_name = n.op == "call_method" and str(n.target).endswith("_")
        by_flag = n.kwargs.get("inplace") is True or "out" in n.kwargs
        by_module = n.op == "call_module" and getattr(gm.get_submodule(str(n.target)), "inplace", False)
        if by_schema or by_name or by_flag or by_module:
            found.append(n)
    return found


def test_seed_model_is_captured_functionally():
    """Untraceable seed code: captured; forward bit-identical; backward runs (zero grads)."""
    data = tiny_graph()
    model = SeedGCN()
    gm = fxquant.functionalize_inplace(model, data)
    assert not torch.is_anomaly_enabled()
    assert "functionalize" in gm.meta[REWRITES_KEY][0] and "mul_" in gm.meta[REWRITES_KEY][0]
    assert not inplace_nodes(gm)
    expected = model(data)
    torch.autograd.set_detect_anomaly(False)  # the seed's forward switches it on
    out = gm(data)
    assert torch.equal(out, expected)
    out.sum().backward()
    assert {n for n, p in gm.named_parameters() if p.grad is not None} == {
        n for n, _ in model.named_parameters()}
    with warnings.catch_warnings(), pytest.raises(RuntimeError, match="modified by an inplace"):
        warnings.simplefilter("ignore")  # anomaly mode's own report of the failure
        model(data).sum().backward()
    torch.autograd.set_detect_anomaly(False)
    assert not fxquant.check(gm, data).errors


def test_symbolic_rewrite_keeps_the_module_structure():
    """add_ -> add and inplace=True -> False in the FX graph; modules stay modules."""
    model = SymbolicTraps()
    x = torch.randn(4, 3)
    gm = fxquant.functionalize_inplace(model, x)
    assert gm.meta[REWRITES_KEY] == ["add_ -> add (node add_)",
                                     "relu(inplace=True) -> inplace=False (node relu)"]
    assert not inplace_nodes(gm)
    assert any(n.op == "call_module" for n in gm.graph.nodes)
    assert torch.equal(gm(x), model(x))
    gm(x).sum().backward()
    assert model.lin.weight.grad is None  # the result owns a copy


def test_inplace_modules_and_functions_without_inputs():
    """nn.ReLU(inplace=True) and torch.relu_ are rewritten; later uses read the new value."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            h = self.lin(x)
            self.act(h)
            y = torch.sigmoid(self.lin(x))
            torch.relu_(y)
            return h + y

    model = Net()
    x = torch.randn(5, 3)
    gm = fxquant.functionalize_inplace(model)
    assert not inplace_nodes(gm)
    assert torch.equal(gm(x), model(x))
    assert model.act.inplace  # the input model is untouched


def test_traceable_but_setitem_falls_back_to_capture(graph):
    """setitem cannot be traced symbolically; with inputs it is captured instead."""
    model = LegalInplace()
    gm = fxquant.functionalize_inplace(model, graph.x, graph.edge_index)
    assert not inplace_nodes(gm)
    assert torch.equal(gm(graph.x, graph.edge_index), model(graph.x, graph.edge_index))
    with pytest.raises(fxquant.TraceError, match="please pass example inputs"):
        fxquant.functionalize_inplace(model)


def test_clean_model_passes_through(graph):
    """A GCN without in-place ops: nothing to rewrite, same outputs."""
    model = GCN()
    gm = fxquant.functionalize_inplace(model, graph.x, graph.edge_index)
    assert gm.meta[REWRITES_KEY] == []
    assert torch.equal(gm(graph.x, graph.edge_index), model(graph.x, graph.edge_index))
