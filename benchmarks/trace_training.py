"""Trace one training run of a ``dq_table.py`` row, epoch by epoch: where a row fails.

    python -m benchmarks.trace_training --model gat --dataset CiteSeer --row int4-lsq-ps \\
        --seed 3 --lsq-refit 30 --float-epochs 30
    python -m benchmarks.trace_training --model gat --dataset CiteSeer --row int4-lsq-ps \\
        --seed 3 --lsq-refit 100 --refit-widen --float-epochs 30 --json trace.json

Trains the row with ``examples/training.py``'s loop (the table's protocol: same model, seed,
optimizer and epochs) and prints, every ``--every`` epochs and at the reported one: the
training loss, the validation and test accuracy of the evaluation, the training nodes'
accuracy in that evaluation, the mean absolute logit, and the share of nodes whose two
largest logits are equal (``ties``: rounded logits on a coarse grid, which ``argmax``
resolves to the first class). ``--refit-widen`` and ``--step-lr`` set the
:class:`fxquant.recipes.QuantTraining` settings of the same names, which the table does not
expose.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

import torch

import fxquant
from fxquant.datasets import PLANETOID_NAMES

from .common import ROOT


def trace(model_kind: str, dataset: str, row: str, seed: int, *, epochs: int = 200,
          lsq_refit: int = 0, float_epochs: int = 0, refit_widen: bool = False,
          step_lr: float | None = None, protect: tuple[float, float] = (0.0, 0.2),
          root: str | None = None) -> dict[str, Any]:
    """One run of ``row``; every epoch's numbers and the reported epoch."""
    sys.path.insert(0, str(ROOT))
    from examples import dq_table, train_cora, training

    data, num_classes = training.load_data(dataset, root, "trace_training")
    cfg = dq_table.rows(protect)[row]
    model = train_cora.build(cfg, data, num_classes, seed, model_kind)
    settings = dict(refit_epochs=lsq_refit, float_epochs=float_epochs,
                    refit_widen=refit_widen, step_lr=step_lr) \
        if isinstance(model, torch.fx.GraphModule) else {}
    run = fxquant.recipes.QuantTraining(model, **settings)  # type: ignore[arg-type]
    rows: list[dict[str, Any]] = []

    def record(epoch: int, loss: float, logits: torch.Tensor) -> None:
        pred = logits.argmax(dim=-1)

        def acc(mask: torch.Tensor) -> float:
            return float((pred[mask] == data.y[mask]).float().mean())

        top2 = logits.topk(2, dim=-1).values
        rows.append({"epoch": epoch, "loss": loss, "val": acc(data.val_mask),
                     "test": acc(data.test_mask), "train": acc(data.train_mask),
                     "abs_logit": float(logits.abs().mean()),
                     "ties": float((top2[:, 0] == top2[:, 1]).float().mean())})

    result = training.fit(model, data, epochs, run=run, progress=False, on_epoch=record)
    reported = run.best.epoch if run.best is not None else None
    return {"model": model_kind, "dataset": dataset, "row": row, "seed": seed,
            "epochs": epochs, "lsq_refit": lsq_refit, "float_epochs": float_epochs,
            "refit_widen": refit_widen, "step_lr": step_lr, "reported_epoch": reported,
            "val": result.val, "test": result.test, "trace": rows,
            "torch": torch.__version__}


def table(payload: dict[str, Any], every: int) -> str:
    lines = ["| epoch | training loss | val | test | train (eval) | mean abs logit | ties |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    last = len(payload["trace"]) - 1
    for r in payload["trace"]:
        e = r["epoch"]
        if e % every and e != payload["reported_epoch"] and e != last \
                and e != payload["float_epochs"]:
            continue
        mark = " (reported)" if e == payload["reported_epoch"] else ""
        lines.append(f"| {e}{mark} | {r['loss']:.3f} | {100 * r['val']:.1f} | "
                     f"{100 * r['test']:.1f} | {100 * r['train']:.1f} | {r['abs_logit']:.4f} "
                     f"| {100 * r['ties']:.1f}% |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from examples import dq_table, training

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=list(training.MODELS), default="gcn")
    p.add_argument("--dataset", default="Cora", choices=list(PLANETOID_NAMES))
    p.add_argument("--row", default="int4-lsq-p", help="a dq_table.py row key")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--lsq-refit", type=training.epochs_arg, default=0)
    p.add_argument("--float-epochs", type=training.epochs_arg, default=0)
    p.add_argument("--refit-widen", action="store_true")
    p.add_argument("--step-lr", type=float, default=None)
    p.add_argument("--protect", type=training.protect_arg, default=None,
                   help="P_MIN:P_MAX, as dq_table.py's --protect (default 0:0.2)")
    p.add_argument("--every", type=int, default=10, help="print every N-th epoch")
    p.add_argument("--root", default=None, help="dataset folder (default: $FXQUANT_DATA)")
    p.add_argument("--json", default=None, help="write every epoch's numbers here")
    args = p.parse_args(argv)
    known = dq_table.rows(args.protect or dq_table.DEFAULT_PROTECT)
    if args.row not in known:
        p.error(f"--row {args.row!r} is not a dq_table.py row; known: {sorted(known)}")
    cfg = known[args.row]
    if args.protect is not None and cfg.protect is None:
        p.error(f"--protect sets Degree-Quant's protection; the {args.row} row protects no "
                "nodes, so it would be ignored")
    args.protect = args.protect or dq_table.DEFAULT_PROTECT
    for flag in ("epochs", "every"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} must be at least 1")
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
    training.refuse_unwritable(p, args, "--json")
    training.refuse_float_epochs_past_training(p, args)
    payload = trace(args.model, args.dataset, args.row, args.seed, epochs=args.epochs,
                    lsq_refit=args.lsq_refit, float_epochs=args.float_epochs,
                    refit_widen=args.refit_widen, step_lr=args.step_lr,
                    protect=args.protect, root=args.root)
    print(f"{args.model} on {args.dataset}, {args.row}, seed {args.seed}: validation "
          f"{100 * payload['val']:.1f}, test {100 * payload['test']:.1f} at epoch "
          f"{payload['reported_epoch']}")
    print(table(payload, args.every))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)
    return payload


if __name__ == "__main__":
    main()
