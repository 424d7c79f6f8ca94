"""The lint wing: autograd traps found before training (lint), after one backward (check),
and rewritten out of place (functionalize_inplace); reports as table, JSON or SARIF."""

from fxquant.linter.api import lint
from fxquant.linter.checking import check
from fxquant.linter.functionalize import FunctionalizeError, Rewrite, functionalize_inplace
from fxquant.linter.report import Finding, LintError, LintReport
from fxquant.linter.rules import RULES, Rule
from fxquant.linter.shapes import ShapeSpec
from fxquant.linter.symbolic import lint_graph

__all__ = [
    "RULES",
    "Finding",
    "FunctionalizeError",
    "LintError",
    "LintReport",
    "Rewrite",
    "Rule",
    "ShapeSpec",
    "check",
    "functionalize_inplace",
    "lint",
    "lint_graph",
]
