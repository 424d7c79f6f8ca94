"""The dependency bounds say what CI tests: every torch minor release the bounds admit has a
CI cell, and the compatibility page lists the same versions."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")


def _bounds(name: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """(lowest, first excluded) minor versions of a `name>=a.b,<c.d` dependency."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if re.match(rf"{name}\b", d))
    low = re.search(r">=(\d+)\.(\d+)", spec)
    high = re.search(r"<(\d+)\.(\d+)", spec)
    assert low and high, f"{spec!r} must give a lower and an upper bound"
    return (int(low[1]), int(low[2])), (int(high[1]), int(high[2]))


def _ci_cells() -> list[tuple[str, str]]:
    """(torch, PyG) versions of every CI cell."""
    text = (ROOT / ".ci" / "run").read_text()
    cells = re.findall(r'"(\d+\.\d+\.\d+) (\d+\.\d+\.\d+)"', text)
    main_torch = re.search(r"pip install -q torch==(\d+\.\d+\.\d+) ", text)
    assert main_torch, ".ci/run names no main torch"
    return [(main_torch[1], ""), *cells]


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def test_every_admitted_torch_minor_has_a_ci_cell():
    (lo_major, lo), (hi_major, hi) = _bounds("torch")
    assert lo_major == hi_major == 2
    admitted = {(2, m) for m in range(lo, hi)}
    tested = {_minor(t) for t, _ in _ci_cells()}
    assert admitted == tested, f"bounds admit {sorted(admitted)}, CI tests {sorted(tested)}"


def test_oldest_and_newest_pyg_are_tested():
    low, high = _bounds("torch_geometric")
    pygs = {_minor(p) for _, p in _ci_cells() if p}
    assert low in pygs, f"the lowest admitted PyG {low} has no CI cell"
    assert (high[0], high[1] - 1) in pygs, "the newest admitted PyG has no CI cell"


def test_compatibility_page_lists_the_cells():
    page = (ROOT / "docs" / "source" / "compatibility.md").read_text()
    for torch_version, pyg_version in _ci_cells():
        assert torch_version in page, f"the compatibility page does not list torch {torch_version}"
        if pyg_version:
            assert pyg_version in page, f"the compatibility page does not list PyG {pyg_version}"
