"""Every bool, int and float setting of every recipe and of QuantTraining refuses a value
of another type (a string "False" acted as True) with an error naming the setting, the
value and the type expected; values of the right type still work."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.nn.models import GCN

import fxquant
from fxquant.errors import FxquantTypeError, FxquantValueError
from fxquant.recipes import QuantTraining

RECIPES = {name: type(fxquant.recipes.get(name)) for name in fxquant.recipes.available()
           if name != "recommended"}
_GM = fxquant.transform(GCN(4, 8, num_layers=2, out_channels=2), bits=8, lint="off")


def _scalar(hint: Any) -> type | None:
    """bool, int or float for an annotation of one of them (or of it ``| None``)."""
    kinds = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    found = [k for k in kinds if k in (bool, int, float)]
    return found[0] if found else None


def _settings() -> list[tuple[str, str, type]]:
    """(owner, setting, kind) for every scalar setting of the recipes and QuantTraining."""
    found = []
    for name, cls in sorted(RECIPES.items()):
        for f in dataclasses.fields(cls):
            kind = _scalar(typing.get_type_hints(cls)[f.name])
            if kind is not None:
                found.append((name, f.name, kind))
    for arg, hint in typing.get_type_hints(QuantTraining.__init__).items():
        kind = _scalar(hint)
        if kind is not None:
            found.append(("QuantTraining", arg, kind))
    return found


SETTINGS = _settings()


def _build(owner: str, setting: str, value: Any) -> Any:
    if owner == "QuantTraining":
        extra = {"target_bits": 2.0} if setting in ("project", "select") else {}
        return QuantTraining(_GM, **{**extra, setting: value})
    return RECIPES[owner](**{setting: value})


def _wrong(kind: type) -> st.SearchStrategy[Any]:
    """Values that are not of ``kind``: strings of every look, containers, and the other
    scalar types where they would be misread."""
    text = st.one_of(st.sampled_from(["False", "True", "0", "1", "2", "0.5", "", "none"]),
                     st.text(max_size=5))
    others = st.one_of(text, st.just([1]), st.just((0.5,)), st.just({"x": 1}),
                       st.just(torch.tensor(1.0)), st.just(1j))
    if kind is bool:
        return st.one_of(others, st.integers(0, 2), st.floats(allow_nan=False), st.none())
    if kind is int:
        return st.one_of(others, st.booleans(), st.floats(allow_nan=False).filter(
            lambda v: v != int(v) if math.isfinite(v) else True), st.just(2.0))
    return st.one_of(others, st.booleans())


def test_the_strings_of_the_issue_are_refused():
    """quantize_logits="False", midrise="False", shared_step="False",
    QuantTraining(project="False"): a type error naming the setting, value and type."""
    for setting in ("quantize_logits", "midrise", "shared_step"):
        with pytest.raises(FxquantTypeError, match=rf"HubMessages: {setting} must be a bool "
                                                   r"\(True or False\), got 'False' \(a str\)"):
            fxquant.recipes.HubMessages(**{setting: "False"})
    with pytest.raises(FxquantTypeError, match=r"project must be a bool \(True or False\), "
                                               r"got 'False' \(a str\)"):
        QuantTraining(_GM, project="False", target_bits=2.0)


@settings(max_examples=300)
@given(case=st.sampled_from(SETTINGS), data=st.data())
def test_every_scalar_setting_refuses_another_type(case, data):
    """Any recipe's or QuantTraining's bool / int / float setting given a value of another
    type: an FxquantTypeError naming the setting, the value and the type; None only where
    the setting is optional."""
    owner, setting, kind = case
    value = data.draw(_wrong(kind))
    annotated = QuantTraining.__init__ if owner == "QuantTraining" else RECIPES[owner]
    optional = type(None) in typing.get_args(typing.get_type_hints(annotated)[setting])
    if value is None and optional:
        return
    expected = {bool: "a bool", int: "an int", float: "a number"}[kind]
    with pytest.raises(FxquantTypeError, match=rf"{setting} must be {expected}.*\(a "):
        _build(owner, setting, value)


@pytest.mark.parametrize("case", [c for c in SETTINGS if c[2] is float])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_float_settings_refuse_non_finite_numbers(case, value):
    """NaN and infinities are numbers, but no setting means them: a value error naming it."""
    owner, setting, _ = case
    with pytest.raises(FxquantValueError, match=setting):
        _build(owner, setting, value)


def test_the_right_types_still_work():
    """numpy's integers and floats (as plain numbers), ints for floats, and every recipe's
    defaults pass."""
    from fxquant.recipes.checks import check_type  # (a module of this version)

    for cls in RECIPES.values():
        cls()
    fxquant.recipes.get("recommended")
    recipe = fxquant.recipes.HubMessages(target_bits=3, anneal_every=np.int64(4),
                                         hub_quantile=np.float32(0.5))
    assert type(recipe.anneal_every) is int and recipe.hub_quantile == 0.5
    assert type(recipe.hub_quantile) is float and recipe.target_bits == 3
    run = QuantTraining(_GM, refit_epochs=np.int32(2), penalty=1, temperature=np.float64(2.0))
    assert type(run.refit_epochs) is int and run.refit_epochs == 2
    assert type(run.state_dict()["settings"]["temperature"]) is float
    check_type(None, "x", int | None)
    with pytest.raises(FxquantTypeError, match=r"x must be an int or None, got 'a' \(a str\)"):
        check_type("a", "x", int | None)


def test_a_recipe_of_ones_own_is_checked_even_with_annotations_it_cannot_resolve():
    """A recipe whose module annotates a field with a name imported only for type checkers:
    its scalar fields are still checked, the unresolvable one left alone."""
    namespace: dict[str, Any] = {}
    exec(compile(
        "from __future__ import annotations\n"
        "from dataclasses import dataclass\n"
        "from typing import TYPE_CHECKING\n"
        "from fxquant.recipes import Recipe\n"
        "if TYPE_CHECKING:\n"
        "    from somewhere import Thing\n"
        "@dataclass(frozen=True)\n"
        "class Mine(Recipe):\n"
        "    flag: bool = True\n"
        "    rate: float | None = None\n"
        "    thing: Thing | None = None\n", "mine.py", "exec"), namespace)
    mine = namespace["Mine"]
    assert mine(thing="anything").flag is True
    with pytest.raises(FxquantTypeError, match=r"Mine: flag must be a bool.*'False'"):
        mine(flag="False")
    with pytest.raises(FxquantTypeError, match=r"Mine: rate must be a number.*or None"):
        mine(rate="0.1")
