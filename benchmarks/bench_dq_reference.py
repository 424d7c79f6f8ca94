"""fxquant against Degree-Quant's reference code on Cora GCN: accuracy over paired seeds,
and epoch time eager and compiled.

    FXQUANT_DQ_REFERENCE=/path/to/degree-quant FXQUANT_DATA=../shared/datasets \\
        python -m benchmarks.bench_dq_reference --json dq_reference.json
    python -m benchmarks.bench_dq_reference --seeds 2 --rows fp32,int8 --epochs 50 \\
        --time-steps 5 --no-write                        # a quick run

The reference (https://github.com/camlsys/degree-quant, commit 257d6bc) is never part of
this repository: the script imports its ``dq`` package from the checkout that
``$FXQUANT_DQ_REFERENCE`` (or ``--reference``) names, and exits with a message when there
is none. Its ``torch_scatter`` import is served by a stand-in over PyG's ``scatter`` when
the compiled package is missing (:mod:`benchmarks.dq_reference_support`).

Protocol (``experiments/train_cora.py``, PyG's ``gcn.py``): NormalizeFeatures, two GCN layers
with 16 hidden units, dropout 0.5, Adam with lr 0.01 and weight decay 5e-4 on the first
layer, 200 epochs, test accuracy at the best validation epoch. For every seed both sides
start from the same weights (fxquant's GCN is built under ``torch.manual_seed(seed)``
and its weights are copied into the reference's ``GCNConvMultiQuant`` layers, transposed)
and from the same global random state (the dropout masks); the reference draws its
protection masks from a generator of its own, so its FP32 row runs the same dropout masks
as fxquant's. Each row reports both sides' mean test accuracy and the paired difference
fxquant - reference with its 95% t interval.

Rows (``--rows``; protection ``(0, 0.2)`` on both sides):

- ``fp32``: the reference's layers with identity quantizers / PyG's ``GCNConv``.
- ``int8``, ``int4``: the reference's GC-PER (per-tensor asymmetric integers, the 0.1th
  to 99.9th percentile by ``kthvalue``, a range that only widens, zero gradient where
  clipped) at its seven GCN tensors; fxquant ``intN:asym``, ``range="percentile:99.9"``
  at every site (input, weight, message, aggregate, output).
- ``int8-mom``, ``int4-mom``: the reference's STE-MOM (min/max with momentum 0.01, 1%
  new, straight-through); fxquant min/max with ``decay=0.99`` (the old range's weight:
  0.99 is the same 1% new), the running range in eval.
- ``int4-p1``: the reference's own INT4 setting (1st to 99th percentile); fxquant
  ``percentile:99``.
- ``int8-dq``, ``int4-dq``: the reference's GC-PER (0.1th-99.9th percentile) against
  fxquant's faithful recipe, :class:`fxquant.recipes.DegreeQuant`: the same seven
  tensors, one mask per layer shared by its sites, messages and coefficients following
  their source, ranges over unprotected rows that only widen and are kept for
  evaluation, the clipped gradient.

Epoch time (``--time-rows``): one training step (forward, backward, Adam) on one thread,
for the reference eager and compiled (``torch.compile``, default mode: its layers break
the graph at boolean-mask writes and at ``float()`` of their ranges) and fxquant eager
and compiled; both models to be compiled first run one eager forward, so their GCN
layers (``cached=True`` on both sides) hold their normalisation before compiling (PyG's
``gcn_norm`` breaks the graph on its first call, and the break would stay in the compiled
code of every later step); each model first runs ``--warmup`` steps and one evaluation (compilation
happens there), then the four take turns for ``--time-rounds`` rounds of
``--time-steps`` steps; the median step is reported, and the ratio of fxquant compiled to
each reference variant within each round (median and quartiles over rounds: the speed of a
shared machine drifts by a third over seconds, and a ratio within a round compares steps
run close together; ``--time-rounds 40 --time-steps 2`` for the published numbers).
With ``--fast-dropout`` three more models take turns: the reference eager and compiled and
fxquant compiled, each with :func:`fxquant.fast_dropout` (the same dropout on both sides),
and fxquant's is compared with all four reference variants.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
import torch_geometric.transforms as T
from tabulate import tabulate
from torch import nn

import fxquant
from benchmarks.common import machine, publish
from benchmarks.dq_reference_support import (
    ENV,
    REFERENCE_COMMIT,
    Reference,
    ReferenceGCN,
    RefQuant,
    copy_gcn_weights,
    degree_probabilities,
    load_reference,
    reference_path,
)
from experiments import training
from experiments.cli import refuse_overridden, refuse_unwritable
from experiments.stats import Difference, paired
from experiments.training import param_groups
from fxquant import QuantMapping
from fxquant.datasets import PLANETOID_NAMES, load_planetoid

SITES = ("input", "weight", "message", "aggregate", "output")


class GCN(training.GCN):
    """The experiments' GCN (PyG's ``examples/gcn.py`` model) with its dropout as an
    ``nn.Dropout`` module, as the reference code has it, so that :func:`fxquant.fast_dropout`
    can replace it on both sides."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int) -> None:
        super().__init__(in_channels, hidden_channels, out_channels)
        self.drop = nn.Dropout(self.dropout)  # F.dropout(x, 0.5, self.training), as a module

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor,
                edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        x = self.drop(x)
        x = self.conv1(x, edge_index, edge_weight).relu()
        x = self.drop(x)
        return self.conv2(x, edge_index, edge_weight)


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, data: Any) -> None:
    model.train()
    optimizer.zero_grad()
    out = model(data.x, data.edge_index)
    F.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
    optimizer.step()


