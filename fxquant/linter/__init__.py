"""The lint wing: autograd traps found before training (lint), after one backward (check),
and rewritten out of place (functionalize_inplace); reports as table, JSON or SARIF."""

from fxquant.linter.api import lint
from fxquant.linter.checking import check
from fxquant.linter.functionalize import functionalize_inplace
from fxquant.linter.report import Finding, LintError, LintReport
from fxquant.linter.rules import RULES, Rule
from fxquant.linter.symbolic import lint_graph

__all__ = [
    "RULES",
    "Finding",
    "LintError",
    "LintReport",
    "Rule",
    "check",
    "functionalize_inplace",
    "lint",
    "lint_graph",
]
