"""Trace one training run of a ``dq_table.py`` row, epoch by epoch: where a row fails.

    python -m experiments.trace_training --model gat --dataset CiteSeer --row int4-lsq-ps \\
        --seed 3 --lsq-refit 30 --float-epochs 30
    python -m experiments.trace_training --model gat --dataset CiteSeer --row int4-lsq-ps \\
        --seed 3 --lsq-refit 100 --refit-widen --float-epochs 30 --json trace.json

Trains the row with :func:`experiments.training.fit` (the table's protocol: same model, seed,
optimizer and epochs) and prints, every ``--every`` epochs and at the reported one: the
training loss, the validation and test accuracy of the evaluation, the training nodes'
accuracy in that evaluation, the mean absolute logit, and the share of nodes whose two
largest logits are equal (``ties``: rounded logits on a coarse grid, which ``argmax``
resolves to the first class), and how many output channels of the first rounded weight
(the first layer's, e.g. one per attention head of a GAT with one channel per head) rounded
to all zeros (``zero channels``: a channel that gives nothing forward and, through the next
layer's rounded weights, often gets no gradient back). ``--refit-widen`` and ``--step-lr``
set the :class:`fxquant.recipes.QuantTraining` settings of the same names, which the table
does not expose; ``--eval-rng`` is ``dq_table.py``'s.

    python -m experiments.trace_training --recipe recommended --target-bits 2 --dataset Cora \\
        --seed 3 --steps

``--recipe NAME`` traces one of :func:`fxquant.recipes.get`'s recipes instead of a table
row (its own settings; ``--target-bits`` for the per-node bit recipes), prepared and
trained as ``experiments.bits_pareto`` does. For every point with a learned step the run
also records, each epoch, the step and, in the evaluation, the share of values beyond the
grid's edge (``clipped``: more than half a step past the grid's top level or, signed grids,
its lowest; an unsigned grid's zeroed negatives are not counted) with the largest value and
the largest rounded one (in the JSON, ``points`` of each epoch); ``--steps`` prints them
at the epoch the steps are fitted, the reported one and the last.
"""

from __future__ import annotations

import argparse
import json
import math
import warnings
from dataclasses import fields
from typing import Any

import torch

import fxquant
from experiments import cli, dq_table, train_cora, training
from fxquant.datasets import PLANETOID_NAMES


