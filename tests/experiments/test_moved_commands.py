"""The experiment drivers left ``examples/`` and ``benchmarks/`` for ``experiments/``: each
moved command, run with one seed and a few epochs, writes the same JSON (and, where it
trains nothing, prints the same table) as the code before the move.

The references under ``moved/`` were written by the commands at their old paths, before
anything moved (``python -m tests.experiments.test_moved_commands --write OLD``; see
:func:`main`). Timings, processor names and the torch version vary from run to run and are
compared by presence only; paths are compared relative to the run's folder. The printed 95%
intervals are left out of the comparison: their t quantiles are scipy's now, where a table
of rounded values stood before (the paired means, and their sign, are compared).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.data import needs_data

ROOT = Path(__file__).resolve().parents[2]
REFERENCES = Path(__file__).resolve().parent / "moved"
#: keys whose values change from run to run (timings, the machine, the torch build)
VOLATILE = frozenset({"epoch_ms", "cpu_s", "teacher_cpu_s", "seconds", "cpu", "torch",
                      "reference_epoch_ms", "fxquant_epoch_ms"})
#: where each driver lived before the move (the old command, without ``python``)
OLD = {
    "experiments.train_cora": ["examples/train_cora.py"],
    "experiments.bits_pareto": ["examples/bits_pareto.py"],
    "experiments.dq_table": ["examples/dq_table.py"],
    "experiments.train_ddp": ["examples/train_ddp.py"],
    "experiments.select_bits": ["-m", "benchmarks.select_bits"],
    "experiments.trace_training": ["-m", "benchmarks.trace_training"],
    "experiments.heldout_bits": ["-m", "benchmarks.bench_heldout_bits"],
}


@dataclass(frozen=True)
class Case:
    """One command: the module it runs now, its arguments (``{out}``: the JSON it writes,
    ``{tmp}``: the run's folder), and what is compared: ``json`` (the file ``{out}``),
    ``jsonl`` (JSON lines in ``{out}``) and/or ``stdout``."""

    id: str
    module: str
    args: tuple[str, ...]
    compare: tuple[str, ...] = ("json",)
    #: commands run first, in the same folder (e.g. the files a merge reads)
    before: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())


def _c(id: str, module: str, *args: str, compare: tuple[str, ...] = ("json",),
       before: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> Case:
    return Case(id, f"experiments.{module}", args, compare, before)


ONE = ("--seeds", "1")
CASES = [
    # train_cora.py: the README's job, and each kind of row of the truncation page
    _c("cora-default", "train_cora", *ONE, "--epochs", "4", "--json", "{out}"),
    _c("cora-sweep-bits", "train_cora", "--sweep", "16,9", *ONE, "--epochs", "3", "--json", "{out}"),
    _c("cora-formats-row", "train_cora", "--sweep", "e4m3,e2m1", "--scale", "row", *ONE,
       "--epochs", "3", "--json", "{out}"),
    _c("cora-format-momentum", "train_cora", "--format", "e4m3", "--scale", "tensor",
       "--momentum", "0.1", *ONE, "--epochs", "3", "--json", "{out}"),
    _c("cora-grad-zero", "train_cora", "--bits", "16", "--grad", "zero", *ONE, "--epochs", "3",
       "--json", "{out}"),
    _c("cora-super-nodes", "train_cora", "--bits", "10", "--rounding", "nearest",
       "--super-nodes", "0.1:8", *ONE, "--epochs", "3", "--json", "{out}"),
    _c("cora-lsq-protect", "train_cora", "--sites", "all", "--format", "int4", "--range", "lsq",
       "--protect", "0.0:0.2", "--lsq-refit", "2", *ONE, "--epochs", "4", "--json", "{out}"),
    _c("cora-gin-mx", "train_cora", "--model", "gin", "--sites", "all", "--format", "e2m1",
       "--scale", "block32", *ONE, "--epochs", "3", "--json", "{out}"),
    _c("cora-gat-sr-fork", "train_cora", "--model", "gat", "--sites", "all", "--format", "int4",
       "--range", "lsq", "--message-rounding", "stochastic", "--eval-rng", "fork", *ONE,
       "--epochs", "3", "--json", "{out}"),
    _c("cora-percentile-layers", "train_cora", "--format", "int8:asym", "--range",
       "percentile:99.9", "--layers", "conv1", "--rounding", "stochastic", *ONE,
       "--dataset", "CiteSeer", "--epochs", "3", "--json", "{out}"),
    _c("cora-from-json", "train_cora", "--from-json", "docs/results/cora_sweep.json",
       "docs/results/cora_formats_row.json", "docs/results/cora_grad_zero.json",
       compare=("stdout",)),
    # bits_pareto.py: every method, and the flags of the published commands
    _c("pareto-topn", "bits_pareto", "--method", "topn", "--target-bits", "2,9", *ONE,
       "--epochs", "3", "--json", "{out}"),
    _c("pareto-format", "bits_pareto", "--method", "format", "--target-bits", "6", *ONE,
       "--epochs", "3", "--json", "{out}"),
    _c("pareto-int", "bits_pareto", "--method", "int", "--target-bits", "3", "--lsq-refit", "2",
       "--last-aggregate-bits", "4", *ONE, "--epochs", "4", "--json", "{out}"),
    _c("pareto-degree", "bits_pareto", "--method", "degree", "--target-bits", "2.5", "--anneal",
       "2", "--dataset", "CiteSeer", *ONE, "--epochs", "5", "--json", "{out}"),
    _c("pareto-degree-hubs", "bits_pareto", "--method", "degree", "--degree-rule",
       "hub-messages", "--target-bits", "2", "--signed-grid", "midrise", "--shared-step",
       "--anneal", "2", "--last-aggregate-bits", "4", "--select", "budget", *ONE, "--epochs",
       "5", "--json", "{out}"),
    _c("pareto-learned", "bits_pareto", "--method", "learned", "--target-bits", "1.5,2",
       "--signed-grid", "midrise", "--shared-step", "--select", "budget", "--penalty", "10",
       "--shared-bits", "layer", "--bits-lr", "0.05", *ONE, "--epochs", "4", "--json", "{out}"),
    _c("pareto-recommended", "bits_pareto", "--method", "recommended", "--target-bits", "2",
       *ONE, "--first-seed", "1", "--epochs", "5", "--json", "{out}"),
    _c("pareto-from-json", "bits_pareto", "--from-json", "docs/results/bits_cora_topn.json",
       "docs/results/bits_cora_recommended.json", "docs/results/bits_citeseer_learned.json",
       compare=("stdout",)),
    # dq_table.py: the default rows, named rows, the flags of the published commands
    _c("dq-default", "dq_table", *ONE, "--epochs", "2", "--json", "{out}"),
    _c("dq-lsq-mx", "dq_table", "--only", "int4-lsq-p,mxfp4", *ONE, "--epochs", "4",
       "--lsq-refit", "2", "--protect", "0:0.1", "--json", "{out}"),
    _c("dq-gat-fork", "dq_table", "--model", "gat", "--dataset", "CiteSeer", "--only",
       "fp32,int4-lsq-ps,int4-lsq-pe", "--eval-rng", "fork", "--lsq-refit", "3",
       "--float-epochs", "2", *ONE, "--epochs", "5", "--json", "{out}"),
    _c("dq-gin-reference", "dq_table", "--model", "gin", "--only", "int8-dq,int8-lsq-p",
       "--first-seed", "3", *ONE, "--epochs", "3", "--json", "{out}"),
    _c("dq-gat64", "dq_table", "--model", "gat64", "--only", "int4-pct-p", *ONE, "--epochs",
       "2", "--json", "{out}"),
    _c("dq-merge", "dq_table", "--from-json", "docs/results/dq_citeseer_gin.json",
       "docs/results/dq_citeseer_gin_int8.json", "--json", "{out}", compare=("json", "stdout")),
    _c("dq-plot", "dq_table", "--from-json", "docs/results/dq_cora_gcn.json",
       "docs/results/dq_cora_gin.json", "--plot", "{tmp}/dq.png", compare=("stdout",)),
    # train_ddp.py: one process emulating two ranks, and one on its own
    _c("ddp-emulated", "train_ddp", "--dataset", "Cora", "--format", "int8", "--sites", "all",
       "--epochs", "2", "--dropout", "0", "--emulate-world", "2", "--json", "{out}"),
    _c("ddp-bits", "train_ddp", "--format", "10", "--rounding", "stochastic", "--epochs", "1",
       "--num-neighbors=-1,-1", "--json", "{out}"),
    # the selection of the recommended recipe: trials, their report, a merge of seed ranges
    _c("select-trials", "select_bits", "--candidates", "hub,budget-degree-float30",
       "--datasets", "Cora", "--seeds", "0", "--epochs", "3", "--trials", "{out}",
       compare=("jsonl",)),
    _c("select-report", "select_bits", "--report", "--trials",
       "docs/results/bits_selection_trials.jsonl", "--json", "{out}",
       compare=("json", "stdout")),
    _c("select-merge", "select_bits", "--merge", "{tmp}/a.json", "{tmp}/b.json", "--json",
       "{out}", before=(
           ("experiments.bits_pareto", ("--method", "int", "--target-bits", "3", *ONE,
                                        "--epochs", "2", "--json", "{tmp}/a.json")),
           ("experiments.bits_pareto", ("--method", "int", "--target-bits", "3", *ONE,
                                        "--first-seed", "1", "--epochs", "2", "--json",
                                        "{tmp}/b.json")))),
    # the training traces of the degree-quant page, and the held-out graphs
    _c("trace-row", "trace_training", "--model", "gat", "--dataset", "CiteSeer", "--row",
       "int4-lsq-ps", "--seed", "3", "--epochs", "5", "--lsq-refit", "3", "--float-epochs",
       "1", "--refit-widen", "--eval-rng", "fork", "--every", "2", "--json", "{out}",
       compare=("json", "stdout")),
    _c("trace-recipe", "trace_training", "--recipe", "hub-messages", "--target-bits", "2",
       "--seed", "1", "--epochs", "4", "--steps", "--json", "{out}", compare=("json", "stdout")),
    _c("heldout-quick", "heldout_bits", "--quick", "--json", "{out}"),
]


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), PYTHONHASHSEED="0")
    return env


def _argv(module: str, args: tuple[str, ...], tmp: Path, old: bool) -> list[str]:
    where = OLD[module] if old else ["-m", module]
    filled = [a.replace("{out}", str(tmp / "out")).replace("{tmp}", str(tmp)) for a in args]
    return [sys.executable, "-W", "ignore", *where, *filled]


def run(case: Case, tmp: Path, old: bool = False) -> dict[str, Any]:
    """Run ``case`` (at its old path with ``old``) in ``tmp``; what it wrote and printed,
    normalized for comparison."""
    for module, args in case.before:
        subprocess.run(_argv(module, args, tmp, old), check=True, cwd=ROOT, env=_environment(),
                       capture_output=True, text=True)
    done = subprocess.run(_argv(case.module, case.args, tmp, old), cwd=ROOT,
                          env=_environment(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = {}
    out = tmp / "out"
    if "json" in case.compare:
        found["json"] = normalize(json.loads(out.read_text()), tmp)
    if "jsonl" in case.compare:
        found["jsonl"] = [normalize(json.loads(line), tmp)
                          for line in out.read_text().splitlines() if line.strip()]
    if "stdout" in case.compare:
        found["stdout"] = normalize(done.stdout, tmp)
    return found


def without_intervals(found: dict[str, Any]) -> dict[str, Any]:
    """``found`` with the bounds of the printed intervals (``+1.0 [-0.5, +2.5]``) left out."""
    if "stdout" not in found:
        return found
    return {**found, "stdout": re.sub(r"\[[-+]\d+\.\d, [-+]\d+\.\d\]", "[interval]",
                                      found["stdout"])}


def normalize(value: Any, tmp: Path) -> Any:
    """``value`` with volatile entries replaced by ``"<volatile>"`` and the run's folder and
    the checkout by ``<tmp>`` and ``<root>``."""
    if isinstance(value, dict):
        return {k: "<volatile>" if k in VOLATILE else normalize(v, tmp) for k, v in value.items()}
    if isinstance(value, list):
        return [normalize(v, tmp) for v in value]
    if isinstance(value, str):
        return re.sub(r"\d+ process\(es\)", "N process(es)", value.replace(
            str(tmp), "<tmp>").replace(str(ROOT), "<root>"))
    return value


@needs_data
@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_moved_command_writes_what_it_wrote_before(case, tmp_path):
    """The command at its new path writes the JSON (and prints the table) the command at
    its old path wrote before the move."""
    reference = json.loads((REFERENCES / f"{case.id}.json").read_text())
    assert without_intervals(run(case, tmp_path)) == without_intervals(reference["found"])


#: cases that train nothing, run at their old paths too (forwards kept for one release)
FORWARDED = ("cora-from-json", "pareto-from-json", "dq-merge", "select-report")


@needs_data
@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CASES if c.id in FORWARDED], ids=lambda c: c.id)
def test_old_path_forwards_to_the_moved_command(case, tmp_path):
    """The command at its old path (a forward now) writes and prints what it did."""
    reference = json.loads((REFERENCES / f"{case.id}.json").read_text())
    found = run(case, tmp_path, old=True)
    assert without_intervals(found) == without_intervals(reference["found"])


def main(argv: list[str] | None = None) -> None:
    """``--write OLD``: write the references, running each case at its old path
    (``OLD``) or its new one (``NEW``)."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--write", choices=["OLD", "NEW"], required=True)
    p.add_argument("--only", default=None, help="comma list of case ids")
    args = p.parse_args(argv)
    import tempfile

    REFERENCES.mkdir(exist_ok=True)
    wanted = set(args.only.split(",")) if args.only else None
    for case in CASES:
        if wanted is not None and case.id not in wanted:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            found = run(case, Path(tmp), old=args.write == "OLD")
        command = [*OLD[case.module], *case.args]
        (REFERENCES / f"{case.id}.json").write_text(json.dumps(
            {"command": command, "found": found}, indent=1) + "\n")
        print(f"{case.id}: written", flush=True)


if __name__ == "__main__":
    main()
