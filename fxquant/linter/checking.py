"""``check``: one forward and backward, run twice, to find what breaks or corrupts backward.

1. The **real** run: the user's forward and backward as they are (on copies of the inputs,
   the model restored afterwards). Its gradients are the ones training would get; None or
   all-zero ones are FXQ008.
2. The **protected** run, from the same RNG state (so dropout draws the same masks): the
   forward runs under the recording modes, and every tensor autograd saves is copied when
   it is saved and handed back from the copy in backward. Backward therefore computes the
   gradients the forward's own values imply, even where the real run crashed ("modified by
   an inplace operation": FXQ001 at the culprit's line) or silently used a value changed
   through ``.data`` (the real gradients differ: FXQ012, naming the write).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from fxquant.errors import FxquantError, FxquantTypeError, FxquantValueError
from fxquant.fx.locations import Location, traceback_location
from fxquant.fx.serial import PROCESS_LOCK
from fxquant.linter.anomaly import watching_anomaly
from fxquant.linter.arguments import with_concrete_args
from fxquant.linter.backward import GradientGuard, GradientWrite, gradient_hint
from fxquant.linter.dynamic import anomaly_finding, plain_error
from fxquant.linter.locate import first_line_after
from fxquant.linter.recorder import Recorder
from fxquant.linter.recording import (
    LADDER,
    Instruments,
    installed,
    instrument_failure,
    internal_failure,
    model_tensors,
    report_exception,
    run_forward,
)
from fxquant.linter.records import HiddenWrite
from fxquant.linter.report import Finding, LintReport
from fxquant.linter.rules import (
    BACKWARD_WRITES_GRADIENT,
    FORWARD_FAILED,
    INPLACE_REFUSED_IN_FORWARD,
    PARAMETER_WITHOUT_GRADIENT,
    SILENTLY_WRONG_GRADIENT,
    hint_for_inplace,
    strip_comment,
)
from fxquant.linter.shapes import shape_only
from fxquant.linter.state import clone_inputs, refuse_lazy, restored_state
from fxquant.linter.torch_internals import tree_leaves

__all__ = ["ProtectedRun", "both_runs", "check", "protected_run"]

Grads = dict[str, Tensor | None]


@dataclass
class ProtectedRun:
    """What the protected run found: the gradients the forward's own values imply."""

    grads: Grads | None  # by parameter name; None when forward or backward raised
    rec: Recorder
    #: hidden writes that make gradients wrong (each reported as FXQ012)
    confirmed: list[HiddenWrite] = field(default_factory=list)
    outputs: Any = None  # the forward's output (None when it raised)
    input_grads: list[Tensor | None] = field(default_factory=list)  # of inputs requiring grad
    error: BaseException | None = None  # what forward or backward raised
    #: lines of custom backwards that wrote into their incoming gradient
    gradient_writes: list[GradientWrite] = field(default_factory=list)
    #: indices (in ``rec.saved``) of saved values changed where no instrument saw it
    unseen: list[int] = field(default_factory=list)


def _sum_outputs(out: Any) -> Tensor:
    floats = [t for t in tree_leaves(out) if isinstance(t, Tensor) and t.is_floating_point()
              and t.requires_grad]
    if not floats:
        raise FxquantTypeError("the model returned no floating-point tensor that requires grad; please "
                        "pass loss_fn=")
    return torch.stack([t.sum() for t in floats]).sum()


def _grads(model: nn.Module) -> Grads:
    return {name: None if p.grad is None else p.grad.detach().clone()
            for name, p in model.named_parameters() if p.requires_grad}


def _input_grads(leaves: list[Tensor]) -> Grads:
    """The gradients of the inputs that require grad, named ``"input 0"``, ``"input 1"``,
    ... (in the order of the example inputs' tensors)."""
    return {f"input {i}": None if t.grad is None else t.grad.detach().clone()
            for i, t in enumerate(leaves)}


def _grad_leaves(inputs: Any) -> list[Tensor]:
    return [t for t in tree_leaves(inputs) if isinstance(t, Tensor) and t.requires_grad]


