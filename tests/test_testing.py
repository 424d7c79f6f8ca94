"""fxquant.testing.assert_backward_safe: the helper users call in their own test suites."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from fxquant.testing import assert_backward_safe
from tests.linter.corpus import (
    crash_03_sigmoid_index_assign,
    legal_01_resnet_relu_inplace_after_bn,
    silent_04_weight_data_normalize,
)
from tests.support.models import GCN


def test_clean_models_pass(graph):
    assert_backward_safe(GCN(), graph.x, graph.edge_index)
    assert_backward_safe(*_made(legal_01_resnet_relu_inplace_after_bn))


def _made(module):
    model, inputs = module.make()
    return (model, *inputs)


@pytest.mark.parametrize("case", [crash_03_sigmoid_index_assign, silent_04_weight_data_normalize],
                         ids=["crash", "silent"])
def test_bugs_fail_with_the_culprit_line(case):
    path = case.__file__.rsplit("/", 1)[-1]
    lines = Path(case.__file__).read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "# CULPRIT" in text)
    model, *inputs = _made(case)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(AssertionError, match=rf"backward is not safe(.|\n)*{re.escape(path)}:{line}"):
        assert_backward_safe(model, *inputs)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_allow_and_strict():
    """A parameter that gets no gradient is a warning: it fails only when strict."""

    class Unused(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.spare = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(x)

    x = torch.randn(2, 3)
    assert_backward_safe(Unused(), x)
    with pytest.raises(AssertionError, match=r"FXQ008.*spare\.weight"):
        assert_backward_safe(Unused(), x, strict=True)
    assert_backward_safe(Unused(), x, strict=True, allow=["FXQ008"])
    with pytest.raises(ValueError, match="unknown rule ids"):
        assert_backward_safe(Unused(), x, allow=["FXQ999"])
