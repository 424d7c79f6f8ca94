"""What the bits buy: converted models (``fxquant.convert``) against PyG float32, side by side.

    python -m benchmarks.bench_execution --json docs/results/execution.json \\
        --plot docs/results/execution.png                     # the published run
    python -m benchmarks.bench_execution --quick --no-compile  # a smoke run (seconds)

Measured in one process, the cases of each table alternating round after round (so drift
on the machine hits them alike), on one thread and on all threads:

- latency of one inference forward: PyG's own layers in float32 (eager, and under
  ``torch.compile``), the converted INT8 model on features stored as its int8 codes
  (``model.quantize_input``, what a deployment keeps) and on float32 features (rounded in
  the forward), and the converted INT4 and per-node models; GCN, GIN and GraphSAGE on Cora
  and on a planted-community graph of 1,000,000 nodes and 10,000,000 edges. The first
  call, which prepares each graph once (normalization, the edge order), is timed apart;
- ONNX Runtime (CPU provider) on the exported integer graph, taking float32 features
  (rounded in the graph) or the codes they are stored as (``stored_input=True``), against
  the same graph in float32 (``export_onnx(..., float32=True)``);
- stored bytes of the values between points (features, hidden states, aggregates; the
  messages apart: the converted model streams them) and of the weights, per-tensor scales
  included and per-row scales counted apart, with the peak memory of a forward;
- bit operations beside the bit average (``fxquant.execution.bit_operations``);
- the top ten ops of each case (``torch.profiler``), for where the time goes.

Writes a JSON file (``--json``) and a plot (``--plot``) for the docs' results page.
``--only memory`` measures the bytes, peaks and bit operations alone (they do not need a
quiet machine):

    python -m benchmarks.bench_execution --only memory --json memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
import torch_geometric.transforms as T
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv
from torch_geometric.nn.models import GIN, GraphSAGE

import fxquant
from fxquant.datasets import load_planetoid
from fxquant.execution import bit_operations, export_onnx, onnx_inputs, storage

SITES = ("input", "weight", "message", "aggregate", "output")
MODELS = ("gcn", "gin", "sage")
CONFIGS = ("int8", "int4-lsq-p", "recommended")
#: what one run measures (``--only``)
SECTIONS = ("latency", "memory", "onnx")


class GCN(nn.Module):
    """PyG's examples/gcn.py model (two cached ``GCNConv``), evaluated."""

    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.conv1 = GCNConv(features, hidden, cached=True)
        self.conv2 = GCNConv(hidden, classes, cached=True)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, edge_index).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index)


def make_model(kind: str, features: int, classes: int) -> nn.Module:
    torch.manual_seed(0)
    if kind == "gcn":
        return GCN(features, 16, classes)
    if kind == "gin":
        return GIN(features, 16, num_layers=2, out_channels=classes, dropout=0.5)
    return GraphSAGE(features, 16, num_layers=2, out_channels=classes, dropout=0.5)


