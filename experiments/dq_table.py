"""Everything quantized (inputs, weights, messages, aggregation, outputs): the Degree-Quant
table on unmodified PyG models, next to FP8 and the OCP MX FP4 formats.

Rows: FP32 | INT8 | INT8 + protection | INT8 asymmetric with a percentile range | INT4 |
INT4 + protection | INT4 LSQ + protection (and, when ``--only`` names them, INT8
``int8-lsq-p`` and ``int4-lsq-pe``: INT4 with the layers' per-edge arguments rounded too,
on an unsigned grid, e.g. GAT's attention coefficients; not for GIN, which has none;
``int4-lsq-ps``: INT4 LSQ + protection with the messages rounded stochastically) | INT8
and INT4 Degree-Quant as its reference code runs it (``int8-dq``, ``int4-dq``:
``fxquant.recipes.DegreeQuant``) | INT4 with a per-row scale | E4M3 | MXFP4 (E2M1,
block-32 E8M0 scale) | E2M1 with a per-row scale. Integer rows use a per-tensor scale from the
current batch's min/max (LSQ: a learned step; ``int8-pct``: the 0.1th-99.9th percentile)
as Degree-Quant does, except "per-row" (one float32 scale per row: per node, per edge for
messages, per output channel for weights); protection is Degree-Quant's (``--protect``).
Seeds are paired: every row of one seed starts from the same initial weights, and the
table reports each row's mean difference to FP32 with its 95% interval.

Run (data: ``FXQUANT_DATA`` or ``--root``):

    python -m experiments.dq_table --dataset Cora --model gcn --seeds 10 \\
        --json docs/results/dq_cora_gcn.json
    python -m experiments.dq_table --from-json docs/results/dq_cora_gcn.json    # table only
    python -m experiments.dq_table --dataset Cora --model gcn --seeds 5 --first-seed 10 \\
        --json more.json                                                # more seeds
    python -m experiments.dq_table --from-json docs/results/dq_cora_gcn.json more.json \\
        --json docs/results/dq_cora_gcn.json                            # merged
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict

import torch

import fxquant
from experiments import cli, train_cora, training
from experiments.stats import paired
from experiments.train_cora import SITES, Config
from fxquant.datasets import PLANETOID_NAMES

#: Degree-Quant's protection probabilities ``(p_min, p_max)`` unless ``--protect`` says
DEFAULT_PROTECT = (0.0, 0.2)


def rows(protect: tuple[float, float]) -> dict[str, Config]:
    """The table's configurations by short key, FP32 first."""
    every = list(SITES)
    return {
        "fp32": Config("FP32", None),
        "int8": Config("INT8", "int8", scale="tensor", sites=every),
        "int8-p": Config("INT8 + protection", "int8", scale="tensor", sites=every,
                         protect=protect),
        "int8-pct": Config("INT8 asymmetric, percentile 99.9", "int8:asym", scale="tensor",
                           range="percentile:99.9", sites=every),
        "int4": Config("INT4", "int4", scale="tensor", sites=every),
        "int4-p": Config("INT4 + protection", "int4", scale="tensor", sites=every,
                         protect=protect),
        "int4-lsq-p": Config("INT4 LSQ + protection", "int4", scale="tensor", range="lsq",
                             sites=every, protect=protect),
        "int8-lsq-p": Config("INT8 LSQ + protection", "int8", scale="tensor", range="lsq",
                             sites=every, protect=protect),
        "int4-lsq-ps": Config("INT4 LSQ + protection, messages rounded stochastically",
                              "int4", scale="tensor", range="lsq", sites=every,
                              protect=protect, message_rounding="stochastic"),
        "int4-lsq-pe": Config("INT4 LSQ + protection, edge site too (uint4)", "int4",
                              scale="tensor", range="lsq", sites=[*every, "edge"],
                              protect=protect, edge_number="uint4"),
        "int4-pct-p": Config("INT4 percentile 99.9 + protection", "int4", scale="tensor",
                             range="percentile:99.9", momentum=0.01, sites=every,
                             protect=protect),
        "int8-dq": _degree_quant(8, protect),
        "int4-dq": _degree_quant(4, protect),
        "int4-row": Config("INT4, per-row scale", "int4", scale="row", sites=every),
        "e4m3": Config("E4M3", "e4m3", scale="tensor", sites=every),
        "mxfp4": Config("MXFP4 (E2M1, block-32)", "e2m1", scale="block32", sites=every),
        "e2m1-row": Config("E2M1, per-row scale", "e2m1", scale="row", sites=every),
    }


