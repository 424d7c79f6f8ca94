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
- ``degree``: integers with a learned step and a bit-width per node from its in-degree
  (the bits follow from the graph: nothing stored). ``--degree-rule hubs-more`` (the
  default): higher in-degree, more bits; two levels whose node average is B: floor(B) and
  one more for the highest-degree fraction B - floor(B) of the nodes, or, for a whole B,
  B - 1 and B + 1 split at the median in-degree. ``--degree-rule hub-messages``: every
  site at floor(B) bits, except the messages into hubs (by default the top 10% by
  in-degree, ``--hub-quantile``), one
  bit fewer: a hub sums many messages, which averages their rounding errors out, and
  they hold a quarter of Cora's messages;
- ``learned``: A2Q-style learned bit-widths per node (with one learned step per site),
  pulled toward B by ``fxquant.bit_penalty`` added to the loss; a table per site, or one
  per layer or for the whole model (``--shared-bits``, ``fxquant.share_bits``);
- ``recommended``: ``fxquant.recipes.get("recommended")``, the per-node bit-width recipe
  chosen on the validation accuracy of Cora and CiteSeer jointly, with its chosen settings
  (``python -m experiments.select_bits``); it takes no flag but ``--target-bits``, ``--dataset``,
  ``--seeds``, ``--epochs``, ``--root`` and ``--json``, and its JSON says which recipe
  and settings ran (``recipe``).

Integer grids are unsigned at the layers' inputs (non-negative after ReLU) and at the
hidden layer's output (it feeds the ReLU, which zeroes what an unsigned grid clamps), and
signed elsewhere.

Bits are counted by :func:`fxquant.bit_report` (raw input features excluded from
``avg_bits``, reported as ``input_bits``; scales and stored bit-widths included) on the
evaluation that gave the reported accuracy (the best validation epoch). Seeds are
paired: FP32 and every method of one seed start from the same weights.

    python -m experiments.bits_pareto --method learned --target-bits 1.5,2,3,4 --seeds 5 \\
        --dataset Cora --json docs/results/bits_cora_learned.json
    python -m experiments.bits_pareto --method degree --degree-rule hub-messages \\
        --target-bits 2 --signed-grid midrise --shared-step --anneal 50 \\
        --last-aggregate-bits 4 --select budget --seeds 5 --dataset Cora \\
        --json docs/results/bits_cora_degree_hubs.json
    python -m experiments.bits_pareto --from-json docs/results/bits_cora_*.json \\
        --plot docs/results/bits_cora.png
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

import fxquant
from experiments import cli, training
from fxquant.datasets import PLANETOID_NAMES
from fxquant.recipes import HubMessages, LearnedBits, QuantTraining

METHODS = ("topn", "format", "int", "degree", "learned", "recommended")
LSQ_METHODS = ("int", "degree", "learned")  # integer grids with a learned step
SITES = ("input", "message", "aggregate", "output")
#: minifloats by value bits, for the ``format`` method
FORMATS = {3: "e1m1", 4: "e2m1", 5: "e2m2", 6: "e2m3", 7: "e3m3", 8: "e4m3"}
SIGNED_GRIDS = ("midrise", "symmetric")
DEGREE_RULES = ("hubs-more", "hub-messages")
SHARED_BITS = ("none", "layer", "all")
#: fixed per-node bit-widths start this many bits above their final widths (``--anneal``)
ANNEAL_BITS = 2
#: the flags ``--method recommended`` takes (it runs its recipe's chosen settings)
RECOMMENDED_FLAGS = ("method", "target_bits", "seeds", "first_seed", "dataset", "epochs",
                     "root", "json", "from_json", "plot")
#: flags that only some methods read (the others would ignore them), by flag
METHOD_FLAGS: dict[str, tuple[str, ...]] = {
    "penalty": ("learned",), "bits_lr": ("learned",), "max_bits": ("learned",),
    "shared_bits": ("learned",), "degree_rule": ("degree",), "hub_quantile": ("degree",),
    "anneal": ("degree",), "anneal_refit": ("degree",), "signed_grid": LSQ_METHODS,
    "shared_step": LSQ_METHODS, "lsq_refit": LSQ_METHODS,
    "last_aggregate_bits": ("int", "degree"),
}


