"""Accuracy against average bits: uniform and per-node precision on a Cora / CiteSeer GCN.

Every activation site of both layers is quantized (the input of each layer, its messages,
its aggregation and its output); weights stay float32. The raw input features (the first
layer's input) are rounded the same way for every method, to ``uint1`` with a per-row
scale (``--input-format``): Cora's and CiteSeer's row-normalized bag-of-words rows are
exact there, and ``avg_bits`` leaves them out (``input_bits`` reports them). The logits
(the last layer's output) stay float32 unless ``--quantize-logits``: a 2-bit grid turns
the argmax over 7 classes into ties. Methods, at a
budget of ``--target-bits`` B, for everything else:

- ``topn``: uniform top-N truncation of the float32 pattern, N = round(B);
- ``format``: a uniform minifloat with a per-row float32 scale, the widest format whose
  value bits fit B minus the scale's share of a 16-value row (2 bits);
- ``int``: uniform integers with a learned step (LSQ), floor(B) bits (at least 2);
- ``degree``: integers with a learned step and a bit-width per node from its in-degree:
  higher in-degree, more bits. Two levels whose node average is B: floor(B) and one more
  for the highest-degree fraction B - floor(B) of the nodes, or, for a whole B, B - 1 and
  B + 1 split at the median in-degree (the bits follow from the graph: nothing stored);
- ``learned``: A2Q-style learned bit-widths per node (with one learned step per site),
  pulled toward B by ``fxquant.bit_penalty`` added to the loss.

Integer grids are unsigned at the layers' inputs (non-negative after ReLU) and at the
hidden layer's output (it feeds the ReLU, which zeroes what an unsigned grid clamps), and
signed elsewhere.

Bits are counted by :func:`fxquant.bit_report` (raw input features excluded from
``avg_bits``, reported as ``input_bits``; scales and stored bit-widths included) on the
evaluation that gave the reported accuracy (the best validation epoch). Seeds are
paired: FP32 and every method of one seed start from the same weights.

    python examples/bits_pareto.py --method learned --target-bits 1.5,2,3,4 --seeds 5 \\
        --dataset Cora --json docs/bits_cora_learned.json
    python examples/bits_pareto.py --from-json docs/bits_cora_*.json --plot docs/bits_cora.png
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
import torch_geometric.transforms as T

import fxquant
from fxquant.datasets import PLANETOID_NAMES, load_planetoid

try:  # imported as examples.bits_pareto (python -m, tests)
    from examples import train_cora
except ModuleNotFoundError:  # run as a script: this folder is on sys.path
    import train_cora  # type: ignore[no-redef]

METHODS = ("topn", "format", "int", "degree", "learned")
LSQ_METHODS = ("int", "degree", "learned")  # integer grids with a learned step
SITES = ("input", "message", "aggregate", "output")
#: minifloats by value bits, for the ``format`` method
FORMATS = {3: "e1m1", 4: "e2m1", 5: "e2m2", 6: "e2m3", 7: "e3m3", 8: "e4m3"}
DEFAULT_PENALTY = 1.0
PENALTY = DEFAULT_PENALTY
INPUT_FORMAT = "uint1:row"
QUANTIZE_LOGITS = False
#: the signed integer grid: "midrise" (2**b levels, no zero; 1 bit is the sign) or
#: "symmetric" (2**b - 1 levels around 0, 2 bits at least)
SIGNED_GRIDS = ("midrise", "symmetric")
SIGNED_GRID = "symmetric"


def site_config(method: str, target: float, data: Any, unsigned: bool) -> fxquant.QuantConfig:
    """One site's config for ``method`` at budget ``target``; integer grids are unsigned
    where the values are non-negative (or about to be clamped at zero by a ReLU)."""
    n = data.num_nodes
    kind = "uint" if unsigned else "int"
    midrise = not unsigned and SIGNED_GRID == "midrise"
    option = ":midrise" if midrise else ""
    lowest = 1 if unsigned or midrise else 2
    if method == "topn":
        return fxquant.QuantConfig(max(1, round(target)), "nearest")
    if method == "format":
        bits = max(3, min(8, math.floor(target - 2)))
        return fxquant.QuantConfig(FORMATS[bits], scale="row")
    if method == "int":
        bits = max(lowest, math.floor(target))
        return fxquant.QuantConfig(f"{kind}{bits}{option}", scale="tensor", range="lsq")
    if method == "degree":
        low, fraction = math.floor(target), target - math.floor(target)
        levels, quantile = (low, low + 1), 1 - fraction
        if fraction == 0:
            levels, quantile = (low - 1, low + 1), 0.5
        levels = (max(lowest, levels[0]), max(lowest, levels[1]))
        rb = fxquant.RowBits.by_degree(data.edge_index, n, [quantile], list(levels),
                                       min_bits=lowest)
        return fxquant.QuantConfig(f"{kind}8{option}", scale="tensor", range="lsq", row_bits=rb)
    rb = fxquant.RowBits.learned_init(n, init=min(8.0, target + 1.0), min_bits=lowest)
    return fxquant.QuantConfig(f"{kind}8{option}", scale="tensor", range="lsq", row_bits=rb)


def mapping_for(method: str, target: float, data: Any) -> fxquant.QuantMapping:
    mapping = fxquant.QuantMapping()
    for site in SITES:  # a layer's input is non-negative (after a ReLU)
        mapping.set_global(site_config(method, target, data, site == "input"), site=site)
    # the hidden layer's output feeds a ReLU: an unsigned grid loses only what it zeroes
    mapping.set_name("conv1", site_config(method, target, data, True), site="output")
    number, _, scale = INPUT_FORMAT.partition(":")
    mapping.set_name("conv1", fxquant.QuantConfig(number, scale=scale or None), site="input")
    if not QUANTIZE_LOGITS:
        mapping.set_name("conv2", None, site="output")
    return mapping


def train(model: torch.nn.Module, data: Any, epochs: int, target: float | None,
          desc: str, lsq_refit: int = 0, within_budget: bool = False
          ) -> tuple[float, fxquant.BitReport | None, bool]:
    """gcn.py's loop (plus the bit penalty for learned bits); returns the test accuracy at
    the best validation epoch, the bits of that epoch's evaluation (learned bit-widths
    change while training: the bits counted are those of the model that scored the
    accuracy; None for a model without quantization points), and whether that epoch met
    the budget.

    With ``within_budget`` (learned bit-widths), only epochs whose ``avg_bits`` is at most
    ``target`` compete (model selection under a constraint, on validation accuracy and
    bit counts only); if none does, the best validation epoch overall is returned with
    ``False``. Learned steps are fitted again on each of the first ``lsq_refit`` epochs
    (:func:`fxquant.refit_steps`)."""
    optimizer = torch.optim.Adam(train_cora._param_groups(model), lr=0.01)
    learned = target is not None and any(
        isinstance(m, fxquant.QuantPoint) and m.row_bits is not None for m in model.modules())
    quantized = any(isinstance(m, fxquant.QuantPoint) for m in model.modules())
    constrained = within_budget and learned
    # [best validation, its test accuracy, its bits]: over all epochs, and within budget
    best: dict[bool, list[Any]] = {False: [0.0, 0.0, None], True: [0.0, 0.0, None]}
    for epoch in range(epochs):
        model.train()
        if 0 < epoch < lsq_refit:
            fxquant.refit_steps(model)
        optimizer.zero_grad()
        out = model(data.x, data.edge_index)
        loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        if learned:
            assert target is not None
            loss = loss + PENALTY * fxquant.bit_penalty(model, target)
        loss.backward()
        optimizer.step()
        model.eval()
        with torch.no_grad():
            pred = model(data.x, data.edge_index).argmax(-1)
        val = float((pred[data.val_mask] == data.y[data.val_mask]).float().mean())
        # the counts of the evaluation forward just run (no second forward)
        report = fxquant.bit_report(model) if constrained else None
        for within in (False, True):
            if val > best[within][0] and (not within or (
                    constrained and report is not None and report.avg_bits <= target)):
                test = float((pred[data.test_mask] == data.y[data.test_mask]).float().mean())
                bits = report if report is not None else (
                    fxquant.bit_report(model) if quantized else None)
                best[within] = [val, test, bits]
    met = constrained and best[True][2] is not None
    _, test, report = best[met]
    if quantized and report is None:  # validation never above 0: the final model's bits
        report = fxquant.bit_report(model, data.x, data.edge_index)
    print(f"{desc}: {100 * test:.1f}" + ("" if met or not constrained else " (over budget)"),
          file=sys.stderr, flush=True)
    return test, report, met


def _targets(text: str) -> list[float]:
    try:
        values = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--target-bits takes numbers, e.g. 1.5,2,3; got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"--target-bits must be positive, got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--method", choices=METHODS, default="learned")
    p.add_argument("--target-bits", type=_targets, default=[2.0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--dataset", default="Cora", choices=list(PLANETOID_NAMES))
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--penalty", type=float, default=DEFAULT_PENALTY,
                   help="weight of fxquant.bit_penalty in the loss (learned; default "
                        f"{DEFAULT_PENALTY:g})")
    p.add_argument("--quantize-logits", action="store_true",
                   help="also round the last layer's output (the logits; float32 by default)")
    p.add_argument("--input-format", default=INPUT_FORMAT,
                   help="the raw input features' format[:scale] (default uint1:row)")
    p.add_argument("--signed-grid", choices=SIGNED_GRIDS, default=SIGNED_GRID,
                   help="signed integer sites: 'midrise' (2**b levels k + 1/2, no zero; "
                        "1 bit is the sign) or 'symmetric' (-(2**(b-1) - 1) .. 2**(b-1) - 1, "
                        "at least 2 bits) (default: symmetric)")
    p.add_argument("--shared-step", action="store_true",
                   help="the second layer's input rounds with the first layer's output step "
                        "(fxquant.share_step; int, degree, learned); by default each learns "
                        "its own")
    p.add_argument("--select", choices=("best-val", "budget"), default="best-val",
                   help="which epoch's model is reported: the best validation accuracy "
                        "(default), or for learned bit-widths the best among the epochs whose "
                        "avg_bits is within --target-bits (budget_met in the JSON says, per "
                        "seed, whether one was)")
    p.add_argument("--lsq-refit", type=train_cora._epochs, default=0, metavar="N",
                   help="fit the learned steps again on each of the first N epochs "
                        "(fxquant.refit_steps; default: on the first only)")
    p.add_argument("--root", default=None)
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--from-json", nargs="+", default=None, metavar="PATH",
                   help="no training: table (and --plot) from earlier --json files")
    p.add_argument("--plot", default=None, metavar="PNG")
    args = p.parse_args(argv)
    if args.seeds < 1 or args.epochs < 1:
        p.error("--seeds and --epochs must be >= 1")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    global INPUT_FORMAT, QUANTIZE_LOGITS, PENALTY, SIGNED_GRID
    INPUT_FORMAT, QUANTIZE_LOGITS = args.input_format, args.quantize_logits
    SIGNED_GRID = args.signed_grid
    PENALTY = args.penalty
    dataset = load_planetoid(args.dataset, args.root, transform=T.NormalizeFeatures(),
                             download=False)
    data = dataset[0]
    fp32 = []
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        model = train_cora.make_model("gcn", data.num_features, dataset.num_classes)
        fp32.append(train(model, data, args.epochs, None, f"FP32 seed {seed}")[0])
    results = []
    for target in args.target_bits:
        accs, reports, budget_met = [], [], []
        for seed in range(args.seeds):
            torch.manual_seed(seed)
            model = train_cora.make_model("gcn", data.num_features, dataset.num_classes)
            gm = fxquant.transform(model, mapping_for(args.method, target, data), lint="off")
            if args.method in LSQ_METHODS and args.shared_step:
                # the hidden output, rounded, then ReLU'd, is the next layer's input: one grid
                fxquant.share_step(gm, "conv2_input_quant", "conv1_quant")
            acc, report, met = train(gm, data, args.epochs, target,
                                     f"{args.method} {target} bits seed {seed}", args.lsq_refit,
                                     args.select == "budget")
            assert report is not None
            accs.append(acc)
            reports.append(report)
            budget_met.append(met)
        results.append({
            "method": args.method, "target_bits": target,
            "avg_bits": statistics.mean(r.avg_bits for r in reports),
            "input_bits": statistics.mean(r.input_bits for r in reports),
            "avg_bits_with_input": statistics.mean(r.avg_bits_with_input for r in reports),
            "histogram": reports[0].histogram, "accs": accs, "fp32_accs": fp32,
            "budget_met": budget_met,
        })
    return {"dataset": args.dataset, "model": "gcn", "sites": list(SITES),
            "epochs": args.epochs, "lsq_refit": args.lsq_refit,
            "penalty": args.penalty, "select": args.select, "signed_grid": args.signed_grid,
            "shared_step": args.shared_step,
            "torch": torch.__version__, "fp32_accs": fp32, "results": results}


def _label(payload: dict[str, Any], method: str) -> str:
    """The curve's name: the method, and the grid options when not the defaults."""
    grid = payload.get("signed_grid", "symmetric")  # files from before the option: symmetric
    extra = [grid] if grid != "symmetric" else []
    if payload.get("shared_step") and method in LSQ_METHODS:
        extra.append("shared step")
    if method == "learned" and payload.get("penalty", DEFAULT_PENALTY) != DEFAULT_PENALTY:
        extra.append(f"penalty {payload['penalty']:g}")
    if method == "learned" and payload.get("select") == "budget":
        extra.append("within budget")
    return f"{method} ({', '.join(extra)})" if extra else method


