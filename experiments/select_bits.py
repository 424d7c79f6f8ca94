"""Choose a per-node bit-width method on validation accuracy: Cora and CiteSeer jointly.

    python -m experiments.select_bits --candidates hub,budget --seeds 0,1 --jobs 2
    python -m experiments.select_bits --report --json docs/results/bits_selection.json
    python -m experiments.select_bits --merge A.json B.json --json OUT.json

Every trial (a candidate recipe with its settings, a dataset and a seed) trains PyG's
gcn.py GCN with :func:`experiments.training.fit`, the same loop ``bits_pareto`` uses, and
appends one JSON line to ``--trials`` (default ``docs/results/bits_selection_trials.jsonl``):
the settings, the validation accuracy of the reported epoch, its counted ``avg_bits``,
whether it met the budget, and its test accuracy, which is recorded for the audit and read
by nothing here. The choice (``--report``): among the candidates that ran every scoring
seed (:data:`SCORE_SEEDS`) on both datasets and whose every trial met the budget, the
highest mean validation accuracy, where the mean is taken over the datasets of the
per-dataset means over the scoring seeds. Every candidate is scored on the same seeds;
trials on further seeds are reported beside the score and play no part in the choice.

The raw input features are kept float32 in the trials (``input_format=None``): Cora's and
CiteSeer's row-normalized features are exact on the recipes' ``uint1:row`` grid, so the
rounded and float32 forwards are the same numbers, the raw input is not counted in
``avg_bits`` either way, and the trials run faster.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import torch

import fxquant
from experiments import cli, training

ROOT = Path(__file__).resolve().parents[1]
TRIALS = ROOT / "docs" / "results" / "bits_selection_trials.jsonl"
DATASETS = ("Cora", "CiteSeer")
TARGET = 2.0
#: the seeds a candidate is scored on (every candidate's score over the same seeds); trials
#: on other seeds are reported beside the score and play no part in the choice
SCORE_SEEDS = (0, 1, 2)

def _widen30(**change: Any) -> tuple[str, dict[str, Any]]:
    """``hub-refit30-widen`` with ``change`` on top."""
    return ("hub-messages", {"refit_epochs": 30, "refit_widen": True, **change})


#: name -> (recipe, settings); every candidate runs at ``target_bits=TARGET``
CANDIDATES: dict[str, tuple[str, dict[str, Any]]] = {
    # the fixed in-degree rule as published for Cora
    "hub": ("hub-messages", {}),
    "hub-q0.8": ("hub-messages", {"hub_quantile": 0.8}),
    "hub-q0.95": ("hub-messages", {"hub_quantile": 0.95}),
    "hub-last5": ("hub-messages", {"last_aggregate_bits": 5}),
    "hub-anneal25": ("hub-messages", {"anneal_every": 25}),
    # the learned steps fitted again: on the first epochs, or after each annealing drop
    "hub-refit15": ("hub-messages", {"refit_epochs": 15}),
    "hub-refit30": ("hub-messages", {"refit_epochs": 30}),
    "hub-refit50": ("hub-messages", {"refit_epochs": 50}),
    "hub-refit100": ("hub-messages", {"refit_epochs": 100}),
    # ... and a learning rate of their own for the learned steps
    "hub-refit30-steplr0.05": ("hub-messages", {"refit_epochs": 30, "step_lr": 0.05}),
    "hub-refit30-steplr0.1": ("hub-messages", {"refit_epochs": 30, "step_lr": 0.1}),
    "hub-steplr0.05": ("hub-messages", {"step_lr": 0.05}),
    # ... refits that never narrow a grid (a narrowing refit clips the largest messages)
    "hub-refit30-widen": ("hub-messages", {"refit_epochs": 30, "refit_widen": True}),
    "hub-refit50-widen": ("hub-messages", {"refit_epochs": 50, "refit_widen": True}),
    # one change at a time around hub-refit30-widen
    "hub-widen-anneal40": _widen30(anneal_every=40),
    "hub-widen-anneal1": _widen30(anneal_bits=1),
    "hub-widen-last5": _widen30(last_aggregate_bits=5),
    "hub-widen-q0.85": _widen30(hub_quantile=0.85),
    "hub-refit20-widen": ("hub-messages", {"refit_epochs": 20, "refit_widen": True}),
    # ... and refitted after each annealing drop too (a drop leaves a step fitted for a
    # wider grid, which clips the narrower one; a widening refit lets it grow at once)
    "hub-widen-droprefit1": _widen30(anneal_refit_epochs=1),
    "hub-widen-droprefit3": _widen30(anneal_refit_epochs=3),
    "hub-droprefit1-widen": ("hub-messages", {"refit_widen": True, "anneal_refit_epochs": 1}),
    # ... trained in float32 over the first epochs, the steps then fitted to the trained
    # activations (an untrained model's are far smaller)
    "hub-widen-float15": _widen30(float_epochs=15),
    "hub-widen-float30": _widen30(float_epochs=30),
    "hub-widen-float50": _widen30(float_epochs=50),
    "hub-widen-float25": _widen30(float_epochs=25),
    "hub-widen-float40": _widen30(float_epochs=40),
    # one change at a time around hub-widen-float30
    "hub-float30-last5": _widen30(float_epochs=30, last_aggregate_bits=5),
    "hub-float30-q0.95": _widen30(float_epochs=30, hub_quantile=0.95),
    "hub-float30-anneal40": _widen30(float_epochs=30, anneal_every=40),
    # the steps fitted again over the first rounded epochs too (refits inside the float
    # epochs fit steps that nothing uses)
    "hub-float30-refit45": _widen30(float_epochs=30, refit_epochs=45),
    "hub-float30-refit60": _widen30(float_epochs=30, refit_epochs=60),
    # messages rounded stochastically (a hub's sum of 1-bit messages without rounding bias)
    "hub-float30-srmsg": _widen30(float_epochs=30, message_rounding="stochastic"),
    # slower learned steps once fitted to the trained activations (the optimizer's 0.01
    # moves a step by about 1% per epoch)
    "hub-float30-steplr0.003": _widen30(float_epochs=30, step_lr=0.003),
    "hub-float30-steplr0.005": _widen30(float_epochs=30, step_lr=0.005),
    # ... and faster ones (the last aggregation's grid clips most of the logits' range
    # while its step grows at about 1% per epoch; trace_training --recipe shows it)
    "hub-float30-steplr0.02": _widen30(float_epochs=30, step_lr=0.02),
    "hub-float30-steplr0.05": _widen30(float_epochs=30, step_lr=0.05),
    # ... distilled from a float32 teacher (the same model and seed trained without
    # rounding, its logits at the best validation epoch), over every node
    "hub-float30-kd1-T1": _widen30(float_epochs=30, distill=1.0),
    "hub-float30-kd0.5-T1": _widen30(float_epochs=30, distill=0.5),
    "hub-float30-kd1-T2": _widen30(float_epochs=30, distill=1.0, temperature=2.0),
    "hub-float30-kd0.5-T2": _widen30(float_epochs=30, distill=0.5, temperature=2.0),
    "hub-droprefit1": ("hub-messages", {"anneal_refit_epochs": 1}),
    "hub-droprefit5": ("hub-messages", {"anneal_refit_epochs": 5}),
    # learned widths held within the budget by projection
    "budget": ("budget-bits", {}),
    "budget-degree": ("budget-bits", {"init": "degree"}),
    "budget-layer": ("budget-bits", {"shared_bits": "layer"}),
    "budget-lr0.01": ("budget-bits", {"bits_lr": 0.01}),
    "budget-lr0.2": ("budget-bits", {"bits_lr": 0.2}),
    "budget-noanneal": ("budget-bits", {"anneal_every": 0}),
    "budget-max8": ("budget-bits", {"max_bits": 8}),
    # ... trained in float32 first, as the hub-messages leader
    "budget-degree-float30": ("budget-bits", {"init": "degree", "refit_epochs": 30,
                                              "refit_widen": True, "float_epochs": 30}),
}


def trial(name: str, dataset: str, seed: int, epochs: int) -> dict[str, Any]:
    """Train one candidate on one dataset and seed; the row recorded for it."""
    torch.set_num_threads(1)
    recipe_name, settings = CANDIDATES[name]
    data, num_classes = training.load_data(dataset, None, "select_bits")
    recipe = fxquant.recipes.get(recipe_name, target_bits=TARGET, input_format=None, **settings)
    # a distilling candidate's teacher first, as bits_pareto.py trains its FP32 runs first:
    # the rounded run then draws the same dropout masks as there
    start = time.process_time()
    teacher = training.teacher_logits("gcn", data, num_classes, seed, epochs) \
        if recipe.training().get("distill") else None
    teacher_s = time.process_time() - start
    torch.manual_seed(seed)
    model = training.make_model("gcn", data.num_features, num_classes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = recipe.prepare(model, data, lint="off")
        if teacher is not None:
            run.set_teacher(teacher)
        start = time.process_time()
        result = training.fit(run.model, data, epochs, run=run, progress=False)
    best = run.best
    assert result.bits is not None and best is not None
    return {"candidate": name, "recipe": recipe_name, "settings": settings,
            "target_bits": TARGET, "dataset": dataset, "seed": seed, "epochs": epochs,
            "val": best.val, "avg_bits": result.bits.avg_bits,
            "budget_met": bool(result.within_budget), "epoch": best.epoch,
            "test": result.test, "cpu_s": round(time.process_time() - start, 1),
            "torch": torch.__version__, "cpu": _cpu_name(),
            **({"teacher_cpu_s": round(teacher_s, 1)} if teacher is not None else {})}


def _cpu_name() -> str:
    """The processor's model name (trials from other machines differ in the last digits)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), platform.processor())
    except OSError:
        return platform.processor()


