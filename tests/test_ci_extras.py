"""A test that needs an extra skips for a user and fails in a CI cell that installed it."""

from __future__ import annotations

import pytest

from tests.support import extras


@pytest.mark.parametrize("env, expected", [
    ({}, set()),
    ({"CI": "true"}, {"scale", "export"}),
    ({"CI": "true", "FXQUANT_CI_EXTRAS": "export"}, {"export"}),
    ({"CI": "true", "FXQUANT_CI_EXTRAS": "scale, export"}, {"scale", "export"}),
    ({"CI": "true", "FXQUANT_CI_EXTRAS": ""}, set()),
])
def test_ci_extras_read_the_cell(monkeypatch, env, expected):
    for name in ("CI", "FXQUANT_CI_EXTRAS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert extras.ci_extras() == expected


def test_missing_module_skips_outside_ci_and_fails_in_a_cell_with_the_extra(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="fxquant\\[export\\]"):
        extras.require("export", "no_such_module_for_fxquant")
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("FXQUANT_CI_EXTRAS", "export")
    with pytest.raises(ImportError):
        extras.require("export", "no_such_module_for_fxquant")
    monkeypatch.setenv("FXQUANT_CI_EXTRAS", "scale")
    with pytest.raises(pytest.skip.Exception):
        extras.require("export", "no_such_module_for_fxquant")
