"""What the experiment drivers share: data, models, the training loop, paired statistics
and the command-line value parsers.

``train_cora.py``, ``bits_pareto.py``, ``dq_table.py`` and ``train_ddp.py`` import this
module; it holds the one full-batch training loop (:func:`fit`), which follows PyG's
``examples/gcn.py`` (Adam, lr 0.01, weight decay 5e-4 on the first layer, test accuracy
at the reported epoch) and lets a :class:`fxquant.recipes.QuantTraining` do what a
quantization method needs around it (step refits, annealing, a bit penalty, the epoch
chosen under a bit budget).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
import torch_geometric.transforms as T
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv
from torch_geometric.nn.models import GAT, GIN
from tqdm import tqdm

import fxquant
from fxquant.datasets import load_planetoid
from fxquant.formats import TopN, parse
from fxquant.recipes import QuantTraining

__all__ = [
    "GCN",
    "MODELS",
    "SITES",
    "Result",
    "epochs_arg",
    "fit",
    "load_data",
    "make_model",
    "number_arg",
    "paired",
    "param_groups",
    "protect_arg",
    "sites_arg",
    "t95",
]

SITES = ("input", "weight", "message", "aggregate", "output")
MODELS = ("gcn", "gin", "gat", "gat64")
#: how :func:`fit`'s evaluation draws random numbers (``--eval-rng``)
EVAL_RNG = ("shared", "fork")


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


def make_model(kind: str, in_channels: int, num_classes: int) -> torch.nn.Module:
    """The untouched FP32 model: PyG's gcn.py GCN, or PyG's GIN / GAT (two layers, hidden
    16; ``gat``: hidden 8, which ``models.GAT`` splits into 8 heads of one channel each, and
    an output layer averaging 8 heads; ``gat64``: hidden 64, 8 heads of 8 channels, the
    width of PyG's examples/gat.py; dropout 0.5, on the attention coefficients too)."""
    if kind == "gcn":
        return GCN(in_channels, 16, num_classes)
    if kind == "gin":
        return GIN(in_channels, 16, num_layers=2, out_channels=num_classes, dropout=0.5)
    hidden = 64 if kind == "gat64" else 8
    return GAT(in_channels, hidden, num_layers=2, out_channels=num_classes, heads=8,
               dropout=0.5)


def stand_in_graph() -> Data:
    """A 4-node ring with 8 features (row-normalized values): what a script's flag checks
    build a recipe on before any work, with ``make_model(kind, 8, 3)``."""
    return Data(x=torch.full((4, 8), 0.125), edge_index=torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]),
                num_nodes=4)


def load_data(name: str, root: str | None, script: str) -> tuple[Data, int]:
    """The Planetoid graph (row-normalized features) and its number of classes; a missing
    dataset is one clear message (``SystemExit``) naming ``--root`` and ``FXQUANT_DATA``."""
    try:
        dataset = load_planetoid(name, root, transform=T.NormalizeFeatures(), download=False)
    except (FileNotFoundError, ValueError) as e:
        where = root or os.environ.get("FXQUANT_DATA") or "(neither --root nor FXQUANT_DATA set)"
        why = str(e) if isinstance(e, ValueError) or "lacks" in str(e) else "no raw files there"
        raise SystemExit(
            f"{script}: cannot load {name} from {where}: {why}.\nPlease pass "
            f"--root DIR or set FXQUANT_DATA to a folder holding "
            f"{name}/raw/ind.{name.lower()}.* (x, tx, allx, y, ty, ally, graph, "
            "test.index: PyG's Planetoid raw files)."
        ) from None
    return dataset[0], dataset.num_classes


def param_groups(model: torch.nn.Module) -> list[dict[str, Any]]:
    """gcn.py's weight decay: 5e-4 on the first layer (``conv1``), none elsewhere; for
    models without ``conv1`` (PyG's zoo) on every parameter."""
    first = getattr(model, "conv1", None)
    decayed = list((first if first is not None else model).parameters())
    mine = {id(p) for p in decayed}
    rest = [p for p in model.parameters() if id(p) not in mine]
    return [{"params": decayed, "weight_decay": 5e-4}, {"params": rest, "weight_decay": 0.0}]


