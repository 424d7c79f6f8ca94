"""The side-by-side benchmark against Degree-Quant's reference code.

The reference is not part of this repository: without a checkout named by
``FXQUANT_DQ_REFERENCE`` the benchmark says so and stops, and the tests that need it skip.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import bench_dq_reference
from benchmarks.dq_reference_support import ENV, load_reference, reference_path, scatter_shim

needs_reference = pytest.mark.skipif(
    reference_path() is None,
    reason=f"set {ENV} to a camlsys/degree-quant checkout (commit 257d6bc) to run this test")


def test_skips_with_a_message_without_a_checkout(monkeypatch, tmp_path, capsys):
    """No checkout: the benchmark returns without training and tells how to get one."""
    monkeypatch.setenv(ENV, str(tmp_path))  # a folder without dq/multi_quant.py
    assert bench_dq_reference.main(["--seeds", "1", "--no-write"]) is None
    err = capsys.readouterr().err
    assert "skipped" in err and ENV in err and "camlsys/degree-quant" in err


def test_load_reference_names_the_variable(monkeypatch):
    """Loading without a checkout raises, naming the variable and the commit."""
    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(FileNotFoundError, match=f"{ENV}.*257d6bc"):
        load_reference()


@pytest.mark.parametrize("name, reduce", [("scatter_add", "sum"), ("scatter_mean", "mean"),
                                          ("scatter_max", "amax"), ("scatter_min", "amin")])
def test_scatter_shim_matches_scatter_reduce(name, reduce):
    """Each stand-in function reduces rows by index like torch's scatter_reduce (empty
    rows give 0), along dim 0 with a 1-D index, as the reference calls them."""
    src = torch.randn(6, 3)
    index = torch.tensor([0, 2, 2, 0, 3, 2])
    out = getattr(scatter_shim(), name)(src, index, 0, None, 5)
    values = out[0] if isinstance(out, tuple) else out
    expected = torch.zeros(5, 3).scatter_reduce(0, index.view(-1, 1).expand(-1, 3), src, reduce,
                                                include_self=False)
    torch.testing.assert_close(values, expected)


def test_rows_pair_formats():
    """Every row but FP32 gives both sides the same integer width."""
    for row in bench_dq_reference.ROWS.values():
        if row.fxquant is None:
            assert row.reference.bits is None
        else:
            assert row.fxquant["format"].startswith(f"int{row.reference.bits}:")


@pytest.fixture
def isolated_imports(monkeypatch):
    """Whatever loading the reference adds to ``sys.modules`` (its ``dq`` package, the
    ``torch_scatter`` stand-in) and ``sys.path`` is gone after the test."""
    before = set(sys.modules)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name in set(sys.modules) - before:
        if name == "torch_scatter" or name == "dq" or name.startswith("dq."):
            del sys.modules[name]


@needs_reference
@pytest.mark.usefixtures("isolated_imports")
def test_fp32_rows_match_with_a_checkout():
    """With the reference present, its FP32 GCN trains exactly like fxquant's FP32 GCN
    (same weights, same dropout masks), and a quantized row runs on both sides."""
    body = bench_dq_reference.main(["--seeds", "2", "--epochs", "3", "--rows", "fp32,int8",
                                    "--time-rows", "", "--no-write"])
    assert body is not None
    fp32 = next(line for line in body.splitlines() if line.startswith("| FP32"))
    assert "+0.0 [+0.0, +0.0]" in fp32
    assert any(line.startswith("| INT8") for line in body.splitlines())


def test_round_ratios_pair_steps_of_the_same_round():
    """The machine slows down in round 2 for every model: each round's ratio stays 0.5,
    while a ratio of the overall medians would not see the pairing."""
    per_round = {"reference eager": [200.0, 300.0, 200.0], "reference compiled": [190.0] * 3,
                 "fxquant eager": [150.0] * 3, "fxquant compiled": [100.0, 150.0, 100.0]}
    ratios = bench_dq_reference._round_ratios(per_round)
    assert ratios["reference eager"] == [0.5, 0.5, 0.5]
    assert ratios["reference compiled"][0] == pytest.approx(100 / 190)
    assert bench_dq_reference._round_ratios({"reference eager": [1.0]}) == {}
    timing = {"row": "int8-dq", "round_ratios": ratios,
              "median_ms": {k: v[0] for k, v in per_round.items()}}
    assert "0.50 [0.50, 0.50]" in bench_dq_reference.report([], [timing], "## header")


ROOT = Path(__file__).resolve().parents[2]


def test_fast_dropout_ratios_compare_with_every_reference_variant():
    fast = bench_dq_reference.FAST
    per_round = {"reference eager": [200.0, 200.0], "reference compiled": [100.0, 100.0],
                 fast + "reference eager": [80.0, 80.0], fast + "reference compiled": [90.0] * 2,
                 "fxquant compiled": [100.0, 100.0], fast + "fxquant compiled": [40.0, 40.0]}
    ratios = bench_dq_reference._round_ratios(per_round, fast + "fxquant compiled",
                                              bench_dq_reference.REFERENCES)
    assert {k: v[0] for k, v in ratios.items()} == pytest.approx(
        {"reference eager": 0.2, "reference compiled": 0.4, fast + "reference eager": 0.5,
         fast + "reference compiled": 40 / 90})
    timing = {"row": "int8-dq", "round_ratios": bench_dq_reference._round_ratios(per_round),
              "round_ratios_fast_dropout": ratios,
              "median_ms": {k: v[0] for k, v in per_round.items()}}
    body = bench_dq_reference.report([], [timing], "## header")
    assert "fast_dropout" in body and "0.20 [0.20, 0.20]" in body and "0.50 [0.50, 0.50]" in body


@needs_reference
@pytest.mark.slow
@pytest.mark.usefixtures("isolated_imports")
def test_fast_dropout_timing_runs_with_a_checkout(tmp_path):
    """--fast-dropout times both sides with fxquant.fast_dropout: the reference's dropout
    and fxquant's are both swapped, and the JSON carries the extra ratios."""
    out = tmp_path / "t.json"
    body = bench_dq_reference.main([
        "--accuracy-from", str(ROOT / "docs" / "results" / "dq_reference_cora_gcn.json"),
        "--time-rows", "int8-dq", "--time-rounds", "1", "--time-steps", "1", "--warmup", "1",
        "--fast-dropout", "--no-write", "--json", str(out)])
    assert body is not None and "fast dropout" in body
    timing = json.loads(out.read_text())["timing"][0]
    assert set(timing["round_ratios_fast_dropout"]) == set(bench_dq_reference.REFERENCES)