def train(model: nn.Module, data: Any, epochs: int) -> tuple[float, float, list[float]]:
    """PyG's ``gcn.py`` loop: ``(test accuracy at the best validation epoch, that
    validation accuracy, training-step times in ms)``."""
    optimizer = torch.optim.Adam(param_groups(model), lr=0.01)
    best_val = test = 0.0
    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        _step(model, optimizer, data)
        times.append(1000 * (time.perf_counter() - start))
        model.eval()
        with torch.no_grad():
            pred = model(data.x, data.edge_index).argmax(dim=-1)
        val = (pred[data.val_mask] == data.y[data.val_mask]).float().mean().item()
        if val > best_val:
            best_val = val
            test = (pred[data.test_mask] == data.y[data.test_mask]).float().mean().item()
    return test, best_val, times


@dataclass(frozen=True)
class Row:
    """One configuration on both sides."""

    key: str
    title: str
    reference: RefQuant
    fxquant: dict[str, Any] | None  # QuantConfig keyword arguments; None: FP32
    #: fxquant's side is ``fxquant.recipes.DegreeQuant(**recipe, protect=...)`` instead
    recipe: dict[str, Any] | None = None

    def mapping(self, protect: tuple[float, float]) -> QuantMapping | None:
        """fxquant's every-site mapping (protection on every site but the weights)."""
        if self.fxquant is None or self.recipe is not None:
            return None
        mapping = fxquant.QuantMapping()
        for site in SITES:
            config = fxquant.QuantConfig(**self.fxquant,
                                         protect=None if site == "weight" else protect)
            mapping.set_global(config, site=site)
        return mapping

    def describe(self) -> tuple[str, str]:
        ref = self.reference
        if ref.bits is None:
            return "FP32", "FP32"
        pct = f"percentile {100 * ref.percentile:g}-{100 - 100 * ref.percentile:g}" \
            if ref.percentile is not None else "min/max" + (", momentum 0.01" if ref.momentum
                                                           else " (running)")
        if self.recipe is not None:
            return (f"INT{ref.bits} {ref.mode()} ({pct})",
                    f"fxquant.recipes.DegreeQuant({self.recipe})")
        assert self.fxquant is not None
        fx = fxquant.QuantConfig(**self.fxquant).describe()
        return f"INT{ref.bits} {ref.mode()} ({pct})", fx


def _fx(fmt: str, **kwargs: Any) -> dict[str, Any]:
    return {"format": fmt, "scale": "tensor", **kwargs}