@dataclass
class Result:
    """One training run: the test (and validation) accuracy at the reported epoch and what
    it cost."""

    test: float
    bits: fxquant.BitReport | None
    within_budget: bool
    epoch_ms: list[float] = field(default_factory=list)
    val: float = 0.0  # the validation accuracy of the reported epoch (0.0: none above 0)
    logits: Tensor | None = None  # the reported epoch's evaluation output (a teacher's)


def fit(model: torch.nn.Module, data: Data, epochs: int, *, run: QuantTraining | None = None,
        desc: str = "", device: torch.device | None = None, progress: bool = True,
        on_epoch: Callable[[int, float, Tensor], None] | None = None,
        eval_rng: str = "shared") -> Result:
    """PyG's gcn.py loop around ``run`` (default: a plain :class:`QuantTraining` of
    ``model``): the test accuracy at the reported epoch (the best validation epoch, or the
    best within the bit budget), that epoch's bits, and each epoch's training time.
    ``on_epoch(epoch, training_loss, logits)`` is called after each evaluation with its
    output (a trace; ``benchmarks/trace_training.py``). ``eval_rng="fork"`` evaluates under
    :func:`torch.random.fork_rng`: what evaluation draws (stochastic rounding) then leaves
    the generator training draws its dropout masks from as it found it, so the float epochs
    of a quantized run repeat the float32 run of the same seed mask for mask (``"shared"``,
    the default: evaluation advances it)."""
    if eval_rng not in EVAL_RNG:
        raise ValueError(f"eval_rng={eval_rng!r} is not one of {list(EVAL_RNG)}")
    device = device or torch.device("cpu")
    run = run or QuantTraining(model)  # type: ignore[arg-type]
    model.to(device)
    optimizer = torch.optim.Adam(run.param_groups(param_groups(model)), lr=0.01)
    times = []
    bar = tqdm(range(epochs), desc=desc, leave=False, file=sys.stderr, dynamic_ncols=True,
               disable=not progress)
    kept: Tensor | None = None
    for epoch in bar:
        start = time.perf_counter()
        model.train()
        run.start_epoch(epoch)
        optimizer.zero_grad()
        out = model(data.x, data.edge_index)
        loss = run.loss(F.cross_entropy(out[data.train_mask], data.y[data.train_mask]),
                        output=out)
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - start))
        model.eval()
        with torch.no_grad(), _evaluation_rng(eval_rng, device):
            logits = model(data.x, data.edge_index)
        pred = logits.argmax(dim=-1)
        val = float((pred[data.val_mask] == data.y[data.val_mask]).float().mean())
        test = float((pred[data.test_mask] == data.y[data.test_mask]).float().mean())
        if run.observe(val, test=test):
            kept = logits
        if on_epoch is not None:
            on_epoch(epoch, loss.item(), logits)
        best = run.best
        bar.set_postfix(val=f"{val:.3f}", test=f"{best.metrics['test'] if best else 0.0:.3f}")
    best = run.best
    quantized = any(isinstance(m, fxquant.QuantPoint) for m in model.modules())
    bits = best.bits if best is not None else None
    if quantized and bits is None:  # no epoch scored above 0: the final model's bits
        bits = fxquant.bit_report(model, data.x, data.edge_index)
    return Result(best.metrics["test"] if best is not None else 0.0, bits,
                  best.within_budget if best is not None else False, times,
                  best.val if best is not None else 0.0, kept)


def draws_in_evaluation(cfg: Any) -> bool:
    """Whether evaluating a configuration (``train_cora.Config``: a row of ``dq_table.py``
    or ``train_cora.py``) draws random numbers: where it rounds stochastically."""
    return "stochastic" in (cfg.rounding, cfg.message_rounding)


def refuse_idle_eval_rng(p: argparse.ArgumentParser, eval_rng: str, configs: Sequence[Any],
                         hint: str = "") -> None:
    """``--eval-rng fork`` keeps evaluation's random draws out of training: a usage error
    when none of ``configs`` draws any (it would be ignored)."""
    if eval_rng != "shared" and not any(draws_in_evaluation(c) for c in configs):
        p.error(f"--eval-rng {eval_rng} keeps evaluation's random draws out of training; "
                f"nothing run rounds stochastically, so evaluation draws nothing and it would "
                f"be ignored{hint}")


