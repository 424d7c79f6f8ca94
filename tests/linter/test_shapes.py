"""Lint from shapes alone: ShapeSpec / meta-tensor inputs run the forward on fake tensors."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv

import fxquant
from fxquant import ShapeSpec
from tests.support.models import seed


class SavedThenWritten(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = GCNConv(16, 4)  # default: self-loops via nonzero (data-dependent size)

    def forward(self, x, edge_index):
        y = self.conv(x, edge_index).sigmoid()
        y += 1
        return y


def rules(report):
    return [(f.rule, f.line) for f in report.findings if f.rule != "FXQ010"]


def test_shapes_give_the_findings_of_real_data():
    model = SavedThenWritten()
    real = fxquant.lint(model, torch.randn(30, 16), torch.randint(0, 30, (2, 90)))
    shapes = fxquant.lint(model, ShapeSpec((30, 16)), ShapeSpec((2, 90), torch.long))
    assert shapes.mode == "shapes" and rules(shapes) == rules(real) != []
    meta = fxquant.lint(model, torch.empty(30, 16, device="meta"),
                        torch.empty(2, 90, dtype=torch.long, device="meta"))
    assert meta.mode == "shapes" and rules(meta) == rules(real)


def test_nothing_is_computed():
    """A 1e6 x 1e4 float input (40 GB) lints in moments: no real tensor of it exists."""
    model = nn.Sequential(nn.Linear(10_000, 8), nn.ReLU(inplace=True), nn.Linear(8, 2))
    report = fxquant.lint(model, ShapeSpec((1_000_000, 10_000)))
    assert report.mode == "shapes" and not report.errors


def test_seed_model_with_a_meta_data_object():
    model, (data,) = seed()
    state = copy.deepcopy(model.state_dict())
    meta = Data(x=torch.empty(2708, 8, device="meta"),
                edge_index=torch.empty(2, 10556, dtype=torch.long, device="meta"))
    report = fxquant.lint(model, meta)
    assert report.mode == "shapes"
    assert {f.rule for f in report.errors} == {"FXQ001"}
    assert {f.line for f in report.errors} == {f.line for f in fxquant.lint(model, data).errors}
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert not torch.is_anomaly_enabled()  # the seed's forward switches it on: restored


def test_forward_that_needs_values_falls_back_to_random_data():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            y = self.lin(x).exp()
            if y.sum() > 0:  # needs a value
                y.add_(1)
            return y

    report = fxquant.lint(Branchy(), ShapeSpec((3, 4)))
    assert report.mode == "dynamic"
    assert [f.rule for f in report.errors] == ["FXQ001"]
    (note,) = report.by_rule("FXQ010")
    assert "needs values" in note.message and "random data" in note.message


def test_shape_spec_and_shape_only_inputs_are_validated():
    with pytest.raises(ValueError, match="non-negative ints"):
        ShapeSpec((3, -1))
    with pytest.raises(TypeError, match=r"torch\.dtype"):
        ShapeSpec((3,), "float32")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="floating"):
        ShapeSpec((3,), torch.long, requires_grad=True)
    with pytest.raises(ValueError, match="check runs backward on values"):
        fxquant.check(nn.Linear(3, 3), ShapeSpec((2, 3)))
    with pytest.raises(ValueError, match="shapes only"):
        fxquant.functionalize_inplace(nn.Linear(3, 3), torch.empty(2, 3, device="meta"))
