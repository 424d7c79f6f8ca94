"""Train the Kipf & Welling GCN on Cora in FP32 and with truncated layer outputs.

The model is PyG's ``examples/gcn.py`` as written there (row-normalized features, two
GCNConv layers with 16 hidden units, ReLU, dropout 0.5 on the input and hidden layer, Adam
with lr 0.01 and weight decay 5e-4 on the first layer, 200 epochs, test accuracy at the
best validation epoch); fxquant transforms it without touching its code.

Run (data: ``FXQUANT_DATA`` or ``--root`` pointing at a folder with ``Cora/raw/ind.cora.*``):

    python examples/train_cora.py                                # FP32 vs 16 bits, 5 seeds
    python examples/train_cora.py --sweep 32,16,12,10,9,8 --plot sweep.png --json sweep.json
    python examples/train_cora.py --bits 10 --rounding nearest --super-nodes 0.1:8
    python examples/train_cora.py --bits 16 --grad zero          # no straight-through gradient
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
import torch_geometric.transforms as T
from tabulate import tabulate
from torch_geometric.nn import GCNConv
from tqdm import tqdm

import fxquant
from fxquant.datasets import PLANETOID_NAMES, load_planetoid

ROUNDINGS = ("toward_zero", "nearest", "stochastic")


class GCN(torch.nn.Module):
    """PyG's examples/gcn.py model, unchanged."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden_channels, cached=True)
        self.conv2 = GCNConv(hidden_channels, out_channels, cached=True)

    def forward(self, x, edge_index, edge_weight=None):
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, edge_index, edge_weight).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv2(x, edge_index, edge_weight)
        return x


@dataclass
class Config:
    """One line of the results table."""

    name: str
    bits: int | None  # None: the untransformed FP32 model
    rounding: str = "-"
    grad: str = "ste"
    layers: list[str] | None = None
    super_nodes: tuple[float, int] | None = None
    accs: list[float] = field(default_factory=list)
    epoch_ms: list[float] = field(default_factory=list)

    def row(self) -> list[object]:
        mean = 100 * statistics.mean(self.accs)
        std = 100 * statistics.stdev(self.accs) if len(self.accs) > 1 else 0.0
        return [self.name, self.bits or 32, self.rounding, f"{mean:.1f} +- {std:.1f}",
                f"{statistics.median(self.epoch_ms):.1f}"]


def build(cfg: Config, data, num_classes: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = GCN(data.num_features, 16, num_classes)
    if cfg.bits is None:
        return model
    node_bits = None
    if cfg.super_nodes is not None:
        fraction, bits = cfg.super_nodes
        hubs = fxquant.top_degree_nodes(data.edge_index, fraction, data.num_nodes)
        layers = cfg.layers or ["conv1", "conv2"]
        node_bits = {layer: (hubs, bits) for layer in layers}
    return fxquant.transform(model, bits=cfg.bits, layers=cfg.layers, rounding=cfg.rounding,
                             grad=cfg.grad, node_bits=node_bits)


def train_one(model: torch.nn.Module, data, epochs: int, desc: str, device: torch.device):
    """PyG's gcn.py loop; returns (test accuracy at the best validation epoch, epoch times)."""
    model.to(device)
    optimizer = torch.optim.Adam([
        {"params": model.conv1.parameters(), "weight_decay": 5e-4},
        {"params": model.conv2.parameters(), "weight_decay": 0.0},
    ], lr=0.01)
    best_val = test_acc = 0.0
    times = []
    bar = tqdm(range(epochs), desc=desc, leave=False, file=sys.stderr, dynamic_ncols=True)
    for _ in bar:
        start = time.perf_counter()
        model.train()
        optimizer.zero_grad()
        out = model(data.x, data.edge_index)
        F.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - start))
        model.eval()
        with torch.no_grad():
            pred = model(data.x, data.edge_index).argmax(dim=-1)
        val = (pred[data.val_mask] == data.y[data.val_mask]).float().mean().item()
        if val > best_val:
            best_val = val
            test_acc = (pred[data.test_mask] == data.y[data.test_mask]).float().mean().item()
        bar.set_postfix(val=f"{val:.3f}", test=f"{test_acc:.3f}")
    return test_acc, times


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bits", type=int, default=16, help="kept bits of each float32 (default 16)")
    p.add_argument("--layers", type=_names, default=None,
                   help="comma-separated layers to truncate after (default: both convs)")
    p.add_argument("--rounding", default=None, choices=[*ROUNDINGS, "all"],
                   help="rounding mode or 'all' (default: toward_zero; all in a sweep)")
    p.add_argument("--grad", default="ste", choices=["ste", "zero"],
                   help="ste: straight-through gradient; zero: the true (zero) derivative")
    p.add_argument("--seeds", type=int, default=5, help="seeds per configuration (default 5)")
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dataset", default="Cora", choices=list(PLANETOID_NAMES))
    p.add_argument("--root", default=None, help="data folder (default: $FXQUANT_DATA)")
    p.add_argument("--super-nodes", type=_super_nodes, default=None, metavar="FRACTION:BITS",
                   help="the top in-degree FRACTION of nodes keeps BITS instead")
    p.add_argument("--sweep", type=_bit_list, default=None, metavar="32,16,...",
                   help="train at each of these bit widths (with every rounding unless given)")
    p.add_argument("--plot", default=None, metavar="PNG", help="with --sweep: accuracy vs bits")
    p.add_argument("--json", default=None, metavar="PATH", help="write all results as JSON")
    args = p.parse_args(argv)
    if args.seeds < 1 or args.epochs < 1:
        p.error("--seeds and --epochs must be >= 1")
    if args.plot and not args.sweep:
        p.error("--plot needs --sweep")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available here")
    return args