def _evaluation_rng(eval_rng: str, device: torch.device) -> contextlib.AbstractContextManager:
    """``fit``'s evaluation: under a fork of the CPU generator and, on an accelerator, of
    the device's (``"fork"``), or not."""
    if eval_rng == "shared":
        return contextlib.nullcontext()
    if device.type == "cpu":
        return torch.random.fork_rng(devices=[])
    index = device.index if device.index is not None \
        else torch.get_device_module(device.type).current_device()
    return torch.random.fork_rng(devices=[index], device_type=device.type)


def teacher_logits(kind: str, data: Data, num_classes: int, seed: int, epochs: int,
                   device: torch.device | None = None) -> Tensor:
    """A distilling run's teacher (``QuantTraining(distill=...)``): the model ``kind`` of
    ``seed`` (the initialisation the rounded model starts from) trained in float32 by
    :func:`fit`, its logits at the best validation epoch."""
    torch.manual_seed(seed)
    model = make_model(kind, data.num_features, num_classes)
    return teacher_of(fit(model, data, epochs, device=device, progress=False), seed)


def teacher_of(result: Result, seed: int) -> Tensor:
    """A float32 run's logits at its reported epoch, as a distilling run's teacher."""
    if result.logits is None:
        raise SystemExit(f"the float32 run of seed {seed} (the teacher) scored 0 on "
                         "validation in every epoch; there is nothing to distill")
    return result.logits


def paired(reference: list[float], other: list[float]) -> str:
    """Mean difference ``other - reference`` (in points) over the seeds both ran, and its
    95% interval (t); ``-`` with fewer than two."""
    n = min(len(reference), len(other))
    if other is reference or n < 2:
        return "-"
    diffs = [100 * (q - f) for q, f in zip(other[:n], reference[:n], strict=True)]
    mean = statistics.mean(diffs)
    half = t95(n - 1) * statistics.stdev(diffs) / n**0.5
    return f"{mean:+.1f} [{mean - half:+.1f}, {mean + half:+.1f}]"


def t95(dof: int) -> float:
    """Two-sided 95% quantile of Student's t (the table's values; 1.96 beyond 30)."""
    table = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
             10: 2.23, 11: 2.20, 12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13, 19: 2.09, 24: 2.06,
             29: 2.05}
    return next((v for k, v in sorted(table.items()) if dof <= k), 1.96)


# -- command-line values -----------------------------------------------------------------


def refuse_training_flags(p: argparse.ArgumentParser, args: argparse.Namespace,
                          keep: tuple[str, ...] = (), writes_json: bool = False) -> None:
    """With ``--from-json`` (no training): a usage error naming every flag given that only
    training reads (``--from-json``, ``--plot`` and the flags named in ``keep`` aside),
    and ``--json`` unless the script writes the files it read (``writes_json``)."""
    if args.json and not writes_json:
        p.error("--json writes the results of training; with --from-json nothing trains, "
                "so it would be ignored: please drop it")
    defaults = p.parse_args([])
    given = [f"--{name.replace('_', '-')}" for name, value in vars(args).items()
             if name not in ("from_json", "plot", "json", *keep)
             and value != getattr(defaults, name)]
    if given:
        p.error(f"{', '.join(given)}: --from-json trains nothing, so these would be "
                "ignored; please drop them")


def refuse_results_files(p: argparse.ArgumentParser, paths: Sequence[str],
                         fields: tuple[str, ...], script: str,
                         payload_fields: tuple[str, ...] = (), one_subject: bool = False) -> None:
    """A usage error for each ``--from-json`` file that cannot be read, or that lacks the
    ``payload_fields`` or whose results lack the ``fields`` that ``script --json`` writes
    (another script's results); with ``one_subject`` (a script that pairs every row
    against one FP32 line), one if the files hold different models or datasets."""
    subjects: dict[str, tuple[str, str]] = {}
    for path in paths:
        try:
            with open(path) as f:
                payload = json.load(f)
        except (OSError, ValueError) as e:
            p.error(f"--from-json {path}: cannot read it as JSON ({e})")
        results = payload.get("results") if isinstance(payload, dict) else None
        if not isinstance(results, list) or not results or not set(payload_fields) <= \
                payload.keys() or not all(isinstance(r, dict) and set(fields) <= r.keys()
                                          for r in results):
            needs = f"{list(payload_fields)} and " if payload_fields else ""
            p.error(f"--from-json {path}: not a file {script} --json writes (it needs "
                    f"{needs}results with {list(fields)}); please leave it out")
        subjects[path] = results_subject(payload)
    if one_subject and len(set(subjects.values())) > 1:
        held = "; ".join(f"{path}: {model} on {dataset}"
                         for path, (model, dataset) in subjects.items())
        p.error(f"--from-json: the files hold results of different models or datasets "
                f"({held}), which would be paired against one FP32 line; please pass files "
                "of one model and dataset")


