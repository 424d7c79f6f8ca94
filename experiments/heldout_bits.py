"""The recommended per-node bit-width recipe on graphs that played no part in choosing it.

    python -m experiments.heldout_bits --seeds 3 --jobs 2     # writes docs/results/
    python -m experiments.heldout_bits --quick --no-write    # a smoke run (tests)

Graphs from :func:`experiments.graphs.planted_communities` (2,000 nodes,
8,000 directed edges, 32 real-valued features, 6 classes) at three homophily levels
(``p_in``: the share of edges inside a community) and three degree skews (``skew``: 0 gives
about Poisson in-degrees, 0.5 a Cora-like tail, 1.0 a few hubs with hundreds of edges and
a third of the nodes with none). Each graph trains PyG's gcn.py GCN with
:func:`experiments.training.fit`, FP32 and with ``fxquant.recipes.get("recommended")`` at
2 bits, on the same seeds, with nothing tuned on these graphs: the raw input features stay
float32 (``input_format=None``, as the recipe's warning advises for real-valued features;
they are not counted in ``avg_bits`` either way). Test accuracy is at the epoch the recipe
reports (the best validation epoch within the budget).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import torch

import fxquant
from experiments import training
from experiments.cli import refuse_counts, refuse_overridden, refuse_unwritable
from experiments.graphs import planted_communities

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "bits_heldout.json"
#: (p_in, skew) of each graph
GRAPHS = [(0.9, 0.0), (0.7, 0.0), (0.5, 0.0), (0.9, 0.5), (0.7, 0.5), (0.5, 0.5), (0.7, 1.0)]
NODES, EDGES, FEATURES, CLASSES = 2000, 8000, 32, 6


def one(job: tuple[float, float, int, int, int, int, float]) -> dict[str, Any]:
    """FP32 and the recipe on one graph and seed."""
    p_in, skew, seed, nodes, edges, epochs, target = job
    torch.set_num_threads(1)
    data = planted_communities(nodes, edges, FEATURES, CLASSES, p_in=p_in, seed=100 + seed,
                               skew=skew)
    data.num_nodes = nodes
    row: dict[str, Any] = {"p_in": p_in, "skew": skew, "seed": seed, "target_bits": target,
                           "homophily": float((data.y[data.edge_index[0]]
                                               == data.y[data.edge_index[1]]).float().mean()),
                           "max_in_degree": int(torch.bincount(data.edge_index[1],
                                                               minlength=nodes).max())}
    torch.manual_seed(seed)
    start = time.perf_counter()
    fp32 = training.fit(training.make_model("gcn", FEATURES, CLASSES), data, epochs,
                        progress=False)
    row["fp32"] = fp32.test
    torch.manual_seed(seed)
    model = training.make_model("gcn", FEATURES, CLASSES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = fxquant.recipes.get("recommended", target_bits=target,
                                  input_format=None).prepare(model, data, lint="off")
        if run.distill:  # its teacher: the FP32 run of the same seed
            run.set_teacher(training.teacher_of(fp32, seed))
        result = training.fit(run.model, data, epochs, run=run, progress=False)
    assert result.bits is not None and run.best is not None
    row.update(hub_quantile=getattr(run.recipe, "hub_quantile", None),
               quant=result.test, val=run.best.val, avg_bits=result.bits.avg_bits,
               budget_met=bool(result.within_budget),
               seconds=round(time.perf_counter() - start, 1))
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| p_in | skew | homophily | max in-degree | FP32 test (%) | recommended test (%) "
             "| avg_bits (max) | every seed within budget | hub quantile used |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p_in, skew in dict.fromkeys((r["p_in"], r["skew"]) for r in rows):
        mine = [r for r in rows if (r["p_in"], r["skew"]) == (p_in, skew)]

        def stat(key: str, rows: list[dict[str, Any]] = mine) -> str:
            values = [100 * r[key] for r in rows]
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            return f"{statistics.mean(values):.1f} +- {sd:.1f}"

        lines.append(f"| {p_in:g} | {skew:g} | {statistics.mean(r['homophily'] for r in mine):.2f}"
                     f" | {max(r['max_in_degree'] for r in mine)} | {stat('fp32')} | "
                     f"{stat('quant')} | {max(r['avg_bits'] for r in mine):.3f} | "
                     f"{'yes' if all(r['budget_met'] for r in mine) else 'no'} | "
                     f"{', '.join(sorted({f'{q:g}' for r in mine if (q := r.get('hub_quantile'))}))}"
                     " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--target-bits", type=float, default=2.0)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="one small graph, 1 seed, 4 epochs")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--json", default=str(OUT))
    args = p.parse_args(argv)
    refuse_counts(p, args, "seeds", "epochs", "jobs")
    if not 0 < args.target_bits <= 32:  # (also nan)
        p.error(f"--target-bits must lie in (0, 32] (average bits per value), got "
                f"{args.target_bits}")
    if args.quick:
        refuse_overridden(p, args, "--quick", ("seeds", "epochs"))
    if args.no_write:
        refuse_overridden(p, args, "--no-write", ("json",), "nothing is written")
    else:
        refuse_unwritable(p, args, "--json")
    graphs, nodes, edges, seeds, epochs = GRAPHS, NODES, EDGES, args.seeds, args.epochs
    if args.quick:
        graphs, nodes, edges, seeds, epochs = [(0.7, 0.5)], 200, 800, 1, 4
    jobs = [(p_in, skew, seed, nodes, edges, epochs, args.target_bits)
            for p_in, skew in graphs for seed in range(seeds)]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.jobs > 1:
        with multiprocessing.get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
            rows = pool.map(one, jobs)
    else:
        rows = [one(job) for job in jobs]
    text = table(rows)
    print(text)
    if not args.no_write:
        payload = {"recipe": "recommended", "settings": dict(fxquant.recipes.RECOMMENDED[1]),
                   "nodes": nodes, "edges": edges,
                   "features": FEATURES, "classes": CLASSES, "epochs": epochs,
                   "torch": torch.__version__, "rows": rows}
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)
    return text


if __name__ == "__main__":
    main()
