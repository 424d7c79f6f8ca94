"""In-place modules that a container runs: named at the line that built them (or made them
in-place), with the line that calls the container."""

from __future__ import annotations

import inspect

import torch
from torch import nn

import fxquant
from fxquant.linter.sites import built_at
from tests.support.lint_models import MLP, SwitchedInplace, UsesMLP


def _line(cls, text):
    lines, start = inspect.getsourcelines(cls)
    return start + next(i for i, line in enumerate(lines) if text in line)


def _error(report):
    (error,) = report.errors
    return error


def test_a_sequential_subclass_is_named_where_it_built_the_dropout():
    """The model is the container: no line of forward is the user's; lint, shapes and
    check name the Dropout's construction, and the ReLU's as the saving op."""
    dropout = _line(MLP, "nn.Dropout(0.5, inplace=inplace)")
    relu = _line(MLP, "nn.ReLU(inplace=inplace)")
    for report in (fxquant.lint(MLP(), torch.rand(2, 3)), fxquant.check(MLP(), torch.rand(2, 3)),
                   fxquant.lint(MLP(), fxquant.ShapeSpec((2, 3)))):
        error = _error(report)
        assert (error.rule, error.line, error.related_location.line) == ("FXQ001", dropout, relu)
        assert "Dropout `2` built at" in error.message and "(the model itself)" in error.message
        assert "`nn.Dropout(0.5, inplace=False)`" in error.hint


def test_the_container_call_line_is_named_too():
    error = _error(fxquant.lint(UsesMLP(), torch.rand(2, 3)))
    assert error.line == _line(MLP, "nn.Dropout(0.5, inplace=inplace)")
    assert f"called at {error.location.display_path}:{_line(UsesMLP, 'self.mlp(x) * 2')}" \
        in error.message.replace(str(error.location.display_path), error.location.display_path)
    assert "`mlp.2`" in error.message


def test_modules_switched_in_place_after_construction():
    """`m.inplace = True` in a loop: that line is the one to fix, and the hint says so."""
    switch = _line(SwitchedInplace, "m.inplace = True")
    error = _error(fxquant.check(SwitchedInplace(), torch.rand(2, 3)))
    assert error.line == switch and "m.inplace = True" in error.hint
    assert "made in-place at" in error.message


def test_symbolic_lint_names_the_construction_line():
    report = fxquant.lint(MLP())
    (finding,) = [f for f in report.findings if f.rule != "FXQ010"]
    assert finding.line == _line(MLP, "nn.Dropout(0.5, inplace=inplace)")


def test_built_at_without_source_is_none_and_plain_containers_still_report():
    """A Sequential built in a function: no class source to read; the finding still names
    the module (no location), and nothing raises."""
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(inplace=True), nn.Dropout(0.5, inplace=True))
    assert built_at(model, "2") is None
    error = _error(fxquant.lint(model, torch.rand(2, 3)))
    assert error.rule == "FXQ001" and "`2`" in error.message


def test_out_of_place_containers_are_clean():
    assert not fxquant.check(MLP(inplace=False), torch.rand(2, 3)).errors
