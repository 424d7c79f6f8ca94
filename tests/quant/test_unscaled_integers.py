"""An integer format whose scale is left out rounds to the integers themselves (a step of
1): ``quantize([.3, .7, 200.], "int8")`` is ``[0, 1, 127]``, and ordinary activations
become 0 and +-1. That warns, once per quantization point, saying how to give a scale;
an explicit ``scale="none"`` (or ``":none"`` in the spec) stays silent."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.nn.models import GCN

import fxquant
from fxquant import QuantConfig, QuantMapping

INTEGERS = [*(f"int{b}" for b in (2, 4, 8, 16)), *(f"uint{b}" for b in (1, 4, 8)),
            "int8:asym", "int3:asym", "int1:midrise", "int4:midrise"]
FLOATS = ["e4m3", "e5m2", "e2m1", "fp16", "top16"]


def _model() -> torch.nn.Module:
    return GCN(4, 8, num_layers=2, out_channels=2)


def _unscaled(caught) -> list[str]:
    return [str(w.message) for w in caught if "without a scale" in str(w.message)]


def test_the_reported_cases_warn_and_say_how_to_give_a_scale():
    """transform(format="int8") and quantize(x, "int8") warn, naming the point, the grid
    and scale='tensor'; the values are those of the unscaled grid, as before."""
    with pytest.warns(UserWarning, match=r"int8 without a scale.*scale='tensor'") as caught:
        y = fxquant.quantize(torch.tensor([0.3, 0.7, 200.0]), "int8")
    assert y.tolist() == [0.0, 1.0, 127.0]
    assert caught[0].filename == __file__  # the user's line
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fxquant.transform(_model(), format="int8", lint="off")
    messages = _unscaled(caught)
    assert len(messages) == 2  # one per point
    assert "'convs.0'" in messages[0] and "'convs.1'" in messages[1]
    assert all("-128..127" in m and "scale='none'" in m for m in messages)
    assert {w.filename for w in caught if "without a scale" in str(w.message)} == {__file__}


def test_an_explicit_unscaled_grid_is_silent():
    x = torch.tensor([0.3, 0.7, 200.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fxquant.quantize(x, "int8", scale="none").tolist() == [0.0, 1.0, 127.0]
        assert fxquant.quantize(x, "int8:none").tolist() == [0.0, 1.0, 127.0]
        for mapping in (QuantConfig("int8", scale="none"), QuantConfig("int8:none")):
            fxquant.transform(_model(), mapping, lint="off")
        fxquant.transform(_model(), format="int8", scale="none", lint="off")


@pytest.mark.parametrize("other", [12, "e4m3"])
def test_a_dict_of_integer_formats_takes_the_scale(other):
    """format={layer: "int8"} with scale= scales the integers: beside kept bits it was
    refused as if it were top-N truncation, beside a float format the integers were
    silently left unscaled."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gm = fxquant.transform(_model(), format={"convs.0": "int8", "convs.1": other},
                               scale="tensor", lint="off")
    configs = {p.layer: p.config for _, p in fxquant.quantization_points(gm)}
    assert configs["convs.0"].scale.value == "tensor"
    assert configs["convs.1"].scale.value == ("none" if other == 12 else "tensor")


def _call(entry: str, spec: str, scale: str | None) -> None:
    kwargs = {} if scale is None else {"scale": scale}
    if entry == "quantize":
        fxquant.quantize(torch.randn(6, 4), spec, **kwargs)
    elif entry == "transform":
        fxquant.transform(_model(), format=spec, lint="off", **kwargs)
    elif entry == "dict":
        fxquant.transform(_model(), format={"convs.0": spec}, lint="off", **kwargs)
    else:
        mapping = QuantMapping().set_global(QuantConfig(spec, **kwargs), site=entry)
        fxquant.transform(_model(), mapping, lint="off")


@settings(max_examples=80)
@given(spec=st.sampled_from(INTEGERS + FLOATS),
       how=st.sampled_from(["left out", "none", ":none", "tensor", ":tensor", "row", ":row"]),
       entry=st.sampled_from(["quantize", "transform", "dict", "output", "message", "input"]))
def test_only_an_integer_format_with_its_scale_left_out_warns(spec, how, entry):
    """Every integer format (signed, unsigned, asymmetric, mid-rise, every width), every
    way of giving a scale or none (scale=, in the spec, left out) and every entry
    (quantize, transform's format=, a dict of layers, a config at any site): it warns
    exactly where an integer format's scale is left out, once per point."""
    top = spec.startswith("top")
    if top and how != "left out":
        return  # (top-N truncation has no scale)
    scale = how if how in ("none", "tensor", "row") else None
    full = spec + how if how.startswith(":") else spec
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _call(entry, full, scale)
    points = 1 if entry in ("quantize", "dict") else 2
    expected = points if spec.startswith(("int", "uint")) and how == "left out" else 0
    assert len(_unscaled(caught)) == expected
