"""fxquant.lint without example inputs (the symbolic graph), reports, and transform(lint=)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

import fxquant
from fxquant.linter import lint_graph
from tests.support.lint_models import ParamWrite, SymbolicTraps
from tests.support.models import GCN, SeedGCN
from tests.support.sarif import validate_sarif

LINT = Path(__file__).resolve().parents[1] / "support" / "lint_models.py"


def line_of(text: str) -> str:
    lines = LINT.read_text().splitlines()
    return f"lint_models.py:{next(i for i, line in enumerate(lines, 1) if text in line)}"


def where(report, rule):
    return sorted(f.where.rsplit("/", 1)[-1] for f in report.by_rule(rule))


def test_symbolic_graph_findings():
    """The add_ into exp's saved output, the constant, floor, and what it cannot see."""
    report = fxquant.lint(SymbolicTraps())
    assert report.mode == "symbolic"
    assert where(report, "FXQ001") == [line_of("y.add_(1)")]
    assert report.by_rule("FXQ001")[0].related == "exp"
    assert where(report, "FXQ005") == [line_of("torch.arange(3)")]
    assert where(report, "FXQ007") == [line_of("torch.floor(self.lin(x))")]
    assert [f.severity for f in report.by_rule("FXQ010")] == ["info"]
    # F.relu(inplace=True) after a Linear is legal: Linear saves its input, not its output.
    assert line_of("inplace=True") not in where(report, "FXQ001") + where(report, "FXQ011")


def test_symbolic_parameter_write_and_data():
    """Writing into a parameter is FXQ003; a used .data is FXQ004."""
    report = fxquant.lint(ParamWrite())
    assert where(report, "FXQ003") == [line_of("self.w.mul_(2)")]

    class UsesData(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * self.w.data

    assert [f.rule for f in fxquant.lint(UsesData()).findings] == ["FXQ004", "FXQ010"]


def test_symbolic_lint_catches_anomaly_mode_while_tracing_and_restores_it():
    """Tracing runs forward's Python: the anomaly switch is reported and undone."""
    report = fxquant.lint(_AnomalyOnly())
    assert [f.rule for f in report.findings] == ["FXQ006", "FXQ010"]
    assert not torch.is_anomaly_enabled()


class _AnomalyOnly(torch.nn.Module):
    def forward(self, x):
        torch.autograd.set_detect_anomaly(True)
        return x * 2


def test_symbolic_plain_gcn_has_only_the_note():
    """A plain GCN: no error and no warning."""
    report = fxquant.lint(GCN())
    assert [f.rule for f in report.findings] == ["FXQ010"]


def test_symbolic_lint_of_an_untraceable_model_says_how():
    """The seed model cannot be traced symbolically: no exception, a report that says
    first that the check was partial, and a note naming the line and asking for shapes."""
    report = fxquant.lint(SeedGCN())
    assert str(report).startswith("PARTIAL CHECK")
    (note,) = report.by_rule("FXQ010")
    assert note.node == "trace"
    assert "models.py" in note.message and "ShapeSpec" in note.hint
    assert not report.errors
    assert not torch.is_anomaly_enabled()


def test_transform_lints_its_result():
    """lint='warn' warns about grad='zero'; 'raise' raises LintError on errors; 'off' is quiet."""
    with pytest.warns(UserWarning, match="FXQ007"):
        fxquant.transform(GCN(), bits=8, grad="zero")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fxquant.transform(GCN(), bits=8)
        fxquant.transform(GCN(), bits=8, grad="zero", lint="off")
    with pytest.raises(fxquant.LintError, match="FXQ003"):
        fxquant.transform(ParamWrite(), bits=8, layers="mul", lint="raise")
    with pytest.raises(ValueError, match="lint='loud'"):
        fxquant.transform(GCN(), bits=8, lint="loud")


def test_lint_graph_does_not_modify_the_graph():
    """Lint reports; it does not edit the graph."""
    gm = fxquant.trace(SymbolicTraps())
    code = gm.code
    lint_graph(gm)
    assert gm.code == code


# -- report formats ------------------------------------------------------------------------


def test_report_table_json_and_sarif(graph):
    """str() is a table; JSON round-trips; SARIF 2.1.0 has its required fields."""
    report = fxquant.lint(SeedGCN(), graph)
    table = str(report)
    assert "FXQ001" in table and "rule" in table.splitlines()[0]
    data = json.loads(report.to_json())
    assert data["mode"] == "dynamic" and len(data["findings"]) == len(report.findings)
    assert set(data["findings"][0]) == {"rule", "severity", "node", "location", "path", "line",
                                        "message", "hint", "related"}
    validate_sarif(json.loads(report.to_sarif()), expected_results=len(report.findings))


def test_empty_report():
    """No findings: a plain sentence, an empty SARIF run."""
    report = fxquant.LintReport(mode="dynamic")
    assert str(report) == "fxquant lint (dynamic): no findings"
    validate_sarif(json.loads(report.to_sarif()), expected_results=0)


class _CachedConvRelu(torch.nn.Module):
    """An in-place ReLU on a cached GCNConv's output: the symbolic lint probes the conv."""

    def __init__(self):
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.conv = GCNConv(4, 4, cached=True)

    def forward(self, x, edge_index):
        return torch.nn.functional.relu(self.conv(x, edge_index), inplace=True)


def test_symbolic_lint_leaves_the_model_as_it_was(graph):
    """Probing runs on a copy: a GCNConv(cached=True) keeps no cache built from random
    probe data, and its outputs stay those of an untouched copy."""
    import copy

    model = _CachedConvRelu()
    untouched = copy.deepcopy(model)
    fxquant.lint(model)
    assert model.conv._cached_edge_index is None
    assert torch.equal(model(graph.x, graph.edge_index), untouched(graph.x, graph.edge_index))