#: rows that run only when ``--only`` names them (the default table keeps its rows)
NAMED_ONLY = frozenset({"int8-lsq-p", "int4-lsq-pe", "int4-lsq-ps"})


def selected(only: str | None, protect: tuple[float, float]) -> dict[str, Config]:
    """The rows a run trains: FP32 and those ``--only`` names, or every row but
    :data:`NAMED_ONLY`."""
    table_rows = rows(protect)
    wanted = set(table_rows) - NAMED_ONLY if not only \
        else {"fp32", *(k.strip() for k in only.split(","))}
    return {k: c for k, c in table_rows.items() if k in wanted}


def _degree_quant(bits: int, protect: tuple[float, float]) -> Config:
    """Degree-Quant as its reference code runs it (``fxquant.recipes.DegreeQuant``)."""
    return Config(f"INT{bits} Degree-Quant (GC-PER)", f"int{bits}:asym", scale="tensor",
                  range="percentile:99.9", grad="clipped",
                  sites=["input", "weight", "linear", "edge", "message", "aggregate", "output"],
                  protect=protect, recipe=("degree-quant", {"bits": bits, "protect": protect}))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--dataset", default="Cora", choices=list(PLANETOID_NAMES))
    p.add_argument("--model", default="gcn", choices=list(training.MODELS),
                   help="gcn, gin, gat (8 heads of one channel) or gat64 (8 heads of 8 "
                        "channels); see experiments/training.py")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--protect", type=cli.protect_arg, default=None,
                   metavar="P_MIN:P_MAX", help="Degree-Quant protection (default 0:0.2)")
    p.add_argument("--only", default=None,
                   help="comma list of row keys to run (FP32 always): " + ",".join(rows((0, 0))))
    p.add_argument("--lsq-refit", type=cli.epochs_arg, default=0, metavar="N",
                   help="fit the LSQ rows' steps again on each of the first N epochs "
                        "(fxquant.refit_steps; default: on the first only)")
    p.add_argument("--float-epochs", type=cli.epochs_arg, default=0, metavar="N",
                   help="train the quantized rows' first N epochs in float32 (evaluation "
                        "still rounds), then fit their learned steps (fxquant.recipes."
                        "QuantTraining float_epochs; default 0)")
    p.add_argument("--eval-rng", default="shared", choices=list(training.EVAL_RNG),
                   help="fork: evaluate under torch.random.fork_rng, so that what evaluation "
                        "draws (stochastic rounding) leaves training's dropout masks as the "
                        "FP32 run of the same seed draws them; shared (default): evaluation "
                        "advances the generator training draws from")
    p.add_argument("--root", default=None)
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--from-json", nargs="+", default=None, metavar="PATH",
                   help="no training: the table from earlier --json files of one model and "
                        "dataset, merged by row and seed (later files win); with --json, "
                        "the merged file is written")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="with --from-json: bars of each row's difference to FP32 per file")
    args = p.parse_args(argv)
    cli.refuse_counts(p, args, "epochs")
    cli.refuse_seeds(p, args)
    if args.plot and not args.from_json:
        p.error("--plot draws earlier results: please pass --from-json FILE ... with it")
    if args.plot and args.json:
        p.error("--json writes the merged table of --from-json files; with --plot each file "
                "is drawn on its own and nothing is merged, so it would be ignored: please "
                "run them as two commands")
    if args.from_json:
        cli.refuse_training_flags(p, args, writes_json=True)
        cli.refuse_results_files(p, args.from_json, ("name", "accs"), "dq_table.py",
                                      payload_fields=("model", "dataset"))
        if not args.plot:  # (rows whose seeds would not pair)
            try:
                merge(args.from_json)
            except SystemExit as e:
                p.error(f"--from-json: {str(e.code).removeprefix('dq_table.py: ')}")
    keys = rows((0.0, 0.0))
    if args.only is not None:
        wanted = [k.strip() for k in args.only.split(",") if k.strip()]
        unknown = sorted(set(wanted) - set(keys))
        if unknown or not wanted:
            p.error(f"--only: unknown row keys {unknown}; keys: {list(keys)}")
        # the edge site needs per-edge arguments, which GIN lacks (a recipe row, such as
        # Degree-Quant's, places its own sites)
        edge = sorted(k for k in set(wanted) if "edge" in keys[k].sites and keys[k].recipe is None)
        if edge and args.model == "gin":
            p.error(f"--only {','.join(edge)} with --model gin: these rows round the layers' "
                    "per-edge arguments, and GINConv's messages take none; please drop them")
        if args.float_epochs and all(k == "fp32" for k in wanted):
            p.error("--float-epochs trains the quantized rows' first epochs in float32; "
                    "--only holds none, so it would be ignored")
        if args.lsq_refit and not any(keys[k].range == "lsq" for k in wanted):
            p.error("--lsq-refit refits learned steps; none of the --only rows has one, so it "
                    "would be ignored")
        if args.protect is not None and not any(keys[k].protect is not None for k in wanted):
            p.error("--protect sets Degree-Quant's protection; none of the --only rows "
                    "protects nodes, so it would be ignored")
    cli.refuse_idle_eval_rng(p, args.eval_rng, list(selected(args.only, (0.0, 0.0)).values()),
                                  " (rows that do, such as int4-lsq-ps, run when --only names "
                                  "them)")
    cli.refuse_unwritable(p, args, "--json", "--plot")
    if not args.from_json:
        cli.refuse_float_epochs_past_training(p, args)
    if args.protect is None:
        args.protect = DEFAULT_PROTECT
    return args


