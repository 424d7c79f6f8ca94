"""Evaluation under ``torch.inference_mode()`` (what Lightning's validation and test loops
use) gives what evaluation under ``torch.no_grad()`` gives, for every recipe."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.nn.models import GCN

import fxquant
from fxquant.recipes import available


def _data(n: int = 40) -> Data:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 8, generator=g)
    return Data(x=x / x.sum(1, keepdim=True), edge_index=torch.randint(0, n, (2, 160), generator=g),
                y=torch.randint(0, 3, (n,), generator=g))


@pytest.mark.parametrize("name", available())
def test_inference_mode_evaluates_like_no_grad(name):
    data = _data()
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = fxquant.recipes.get(name).prepare(GCN(8, 16, num_layers=2, out_channels=3),
                                                data, lint="off")
    if run.distill:  # (the recommended recipe)
        run.set_teacher(torch.randn(40, 3))
    optimizer = torch.optim.Adam(run.param_groups(), lr=0.01)
    for epoch in range(2):
        run.model.train()
        run.start_epoch(epoch)
        optimizer.zero_grad()
        out = run.model(data.x, data.edge_index)
        run.loss(F.cross_entropy(out, data.y), output=out).backward()
        optimizer.step()
    run.model.eval()
    with torch.no_grad():
        expected = run.model(data.x, data.edge_index)
    with torch.inference_mode():
        features = data.x.clone()  # an inference tensor: no version counter
        out = run.model(data.x, data.edge_index)
        again = run.model(features, data.edge_index)
    assert torch.equal(out, expected)
    assert torch.equal(again, expected)