def _run_one(job: tuple[str, str, int, int, str]) -> str:
    name, dataset, seed, epochs, path = job
    try:
        row = trial(name, dataset, seed, epochs)
    except SystemExit as e:  # (a dataset that cannot load) would stall the pool
        raise RuntimeError(f"{name} on {dataset}, seed {seed}: {e}") from None
    line = json.dumps(row)
    with open(path, "a") as f:
        f.write(line + "\n")
    return line


def load(path: str | Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def summarize(rows: list[dict[str, Any]], score_seeds: tuple[int, ...] = SCORE_SEEDS
              ) -> list[dict[str, Any]]:
    """Per candidate: per-dataset mean validation accuracy over the scoring seeds both
    datasets ran, whether every trial met the budget, the joint mean (the selection
    score), whether it ran every scoring seed (``eligible``, with the budget met), and the
    means over every seed both datasets ran (``val_all``, not used in the choice)."""
    out = []
    for name in dict.fromkeys(r["candidate"] for r in rows):
        mine = [r for r in rows if r["candidate"] == name]
        ran = set.intersection(*({r["seed"] for r in mine if r["dataset"] == d}
                                 for d in DATASETS))
        seeds = ran & set(score_seeds)
        if not seeds:
            continue
        used = [r for r in mine if r["seed"] in seeds]
        per = {d: [r for r in used if r["dataset"] == d] for d in DATASETS}
        val = {d: statistics.mean(r["val"] for r in per[d]) for d in DATASETS}
        every = [r for r in mine if r["seed"] in ran]
        budget_met = all(r["budget_met"] for r in every)
        out.append({
            "candidate": name, "recipe": mine[0]["recipe"], "settings": mine[0]["settings"],
            "seeds": sorted(seeds), "val": val, "score": statistics.mean(val.values()),
            "budget_met": budget_met,
            "eligible": budget_met and seeds == set(score_seeds),
            "max_bits_seen": max(r["avg_bits"] for r in every),
            "test": {d: statistics.mean(r["test"] for r in per[d]) for d in DATASETS},
            "seeds_all": sorted(ran),
            "val_all": {d: statistics.mean(r["val"] for r in every if r["dataset"] == d)
                        for d in DATASETS},
        })
    return sorted(out, key=lambda s: (not s["eligible"], not s["budget_met"], -s["score"]))


def report(rows: list[dict[str, Any]]) -> str:
    summary = summarize(rows)
    lines = ["| candidate | recipe settings | seeds | val Cora | val CiteSeer | score (val) "
             "| every seed within budget | max avg_bits | (test Cora / CiteSeer, not used) "
             "| (val Cora / CiteSeer over every seed run, not used) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in summary:
        extra = "-" if s["seeds_all"] == s["seeds"] else (
            f"{100 * s['val_all']['Cora']:.1f} / {100 * s['val_all']['CiteSeer']:.1f} "
            f"(seeds {','.join(map(str, s['seeds_all']))})")
        lines.append(f"| {s['candidate']} | {s['recipe']} {s['settings'] or ''} | "
                     f"{','.join(map(str, s['seeds']))} | {100 * s['val']['Cora']:.1f} | "
                     f"{100 * s['val']['CiteSeer']:.1f} | {100 * s['score']:.2f} | "
                     f"{'yes' if s['budget_met'] else 'no'} | {s['max_bits_seen']:.3f} | "
                     f"{100 * s['test']['Cora']:.1f} / {100 * s['test']['CiteSeer']:.1f} | "
                     f"{extra} |")
    chosen = next((s for s in summary if s["eligible"]), None)
    lines.append("")
    lines.append(f"chosen: {chosen['candidate'] if chosen else 'none'}")
    return "\n".join(lines)


def merge(payloads: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``bits_pareto.py`` JSON from runs over consecutive seed ranges of one command
    (``--first-seed``): each seed's runs depend on that seed alone, so the merge is what
    the command over all the seeds writes; per-seed lists are joined in seed order and the
    averages recomputed over the seeds."""
    ordered = sorted(payloads, key=lambda p: p.get("first_seed", 0))
    first = ordered[0]
    fixed = ("dataset", "model", "epochs", "select", "signed_grid", "shared_step")
    for p in ordered[1:]:
        if any(p.get(k) != first.get(k) for k in fixed) or \
                [(r.get("method"), r["target_bits"]) for r in p["results"]] != \
                [(r.get("method"), r["target_bits"]) for r in first["results"]]:
            raise ValueError("merge: these JSON files come from different commands")
    start = first.get("first_seed", 0)
    for p in ordered:
        if p.get("first_seed", 0) != start:
            raise ValueError(f"merge: seeds must follow on; expected first_seed {start}, got "
                             f"{p.get('first_seed', 0)}")
        start += len(p["fp32_accs"])
    out = {k: v for k, v in first.items() if k not in ("results", "fp32_accs", "first_seed")}
    out["fp32_accs"] = [a for p in ordered for a in p["fp32_accs"]]
    if first.get("first_seed"):
        out["first_seed"] = first["first_seed"]
    out["merged_from"] = [{"first_seed": p.get("first_seed", 0), "seeds": len(p["fp32_accs"])}
                          for p in ordered]
    results = []
    for i, row in enumerate(first["results"]):
        rows = [p["results"][i] for p in ordered]
        counts = [len(r["accs"]) for r in rows]
        merged = dict(row)
        for key in ("accs", "fp32_accs", "budget_met", "avg_bits_per_seed"):
            if all(key in r for r in rows):
                merged[key] = [v for r in rows for v in r[key]]
        for key in ("avg_bits", "input_bits", "avg_bits_with_input"):
            merged[key] = sum(r[key] * n for r, n in zip(rows, counts, strict=True)) / sum(counts)
        results.append(merged)
    out["results"] = results
    return out


def _check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors (exit 2, naming the flag) before any work: flags the mode would ignore,
    values that would fail later (in a worker, where a failure stalls the pool). Turns the
    training lists into checked lists and ``--epochs`` into its default when training."""
    defaults = p.parse_args([])
    training_flags = ("candidates", "datasets", "seeds", "jobs")
    if args.merge or args.report:
        mode = "--merge" if args.merge else "--report"
        given = [f"--{n}" for n in (*training_flags, *(["epochs"] if args.merge else []))
                 if getattr(args, n) != getattr(defaults, n)]
        if given:
            p.error(f"{', '.join(given)}: {mode} trains nothing, so these would be ignored; "
                    "please drop them")
    if args.merge and args.report:
        p.error("--merge and --report are two commands (--report reads --trials); please run "
                "them one after the other")
    if args.merge and args.trials != defaults.trials:
        p.error("--trials is read by --report and written by training; --merge joins "
                "bits_pareto.py JSON files, so it would be ignored: please drop it")
    if args.merge and not args.json:
        p.error("--merge writes to --json PATH; please give it")
    if args.json and not (args.merge or args.report):
        p.error("--json is written by --merge or --report; training appends to --trials")
    cli.refuse_unwritable(p, args, "--json")
    if args.report and not os.path.isfile(args.trials):
        p.error(f"--trials {args.trials}: no such file to report")
    if args.report:
        try:
            trials = load(args.trials)
            if not all(isinstance(r, dict) and {"candidate", "epochs"} <= r.keys()
                       for r in trials):
                raise ValueError("lines without 'candidate' and 'epochs'")
        except (OSError, ValueError) as e:  # (json.JSONDecodeError is a ValueError)
            p.error(f"--trials {args.trials}: not the JSON lines training writes ({e})")
    if args.merge or args.report:
        return
    args.candidates = [n.strip() for n in args.candidates.split(",") if n.strip()]
    unknown = [n for n in args.candidates if n not in CANDIDATES]
    if unknown or not args.candidates:
        p.error(f"--candidates: unknown candidates {unknown}; known: {list(CANDIDATES)}")
    canonical = {d.lower(): d for d in DATASETS}
    names = [d.strip() for d in args.datasets.split(",") if d.strip()]
    if not names or any(d.lower() not in canonical for d in names):
        p.error(f"--datasets {args.datasets!r}: the choice is made on {list(DATASETS)}; "
                "please name those")
    args.datasets = [canonical[d.lower()] for d in names]
    for flag, values in (("--candidates", args.candidates), ("--datasets", args.datasets)):
        if len(set(values)) < len(values):  # (each trial would run again)
            p.error(f"{flag}: {sorted({v for v in values if values.count(v) > 1})} given twice")
    text = args.seeds
    try:
        args.seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        args.seeds = []
    if not args.seeds or min(args.seeds) < 0 or len(set(args.seeds)) < len(args.seeds):
        p.error(f"--seeds: expected a comma list of distinct seeds (0 or more), got {text!r}")
    if args.epochs is None:
        args.epochs = 200
    for flag in ("epochs", "jobs"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} must be at least 1")
    cli.refuse_unwritable(p, args, "--trials")


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--candidates", default=",".join(CANDIDATES))
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--epochs", type=int, default=None,
                   help="epochs per trial (default 200); with --report: which trials to "
                        "report where the file holds several")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--trials", default=str(TRIALS))
    p.add_argument("--report", action="store_true", help="no training: the table and choice")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="no training: join bits_pareto.py JSON files over consecutive seed "
                        "ranges (--first-seed) into --json")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="where --merge writes, or --report its summary and choice")
    args = p.parse_args(argv)
    _check(p, args)
    if args.merge:
        payloads = []
        for path in args.merge:
            try:
                with open(path) as f:
                    payloads.append(json.load(f))
            except (OSError, ValueError) as e:
                p.error(f"--merge {path}: cannot read it as JSON ({e})")
        try:
            merged = merge(payloads)
        except (KeyError, TypeError, ValueError) as e:
            p.error(f"--merge: these files do not join into one run ({e})")
        with open(args.json, "w") as f:
            json.dump(merged, f, indent=1)
        return args.json
    if args.report:
        rows = load(args.trials)
        epochs = sorted({r["epochs"] for r in rows})
        if args.epochs is None and len(epochs) > 1:
            p.error(f"--trials {args.trials} holds trials of {epochs} epochs, which are not "
                    "compared; please give --epochs to report one of them")
        if args.epochs is not None:
            rows = [r for r in rows if r["epochs"] == args.epochs]
            if not rows:
                p.error(f"--epochs {args.epochs}: no trial in {args.trials} ran that many "
                        f"(they ran {epochs})")
        text = report(rows)
        print(text)
        if args.json:  # the summary and the choice, beside the trials they come from
            summary = summarize(rows)
            chosen = next((s["candidate"] for s in summary if s["eligible"]), None)
            with open(args.json, "w") as f:
                json.dump({"target_bits": TARGET, "datasets": list(DATASETS),
                           "rule": "highest mean validation accuracy over the datasets (of "
                                   "per-dataset means over the scoring seeds) among the "
                                   "candidates that ran every scoring seed on both datasets "
                                   "and whose every trial met the budget; test accuracy and "
                                   "trials on other seeds are recorded, never used",
                           "score_seeds": list(SCORE_SEEDS),
                           "trials": os.path.relpath(args.trials, ROOT),
                           "summary": summary, "chosen": chosen}, f, indent=1)
        return text
    names, datasets, seeds = args.candidates, args.datasets, args.seeds  # checked lists
    for dataset in datasets:  # a clear message here, not a failure in a worker
        training.load_data(dataset, None, "select_bits")
    done = {(r["candidate"], r["dataset"], r["seed"], r["epochs"])
            for r in (load(args.trials) if os.path.exists(args.trials) else [])}
    jobs = [(n, d, s, args.epochs, args.trials) for s in seeds for d in datasets for n in names
            if (n, d, s, args.epochs) not in done]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(args.jobs, maxtasksperchild=1) as pool:
        for line in pool.imap_unordered(_run_one, jobs):
            print(line, flush=True)
    return ""


if __name__ == "__main__":
    main()