def table(configs: list[Config], title: str) -> str:
    fp32 = configs[0]
    lines = [f"{title}: test accuracy (%) over {len(fp32.accs)} paired seeds", "",
             "| configuration | test acc (%) | vs FP32 (pt, 95% CI) | median epoch (ms) |",
             "| --- | --- | --- | --- |"]
    for c in configs:
        row = c.row()
        difference = paired(c.accs, fp32.accs) if c is not fp32 else None
        lines.append(f"| {c.name} | {row[-2]} | {difference or '-'} | {row[-1]} |")
    return "\n".join(lines)


def plot(payloads: list[dict], path: str) -> None:
    """One group of bars per configuration: its paired difference to FP32 (95% CI), one bar
    per file (model x dataset)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["name"] for r in payloads[0]["results"][1:]]
    fig, ax = plt.subplots(figsize=(11, 4.2))
    width = 0.8 / len(payloads)
    for i, payload in enumerate(payloads):
        fp32 = payload["results"][0]["accs"]
        means, errs = [], []
        for name in names:
            row = next((r for r in payload["results"] if r["name"] == name), None)
            if row is None:
                means.append(float("nan"))
                errs.append(0.0)
                continue
            difference = paired(row["accs"], fp32)
            if difference is None:  # (one seed: its difference, no interval)
                means.append(100 * (row["accs"][0] - fp32[0]))
                errs.append(0.0)
                continue
            means.append(difference.mean)
            errs.append(difference.half_width)
        xs = [j + i * width for j in range(len(names))]
        ax.bar(xs, means, width, yerr=errs, capsize=2,
               label=f"{payload['model']} on {payload['dataset']} ({len(fp32)} seeds)")
    ax.axhline(0, color="gray", lw=0.8)
    ax.set_xticks([j + width * (len(payloads) - 1) / 2 for j in range(len(names))])
    ax.set_xticklabels(names, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("test accuracy - FP32 (points)")
    ax.set_ylim(bottom=max(ax.get_ylim()[0], -50))
    ax.set_title("Everything quantized (inputs, weights, messages, aggregation, outputs)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _seeds(payload: dict, result: dict) -> list[int]:
    if "seeds" in result:
        return list(result["seeds"])
    first = payload.get("args", {}).get("first_seed", 0)
    return list(range(first, first + len(result["accs"])))


def merge(paths: Sequence[str]) -> tuple[list[Config], dict]:
    """Rows of several ``--json`` files of one model and dataset, by row and seed; where two
    files ran the same row with the same seed, the later file wins (a row re-run after a
    fix replaces the old one). Returns the rows and the merged payload."""
    by_name: dict[str, dict[int, tuple[float, list[float], float | None]]] = {}
    meta: dict[str, dict] = {}
    payload: dict = {}
    for path in paths:
        with open(path) as f:
            payload_i = json.load(f)
        if payload and (payload_i["model"], payload_i["dataset"]) != \
                (payload["model"], payload["dataset"]):
            raise SystemExit(f"dq_table.py: {path} is {payload_i['model']} on "
                             f"{payload_i['dataset']}, not {payload['model']} on "
                             f"{payload['dataset']}: merge one model and dataset at a time")
        payload = payload or payload_i
        epochs = payload_i.get("args", {}).get("epochs", 0)
        for r in payload_i["results"]:
            seeds = _seeds(payload_i, r)
            per_seed = by_name.setdefault(r["name"], {})
            meta.setdefault(r["name"], r)
            for i, seed in enumerate(seeds):
                times = r["epoch_ms"][i * epochs:(i + 1) * epochs] if epochs else []
                vals = r.get("vals") or []  # (files written before vals were recorded)
                per_seed[seed] = (r["accs"][i], times, vals[i] if i < len(vals) else None)
    fp32_seeds = sorted(next(iter(by_name.values())))
    configs, results = [], []
    for name, per_seed in by_name.items():
        seeds = sorted(per_seed)
        if seeds != fp32_seeds[:len(seeds)]:
            raise SystemExit(f"dq_table.py: row {name!r} has seeds {seeds}, not a prefix of "
                             f"FP32's {fp32_seeds}: its paired differences would mismatch")
        r = meta[name]
        c = Config(name, r["number"])
        c.accs = [per_seed[s][0] for s in seeds]
        c.epoch_ms = [t for s in seeds for t in per_seed[s][1]]
        vals = [v for s in seeds if (v := per_seed[s][2]) is not None]
        c.vals = vals if len(vals) == len(seeds) else []  # (none where a file lacks them)
        configs.append(c)
        results.append({**r, "accs": c.accs, "epoch_ms": c.epoch_ms, "vals": c.vals,
                        "seeds": seeds})
    merged = {**payload, "results": results}
    merged["args"] = {**payload.get("args", {}), "seeds": len(fp32_seeds),
                      "first_seed": fp32_seeds[0], "json": None, "from_json": list(paths)}
    return configs, merged


def main(argv: Sequence[str] | None = None) -> list[Config]:
    args = parse_args(argv)
    if args.from_json and args.plot:
        payloads = []
        for path in args.from_json:
            with open(path) as f:
                payloads.append(json.load(f))
        plot(payloads, args.plot)
        configs: list[Config] = []
        for path in args.from_json:  # one file per model x dataset: a table each
            configs, payload = merge([path])
            print(table(configs, f"{payload['model']} on {payload['dataset']}") + "\n")
        return configs
    if args.from_json:
        configs, payload = merge(args.from_json)
        print(table(configs, f"{payload['model']} on {payload['dataset']}"))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(payload, f, indent=1)
        return configs
    configs = list(selected(args.only, args.protect).values())
    data, num_classes = training.load_data(args.dataset, args.root, "dq_table.py")
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for cfg in configs:
            model = train_cora.build(cfg, data, num_classes, seed, args.model)
            run = fxquant.recipes.QuantTraining(model, refit_epochs=args.lsq_refit,
                                                float_epochs=args.float_epochs) \
                if isinstance(model, torch.fx.GraphModule) else None
            result = training.fit(model, data, args.epochs, run=run, desc=f"{cfg.name} seed {seed}",
                                  eval_rng=args.eval_rng)
            cfg.accs.append(result.test)
            cfg.vals.append(result.val)
            cfg.epoch_ms.extend(result.epoch_ms)
            print(f"seed {seed} {cfg.name}: {100 * result.test:.1f}", file=sys.stderr, flush=True)
    print(table(configs, f"{args.model} on {args.dataset}"))
    if args.json:
        payload = {"args": vars(args), "model": args.model, "dataset": args.dataset,
                   "torch": torch.__version__, "threads": torch.get_num_threads(),
                   "results": [{**asdict(c), "bits": c.bits} for c in configs]}
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)
    return configs


if __name__ == "__main__":
    main()
