"""python -m fxquant lint: the exit-status contract, formats, inputs, usage errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fxquant.cli import main
from tests.support.sarif import validate_sarif

ROOT = Path(__file__).resolve().parents[1]
SEED = f"{ROOT / 'tests' / 'support' / 'models.py'}:seed"
MODELS = ROOT / "tests" / "support" / "models.py"


def test_seed_model_prints_the_table_and_exits_1(capsys):
    """Errors found: the table names the `*=` lines; exit status 1."""
    assert main(["lint", SEED]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["rule", "severity", "location"]
    assert "FXQ001" in out and "out *= 2**e_decimal" in out


def test_json_and_sarif_formats(capsys):
    """Both machine formats parse; SARIF is 2.1.0."""
    assert main(["lint", SEED, "--format", "json"]) == 1
    assert json.loads(capsys.readouterr().out)["mode"] == "dynamic"
    assert main(["lint", SEED, "--format", "sarif"]) == 1
    log = json.loads(capsys.readouterr().out)
    validate_sarif(log, expected_results=len(log["runs"][0]["results"]))


def test_clean_model_from_shapes_exits_0(capsys):
    """--input gives shapes: lint runs the forward on fake tensors (no data, no compute)."""
    code = main(["lint", f"{MODELS}:GCN", "--input", "x=6,4", "--input", "edge_index=2,12:int64",
                 "--format", "json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["mode"] == "shapes"
    assert [f["rule"] for f in report["findings"]] == ["FXQ010"]  # the note: shapes only


def test_seed_model_lints_from_shapes_of_data_fields(capsys):
    """A PyG Data argument, field by field; Cora's shapes, nothing computed."""
    code = main(["lint", SEED, "--input", "data.x=2708,8", "--input",
                 "data.edge_index=2,10556:int64", "--format", "json"])
    assert code == 1
    report = json.loads(capsys.readouterr().out)
    assert report["mode"] == "shapes"
    assert {f["rule"] for f in report["findings"] if f["severity"] == "error"} == {"FXQ001"}


def test_check_with_inputs_runs_on_random_data(capsys):
    code = main(["lint", f"{MODELS}:GCN", "--input", "x=6,4", "--input", "edge_index=2,12:int64",
                 "--check", "--format", "json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["mode"] == "check"


_EDGE_MODEL = """
import torch
from torch_geometric.nn import GCNConv


class EdgeWeighted(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.edge = GCNConv(4, 4), torch.nn.Linear(2, 1)

    def forward(self, x, edge_index, edge_attr):
        return self.conv(x, edge_index, self.edge(edge_attr).sigmoid().view(-1)).relu()
"""


@pytest.mark.parametrize("first", ["edge_attr", "x"])
def test_check_draws_node_ids_from_the_node_features_whatever_the_flag_order(first, tmp_path,
                                                                          capsys):
    """Random integer inputs index the first floating input in forward's order: with
    --input edge_attr=100,2 given before x=10,4 they ranged over 100 rows, and a correct
    model got an FXQ009 "index out of bounds" (exit 1)."""
    path = tmp_path / "edge_model.py"
    path.write_text(_EDGE_MODEL)
    specs = {"x": "x=10,4", "edge_attr": "edge_attr=100,2"}
    inputs = [specs[first], specs["x" if first == "edge_attr" else "edge_attr"],
              "edge_index=2,100:int64"]
    args = [a for spec in inputs for a in ("--input", spec)]
    assert main(["lint", f"{path}:EdgeWeighted", *args, "--check"]) == 0, capsys.readouterr().out


def test_check_flag_runs_backward(capsys):
    """--check adds the zero-gradient parameters."""
    assert main(["lint", SEED, "--check"]) == 1
    assert "FXQ008" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["lint", "nofile.py:X"], "no such file"),
        (["lint", "models.py"], "path/to/file.py:NAME"),
        (["lint", f"{MODELS}:Missing"], "has no 'Missing'"),
        (["lint", f"{MODELS}:tiny_graph"], "must be an nn.Module"),
        (["lint", f"{MODELS}:GCN", "--input", "z=3"], "forward has no argument 'z'"),
        (["lint", f"{MODELS}:GCN", "--input", "x=a,b"], "comma-separated ints"),
        (["lint", f"{MODELS}:GCN", "--input", "x=-1"], "sizes must be >= 0"),
        (["lint", f"{MODELS}:GCN", "--input", "x=3,4:complex7"], "unknown dtype"),
        (["lint", f"{MODELS}:GCN", "--input", "x=3,4"], r"forward needs \['edge_index'\]"),
        (["lint", f"{MODELS}:GCN", "--check"], "needs example inputs"),
        (["lint", f"{MODELS}:GCN", "--input", "x=3,4", "--input", "x=3,5"], "given twice"),
        (["lint", f"{MODELS}:GCN", "--check", "--input", "x=100000000000000,16", "--input",
          "edge_index=2,10:int64"], r"--input of shape \[100000000000000, 16\].*cannot allocate"),
        (["lint", f"{MODELS}:GCN", "--output", "no/such/folder/out.txt"],
         "--output no/such/folder/out.txt: not a file in an existing folder"),
    ],
)
def test_usage_errors_exit_2(argv, message, capsys):
    """Each usage error says what is wrong on stderr and exits 2."""
    assert main(argv) == 2
    assert pytest.importorskip("re").search(message, capsys.readouterr().err)


