"""What the experiment drivers share: the data, the models and the training loop.

The one full-batch training loop (:func:`fit`) follows PyG's ``examples/gcn.py`` (Adam,
lr 0.01, weight decay 5e-4 on the first layer, test accuracy at the reported epoch) and
lets a :class:`fxquant.recipes.QuantTraining` do what a quantization method needs around
it (step refits, annealing, a bit penalty, the epoch chosen under a bit budget). The
drivers (``python -m experiments.train_cora``, ``bits_pareto``, ``dq_table``,
``select_bits``, ``trace_training``, ``heldout_bits``) and the benchmarks train with it.

Example:
    >>> from experiments.training import make_model, param_groups
    >>> model = make_model("gcn", 8, 3)
    >>> [len(g["params"]) for g in param_groups(model)]   # conv1 decayed, conv2 not
    [2, 2]
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
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
from fxquant.recipes import QuantTraining

__all__ = [
    "EVAL_RNG",
    "GCN",
    "MODELS",
    "SITES",
    "Result",
    "fit",
    "load_data",
    "make_model",
    "param_groups",
    "stand_in_graph",
    "teacher_logits",
    "teacher_of",
]

SITES = ("input", "weight", "message", "aggregate", "output")
MODELS = ("gcn", "gin", "gat", "gat64")
#: how :func:`fit`'s evaluation draws random numbers (``--eval-rng``)
EVAL_RNG = ("shared", "fork")


class GCN(torch.nn.Module):
    """PyG's ``examples/gcn.py`` model: two ``GCNConv`` layers with a ReLU between and
    dropout on the input and the hidden layer.

    Args:
        in_channels (int): input features.
        hidden_channels (int): hidden units (gcn.py: 16).
        out_channels (int): classes.
        dropout (float, optional): the dropout probability. (default: ``0.5``)
        cached (bool, optional): ``GCNConv(cached=...)``: keep the normalized graph of the
            first call (full-batch training on one graph); ``False`` for mini-batches.
            (default: ``True``)
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 dropout: float = 0.5, cached: bool = True) -> None:
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden_channels, cached=cached)
        self.conv2 = GCNConv(hidden_channels, out_channels, cached=cached)
        self.dropout = dropout

    def forward(self, x: Tensor, edge_index: Tensor, edge_weight: Tensor | None = None
                ) -> Tensor:
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = self.conv1(x, edge_index, edge_weight).relu()
        x = F.dropout(x, p=self.dropout, training=self.training)
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
    models without ``conv1`` (PyG's zoo) on every parameter. A quantization point's own
    parameters (learned steps and bit-widths) are never decayed.

    Args:
        model (torch.nn.Module): the model, transformed or not.
    """
    quant = {id(p) for m in model.modules() if isinstance(m, fxquant.QuantPoint)
             for p in m.parameters()}
    first = getattr(model, "conv1", None)
    decayed = [p for p in (first if first is not None else model).parameters()
               if id(p) not in quant]
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
    output (a trace; ``experiments/trace_training.py``). ``eval_rng="fork"`` evaluates under
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


