"""Format names people use, and one grammar for a format's variant and its scale.

``"mxfp4"``/``"mxfp8"`` (the OCP MX types, a format and its block-32 scale),
``torch.float8_e4m3fn``/``torch.float8_e5m2`` are formats; a bare ``"fp8"`` is refused as
ambiguous. ``"int8:asym"`` is a variant and ``"uint1:row"`` a scale: the last ``":"``
field is a scale where it names one (``input_format="int8:asym"`` failed with
``scale='asym'``)."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.data import Data
from torch_geometric.nn.models import GCN

import fxquant
from fxquant import QuantConfig
from fxquant.errors import FxquantValueError
from fxquant.formats import SCALED_PRESETS, parse, parse_scaled
from fxquant.modes import Scale, ScaleKind, register_scale, unregister_scale

BASES = ["e4m3", "e5m2", "fp16", "bf16", "e3m2", "e2m3", "e2m1", "e3m0", "e2m5",
         "e4m3:bias=6:special=none:subnormals=1:overflow=saturate", "int8", "int2", "uint4",
         "uint1", "int8:asym", "int3:asym", "int4:midrise", "int1:midrise", "fp4", "e4m3fn"]
SCALES = [None, "none", "tensor", "row", "tensor-pow2", "row-pow2", "block32"]
DTYPES = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2", torch.float16: "fp16",
          torch.bfloat16: "bf16", torch.int8: "int8", torch.uint8: "uint8",
          torch.int16: "int16"}


def _x() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(6, 40, generator=g) * torch.logspace(-3, 3, 40)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_the_reported_names():
    """mxfp4 / mxfp8 are E2M1 / E4M3 with a block-32 power-of-two scale; the float8 dtypes
    are their formats; fp8 names both choices; input_format='int8:asym' works."""
    assert QuantConfig("mxfp4") == QuantConfig("e2m1", scale="block32")
    assert QuantConfig("mxfp8") == QuantConfig("e4m3", scale="block32")
    assert QuantConfig(torch.float8_e4m3fn) == QuantConfig("e4m3")
    x = _x()
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # bit-identical to torch's cast
        saturated = x.clamp(-448, 448) if dtype == torch.float8_e4m3fn else x  # (2.12: NaN)
        assert _same(fxquant.quantize(x, dtype), saturated.to(dtype).float())
    with pytest.raises(FxquantValueError, match=r"'fp8' is ambiguous.*'e4m3'.*'e5m2'"):
        QuantConfig("fp8")
    recipe = fxquant.recipes.HubMessages(input_format="int8:asym", anneal_every=0,
                                         fit_budget=False)
    graph = Data(x=torch.rand(6, 4), num_nodes=6,
                 edge_index=torch.tensor([[1, 2, 3, 4, 5, 0], [0, 0, 0, 0, 0, 1]]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = recipe.prepare(GCN(4, 8, num_layers=2, out_channels=2), graph, lint="off")
    point = run.model.get_submodule("convs_0_input_quant")
    assert point.config.format.spec() == "int8:asym" and point.config.scale is Scale.NONE
    assert fxquant.recipes.HubMessages(input_format="uint1:row").input_format == "uint1:row"


@settings(max_examples=300)
@given(base=st.sampled_from(BASES), scale=st.sampled_from(SCALES), upper=st.booleans())
def test_a_scale_in_the_spec_is_the_scale_given(base, scale, upper):
    """Every format and variant (presets, aliases, eXmY and its long form, integers with
    ':asym' / ':midrise', in any case) with every scale after its last ':': the same
    config, the same rounding and the same parse as the format with scale=."""
    spec = base if scale is None else f"{base}:{scale}"
    spec = spec.upper() if upper else spec
    fmt, named = parse_scaled(spec)
    assert fmt == parse(base) and named == (None if scale is None else Scale(scale))
    assert QuantConfig(spec) == QuantConfig(base, scale=scale)
    assert QuantConfig(spec).scale_given == (scale is not None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (an integer left unscaled says so)
        assert _same(fxquant.quantize(_x(), spec), fxquant.quantize(_x(), base, scale=scale))
    if scale is not None:
        with pytest.raises(FxquantValueError, match="names a scale"):
            parse(spec)
        other = "row" if scale != "row" else "tensor"
        with pytest.raises(FxquantValueError, match="give the scale once"):
            QuantConfig(spec, scale=other)
        assert QuantConfig(spec, scale=scale) == QuantConfig(spec)


@settings(max_examples=100)
@given(name=st.sampled_from(sorted(SCALED_PRESETS)),
       suffix=st.sampled_from([None, "block32", "tensor", "row", "none"]),
       entry=st.sampled_from(["config", "quantize", "transform"]))
def test_a_name_that_carries_its_scale(name, suffix, entry):
    """The MX names are their element format with scale='block32' in every entry; a
    conflicting scale (in the spec or as scale=) is refused, naming the name."""
    element, implied = SCALED_PRESETS[name]
    spec = name if suffix is None else f"{name}:{suffix}"
    if suffix not in (None, implied):
        with pytest.raises(FxquantValueError, match=f"{name} carries the scale 'block32'"):
            parse_scaled(spec)
        return
    if entry == "config":
        assert QuantConfig(spec) == QuantConfig(element, scale="block32")
        with pytest.raises(FxquantValueError, match="give the scale once"):
            QuantConfig(spec, scale="tensor")
    elif entry == "quantize":
        assert _same(fxquant.quantize(_x(), spec), fxquant.quantize(_x(), element,
                                                                     scale="block32"))
    else:
        gm = fxquant.transform(GCN(4, 8, num_layers=2, out_channels=2), format=spec, lint="off")
        assert {str(p.config.describe()) for _, p in fxquant.quantization_points(gm)} == \
            {f"{element}, nearest, scale block32, ste"}


@pytest.mark.parametrize("dtype", sorted(DTYPES, key=str))
def test_torch_dtypes_are_their_formats_everywhere(dtype):
    name = DTYPES[dtype]
    assert parse(dtype) == parse(name) and QuantConfig(dtype) == QuantConfig(name)
    scale = "none" if name.startswith(("int", "uint")) else None
    assert _same(fxquant.quantize(_x(), dtype, scale=scale),
                 fxquant.quantize(_x(), name, scale=scale))
    gm = fxquant.transform(GCN(4, 8, num_layers=2, out_channels=2), format=dtype,
                           scale="tensor", lint="off")
    assert {p.config.format.spec() for _, p in fxquant.quantization_points(gm)} == {name}


@pytest.mark.parametrize("spec", ["fp8", "FP8", "fp8:tensor", "fp6", "mxfp6"])
def test_ambiguous_names_are_refused_naming_the_choices(spec):
    with pytest.raises(FxquantValueError, match="ambiguous"):
        QuantConfig(spec)


def test_other_dtypes_are_refused_naming_the_ones_read():
    with pytest.raises(FxquantValueError, match=r"torch.float32 is not a format.*float8_e4m3fn"):
        QuantConfig(torch.float32)


class _PerColumn(ScaleKind):
    name = "column"

    def bounds(self, x):
        lo, hi = x.amin(0, keepdim=True), x.amax(0, keepdim=True)
        return torch.stack([lo, hi], dim=-1)

    def storage_bits(self, rows, width):
        return 32 * width


def test_a_registered_scale_ends_a_spec_and_cannot_be_a_variant():
    kind = register_scale(_PerColumn())
    try:
        fmt, scale = parse_scaled("int8:asym:column")
        assert fmt == parse("int8:asym") and scale is kind
        assert QuantConfig("int4:column").scale is kind
    finally:
        unregister_scale("column")

    class Asym(_PerColumn):
        name = "asym"

    with pytest.raises(FxquantValueError, match="variant of the integer formats"):
        register_scale(Asym())