def planted_graph(nodes: int, edges: int, features: int, classes: int = 8) -> Data:
    """The scale benchmark's graph: classes are contiguous communities, 80% of the edges
    stay inside one, features are the class centroid plus noise (uniform degrees)."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(nodes) * classes // nodes
    start = torch.arange(classes) * nodes // classes
    size = torch.diff(torch.cat([start, torch.tensor([nodes])]))
    src = torch.randint(0, nodes, (edges,), generator=g)
    inside = torch.rand(edges, generator=g) < 0.8
    community = y[src]
    offset = (torch.rand(edges, generator=g) * size[community]).long()
    dst = torch.where(inside, start[community] + offset,
                      torch.randint(0, nodes, (edges,), generator=g))
    x = torch.randn(classes, features, generator=g)[y] + 2.0 * torch.randn(nodes, features,
                                                                            generator=g)
    return Data(x=x, edge_index=torch.stack([src, dst]), y=y, num_nodes=nodes)


def converted(model: nn.Module, config: str, data: Data, ties: str = "simulation"
              ) -> fxquant.ConvertedModel:
    """``model`` transformed in ``config``, one training forward (fits the learned steps),
    converted (float32 where a part has no integer form, as the report lists)."""
    if config == "recommended":
        gm = fxquant.recipes.get("recommended", fit_budget=False).prepare(
            model, data, lint="off").model
    else:
        mapping = fxquant.QuantMapping()
        for site in SITES:
            mapping.set_global(fxquant.QuantConfig(
                "int8", scale="tensor") if config == "int8" else fxquant.QuantConfig(
                "int4", scale="tensor", range="lsq",
                protect=None if site == "weight" else (0.0, 0.2)), site=site)
        gm = fxquant.transform(model, mapping, lint="off")
    gm.train()
    for point in (m for m in gm.modules() if isinstance(m, fxquant.QuantPoint)):
        point.float_training = False
    with torch.no_grad():
        gm(data.x, data.edge_index)
    return fxquant.convert(gm.eval(), strict=False, ties=ties)


# -- timing -----------------------------------------------------------------------------


def _block(fn: Callable[[], Any], min_time: float) -> float:
    """Median seconds of ``fn()`` over a block of calls lasting about ``min_time``."""
    times: list[float] = []
    start = time.perf_counter()
    while not times or time.perf_counter() - start < min_time:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def alternate(cases: dict[str, Callable[[], Any]], rounds: int, min_time: float,
              base: str) -> dict[str, dict[str, float]]:
    """Each case timed in turn, ``rounds`` times: the median time of each, and the median
    over rounds of ``base``'s time / the case's (the speedup)."""
    per_round: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            per_round[name].append(_block(fn, min_time))
    out = {}
    for name, times in per_round.items():
        speedups = [b / t for b, t in zip(per_round[base], times, strict=True)]
        out[name] = {"seconds": statistics.median(times), "speedup": statistics.median(speedups),
                     "speedup_min": min(speedups), "speedup_max": max(speedups)}
    return out


def top_ops(fn: Callable[[], Any], calls: int = 3) -> list[dict[str, Any]]:
    """The ten ops with the most self CPU time over ``calls`` calls."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    return [{"op": e.key, "calls": e.count, "self_ms": e.self_cpu_time_total / 1000 / calls,
             "share": e.self_cpu_time_total / total} for e in events[:10]]


def peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes allocated on the CPU while ``fn()`` runs, from the profiler's memory
    events (allocations at their op's start, frees at its end)."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    del out
    steps = sorted((e.time_range.start if e.self_cpu_memory_usage > 0 else e.time_range.end,
                    e.self_cpu_memory_usage) for e in prof.events() if e.self_cpu_memory_usage)
    total = peak = 0
    for _, delta in steps:
        total += delta
        peak = max(peak, total)
    return peak


# -- the sections -----------------------------------------------------------------------


def _latency_cases(model: nn.Module, models: dict[str, fxquant.ConvertedModel], data: Data,
                   compile_: bool) -> dict[str, Callable[[], Any]]:
    """PyG float32 (eager, compiled) and the converted models, each a call of one forward."""
    x, ei = data.x, data.edge_index
    int8 = models["int8"]
    stored = int8.quantize_input(x)
    cases: dict[str, Callable[[], Any]] = {"pyg float32 eager": lambda: model(x, ei)}
    if compile_:
        compiled = torch.compile(model)
        cases["pyg float32 compiled"] = lambda: compiled(x, ei)
    cases["int8, stored int8 features"] = lambda: int8(stored, ei)
    cases["int8, float32 features"] = lambda: int8(x, ei)
    nearest = models["int8 ties=nearest"]
    stored_nearest = nearest.quantize_input(x)
    cases["int8 (ties=nearest), stored int8 features"] = lambda: nearest(stored_nearest, ei)
    for config, m in models.items():
        if config.startswith("int8"):
            continue
        features = m.quantize_input(x) if m.input_point is not None else x
        cases[f"{config}, stored features"] = partial(m, features, ei)
    return cases


def latency(name: str, data: Data, classes: int, args: argparse.Namespace) -> list[dict]:
    rows = []
    configs = ("int8",) if data.num_nodes > 100_000 else CONFIGS
    for kind in args.models:
        model = make_model(kind, data.num_features, classes).eval()
        models = {c: converted(make_model(kind, data.num_features, classes), c, data)
                  for c in configs}
        models["int8 ties=nearest"] = converted(make_model(kind, data.num_features, classes),
                                                "int8", data, ties="nearest")
        cases = _latency_cases(model, models, data, args.compile)
        first = {}
        for case, fn in cases.items():  # first calls: per-graph preparation, compilation
            with torch.no_grad():
                start = time.perf_counter()
                fn()
                first[case] = time.perf_counter() - start
        for threads in args.threads:
            torch.set_num_threads(threads)
            with torch.no_grad():
                timed = alternate(cases, args.rounds, args.min_time, "pyg float32 eager")
                profiles = {case: top_ops(fn, 1 if data.num_nodes > 100_000 else 3)
                            for case, fn in cases.items()} if threads == 1 else {}
            for case, result in timed.items():
                rows.append({"graph": name, "model": kind, "threads": threads, "case": case,
                             **result, "first_call_seconds": first[case],
                             "top_ops": profiles.get(case, [])})
                print(f"{name:9s} {kind:4s} {threads:2d} thr  {case:30s} "
                      f"{1000 * result['seconds']:10.2f} ms  {result['speedup']:5.2f}x")
        torch.set_num_threads(args.threads[-1])
    return rows


def memory(name: str, data: Data, classes: int, args: argparse.Namespace) -> list[dict]:
    rows = []
    for kind in args.models:
        base = make_model(kind, data.num_features, classes).eval()
        with torch.no_grad():
            float_peak = peak_bytes(partial(base, data.x, data.edge_index))
        for config in CONFIGS:
            model = converted(make_model(kind, data.num_features, classes), config, data)
            s = storage(model, data.x, data.edge_index)
            ops = bit_operations(model, data.x, data.edge_index)
            features = model.quantize_input(data.x) if model.input_point else data.x
            with torch.no_grad():
                peak = peak_bytes(partial(model, features, data.edge_index))
            values = ("features", "hidden", "aggregate")
            stored, reference = s.total(values)
            counted = [r for r in s.rows if r.kind != "weight"]
            bits = sum(r.bits * r.elements for r in counted) / max(
                1, sum(r.elements for r in counted))
            weights = [r for r in s.rows if r.kind == "weight"]
            row = {"graph": name, "model": kind, "config": config,
                   "values_ratio": s.ratio(values), "values_bytes": stored,
                   "values_float32_bytes": reference,
                   "values_ratio_without_row_scales": s.ratio(values, row_scales=False),
                   "row_scale_bytes": sum(r.row_scale_bytes for r in s.rows),
                   "by_kind": {k: s.ratio((k,)) for k in ("features", "hidden", "aggregate",
                                                          "messages")
                               if any(r.kind == k for r in s.rows)},
                   "weights_ratio": s.ratio(("weight",)) if weights else None,
                   "float_parameter_bytes": s.float_parameter_bytes,
                   "width_table_bytes": s.width_table_bytes, "avg_bits": bits,
                   "bitops": ops.bitops, "float32_bitops": ops.float32_bitops,
                   "peak_bytes": peak, "float32_peak_bytes": float_peak,
                   "report": model.report.counts(), "float32_parts": [
                       p.where for p in model.report.float32]}
            rows.append(row)
            print(f"{name:9s} {kind:4s} {config:12s} values {row['values_ratio']:6.2f}x "
                  f"weights {row['weights_ratio'] or 0:5.2f}x  bits {bits:5.2f}  BitOPs "
                  f"{ops.float32_bitops / max(ops.bitops, 1):6.1f}x fewer  peak "
                  f"{peak / 2**20:8.1f} MiB (float32 {float_peak / 2**20:8.1f})")
    return rows


def onnx_runtime(data: Data, classes: int, args: argparse.Namespace) -> list[dict]:
    try:
        import onnxruntime as ort
    except ImportError:
        print("onnx: skipped (pip install 'fxquant[export]')")
        return []
    rows = []
    folder = tempfile.mkdtemp()
    for kind in args.models:
        model = converted(make_model(kind, data.num_features, classes), "int8", data)
        stored = model.quantize_input(data.x)
        paths, feeds = {}, {}
        for i, (label, kwargs) in enumerate((
                ("onnxruntime int8", {}),
                ("onnxruntime int8, stored int8 features", {"stored_input": True}),
                ("onnxruntime float32", {"float32": True}))):
            paths[label] = os.path.join(folder, f"{kind}_{i}.onnx")
            export_onnx(model, paths[label], feature_dim=data.num_features, **kwargs)
            feeds[label] = onnx_inputs(stored if "stored" in label else data.x,
                                       data.edge_index)
        for threads in args.threads:
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            sessions = {k: ort.InferenceSession(p, options, providers=["CPUExecutionProvider"])
                        for k, p in paths.items()}
            cases: dict[str, Callable[[], Any]] = {
                k: partial(s.run, None, feeds[k]) for k, s in sessions.items()}
            for case, result in alternate(cases, args.rounds, args.min_time,
                                          "onnxruntime float32").items():
                rows.append({"model": kind, "threads": threads, "case": case, **result})
                print(f"onnx      {kind:4s} {threads:2d} thr  {case:30s} "
                      f"{1000 * result['seconds']:10.2f} ms  {result['speedup']:5.2f}x")
    return rows


def plot(payload: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    rows = [r for r in payload["latency"] if r["threads"] == 1 and "eager" not in r["case"]]
    labels = [f"{r['graph']} {r['model']}\n{r['case']}" for r in rows]
    left.barh(range(len(rows)), [r["speedup"] for r in rows], color="tab:blue")
    left.set_yticks(range(len(rows)))
    left.set_yticklabels(labels, fontsize=6)
    left.axvline(1.0, color="gray", lw=0.8)
    left.set_xlabel("speedup over PyG float32 eager (one thread)")
    mem = payload["memory"]
    labels = [f"{r['graph']} {r['model']} {r['config']}" for r in mem]
    right.barh(range(len(mem)), [r["values_ratio"] for r in mem], color="tab:green",
               label="values")
    right.barh([i + 0.4 for i in range(len(mem))], [r["weights_ratio"] or 0 for r in mem],
               height=0.4, color="tab:orange", label="weights")
    right.set_yticks(range(len(mem)))
    right.set_yticklabels(labels, fontsize=6)
    right.set_xlabel("float32 bytes / stored bytes")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=1_000_000)
    p.add_argument("--edges", type=int, default=10_000_000)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--min-time", type=float, default=1.0, help="seconds per timed block")
    p.add_argument("--threads", default=f"1,{torch.get_num_threads()}",
                   help="comma list of thread counts (default: 1 and all)")
    p.add_argument("--no-compile", dest="compile", action="store_false",
                   help="leave out the torch.compile baseline")
    p.add_argument("--no-large", dest="large", action="store_false",
                   help="Cora only (no planted-community graph)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 2,000-node graph, 1 round of 0.05 s, one thread")
    p.add_argument("--only", default=",".join(SECTIONS), metavar="SECTIONS",
                   help=f"comma list of the sections to run (default: all of {','.join(SECTIONS)}); "
                        "memory and bit operations do not depend on a quiet machine")
    p.add_argument("--root", default=None, help="Planetoid data (default: FXQUANT_DATA)")
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--plot", default=None, metavar="PNG")
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        p.error(f"--models: unknown {unknown}; models: {list(MODELS)}")
    args.threads = sorted({int(t) for t in args.threads.split(",")})
    args.only = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = sorted(set(args.only) - set(SECTIONS))
    if unknown or not args.only:
        p.error(f"--only: unknown sections {unknown}; sections: {list(SECTIONS)}")
    if args.plot and not {"latency", "memory"} <= set(args.only):
        p.error("--plot draws latency and memory: please run both (--only latency,memory)")
    if args.quick:
        args.nodes, args.edges, args.rounds, args.min_time = 2_000, 10_000, 1, 0.05
        args.threads = [1]
    dataset = load_planetoid("Cora", args.root, transform=T.NormalizeFeatures(), download=False)
    cora, classes = dataset[0], dataset.num_classes
    graphs = [("Cora", cora, classes)]
    if args.large:
        graphs.append((f"planted-{args.nodes}", planted_graph(args.nodes, args.edges,
                                                              args.features), 8))
    payload: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__, "args": {k: v for k, v in vars(args).items()},
        "latency": [], "memory": [], "onnx": []}
    for name, data, c in graphs if "latency" in args.only else ():
        payload["latency"] += latency(name, data, c, args)
    for name, data, c in graphs if "memory" in args.only else ():
        payload["memory"] += memory(name, data, c, args)
    if "onnx" in args.only:
        payload["onnx"] = onnx_runtime(cora, classes, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)
    if args.plot:
        plot(payload, args.plot)
    return payload


if __name__ == "__main__":
    main()