@dataclass(frozen=True)
class Options:
    """How every method's sites are set up and trained (the command line's flags)."""

    #: the raw input features' format[:scale]
    input_format: str = "uint1:row"
    #: also round the last layer's output (the logits)
    quantize_logits: bool = False
    #: weight of fxquant.bit_penalty in the loss (learned)
    penalty: float = 1.0
    #: the signed integer grid: "midrise" (2**b levels, no zero; 1 bit is the sign) or
    #: "symmetric" (2**b - 1 levels around 0, 2 bits at least)
    signed_grid: str = "symmetric"
    #: the widest learned bit-width (``NodeBits.max_bits``): fewer allowed widths, a
    #: shorter stored code per node (1 bit for 1..2)
    max_bits: int = 8
    #: learned: one bit-width table per layer ("layer") or for all sites ("all")
    #: (fxquant.share_bits); "none": a table per site
    shared_bits: str = "none"
    #: Adam's learning rate for learned bit-widths (the model's is 0.01)
    bits_lr: float = 0.01
    #: how ``degree`` assigns bits (see the module docstring)
    degree_rule: str = "hubs-more"
    #: hub-messages: the in-degree quantile above which a node is a hub
    hub_quantile: float = 0.9
    #: bits of the last layer's aggregation (the logits before the bias); None: as the rest
    last_aggregate_bits: int | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Options:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


DEFAULTS = Options()


def site_config(method: str, target: float, data: Any, unsigned: bool, message: bool = False,
                bits: int | None = None, opts: Options = DEFAULTS) -> fxquant.QuantConfig:
    """One site's config for ``method`` at budget ``target``; integer grids are unsigned
    where the values are non-negative (or about to be clamped at zero by a ReLU).
    ``message``: the site rounds messages (rows keyed by their target node); ``bits``: this
    site's bits instead of the budget's (``int``, ``degree``)."""
    n = data.num_nodes
    kind = "uint" if unsigned else "int"
    midrise = not unsigned and opts.signed_grid == "midrise"
    option = ":midrise" if midrise else ""
    lowest = 1 if unsigned or midrise else 2
    if method == "topn":
        return fxquant.QuantConfig(max(1, round(target)), "nearest")
    if method == "format":
        bits = max(3, min(8, math.floor(target - 2)))
        return fxquant.QuantConfig(FORMATS[bits], scale="row")
    if method == "int":
        bits = max(lowest, math.floor(target)) if bits is None else bits
        return fxquant.QuantConfig(f"{kind}{bits}{option}", scale="tensor", range="lsq")
    if method == "degree" and (opts.degree_rule == "hub-messages" or bits is not None):
        base = max(lowest, math.floor(target)) if bits is None else bits
        hub = max(lowest, base - 1) if message and bits is None else base
        rb = fxquant.NodeBits.by_degree(data.edge_index, [opts.hub_quantile], [base, hub],
                                       num_nodes=n, min_bits=lowest)
        return fxquant.QuantConfig(f"{kind}8{option}", scale="tensor", range="lsq", node_bits=rb)
    if method == "degree":
        low, fraction = math.floor(target), target - math.floor(target)
        levels, quantile = (low, low + 1), 1 - fraction
        if fraction == 0:
            levels, quantile = (low - 1, low + 1), 0.5
        levels = (max(lowest, levels[0]), max(lowest, levels[1]))
        rb = fxquant.NodeBits.by_degree(data.edge_index, [quantile], list(levels),
                                       num_nodes=n, min_bits=lowest)
        return fxquant.QuantConfig(f"{kind}8{option}", scale="tensor", range="lsq", node_bits=rb)
    if opts.shared_bits != "none":  # a shared table has one range: the signed grid's lowest
        lowest = 1 if opts.signed_grid == "midrise" else 2
    rb = fxquant.NodeBits.learned_init(n, init=min(float(opts.max_bits), target + 1.0),
                                      min_bits=lowest, max_bits=opts.max_bits)
    return fxquant.QuantConfig(f"{kind}8{option}", scale="tensor", range="lsq", node_bits=rb)


def mapping_for(method: str, target: float, data: Any, opts: Options = DEFAULTS
                ) -> fxquant.QuantMapping:
    mapping = fxquant.QuantMapping()
    for site in SITES:  # a layer's input is non-negative (after a ReLU)
        mapping.set_global(site_config(method, target, data, site == "input",
                                       message=site == "message", opts=opts), site=site)
    if opts.last_aggregate_bits is not None:
        mapping.set_name("conv2", site_config(method, target, data, False,
                                              bits=opts.last_aggregate_bits, opts=opts),
                         site="aggregate")
    # the hidden layer's output feeds a ReLU: an unsigned grid loses only what it zeroes
    mapping.set_name("conv1", site_config(method, target, data, True, opts=opts), site="output")
    mapping.set_name("conv1", fxquant.QuantConfig(opts.input_format), site="input")
    if not opts.quantize_logits:
        mapping.set_name("conv2", None, site="output")
    return mapping


