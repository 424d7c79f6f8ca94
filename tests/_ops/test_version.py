"""Compiled graphs carry the numerics' fingerprint, so compile caches never reuse kernels
compiled from other numerics (inductor does not hash custom-op decompositions)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

import fxquant
from fxquant._ops.version import NUMERICS, numerics_fingerprint
from fxquant.quant import QuantConfig, QuantPoint

PACKAGE = Path(fxquant.__file__).resolve().parent


def _captured_code(fn, *args) -> str:
    """The code of the graph dynamo hands the backend (what the caches key on)."""
    codes = []

    def backend(gm, example_inputs):
        codes.append(gm.code)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return "\n".join(codes)


def test_fingerprint_is_in_every_captured_graph():
    """fxquant.truncate, fxquant.quantize and a QuantPoint all pass it to their op."""
    x = torch.randn(8, 4)
    assert NUMERICS in _captured_code(lambda t: fxquant.truncate(t, 10, "nearest"), x)
    assert NUMERICS in _captured_code(lambda t: fxquant.quantize(t, "e4m3", scale="tensor"), x)
    point = QuantPoint(QuantConfig("e3m2", scale="row"), "lin")
    assert NUMERICS in _captured_code(point, x)


def test_fingerprint_follows_the_numerics_source(tmp_path):
    """Editing a kernel (or the formats) changes the fingerprint; other files do not."""
    copy = tmp_path / "fxquant"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert numerics_fingerprint(copy) == NUMERICS
    (copy / "cli.py").write_text("# unrelated\n")
    assert numerics_fingerprint(copy) == NUMERICS
    kernel = copy / "_ops" / "truncate.py"
    kernel.write_text(kernel.read_text().replace("mask = -(1 << d)", "mask = -(1 << d)  # edit", 1))
    assert numerics_fingerprint(copy) != NUMERICS
