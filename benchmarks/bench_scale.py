"""A million-node graph: full-batch and mini-batch training of a transformed GCN.

    python -m benchmarks.bench_scale                  # 1,000,000 nodes, 10,000,000 edges
    python -m benchmarks.bench_scale --quick --no-write   # a small smoke run (tests use it)

The graph has planted communities (each node's class is its community; 80% of the edges
stay inside one; features are the class's centroid plus noise), so a GCN trained on it
reaches a meaningful accuracy. Cases, each in a fresh process so its peak resident memory
is its own:

- full batch: one forward + backward of a 2-layer GCN (64 -> 16 -> 8 classes), plain and
  transformed (output truncation to 10 bits; int8 messages with a per-tensor running
  range), median of 3 steps after one warm-up; extra peak RSS over the graph and model
  already resident, and the transformed model's extra over the plain one in units of one
  activation (``nodes x 16`` float32) and one message tensor (``edges x 16`` float32). The
  target is one tensor of the site's own size per quantized site: conv1's (x 16) and
  conv2's (x 8), 1.5 units in all;
- mini-batch: ``NeighborLoader`` (10, 10 neighbours, 1,024 seed nodes per batch; needs
  torch-sparse or pyg-lib), seed nodes per second over 20 training batches, sampling
  included, plain and transformed in the same process, alternating.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F
from tabulate import tabulate
from torch import nn
from torch_geometric.nn import GCNConv

import fxquant
from benchmarks.common import machine, publish
from experiments.cli import refuse_counts, refuse_overridden
from experiments.graphs import planted_communities

CASES = ("plain", "output", "message")


class GCN(nn.Module):
    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = GCNConv(features, 16), GCNConv(16, classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def model_for(case: str, features: int, classes: int) -> nn.Module:
    torch.manual_seed(0)
    model = GCN(features, classes)
    if case == "plain":
        return model
    if case == "output":
        return fxquant.transform(model, bits=10, lint="off")
    mapping = fxquant.QuantMapping().set_global(
        fxquant.QuantConfig("int8", scale="tensor", decay=0.1), site="message")
    return fxquant.transform(model, mapping, lint="off")


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def full_batch_case(case: str, nodes: int, edges: int, features: int) -> dict[str, float]:
    """Run in its own process: median step time and extra peak RSS of fwd + bwd."""
    data = planted_communities(nodes, edges, features, 8)
    model = model_for(case, features, 8)
    base = _rss_bytes()
    times = []
    for i in range(4):
        start = time.perf_counter()
        out = model(data.x, data.edge_index)
        F.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
        if i:
            times.append(time.perf_counter() - start)
        del out
    return {"seconds": statistics.median(times), "extra_rss": _rss_bytes() - base}


def minibatch_rows(nodes: int, edges: int, features: int, batches: int) -> list[list[Any]]:
    try:
        import torch_sparse  # noqa: F401
        from torch_geometric.loader import NeighborLoader
    except ImportError:
        return [["mini-batch", "NeighborLoader needs torch-sparse or pyg-lib: "
                 "pip install --no-build-isolation torch-scatter torch-sparse", "", ""]]
    data = planted_communities(nodes, edges, features, 8)
    seeds = data.train_mask.nonzero().view(-1)
    rate: dict[str, list[float]] = {"plain": [], "message": []}
    models = {case: model_for(case, features, 8) for case in rate}
    for _ in range(2):  # alternate, so drift hits both alike
        for case, model in models.items():
            optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
            loader = NeighborLoader(data, num_neighbors=[10, 10], input_nodes=seeds,
                                    batch_size=1024, shuffle=True)
            count, start = 0, time.perf_counter()
            for i, batch in enumerate(loader):
                if i == batches:
                    break
                optimizer.zero_grad()
                kwargs = {} if case == "plain" else {"node_ids": batch.n_id}
                out = model(batch.x, batch.edge_index, **kwargs)[:batch.batch_size]
                F.cross_entropy(out, batch.y[:batch.batch_size]).backward()
                optimizer.step()
                count += batch.batch_size
            rate[case].append(count / (time.perf_counter() - start))
    plain, quant = statistics.median(rate["plain"]), statistics.median(rate["message"])
    return [["mini-batch plain", f"{plain:,.0f} seeds/s", "", ""],
            ["mini-batch int8 messages", f"{quant:,.0f} seeds/s", f"{quant / plain:.2f}x",
             ">= 0.9x"]]


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=1_000_000)
    p.add_argument("--edges", type=int, default=10_000_000)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="20,000 nodes, 100,000 edges")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)  # one case, in a child
    args = p.parse_args(argv)
    refuse_counts(p, args, "nodes", "edges", "features", "batches")
    if args.quick:
        refuse_overridden(p, args, "--quick", ("nodes", "edges", "batches"))
        args.nodes, args.edges, args.batches = 20_000, 100_000, 3
    if args.case:
        print(json.dumps(full_batch_case(args.case, args.nodes, args.edges, args.features)))
        return ""
    results = {}
    for case in CASES:
        done = subprocess.run([sys.executable, "-m", "benchmarks.bench_scale", "--case", case,
                               "--nodes", str(args.nodes), "--edges", str(args.edges),
                               "--features", str(args.features)],
                              capture_output=True, text=True, check=True)
        results[case] = json.loads(done.stdout.strip().splitlines()[-1])
    activation = args.nodes * 16 * 4
    message = args.edges * 16 * 4
    plain = results["plain"]
    rows = [["full batch plain", f"{plain['seconds']:.2f} s",
             f"{plain['extra_rss'] / 2**20:,.0f} MiB extra peak", ""]]
    for case, label, target in (("output", "output truncation (10 bits)", "<= 1.5 activations"),
                                ("message", "int8 messages (running range)",
                                 # one per site: conv1's edges x 16 and conv2's edges x 8
                                 "<= 1.5 message tensors")):
        r = results[case]
        extra = r["extra_rss"] - plain["extra_rss"]
        rows.append([f"full batch {label}", f"{r['seconds']:.2f} s "
                     f"({r['seconds'] / plain['seconds']:.2f}x, target <= 1.1x)",
                     f"{extra / 2**20:+,.0f} MiB = {extra / activation:.2f} activations = "
                     f"{extra / message:.2f} message tensors", target])
    rows += minibatch_rows(args.nodes, args.edges, args.features, args.batches)
    table = tabulate(rows, headers=["case", "time / throughput", "memory", "target"],
                     tablefmt="github")
    body = (f"## bench_scale\n\n`python -m benchmarks.bench_scale` on {machine()}; "
            f"{args.nodes:,} nodes, {args.edges:,} edges, {args.features} features, "
            "CPU only.\n\n" + table + "\n")
    return publish("bench_scale", body, write=not args.no_write)


if __name__ == "__main__":
    main()