def trace(model_kind: str, dataset: str, row: str | None, seed: int, *, epochs: int = 200,
          lsq_refit: int = 0, float_epochs: int = 0, refit_widen: bool = False,
          step_lr: float | None = None, protect: tuple[float, float] = (0.0, 0.2),
          root: str | None = None, recipe: str | None = None,
          target_bits: float | None = None, eval_rng: str = "shared") -> dict[str, Any]:
    """One run of ``row`` (or of ``recipe``); every epoch's numbers and the reported epoch."""
    data, num_classes = training.load_data(dataset, root, "trace_training")
    if recipe is not None:  # prepared as bits_pareto.py prepares its recipes
        built = fxquant.recipes.get(recipe, **({} if target_bits is None
                                               else {"target_bits": target_bits}))
        # a distilling recipe's teacher first, as bits_pareto.py trains its FP32 runs first
        teacher = training.teacher_logits(model_kind, data, num_classes, seed, epochs) \
            if built.training().get("distill") else None
        torch.manual_seed(seed)
        plain = training.make_model(model_kind, data.num_features, num_classes)
        # (its warnings show: hub-messages saying it lowered its quantile to fit the budget)
        run = built.prepare(plain, data, lint="off")
        if teacher is not None:
            run.set_teacher(teacher)
        model: torch.nn.Module = run.model
        float_epochs = run.float_epochs
    else:
        assert row is not None
        cfg = dq_table.rows(protect)[row]
        model = train_cora.build(cfg, data, num_classes, seed, model_kind)
        settings = dict(refit_epochs=lsq_refit, float_epochs=float_epochs,
                        refit_widen=refit_widen, step_lr=step_lr) \
            if isinstance(model, torch.fx.GraphModule) else {}
        run = fxquant.recipes.QuantTraining(model, **settings)  # type: ignore[arg-type]
    rows: list[dict[str, Any]] = []
    steps = StepTrace(model)
    zeros = ZeroChannels(model)

    def record(epoch: int, loss: float, logits: torch.Tensor) -> None:
        pred = logits.argmax(dim=-1)

        def acc(mask: torch.Tensor) -> float:
            return float((pred[mask] == data.y[mask]).float().mean())

        top2 = logits.topk(2, dim=-1).values
        rows.append({"epoch": epoch, "loss": loss, "val": acc(data.val_mask),
                     "test": acc(data.test_mask), "train": acc(data.train_mask),
                     "abs_logit": float(logits.abs().mean()),
                     "ties": float((top2[:, 0] == top2[:, 1]).float().mean()),
                     **zeros.take(),
                     **({"points": steps.take()} if steps.hooks else {})})

    try:
        result = training.fit(model, data, epochs, run=run, progress=False, on_epoch=record,
                              eval_rng=eval_rng)
    finally:
        steps.remove()
        zeros.remove()
    reported = run.best.epoch if run.best is not None else None
    payload: dict[str, Any] = {"model": model_kind, "dataset": dataset, "row": row, "seed": seed,
               "epochs": epochs, "lsq_refit": lsq_refit, "float_epochs": float_epochs,
               "refit_widen": refit_widen, "step_lr": step_lr, "eval_rng": eval_rng,
               "reported_epoch": reported,
               "val": result.val, "test": result.test, "trace": rows,
               "torch": torch.__version__}
    if recipe is not None:
        used: Any = run.recipe  # the settings it ran with (hub-messages may lower its quantile)
        payload.update(recipe={"name": used.name, "settings": {
            f.name: getattr(used, f.name) for f in fields(used)}} if used else {"name": recipe},
            lsq_refit=None, refit_widen=None, step_lr=None)
    return payload


