"""Train PyG's GCN on Cora in FP32 and with the top 16 bits of each float32 kept after both
layers, 5 seeds each, and print the paired difference (about 2.5 minutes on 2 CPU cores).

Data: ``FXQUANT_DATA``, a folder holding ``Cora/raw/ind.cora.*``. The GCN is PyG's
``examples/gcn.py``; fxquant rounds its layers' outputs without touching its code. Any flag
but --seeds and --epochs (--root, sweeps, formats, sites, --json, ...) runs the experiment
driver, ``python -m experiments.train_cora``, with the same arguments."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
import torch_geometric.transforms as T
from scipy import stats
from tabulate import tabulate
from torch_geometric.nn import GCNConv

import fxquant
from fxquant.datasets import load_planetoid
from fxquant.recipes import QuantTraining


class GCN(torch.nn.Module):
    def __init__(self, in_channels: int, hidden: int, out_channels: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = GCNConv(in_channels, hidden, cached=True), GCNConv(
            hidden, out_channels, cached=True)

    def forward(self, x, edge_index, edge_weight=None):
        x = self.conv1(F.dropout(x, 0.5, self.training), edge_index, edge_weight).relu()
        return self.conv2(F.dropout(x, 0.5, self.training), edge_index, edge_weight)


def build(data, classes: int, seed: int, bits: int | None) -> torch.nn.Module:
    torch.manual_seed(seed)  # FP32 and rounded runs of a seed: the same initial weights
    model = GCN(data.num_features, 16, classes).to(data.x.device)
    return model if bits is None else fxquant.transform(model, bits=bits)


def train(model, data, epochs: int) -> tuple[float, list[float]]:  # PyG's gcn.py loop
    run = QuantTraining(model)
    decayed = list(model.conv1.parameters())  # gcn.py: weight decay on the first layer
    groups = [{"params": decayed, "weight_decay": 5e-4}, {"params": [
        p for p in model.parameters() if all(p is not q for q in decayed)], "weight_decay": 0.0}]
    optimizer, times = torch.optim.Adam(run.param_groups(groups), lr=0.01), []
    for epoch in range(epochs):
        start = time.perf_counter()
        model.train()
        run.start_epoch(epoch)
        optimizer.zero_grad()
        out = model(data.x, data.edge_index)
        run.loss(F.cross_entropy(out[data.train_mask], data.y[data.train_mask]),
                 output=out).backward()
        optimizer.step()
        if data.x.is_cuda:
            torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - start))
        model.eval()
        with torch.no_grad():
            pred = model(data.x, data.edge_index).argmax(dim=-1)
        accs = [float((pred[m] == data.y[m]).float().mean()) for m in (data.val_mask, data.test_mask)]
        run.observe(accs[0], test=accs[1])
    return (run.best.metrics["test"] if run.best else 0.0), times  # (best validation epoch)


def paired(a: list[float], b: list[float]) -> str:  # a - b in points, its 95% t interval
    diffs, n = [100 * (x - y) for x, y in zip(a, b, strict=True)], len(a)
    mean, half = statistics.mean(diffs), 0.0 if n < 2 else \
        stats.t.ppf(0.975, n - 1) * statistics.stdev(diffs) / n**0.5
    return f"{mean:+.1f} [{mean - half:+.1f}, {mean + half:+.1f}]" if n > 1 else "-"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--seeds", type=int, default=5, help="seeds per configuration (default 5)")
    p.add_argument("--epochs", type=int, default=200, help="(default 200)")
    args, other = p.parse_known_args(argv)
    if other:  # the experiment driver's flags: run it (the package beside this folder)
        os.environ["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")])
        sys.exit(subprocess.call([sys.executable, "-m", "experiments.train_cora",
                                  *(sys.argv[1:] if argv is None else argv)]))
    if min(args.seeds, args.epochs) < 1:
        p.error("--seeds and --epochs must be >= 1")
    try:
        dataset = load_planetoid("Cora", transform=T.NormalizeFeatures(), download=False)
    except (FileNotFoundError, ValueError) as e:
        p.error(f"FXQUANT_DATA (or --root DIR): {e}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data, classes = dataset[0].to(device), dataset.num_classes
    gm = build(data, classes, 0, bits=16)
    print(f"Cora: {data.num_nodes} nodes, {data.num_edges} edges, device {device}, model gcn"
          f"\n\nTransformed graph (top-16):\n{fxquant.summary(gm, data.x, data.edge_index)}\n\n"
          f"Lint of the transformed graph on the real data:\n"
          f"{fxquant.lint(gm, data.x, data.edge_index)}\n")
    rows, fp32 = [], []
    for name, bits in (("FP32", None), ("top-16", 16)):
        accs, times = [], []
        for seed in range(args.seeds):
            acc, ms = train(build(data, classes, seed, bits), data, args.epochs)
            print(f"{name} seed {seed}: test {100 * acc:.1f}%", file=sys.stderr)
            accs, times, fp32 = [*accs, acc], times + ms, fp32 if bits else [*fp32, acc]
        std = 100 * statistics.stdev(accs) if len(accs) > 1 else 0.0
        cols = ["toward_zero", "-", "output", "-", "ste"] if bits else ["-"] * 5
        rows.append([name, bits or 32, *cols, f"{100 * statistics.mean(accs):.1f} +- {std:.1f}",
                     paired(accs, fp32) if bits else "-", f"{statistics.median(times):.1f}"])
    print(tabulate(rows, headers=["config", "bits", "rounding", "scale", "sites", "protect",
                                  "grad", "test acc (%)", "vs FP32 (pt, 95% CI)",
                                  "median epoch (ms)"], tablefmt="github"))


if __name__ == "__main__":
    main()
