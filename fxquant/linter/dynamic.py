"""The dynamic lint: one forward of the model on copies of example inputs, watched."""

from __future__ import annotations

from typing import Any

from torch import nn

from fxquant.fx.serial import PROCESS_LOCK
from fxquant.linter.anomaly import watching_anomaly
from fxquant.linter.recording import (
    Recorder,
    installed,
    model_tensors,
    report_exception,
    run_forward,
)
from fxquant.linter.report import LintReport
from fxquant.linter.shapes import (
    NEEDS_VALUES,
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

__all__ = ["anomaly_finding", "lint_dynamic"]


def anomaly_finding(rec: Recorder) -> Any:
    """The callback :func:`watching_anomaly` calls: FXQ006 at the switching line."""

    def found(where: Any) -> None:
        code = where.code if where is not None and where.code else "set_detect_anomaly"
        rec.add("FXQ006", where, rec.node_name("set_detect_anomaly"),
                f"`{code}` switches anomaly detection on from forward: every step runs slower, "
                "the mode stays on for the whole process, and it names the op that saved a "
                "tensor rather than the in-place op that modified it.",
                "remove it from forward; to debug, wrap one step in "
                "`with torch.autograd.detect_anomaly():` or run fxquant.check(model, *inputs)")

    return found


def lint_dynamic(model: nn.Module, example_inputs: tuple[Any, ...]) -> LintReport:
    """Lint by running one forward of ``model`` on copies of ``example_inputs`` (on fake
    tensors when some are given by shape only: see :mod:`fxquant.linter.shapes`)."""
    if not shape_only(example_inputs):
        return _lint_run(model, example_inputs, LintReport(mode="dynamic"))
    with PROCESS_LOCK:
        mode = new_mode()
        report = LintReport(mode="shapes")
        try:
            fake_model = fake_copy(model, mode)
            fake_inputs = from_shapes(example_inputs, mode)
            with mode, quiet():  # the fake copy is thrown away: only global state is restored
                _lint_run(fake_model, fake_inputs, report, reraise=NEEDS_VALUES,
                          restore=nn.Module())
        except NEEDS_VALUES as e:
            report = LintReport(mode="dynamic")
            report.add(needs_values_note(e))
            return _lint_run(model, random_like(example_inputs), report)
        report.add(shapes_note())
        return report


def _lint_run(model: nn.Module, example_inputs: tuple[Any, ...], report: LintReport,
              reraise: tuple[type[BaseException], ...] = (),
              restore: nn.Module | None = None) -> LintReport:
    rec = Recorder(report, scan_saved=True, copy_saved=False)
    with PROCESS_LOCK, restored_state(model if restore is None else restore):
        inputs = clone_inputs(example_inputs)
        rec.mark_inputs(model_tensors(model, inputs), model)
        out = None
        try:
            with watching_anomaly(anomaly_finding(rec)), installed(rec):
                out = run_forward(model, inputs, rec)
        except KeyboardInterrupt:
            raise
        except reraise:
            raise
        except BaseException as e:  # SystemExit from a forward is a finding, not an exit
            report_exception(report, "forward", e)
        rec.report_zero_grad(out)
    return report
