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


def test_every_dotted_name_the_docs_write_is_reachable_after_import_fxquant():
    """``import fxquant; fxquant.testing.assert_backward_safe`` raised AttributeError (the
    README lists it): every ``fxquant.a.b`` the README, the docs and the examples write is
    reachable as attributes after a plain ``import fxquant``, in a fresh interpreter."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    texts = [root / "README.md", *(root / "docs" / "source").rglob("*.md"),
             *(root / "examples").glob("*.py")]
    names = sorted({m.group(0) for path in texts for m in re.finditer(
        r"fxquant(?:\.[A-Za-z_]\w*){2,}", path.read_text())})
    assert "fxquant.testing.assert_backward_safe" in names
    code = ("import functools, sys, fxquant\n"
            "missing = [n for n in sys.argv[1:] if not (lambda parts: "
            "functools.reduce(lambda o, a: getattr(o, a, None) if o is not None else None, "
            "parts[1:], fxquant))(n.split('.'))]\n"
            "print(missing)\n")
    done = subprocess.run([sys.executable, "-c", code, *names], cwd=root, capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