def table(payloads: list[dict[str, Any]]) -> str:
    lines = ["| dataset | method | target bits | avg_bits | input_bits | test acc (%) | FP32 (%) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for payload in payloads:
        for r in payload["results"]:
            acc = 100 * statistics.mean(r["accs"])
            sd = 100 * statistics.stdev(r["accs"]) if len(r["accs"]) > 1 else 0.0
            over = r.get("budget_met", []).count(False) if payload.get("select") == "budget" \
                else 0  # seeds whose every epoch was over the budget
            lines.append(f"| {payload['dataset']} | {_label(payload, r['method'])} | "
                         f"{r['target_bits']:g}{f' ({over} over)' if over else ''} | "
                         f"{r['avg_bits']:.2f} | {r['input_bits']:.2f} | {acc:.1f} +- {sd:.1f} | "
                         f"{100 * statistics.mean(r['fp32_accs']):.1f} |")
    return "\n".join(lines)


def plot(payloads: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = sorted({p["dataset"] for p in payloads})
    fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 4.2), squeeze=False)
    for ax, name in zip(axes[0], datasets, strict=True):
        by_method: dict[str, list[tuple[float, float, float]]] = {}
        fp32 = []
        for p in payloads:
            if p["dataset"] != name:
                continue
            fp32 += p["fp32_accs"]
            for r in p["results"]:
                by_method.setdefault(_label(p, r["method"]), []).append(
                    (r["avg_bits"], 100 * statistics.mean(r["accs"]),
                     100 * statistics.stdev(r["accs"]) if len(r["accs"]) > 1 else 0.0))
        for method in sorted(by_method, key=lambda m: (METHODS.index(m.split()[0]), m)):
            points = sorted(by_method[method])
            if points:
                ax.errorbar([b for b, _, _ in points], [a for _, a, _ in points],
                            yerr=[s for _, _, s in points], marker="o", capsize=3, label=method)
        if fp32:
            ax.axhline(100 * statistics.mean(fp32), color="gray", ls="--", label="FP32")
        ax.set(xlabel="average bits per value (raw input excluded, storage included)",
               ylabel="test accuracy (%)", title=f"GCN on {name}, all activations quantized")
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=max(0, ax.get_ylim()[0]))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, framealpha=0.6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    if args.from_json:
        payloads = []
        for path in args.from_json:
            with open(path) as f:
                payloads.append(json.load(f))
    else:
        payloads = [run(args)]
        if args.json:
            with open(args.json, "w") as f:
                json.dump(payloads[0], f, indent=1)
    print(table(payloads))
    if args.plot:
        plot(payloads, args.plot)
    return payloads


if __name__ == "__main__":
    main()
