"""Lint reports for people and tools: a table, JSON, or SARIF 2.1.0.

A finding's location is a structured :class:`~fxquant.fx.locations.Location` (path, line);
it is rendered as ``"path:LINE"`` only here, at the edges.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from tabulate import tabulate

from fxquant.errors import FxquantError, FxquantValueError
from fxquant.fx.locations import Location
from fxquant.linter.rules import RULES, Severity, severity_of

__all__ = ["PARTIAL_NOTE", "Finding", "LintError", "LintReport"]


@dataclass(frozen=True)
class Finding:
    """One problem: which rule, where (graph node and user source line), how to fix it.

    ``related`` names a second place, e.g. the op that saved the tensor an in-place op
    modified (``"pow"`` at ``related_location``). The severity comes from the rule table.
    """

    rule: str
    node: str
    location: Location | None
    message: str
    hint: str
    related: str = ""
    related_location: Location | None = None

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise FxquantValueError(f"unknown rule {self.rule!r}; rules: {sorted(RULES)}")

    @property
    def severity(self) -> Severity:
        return severity_of(self.rule)

    @property
    def where(self) -> str:
        """``"path:LINE"`` or ``""``."""
        return str(self.location) if self.location is not None else ""

    @property
    def file(self) -> str:
        return self.location.display_path if self.location is not None else ""

    @property
    def line(self) -> int | None:
        return self.location.line if self.location is not None else None

    @property
    def saved_by(self) -> str:
        """``"pow at path:LINE"`` for the related place, or ``""``."""
        if not self.related:
            return ""
        return f"{self.related} at {self.related_location}" if self.related_location else self.related

    def to_dict(self) -> dict[str, Any]:
        """Plain values for JSON: the location as ``"path:LINE"`` and as path and line."""
        return {"rule": self.rule, "severity": self.severity, "node": self.node,
                "location": self.where, "path": self.file, "line": self.line,
                "message": self.message, "hint": self.hint, "related": self.saved_by}


class LintError(FxquantError, RuntimeError):
    """Raised by ``transform(..., lint="raise")`` when the linter finds errors."""

    def __init__(self, report: LintReport) -> None:
        self.report = report
        super().__init__(f"fxquant lint found {len(report.errors)} error(s):\n{report}")


_ORDER = {"error": 0, "warning": 1, "info": 2}

#: What a report made without example inputs says first.
PARTIAL_NOTE = (
    "PARTIAL CHECK: no example inputs were given, so only the symbolic FX graph was linted; "
    "it cannot see `x += y` or `x[i] = v`, `.data`, which values require grad, or what the "
    "modules do inside: a report without errors does not mean backward is safe. For the "
    "real answer give the input shapes: fxquant.lint(model, fxquant.ShapeSpec((N, F)), "
    "...) in Python, --input NAME=SHAPE[:DTYPE] (e.g. --input x=2708,1433) in the CLI; "
    "no data is needed."
)


@dataclass
class LintReport:
    """What :func:`fxquant.lint` or :func:`fxquant.check` found.

    Example:
        >>> report = LintReport([Finding("FXQ004", "data", Location("model.py", 12),
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
        """Add a finding unless the same rule was reported at the same place already."""
        key = (finding.rule, finding.location, finding.node, finding.saved_by)
        if all((f.rule, f.location, f.node, f.saved_by) != key for f in self.findings):
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

    @property
    def partial(self) -> str:
        """Why this report is not the whole answer, and how to get it ('' when it is)."""
        return PARTIAL_NOTE if self.mode == "symbolic" else ""

    def __str__(self) -> str:
        first = f"{self.partial}\n" if self.partial else ""
        if not self.findings:
            return f"{first}fxquant lint ({self.mode}): no findings"
        rows = [
            [f.rule, f.severity, f.where or "-", f.node,
             f.message + (f"\n(saved by {f.saved_by})" if f.saved_by else ""), f.hint]
            for f in sorted(self.findings, key=lambda f: (_ORDER[f.severity], f.where))
        ]
        return first + tabulate(rows, headers=["rule", "severity", "location", "node",
                                               "message", "hint"],
                                maxcolwidths=[None, None, None, 18, 54, 36])

    def to_json(self, indent: int | None = 2) -> str:
        """All findings as a JSON document (``{"mode": ..., "findings": [...]}``; a report
        made without example inputs starts with ``"partial": "<what to do>"``)."""
        document: dict[str, Any] = {"partial": self.partial} if self.partial else {}
        document.update(mode=self.mode, findings=[f.to_dict() for f in self.findings])
        return json.dumps(document, indent=indent)

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
                        "artifactLocation": {"uri": _uri(f.location)},
                        "region": {"startLine": f.line},
                    },
                    "logicalLocations": [{"name": f.node}],
                }]
            results.append(result)
        run: dict[str, Any] = {}
        if self.partial:  # shown by code-scanning UIs as a tool notification
            run["invocations"] = [{
                "executionSuccessful": True,
                "toolExecutionNotifications": [{"level": "warning",
                                                "message": {"text": self.partial}}],
            }]
        log = {
            "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
            "version": "2.1.0",
            "runs": [{
                **run,
                "tool": {"driver": {
                    "name": "fxquant",
                    "informationUri": "https://github.com/fxquant/fxquant",
                    "rules": [{
                        "id": RULES[r].id,
                        "name": RULES[r].name,
                        "shortDescription": {"text": RULES[r].summary},
                        "fullDescription": {"text": RULES[r].description},
                        "help": {"text": RULES[r].hint},
                        "defaultConfiguration": {"level": level[RULES[r].severity]},
                    } for r in used],
                }},
                "results": results,
            }],
        }
        return json.dumps(log, indent=indent)


def _uri(location: Location | None) -> str:
    path = location.display_path if location is not None else ""
    if os.path.isabs(path):
        return "file://" + path
    return path.replace(os.sep, "/")
