"""Reports for people and tools: what a pass inserted, what the linter found.

The report and the CLI are the only places that format text for display. Findings render
as a table (``str(report)``), JSON (``report.to_json()``) or SARIF 2.1.0
(``report.to_sarif()``, for code-scanning UIs).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from tabulate import tabulate
from torch.fx import GraphModule

from fxquant.spec import RowOverride, describe

__all__ = ["RULES", "Finding", "LintError", "LintReport", "Rule", "summary"]

Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Rule:
    """A lint rule: stable id, short name, default severity and what it means."""

    id: str
    name: str
    severity: Severity
    description: str


#: Every rule the linter and the autograd check report, by stable id.
RULES: dict[str, Rule] = {
    r.id: r
    for r in (
        Rule("FXQ001", "inplace-modifies-saved-tensor", "error",
             "An in-place op writes into a tensor (or a view of its base) that an earlier op "
             "saved for backward; backward fails with 'modified by an inplace operation'."),
        Rule("FXQ002", "inplace-overwrites-grad-tensor", "warning",
             "An in-place write overwrites elements of a tensor that requires grad; legal, "
             "but the overwritten elements no longer pass gradient to what computed them."),
        Rule("FXQ003", "inplace-on-leaf", "error",
             "An in-place op (or out=) writes into a leaf tensor that requires grad "
             "(e.g. a parameter); autograd refuses it."),
        Rule("FXQ004", "data-attribute", "warning",
             "`.data` on a tensor that requires grad: writes through it are invisible to "
             "autograd and give silently wrong gradients."),
        Rule("FXQ005", "factory-without-device", "warning",
             "A tensor is created without device= and then meets data derived from the "
             "inputs or parameters; it stays on the CPU when the model moves to a GPU."),
        Rule("FXQ006", "anomaly-mode-in-forward", "warning",
             "torch.autograd.set_detect_anomaly / detect_anomaly is called from forward: it "
             "slows every step and stays on for the whole process."),
        Rule("FXQ007", "zero-gradient-op", "warning",
             "An op whose derivative is zero almost everywhere (floor, round, sign, "
             "comparisons, reinterpreted bits, argmax, ...) lies between parameters and the "
             "output: parameters upstream receive zero gradient through it."),
        Rule("FXQ008", "parameter-without-gradient", "warning",
             "After one backward, a parameter's gradient is None or exactly zero."),
        Rule("FXQ009", "forward-failed", "error",
             "Running the model (forward or backward) raised an exception."),
        Rule("FXQ010", "not-visible", "info",
             "Something the linter could not see in this mode."),
        Rule("FXQ011", "inplace-maybe-saved", "warning",
             "An in-place op writes into a value an earlier op may have saved for backward; "
             "the symbolic graph cannot tell. Lint with example inputs to know."),
    )
}


@dataclass(frozen=True)
class Finding:
    """One problem: which rule, how bad, where (graph node and user source line), how to fix.

    ``location`` is ``"path/to/file.py:LINE"`` of the user's code (empty when unknown);
    ``related`` names a second place, e.g. the op whose saved tensor was modified.
    """

    rule: str
    severity: Severity
    node: str
    location: str
    message: str
    hint: str
    related: str = ""

    @property
    def file(self) -> str:
        return self.location.rsplit(":", 1)[0] if ":" in self.location else self.location

    @property
    def line(self) -> int | None:
        tail = self.location.rsplit(":", 1)[-1]
        return int(tail) if tail.isdigit() else None


class LintError(RuntimeError):
    """Raised by ``transform(..., lint="raise")`` when the linter finds errors."""

    def __init__(self, report: LintReport) -> None:
        self.report = report
        super().__init__(f"fxquant lint found {len(report.errors)} error(s):\n{report}")


_ORDER = {"error": 0, "warning": 1, "info": 2}


@dataclass
class LintReport:
    """What :func:`fxquant.lint` or :func:`fxquant.check` found.

    Example:
        >>> report = LintReport([Finding("FXQ004", "warning", "data", "model.py:12",
        ...                              "`.data` used", "use .detach()")])
        >>> len(report.errors), len(report.warnings)
        (0, 1)
        >>> print(report)
        rule    severity    location     node    message       hint
        ------  ----------  -----------  ------  ------------  -------------
        FXQ004  warning     model.py:12  data    `.data` used  use .detach()
    """

    findings: list[Finding] = field(default_factory=list)
    #: How the model was examined: "dynamic" (ran with example inputs), "symbolic" or "check".
    mode: str = "dynamic"

    def add(self, finding: Finding) -> None:
        key = (finding.rule, finding.location, finding.node, finding.related)
        if all((f.rule, f.location, f.node, f.related) != key for f in self.findings):
            self.findings.append(finding)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    def by_rule(self, rule: str) -> list[Finding]:
        return [f for f in self.findings if f.rule == rule]

    def __bool__(self) -> bool:
        return bool(self.findings)

    def __len__(self) -> int:
        return len(self.findings)

    def __str__(self) -> str:
        if not self.findings:
            return f"fxquant lint ({self.mode}): no findings"
        rows = [
            [f.rule, f.severity, f.location or "-", f.node,
             f.message + (f"\n(saved by {f.related})" if f.related else ""), f.hint]
            for f in sorted(self.findings, key=lambda f: (_ORDER[f.severity], f.location))
        ]
        return tabulate(rows, headers=["rule", "severity", "location", "node", "message", "hint"],
                        maxcolwidths=[None, None, None, 18, 54, 36])

    def to_json(self, indent: int | None = 2) -> str:
        """All findings as a JSON document (``{"mode": ..., "findings": [...]}``)."""
        return json.dumps({"mode": self.mode, "findings": [asdict(f) for f in self.findings]},
                          indent=indent)

    def to_sarif(self, indent: int | None = 2) -> str:
        """The findings as a SARIF 2.1.0 log, one run of the tool ``fxquant``."""
        used = sorted({f.rule for f in self.findings})
        level = {"error": "error", "warning": "warning", "info": "note"}
        results: list[dict[str, Any]] = []
        for f in self.findings:
            result: dict[str, Any] = {
                "ruleId": f.rule,
                "ruleIndex": used.index(f.rule),
                "level": level[f.severity],
                "message": {"text": f"{f.message} Hint: {f.hint}"},
            }
            if f.line is not None:
                result["locations"] = [{
                    "physicalLocation": {
                        "artifactLocation": {"uri": _uri(f.file)},
                        "region": {"startLine": f.line},
                    },
                    "logicalLocations": [{"name": f.node}],
                }]
            results.append(result)
        log = {
            "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
            "version": "2.1.0",
            "runs": [{
                "tool": {"driver": {
                    "name": "fxquant",
                    "informationUri": "https://github.com/fxquant/fxquant",
                    "rules": [{
                        "id": RULES[r].id,
                        "name": RULES[r].name,
                        "shortDescription": {"text": RULES[r].description},
                        "defaultConfiguration": {"level": level[RULES[r].severity]},
                    } for r in used],
                }},
                "results": results,
            }],
        }
        return json.dumps(log, indent=indent)


def _uri(path: str) -> str:
    if os.path.isabs(path):
        return "file://" + path
    return path.replace(os.sep, "/")


def summary(gm: GraphModule, tablefmt: str = "simple") -> str:
    """A table of the nodes fxquant inserted into ``gm`` (also works on a reloaded GraphModule).

    Args:
        gm (torch.fx.GraphModule): a model returned by :func:`fxquant.transform`.
        tablefmt (str, optional): any :mod:`tabulate` format, e.g. ``"github"``.

    Example:
        >>> from torch_geometric.nn.models import GCN
        >>> from fxquant import transform
        >>> print(summary(transform(GCN(4, 8, num_layers=2, out_channels=2), bits=12)))
        node           after    format      bits  rounding     scale    grad    row override
        -------------  -------  --------  ------  -----------  -------  ------  --------------
        convs_0_trunc  convs.0  top-12        12  toward_zero  -        ste     -
        convs_1_trunc  convs.1  top-12        12  toward_zero  -        ste     -
    """
    from fxquant.passes.insert_truncation import truncations  # the pass imports this module

    rows = []
    for t in truncations(gm):
        override = "-"
        if t.rows is not None and t.rows_number is not None:
            override = RowOverride(t.rows, t.rows_number).describe()
        scale = "-" if t.scale == "none" else t.scale
        if t.running is not None:
            scale += f" (running, momentum {t.running.momentum})"
        grad = t.grad + (f", grad {describe(t.grad_number)}" if t.grad_number is not None else "")
        bits = t.number if isinstance(t.number, int) else t.number.bits
        rows.append([t.node.name, t.after, describe(t.number), bits, t.rounding, scale, grad,
                     override])
    if not rows:
        return "no fxquant truncation nodes in this graph"
    return tabulate(
        rows,
        headers=["node", "after", "format", "bits", "rounding", "scale", "grad", "row override"],
        tablefmt=tablefmt,
    )
