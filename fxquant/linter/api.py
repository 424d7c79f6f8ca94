"""``lint``: find what will break or starve backward, naming the culprit's source line."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn
from torch.fx import GraphModule

from fxquant.errors import FxquantError, FxquantTypeError
from fxquant.fx.tracer import LeafSpec, TraceError, check_leaf_modules, trace
from fxquant.linter.anomaly import watching_anomaly
from fxquant.linter.arguments import with_concrete_args
from fxquant.linter.dynamic import lint_dynamic
from fxquant.linter.recording import internal_failure
from fxquant.linter.report import Finding, LintReport
from fxquant.linter.rules import (
    ANOMALY_MODE_IN_FORWARD,
    NOT_VISIBLE,
)
from fxquant.linter.state import refuse_lazy
from fxquant.linter.symbolic import ORIGINAL_KEY, lint_graph

__all__ = ["lint", "untraceable_note"]


def untraceable_note(error: TraceError) -> Finding:
    """FXQ010: without inputs, the model could not even be traced; nothing was linted."""
    first = str(error).splitlines()[0] if str(error) else "TraceError"
    return Finding(
        NOT_VISIBLE.id, "trace", None,
        f"the forward was not linted: without example inputs the model is traced "
        f"symbolically, and tracing could not follow it ({first})",
        "give the input shapes (fxquant.lint(model, fxquant.ShapeSpec((N, F))); in the CLI "
        "--input x=N,F): the real forward then runs on fake tensors")


def lint(
    model: nn.Module,
    *example_inputs: Any,
    concrete_args: dict[str, Any] | None = None,
    leaf_modules: Iterable[LeafSpec] = (),
) -> LintReport:
    """Find what will break or starve backward, naming the culprit's source line.

    With example inputs, one forward runs on copies of them (the model, global modes and
    the RNG are left as they were, also when it raises) and every in-place op, factory
    call, ``.data`` access and anomaly switch is seen as it really happens; example inputs
    given as shapes (:class:`ShapeSpec`, ``meta`` tensors) run it on fake tensors. Without
    example inputs only the symbolic graph is linted: a partial check, and the report
    says so first (``report.partial``, the first line of ``str(report)``). An in-place
    module that a container runs is named at the line that built it. Where fxquant's own
    recording cannot follow a forward that runs without it, the forward is linted with
    fewer instruments and an FXQ010 note says what was not checked; fxquant's own errors
    are never reported as errors in the model.

    Args:
        model (torch.nn.Module or torch.fx.GraphModule): the model, unmodified.
        *example_inputs: forward arguments; strongly recommended.
        concrete_args (dict, optional): forward arguments fixed by name, as in
            :func:`fxquant.trace`: with example inputs the forward runs with them (put in
            their places of forward's signature); without, they fix the symbolic trace.
        leaf_modules (iterable, optional): for the symbolic trace (no example inputs).

    Returns:
        LintReport: findings with ``rule``, ``severity``, ``node``, ``location``,
        ``message`` and ``hint``; ``str(report)`` is a table.

    Raises:
        FxquantValueError: a lazy layer (``GCNConv(-1, 16)``, ``nn.LazyLinear``) is not
            initialized yet: run the model once on example inputs first.

    Example:
        >>> class Model(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.lin = torch.nn.Linear(3, 3)
        ...     def forward(self, x):
        ...         y = torch.exp(self.lin(x))
        ...         y.add_(1)  # exp saved y for its backward
        ...         return y
        >>> report = lint(Model(), torch.randn(2, 3))
        >>> [(f.rule, f.node, f.related) for f in report.errors]
        [('FXQ001', 'add_', 'exp')]
        >>> [f.rule for f in lint(Model()).findings]  # symbolic: sees the add_ node too
        ['FXQ001', 'FXQ010']
    """
    if not isinstance(model, nn.Module):
        raise FxquantTypeError(f"fxquant.lint expects a torch.nn.Module, got {type(model).__name__}")
    check_leaf_modules(leaf_modules)
    refuse_lazy(model, "lint")
    if example_inputs:
        return lint_dynamic(model, with_concrete_args(model, example_inputs, concrete_args,
                                                      "lint"))
    report = LintReport(mode="symbolic")
    if isinstance(model, GraphModule):
        gm = model
    else:
        def found(where: Any) -> None:
            code = where.code if where is not None and where.code else "set_detect_anomaly"
            report.add(Finding(
                ANOMALY_MODE_IN_FORWARD.id, "set_detect_anomaly", where,
                f"`{code}` switches anomaly detection on from forward: every step runs slower "
                "and the mode stays on for the process.",
                "remove it from forward; to debug, wrap one step in "
                "`with torch.autograd.detect_anomaly():`"))

        try:
            with watching_anomaly(found):
                gm = trace(model, concrete_args, leaf_modules)
        except TraceError as e:  # a model tracing cannot follow is not an error in it
            report.add(untraceable_note(e))
            return report
        except FxquantError:
            raise
        except Exception as e:  # fxquant's own failure is never the model's error
            report.add(internal_failure(e, "symbolic trace"))
            return report
        gm.meta[ORIGINAL_KEY] = model
    for finding in lint_graph(gm).findings:
        report.add(finding)
    return report
