"""Sparse tensors in a model's state: lint, check and functionalize_inplace run on them,
and leave them as they were."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from torch.fx import GraphModule

import fxquant
from fxquant.linter.state import components, copy_model
from tests.support.lint_models import SparseResidual, SparseValuesScaled

LAYOUTS = [torch.sparse_coo, torch.sparse_csr, torch.sparse_csc]
pytestmark = pytest.mark.filterwarnings("ignore:Sparse")


def _line(cls, text):
    lines, start = inspect.getsourcelines(cls)
    return start + next(i for i, line in enumerate(lines) if text in line)


def _same(a, b):
    return a.layout == b.layout and all(
        torch.equal(x, y) for x, y in zip(components(a), components(b), strict=True))


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_lint_check_and_shapes_find_the_bug_next_to_a_sparse_buffer(layout):
    """The `h += ...` after ReLU, named at its line by all three; the buffer is untouched."""
    model, x = SparseResidual(layout), torch.randn(4, 3)
    adj, values = model.adj, model.adj.detach().clone()
    line = _line(SparseResidual, "h += self.adj @ x")
    for report in (fxquant.lint(model, x), fxquant.check(model, x),
                   fxquant.lint(model, fxquant.ShapeSpec((4, 3)))):
        assert [(f.rule, f.line) for f in report.errors] == [("FXQ001", line)]
    assert model.adj is adj and _same(model.adj, values)


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr, torch.sparse_csc], ids=str)
def test_functionalize_fixes_a_model_with_a_sparse_buffer(layout):
    model, x = SparseResidual(layout), torch.randn(4, 3)
    gm = fxquant.functionalize_inplace(model, x)
    assert isinstance(gm, GraphModule) and gm.adj.layout == layout
    assert _same(gm.adj, model.adj) and gm.adj is not model.adj
    want = model.lin(x).relu() + model.adj @ x
    assert torch.allclose(gm(x), want)


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
@pytest.mark.parametrize("tool", [fxquant.lint, fxquant.check], ids=["lint", "check"])
def test_writes_into_a_sparse_buffer_are_put_back(layout, tool):
    """The forward doubles the buffer's values in place: the model is restored exactly."""
    model = SparseValuesScaled(layout)
    before = model.adj.detach().clone()
    tool(model, torch.randn(4, 3))
    assert _same(model.adj, before)


def test_copy_model_copies_compressed_sparse_buffers():
    """torch's deepcopy cannot copy a CSR tensor (it reads its storage); copy_model can."""
    model = SparseResidual(torch.sparse_csr)
    with pytest.raises(NotImplementedError):
        import copy

        copy.deepcopy(model)
    twin = copy_model(model)
    assert _same(twin.adj, model.adj) and twin.adj is not model.adj


def test_a_pyg_sparse_tensor_in_the_buffers():
    """PyG's SparseTensor (not a torch.Tensor) kept in `_buffers`: lint, check and
    functionalize_inplace run, and its storage comes back unchanged."""
    torch_sparse = pytest.importorskip("torch_sparse")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            dense = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0], [0.0, 4.0, 0.0]])
            self._buffers["adj_t"] = torch_sparse.SparseTensor.from_dense(dense)
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            self.adj_t.storage.value().mul_(2)
            h = torch_sparse.matmul(self.adj_t, self.lin(x))
            h.relu_()
            return h

    model, x = Model(), torch.randn(3, 2)
    value = model.adj_t.storage.value().clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert not fxquant.lint(model, x).errors
        assert not fxquant.check(model, x).errors
        fixed = fxquant.functionalize_inplace(model, x)
    assert torch.equal(model.adj_t.storage.value(), value)
    assert set(fixed.state_dict()) == set(model.state_dict())
