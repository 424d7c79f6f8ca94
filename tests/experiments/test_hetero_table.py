"""The heterogeneous and graph-level table: a smoke run at tiny sizes writes the JSON the
results page reads, and the table prints from it."""

from __future__ import annotations

import json

from experiments import hetero_table


def test_quick_run_writes_the_table(tmp_path, capsys):
    path = tmp_path / "hetero.json"
    payload = hetero_table.main(["--quick", "--seeds", "2", "--json", str(path)])
    saved = json.loads(path.read_text())
    assert saved["results"].keys() == set(hetero_table.MODELS)
    for model in hetero_table.MODELS:
        rows = saved["results"][model]
        assert rows.keys() == set(hetero_table.CONFIGS)
        assert all(len(row["accs"]) == 2 and len(row["vals"]) == 2 for row in rows.values())
        assert rows["int4-lsq-p"]["refit_epochs"] in hetero_table.REFIT_CANDIDATES
    assert payload["seeds"] == [0, 1]
    capsys.readouterr()
    hetero_table.main(["--from-json", str(path)])
    printed = capsys.readouterr().out
    assert "| INT8, every site |" in printed and "GIN + sum pooling" in printed


def test_the_int4_row_is_chosen_on_validation_accuracy():
    """Where two refit settings differ, the row reports the one of the higher mean
    validation accuracy, whatever the test accuracy."""
    chosen = hetero_table.choose({0: {"vals": [0.5, 0.6], "accs": [0.9, 0.9]},
                                  5: {"vals": [0.7, 0.6], "accs": [0.1, 0.1]}})
    assert chosen == 5
    assert hetero_table.choose({0: {"vals": [0.5]}, 5: {"vals": [0.5]}}) == 0
