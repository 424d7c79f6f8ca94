"""In-place modules that a container runs: named at the line that built them (or made them
in-place), with the line that calls the container."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import fxquant
from fxquant.linter.sites import built_at
from tests.support.lint_models import (
    MLP,
    HelperBuilt,
    SwitchedInplace,
    TowerBuilt,
    UsesMLP,
    ViaMethod,
    ViaPartial,
    ViaThreeCalls,
)


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


def test_a_container_built_by_a_helper_function_is_named_where_the_helper_builds_it():
    """``self.body = make_block(4)``: the line to fix is in ``make_block`` (another module
    here), found through the model's module namespace."""
    from tests.support import lint_models

    hardtanh = _line(lint_models.make_block, "nn.Hardtanh(inplace=inplace)")
    for report in (fxquant.lint(HelperBuilt(), torch.rand(2, 4)),
                   fxquant.check(HelperBuilt(), torch.rand(2, 4))):
        error = _error(report)
        assert error.rule == "FXQ001"
        assert error.location.path == inspect.getsourcefile(lint_models.make_block)
        assert error.line == hardtanh, (error.line, hardtanh)
        assert "Hardtanh `body.2` built at" in error.message
        assert "`nn.Hardtanh(inplace=False)`" in error.hint
    assert built_at(HelperBuilt(), "body.2").line == hardtanh
    assert built_at(HelperBuilt(), "head.1").line == _line(HelperBuilt, "nn.Hardtanh(inplace=False)")


@pytest.mark.parametrize("how", ["method", "partial", "deep"])
def test_helpers_through_methods_partials_and_three_calls(how):
    """A clean ``nn.Hardtanh(inplace=False)`` elsewhere in the class was named (with the
    hint to build it with inplace=False); the helper's line is the one."""
    from tests.support import lint_models

    model, where = {
        "method": (ViaMethod, (ViaMethod._block, "nn.Hardtanh(inplace=True)")),
        "partial": (ViaPartial, (lint_models.make_block, "nn.Hardtanh(inplace=inplace)")),
        "deep": (ViaThreeCalls, (lint_models._level3, "nn.Hardtanh(inplace=True)"))}[how]
    error = _error(fxquant.lint(model(), torch.rand(2, 4)))
    assert error.line == _line(*where), (error.line, error.message)
    assert "inplace=False)`" in error.hint and "`body.2`" in error.message


def test_helpers_are_followed_two_calls_deep():
    from tests.support import lint_models

    error = _error(fxquant.lint(TowerBuilt(), torch.rand(2, 4)))
    assert error.line == _line(lint_models.make_block, "nn.Hardtanh(inplace=inplace)")
    assert "`tower.1.2`" in error.message


_PYG_MODEL = """\
import torch
from torch import nn
from torch_geometric import nn as gnn


class PygSequential(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = gnn.Sequential("x, edge_index", [
            (gnn.GCNConv(4, 4), "x, edge_index -> x"), nn.Sigmoid(),
            nn.ReLU(inplace=True),
            (gnn.GCNConv(4, 4), "x, edge_index -> x")])

    def forward(self, x, edge_index):
        return self.seq(x, edge_index)
"""


def test_a_pyg_sequential_is_a_container_and_its_generated_forward_is_not_user_code(
        tmp_path, monkeypatch):
    """PyG's ``Sequential`` runs its modules from a forward it writes to a temporary file
    (when the module that builds it imports by name, as a script does): the finding names
    the user's construction line and the call of the container, not that file."""
    import importlib

    from torch_geometric import nn as gnn

    from fxquant.fx.locations import is_internal

    # PyG sets the generated forward on the class: restore PyG's own after the test
    monkeypatch.setattr(gnn.Sequential, "forward", gnn.Sequential.forward)
    path = tmp_path / "pyg_seq_model.py"
    path.write_text(_PYG_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    model = importlib.import_module("pyg_seq_model").PygSequential()
    generated = type(model.seq).forward.__code__.co_filename
    assert generated != inspect.getsourcefile(type(model.seq)) and is_internal(generated)
    error = _error(fxquant.lint(model, torch.rand(5, 4),
                                torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])))
    lines = _PYG_MODEL.splitlines()
    relu = 1 + next(i for i, line in enumerate(lines) if "nn.ReLU(inplace=True)" in line)
    call = 1 + next(i for i, line in enumerate(lines) if "self.seq(x" in line)
    assert (error.location.path, error.line) == (str(path), relu)
    assert "run by the Sequential container `seq`" in error.message
    assert f"called at {error.location.display_path}:{call}" in error.message