def _real_run(model: nn.Module, inputs: tuple[Any, ...], loss: Callable[[Any], Tensor],
              rng: Tensor) -> tuple[Grads | None, BaseException | None, Grads]:
    """Forward and backward as the user's code runs them; grads (and those of the inputs
    that require grad), or what it raised."""
    with restored_state(model):
        torch.set_rng_state(rng)
        for p in model.parameters():
            p.grad = None
        copies = clone_inputs(inputs)
        leaves = _grad_leaves(copies)  # before forward, as the protected run takes them
        try:
            with torch.enable_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # anomaly mode's report of a crash, if on
                loss(model(*copies)).backward()
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            return None, e, {}
        return _grads(model), None, _input_grads(leaves)


def check(
    model: nn.Module,
    *example_inputs: Any,
    concrete_args: dict[str, Any] | None = None,
    loss_fn: Callable[[Any], Tensor] | None = None,
    rtol: float = 1e-4,
    atol: float = 1e-6,
) -> LintReport:
    """Run forward and backward and report what breaks, starves or corrupts backward.

    Reports, with the user's source lines: each in-place op that modified a tensor saved
    for backward (FXQ001, the culprit, with the op that saved it); a backward that runs but
    gives other gradients than the forward's values imply (FXQ012, at the write: through
    ``.data`` or a ``.detach()`` alias; a custom Function's backward changing the gradient
    it receives; a write no instrument sees, such as a NumPy view, found by watching the
    user's lines, or else named by the op and line that saved the changed value), only
    where the gradients reaching the changed elements are non-zero; every parameter whose
    gradient is None or exactly zero (FXQ008); and what :func:`fxquant.lint` reports about
    the forward. Where fxquant's recording fails on a model whose plain forward and
    backward run, it checks again with fewer instruments and notes what it could not check
    (FXQ010), never an FXQ009. The model is left exactly as it was (see
    :mod:`fxquant.linter.state`), also when it raises.

    Args:
        model (torch.nn.Module): the model, unmodified.
        *example_inputs: its forward arguments (copied; never written).
        concrete_args (dict, optional): forward arguments fixed by name, as
            :func:`fxquant.lint` takes them: the forward runs with them (put in their
            places of forward's signature).
        loss_fn (callable, optional): maps the output to a scalar loss.
            (default: the sum of all floating-point outputs that require grad)
        rtol, atol (float, optional): tolerance of the gradient comparison.

    Raises:
        FxquantValueError: a lazy layer (``GCNConv(-1, 16)``, ``nn.LazyLinear``) is not
            initialized yet: run the model once on example inputs first.

    Example:
        >>> class Doubler(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.lin = torch.nn.Linear(3, 3)
        ...     def forward(self, x):
        ...         y = self.lin(x).sigmoid()
        ...         y *= 2  # sigmoid saved y for backward
        ...         return y
        >>> report = check(Doubler(), torch.randn(4, 3))
        >>> [(f.rule, f.severity, f.related) for f in report.errors]
        [('FXQ001', 'error', 'sigmoid')]
    """
    if not isinstance(model, nn.Module):
        raise FxquantTypeError(f"fxquant.check expects a torch.nn.Module, got {type(model).__name__}")
    refuse_lazy(model, "check")
    if loss_fn is not None and not callable(loss_fn):
        raise FxquantTypeError(f"loss_fn must be a callable mapping the output to a scalar, got {loss_fn!r}")
    if shape_only(example_inputs):
        raise FxquantValueError("fxquant.check runs backward on values, but some example inputs are "
                         "shapes only (ShapeSpec or meta tensors): pass real tensors, or use "
                         "fxquant.lint(model, *shapes) to lint from shapes alone")
    example_inputs = with_concrete_args(model, example_inputs, concrete_args, "check")
    loss = loss_fn if loss_fn is not None else _sum_outputs
    report = LintReport(mode="check")
    with PROCESS_LOCK, restored_state(model):
        try:
            both_runs(model, example_inputs, loss, torch.get_rng_state(), report, rtol, atol)
        except FxquantError:  # said on purpose (a loss_fn is needed, ...)
            raise
        except Exception as e:  # fxquant's own failure is never the model's error
            report.add(internal_failure(e, "check"))
    return report