def prepare(method: str, target: float, data: Any, model: torch.nn.Module,
            args: argparse.Namespace) -> QuantTraining:
    """The transformed model and what its training does around it: the hub-messages rule
    and learned bit-widths are fxquant's recipes; the other methods a mapping of their own
    (:func:`mapping_for`) with the same training options."""
    if method == "recommended":
        return fxquant.recipes.get("recommended", target_bits=target).prepare(model, data,
                                                                               lint="off")
    opts = Options.from_args(args)
    common = {"target_bits": target, "midrise": opts.signed_grid == "midrise",
              "shared_step": args.shared_step, "input_format": opts.input_format,
              "quantize_logits": opts.quantize_logits, "select": args.select,
              "refit_epochs": args.lsq_refit, "refit_widen": args.refit_widen}
    if method == "learned":
        return LearnedBits(penalty=opts.penalty, bits_lr=opts.bits_lr, max_bits=opts.max_bits,
                           shared_bits=opts.shared_bits, **common).prepare(model, data, lint="off")
    if method == "degree" and opts.degree_rule == "hub-messages":
        return HubMessages(hub_quantile=opts.hub_quantile,
                           last_aggregate_bits=opts.last_aggregate_bits,
                           anneal_every=args.anneal, anneal_bits=ANNEAL_BITS,
                           anneal_refit_epochs=args.anneal_refit,
                           fit_budget=False,  # the quantile as given (--hub-quantile)
                           **common).prepare(model, data, lint="off")
    gm = fxquant.transform(model, mapping_for(method, target, data, opts), lint="off")
    if method in LSQ_METHODS and args.shared_step:
        # the hidden output, rounded, then ReLU'd, is the next layer's input: one grid
        fxquant.share_step(gm, "conv2_input_quant", "conv1_quant")
    return QuantTraining(gm, refit_epochs=args.lsq_refit, refit_widen=args.refit_widen,
                         anneal_every=args.anneal,
                         anneal_bits=ANNEAL_BITS, anneal_refit_epochs=args.anneal_refit,
                         target_bits=target, select=args.select)


