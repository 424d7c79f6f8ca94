"""The examples: each is at most 120 lines, has --help, and runs (shortened); the README's
job (``examples/train_cora.py``) prints the table it printed before the drivers moved to
``experiments/``, and the old paths of the drivers forward to them."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from examples import cora_recipe, ddp, fix_inplace, per_node_bits, quickstart
from tests.support.data import needs_data

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
#: the drivers' old paths, kept one release as forwards to ``python -m experiments.NAME``
FORWARDS = ["bits_pareto.py", "dq_table.py", "train_ddp.py"]


def _run(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-W", "ignore", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=ROOT)


def test_every_example_is_short():
    """At most 120 lines each: a user reads them."""
    lengths = {p.name: len(p.read_text().splitlines()) for p in EXAMPLES.glob("*.py")}
    assert lengths and not {name: n for name, n in lengths.items() if n > 120}


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_every_example_has_help(name):
    """--help prints the usage and trains nothing (a forward prints its driver's)."""
    done = _run([str(EXAMPLES / name), "--help"], timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage:"), done.stderr


def test_quickstart_trains_through_truncations(capsys):
    """The truncated model trains and gradients reach the first layer."""
    quickstart.main(["--steps", "20"])
    out = capsys.readouterr().out
    assert "conv1_quant" in out and "gradient norm through the truncations" in out


def test_fix_inplace_names_the_line_and_fixes_it(capsys):
    """The culprit line is the masked write; the fixed model trains."""
    fix_inplace.main(["--steps", "2"])
    out = capsys.readouterr().out
    assert "culprit: examples/fix_inplace.py:" in out and "saved by sigmoid" in out
    assert "trained 2 steps on the fixed model" in out
    # the one rewrite the user's code needs; PyG's degree() filling its count is not listed
    assert [line for line in out.splitlines() if line.startswith("rewrote")] == [
        "rewrote `x[index] = v` (in place) -> `x[index] = v` on a copy of x"]


def test_per_node_bits_counts_and_learns(capsys):
    """Fixed widths by degree, learned widths, a mini-batch by global ids."""
    per_node_bits.main(["--steps", "5"])
    out = capsys.readouterr().out
    assert "rows per bit-width" in out and "a batch of 250 nodes" in out


@needs_data
def test_cora_recipe_reports_an_epoch(capsys):
    """A named recipe on Cora in a plain loop (2 epochs)."""
    acc = cora_recipe.main(["--epochs", "2", "--recipe", "mx"])
    assert 0.0 < acc <= 1.0
    assert "mx: test accuracy" in capsys.readouterr().out


def test_ddp_example_ranks_agree(capsys):
    """Two gloo processes end with the same parameters and ranges."""
    ddp.main(["--steps", "2"])
    assert "both ranks hold the same parameters and ranges: True" in capsys.readouterr().out


def _without_times(text: str) -> str:
    """The table's last column (median epoch time, ms) blanked out."""
    return re.sub(r"\|\s*[\d.]+\s*\|$", "| ms |", text, flags=re.M)


@needs_data
@pytest.mark.slow
def test_train_cora_prints_the_table_it_printed_before_the_move():
    """``python examples/train_cora.py`` (2 seeds, 3 epochs): the header, the transformed
    graph, its lint and the table, as the full driver printed them before it moved (the
    epoch times aside)."""
    done = _run([str(EXAMPLES / "train_cora.py"), "--seeds", "2", "--epochs", "3"])
    assert done.returncode == 0, done.stderr[-2000:]
    before = (Path(__file__).parent / "reference" / "train_cora_seeds2_epochs3.txt").read_text()
    assert _without_times(done.stdout) == _without_times(before)


@needs_data
def test_train_cora_forwards_other_flags_to_the_driver():
    """Any flag but --seeds and --epochs runs ``python -m experiments.train_cora``: the
    same output (here a table from published results, no training)."""
    args = ["--from-json", "docs/results/cora_grad_zero.json"]
    forwarded = _run([str(EXAMPLES / "train_cora.py"), *args])
    driver = _run(["-m", "experiments.train_cora", *args])
    assert forwarded.returncode == driver.returncode == 0, forwarded.stderr
    assert forwarded.stdout == driver.stdout and "| FP32" in driver.stdout


@pytest.mark.parametrize("name", FORWARDS)
def test_old_paths_forward_to_the_drivers(name):
    """``python examples/NAME.py`` runs ``python -m experiments.NAME`` with its arguments
    (a usage error here: exit 2, the driver's message), saying where the driver went."""
    done = _run([str(EXAMPLES / name), "--epochs", "0"], timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"python -m experiments.{name[:-3]}" in done.stderr
    assert "--epochs must be >= 1" in done.stderr