def both_runs(model: nn.Module, inputs: tuple[Any, ...], loss: Callable[[Any], Tensor],
              rng: Tensor, report: LintReport, rtol: float = 1e-4,
              atol: float = 1e-6) -> ProtectedRun:
    """The real run and the protected run from RNG state ``rng``, compared; findings go
    to ``report``; the protected run is returned."""
    real, real_error, real_inputs = _real_run(model, inputs, loss, rng)
    first = LintReport(mode="check")
    run = protected_run(model, inputs, loss, rng, first)
    kept = first.findings
    if run.error is not None and (real_error is None or (
            run.outputs is None and plain_error(model, inputs) is None)):
        # fxquant's recording failed where the plain forward and backward run: again with
        # fewer instruments, saying what they cannot check (never an FXQ009)
        error, tools = run.error, LADDER[0]
        for tools in LADDER[1:]:
            again = LintReport(mode="check")
            run = protected_run(model, inputs, loss, rng, again, tools)
            # done when it runs, or when its forward runs and backward fails as the
            # model's own backward does (then that failure is the model's: FXQ009 stays)
            if run.error is None or (run.outputs is not None and real_error is not None) \
                    or tools is LADDER[-1]:
                break
        model_failed = run.error is not None and real_error is not None and run.outputs is not None
        kept = [f for f in first.findings if f.rule != FORWARD_FAILED.id]
        kept += [f for f in again.findings if f.rule != FORWARD_FAILED.id or model_failed]
        kept.append(instrument_failure(LADDER[0], tools, error, "forward and backward"))
    for finding in kept:
        report.add(finding)
    protected, rec = run.grads, run.rec
    wrong: list[str] = []
    if real is not None and protected is not None:
        # the inputs' gradients too (a write can spare every parameter's)
        wrong = _wrong(real, protected, rtol, atol) + _wrong(
            real_inputs, _input_grads_of(run), rtol, atol)
        if wrong:
            _explain(wrong, run, report, lambda: _locate_unseen(model, inputs, rng, run))
    if not wrong and rec.written_arguments():
        rec.report = report
        rec.report_argument_writes(harmful=False)
    crashed_there = real_error is not None and traceback_location(real_error) in {
        w.where for w in run.gradient_writes}
    _report_gradient_writes(run, report, bool(wrong) or crashed_there)
    if real is not None:
        _starved(real, rec, report, "")
    elif protected is not None and not rec.went_on_without_grad:
        _starved(protected, rec, report, " (once the errors above are fixed)")
        if real_error is not None and not report.errors:
            rec.report_checkpoint_writes(report)
            if not report.errors:
                report_exception(report, "backward", real_error)
    return run


def protected_run(model: nn.Module, inputs: tuple[Any, ...], loss: Callable[[Any], Tensor],
                  rng: Tensor, report: LintReport,
                  tools: Instruments = LADDER[0]) -> ProtectedRun:
    """Forward under the recording modes (those ``tools`` asks for) with saved tensors
    copied when saved, then backward from ``loss``; from RNG state ``rng``, the model
    restored afterwards."""
    rec = Recorder(report, scan_saved=False, copy_saved=True)
    with restored_state(model):
        torch.set_rng_state(rng)
        for p in model.parameters():
            p.grad = None
        copies = clone_inputs(inputs)
        leaves = _grad_leaves(copies)
        rec.mark_inputs(model_tensors(model, copies), model)
        out = None
        guard = GradientGuard(None)
        unseen: list[int] = []
        try:
            with watching_anomaly(anomaly_finding(rec)), installed(rec, tools):
                out = run_forward(model, copies, rec)
            rec.cut_at = rec.report_zero_grad(out)
            # saved values changed where no instrument saw it (NumPy views, C extensions)
            unseen = [i for i, entry in enumerate(rec.saved) if entry.changed_unseen()]
            with torch.enable_grad():
                total = loss(out)
                with GradientGuard(total) as guard:
                    total.backward()
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            rec.report_modified()  # backward may never have run to see them
            if not report.by_rule(INPLACE_REFUSED_IN_FORWARD.id):  # (else a consequence of
                # the write torch refuses: its forward would have stopped there)
                report_exception(report, "forward/backward", e)
            return ProtectedRun(None, rec, outputs=out, error=e,
                                gradient_writes=guard.written, unseen=unseen)
        return ProtectedRun(_grads(model), rec, outputs=out, input_grads=[t.grad for t in leaves],
                            confirmed=rec.confirm_hidden(),
                            gradient_writes=[*guard.written, *rec.hook_writes], unseen=unseen)


def _input_grads_of(run: ProtectedRun) -> Grads:
    return {f"input {i}": None if g is None else g.detach()
            for i, g in enumerate(run.input_grads)}


