"""Train GNNs on Cora / CiteSeer in FP32 and with reduced precision, inside and between layers.

The GCN is PyG's ``examples/gcn.py`` as written there (row-normalized features, two GCNConv
layers with 16 hidden units, ReLU, dropout 0.5 on the input and hidden layer, Adam with
lr 0.01 and weight decay 5e-4 on the first layer, 200 epochs, test accuracy at the best
validation epoch); ``--model gin`` / ``gat`` / ``gat64`` use PyG's ``models.GIN`` /
``models.GAT`` (two layers, hidden 16; ``gat``: hidden 8 as 8 heads of one channel each;
``gat64``: hidden 64 as 8 heads of 8, the width of PyG's ``examples/gat.py``; dropout 0.5,
the same optimizer and protocol).
fxquant transforms them without touching their code. Seeds are paired: each seed's FP32
and quantized runs start from the same initial weights.

Run (data: ``FXQUANT_DATA`` or ``--root`` pointing at a folder with ``Cora/raw/ind.cora.*``):

    python -m experiments.train_cora                                # FP32 vs top-16 bits, 5 seeds
    python -m experiments.train_cora --sweep 32,16,12,10,9,8 --plot sweep.png --json sweep.json
    python -m experiments.train_cora --format e4m3 --scale tensor   # FP8, a per-tensor scale
    python -m experiments.train_cora --sweep e4m3,e5m2,e3m2,e2m3,e2m1 --scale row --plot f.png
    python -m experiments.train_cora --bits 10 --rounding nearest --super-nodes 0.1:8
    python -m experiments.train_cora --bits 16 --grad zero          # no straight-through gradient
    python -m experiments.train_cora --sites all --format int4 --range lsq --protect 0.0:0.2
    python -m experiments.train_cora --sites all --format e2m1 --scale block32 --model gin

(run from the repository root; ``python examples/train_cora.py`` is the short version of
the first line).

``--sites`` rounds inside the layers too: ``input``, ``weight``, ``message``,
``aggregate`` and ``output`` of every GNN layer (``all``); protection (Degree-Quant) keeps
nodes at full precision in training with a probability growing with in-degree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from typing import Any

import torch
from tabulate import tabulate
from torch_geometric.data import Data
from tqdm import tqdm

import fxquant
from experiments import cli, training
from experiments.stats import paired
from fxquant.datasets import PLANETOID_NAMES
from fxquant.formats import IntFormat, parse

ROUNDINGS = ("toward_zero", "nearest", "stochastic")
SITES, MODELS = training.SITES, training.MODELS


@dataclass
class Config:
    """One line of the results table."""

    name: str
    number: int | str | None  # kept bits, a format name, or None for the FP32 model
    rounding: str | None = None
    grad: str = "ste"
    scale: str | None = None
    momentum: float | None = None
    layers: list[str] | None = None
    super_nodes: tuple[float, int | str] | None = None
    sites: list[str] = field(default_factory=lambda: ["output"])
    range: str = "minmax"
    protect: tuple[float, float] | None = None
    #: a named recipe (``fxquant.recipes.get(name, **settings)``) instead of the fields
    recipe: tuple[str, dict] | None = None
    #: the ``edge`` site's number where it differs from ``number`` (e.g. an unsigned grid
    #: for attention coefficients, which are never negative)
    edge_number: str | None = None
    #: the ``message`` site's rounding where it differs from ``rounding`` (``"stochastic"``:
    #: a node's sum of many rounded messages carries no rounding bias)
    message_rounding: str | None = None
    accs: list[float] = field(default_factory=list)
    epoch_ms: list[float] = field(default_factory=list)
    #: the validation accuracy of each run's reported epoch (settings are chosen on these)
    vals: list[float] = field(default_factory=list)

    @property
    def kind(self) -> str:
        if self.number is None:
            return "fp32"
        if isinstance(self.number, int):
            return "top"
        return "int" if isinstance(parse(self.number), IntFormat) else "format"

    @property
    def bits(self) -> int:
        """Bits per value."""
        if self.number is None:
            return 32
        parsed = parse(self.number if isinstance(self.number, str) else f"top{self.number}")
        return parsed.bits

    @property
    def rounding_label(self) -> str:
        if self.number is None:
            return "-"
        label = self.rounding or ("toward_zero" if self.kind == "top" else "nearest")
        if self.message_rounding is not None and self.message_rounding != label:
            label += f" (messages {self.message_rounding})"
        return label

    def row(self) -> list[object]:
        mean = 100 * statistics.mean(self.accs)
        std = 100 * statistics.stdev(self.accs) if len(self.accs) > 1 else 0.0
        scale = self.scale or "-"
        if self.range != "minmax":
            scale += f" ({self.range})"
        grad = "-" if self.number is None else self.grad
        sites = "-" if self.number is None else ",".join(self.sites)
        protect = "-" if self.protect is None else f"{self.protect[0]:g}:{self.protect[1]:g}"
        return [self.name, self.bits, self.rounding_label, scale, sites, protect, grad,
                f"{mean:.1f} +- {std:.1f}", f"{statistics.median(self.epoch_ms):.1f}"]


#: the sites whose rows are nodes (where --super-nodes applies)
NODE_SITES = frozenset({"output", "input", "aggregate", "message"})


def site_settings(cfg: Config, site: str) -> tuple[int | str, list[tuple[str, str, Any]]]:
    """The number and the :class:`fxquant.QuantConfig` settings of one configuration at one
    site, each with the flag it comes from: ``(number, [(flag, keyword, value), ...])``."""
    protect: tuple[float, float] | fxquant.Protection | None = \
        cfg.protect if site != "weight" else None
    if cfg.protect is not None and site in ("linear", "edge"):  # inside the layer: its mask
        protect = fxquant.Protection(*cfg.protect, share="layer")
    number = cfg.number if cfg.kind != "top" else int(cfg.number)  # type: ignore[arg-type]
    if site == "edge" and cfg.edge_number is not None:
        number = cfg.edge_number
    scaled = cfg.kind in ("format", "int")  # (top-N truncation has no scale)
    message = site == "message" and cfg.message_rounding
    rounding = cfg.message_rounding if message else cfg.rounding
    assert number is not None
    # (a format without a scale is cast unscaled on purpose: "none", said explicitly)
    return number, [("--scale", "scale", (cfg.scale or "none") if scaled else None),
                    ("--range", "range", cfg.range),
                    ("--momentum", "decay", cfg.momentum if scaled else None),
                    ("--message-rounding" if message else "--rounding", "rounding", rounding),
                    ("--grad", "grad", cfg.grad), ("--protect", "protect", protect)]


def mapping_for(cfg: Config, data: Any) -> fxquant.QuantMapping:
    """The quantization points of one configuration, at every site it names."""
    mapping = fxquant.QuantMapping()
    for site in cfg.sites:
        number, settings = site_settings(cfg, site)
        config = fxquant.QuantConfig(number, **{keyword: value for _, keyword, value in settings})
        if cfg.layers:
            for layer in cfg.layers:
                mapping.set_name(layer, config, site=site)
        else:
            mapping.set_global(config, site=site)
    if cfg.super_nodes is not None:
        fraction, over = cfg.super_nodes
        hubs = fxquant.top_degree_nodes(data.edge_index, fraction, data.num_nodes)
        for site in cfg.sites:
            if site in NODE_SITES:
                for layer in cfg.layers or ["conv1", "conv2"]:
                    mapping.set_nodes(layer, hubs, over, site=site)
    return mapping


def build(cfg: Config, data: Any, num_classes: int, seed: int, model_kind: str = "gcn"
          ) -> torch.nn.Module:
    torch.manual_seed(seed)
    # (initialised on the CPU, the same weights on every device; transformed where the data is)
    model = training.make_model(model_kind, data.num_features, num_classes).to(data.x.device)
    if cfg.number is None:
        return model
    if cfg.recipe is not None:
        name, settings = cfg.recipe
        return fxquant.recipes.get(name, **settings).prepare(model, data).model
    return fxquant.transform(model, mapping_for(cfg, data))


def _bits(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 32:
        raise argparse.ArgumentTypeError(f"must be in 1..32, got {text!r}")
    return value


def _number_list(text: str) -> list[int | str]:
    numbers = [cli.number_arg(t) for t in text.split(",") if t.strip()]
    if not numbers:  # an empty sweep would run the default instead
        raise argparse.ArgumentTypeError(f"expected a comma list of bits or formats, got {text!r}")
    twice = sorted({str(n) for n in numbers if numbers.count(n) > 1})
    if twice:  # (each would train twice and print two rows)
        raise argparse.ArgumentTypeError(f"{', '.join(twice)} given twice in {text!r}")
    return numbers


def _names(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:  # no names would round every layer
        raise argparse.ArgumentTypeError(f"expected a comma list of layer names, got {text!r}")
    return names


def _range(text: str) -> str:
    try:
        return fxquant.QuantConfig("int8", scale="tensor", range=text).range
    except (TypeError, ValueError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _super_nodes(text: str) -> tuple[float, int | str]:
    fraction, sep, number = text.partition(":")
    try:
        parsed = float(fraction)
    except ValueError:
        parsed = -1.0
    if not sep or not 0 < parsed < 1:  # (1: every node, the same as BITS for all)
        raise argparse.ArgumentTypeError(f"expected FRACTION:BITS like 0.1:8 (FRACTION in "
                                         f"(0, 1)), got {text!r}")
    return parsed, cli.number_arg(number)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_mutually_exclusive_group()
    what.add_argument("--bits", type=_bits, default=None,
                      help="keep the top BITS of each float32 pattern (default 16)")
    what.add_argument("--format", default=None, type=cli.number_arg,
                      help="round to a number format instead: e4m3, e5m2, e3m2, e2m3, e2m1, eXmY, "
                           "or integers: int8, int4, uint8, int8:asym, ...")
    p.add_argument("--scale", default="tensor", choices=["tensor", "row", "none", "tensor-pow2",
                                                         "row-pow2", "block32"],
                   help="scaling for formats (default: tensor; block32: OCP MX)")
    p.add_argument("--range", default="minmax", type=_range, metavar="{minmax,percentile:Q,lsq}",
                   help="where a scale's range comes from (default: minmax)")
    p.add_argument("--lsq-refit", type=cli.epochs_arg, default=0, metavar="N",
                   help="with --range lsq: fit the learned steps again on each of the first N "
                        "epochs (fxquant.refit_steps), then learn them (default: first only)")
    p.add_argument("--momentum", type=cli.fraction_arg, default=None,
                   help="formats with --scale tensor: running range for eval, the old range's "
                        "weight (QuantConfig's decay=)")
    p.add_argument("--sites", type=cli.sites_arg, default=["output"], metavar="SITES",
                   help="comma list of output,input,weight,message,aggregate, or all "
                        "(default: output)")
    p.add_argument("--protect", type=cli.protect_arg, default=None, metavar="P_MIN:P_MAX",
                   help="Degree-Quant protection: nodes stay at full precision in training "
                        "with a probability from P_MIN to P_MAX, growing with in-degree")
    p.add_argument("--model", default="gcn", choices=list(MODELS),
                   help="gcn: PyG's examples/gcn.py; gin / gat: PyG's models.GIN / GAT (gat: "
                        "8 heads of one channel; gat64: 8 heads of 8, as in PyG's "
                        "examples/gat.py)")
    p.add_argument("--layers", type=_names, default=None,
                   help="comma-separated layers to round after (default: both convs)")
    p.add_argument("--rounding", default=None, choices=[*ROUNDINGS, "all"],
                   help="rounding mode or 'all' (default: the op's; all rounding modes in a "
                        "sweep of bit widths)")
    p.add_argument("--message-rounding", default=None, choices=list(ROUNDINGS),
                   help="with 'message' among --sites: round the messages this way instead "
                        "(stochastic: a node's sum of many small messages stays right on "
                        "average, e.g. GAT's)")
    p.add_argument("--eval-rng", default="shared", choices=list(training.EVAL_RNG),
                   help="fork: evaluate under torch.random.fork_rng, so that what evaluation "
                        "draws (stochastic rounding) leaves training's dropout masks alone; "
                        "shared (default): evaluation advances the generator training draws "
                        "from")
    p.add_argument("--grad", default="ste", choices=["ste", "zero"],
                   help="ste: straight-through gradient; zero: the true (zero) derivative")
    p.add_argument("--seeds", type=int, default=5, help="seeds per configuration (default 5)")
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dataset", default="Cora", choices=list(PLANETOID_NAMES))
    p.add_argument("--root", default=None, help="data folder (default: $FXQUANT_DATA)")
    p.add_argument("--super-nodes", type=_super_nodes, default=None, metavar="FRACTION:BITS",
                   help="the top in-degree FRACTION of nodes keeps BITS (or a format) instead")
    p.add_argument("--sweep", type=_number_list, default=None, metavar="32,16,...|e4m3,...",
                   help="train at each bit width and/or format")
    p.add_argument("--plot", default=None, metavar="PNG", help="with --sweep: accuracy vs bits")
    p.add_argument("--json", default=None, metavar="PATH", help="write all results as JSON")
    p.add_argument("--from-json", nargs="+", default=None, metavar="PATH",
                   help="no training: table and --plot from earlier --json files (merged)")
    args = p.parse_args(argv)
    cli.refuse_counts(p, args, "seeds", "epochs")
    if args.sweep and (args.bits is not None or args.format is not None):
        flag = "--bits" if args.bits is not None else "--format"
        p.error(f"{flag} with --sweep: the sweep's widths and formats are the ones trained, so "
                f"{flag} would be ignored; please add it to --sweep instead")
    if args.plot and not (args.sweep or args.from_json):
        p.error("--plot needs --sweep or --from-json")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available here")
    numbers = args.sweep or [args.format or args.bits or 16]
    if args.protect is not None and args.sites == ["weight"]:
        p.error("--protect needs a site that belongs to nodes (input, message, aggregate, output)")
    _check_combinations(p, args, numbers)
    cli.refuse_unwritable(p, args, "--json", "--plot")
    return args


def _check_combinations(p: argparse.ArgumentParser, args: argparse.Namespace,
                        numbers: list[int | str]) -> None:
    """Flags that would be ignored or fail only after training has started: a usage error
    naming the flag, before any work."""
    if args.from_json:  # (--dataset names the plot)
        cli.refuse_training_flags(p, args, keep=("dataset",) if args.plot else ())
        cli.refuse_results_files(p, args.from_json, ("name", "accs"), "train_cora.py",
                                      one_subject=True)
        return
    if args.rounding == "all" and not any(isinstance(n, int) for n in numbers):
        p.error("--rounding all runs each rounding mode of top-N bit widths (--bits, --sweep); "
                "the formats here would each run once, so please give one --rounding MODE")
    if args.super_nodes is not None and not set(args.sites) & NODE_SITES:
        p.error("--super-nodes gives nodes other bits at node sites (input, message, "
                f"aggregate, output); with --sites {','.join(args.sites)} it would be ignored")
    if not any(isinstance(n, str) for n in numbers):  # (only formats have a scale)
        for flag, given in (("--scale", args.scale != "tensor"), ("--range", args.range != "minmax"),
                            ("--momentum", args.momentum is not None)):
            if given:
                p.error(f"{flag} sets the scale of a format; with --bits (top-N truncation) "
                        f"there is none, so it would be ignored. Please drop {flag} or use "
                        "--format.")
    if args.message_rounding is not None and "message" not in args.sites:
        p.error("--message-rounding rounds the messages; without 'message' in --sites none "
                "are rounded, so it would be ignored. Please add it (e.g. --sites all).")
    if args.lsq_refit and args.range != "lsq":
        p.error("--lsq-refit refits learned steps; without --range lsq there are none, so it "
                "would be ignored. Please drop it or pass --range lsq.")
    if args.super_nodes is not None and args.model != "gcn" and not args.layers:
        p.error("--super-nodes names conv1/conv2 of the GCN; with --model gin/gat/gat64 please "
                "also pass --layers convs.0,convs.1")
    cli.refuse_idle_eval_rng(p, args.eval_rng, configs_for(args)[1:])
    # What a configuration may be is the config's to say: each row's config, built one flag
    # at a time, then the mapping and the transformed stand-in of the same model.
    graph = Data(edge_index=torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]), num_nodes=4)
    model = training.make_model(args.model, 8, 3)
    number_flag = "--sweep" if args.sweep else "--format" if args.format else "--bits"
    for cfg in configs_for(args)[1:]:
        for site in cfg.sites:
            number, settings = site_settings(cfg, site)
            cli.config_from_flags(p, (number_flag, number), *settings)
        mapping = cli.guarded(p, "--super-nodes", partial(mapping_for, cfg, graph))
        cli.guarded(p, "--layers" if args.layers else "--sites",
                    partial(fxquant.transform, model, mapping, lint="off"))


def configs_for(args: argparse.Namespace) -> list[Config]:
    numbers: list[int | str] = args.sweep or [args.format or args.bits or 16]
    common = {"grad": args.grad, "layers": args.layers, "super_nodes": args.super_nodes,
              "sites": args.sites, "protect": args.protect,
              "message_rounding": args.message_rounding}
    configs = [Config("FP32", None)]
    has_bits = any(isinstance(n, int) for n in numbers)
    if args.rounding == "all" or (args.rounding is None and args.sweep and has_bits):
        roundings: tuple[str | None, ...] = ROUNDINGS
    else:
        roundings = (args.rounding,)
    scale = None if args.scale == "none" else args.scale
    for r in roundings:
        configs += [Config(f"top-{n}", n, r, **common) for n in numbers if isinstance(n, int)]
    for n in numbers:
        if isinstance(n, str):
            label = args.scale + (f", {args.range}" if args.range != "minmax" else "")
            configs.append(Config(f"{n} ({label})", n, None if args.rounding == "all"
                                  else args.rounding, scale=scale, momentum=args.momentum,
                                  range=args.range, **common))
    return configs


def plot(configs: list[Config], path: str, dataset: str) -> None:
    """Accuracy against bits per value: one line per top-N rounding mode, one per scaling mode
    of the formats (through the best format of each width, every format marked and named)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.4), dpi=110)
    fp32 = next(c for c in configs if c.number is None)
    ax.axhline(100 * statistics.mean(fp32.accs), color="black", linestyle="--", linewidth=1,
               label=f"FP32 ({100 * statistics.mean(fp32.accs):.1f}%)")

    def stats(c: Config) -> tuple[float, float]:
        std = statistics.stdev(c.accs) if len(c.accs) > 1 else 0.0
        return 100 * statistics.mean(c.accs), 100 * std

    for rounding in ROUNDINGS:
        rows = sorted((c for c in configs if c.kind == "top" and c.rounding_label == rounding),
                      key=lambda c: c.bits)
        if rows:
            ys, es = zip(*map(stats, rows), strict=True)
            ax.errorbar([c.bits for c in rows], ys, yerr=es, marker="o", markersize=4, capsize=2,
                        linewidth=1.2, label=f"top-N bits of float32, {rounding}")
    for scale in sorted({c.scale or "none" for c in configs if c.kind == "format"}):
        rows = [c for c in configs if c.kind == "format" and (c.scale or "none") == scale]
        widths = sorted({c.bits for c in rows})
        best = [max((c for c in rows if c.bits == w), key=lambda c: stats(c)[0]) for w in widths]
        ys, es = zip(*map(stats, best), strict=True)
        line = ax.errorbar(widths, ys, yerr=es, marker="s", markersize=5, capsize=2,
                           linewidth=1.6, label=f"minifloat formats, {scale} scale (best per width)")
        color = line[0].get_color()
        for c in rows:
            y = stats(c)[0]
            ax.scatter([c.bits], [y], s=18, facecolors="none", edgecolors=color, zorder=3)
            ax.annotate(str(c.number), (c.bits, y), textcoords="offset points",
                        xytext=(-14 if scale == "row" else 5, -3), fontsize=6.5, color=color)
    ax.set_xscale("log", base=2)
    ticks = sorted({c.bits for c in configs})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("bits per value (after both GCN layers)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"GCN on {dataset}: {len(fp32.accs)} seeds, mean +- std")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)


def load_results(paths: Sequence[str]) -> list[Config]:
    """Configs from earlier --json runs; one FP32 line (the first file's) for all of them."""
    configs: list[Config] = []
    names = {f.name for f in fields(Config)}
    for path in paths:
        with open(path) as f:
            for r in json.load(f)["results"]:
                if "number" not in r:  # files written before formats existed
                    r = {**r, "number": r.get("bits"), "rounding": r.get("rounding")
                         if r.get("bits") is not None else None}
                cfg = Config(**{k: v for k, v in r.items() if k in names})
                if cfg.super_nodes is not None:
                    cfg.super_nodes = tuple(cfg.super_nodes)  # type: ignore[assignment]
                if cfg.protect is not None:
                    cfg.protect = tuple(cfg.protect)  # type: ignore[assignment]
                if cfg.number is None and any(c.number is None for c in configs):
                    continue
                configs.append(cfg)
    return configs


def report(configs: list[Config], args: argparse.Namespace) -> None:
    headers = ["config", "bits", "rounding", "scale", "sites", "protect", "grad", "test acc (%)",
               "vs FP32 (pt, 95% CI)", "median epoch (ms)"]
    fp32 = next((c for c in configs if c.number is None), None)
    rows = []
    for c in configs:
        row = c.row()
        difference = paired(c.accs, fp32.accs) if fp32 is not None and c is not fp32 else None
        row.insert(-1, str(difference or "-"))
        rows.append(row)
    print(tabulate(rows, headers=headers, tablefmt="github"))
    for rounding in ROUNDINGS:
        tops = [c for c in configs if c.kind == "top" and c.rounding_label == rounding]
        if len(tops) > 1:
            below = sorted((c.bits for c in tops if 100 * statistics.mean(c.accs) < 80.0),
                           reverse=True)
            print(f"top-N, {rounding}: under 80% at bits {below or 'none'}")


def write_plot(configs: list[Config], args: argparse.Namespace) -> None:
    if args.plot:
        plot(configs, args.plot, args.dataset)
        print(f"plot written to {args.plot}")


def main(argv: Sequence[str] | None = None) -> list[Config]:
    args = parse_args(argv)
    if args.from_json:
        configs = load_results(args.from_json)
        report(configs, args)
        write_plot(configs, args)
        return configs
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else "cpu" if args.device == "auto" else args.device)
    data, num_classes = training.load_data(args.dataset, args.root, "train_cora.py")
    data = data.to(device)
    configs = configs_for(args)

    example = next(c for c in configs if c.number is not None)
    gm = build(example, data, num_classes, seed=0, model_kind=args.model)
    print(f"{args.dataset}: {data.num_nodes} nodes, {data.num_edges} edges, device {device}, "
          f"model {args.model}")
    print(f"\nTransformed graph ({example.name}):\n"
          + fxquant.summary(gm, data.x, data.edge_index) + "\n")
    print("Lint of the transformed graph on the real data:\n"
          + str(fxquant.lint(gm, data.x, data.edge_index)) + "\n")

    runs = tqdm(total=len(configs) * args.seeds, desc="runs", unit="run", file=sys.stderr,
                dynamic_ncols=True)
    for cfg in configs:
        for seed in range(args.seeds):
            model = build(cfg, data, num_classes, seed, args.model)
            desc = f"{cfg.name} {cfg.rounding_label} seed {seed}"
            run = fxquant.recipes.QuantTraining(model, refit_epochs=args.lsq_refit) \
                if isinstance(model, torch.fx.GraphModule) else None
            result = training.fit(model, data, args.epochs, run=run, desc=desc, device=device,
                                  eval_rng=args.eval_rng)
            cfg.accs.append(result.test)
            cfg.vals.append(result.val)
            cfg.epoch_ms.extend(result.epoch_ms)
            runs.update()
            runs.write(f"{desc}: test {100 * result.test:.1f}%", file=sys.stderr)
    runs.close()

    report(configs, args)
    if args.json:
        payload = {"args": vars(args), "device": str(device), "torch": torch.__version__,
                   "model": args.model, "dataset": args.dataset,
                   "results": [{**asdict(c), "bits": c.bits} for c in configs]}
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)
        print(f"results written to {args.json}")
    write_plot(configs, args)  # (after the results are safe)
    return configs


if __name__ == "__main__":
    main()