ROWS: dict[str, Row] = {r.key: r for r in [
    Row("fp32", "FP32", RefQuant(None), None),
    Row("int8", "INT8, percentile 0.1-99.9", RefQuant(8, 0.001),
        _fx("int8:asym", range="percentile:99.9")),
    Row("int4", "INT4, percentile 0.1-99.9", RefQuant(4, 0.001),
        _fx("int4:asym", range="percentile:99.9")),
    Row("int8-mom", "INT8, min/max momentum", RefQuant(8, None, momentum=True, ste=True),
        _fx("int8:asym", decay=0.99)),
    Row("int4-mom", "INT4, min/max momentum", RefQuant(4, None, momentum=True, ste=True),
        _fx("int4:asym", decay=0.99)),
    Row("int4-p1", "INT4, percentile 1-99", RefQuant(4, 0.01),
        _fx("int4:asym", range="percentile:99")),
    Row("int8-dq", "INT8 GC-PER, fxquant's faithful recipe", RefQuant(8, 0.001),
        _fx("int8:asym"), recipe={"bits": 8, "percentile": 99.9}),
    Row("int4-dq", "INT4 GC-PER, fxquant's faithful recipe", RefQuant(4, 0.001),
        _fx("int4:asym"), recipe={"bits": 4, "percentile": 99.9}),
]}
DEFAULT_ROWS = ("fp32", "int8", "int4")


@dataclass
class Result:
    """Both sides' test accuracies of one row, seed by seed."""

    row: Row
    seeds: list[int] = field(default_factory=list)
    reference: list[float] = field(default_factory=list)
    fxquant: list[float] = field(default_factory=list)
    reference_val: list[float] = field(default_factory=list)
    fxquant_val: list[float] = field(default_factory=list)
    reference_ms: list[float] = field(default_factory=list)
    fxquant_ms: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        ref_desc, fx_desc = self.row.describe()
        return {"key": self.row.key, "title": self.row.title, "reference_config": ref_desc,
                "fxquant_config": fx_desc, "seeds": self.seeds,
                "reference_acc": self.reference, "fxquant_acc": self.fxquant,
                "reference_val": self.reference_val, "fxquant_val": self.fxquant_val,
                "difference": _as_dict(paired(self.fxquant, self.reference)),
                "reference_epoch_ms": statistics.median(self.reference_ms),
                "fxquant_epoch_ms": statistics.median(self.fxquant_ms)}


def _as_dict(d: Difference | None) -> dict[str, float] | None:
    return None if d is None else d.as_dict()


def _interval(d: Difference | None) -> str:
    return "-" if d is None else str(d)


class Sides:
    """Builds both sides' models of a row for a seed, from the same weights."""

    def __init__(self, ref: Reference, data: Any, num_classes: int,
                 protect: tuple[float, float]) -> None:
        self.ref, self.data, self.num_classes, self.protect = ref, data, num_classes, protect
        self.prob_mask = degree_probabilities(ref, data, *protect)

    def build(self, row: Row, seed: int) -> tuple[nn.Module, nn.Module, torch.Tensor]:
        """``(reference model, fxquant model, global RNG state to train each from)``."""
        torch.manual_seed(seed)
        gcn = GCN(self.data.num_features, 16, self.num_classes)
        state = torch.get_rng_state()
        reference = ReferenceGCN(self.ref, row.reference, self.data.num_features, 16,
                                 self.num_classes,
                                 self.prob_mask if row.reference.bits is not None else None,
                                 torch.Generator().manual_seed(seed))
        copy_gcn_weights(gcn, reference)
        mapping = row.mapping(self.protect)
        model: nn.Module = gcn
        if row.recipe is not None:
            recipe = fxquant.recipes.DegreeQuant(**row.recipe, protect=self.protect)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = recipe.prepare(gcn, self.data, lint="off").model
        elif mapping is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = fxquant.transform(gcn, mapping, lint="off")
        return reference, model, state


def run_pair(sides: Sides, row: Row, seed: int, epochs: int, reference_first: bool
             ) -> dict[str, tuple[float, float, float]]:
    """Both sides of one row and seed: ``{side: (test acc, best val acc, median step ms)}``."""
    reference, model, state = sides.build(row, seed)
    order = [("reference", reference), ("fxquant", model)]
    out = {}
    for side, m in order if reference_first else order[::-1]:
        torch.set_rng_state(state)
        acc, val, times = train(m, sides.data, epochs)
        out[side] = (acc, val, statistics.median(times))
    return out


_WORKER: dict[str, Any] = {}


def _worker_init(reference: str | None, dataset: str, root: str | None,
                 protect: tuple[float, float]) -> None:
    torch.set_num_threads(1)
    _WORKER["sides"] = make_sides(reference, dataset, root, protect)


def _worker_run(key: str, seed: int, epochs: int, reference_first: bool
                ) -> dict[str, tuple[float, float, float]]:
    return run_pair(_WORKER["sides"], ROWS[key], seed, epochs, reference_first)