def _names(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def _bit_list(text: str) -> list[int]:
    try:
        bits = [int(b) for b in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
    if not all(1 <= b <= 32 for b in bits):
        raise argparse.ArgumentTypeError(f"bit widths must be in 1..32, got {text!r}")
    return bits


def _super_nodes(text: str) -> tuple[float, int]:
    try:
        fraction, bits = text.split(":")
        parsed = float(fraction), int(bits)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FRACTION:BITS like 0.1:8, got {text!r}") from None
    if not (0 < parsed[0] <= 1 and 1 <= parsed[1] <= 32):
        raise argparse.ArgumentTypeError(f"need 0 < FRACTION <= 1 and 1 <= BITS <= 32, got {text!r}")
    return parsed


def configs_for(args: argparse.Namespace) -> list[Config]:
    common = {"grad": args.grad, "layers": args.layers, "super_nodes": args.super_nodes}
    if args.rounding == "all" or (args.rounding is None and args.sweep):
        roundings: tuple[str, ...] = ROUNDINGS
    else:
        roundings = (args.rounding or "toward_zero",)
    bit_widths = args.sweep or [args.bits]
    return [Config("FP32", None)] + [
        Config(f"top-{b}", b, r, **common) for r in roundings for b in bit_widths
    ]


def plot(configs: list[Config], path: str, dataset: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    fp32 = next(c for c in configs if c.bits is None)
    mean = 100 * statistics.mean(fp32.accs)
    ax.axhline(mean, color="black", linestyle="--", linewidth=1, label=f"FP32 ({mean:.1f}%)")
    for rounding in ROUNDINGS:
        rows = sorted((c for c in configs if c.rounding == rounding), key=lambda c: c.bits or 32)
        if not rows:
            continue
        xs = [c.bits for c in rows]
        ys = [100 * statistics.mean(c.accs) for c in rows]
        es = [100 * statistics.stdev(c.accs) if len(c.accs) > 1 else 0 for c in rows]
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=rounding)
    ax.set_xlabel("kept bits of each float32 (after both GCN layers)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"GCN on {dataset}: top-N bit truncation, {len(fp32.accs)} seeds")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main(argv: Sequence[str] | None = None) -> list[Config]:
    args = parse_args(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else "cpu" if args.device == "auto" else args.device)
    dataset = load_planetoid(args.dataset, args.root, transform=T.NormalizeFeatures())
    data = dataset[0].to(device)
    configs = configs_for(args)

    example = next(c for c in configs if c.bits is not None)
    gm = build(example, data, dataset.num_classes, seed=0)
    print(f"{args.dataset}: {data.num_nodes} nodes, {data.num_edges} edges, device {device}")
    print("\nTransformed graph:\n" + fxquant.summary(gm) + "\n")
    print("Lint of the transformed graph on the real data:\n"
          + str(fxquant.lint(gm, data.x, data.edge_index)) + "\n")

    for cfg in configs:
        for seed in range(args.seeds):
            model = build(cfg, data, dataset.num_classes, seed)
            desc = f"{cfg.name} {cfg.rounding} seed {seed}"
            acc, times = train_one(model, data, args.epochs, desc, device)
            cfg.accs.append(acc)
            cfg.epoch_ms.extend(times)

    headers = ["config", "bits", "rounding", "test acc (%)", "median epoch (ms)"]
    print(tabulate([c.row() for c in configs], headers=headers, tablefmt="github"))
    if args.sweep:
        for rounding in sorted({c.rounding for c in configs if c.bits is not None}):
            below = [c.bits for c in configs
                     if c.rounding == rounding and 100 * statistics.mean(c.accs) < 80.0]
            print(f"{rounding}: under 80% at bits {sorted(below, reverse=True) or 'none'}")
    if args.plot:
        plot(configs, args.plot, args.dataset)
        print(f"plot written to {args.plot}")
    if args.json:
        payload = {"args": {k: v for k, v in vars(args).items()}, "device": str(device),
                   "torch": torch.__version__, "results": [asdict(c) for c in configs]}
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)
        print(f"results written to {args.json}")
    return configs


if __name__ == "__main__":
    main()
