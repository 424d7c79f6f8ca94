"""python -m fxquant lint: exit codes, formats, inputs, usage errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fxquant.cli import main

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


@pytest.fixture
def seed_file(tmp_path):
    path = tmp_path / "seed_model.py"
    path.write_text(
        "import sys\n"
        f"sys.path[:0] = [{str(ROOT / 'benchmarks')!r}, {str(TESTS)!r}]\n"
        "from seed_bitplanes import SeedGCN\n"
        "from models import tiny_graph\n\n"
        "def seed():\n"
        "    return SeedGCN(), (tiny_graph(),)\n"
    )
    return path


def test_seed_model_prints_the_table_and_exits_1(seed_file, capsys):
    """Errors found: the table names the `*=` lines; exit status 1."""
    assert main(["lint", f"{seed_file}:seed"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["rule", "severity", "location"]
    assert "FXQ001" in out and "out *= 2**e_decimal" in out


def test_json_and_sarif_formats(seed_file, capsys):
    """Both machine formats parse; SARIF is 2.1.0."""
    assert main(["lint", f"{seed_file}:seed", "--format", "json"]) == 1
    assert json.loads(capsys.readouterr().out)["mode"] == "dynamic"
    assert main(["lint", f"{seed_file}:seed", "--format", "sarif"]) == 1
    from passes.test_lint import validate_sarif

    log = json.loads(capsys.readouterr().out)
    validate_sarif(log, expected_results=len(log["runs"][0]["results"]))


def test_clean_model_with_generated_inputs_exits_0(capsys):
    """--input makes randn floats and integer indices into the rows of the first float input."""
    code = main(["lint", f"{TESTS / 'models.py'}:GCN", "--input", "x=6,4",
                 "--input", "edge_index=2,12:int64"])
    assert code == 0
    assert "no findings" in capsys.readouterr().out


def test_check_flag_runs_backward(seed_file, capsys):
    """--check adds the zero-gradient parameters."""
    assert main(["lint", f"{seed_file}:seed", "--check"]) == 1
    assert "FXQ008" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["lint", "nofile.py:X"], "no such file"),
        (["lint", "models.py"], "path/to/file.py:NAME"),
        (["lint", f"{TESTS / 'models.py'}:Missing"], "has no 'Missing'"),
        (["lint", f"{TESTS / 'models.py'}:tiny_graph"], "must be an nn.Module"),
        (["lint", f"{TESTS / 'models.py'}:GCN", "--input", "z=3"], "forward has no argument 'z'"),
        (["lint", f"{TESTS / 'models.py'}:GCN", "--input", "x=a,b"], "comma-separated ints"),
        (["lint", f"{TESTS / 'models.py'}:GCN", "--input", "x=3,4:complex7"], "unknown dtype"),
        (["lint", f"{TESTS / 'models.py'}:GCN", "--input", "x=3,4"], r"forward needs \['edge_index'\]"),
        (["lint", f"{TESTS / 'models.py'}:GCN", "--check"], "needs example inputs"),
    ],
)
def test_usage_errors_exit_2(argv, message, capsys):
    """Each usage error says what is wrong on stderr and exits 2."""
    assert main(argv) == 2
    assert pytest.importorskip("re").search(message, capsys.readouterr().err)


def test_module_entry_point_and_help():
    """`python -m fxquant lint --help` warns that linting runs the file."""
    done = subprocess.run([sys.executable, "-m", "fxquant", "lint", "--help"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0
    assert "imports the file, which runs its top-level code" in done.stdout
