"""RULES is the one source of each rule: its constant, its fix hint, the reports and the docs
read it, and no rule id is written out anywhere else in the package."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch

import fxquant
from fxquant.linter import rules
from fxquant.linter.report import Finding, LintReport
from fxquant.linter.rules import RULES, Rule, rules_table

PACKAGE = Path(fxquant.__file__).resolve().parent
DOCS = Path(__file__).resolve().parents[2] / "docs" / "source"
_ID = re.compile(r"FXQ\d{3}")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.body and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant):
            found.add(id(node.body[0].value))
    return found


def test_no_rule_id_is_written_out_outside_the_rule_table():
    """Code refers to rules through their constants; only docstrings (which show users
    what a report holds) name the ids."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == Path(rules.__file__).resolve():
            continue
        tree = ast.parse(path.read_text())
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in docstrings and _ID.search(node.value):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: "
                                 f"{node.value[:60]!r}")
    assert not offenders, "\n".join(offenders)


def test_each_rule_is_a_constant_named_after_it():
    constants = {name: value for name, value in vars(rules).items() if isinstance(value, Rule)}
    assert {rule.name.upper().replace("-", "_") for rule in RULES.values()} == set(constants)
    for name, rule in constants.items():
        assert RULES[rule.id] is rule and rule.name.upper().replace("-", "_") == name
        assert name in rules.__all__


@pytest.mark.parametrize("rule", RULES.values(), ids=lambda r: r.id)
def test_each_rule_says_what_it_finds_and_how_to_fix_it(rule):
    assert _ID.fullmatch(rule.id) and re.fullmatch(r"[a-z]+(-[a-z]+)*", rule.name)
    assert rule.severity in ("error", "warning", "info")
    for text in (rule.summary, rule.description, rule.hint):
        assert text.strip() and "|" not in text and "\n" not in text


def test_ids_are_stable_and_in_order():
    """Ids are never reused or renumbered: FXQ001 to FXQ018, in table order."""
    assert list(RULES) == [f"FXQ{i:03d}" for i in range(1, 19)]


def test_the_docs_rule_table_is_the_rule_tables_own_text():
    """The concepts page holds exactly ``rules_table()``: paste it there when a rule changes."""
    page = (DOCS / "concepts" / "lint-rules.md").read_text()
    assert rules_table() in page


def test_a_sarif_log_describes_each_rule_from_the_table():
    report = LintReport([Finding(rules.DATA_ATTRIBUTE.id, "data", None, "`.data` used",
                                 "use .detach()")])
    (described,) = json.loads(report.to_sarif())["runs"][0]["tool"]["driver"]["rules"]
    rule = rules.DATA_ATTRIBUTE
    assert described["shortDescription"]["text"] == rule.summary
    assert described["fullDescription"]["text"] == rule.description
    assert described["help"]["text"] == rule.hint


def test_a_generic_finding_carries_its_rules_hint():
    """Where nothing about the line changes the fix, the finding's hint is the rule's."""

    class Data(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(x) * self.lin.weight.data.sum()

    (finding,) = fxquant.lint(Data(), torch.randn(1, 2)).by_rule(rules.DATA_ATTRIBUTE.id)
    assert finding.hint == rules.DATA_ATTRIBUTE.hint