def make_sides(reference: str | None, dataset: str, root: str | None,
               protect: tuple[float, float]) -> Sides:
    """Load the reference and the data."""
    ref = load_reference(reference)
    data = load_planetoid(dataset, root, transform=T.NormalizeFeatures(), download=False)
    return Sides(ref, data[0], data.num_classes, protect)


def run_accuracy(sides: Sides, rows: list[Row], seeds: list[int], epochs: int,
                 log: Callable[[str], None], jobs: int = 1,
                 worker_args: tuple[Any, ...] = ()) -> list[Result]:
    """Train every row on both sides for every seed; the side that goes first alternates
    from seed to seed. With ``jobs > 1`` the (row, seed) pairs run in that many worker
    processes of one thread each (``worker_args`` for :func:`make_sides`); every pair
    starts from its seed's state, so the accuracies do not depend on ``jobs``."""
    results = {r.key: Result(r) for r in rows}
    tasks = [(r.key, seed, i % 2 == 0) for i, seed in enumerate(seeds) for r in rows]

    def record(key: str, seed: int, out: dict[str, tuple[float, float, float]]) -> None:
        result = results[key]
        result.seeds.append(seed)
        for side, (acc, val, ms) in out.items():
            getattr(result, side).append(acc)
            getattr(result, f"{side}_val").append(val)
            getattr(result, f"{side}_ms").append(ms)
        log(f"seed {seed} {key}: reference {100 * out['reference'][0]:.1f}, "
            f"fxquant {100 * out['fxquant'][0]:.1f}")

    if jobs <= 1:
        for key, seed, first in tasks:
            record(key, seed, run_pair(sides, ROWS[key], seed, epochs, first))
        return list(results.values())
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_init,
                             initargs=worker_args) as pool:
        futures = {pool.submit(_worker_run, key, seed, epochs, first): (key, seed)
                   for key, seed, first in tasks}
        for done, future in enumerate(as_completed(futures), 1):  # progress as pairs end
            key, seed = futures[future]
            out = future.result()
            log(f"({done}/{len(tasks)}) seed {seed} {key}: reference "
                f"{100 * out['reference'][0]:.1f}, fxquant {100 * out['fxquant'][0]:.1f}")
        outs = [f.result() for f in futures]
    for (key, seed, _), out in zip(tasks, outs, strict=True):
        record(key, seed, out)
    return list(results.values())


def run_timing(sides: Sides, row: Row, warmup: int, rounds: int, steps: int,
               log: Callable[[str], None], fast_dropout: bool = False) -> dict[str, Any]:
    """Median training-step time (ms) of the reference and fxquant, eager and compiled;
    with ``fast_dropout`` also both sides' models with :func:`fxquant.fast_dropout`."""
    reference, model, state = sides.build(row, 0)
    reference_c, model_c, _ = sides.build(row, 0)
    to_compile = [reference_c, model_c]
    if fast_dropout:
        fast_ref, _, _ = sides.build(row, 0)
        fast_ref_c, fast_c, _ = sides.build(row, 0)
        fast_ref, fast_ref_c, fast_c = (fxquant.fast_dropout(m)
                                        for m in (fast_ref, fast_ref_c, fast_c))
        for m in (fast_ref, fast_c):  # a model without nn.Dropout would time the same twice
            if not any(isinstance(d, nn.Dropout) and type(d) is not nn.Dropout
                       for d in m.modules()):  # (fast_dropout's subclass in its place)
                raise RuntimeError(f"{row.key}: fast_dropout found no nn.Dropout in "
                                   f"{type(m).__name__}")
        to_compile += [fast_ref_c, fast_c]
    for m in to_compile:  # fill the GCN layers' caches before compiling
        torch.set_rng_state(state)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m(sides.data.x, sides.data.edge_index)
    variants: dict[str, nn.Module] = {
        "reference eager": reference,
        "reference compiled": cast(nn.Module, torch.compile(reference_c)),
        "fxquant eager": model, "fxquant compiled": cast(nn.Module, torch.compile(model_c))}
    if fast_dropout:
        variants |= {FAST + "reference eager": fast_ref,
                     FAST + "reference compiled": cast(nn.Module, torch.compile(fast_ref_c)),
                     FAST + "fxquant compiled": cast(nn.Module, torch.compile(fast_c))}
    optimizers: dict[str, torch.optim.Optimizer] = {}
    times: dict[str, list[float]] = {}
    errors: dict[str, str] = {}
    warm_s: dict[str, float] = {}
    data = sides.data
    for name, m in variants.items():
        torch.set_rng_state(state)
        optimizers[name] = torch.optim.Adam(param_groups(getattr(m, "_orig_mod", m)), lr=0.01)
        start = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for _ in range(warmup):
                    _step(m, optimizers[name], data)
                m.eval()
                with torch.no_grad():
                    m(data.x, data.edge_index)
        except Exception as e:  # the reference may not compile: report, not fail
            errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            log(f"{row.key} {name}: {errors[name]}")
            continue
        warm_s[name] = time.perf_counter() - start
        times[name] = []
    per_round: dict[str, list[float]] = {name: [] for name in times}
    for _ in range(rounds):
        for name in times:
            m, opt = variants[name], optimizers[name]
            this_round = []
            for _ in range(steps):
                start = time.perf_counter()
                _step(m, opt, data)
                this_round.append(1000 * (time.perf_counter() - start))
            times[name] += this_round
            per_round[name].append(statistics.median(this_round))
    median = {name: statistics.median(t) for name, t in times.items()}
    log(f"{row.key} epoch ms: " + ", ".join(f"{k} {v:.1f}" for k, v in median.items()))
    out = {"row": row.key, "median_ms": median, "warmup_s": warm_s, "errors": errors,
           "steps": {name: len(t) for name, t in times.items()},
           "round_ratios": _round_ratios(per_round)}
    if fast_dropout:
        out["round_ratios_fast_dropout"] = _round_ratios(per_round, FAST + "fxquant compiled",
                                                         REFERENCES)
    return out


