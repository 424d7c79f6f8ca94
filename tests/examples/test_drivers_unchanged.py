"""The experiment drivers give the same accuracies (and bits) as before their training loop
moved into ``examples/training.py`` and ``fxquant.recipes``: each command runs twice, with
the scripts as they were (read from git history) and as they are, on 2 seeds x 6 epochs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.data import needs_data

ROOT = Path(__file__).resolve().parents[2]
#: the last commit with the drivers' own training loops
BEFORE = "b5b51df"
SCRIPTS = ("train_cora.py", "bits_pareto.py", "dq_table.py", "training.py")
SHORT = ["--seeds", "2", "--epochs", "6"]

COMMANDS = [
    ["train_cora.py"],
    ["train_cora.py", "--sites", "all", "--format", "int4", "--range", "lsq", "--protect",
     "0.0:0.2", "--lsq-refit", "3"],
    ["train_cora.py", "--model", "gin", "--sites", "all", "--format", "e2m1", "--scale",
     "block32"],
    ["bits_pareto.py", "--method", "degree", "--degree-rule", "hub-messages", "--target-bits",
     "2", "--signed-grid", "midrise", "--shared-step", "--anneal", "2",
     "--last-aggregate-bits", "4", "--select", "budget"],
    ["bits_pareto.py", "--method", "learned", "--target-bits", "2", "--signed-grid", "midrise",
     "--shared-step", "--select", "budget", "--penalty", "10", "--shared-bits", "layer"],
    ["bits_pareto.py", "--method", "degree", "--target-bits", "2.5", "--anneal", "3"],
    ["bits_pareto.py", "--method", "int", "--target-bits", "3", "--lsq-refit", "2",
     "--last-aggregate-bits", "4"],
    ["dq_table.py", "--only", "int4-lsq-p,mxfp4", "--model", "gcn"],
]


def _old_scripts(tmp_path: Path) -> Path:
    folder = tmp_path / "before" / "examples"
    folder.mkdir(parents=True)
    for name in SCRIPTS:
        shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{BEFORE}:examples/{name}"],
                               capture_output=True, text=True)
        if shown.returncode == 0:
            (folder / name).write_text(shown.stdout)
    return folder


def _run(script: Path, args: list[str], out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    subprocess.run([sys.executable, "-W", "ignore", str(script), *args, *SHORT, "--json",
                    str(out)], check=True, env=env, capture_output=True, cwd=script.parent)
    return json.loads(out.read_text())


def _numbers(payload: dict) -> list:
    rows = []
    for r in payload["results"]:
        rows.append((r.get("name", r.get("method")), r["accs"], r.get("avg_bits"),
                     r.get("budget_met")))
    return [*rows, payload.get("fp32_accs")]


@needs_data
@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:3]))
def test_same_accuracies_as_before_the_move(command, tmp_path):
    """Same command, same seeds: the same accuracies, bits and budget flags as before."""
    if subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", BEFORE],
                      capture_output=True).returncode != 0:
        pytest.skip(f"this clone lacks commit {BEFORE} (a shallow clone)")
    old = _run(_old_scripts(tmp_path) / command[0], command[1:], tmp_path / "old.json")
    new = _run(ROOT / "examples" / command[0], command[1:], tmp_path / "new.json")
    assert _numbers(new) == _numbers(old)