def _targets(text: str) -> list[float]:
    try:
        values = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--target-bits takes numbers, e.g. 1.5,2,3; got {text!r}") from None
    if not values or any(not 0 < v <= 32 for v in values):  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"--target-bits must lie in (0, 32] (average bits per "
                                         f"value), got {text!r}")
    twice = sorted({f"{v:g}" for v in values if values.count(v) > 1})
    if twice:  # (each would train twice, in two rows)
        raise argparse.ArgumentTypeError(f"{', '.join(twice)} given twice in {text!r}")
    return values


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What would be ignored, or fail only after the FP32 baselines have trained: a usage
    error naming the flag, before any work."""
    cli.refuse_unwritable(p, args, "--json", "--plot")
    if args.from_json:
        cli.refuse_training_flags(p, args)
        cli.refuse_results_files(p, args.from_json, ("method", "target_bits", "accs"),
                                      "bits_pareto.py")
        return
    defaults = p.parse_args([])
    if args.method == "recommended":
        given = [f"--{name.replace('_', '-')}" for name, value in vars(args).items()
                 if name not in RECOMMENDED_FLAGS and value != getattr(defaults, name)]
        if given:
            p.error(f"{', '.join(given)}: --method recommended runs its chosen settings, so "
                    "these would be ignored; please drop them")
    for name, methods in METHOD_FLAGS.items():
        if args.method not in methods and getattr(args, name) != getattr(defaults, name):
            p.error(f"--{name.replace('_', '-')} is read by --method {'/'.join(methods)}; "
                    f"--method {args.method} would ignore it: please drop it")
    if args.hub_quantile != defaults.hub_quantile and args.degree_rule != "hub-messages":
        p.error("--hub-quantile sets the hubs of --degree-rule hub-messages; with "
                f"--degree-rule {args.degree_rule} it would be ignored: please drop it")
    if args.anneal_refit and not args.anneal:
        p.error("--anneal-refit refits the steps after each annealing drop; without --anneal "
                "there are none, so it would be ignored: please give --anneal E too")
    if args.method == "format" and min(args.target_bits) < 5:
        p.error(f"--target-bits {min(args.target_bits):g} with --method format: a budget B "
                "leaves B - 2 value bits to the format, and the narrowest here (e1m1) has 3, "
                "so that row would run e1m1 over budget; please give budgets of 5 or more")
    try:
        fxquant.QuantConfig(args.input_format)
    except fxquant.FxquantError as e:
        p.error(f"--input-format {args.input_format!r}: {e}")
    if args.refit_widen and not (args.lsq_refit or args.anneal_refit):
        p.error("--refit-widen changes how refits fit the steps; please give --lsq-refit N "
                "or --anneal-refit R too (without refits it would be ignored)")
    # each budget, built on a stand-in graph and model
    graph = training.stand_in_graph()
    for target in args.target_bits:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                prepare(args.method, target, graph, training.make_model("gcn", 8, 3), args)
        except fxquant.FxquantError as e:
            p.error(f"--target-bits {target:g} with --method {args.method}: {e}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--method", choices=METHODS, default="learned")
    p.add_argument("--target-bits", type=_targets, default=[2.0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--first-seed", type=int, default=0, metavar="S",
                   help="run seeds S .. S + SEEDS - 1 (default 0); each seed's runs depend on "
                        "that seed alone, so a run split over several commands gives the same "
                        "numbers")
    p.add_argument("--dataset", default="Cora", choices=list(PLANETOID_NAMES))
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--penalty", type=_non_negative, default=DEFAULTS.penalty,
                   help="weight of fxquant.bit_penalty in the loss (learned; default "
                        f"{DEFAULTS.penalty:g})")
    p.add_argument("--quantize-logits", action="store_true",
                   help="also round the last layer's output (the logits; float32 by default)")
    p.add_argument("--input-format", default=DEFAULTS.input_format,
                   help="the raw input features' format, its scale after the last ':' "
                        "(default uint1:row; e.g. int8:asym:row)")
    p.add_argument("--signed-grid", choices=SIGNED_GRIDS, default=DEFAULTS.signed_grid,
                   help="signed integer sites: 'midrise' (2**b levels k + 1/2, no zero; "
                        "1 bit is the sign) or 'symmetric' (-(2**(b-1) - 1) .. 2**(b-1) - 1, "
                        "at least 2 bits) (default: symmetric)")
    p.add_argument("--shared-step", action="store_true",
                   help="the second layer's input rounds with the first layer's output step "
                        "(fxquant.share_step; int, degree, learned); by default each learns "
                        "its own")
    p.add_argument("--max-bits", type=int, default=DEFAULTS.max_bits,
                   help="learned bit-widths: the widest allowed (default 8); each node's "
                        "stored width costs ceil(log2(max - min + 1)) bits")
    p.add_argument("--shared-bits", choices=SHARED_BITS, default=DEFAULTS.shared_bits,
                   help="learned: one bit-width per node for each layer's sites ('layer') or "
                        "for every site ('all'; fxquant.share_bits), stored once; default "
                        "'none': a table per site")
    p.add_argument("--bits-lr", type=float, default=DEFAULTS.bits_lr,
                   help="learned: Adam's learning rate for the bit-widths (default "
                        f"{DEFAULTS.bits_lr:g})")
    p.add_argument("--degree-rule", choices=DEGREE_RULES, default=DEFAULTS.degree_rule,
                   help="degree: 'hubs-more' (higher in-degree, more bits; default) or "
                        "'hub-messages' (messages into the hubs one bit fewer)")
    p.add_argument("--hub-quantile", type=float, default=DEFAULTS.hub_quantile, metavar="Q",
                   help="hub-messages: nodes whose in-degree lies above this quantile of all "
                        f"in-degrees are hubs (default {DEFAULTS.hub_quantile:g}: the top 10%%)")
    p.add_argument("--last-aggregate-bits", type=int, default=None, metavar="N",
                   help="int, degree: N bits for the last layer's aggregation (the logits "
                        "before the bias) instead of the budget's")
    p.add_argument("--anneal", type=int, default=0, metavar="E",
                   help=f"degree: the per-node bit-widths start {ANNEAL_BITS} bits above "
                        "their final widths and drop by one every E epochs (default 0: off)")
    p.add_argument("--anneal-refit", type=int, default=0, metavar="R",
                   help="degree, with --anneal: fit the learned steps again on each of the "
                        "first R epochs after every drop (default 0: not again)")
    p.add_argument("--select", choices=("best-val", "budget"), default="best-val",
                   help="which epoch's model is reported: the best validation accuracy "
                        "(default), or the best among the epochs whose avg_bits is within "
                        "--target-bits (budget_met in the JSON says, per seed, whether one "
                        "was; learned and annealed bit-widths change from epoch to epoch)")
    p.add_argument("--lsq-refit", type=cli.epochs_arg, default=0, metavar="N",
                   help="fit the learned steps again on each of the first N epochs "
                        "(fxquant.refit_steps; default: on the first only)")
    p.add_argument("--refit-widen", action="store_true",
                   help="with --lsq-refit or --anneal-refit: refits never narrow a grid "
                        "(fxquant.refit_steps(widen=True))")
    p.add_argument("--root", default=None)
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--from-json", nargs="+", default=None, metavar="PATH",
                   help="no training: table (and --plot) from earlier --json files")
    p.add_argument("--plot", default=None, metavar="PNG")
    args = p.parse_args(argv)
    cli.refuse_counts(p, args, "epochs")
    cli.refuse_seeds(p, args)
    # the recipes' own checks of the settings they take, each naming its flag
    for flag, build in (("--bits-lr", lambda: LearnedBits(bits_lr=args.bits_lr)),
                        ("--max-bits", lambda: LearnedBits(max_bits=args.max_bits)),
                        ("--hub-quantile", lambda: HubMessages(hub_quantile=args.hub_quantile)),
                        ("--anneal", lambda: HubMessages(anneal_every=args.anneal)),
                        ("--anneal-refit",
                         lambda: HubMessages(anneal_refit_epochs=args.anneal_refit)),
                        ("--last-aggregate-bits",
                         lambda: HubMessages(last_aggregate_bits=args.last_aggregate_bits))):
        cli.guarded(p, flag, build)
    lowest = 1 if args.signed_grid == "midrise" else 2  # (the grid the flags' bits are on)
    for flag, bits in (("--max-bits", args.max_bits),
                       ("--last-aggregate-bits", args.last_aggregate_bits)):
        if bits is not None and bits < lowest:
            p.error(f"{flag} {bits}: a symmetric signed grid needs 2 bits at least (1 only "
                    "with --signed-grid midrise)")
    _check(p, args)
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    data, num_classes = training.load_data(args.dataset, args.root, "bits_pareto.py")
    fp32 = []
    teachers = {}  # a distilling recipe's teacher: the FP32 run of the same seed
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    for seed in seeds:
        torch.manual_seed(seed)
        model = training.make_model("gcn", data.num_features, num_classes)
        result = training.fit(model, data, args.epochs, progress=False)
        print(f"FP32 seed {seed}: {100 * result.test:.1f}", file=sys.stderr, flush=True)
        fp32.append(result.test)
        teachers[seed] = result
    results = []
    for target in args.target_bits:
        accs, reports, budget_met = [], [], []
        for seed in seeds:
            torch.manual_seed(seed)
            model = training.make_model("gcn", data.num_features, num_classes)
            quant = prepare(args.method, target, data, model, args)
            if quant.distill:
                quant.set_teacher(training.teacher_of(teachers[seed], seed))
            result = training.fit(quant.model, data, args.epochs, run=quant, progress=False)
            budgeted = args.select == "budget" or args.method == "recommended"
            met = result.within_budget and budgeted
            print(f"{args.method} {target} bits seed {seed}: {100 * result.test:.1f}"
                  + ("" if met or not budgeted else " (over budget)"),
                  file=sys.stderr, flush=True)
            assert result.bits is not None
            accs.append(result.test)
            reports.append(result.bits)
            budget_met.append(met)
        results.append({
            "method": args.method, "target_bits": target,
            "avg_bits": statistics.mean(r.avg_bits for r in reports),
            "input_bits": statistics.mean(r.input_bits for r in reports),
            "avg_bits_with_input": statistics.mean(r.avg_bits_with_input for r in reports),
            "histogram": reports[0].histogram, "accs": accs, "fp32_accs": fp32,
            "budget_met": budget_met, "avg_bits_per_seed": [r.avg_bits for r in reports],
        })
    payload = {"dataset": args.dataset, "model": "gcn", "sites": list(SITES),
               "epochs": args.epochs, "lsq_refit": args.lsq_refit,
               "refit_widen": args.refit_widen,
               "penalty": args.penalty, "select": args.select, "signed_grid": args.signed_grid,
               "shared_step": args.shared_step, "max_bits": args.max_bits,
               "shared_bits": args.shared_bits, "bits_lr": args.bits_lr,
               "degree_rule": args.degree_rule, "hub_quantile": args.hub_quantile,
               "anneal": args.anneal, "anneal_refit": args.anneal_refit,
               "last_aggregate_bits": args.last_aggregate_bits,
               "torch": torch.__version__, "fp32_accs": fp32, "results": results}
    if args.first_seed:
        payload["first_seed"] = args.first_seed
    if args.method == "recommended":  # what ran is the recipe's, not the flags' defaults
        recipe: Any = fxquant.recipes.get("recommended")  # (a HubMessages)
        settings = {f.name: getattr(recipe, f.name) for f in fields(recipe)
                    if f.name != "target_bits"}
        payload.update(recipe={"name": recipe.name, "settings": settings},
                       select=recipe.select, shared_step=recipe.shared_step,
                       signed_grid="midrise" if recipe.midrise else "symmetric",
                       lsq_refit=recipe.refit_epochs)
        for key in ("max_bits", "shared_bits", "bits_lr", "hub_quantile"):
            if key in settings:
                payload[key] = settings[key]
        if "anneal_every" in settings:
            payload["anneal"] = settings["anneal_every"]
        payload["anneal_refit"] = settings.get("anneal_refit_epochs", 0)
        payload["refit_widen"] = settings.get("refit_widen", False)
        if "last_aggregate_bits" in settings:
            payload["last_aggregate_bits"] = settings["last_aggregate_bits"]
        payload["penalty"] = settings.get("penalty", 0.0)
    return payload


def _label(payload: dict[str, Any], method: str) -> str:
    """The curve's name: the method, and the grid options when not the defaults."""
    if method == "recommended":
        return f"recommended ({payload.get('recipe', {}).get('name', '?')}, within budget)"
    grid = payload.get("signed_grid", "symmetric")  # files from before the option: symmetric
    extra = [grid] if grid != "symmetric" else []
    if payload.get("shared_step") and method in LSQ_METHODS:
        extra.append("shared step")
    if method == "learned" and payload.get("penalty", DEFAULTS.penalty) != DEFAULTS.penalty:
        extra.append(f"penalty {payload['penalty']:g}")
    if method == "learned" and payload.get("max_bits", 8) != 8:
        extra.append(f"max {payload['max_bits']} bits")
    if method == "learned" and payload.get("shared_bits", "none") != "none":
        extra.append(f"bits shared per {payload['shared_bits'].replace('all', 'model')}")
    if method == "learned" and payload.get("bits_lr", DEFAULTS.bits_lr) != DEFAULTS.bits_lr:
        extra.append(f"bits lr {payload['bits_lr']:g}")
    if method == "degree" and payload.get("degree_rule", "hubs-more") != "hubs-more":
        extra.append(payload["degree_rule"])
        if payload.get("hub_quantile", DEFAULTS.hub_quantile) != DEFAULTS.hub_quantile:
            extra.append(f"hubs above quantile {payload['hub_quantile']:g}")
    if payload.get("last_aggregate_bits") is not None:
        extra.append(f"last aggregate {payload['last_aggregate_bits']} bits")
    if payload.get("anneal"):
        extra.append(f"anneal {payload['anneal']}")
        if payload.get("anneal_refit"):
            extra.append(f"refit {payload['anneal_refit']} after each drop")
    if payload.get("select") == "budget":
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
    fig, axes = plt.subplots(1, len(datasets), figsize=(7 * len(datasets), 7.5), squeeze=False)
    # (tab20 is a ListedColormap: its 20 colors)
    colors = plt.get_cmap("tab20").colors  # type: ignore[attr-defined]
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
        ordered = sorted(by_method, key=lambda m: (METHODS.index(m.split()[0]), m))
        for i, method in enumerate(ordered):
            points = sorted(by_method[method])
            if points:
                ax.errorbar([b for b, _, _ in points], [a for _, a, _ in points],
                            yerr=[s for _, _, s in points], marker="o", capsize=3, label=method,
                            color=colors[2 * (i % 10) + i // 10 % 2])
        if fp32:
            ax.axhline(100 * statistics.mean(fp32), color="gray", ls="--", label="FP32")
        ax.set(xlabel="average bits per value (raw input excluded, storage included)",
               ylabel="test accuracy (%)", title=f"GCN on {name}, all activations quantized")
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=max(0, ax.get_ylim()[0]))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.14))
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