#: the prefix of the timing variants whose models run :func:`fxquant.fast_dropout`
FAST = "fast dropout, "
#: the reference's timing variants
REFERENCES = ("reference eager", "reference compiled", FAST + "reference eager",
              FAST + "reference compiled")


def _round_ratios(per_round: dict[str, list[float]], ours_name: str = "fxquant compiled",
                  references: Sequence[str] = REFERENCES[:2]) -> dict[str, list[float]]:
    """``ours_name`` over each of ``references``, round by round (the machine's speed
    drifts between rounds; a ratio within one round compares steps run seconds apart):
    ``[median, first quartile, third quartile]`` of the rounds' ratios."""
    out: dict[str, list[float]] = {}
    ours = per_round.get(ours_name)
    for name in references:
        theirs = per_round.get(name)
        if ours and theirs and len(ours) == len(theirs):
            ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
            q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
            out[name] = [statistics.median(ratios), q[0], q[-1]]
    return out


def _ratio(timing: dict[str, Any], a: str, b: str) -> str:
    m = timing["median_ms"]
    return f"{m[a] / m[b]:.2f}" if a in m and b in m else "-"


def load_results(path: str) -> tuple[list[Result], dict[str, Any]]:
    """The accuracy rows of an earlier ``--json`` file, and the file."""
    with open(path) as f:
        payload = json.load(f)
    results = []
    for r in payload["results"]:
        result = Result(ROWS[r["key"]], list(r["seeds"]), r["reference_acc"], r["fxquant_acc"],
                        r["reference_val"], r["fxquant_val"])
        result.reference_ms = [r["reference_epoch_ms"]]
        result.fxquant_ms = [r["fxquant_epoch_ms"]]
        results.append(result)
    return results, payload


