"""Formats and fxquant.quantize: torch's casts, a NumPy reference, scaling, gradients, errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fxquant
from fxquant.formats import PRESETS, Format, TopN, parse
from tests.support.numerics import format_values, np_quantize, random_floats, same

TORCH_CASTS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2,
               "fp16": torch.float16, "bf16": torch.bfloat16}


def cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """torch's cast to ``dtype`` and back, with E4M3's overflow saturating at 448 as torch
    2.13 casts it (torch 2.12's cast gives NaN there)."""
    if dtype == torch.float8_e4m3fn:
        x = x.clamp(-448.0, 448.0)
    return x.to(dtype).float()


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_all_fp8_codes_round_trip(name):
    """Each of the 256 codes decoded to float32 quantizes to itself, as torch casts it."""
    codes = torch.arange(256, dtype=torch.uint8).view(TORCH_CASTS[name]).float()
    assert same(fxquant.quantize(codes, name), codes).all()
    assert same(fxquant.quantize(codes, name), codes.to(TORCH_CASTS[name]).float()).all()


@pytest.mark.parametrize("name", list(TORCH_CASTS))
def test_bit_identical_to_torch_casts(name):
    """Millions of values, with specials, subnormals, out-of-range and exact ties."""
    dtype = TORCH_CASTS[name]
    x = random_floats()
    if name in ("e4m3", "e5m2"):
        codes = torch.arange(256, dtype=torch.uint8).view(dtype).double()
        grid = codes[codes.isfinite()].unique()
        x = torch.cat([x, ((grid[1:] + grid[:-1]) / 2).float()])  # every tie between codes
    mismatch = ~same(fxquant.quantize(x, name), cast(x, dtype))
    assert not mismatch.any(), x[mismatch][:5]


@pytest.mark.parametrize("name", list(TORCH_CASTS))
def test_round_float_equals_torch_casts(name):
    """The per-element rounding itself (what compiled graphs, float64 inputs and other
    roundings use; eager float32 to nearest takes torch's cast) against the casts, bit for
    bit."""
    from fxquant._ops.rounding import round_float

    dtype = TORCH_CASTS[name]
    x = random_floats()
    if name in ("e4m3", "e5m2"):
        codes = torch.arange(256, dtype=torch.uint8).view(dtype).double()
        grid = codes[codes.isfinite()].unique()
        x = torch.cat([x, ((grid[1:] + grid[:-1]) / 2).float()])
    mismatch = ~same(round_float(x, PRESETS[name], "nearest"), cast(x, dtype))
    assert not mismatch.any(), x[mismatch][:5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rounding", ["nearest", "toward_zero"])
def test_pattern_rounding_equals_rounding_by_spacing(dtype, rounding):
    """Both ways of rounding magnitudes agree bit for bit, on random patterns (subnormals,
    huge values, NaN and inf) and on every tie and grid point of each format. The pattern
    way serves nearest and toward zero; the spacing way the other cases."""
    from fxquant._ops.layouts import layout_of
    from fxquant._ops.rounding import _round_by_spacing, _round_pattern, _rounds_by_pattern

    layout = layout_of(dtype)
    formats = [PRESETS[n] for n in ("e4m3", "e5m2", "fp16", "bf16", "e3m2", "e2m3", "e2m1")] + [
        Format(4, 3, bias=3), Format(8, 3), Format(6, 9), Format(2, 2, subnormals=False)]
    x = random_floats(n=200_000, seed=2).to(dtype)
    if dtype == torch.float64:
        g = torch.Generator().manual_seed(3)
        x = torch.cat([x, torch.randint(-(2**62), 2**62, (200_000,), generator=g).view(dtype)])
    for fmt in formats:
        assert _rounds_by_pattern(fmt, rounding, layout)
        grid = torch.from_numpy(format_values(fmt)).to(dtype)
        a = torch.cat([x, grid, (grid[1:] + grid[:-1]) / 2]).abs()
        a = a[a.isfinite()]
        got = _round_pattern(a, fmt, rounding, layout)
        expected = _round_by_spacing(a, fmt, rounding, layout, None)
        bad = got.view(layout.int_dtype) != expected.view(layout.int_dtype)
        assert not bad.any(), (fmt.spec(), a[bad][:5], got[bad][:5], expected[bad][:5])
    assert not _rounds_by_pattern(Format(3, 0), rounding, layout)
    assert not _rounds_by_pattern(PRESETS["e4m3"], "stochastic", layout)


CUSTOM = [
    PRESETS["e3m2"], PRESETS["e2m3"], PRESETS["e2m1"], Format(3, 0), Format(1, 1), Format(0, 3),
    Format(4, 3), Format(2, 2, subnormals=False), Format(3, 1, bias=2),
    Format(4, 2, special="ieee", overflow="inf"), Format(3, 3, special="nan_only"),
    Format(5, 4, special="ieee"),
]


@pytest.mark.parametrize("fmt", CUSTOM, ids=lambda f: f.spec())
@pytest.mark.parametrize("rounding", ["nearest", "toward_zero"])
def test_formats_torch_lacks_match_numpy_reference(fmt, rounding):
    """MX element types and custom formats against an independent NumPy search."""
    x = random_floats(n=40_000, seed=1)
    grid = torch.from_numpy(format_values(fmt)).float()
    mids = (grid[1:] + grid[:-1]) / 2
    x = torch.cat([x, grid, -grid, mids, -mids, x[:1000] * fmt.max_finite / 3])
    got = fxquant.quantize(x, fmt, rounding)
    expected = torch.from_numpy(np_quantize(x.numpy(), fmt, rounding))
    bad = ~same(got, expected)
    assert not bad.any(), (x[bad][:5], got[bad][:5], expected[bad][:5])


def test_preset_numbers():
    """Max, min normal and bits of the presets are the published ones."""
    expect = {"e4m3": (448.0, 8), "e5m2": (57344.0, 8), "fp16": (65504.0, 16),
              "bf16": (3.3895313892515355e38, 16), "e3m2": (28.0, 6), "e2m3": (7.5, 6),
              "e2m1": (6.0, 4)}
    assert {k: (PRESETS[k].max_finite, PRESETS[k].bits) for k in expect} == expect
    assert PRESETS["e2m1"].min_subnormal == 0.5 and PRESETS["e4m3"].min_subnormal == 2.0**-9


@given(st.sampled_from(["e4m3", "e5m2", "e3m2", "e2m1", "e3m0", "fp16"]),
       st.sampled_from(["nearest", "toward_zero", "stochastic"]),
       st.sampled_from([None, "tensor", "row", "tensor-pow2"]),
       st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=2, max_size=16))
def test_nan_sign_and_finiteness(name, rounding, scale, values):
    """NaN stays NaN, the sign never flips, no finite input becomes NaN."""
    x = torch.tensor(values, dtype=torch.float32).view(2, -1) if len(values) % 2 == 0 else \
        torch.tensor(values, dtype=torch.float32)[None]
    y = fxquant.quantize(x, name, rounding, scale=scale)
    assert torch.equal(y.isnan(), x.isnan())
    keep = ~x.isnan()
    assert torch.equal(torch.signbit(y[keep]), torch.signbit(x[keep]))


@pytest.mark.parametrize("name", ["e4m3", "e2m1", "e3m2"])
def test_stochastic_neighbours_and_unbiased(name):
    """Each result is the value just below or above; the mean over draws is the input."""
    n = 20000
    x = torch.tensor([0.3, -1.37, 2.9, 0.013], dtype=torch.float64)
    y = fxquant.quantize(x.repeat(n, 1), name, "stochastic").abs()
    grid = torch.from_numpy(format_values(parse(name)))
    a = x.abs()
    lo = grid[torch.searchsorted(grid, a, right=True) - 1]
    hi = grid[torch.searchsorted(grid, a)]
    assert ((y == lo) | (y == hi)).all()
    sigma = (hi - lo) * 0.5 / n**0.5
    assert ((y.mean(0) - a).abs() <= 6 * sigma).all()


def test_scaling_modes():
    """Per-tensor and per-row scales put the amax on the format's max; pow2 is exact."""
    x = torch.tensor([[0.001, 0.002, -0.004], [10.0, -20.0, 40.0], [0.0, 0.0, 0.0]])
    t = fxquant.quantize(x, "e2m1", scale="tensor")
    assert t[1].tolist() == [10.0, -20.0, 40.0] and t[0].abs().max() == 0
    r = fxquant.quantize(x, "e2m1", scale="row")
    assert r[0].tolist() == pytest.approx([0.001, 0.002, -0.004], rel=1e-6)
    assert r[2].tolist() == [0.0, 0.0, 0.0]
    perm = torch.tensor([2, 0, 1])
    assert torch.equal(fxquant.quantize(x[perm], "e2m1", scale="row"), r[perm])
    k = 2.0 ** math.floor(math.log2(6.0 / 40.0))
    assert torch.equal(fxquant.quantize(x, "e2m1", scale="tensor-pow2"),
                       fxquant.quantize(x * k, "e2m1") / k)


def test_formats_on_other_dtypes_and_meta():
    """float16/bfloat16/float64 inputs keep their dtype; the meta device runs."""
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        x = torch.randn(10, dtype=dtype)
        assert fxquant.quantize(x, "e4m3").dtype == dtype
    m = fxquant.quantize(torch.empty(4, 3, device="meta"), "e3m2", "stochastic", scale="row")
    assert m.device.type == "meta" and m.shape == (4, 3)
    assert fxquant.quantize(torch.empty(0, 3), "e4m3", scale="row").shape == (0, 3)


def test_gradient_formats():
    """grad_format/grad_bits: the gradient reaching x is the rounded upstream gradient."""
    x = torch.randn(64, 8, requires_grad=True)
    upstream = torch.randn(64, 8) * 1e-3
    torch.ops.fxquant.quantize(x, "e4m3", grad_format="e5m2").backward(upstream)
    assert torch.equal(x.grad, fxquant.quantize(upstream, "e5m2"))
    x.grad = None
    torch.ops.fxquant.quantize(x, "e4m3", scale="tensor", grad_format="e4m3").backward(upstream)
    assert torch.equal(x.grad, fxquant.quantize(upstream, "e4m3", scale="tensor"))
    x.grad = None
    torch.ops.fxquant.truncate(x, 12, "nearest", grad_bits=10).backward(upstream)
    assert torch.equal(x.grad, fxquant.truncate(upstream, 10, "nearest"))
    x.grad = None
    fxquant.quantize(x, "e4m3").backward(upstream)
    assert torch.equal(x.grad, upstream)


@pytest.mark.slow
def test_quantize_under_torch_compile():
    """fullgraph compile with the op (opaque, fake kernel) agrees with eager."""
    f = torch.compile(lambda t: fxquant.quantize(t * 2, "e3m2", scale="row") + 1, fullgraph=True)
    x = torch.randn(32, 8)
    assert torch.equal(f(x), fxquant.quantize(x * 2, "e3m2", scale="row") + 1)


@pytest.mark.parametrize(
    ("make", "exc", "match"),
    [
        (lambda: Format(0, 3, subnormals=False), ValueError, "0 exponent bits"),
        (lambda: Format(10, 30), ValueError, "at most 32 bits"),
        (lambda: Format(3, 2, special="none", overflow="inf"), ValueError, "needs inf codes"),
        (lambda: Format(-1, 2), ValueError, "exp_bits must be an int >= 0"),
        (lambda: Format(3, 2, special="maybe"), ValueError, "special='maybe'"),
        (lambda: parse("e9x"), ValueError, r"unknown format 'e9x'; presets: \['bf16', 'e2m1'"),
        (lambda: parse("e3m2:color=red"), ValueError, "unknown format option 'color'"),
        (lambda: fxquant.quantize(torch.ones(2), "e4m3", scale="block"), ValueError,
         "scale='block'"),
        (lambda: fxquant.quantize(torch.ones(2), "e4m3", rounding="up"), ValueError,
         "rounding='up'"),
        (lambda: fxquant.quantize(torch.ones(2, dtype=torch.int64), "e4m3"), TypeError,
         "torch.int64"),
        (lambda: fxquant.quantize(torch.ones(2), 3.5), TypeError, "format must be"),
    ],
)
def test_errors(make, exc, match):
    """Impossible formats and bad arguments are named, with what is allowed."""
    with pytest.raises(exc, match=match):
        make()


def test_spec_strings_round_trip():
    """What goes into a graph reads back as the same format."""
    for fmt in [*PRESETS.values(), *CUSTOM, Format(4, 3, bias=8, special="none")]:
        assert parse(fmt.spec()) == fmt
    assert parse("top12") == TopN(12) and parse("E4M3FN") is PRESETS["e4m3"]
    assert Format(4, 3).spec() != "e4m3"  # the custom e4m3 is not torch's e4m3fn
