"""A smoke run of benchmarks/bench_execution.py (tiny sizes, one short round), so that it
cannot rot. Speed is measured by the script, never asserted here."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_execution
from tests.support.data import needs_data


@pytest.mark.slow
@needs_data
def test_bench_execution_quick(tmp_path):
    """Every section is written: latency per case (with its profile), memory and BitOPs
    per configuration, ONNX Runtime where the export extra is installed."""
    path = tmp_path / "execution.json"
    payload = bench_execution.main(["--quick", "--no-compile", "--models", "gcn",
                                    "--json", str(path)])
    saved = json.loads(path.read_text())
    assert saved["latency"] and saved["memory"]
    cases = {r["case"] for r in saved["latency"]}
    assert {"pyg float32 eager", "int8, stored int8 features",
            "int8 (ties=nearest), stored int8 features"} <= cases
    assert all(r["top_ops"] for r in saved["latency"] if r["threads"] == 1)
    configs = {r["config"]: r for r in saved["memory"] if r["graph"] == "Cora"}
    assert configs["int8"]["values_ratio"] > 3.9 and configs["int4-lsq-p"]["values_ratio"] > 7.5
    assert configs["recommended"]["values_ratio"] > 12
    assert payload["memory"] == saved["memory"]
    if saved["onnx"]:
        assert {r["case"] for r in saved["onnx"]} == {
            "onnxruntime int8", "onnxruntime int8, stored int8 features", "onnxruntime float32"}


@needs_data
def test_bench_execution_runs_only_the_sections_asked(tmp_path):
    """--only memory measures bytes, peaks and BitOPs without timing anything; an unknown
    section, or a plot without both of its sections, is a usage error before any work."""
    path = tmp_path / "memory.json"
    bench_execution.main(["--quick", "--no-large", "--models", "gcn", "--only", "memory",
                          "--json", str(path)])
    saved = json.loads(path.read_text())
    assert saved["memory"] and not saved["latency"] and not saved["onnx"]
    for argv in (["--only", "speed"], ["--only", "memory", "--plot", str(tmp_path / "p.png")]):
        with pytest.raises(SystemExit) as e:
            bench_execution.main(["--quick", *argv])
        assert e.value.code == 2
