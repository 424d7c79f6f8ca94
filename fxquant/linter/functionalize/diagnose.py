"""Step 1 of :func:`~fxquant.linter.functionalize.functionalize_inplace`: diagnose.

The autograd check's protected run (:func:`fxquant.check`'s second run) records every
in-place call with its source line and gives the gradients the forward's own values imply,
also where the real backward crashes (:func:`reference`). Writes that no rewrite can make
equivalent are refused here, naming the line (:func:`refuse_unfixable`): writes into a
leaf that requires grad and writes autograd does not see (``.data``, a ``.detach()``ed
alias, no_grad) that change gradients, whose intended gradient only the author knows.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from fxquant.fx.locations import Location, traceback_location
from fxquant.linter.checking import ProtectedRun, both_runs
from fxquant.linter.functionalize.compare import close, weighted_loss
from fxquant.linter.functionalize.outcome import FunctionalizeError
from fxquant.linter.records import HiddenWrite, InplaceCall
from fxquant.linter.report import LintReport
from fxquant.linter.rules import (
    FORWARD_FAILED,
    INPLACE_MODIFIES_SAVED_TENSOR,
    INPLACE_ON_LEAF,
    INPLACE_REFUSED_IN_FORWARD,
    SILENTLY_WRONG_GRADIENT,
)
from fxquant.linter.state import clone_inputs, named_buffers, restored_state, snapshot
from fxquant.linter.torch_internals import tree_leaves, tree_map_only

__all__ = ["Reference", "reference", "refuse_unfixable"]

@dataclass
class Reference:
    outputs: Any
    requires_grad: list[bool] | None
    buffers: dict[str, Tensor]
    grads: dict[str, Tensor | None] | None
    input_grads: list[Tensor | None]
    forward_raised: bool
    report: LintReport
    calls: list[InplaceCall]
    hidden: list[HiddenWrite]
    state: dict[str, Any]  # module attributes the forward changes: their new values
    other_rng: Tensor  # a second RNG state, to catch random draws frozen into a graph
    other_outputs: Any
    no_grad_lines: set[Location] = field(default_factory=set)  # ran with autograd off
    #: lines that changed a custom Function's output, which torch refuses to use after
    output_writes: list[Location | None] = field(default_factory=list)
    #: lines that wrote into the argument of a function given to torch.autograd.functional
    argument_writes: list[Location | None] = field(default_factory=list)
    #: buffers that carry autograd history after the original's forward (by design)
    carried: set[str] = field(default_factory=set)
    #: whether the original's second forward and backward fail where its first run
    second_step_fails: bool = False


def _plain_attributes(model: nn.Module) -> dict[str, Any]:
    """Plain attributes of every module (not parameters, buffers or submodules): tensors
    (copied) and Python numbers, strings and bools, by qualified name."""
    found: dict[str, Any] = {}
    for name, module in model.named_modules():
        for key, value in vars(module).items():
            if key.startswith("_") or key == "training":
                continue
            if isinstance(value, Tensor) and not isinstance(value, nn.Parameter):
                found[f"{name}.{key}" if name else key] = snapshot(value)
            elif isinstance(value, bool | int | float | str):
                found[f"{name}.{key}" if name else key] = value
    return found


def _changed(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    changed = {}
    for key, value in after.items():
        old = before.get(key)
        same = (isinstance(old, Tensor) and isinstance(value, Tensor)
                and close(old, value, 0.0, 0.0)) \
            or (not isinstance(value, Tensor) and old == value)
        if not same:
            changed[key] = value
    return changed


def _plain_run(model: nn.Module, inputs: tuple, rng: Tensor, grad: bool = False
               ) -> tuple[Any, dict[str, Tensor], dict[str, Any]]:
    """The forward's values with autograd off (where writes into any view are legal; on
    with ``grad``, for a forward that differentiates inside itself), the buffers after it,
    and the plain module attributes it changed."""
    with restored_state(model):
        torch.set_rng_state(rng)
        before = _plain_attributes(model)
        with torch.set_grad_enabled(grad):
            out = model(*clone_inputs(inputs))
        buffers = {n: snapshot(b) for n, b in named_buffers(model)}
        state = _changed(before, _plain_attributes(model))
    return tree_map_only(Tensor, lambda t: t.detach().clone(), out), buffers, state


def _plain_runs(model: nn.Module, inputs: tuple, rng: Tensor, other: Tensor) -> tuple[Any, ...]:
    """:func:`_plain_run` from ``rng`` and from ``other``: without autograd, else (a
    forward that needs autograd, as ``torch.autograd.functional`` does) with it."""
    try:
        first = _plain_run(model, inputs, rng)
        return (*first, _plain_run(model, inputs, other)[0])
    except Exception:
        first = _plain_run(model, inputs, rng, grad=True)
        return (*first, _plain_run(model, inputs, other, grad=True)[0])


def reference(model: nn.Module, inputs: tuple, rng: Tensor) -> Reference:
    report = LintReport(mode="check")
    run = both_runs(model, inputs, weighted_loss, rng, report)
    g = torch.Generator().manual_seed(int(rng.sum()) + 1)
    other_rng = torch.Generator().manual_seed(int(torch.randint(2**62, (), generator=g)))
    other = other_rng.get_state()
    try:
        outputs, buffers, state, other_outputs = _plain_runs(model, inputs, rng, other)
    except Exception as e:  # not even plainly: there is no result to reproduce
        refuse_unfixable(report, run.confirmed, run.rec.output_writes,  # (a known cause first)
                         _argument_writes(run))
        at = traceback_location(e)
        found = "".join(f"\n  {f.rule} at {f.where}: {f.message}" for f in report.errors)
        raise FunctionalizeError(
            f"the original forward raises even with autograd off"
            f"{f' at {at}' if at else ''} ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}), so there is no result an "
            f"out-of-place rewrite could reproduce; fix it first:{found}") from e
    carried, second_step_fails = _two_steps(model, inputs, rng)
    flags = None
    if run.outputs is not None:
        flags = [t.requires_grad for t in tree_leaves(run.outputs) if isinstance(t, Tensor)]
    return Reference(outputs, flags, buffers, run.grads, run.input_grads,
                     bool(report.by_rule(INPLACE_REFUSED_IN_FORWARD.id)), report,
                     run.rec.inplace_calls, run.confirmed, state, other, other_outputs,
                     run.rec.locator.no_grad_lines, run.rec.output_writes,
                     _argument_writes(run), carried, second_step_fails)


def _two_steps(model: nn.Module, inputs: tuple, rng: Tensor) -> tuple[set[str], bool]:
    """Two training steps of the original, as they are: the buffers that carry autograd
    history after the first forward, and whether the second step fails where the first
    ran (a model that keeps its graph in a buffer on purpose)."""
    with restored_state(model), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (anomaly mode's report of a crash, if on)
        torch.set_rng_state(rng)
        try:
            out = model(*clone_inputs(inputs))
            carried = {n for n, b in named_buffers(model)
                       if isinstance(b, Tensor) and b.grad_fn is not None}
            weighted_loss(out).backward()
        except Exception:
            return set(), False
        try:
            weighted_loss(model(*clone_inputs(inputs))).backward()
        except Exception:
            return carried, True
    return carried, False


def _argument_writes(run: ProtectedRun) -> list[Location | None]:
    return [where for a in run.rec.written_arguments() for _, where, _ in a.writes]


def refuse_unfixable(report: LintReport, hidden: list[HiddenWrite],
                     output_writes: Sequence[Location | None] = (),
                     argument_writes: Sequence[Location | None] = ()) -> None:
    """Raise :class:`FunctionalizeError`, naming each line, where no rewrite can be
    equivalent: writes into leaves, writes autograd does not see that change gradients,
    changes to a custom Function's output that torch refuses to use, writes into the
    argument of a function given to ``torch.autograd.functional`` that change its result
    (fxquant does not rewrite inside those functions)."""
    reasons = []
    for write in hidden:
        if write.hint:  # (a contract of its own, e.g. a custom Function's mark_dirty)
            reasons.append(
                f"{write.where or '?'}: `{write.code}` changes {write.target} {write.how}, "
                "which autograd does not see, and the model computes with it afterwards: "
                f"functionalize_inplace does not rewrite custom Functions. Fix: {write.hint}")
            continue
        reasons.append(
            f"{write.where or '?'}: `{write.code}` changes {write.target} {write.how}, which "
            "autograd does not see: an out-of-place rewrite would have to choose a gradient "
            "for it, and which one was meant only the author knows. Fix: compute the new "
            "value out of place (`y = f(y)`) to differentiate through it, or write a "
            "straight-through estimator explicitly, `y = y + (f(y) - y).detach()`")
    for f in report.errors:
        if f.rule == INPLACE_ON_LEAF.id and f.related != "checkpoint":  # (a segment's input: its
            # write is only refused when backward re-runs it; out of place, it is not)
            reasons.append(f"{f.where}: `{f.location.code if f.location else f.node}` writes in "
                           "place into a leaf tensor that requires grad (a parameter or an input): "
                           "no out-of-place rewrite computes the same thing, because the leaf "
                           f"itself changes. Fix: {f.hint}")
        elif f.rule == INPLACE_REFUSED_IN_FORWARD.id and f.location is not None \
                and f.location in output_writes:
            reasons.append(f"{f.where}: {f.message} Which gradient the write was meant to "
                           f"have only the author knows. Fix: {f.hint}")
        elif f.rule == SILENTLY_WRONG_GRADIENT.id and f.location is not None \
                and f.location in argument_writes:
            reasons.append(f"{f.where}: {f.message} functionalize_inplace does not rewrite "
                           "inside the functions given to torch.autograd.functional. Fix: "
                           f"{f.hint}")
        elif f.rule == SILENTLY_WRONG_GRADIENT.id and (f.location is None or f.location not in {
                w.where for w in hidden}):
            reasons.append(f"{f.where}: {f.message} Which gradient was meant only the author "
                           f"knows. Fix: {f.hint}")
        elif f.rule == FORWARD_FAILED.id and not report.by_rule(INPLACE_MODIFIES_SAVED_TENSOR.id) and \
                not report.by_rule(INPLACE_REFUSED_IN_FORWARD.id):
            reasons.append(f"{f.where}: {f.message}")
    if reasons:
        raise FunctionalizeError(
            "functionalize_inplace cannot make this model equivalent out of place:\n  "
            + "\n  ".join(reasons))