def report(results: list[Result], timings: list[dict[str, Any]], header: str) -> str:
    fp32 = next((r for r in results if r.row.key == "fp32"), None)
    acc_rows = []
    for r in results:
        own = ["-", "-"] if fp32 is None or r is fp32 else [
            _interval(paired(r.reference, fp32.reference)), _interval(paired(r.fxquant, fp32.fxquant))]
        acc_rows.append([r.row.title, f"{100 * statistics.mean(r.reference):.1f}",
                         f"{100 * statistics.mean(r.fxquant):.1f}",
                         _interval(paired(r.fxquant, r.reference)), *own])
    table = tabulate(acc_rows, headers=["row", "reference (%)", "fxquant (%)",
                                        "fxquant - reference (pt, 95% CI)",
                                        "reference - its FP32", "fxquant - its FP32"],
                     tablefmt="github")
    configs = "\n".join(f"- `{r.row.key}`: reference {r.row.describe()[0]}; fxquant "
                        f"`{r.row.describe()[1]}`" for r in results)
    time_rows = []
    for t in timings:
        m = t["median_ms"]
        cells = [f"{m[k]:.1f}" if k in m else "fails" for k in
                 ("reference eager", "reference compiled", "fxquant eager", "fxquant compiled")]
        best_ref = min((m[k] for k in ("reference eager", "reference compiled") if k in m),
                       default=None)
        best = f"{m['fxquant compiled'] / best_ref:.2f}" if best_ref and "fxquant compiled" in m \
            else "-"
        rounds = t.get("round_ratios", {})
        paired_cells = [f"{r[0]:.2f} [{r[1]:.2f}, {r[2]:.2f}]" if (r := rounds.get(k)) else "-"
                        for k in ("reference eager", "reference compiled")]
        time_rows.append([t["row"], *cells, _ratio(t, "fxquant compiled", "reference eager"), best,
                          *paired_cells])
    time_table = tabulate(time_rows, headers=["row", "reference eager", "reference compiled",
                                              "fxquant eager", "fxquant compiled",
                                              "fxquant compiled / reference eager",
                                              "fxquant compiled / best reference",
                                              "per round / reference eager (median [IQR])",
                                              "per round / reference compiled"],
                          tablefmt="github") if timings else "(no timing rows)"
    fast = [t for t in timings if "round_ratios_fast_dropout" in t]
    if fast:
        rows = []
        for t in fast:
            m, r = t["median_ms"], t["round_ratios_fast_dropout"]
            rows.append([t["row"], *(f"{m[k]:.1f}" if k in m else "fails"
                                     for k in (*REFERENCES[2:], FAST + "fxquant compiled")),
                         *(f"{v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]" if (v := r.get(k)) else "-"
                           for k in REFERENCES)])
        time_table += "\n\nWith `fxquant.fast_dropout` (`--fast-dropout`): step (ms), and " \
            "fxquant compiled with it over each reference variant per round (median [IQR]):\n\n" \
            + tabulate(rows, headers=["row", "reference eager, fast dropout",
                                      "reference compiled, fast dropout",
                                      "fxquant compiled, fast dropout", "/ reference eager",
                                      "/ reference compiled", "/ reference eager, fast dropout",
                                      "/ reference compiled, fast dropout"], tablefmt="github")
    return f"{header}\n\n{table}\n\n{configs}\n\nMedian training step (ms):\n\n{time_table}\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--reference", default=None, metavar="DIR",
                   help=f"the degree-quant checkout (default: ${ENV})")
    p.add_argument("--dataset", default="Cora", choices=list(PLANETOID_NAMES))
    p.add_argument("--root", default=None, help="data folder (default: $FXQUANT_DATA)")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                   help=f"comma list of rows, from {','.join(ROWS)} (default: "
                        f"{','.join(DEFAULT_ROWS)})")
    p.add_argument("--protect", default="0:0.2", metavar="P_MIN:P_MAX")
    p.add_argument("--time-rows", default="int8,int4",
                   help="rows to time eager and compiled ('' for none; default: int8,int4)")
    p.add_argument("--fast-dropout", action="store_true",
                   help="also time both sides with fxquant.fast_dropout (their dropout's mask "
                        "from one torch.rand draw)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per model (compiles)")
    p.add_argument("--time-rounds", type=int, default=5)
    p.add_argument("--time-steps", type=int, default=10)
    p.add_argument("--jobs", type=int, default=1,
                   help="worker processes for the accuracy runs, one thread each (default 1; "
                        "2 on an otherwise idle 2-core machine halves the time)")
    p.add_argument("--accuracy-from", default=None, metavar="JSON",
                   help="take the accuracy rows from an earlier --json file instead of "
                        "training them (e.g. to time on a quiet machine after a long run)")
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    args = p.parse_args(argv)
    rows = [k.strip() for k in args.rows.split(",") if k.strip()]
    timed = [k.strip() for k in args.time_rows.split(",") if k.strip()]
    unknown = sorted(set(rows + timed) - set(ROWS))
    if unknown:
        p.error(f"unknown rows {unknown}; rows: {list(ROWS)}")
    if args.seeds < 1 or args.epochs < 1 or args.jobs < 1 or args.time_rounds < 1 or args.time_steps < 1:
        p.error("--seeds, --epochs, --jobs, --time-rounds and --time-steps must be >= 1")
    low, _, high = args.protect.partition(":")
    try:
        args.protect = (float(low), float(high))
    except ValueError:
        p.error(f"--protect: expected P_MIN:P_MAX, got {args.protect!r}")
    if not 0 <= args.protect[0] <= args.protect[1] <= 1:
        p.error(f"--protect: expected 0 <= P_MIN <= P_MAX <= 1, got {args.protect}")
    if args.first_seed < 0 or args.first_seed + args.seeds > 2**63:
        p.error(f"--first-seed must lie in 0..2**63 - --seeds, got {args.first_seed}")
    if args.accuracy_from:
        refuse_overridden(p, args, "--accuracy-from", ("rows", "seeds", "first_seed", "epochs",
                                                       "jobs"),
                          "the accuracy rows come from that file")
        try:
            load_results(args.accuracy_from)
        except (OSError, ValueError, KeyError, TypeError) as e:
            p.error(f"--accuracy-from {args.accuracy_from}: cannot read it as this "
                    f"benchmark's --json ({type(e).__name__}: {e})")
    if not timed:
        refuse_overridden(p, args, "--time-rows ''", ("fast_dropout", "warmup", "time_rounds",
                                                      "time_steps"), "no row is timed")
    if args.reference is not None and reference_path(args.reference) is None:
        p.error(f"--reference {args.reference}: not a Degree-Quant checkout (it lacks "
                "dq/multi_quant.py)")
    refuse_unwritable(p, args, "--json")
    args.rows, args.time_rows = rows, timed
    return args