def _wrong(real: Grads, protected: Grads, rtol: float, atol: float) -> list[str]:
    """The parameters (or inputs) whose real gradient differs from the protected one."""
    wrong = []
    for name, got in real.items():
        want = protected.get(name)
        if (got is None) != (want is None) or (got is not None and want is not None and (
                got.shape != want.shape or not torch.allclose(got, want, rtol=rtol, atol=atol,
                                                              equal_nan=True))):
            wrong.append(name)
    return wrong


def _explain(wrong: list[str], run: ProtectedRun, report: LintReport,
             locate: Callable[[], Location | None]) -> None:
    """Say why the real gradients of ``wrong`` differ from those the forward implies, as
    precisely as was observed: a hidden write the recorder saw (already an FXQ012), a
    write into a saved value's memory seen at the ATen level, a custom backward that
    changed its incoming gradient, a saved value changed where no instrument saw it (the
    line found by watching the user's lines, else the op that saved it), or nothing known."""
    rec = run.rec
    if rec.written_arguments():  # the protected run differentiated as the function means
        rec.report = report
        rec.report_argument_writes(harmful=True)
        return
    # hidden writes the recorder saw
    already = {f.location for f in report.by_rule(SILENTLY_WRONG_GRADIENT.id)}
    silent = [(entry, write) for entry in rec.saved for write in entry.silent
              if write[1] is None or write[1] not in already]
    names = ", ".join(repr(n) for n in wrong[:6]) + (" ..." if len(wrong) > 6 else "")
    if silent:
        for entry, (code, where, node, op) in silent:
            saver = f"`{entry.op}`" + (f" at {entry.where}" if entry.where else "")
            fused = op.startswith("_fused_") and not entry.kept_as
            how = ("which went through your saved-tensor hooks as it was, so autograd "
                   "does not check it" if entry.kept_as == "saved_tensors_hooks" else
                   f"which `{entry.op}` keeps as `{entry.kept_as}` instead of through "
                   "save_for_backward, so autograd does not check it" if entry.kept_as else
                   f"through `{op}`, a fused kernel that moves no version counter" if fused
                   else "through `.data`" if ".data" in code else
                   "through an alias autograd does not track")
            report.add(Finding(
                SILENTLY_WRONG_GRADIENT.id, node, where,
                f"backward runs but gives wrong gradients for {names}: the value saved by "
                f"{saver} was changed at this line by `{code}`, {how}.",
                "write out of place (`y = y + 1`), or have the pack hook keep a copy"
                if entry.kept_as == "saved_tensors_hooks" else
                "save it with ctx.save_for_backward (autograd then refuses the write), or "
                "write into a copy (`y = y * 3`)" if entry.kept_as else
                hint_for_inplace(code, op) if fused else
                "compute a new tensor instead of writing into the saved one (`w = f(w)`), "
                "or make the change under torch.no_grad() before the value is used",
                related=entry.op, related_location=entry.where))
        return
    if already or run.gradient_writes:
        return  # reported by the recorder, or by _report_gradient_writes
    suspect = [c for c in rec.checkpoints if not c.input_requires_grad or not c.preserve_rng_state]
    if suspect and not run.unseen:
        segment = suspect[0]
        why = ("none of its inputs requires grad, so backward passes no gradient to the "
               "parameters inside it" if not segment.input_requires_grad else
               "it does not preserve the RNG state (preserve_rng_state=False), so backward "
               "recomputes its random ops (dropout) with other draws")
        report.add(Finding(
            SILENTLY_WRONG_GRADIENT.id, "checkpoint", segment.where,
            f"backward runs but gives other gradients for {names} than the forward's values "
            f"imply: this line runs a reentrant torch.utils.checkpoint segment, and {why}.",
            "pass use_reentrant=False to torch.utils.checkpoint.checkpoint (PyTorch's "
            "recommended mode), which has neither limit"))
        return
    if run.unseen:
        entries = [rec.saved[i] for i in run.unseen]
        first = entries[0]
        saver = f"`{first.op}`" + (f" at {first.where}" if first.where else "")
        where = locate()
        if where is not None:
            report.add(Finding(
                SILENTLY_WRONG_GRADIENT.id, first.op, where,
                f"backward runs but gives wrong gradients for {names}: `{strip_comment(where.code)}` "
                f"changes "
                f"the value that {saver} saved for backward, and autograd does not see it (its "
                "version counter did not move: a NumPy view, a C extension or a kernel wrote "
                "into the memory), so backward computes with the changed value.",
                "do not write into a tensor autograd saved: write into a copy "
                "(`a = y.detach().numpy().copy()`, `y.clone()`), or compute the change with "
                "torch ops into a new tensor",
                related=first.op, related_location=first.where))
            return
        report.add(Finding(
            SILENTLY_WRONG_GRADIENT.id, first.op, first.where,
            f"backward runs but gives wrong gradients for {names}: the value that {saver} "
            "saved for backward (this line) was changed afterwards by a write no instrument sees "
            "and that ran outside the user's Python lines (a NumPy view, a C extension or a "
            "kernel writing into its input, or a hook); backward computes with the changed "
            "value.",
            "find what writes into this value after it is computed and make it write into "
            "a copy (`y.clone()`), or compute the change into a new tensor",
            related=first.op, related_location=first.where))
        return
    report.add(Finding(
        SILENTLY_WRONG_GRADIENT.id, names, None,
        f"backward runs but gives wrong gradients for {names}: a value autograd uses in "
        "backward changed after it was recorded, through a path neither autograd nor "
        "fxquant's instruments see, and no saved value was seen changing in forward (a "
        "backward hook, or a write during backward, can do this).",
        "check hooks and custom backward code for writes into tensors they receive; run "
        "fxquant.check on submodules to narrow the place down"))


