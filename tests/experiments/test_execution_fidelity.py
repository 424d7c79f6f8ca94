"""The fidelity table of converted models: a one-case run writes the rows the results page
reads, and unknown values of its flags exit 2 naming the flag."""

from __future__ import annotations

import json

import pytest

from experiments import execution_fidelity
from tests.support.data import needs_data


@needs_data
def test_one_case_writes_both_ways_of_rounding_ties(tmp_path):
    path = tmp_path / "fidelity.json"
    execution_fidelity.main(["--datasets", "Cora", "--models", "gcn", "--configs", "int8",
                             "--json", str(path)])
    rows = json.loads(path.read_text())["rows"]
    assert [(r["dataset"], r["model"], r["config"], r["ties"]) for r in rows] == [
        ("Cora", "gcn", "int8", "simulation"), ("Cora", "gcn", "int8", "nearest")]
    for row in rows:
        assert 0 <= row["unequal"] <= row["codes"] and row["codes"] > 0
        assert 0.999 <= row["worst_fraction"] <= 1.0 and row["agreement"] >= 0.995


@pytest.mark.parametrize("flag, value", [("--models", "gcn,mlp"), ("--ties", "auto"),
                                         ("--configs", "int2")])
def test_unknown_values_exit_2_naming_the_flag(flag, value, capsys):
    with pytest.raises(SystemExit) as exc:
        execution_fidelity.main([flag, value])
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err
