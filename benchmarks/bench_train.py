"""What truncation costs in training: Kipf GCN on Cora, eager and compiled, plus pass times.

    python -m benchmarks.bench_train                  # writes benchmarks/RESULTS.md
    python -m benchmarks.bench_train --quick --no-write   # smoke run (tests use it)

Epoch time is one training step (forward, backward, Adam), the median over the epochs of a
run (the first epochs, which compile, do not move a median of 200); the four models take
turns within each seed and ratios are medians over seeds of per-seed ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any, cast

import torch
import torch_geometric.transforms as T
from tabulate import tabulate
from torch._inductor.utils import run_and_get_code
from torch_geometric.data import Data

import fxquant
from benchmarks.common import machine, publish
from experiments import training
from experiments.cli import refuse_counts, refuse_overridden
from experiments.training import GCN
from fxquant.datasets import load_planetoid


def median_ms(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def random_graph(num_nodes: int, num_edges: int, features: int) -> Data:
    g = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, num_nodes, (2, num_edges), generator=g)
    return Data(x=torch.randn(num_nodes, features, generator=g), edge_index=edge_index)


def fused_kernels(gm: torch.nn.Module, data: Data) -> tuple[list[str], bool]:
    """Inductor's kernel names for the eval forward, and whether the op stayed opaque."""
    compiled = torch.compile(gm.eval(), fullgraph=True)
    with torch.no_grad():
        _, codes = run_and_get_code(compiled, data.x, data.edge_index)
    code = "\n".join(codes)
    names = sorted({w.split("(")[0] for w in code.split() if w.startswith("cpp_fused_")
                    and "truncate" in w})
    return names, "torch.ops.fxquant.truncate" in code


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="1 seed, 3 epochs, small graph")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    refuse_counts(p, args, "seeds", "epochs")
    if args.quick:
        refuse_overridden(p, args, "--quick", ("seeds", "epochs"))
    seeds, epochs = (1, 3) if args.quick else (args.seeds, args.epochs)
    device = torch.device("cpu")
    if args.quick:
        data, num_classes = random_graph(60, 300, 32), 3
        data.y = torch.randint(0, num_classes, (60,))
        for mask in ("train_mask", "val_mask", "test_mask"):
            data[mask] = torch.rand(60) < 0.5
    else:
        dataset = load_planetoid("Cora", transform=T.NormalizeFeatures())
        data, num_classes = dataset[0], dataset.num_classes

    every_site = fxquant.QuantMapping()
    for site in ("input", "weight", "message", "aggregate", "output"):
        every_site.set_global(fxquant.QuantConfig("int8", scale="tensor", decay=0.9), site=site)

    def learned_bits(signed: str) -> fxquant.QuantMapping:
        """Learned per-node bits at every activation site; ``signed`` at the messages and
        aggregations (a mid-rise grid has no zero: the inputs' zeros stay on int8)."""
        mapping = fxquant.QuantMapping()
        for site in ("input", "message", "aggregate", "output"):
            mapping.set_global(fxquant.QuantConfig(
                signed if site in ("message", "aggregate") else "int8", scale="tensor",
                range="lsq", node_bits=fxquant.NodeBits.learned_init(data.num_nodes, 4.0)),
                site=site)
        return mapping

    learned, learned_midrise = learned_bits("int8"), learned_bits("int8:midrise")

    def build(kind: str, seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        model: torch.nn.Module = GCN(data.num_features, 16, num_classes)
        if "bits=16" in kind:
            model = fxquant.transform(model, bits=16)
        if "int8 all sites" in kind:
            model = fxquant.transform(model, every_site)
        if "learned bits" in kind:
            model = fxquant.transform(model, learned_midrise if "mid-rise" in kind else learned)
        if "compiled" in kind:
            return cast(torch.nn.Module, torch.compile(model))
        return model

    kinds = ["FP32 eager", "bits=16 eager", "int8 all sites eager", "learned bits eager",
             "learned bits mid-rise eager", "FP32 compiled", "bits=16 compiled", "int8 all sites compiled"]
    # The four models take turns within each seed, so a ratio compares runs that are
    # neighbours in time; the reported ratios are medians over seeds of per-seed ratios.
    per_seed: dict[str, list[float]] = {k: [] for k in kinds}
    accs: dict[str, list[float]] = {k: [] for k in kinds}
    for seed in range(seeds):
        for kind in kinds:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = training.fit(build(kind, seed), data, epochs,
                                      desc=f"{kind} seed {seed}", device=device)
            per_seed[kind].append(statistics.median(result.epoch_ms))
            accs[kind].append(result.test)
    epoch_ms = {k: statistics.median(v) for k, v in per_seed.items()}
    accuracy = {k: 100 * statistics.mean(v) for k, v in accs.items()}

    def ratio(a: str, b: str) -> str:
        return f"{statistics.median(x / y for x, y in zip(per_seed[a], per_seed[b], strict=True)):.3f}"

    gcn = GCN(data.num_features, 16, num_classes)
    transform_ms = median_ms(lambda: fxquant.transform(gcn, bits=16), 3 if args.quick else 20)
    transform_nolint_ms = median_ms(lambda: fxquant.transform(gcn, bits=16, lint="off"),
                                    3 if args.quick else 20)
    big = random_graph(1000, 5000, data.num_features)
    lint_ms = median_ms(lambda: fxquant.lint(gcn, big.x, big.edge_index), 3 if args.quick else 10)
    symbolic_ms = median_ms(lambda: fxquant.lint(gcn), 3 if args.quick else 10)
    kernels, opaque = fused_kernels(fxquant.transform(gcn, bits=16), data)

    rows = [[k, f"{epoch_ms[k]:.2f}", f"{accuracy[k]:.1f}"] for k in kinds]
    table = tabulate(rows, headers=["model", "median epoch (ms)", "test acc (%)"], tablefmt="github")
    ratios = [
        ["bits=16 eager / FP32 eager", ratio("bits=16 eager", "FP32 eager"), "<= 1.05"],
        ["bits=16 compiled / bits=16 eager", ratio("bits=16 compiled", "bits=16 eager"), "<= 1.00"],
        ["int8 all sites eager / FP32 eager", ratio("int8 all sites eager", "FP32 eager"),
         "<= 1.5"],
        ["int8 all sites compiled / FP32 compiled",
         ratio("int8 all sites compiled", "FP32 compiled"), "<= 1.1"],
        ["learned bits per node eager / FP32 eager", ratio("learned bits eager", "FP32 eager"),
         "<= 1.3"],
        ["learned bits, mid-rise grid, eager / FP32 eager",
         ratio("learned bits mid-rise eager", "FP32 eager"), "<= 1.3"],
        ["FP32 compiled / FP32 eager", ratio("FP32 compiled", "FP32 eager"), ""],
        ["transform(GCN, bits=16), lint on (ms)", f"{transform_ms:.1f}", "<= 100"],
        ["transform(GCN, bits=16, lint='off') (ms)", f"{transform_nolint_ms:.1f}", ""],
        ["lint(GCN, x, edge_index), 1,000 nodes (ms)", f"{lint_ms:.1f}", "<= 200"],
        ["lint(GCN) symbolic (ms)", f"{symbolic_ms:.1f}", ""],
    ]
    ratio_table = tabulate(ratios, headers=["measure", "value", "target"], tablefmt="github")
    source = "a generated graph (quick run)" if args.quick else "Cora (public split)"
    body = (
        f"## bench_train\n\n`python -m benchmarks.bench_train` on {machine()}; {source}, "
        f"{seeds} seeds x {epochs} epochs per model; 'int8 all sites': input, weight, "
        "message, aggregate and output of both convs, int8 with a per-tensor running range "
        "(decay 0.9); 'learned bits': input, message, aggregate and output with a learned "
        "bit-width per node (NodeBits, LSQ step; 'mid-rise': messages and aggregations on an "
        "int8:midrise grid)."
        f"\n\n{table}\n\n{ratio_table}\n\n"
        f"Compiled transformed GCN (eval forward): inductor kernels that contain the truncation: "
        f"{kernels or 'none'}; opaque fxquant.truncate call left in the generated code: "
        f"{'yes' if opaque else 'no'}.\n"
    )
    return publish("bench_train", body, write=not args.no_write)


if __name__ == "__main__":
    main()