def main(argv: Sequence[str] | None = None) -> str | None:
    args = parse_args(argv)
    if reference_path(args.reference) is None:
        print(f"bench_dq_reference: skipped: no Degree-Quant reference checkout. Set {ENV} "
              f"(or --reference) to a clone of https://github.com/camlsys/degree-quant at "
              f"commit {REFERENCE_COMMIT}.", file=sys.stderr)
        return None
    torch.set_num_threads(1)
    sides = make_sides(args.reference, args.dataset, args.root, args.protect)
    ref = sides.ref
    if ref.commit is not None and not ref.commit.startswith(REFERENCE_COMMIT):
        print(f"bench_dq_reference: note: the checkout is at {ref.commit[:7]}, not "
              f"{REFERENCE_COMMIT}", file=sys.stderr)
    start = time.perf_counter()

    def log(text: str) -> None:
        print(f"[{time.perf_counter() - start:6.0f} s] {text}", file=sys.stderr, flush=True)

    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    source = ""
    if args.accuracy_from:
        results, earlier = load_results(args.accuracy_from)
        seeds = sorted({s for r in results for s in r.seeds})
        args.epochs = earlier["args"]["epochs"]
        source = (f" Accuracy rows from `{args.accuracy_from}` ({earlier['accuracy_s'] / 60:.0f} "
                  f"min of training on {earlier['machine']}, {earlier['args']['jobs']} jobs).")
    else:
        results = run_accuracy(sides, [ROWS[k] for k in args.rows], seeds, args.epochs, log,
                               args.jobs, (args.reference, args.dataset, args.root,
                                           args.protect))
    accuracy_s = time.perf_counter() - start
    timings = [run_timing(sides, ROWS[k], args.warmup, args.time_rounds, args.time_steps, log,
                          args.fast_dropout) for k in args.time_rows]
    duration = time.perf_counter() - start
    header = (f"## bench_dq_reference\n\n`python -m benchmarks.bench_dq_reference` on "
              f"{machine()}; GCN on {args.dataset}, {len(seeds)} paired seeds x "
              f"{args.epochs} epochs, protection {args.protect[0]:g}:{args.protect[1]:g}; "
              f"reference camlsys/degree-quant {(ref.commit or '?')[:7]} (torch_scatter: "
              f"{ref.scatter}); {duration / 60:.1f} min in all ({accuracy_s / 60:.1f} min "
              "training)." + source)
    body = report(results, timings, header)
    if args.json:
        payload = {"args": {k: v for k, v in vars(args).items()}, "machine": machine(),
                   "torch": torch.__version__, "reference_commit": ref.commit,
                   "torch_scatter": ref.scatter, "duration_s": duration,
                   "accuracy_s": accuracy_s, "results": [r.to_dict() for r in results],
                   "timing": timings}
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)
    return publish("bench_dq_reference", body, write=not args.no_write)


if __name__ == "__main__":
    main()