def results_subject(payload: dict[str, Any]) -> tuple[str, str]:
    """``(model, dataset)`` of a ``--json`` file (files written before either was recorded:
    the GCN, on the dataset of its arguments, else Cora)."""
    args = payload.get("args") if isinstance(payload.get("args"), dict) else {}
    return (str(payload.get("model", args.get("model", "gcn"))),
            str(payload.get("dataset", args.get("dataset", "Cora"))))


def refuse_unwritable(p: argparse.ArgumentParser, args: argparse.Namespace,
                      *flags: str) -> None:
    """A usage error for each output flag (``"--json"``, ``"--plot"``) whose path is a
    folder or lies in no existing folder: checked before training, which would otherwise
    end, minutes later, in a traceback with nothing written."""
    for flag in flags:
        path = getattr(args, flag.lstrip("-").replace("-", "_"), None)
        if path and (os.path.isdir(path) or not os.path.isdir(
                os.path.dirname(os.path.abspath(path)))):
            p.error(f"{flag} {path}: not a file in an existing folder")
        if path and flag == "--plot":
            from matplotlib.backend_bases import FigureCanvasBase

            kinds = FigureCanvasBase.get_supported_filetypes()
            if os.path.splitext(path)[1].lstrip(".").lower() not in kinds:
                p.error(f"--plot {path}: matplotlib writes {', '.join(sorted(kinds))}; please "
                        "end the name with one of them (e.g. .png)")


def refuse_seeds(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--seeds`` and ``--first-seed``: at least one seed, none negative or past what
    ``torch.manual_seed`` takes."""
    first = getattr(args, "first_seed", 0)
    if args.seeds < 1:
        p.error(f"--seeds must be >= 1, got {args.seeds}")
    if first < 0 or first + args.seeds > 2**63:
        p.error(f"--first-seed must lie in 0..2**63 - --seeds, got {first}")


def refuse_float_epochs_past_training(p: argparse.ArgumentParser,
                                      args: argparse.Namespace) -> None:
    """``--float-epochs`` at or past ``--epochs``: the learned steps would never be fitted
    and every evaluation would round with the placeholder step (one class for all)."""
    if args.float_epochs and args.float_epochs >= args.epochs:
        p.error(f"--float-epochs {args.float_epochs} with --epochs {args.epochs}: no epoch "
                "would train rounded, and the learned steps would never be fitted; please "
                "give --float-epochs below --epochs")


def epochs_arg(text: str) -> int:
    """A count of epochs, 0 or more (``--lsq-refit``)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of epochs (0 or more), got {text!r}")
    return value


def number_arg(text: str) -> int | str:
    """An int of kept bits (1..32) or a format name that fxquant knows."""
    text = text.strip()
    try:
        value: int | str = int(text)
    except ValueError:
        value = text
    try:
        parsed = parse(value if isinstance(value, str) else f"top{value}")
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if isinstance(parsed, TopN) and not 1 <= parsed.bits <= 32:
        raise argparse.ArgumentTypeError(f"bit widths must be in 1..32, got {text!r}")
    return value


def sites_arg(text: str) -> list[str]:
    """A comma list of sites, or ``all``."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    if names == ["all"]:
        return list(SITES)
    unknown = [n for n in names if n not in SITES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown site(s) {unknown}; choose from {list(SITES)} "
                                         "or 'all'")
    return [s for s in SITES if s in names]


def protect_arg(text: str) -> tuple[float, float]:
    """``P_MIN:P_MAX`` with ``0 <= P_MIN <= P_MAX <= 1``."""
    low, sep, high = text.partition(":")
    try:
        pair = (float(low), float(high))
    except ValueError:
        pair = (-1.0, -1.0)
    if not sep or not 0 <= pair[0] <= pair[1] <= 1:
        raise argparse.ArgumentTypeError(f"expected P_MIN:P_MAX with 0 <= P_MIN <= P_MAX <= 1, "
                                         f"got {text!r}")
    return pair


def fraction_arg(text: str) -> float:
    """A number in [0, 1) (``--momentum``)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value
