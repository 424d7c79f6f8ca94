"""Smoke runs of the benchmark scripts (tiny sizes, one repeat), so they cannot rot.

Speed is measured by the scripts themselves, never asserted here.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks import bench_train, bench_truncate
from benchmarks.common import peak_bytes


def test_bench_truncate_quick():
    """Every row appears, with ratios against clone and the kernel's device check."""
    body = bench_truncate.main(["--quick", "--no-write"])
    for row in ("x.clone()", "truncate toward_zero", "truncate nearest", "truncate stochastic",
                "truncate fwd+bwd (ste)", "fused toward_zero", "seed bit-planes round trip"):
        assert row in body
    assert "['meta']" in body


def test_peak_bytes_counts_allocations():
    """The profiler-based peak sees one output for clone and more for a chain."""
    x = torch.randn(1000, 100)
    assert peak_bytes(lambda: x.clone()) >= x.nbytes
    assert peak_bytes(lambda: (x * 2) + (x * 3)) >= 2 * x.nbytes


@pytest.mark.slow
def test_bench_train_quick():
    """The training benchmark runs end to end on a generated graph, compile included."""
    body = bench_train.main(["--quick", "--no-write"])
    assert "bits=16 compiled" in body and "lint(GCN, x, edge_index)" in body
    assert "opaque fxquant.truncate call left in the generated code: no" in body


@pytest.mark.slow
def test_bench_quantize_quick():
    """Every format has a row, and the memory table runs its subprocess cases."""
    from benchmarks import bench_quantize

    body = bench_quantize.main(["--quick", "--no-write"])
    for name in bench_quantize.FORMATS:
        assert f"| {name} " in body
    assert "truncate(5, toward_zero, one NaN)" in body


def test_bench_lsq_quick():
    """Both roundings have a speed and a memory row."""
    from benchmarks import bench_lsq

    body = bench_lsq.main(["--quick", "--no-write"])
    assert body.count("| nearest ") == 2 and body.count("| stochastic ") == 2



@pytest.mark.slow
def test_bench_lsq_compiled_rows():
    """The published command's compiled rows run (the smoke run above is eager only)."""
    from benchmarks import bench_lsq

    rows = bench_lsq.speed_rows(256, 1, 0.01, compiled=True)
    assert [r[:2] for r in rows] == [["nearest", "eager"], ["stochastic", "eager"],
                                     ["nearest", "compiled"], ["stochastic", "compiled"]]
    assert all(r[2].endswith("x") and float(r[2][:-1]) > 0 for r in rows)