def _report_gradient_writes(run: ProtectedRun, report: LintReport, harmful: bool) -> None:
    """A custom backward changed its incoming gradient: FXQ012 when the real gradients
    are wrong (or the real backward failed), else FXQ015 (harmless here, a hazard)."""
    for write in run.gradient_writes:
        what = (f"the tensor hook registered by `{write.code}`" if write.hook else
                f"`{write.code}` in the backward of `{write.function}`")
        hint = gradient_hint(write.code) if not write.hook else (
            "return a new tensor from the hook instead of changing its argument (`lambda g: "
            "g * 0.1` for `lambda g: g.mul_(0.1)`): the hook's result replaces the gradient "
            "on its branch only")
        if harmful:
            report.add(Finding(
                SILENTLY_WRONG_GRADIENT.id, write.function, write.where,
                f"{what[:1].upper()}{what[1:]} writes in place into the gradient it receives; "
                "autograd handed that tensor to other branches too, so their gradients "
                "change: backward runs but the gradients are wrong.", hint))
        else:
            report.add(Finding(
                BACKWARD_WRITES_GRADIENT.id, write.function, write.where,
                f"{what[:1].upper()}{what[1:]} writes in place into the gradient it receives; "
                "here no other branch shares that tensor, so the gradients are right, but a "
                "model that reuses the output would get wrong ones.", hint))


def _locate_unseen(model: nn.Module, inputs: tuple[Any, ...], rng: Tensor,
                   run: ProtectedRun) -> Location | None:
    """Run the forward once more, watching the user's lines, to find the one after which
    a saved value first differs from its copy."""
    indices = list(run.unseen)
    rec = Recorder(LintReport(mode="check"), scan_saved=False, copy_saved=True)

    def changed() -> bool:
        return any(i < len(rec.saved) and rec.saved[i].changed_unseen() for i in indices)

    with restored_state(model):
        torch.set_rng_state(rng)
        copies = clone_inputs(inputs)
        rec.mark_inputs(model_tensors(model, copies), model)
        try:
            with installed(rec), first_line_after(changed) as found:
                run_forward(model, copies, rec)
        except Exception:  # the forward ran before; a second failure leaves it unlocated
            return None
    return found[0] if found else None


def _starved(grads: Grads, rec: Recorder, report: LintReport, when: str) -> None:
    where = ", ".join(sorted({str(rec.origins[k].where) for k in rec.cut_at
                              if rec.origins[k].where}))
    for name, grad in grads.items():
        if grad is None or not bool(grad.ne(0).any()):
            state = "no gradient (None)" if grad is None else "an all-zero gradient"
            report.add(Finding(
                PARAMETER_WITHOUT_GRADIENT.id, name, None,
                f"parameter {name!r} gets {state} from backward{when}"
                + (f"; the gradient path is cut at {where}" if where else ""),
                PARAMETER_WITHOUT_GRADIENT.hint))