_MISBEHAVING = '''
import sys
import torch


class ExitsAfterInplaceError(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        print("model output on stdout")
        y = torch.sigmoid(self.lin(x))
        y *= 2
        raise SystemExit(0)


class Chatty(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        print("hello from forward")
        sys.path.insert(0, "/nowhere")
        return self.lin(x)


def exits_at_build():
    raise SystemExit(0)
'''


@pytest.fixture
def misbehaving(tmp_path):
    path = tmp_path / "misbehaving.py"
    path.write_text(textwrap.dedent(_MISBEHAVING))
    return path


@pytest.mark.parametrize("extra", [[], ["--check"]])
def test_system_exit_in_forward_still_reports_the_error(misbehaving, extra, capsys):
    """SystemExit(0) after an in-place error: exit 1 with the findings, not a silent 0."""
    code = main(["lint", f"{misbehaving}:ExitsAfterInplaceError", "--input", "x=4,3", *extra])
    out = capsys.readouterr().out
    assert code == 1
    assert "FXQ009" in out and "SystemExit" in out
    assert "y *= 2" in out


def test_model_output_goes_to_stderr_and_json_stays_valid(misbehaving, capsys):
    """What forward prints does not land in the JSON on stdout; sys.path comes back exactly."""
    before = list(sys.path)
    assert main(["lint", f"{misbehaving}:Chatty", "--input", "x=4,3", "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert [f["rule"] for f in json.loads(captured.out)["findings"]] == ["FXQ010"]
    assert "hello from forward" in captured.err
    assert sys.path == before


def test_output_file(misbehaving, tmp_path, capsys):
    """--output writes the report there and nothing else to stdout."""
    target = tmp_path / "report.sarif"
    code = main(["lint", f"{misbehaving}:ExitsAfterInplaceError", "--input", "x=4,3",
                 "--format", "sarif", "--output", str(target)])
    assert code == 1 and capsys.readouterr().out == ""
    validate_sarif(json.loads(target.read_text()), expected_results=len(
        json.loads(target.read_text())["runs"][0]["results"]))


@pytest.mark.parametrize("name", ["exits_at_build", "Missing"])
def test_import_and_build_failures_exit_2(misbehaving, tmp_path, name, capsys):
    """A target that cannot be built, or a file whose import raises (even SystemExit), is
    'could not lint' (2), not 'clean' (0) or 'errors' (1)."""
    assert main(["lint", f"{misbehaving}:{name}"]) == 2
    broken = tmp_path / "broken.py"
    broken.write_text("raise SystemExit(0)\n")
    assert main(["lint", f"{broken}:X"]) == 2
    assert "importing" in capsys.readouterr().err


def _run_module(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "fxquant", *args], capture_output=True,
                          text=True, check=False, cwd=cwd, env=env)


def test_module_entry_point_and_help(tmp_path):
    """`python -m fxquant lint --help` warns that linting runs the file; a `tabulate.py` in
    the working folder does not replace the real dependency."""
    (tmp_path / "tabulate.py").write_text("raise SystemExit('the shadow tabulate was imported')\n")
    done = _run_module(["lint", "--help"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "imports the file, which runs its top-level code" in done.stdout
    done = _run_module(["lint", SEED], tmp_path)
    assert done.returncode == 1, done.stderr
    assert "FXQ001" in done.stdout


def _hooks():
    """(id, entry) of each hook in .pre-commit-hooks.yaml (no YAML library needed)."""
    text = (Path(__file__).resolve().parents[1] / ".pre-commit-hooks.yaml").read_text()
    ids = re.findall(r"^- id: (\S+)$", text, re.M)
    entries = re.findall(r"^  entry: (.+)$", text, re.M)
    assert len(ids) == len(entries) >= 1
    return list(zip(ids, entries, strict=True))


@pytest.mark.parametrize(("hook", "entry"), _hooks())
def test_pre_commit_hooks_run_the_cli(hook, entry, tmp_path):
    """Each hook's entry, run as pre-commit would: 1 on a buggy model, 0 on a clean one."""
    model_file = tmp_path / "models.py"
    model_file.write_text(
        "import torch\n"
        "class Buggy(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.lin = torch.nn.Linear(3, 3)\n"
        "    def forward(self, x):\n"
        "        y = self.lin(x).sigmoid()\n"
        "        y += 1\n"
        "        return y\n"
        "class Clean(Buggy):\n"
        "    def forward(self, x):\n"
        "        return self.lin(x).sigmoid() + 1\n")
    command = entry.split()
    assert command[:3] == ["python", "-m", "fxquant"]
    for name, status in (("Buggy", 1), ("Clean", 0)):
        done = subprocess.run([sys.executable, *command[1:], f"{model_file}:{name}",
                               "--input", "x=4,3"], capture_output=True, text=True,
                              cwd=tmp_path, timeout=300)
        assert done.returncode == status, (hook, name, done.stdout, done.stderr)


_NOISY = '''
import os
import subprocess

import torch

os.write(1, b"noise at import\\n")


class Noisy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        os.write(1, b"noise in __init__\\n")
        subprocess.run(["echo", "noise from a subprocess in __init__"], check=True)
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        os.write(1, b"noise in forward\\n")
        subprocess.run(["echo", "noise from a subprocess in forward"], check=True)
        y = torch.sigmoid(self.lin(x))
        y *= 2
        return y
'''


@pytest.fixture
def noisy(tmp_path):
    path = tmp_path / "noisy.py"
    path.write_text(textwrap.dedent(_NOISY))
    return path


@pytest.mark.parametrize("fmt", ["json", "sarif"])
@pytest.mark.parametrize("extra", [["--input", "x=4,3"], ["--input", "x=4,3", "--check"], []])
def test_output_on_file_descriptor_1_never_lands_in_the_report(noisy, fmt, extra, capfd):
    """os.write(1, ...) and subprocesses at import, in __init__ and in forward: the report
    on stdout still parses; the noise is on stderr."""
    code = main(["lint", f"{noisy}:Noisy", "--format", fmt, *extra])
    captured = capfd.readouterr()
    document = json.loads(captured.out)
    assert code == (1 if extra else 0)
    assert "noise" not in captured.out
    assert "noise in __init__" in captured.err and "noise from a subprocess" in captured.err
    if fmt == "sarif":
        validate_sarif(document, expected_results=len(document["runs"][0]["results"]))
    os.write(1, b"fd 1 is back\n")
    assert "fd 1 is back" in capfd.readouterr().out


@pytest.mark.parametrize("fmt", ["json", "sarif"])
def test_noise_on_file_descriptor_1_in_a_real_process(noisy, fmt, tmp_path):
    """The same through `python -m fxquant`, where nothing captures file descriptors."""
    done = _run_module(["lint", f"{noisy}:Noisy", "--input", "x=4,3", "--format", fmt], tmp_path)
    assert done.returncode == 1, done.stderr
    json.loads(done.stdout)
    assert "noise in forward" in done.stderr and "noise from a subprocess" in done.stderr


_CRASHES_IN_BACKWARD = (
    "import torch\n"
    "class Buggy(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.lin = torch.nn.Linear(3, 3)\n"
    "    def forward(self, x):\n"
    "        y = self.lin(x).sigmoid()\n"
    "        y += 1\n"
    "        return y\n")


def test_without_inputs_the_output_says_first_that_the_check_was_partial(tmp_path, capsys):
    """No --input: the exit contract stays (no error seen: 0), and the first line says the
    check was partial and how to make it complete; --input then finds the bug (1)."""
    path = tmp_path / "buggy.py"
    path.write_text(_CRASHES_IN_BACKWARD)
    assert main(["lint", f"{path}:Buggy"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("PARTIAL CHECK") and "--input" in first and "ShapeSpec" in first
    assert main(["lint", f"{path}:Buggy", "--format", "json"]) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert next(iter(document)) == "partial" and "--input" in document["partial"]
    assert "PARTIAL CHECK" in captured.err
    assert main(["lint", f"{path}:Buggy", "--format", "sarif"]) == 0
    log = json.loads(capsys.readouterr().out)
    (note,) = log["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    assert "PARTIAL CHECK" in note["message"]["text"]
    validate_sarif(log, expected_results=len(log["runs"][0]["results"]))
    assert main(["lint", f"{path}:Buggy", "--input", "x=4,3"]) == 1
    assert not capsys.readouterr().out.startswith("PARTIAL")


def test_a_container_module_is_named_where_it_was_built_from_the_cli(capsys):
    """The CLI loads the file by path (its classes are not in sys.modules): the Dropout a
    Sequential runs is still named at its construction line."""
    path = ROOT / "tests" / "linter" / "corpus" / "crash_23_feedforward_sequential_dropout_inplace.py"
    culprit = next(i for i, line in enumerate(path.read_text().splitlines(), 1)
                   if line.rstrip().endswith("# CULPRIT"))
    assert main(["lint", f"{path}:make", "--format", "json"]) == 1
    (error,) = [f for f in json.loads(capsys.readouterr().out)["findings"]
                if f["severity"] == "error"]
    assert (error["rule"], error["line"]) == ("FXQ001", culprit)
    assert "inplace=False" in error["hint"]


_OPTIONAL_ARGUMENTS = """
import torch


class Optional(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x, scale=None, bias=None):
        y = self.lin(x)
        if bias is not None:
            y = torch.exp(y)
            y.add_(bias)
        return y
"""


@pytest.mark.parametrize("check", [False, True])
def test_an_input_after_a_skipped_optional_argument_is_passed(tmp_path, check, capsys):
    """--input for a later argument while an earlier optional one is left out: forward
    gets the later one (the skipped one its default), so the bug behind it is found
    (it was dropped, and the model reported clean)."""
    path = tmp_path / "optional.py"
    path.write_text(_OPTIONAL_ARGUMENTS)
    argv = ["lint", f"{path}:Optional", "--input", "x=5,8", "--input", "bias=5,4"]
    assert main(argv + (["--check"] if check else [])) == 1
    assert "FXQ001" in capsys.readouterr().out