def code_range(bits: torch.Tensor, number: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(qmin, qmax)`` of each row's ``bits``-bit grid of the integer format ``number``'s
    kind: signed symmetric ``-(2**(b-1) - 1) .. 2**(b-1) - 1``, signed mid-rise one code
    more below, unsigned ``0 .. 2**b - 1``."""
    qmax = 2 ** (bits - 1) - 1 if number.signed else 2 ** bits - 1
    qmin = (-qmax - 1 if number.midrise else -qmax) if number.signed else qmax * 0
    return qmin, qmax


class _EvaluationHooks:
    """Forward hooks that record what evaluations show: :meth:`take` hands the last one's
    record over and starts the next; :meth:`remove` takes the hooks off."""

    seen: dict[str, Any]
    hooks: list[Any]

    def take(self) -> dict[str, Any]:
        seen, self.seen = self.seen, {}
        return seen

    def remove(self) -> None:
        for handle in self.hooks:
            handle.remove()


class StepTrace(_EvaluationHooks):
    """Forward hooks on the model's points with a learned step: in each evaluation, the
    step, the share of values beyond the grid's edge (more than half a step past its top
    level or, signed grids, its lowest; each row's own grid with per-node bit-widths), the
    largest value and the largest rounded one (:meth:`take` hands them over and starts the
    next epoch's)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.seen: dict[str, dict[str, float]] = {}
        self.hooks = [point.register_forward_hook(self._hook(name))
                      for name, point in model.named_modules()
                      if isinstance(point, fxquant.QuantPoint) and point.log_step is not None]

    def _hook(self, name: str) -> Any:
        def hook(point: Any, args: tuple[Any, ...], out: Any) -> None:
            x = args[0] if args else None
            if point.training or not isinstance(x, torch.Tensor) or not isinstance(
                    out, torch.Tensor) or not x.is_floating_point() or x.numel() == 0:
                return
            step = float(point.log_step.detach().exp())
            number = point.config.format
            with torch.no_grad():
                x, y = x.detach().float(), out.detach().float()
                qmin, qmax = number.qmin, number.qmax
                widths = point.__dict__.get("last_widths")
                if point.config.node_bits is not None and widths is not None:
                    bits = widths[0].detach().float().view((-1,) + (1,) * (x.dim() - 1))
                    qmin, qmax = code_range(bits, number)  # each row's own grid
                # in codes: more than half a step past the top level (or the lowest, signed
                # grids), whichever way the point rounds (nearest or stochastic)
                u = x / step - number.offset
                past = (u > qmax + 0.5) | ((u < qmin - 0.5) if number.signed else False)
                self.seen[name] = {"step": step, "clipped": float(past.float().mean()),
                                   "max_abs": float(x.abs().max()),
                                   "grid_max_abs": float(y.abs().max())}
        return hook


class ZeroChannels(_EvaluationHooks):
    """A forward hook on the model's first rounded two-dimensional weight (in module order:
    the first layer's): in each evaluation, how many of its output channels (rows) rounded
    to all zeros, and of how many (:meth:`take` hands them over)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.seen: dict[str, Any] = {}
        first = next((point for point in model.modules() if isinstance(point, fxquant.QuantPoint)
                      and point.site is fxquant.Site.WEIGHT and point.tensor is not None
                      and _weight_dims(model, point) == 2), None)
        self.hooks = [first.register_forward_hook(self._hook)] if first is not None else []
        self.name = first.name if first is not None else None

    def _hook(self, point: torch.nn.Module, args: tuple[Any, ...], out: Any) -> None:
        if point.training or not isinstance(out, torch.Tensor) or out.dim() != 2:
            return
        self.seen = {"zero_channels": int((out.detach() == 0).all(dim=1).sum()),
                     "channels": out.shape[0], "zero_channels_of": self.name}


def _weight_dims(model: torch.nn.Module, point: fxquant.QuantPoint) -> int:
    """The number of dimensions of the parameter a weight point rounds (0 if not found)."""
    target = f"{point.layer}.{point.tensor}" if point.layer else str(point.tensor)
    param = dict(model.named_parameters()).get(target)
    return param.dim() if param is not None else 0


def table(payload: dict[str, Any], every: int) -> str:
    lines = ["| epoch | training loss | val | test | train (eval) | mean abs logit | ties "
             "| zero channels |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    last = len(payload["trace"]) - 1
    for r in payload["trace"]:
        e = r["epoch"]
        if e % every and e != payload["reported_epoch"] and e != last \
                and e != payload["float_epochs"]:
            continue
        mark = " (reported)" if e == payload["reported_epoch"] else ""
        lines.append(f"| {e}{mark} | {r['loss']:.3f} | {100 * r['val']:.1f} | "
                     f"{100 * r['test']:.1f} | {100 * r['train']:.1f} | {r['abs_logit']:.4f} "
                     f"| {100 * r['ties']:.1f}% | "
                     + (f"{r['zero_channels']} of {r['channels']} |" if "channels" in r
                        else "- |"))
    return "\n".join(lines)


def step_table(payload: dict[str, Any]) -> str:
    """The learned steps at the epoch they are fitted (the first trained rounded), the
    reported one and the last, in epoch order."""
    trace = payload["trace"]
    last = len(trace) - 1
    fitted = min(payload["float_epochs"], last)
    labels: dict[int, list[str]] = {}
    for label, epoch in (("fitted", fitted), ("reported", payload["reported_epoch"]),
                         ("last", last)):
        if epoch is not None:
            labels.setdefault(epoch, []).append(label)
    epochs = sorted(labels)
    names = list(trace[-1].get("points", {}))
    lines = ["| point | " + " | ".join(f"step, {' and '.join(labels[e])} (epoch {e})"
                                      for e in epochs)
             + " | clipped (reported) | largest value / largest rounded (reported) |",
             "| --- " * (len(epochs) + 3) + "|"]
    at = trace[payload["reported_epoch"] if payload["reported_epoch"] is not None else -1]
    for name in names:
        found = [trace[e].get("points", {}).get(name) for e in epochs]
        now = at.get("points", {}).get(name)
        lines.append(f"| {name} | " + " | ".join(f"{p['step']:.3g}" if p else "-" for p in found)
                     + (f" | {100 * now['clipped']:.2f}% | {now['max_abs']:.3g} / "
                        f"{now['grid_max_abs']:.3g} |" if now else " | - | - |"))
    reported = payload["reported_epoch"]
    if reported is not None and reported < payload["float_epochs"]:
        lines.append(f"\nThe reported epoch {reported} trained in float32: its evaluation "
                     "rounded with the placeholder steps (1), fitted only at epoch "
                     f"{payload['float_epochs']}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=list(training.MODELS), default="gcn")
    p.add_argument("--dataset", default="Cora", choices=list(PLANETOID_NAMES))
    p.add_argument("--row", default=None, help="a dq_table.py row key (default: int4-lsq-p)")
    p.add_argument("--recipe", default=None, choices=fxquant.recipes.available(),
                   help="trace this fxquant.recipes recipe (its own settings) instead of a row")
    p.add_argument("--target-bits", type=float, default=None,
                   help="with --recipe: the budget of a per-node bit recipe")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--lsq-refit", type=cli.epochs_arg, default=0)
    p.add_argument("--float-epochs", type=cli.epochs_arg, default=0)
    p.add_argument("--refit-widen", action="store_true")
    p.add_argument("--step-lr", type=float, default=None)
    p.add_argument("--protect", type=cli.protect_arg, default=None,
                   help="P_MIN:P_MAX, as dq_table.py's --protect (default 0:0.2)")
    p.add_argument("--eval-rng", default="shared", choices=list(training.EVAL_RNG),
                   help="as dq_table.py's --eval-rng (fork: evaluation's random draws leave "
                        "training's dropout masks alone)")
    p.add_argument("--every", type=int, default=10, help="print every N-th epoch")
    p.add_argument("--steps", action="store_true",
                   help="also print each learned step (fitted, reported and last epoch) with "
                        "the share of values past its grid")
    p.add_argument("--root", default=None, help="dataset folder (default: $FXQUANT_DATA)")
    p.add_argument("--json", default=None, help="write every epoch's numbers here")
    args = p.parse_args(argv)
    if args.recipe is not None:
        _check_recipe(p, args)
    else:
        if args.target_bits is not None:
            p.error("--target-bits sets a recipe's budget; please give --recipe (the table's "
                    "rows have fixed formats)")
        args.row = args.row or "int4-lsq-p"
        _check_row(p, args)
    for flag in ("epochs", "every"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} must be at least 1")
    cli.refuse_unwritable(p, args, "--json")
    if args.recipe is None:
        cli.refuse_float_epochs_past_training(p, args)
    payload = trace(args.model, args.dataset, args.row, args.seed, epochs=args.epochs,
                    lsq_refit=args.lsq_refit, float_epochs=args.float_epochs,
                    refit_widen=args.refit_widen, step_lr=args.step_lr,
                    protect=args.protect or (0.0, 0.2), root=args.root, recipe=args.recipe,
                    target_bits=args.target_bits, eval_rng=args.eval_rng)
    what = args.row if args.recipe is None else f"recipe {args.recipe}"
    print(f"{args.model} on {args.dataset}, {what}, seed {args.seed}: validation "
          f"{100 * payload['val']:.1f}, test {100 * payload['test']:.1f} at epoch "
          f"{payload['reported_epoch']}")
    print(table(payload, args.every))
    if args.steps:
        print()
        print(step_table(payload) if any("points" in r for r in payload["trace"]) else
              "(no point with a learned step: nothing to list)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)
    return payload


def _check_recipe(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--recipe``: the row's flags would be ignored; ``--target-bits`` needs a recipe
    that has a budget, and one it can build."""
    for flag, given in (("--row", args.row is not None), ("--lsq-refit", args.lsq_refit),
                        ("--float-epochs", args.float_epochs),
                        ("--refit-widen", args.refit_widen),
                        ("--step-lr", args.step_lr is not None),
                        ("--protect", args.protect is not None),
                        ("--eval-rng", args.eval_rng != "shared")):
        if given:
            p.error(f"{flag} with --recipe: the recipe trains with its own settings, so it "
                    "would be ignored (leave it out, or trace a table row with --row)")
    recipe = fxquant.recipes.get(args.recipe)
    if args.target_bits is not None:
        if not hasattr(recipe, "target_bits"):
            p.error(f"--target-bits: the {args.recipe} recipe has no bit budget")
        if not (math.isfinite(args.target_bits) and args.target_bits > 0):
            p.error(f"--target-bits must be a finite number above 0, got {args.target_bits}")
        try:  # built on a stand-in graph and model, as bits_pareto.py checks its budgets
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fxquant.recipes.get(args.recipe, target_bits=args.target_bits).prepare(
                    training.make_model(args.model, 8, 3), training.stand_in_graph(),
                    lint="off")
        except fxquant.FxquantError as e:
            p.error(f"--target-bits {args.target_bits:g} with --recipe {args.recipe}: {e}")
    float_epochs = getattr(recipe, "float_epochs", 0)
    if float_epochs >= args.epochs:
        p.error(f"--epochs {args.epochs}: the {args.recipe} recipe trains its first "
                f"{float_epochs} epochs in float32, so nothing rounded would be traced")


def _check_row(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    known = dq_table.rows(args.protect or dq_table.DEFAULT_PROTECT)
    if args.row not in known:
        p.error(f"--row {args.row!r} is not a dq_table.py row; known: {sorted(known)}")
    cfg = known[args.row]
    if args.protect is not None and cfg.protect is None:
        p.error(f"--protect sets Degree-Quant's protection; the {args.row} row protects no "
                "nodes, so it would be ignored")
    args.protect = args.protect or dq_table.DEFAULT_PROTECT
    cli.refuse_idle_eval_rng(p, args.eval_rng, [cfg], f" (the {args.row} row)")
    if args.step_lr is not None and not (math.isfinite(args.step_lr) and args.step_lr > 0):
        p.error(f"--step-lr must be a finite number above 0, got {args.step_lr}")
    if cfg.number is None and args.float_epochs:
        p.error("--float-epochs sets how a quantized row trains; the fp32 row rounds nothing")
    learned = cfg.range == "lsq"
    for flag, given in (("--lsq-refit", args.lsq_refit), ("--refit-widen", args.refit_widen),
                        ("--step-lr", args.step_lr is not None)):
        if given and not learned:
            p.error(f"{flag} sets how learned steps train; the {args.row} row has none "
                    "(rows with range lsq: "
                    f"{sorted(k for k, c in known.items() if c.range == 'lsq')})")
    if args.refit_widen and args.lsq_refit <= args.float_epochs + 1:
        p.error("--refit-widen changes the refits after the first fit; with --lsq-refit "
                f"{args.lsq_refit} and --float-epochs {args.float_epochs} there are none, so "
                "it would be ignored: please give --lsq-refit above --float-epochs + 1")
    if "edge" in cfg.sites and cfg.recipe is None and args.model == "gin":
        p.error(f"--row {args.row} with --model gin: the row rounds the layers' per-edge "
                "arguments, and GINConv's messages take none")


if __name__ == "__main__":
    main()
