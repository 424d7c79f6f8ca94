"""The dynamic lint: one forward of the model on copies of example inputs, watched."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import nn

from fxquant.errors import FxquantError
from fxquant.fx.serial import PROCESS_LOCK
from fxquant.linter.anomaly import watching_anomaly
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
from fxquant.linter.report import Finding, LintReport
from fxquant.linter.rules import (
    ANOMALY_MODE_IN_FORWARD,
    FORWARD_FAILED,
    strip_comment,
)
from fxquant.linter.shapes import (
    NEEDS_VALUES,
    ShapeSpec,
    fake_copy,
    from_shapes,
    needs_values_note,
    new_mode,
    quiet,
    random_like,
    shape_only,
    shapes_note,
)
from fxquant.linter.state import clone_inputs, restored_state
from fxquant.linter.torch_internals import tree_leaves

__all__ = ["anomaly_finding", "lint_dynamic", "plain_error"]


def anomaly_finding(rec: Recorder) -> Any:
    """The callback :func:`watching_anomaly` calls: FXQ006 at the switching line."""

    def found(where: Any) -> None:
        code = strip_comment(where.code) if where is not None and where.code \
            else "set_detect_anomaly"
        rec.add(ANOMALY_MODE_IN_FORWARD.id, where, rec.node_name("set_detect_anomaly"),
                f"`{code}` switches anomaly detection on from forward: every step runs slower, "
                "the mode stays on for the whole process, and it names the op that saved a "
                "tensor rather than the in-place op that modified it.",
                ANOMALY_MODE_IN_FORWARD.hint)

    return found


def lint_dynamic(model: nn.Module, example_inputs: tuple[Any, ...]) -> LintReport:
    """Lint by running one forward of ``model`` on copies of ``example_inputs`` (on fake
    tensors when some are given by shape only: see :mod:`fxquant.linter.shapes`). An error
    of fxquant's own is an FXQ010 note, never an exception or an error finding."""
    partial = LintReport(mode="shapes" if shape_only(example_inputs) else "dynamic")
    try:
        return _lint_dynamic(model, example_inputs, partial)
    except FxquantError:
        raise
    except Exception as e:
        partial.add(internal_failure(e, "lint"))
        return partial


def _lint_dynamic(model: nn.Module, example_inputs: tuple[Any, ...],
                  report: LintReport) -> LintReport:
    if not shape_only(example_inputs):
        return _lint_run(model, example_inputs, report)
    with PROCESS_LOCK:
        mode = new_mode()
        try:
            fake_model = fake_copy(model, mode)
            fake_inputs = from_shapes(example_inputs, mode)
        except Exception as e:  # state fake tensors cannot stand for (a C++ object)
            return _on_random_data(model, example_inputs, report, needs_values_note(
                e, "the model's state could not be made into fake tensors"))
        # a forward that raises on fake tensors is tried on random data (if that is not
        # too big to make): it may only need what fake tensors lack (`.numpy()`, values)
        small = _elements(example_inputs) <= _RANDOM_DATA_LIMIT
        try:
            with mode, quiet():  # the fake copy is thrown away: only global state is restored
                _lint_run(fake_model, fake_inputs, report, reraise=NEEDS_VALUES,
                          restore=nn.Module(), escalate=small)
        except NEEDS_VALUES as e:
            return _on_random_data(model, example_inputs, report, needs_values_note(e))
        except Exception as e:
            return _on_random_data(model, example_inputs, report, needs_values_note(
                e, "the forward raised on fake tensors"))
        report.add(shapes_note())
        return report


#: Input elements up to which a forward that fails on fake tensors is linted on random data.
_RANDOM_DATA_LIMIT = 50_000_000


def _elements(example_inputs: tuple[Any, ...]) -> int:
    """How many elements random inputs of these shapes would hold."""
    total = 0
    for x in tree_leaves(example_inputs, is_leaf=lambda v: isinstance(v, ShapeSpec)):
        shape = x.shape if isinstance(x, (ShapeSpec, torch.Tensor)) else ()
        total += math.prod(shape)
    return total


def _on_random_data(model: nn.Module, example_inputs: tuple[Any, ...], report: LintReport,
                    note: Finding) -> LintReport:
    """The lint of the real model on random inputs of the given shapes, saying why."""
    report.findings.clear()
    report.mode = "dynamic"
    report.add(note)
    return _lint_run(model, random_like(example_inputs), report)


def _lint_run(model: nn.Module, example_inputs: tuple[Any, ...], report: LintReport,
              reraise: tuple[type[BaseException], ...] = (),
              restore: nn.Module | None = None, escalate: bool = False) -> LintReport:
    """One watched forward; where fxquant's own recording fails on a forward that runs
    without it, again with fewer instruments (:data:`LADDER`), saying what was not checked.
    FXQ009 is reported only when the plain forward raises too (``escalate``: raise that
    error instead, for the caller to try real data)."""
    found, error = _lint_once(model, example_inputs, LADDER[0], reraise, restore)
    plain = plain_error(model, example_inputs, restore) if error is not None else None
    if escalate and isinstance(plain, Exception):
        raise plain
    if error is not None and plain is None:
        earlier = [f for f in found.findings if f.rule != FORWARD_FAILED.id]
        for tools in LADDER[1:]:
            found, again = _lint_once(model, example_inputs, tools, reraise, restore)
            if again is None or tools is LADDER[-1]:
                break
        for finding in earlier:
            report.add(finding)
        report.add(instrument_failure(LADDER[0], tools, error, "forward"))
        found.findings = [f for f in found.findings if f.rule != FORWARD_FAILED.id]
    for finding in found.findings:
        report.add(finding)
    return report


def _lint_once(model: nn.Module, example_inputs: tuple[Any, ...], tools: Instruments,
               reraise: tuple[type[BaseException], ...],
               restore: nn.Module | None) -> tuple[LintReport, BaseException | None]:
    report = LintReport(mode="dynamic")
    rec = Recorder(report, scan_saved=True, copy_saved=False)
    error: BaseException | None = None
    with PROCESS_LOCK, restored_state(model if restore is None else restore):
        inputs = clone_inputs(example_inputs)
        rec.mark_inputs(model_tensors(model, inputs), model)
        out = None
        try:
            with watching_anomaly(anomaly_finding(rec)), installed(rec, tools):
                out = run_forward(model, inputs, rec)
        except KeyboardInterrupt:
            raise
        except reraise:
            raise
        except BaseException as e:  # SystemExit from a forward is a finding, not an exit
            error = e
            report_exception(report, "forward", e)
        rec.report_zero_grad(out)
        rec.report_gradient_writes(out)
    return report, error


def plain_error(model: nn.Module, example_inputs: tuple[Any, ...],
                restore: nn.Module | None = None) -> BaseException | None:
    """What the forward raises with no fxquant instrument at all (None: it runs); the
    model (or ``restore``) is put back afterwards."""
    with PROCESS_LOCK, restored_state(model if restore is None else restore):
        try:
            with torch.enable_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model(*clone_inputs(example_inputs))
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            return e
    return None
