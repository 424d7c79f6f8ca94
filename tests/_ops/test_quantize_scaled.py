"""fxquant.quantize with scales, integer formats and OCP MX blocks: exact against an
independent NumPy reference, eager (chunked, torch's casts, Veltkamp splitting) equal to
the per-element functions the compiler fuses, and properties on every dtype."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fxquant
from fxquant._ops import quantize as Q
from fxquant.formats import PRESETS, Format, IntFormat, parse
from fxquant.modes import Scale
from tests.support.numerics import format_values, np_quantize, random_floats, same

F32 = np.float32


# -- an independent NumPy reference, float32 arithmetic ---------------------------------------


def _np_amax(a: np.ndarray, axis=None) -> np.ndarray:
    finite = np.where(np.isfinite(a), np.abs(a), 0).astype(F32)
    return finite.max(axis=axis, keepdims=axis is not None) if a.size else F32(0)


def _np_floor_pow2(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, dtype=F32)
    return (v.view(np.int32) & ~np.int32((1 << 23) - 1)).view(F32)


def np_scaled_format(x: np.ndarray, fmt: Format, rounding: str, scale: str) -> np.ndarray:
    """round(x * factor) / factor with factor = max / amax in float32 (capped, pow2 floored)."""
    x = x.astype(F32)
    axis = 1 if scale.startswith("row") else None
    flat = x.reshape(x.shape[0], -1) if axis else x
    amax = _np_amax(flat, axis)
    usable = (amax > 0) & np.isfinite(amax)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        factor = np.where(usable, F32(fmt.max_finite) / np.where(usable, amax, F32(1)), F32(1))
    factor = np.minimum(factor.astype(F32), F32(2.0**126))
    if scale.endswith("pow2"):
        factor = _np_floor_pow2(np.maximum(factor, np.finfo(F32).tiny))
    with np.errstate(over="ignore", invalid="ignore"):
        y = (flat * factor).astype(F32)
    q = np_quantize(y.reshape(-1), fmt, rounding).reshape(y.shape).astype(F32)
    with np.errstate(invalid="ignore"):
        return (q / factor).astype(F32).reshape(x.shape)


def np_mx(x: np.ndarray, fmt: Format, rounding: str) -> np.ndarray:
    """OCP MX: per 32 values along the last dim, X = 2**(floor(log2 amax) - emax), the
    elements x / X rounded with saturation, times X."""
    saturating = Format(fmt.exp_bits, fmt.man_bits, fmt.bias, fmt.special, fmt.subnormals,
                        "saturate")
    x = x.astype(F32)
    out = np.empty_like(x)
    for r in range(x.shape[0]):
        for start in range(0, x.shape[1], 32):
            block = x[r, start:start + 32]
            amax = _np_amax(block)
            if amax > 0 and amax >= np.finfo(F32).tiny:
                shared = int(np.clip(math.floor(math.log2(float(amax))) - fmt.emax, -127, 127))
            else:
                shared = 0
            q = np_quantize((block * F32(2.0**-shared)).astype(F32), saturating, rounding)
            out[r, start:start + 32] = (q * F32(2.0**shared)).astype(F32)
    return out


def np_int(x: np.ndarray, fmt: IntFormat, rounding: str, scale: str) -> np.ndarray:
    """(clip(rint(x * (1 / s)) + zp, qmin, qmax) - zp) * s, torch.ao's qparams in float32."""
    x = x.astype(F32)
    if scale == "block32":
        blocks = x.reshape(x.shape[0], -1, 32)
        amax = _np_amax(blocks, axis=2)
        s = (amax / F32(fmt.qmax)).astype(F32)
        s = np.where((s > 0) & (s >= np.finfo(F32).tiny), s, F32(1)).astype(F32)
        fl = _np_floor_pow2(s)
        s = np.where(fl < s, fl * F32(2), fl).astype(F32)
        codes = _np_round((blocks * (F32(1) / s)).astype(F32), rounding)
        codes = np.clip(codes, fmt.qmin, fmt.qmax)
        codes = np.abs(codes) if fmt.qmin >= 0 else codes  # an unsigned grid has no -0
        return (codes * s).astype(F32).reshape(x.shape)
    axis = 1 if scale.startswith("row") else None
    flat = x.reshape(x.shape[0], -1) if axis else x
    finite = np.where(np.isfinite(flat), flat, np.nan)
    lo = np.nanmin(finite, axis=axis, keepdims=axis is not None).astype(F32)
    hi = np.nanmax(finite, axis=axis, keepdims=axis is not None).astype(F32)
    zp = None
    if fmt.asymmetric:
        lo, hi = np.minimum(lo, F32(0)), np.maximum(hi, F32(0))
        s = ((hi - lo) / F32(fmt.qmax - fmt.qmin)).astype(F32)
    elif fmt.signed:
        s = (np.maximum(np.abs(lo), np.abs(hi)) / F32(fmt.qmax)).astype(F32)
    else:
        s = (np.maximum(hi, F32(0)) / F32(fmt.qmax)).astype(F32)
    s = np.where((s > 0) & np.isfinite(s) & (s >= np.finfo(F32).tiny), s, F32(1)).astype(F32)
    if scale.endswith("pow2"):
        fl = _np_floor_pow2(s)
        s = np.where(fl < s, fl * F32(2), fl).astype(F32)
    if fmt.asymmetric:
        zp = np.clip(F32(fmt.qmin) - np.rint(lo / s), fmt.qmin, fmt.qmax).astype(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        codes = _np_round((flat * (F32(1) / s)).astype(F32), rounding)
        if zp is not None:
            codes = codes + zp
        codes = np.clip(codes, fmt.qmin, fmt.qmax)
        if zp is not None:
            codes = codes - zp
        elif fmt.qmin >= 0:  # an unsigned grid has no -0
            codes = np.abs(codes)
        out = (codes * s).astype(F32)
    return np.where(np.isnan(flat), np.nan, out).astype(F32).reshape(x.shape)


def _np_round(v: np.ndarray, rounding: str) -> np.ndarray:
    return np.rint(v) if rounding == "nearest" else np.trunc(v)


def data(rows: int = 64, cols: int = 96, seed: int = 0) -> torch.Tensor:
    """Rows of very different magnitudes, zero rows, and exact ties of several grids."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.logspace(-6, 6, rows)[:, None]
    x[3] = 0.0
    x[5, :8] = torch.tensor([0.5, 1.5, 2.5, -2.5, 0.25, 3.0, -7.0, 6.5])
    return x


FORMATS = ["e4m3", "e5m2", "e3m2", "e2m3", "e2m1", "e3m0", "fp16"]
SCALES = ["tensor", "row", "tensor-pow2", "row-pow2"]


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("rounding", ["nearest", "toward_zero"])
def test_scaled_formats_match_numpy(name, scale, rounding):
    x = data()
    got = fxquant.quantize(x, name, rounding, scale=scale)
    expected = torch.from_numpy(np_scaled_format(x.numpy(), parse(name), rounding, scale))
    bad = ~same(got, expected)
    assert not bad.any(), (x[bad][:4], got[bad][:4], expected[bad][:4])


@pytest.mark.parametrize("name", ["e2m1", "e3m2", "e2m3", "e4m3", "e5m2"])
@pytest.mark.parametrize("rounding", ["nearest", "toward_zero"])
def test_mx_block32_matches_the_ocp_definition(name, rounding):
    x = data(8, 96)
    x[1, 40:45] = torch.tensor([1e30, -3e-30, 0.0, 7.0, 1e-44])
    got = fxquant.quantize(x, name, rounding, scale="block32")
    expected = torch.from_numpy(np_mx(x.numpy(), parse(name), rounding))
    bad = ~same(got, expected)
    assert not bad.any(), (x[bad][:4], got[bad][:4], expected[bad][:4])


BLOCK_SHAPES = [(6, 8, 8), (6, 40), (6, 8, 1), (6, 3, 64), (5,)]


@pytest.mark.parametrize(("name", "shape", "compiled"), [
    *((name, shape, False) for name in ("e2m1", "int4") for shape in BLOCK_SHAPES),
    ("e2m1", (6, 8, 8), True), ("int4", (6, 40), True), ("int4", (5,), True)])
def test_block32_output_is_contiguous_whatever_the_last_dim(name, shape, compiled):
    """A last dim that is not a multiple of 32 is padded to blocks inside the op; the
    result is the input's shape in memory of its own (a GAT layer's [nodes, heads,
    channels] aggregation is ``.view``-ed to [nodes, heads * channels] next), equal to
    the rounding of the zero-padded rows."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    fn = torch.compile(fxquant.quantize, fullgraph=True) if compiled else fxquant.quantize
    got = fn(x, name, scale="block32")
    assert got.shape == x.shape and got.is_contiguous()
    assert got.untyped_storage().nbytes() <= (x.numel() + 31) * x.element_size()  # one pad
    last = shape[-1]
    padded = torch.nn.functional.pad(x.reshape(-1, last), (0, -last % 32))
    want = fxquant.quantize(padded, name, scale="block32")[:, :last].reshape(shape)
    assert torch.equal(got, want)
    got.view(-1)  # (a view of the padded blocks cannot be flattened)


@pytest.mark.parametrize("name", ["int8", "int4", "int2", "uint8", "uint4", "int8:asym",
                                  "int3:asym", ("int", 5)])
@pytest.mark.parametrize("scale", [*SCALES, "block32"])
@pytest.mark.parametrize("rounding", ["nearest", "toward_zero"])
def test_integer_formats_match_numpy(name, scale, rounding):
    x = data()
    fmt = parse(name)
    assert isinstance(fmt, IntFormat)
    if scale == "block32" and fmt.asymmetric:
        return
    got = fxquant.quantize(x, name, rounding, scale=scale)
    expected = torch.from_numpy(np_int(x.numpy(), fmt, rounding, scale))
    bad = ~same(got, expected)
    assert not bad.any(), (x[bad][:4], got[bad][:4], expected[bad][:4])


def test_integer_ties_go_to_even_codes():
    """x / scale exactly half way between codes rounds to the even one."""
    x = torch.tensor([[-3.5, -2.5, -0.5, 0.5, 1.5, 2.5, 7.0]])
    assert fxquant.quantize(x, "int4", scale="tensor").tolist() == \
        [[-4.0, -2.0, -0.0, 0.0, 2.0, 2.0, 7.0]]
    assert fxquant.quantize(torch.tensor([2.5, 3.5, 200.0]), "int8", scale="none").tolist() == \
        [2.0, 4.0, 127.0]


# -- the eager paths equal the fused per-element functions ------------------------------------


@pytest.mark.parametrize("name", ["e3m2", "e2m3", "e2m1", "e4m3", (4, 2), (3, 1), (2, 2),
                                  (1, 2), (5, 3), (6, 5), (8, 3), (8, 1)])
def test_veltkamp_split_equals_the_reference_rounding_on_every_tie(name):
    fmt = parse(name)
    grid = torch.from_numpy(format_values(fmt))
    ties = ((grid[1:] + grid[:-1]) / 2).float()
    up = torch.nextafter(ties, torch.tensor(math.inf))
    down = torch.nextafter(ties, torch.tensor(-math.inf))
    x = torch.cat([ties, up, down, -ties, -up, -down, random_floats(200_000, seed=3),
                   grid.float(), torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan])])
    target = Q._saturating(fmt)
    if not Q._split_rounds(target, "nearest"):
        pytest.skip("not a split format")
    part = x.clone()
    Q._round_nearest_split(part, target)
    assert same(part, Q.round_float(x, target, "nearest")).all()


@pytest.mark.parametrize("name", ["e2m3", "e3m2", "e4m3", "e5m2", (3, 3), (1, 3), (4, 2),
                                  (2, 2), (4, 10)])
def test_cast_route_equals_the_reference_rounding_on_every_tie(name):
    """A format rounded by a torch cast after a power-of-two shift (E2M3 by E4M3's, E3M2 by
    E5M2's) gives the reference's values, bit for bit, signed zeros included."""
    fmt = parse(name)
    target = Q._saturating(fmt) if fmt.special != "ieee" else fmt
    route = Q._cast_route(target, "nearest", torch.float32)
    assert route is not None
    grid = torch.from_numpy(format_values(fmt))
    ties = ((grid[1:] + grid[:-1]) / 2).float()
    up = torch.nextafter(ties, torch.tensor(math.inf))
    down = torch.nextafter(ties, torch.tensor(-math.inf))
    x = torch.cat([ties, up, down, -ties, -up, -down, random_floats(200_000, seed=3),
                   grid.float(), -grid.float(), torch.tensor([0.0, -0.0, math.inf, -math.inf,
                                                              math.nan, 1e-45, -1e-45])])
    expected = Q.round_float(x, target, "nearest")
    got = Q._eager(x, target, "nearest", Scale.NONE, None, None)
    assert same(got, expected).all()
    assert torch.equal(got.view(torch.int32)[~torch.isnan(got)],
                       expected.view(torch.int32)[~torch.isnan(expected)])


def test_cast_route_is_refused_where_it_would_round_twice():
    """No route through a cast whose subnormals are float32's (bfloat16), none for formats
    with inf or without a cast of as many mantissa bits, none but nearest."""
    assert Q._cast_route(parse((6, 7)), "nearest", torch.float32) is None  # only bf16 has 7
    assert Q._cast_route(parse("e2m1"), "nearest", torch.float32) is None
    assert Q._cast_route(parse("e2m3"), "toward_zero", torch.float32) is None
    assert Q._cast_route(parse("e2m3"), "nearest", torch.float64) is None
    assert Q._cast_route(parse((3, 2)), "nearest", torch.float32) is not None


@pytest.mark.parametrize("name", ["e4m3", "e2m1", "e3m2", "e2m3", "fp16", "int8", "int4:asym",
                                  "e8m7", "e8m3", "e8m23"])
@pytest.mark.parametrize("scale", ["none", "tensor", "row", "block32"])
@pytest.mark.parametrize("rounding", ["nearest", "toward_zero"])
def test_chunked_eager_equals_whole(name, scale, rounding, monkeypatch):
    """Chunk boundaries (made small here), torch's casts and in-place integer steps give
    exactly what the per-element functions on the whole tensor give."""
    number = parse(name.replace(":asym", "").replace("int4", "int4:asym") if ":asym" in name
                   else name)
    if (scale == "none" and isinstance(number, IntFormat)) or \
            (scale == "block32" and isinstance(number, IntFormat) and number.asymmetric):
        return
    monkeypatch.setattr(Q, "CHUNK", 1000)
    x = torch.cat([data(), random_floats(4_800, seed=2)[:4_800].view(-1, 96)])
    x[7, 7], x[9, 9], x[11, 11] = math.nan, math.inf, -math.inf
    mode = Scale.parse(scale)
    whole = Q._whole(x, number, rounding, mode, None, None)
    eager = Q.quantize_values(x, number, rounding, scale)
    assert same(eager, whole).all()


# -- issue 14: formats never invent NaN --------------------------------------------------------


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _extremes(dtype: torch.dtype) -> list[float]:
    info = torch.finfo(dtype)
    return [info.max, -info.max, info.tiny, -info.tiny, info.smallest_normal / 2 ** 3,
            float(torch.nextafter(torch.tensor(0.0, dtype=dtype), torch.tensor(1.0, dtype=dtype)))]


FORMAT_SPECS = [*PRESETS, "e3m0", "e1m0", "e0m1", "e0m3", "e1m1", "e2m0", "e5m0", "e8m0",
                "e4m3:bias=1", "e3m2:special=nan_only", "e5m2:special=ieee:overflow=inf",
                "e2m1:subnormals=0", "e6m9", "e8m7", "e8m3", "e8m23"]
ALL_SCALES = [None, "tensor", "row", "tensor-pow2", "row-pow2", "block32"]


@given(spec=st.sampled_from([*FORMAT_SPECS, "int8", "int2", "uint4", "int5:asym"]),
       scale=st.sampled_from(ALL_SCALES),
       rounding=st.sampled_from(["nearest", "toward_zero", "stochastic"]),
       dtype=st.sampled_from(DTYPES),
       values=st.lists(st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=16),
                                 st.floats(-1e-30, 1e-30), st.floats(-1e30, 1e30),
                                 st.sampled_from([0.0, 1.0, -1.0])), min_size=2, max_size=12),
       extreme=st.booleans())
def test_finite_in_finite_out(spec, scale, rounding, dtype, values, extreme):
    """Every number, scale, rounding and dtype: finite inputs give finite outputs, except
    where a format with inf codes overflows without a scale (documented), and the sign of
    a nonzero result is the input's."""
    if extreme:
        values = values + _extremes(dtype)
    x = torch.tensor(values, dtype=torch.float64).clamp(-torch.finfo(dtype).max,
                                                        torch.finfo(dtype).max).to(dtype)
    x = x.view(2, -1) if x.numel() % 2 == 0 else x[None]
    y = fxquant.quantize(x, spec, rounding, scale=scale)
    number = parse(spec)
    may_overflow = isinstance(number, Format) and number.overflow == "inf" and scale is None
    assert not y.isnan().any(), (x, y)
    if not may_overflow:
        assert y.isfinite().all(), (x, y)
    nonzero = y != 0
    assert torch.equal(torch.signbit(y[nonzero]), torch.signbit(x[nonzero]))


@pytest.mark.parametrize("name", ["e4m3", "e2m1", "int8", "e5m2"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_and_inf_inputs(name, dtype):
    """NaN stays NaN; +-inf stays +-inf where the format has inf, else saturates."""
    x = torch.tensor([[math.nan, math.inf, -math.inf, 1.0]], dtype=dtype)
    for scale in ("none", "tensor", "row", "block32"):
        y = fxquant.quantize(x, name, scale=scale)
        assert y.dtype == dtype and y[0, 0].isnan()
        has_inf = name == "e5m2"  # MX saturates finite overflow; inf stays inf
        assert (y[0, 1:3].isinf().all() if has_inf else y[0, 1:3].isfinite().all()), (scale, y)
        assert y[0, 1] > 0 > y[0, 2]


@pytest.mark.parametrize("name", ["e8m7", "e8m3", "e8m1", "e8m23", (8, 7)])
@pytest.mark.parametrize("scale", [None, "tensor", "row", "tensor-pow2", "block32"])
def test_eight_exponent_bits_with_a_scale_keep_the_values(name, scale):
    """A format with float32's 8 exponent bits: splitting ``y * (2**s + 1)`` overflowed for
    values near float32's largest (where every scale puts the largest input), giving NaN,
    and the MX scale put the largest input past float32. Each value now lies within the
    format's relative spacing of the input."""
    x = torch.tensor([[3.0, -1.5, 0.25, 1e-3, 0.0, 7.0], [1e34, -2e35, 5.0, 1e-20, 3e38, 1.0]])
    y = fxquant.quantize(x, name, scale=scale)
    spacing = 2.0 ** -parse(name).man_bits
    assert y.isfinite().all(), y
    assert ((y - x).abs() <= spacing * x.abs()).all(), (x, y)


def test_reported_nan_and_inf_cases():
    """The reproductions of the hardening issue."""
    with pytest.raises(ValueError, match="beyond float64's range"):
        parse((12, 0))
    with pytest.raises(ValueError, match="no nonzero value"):
        parse("e0m0")
    with pytest.raises(ValueError, match="beyond float64's range"):
        parse("e11m20")  # not a RecursionError
    tiny = torch.tensor([1e-305, -3e-306, 0.0], dtype=torch.float64)
    assert fxquant.quantize(tiny, "e5m2", scale="tensor").isfinite().all()
    half = torch.tensor([65504.0, 1.0], dtype=torch.float16)
    assert fxquant.quantize(half, "e4m3", scale="tensor-pow2").tolist() == [65504.0, 1.0]
    with pytest.raises(ValueError, match="scale='row' gives each row"):
        fxquant.quantize(torch.ones(4), "e4m3", scale="row")
    with pytest.raises(ValueError, match=r"option bias='abc'.*must be an integer"):
        fxquant.quantize(torch.ones(4), "e4m3:bias=abc")
    with pytest.raises(TypeError, match=r"generator must be a torch\.Generator"):
        fxquant.quantize(torch.ones(4), "e4m3", generator=5)
    with pytest.raises(TypeError, match="dense"):
        fxquant.quantize(torch.ones(4).to_sparse(), "e4m3")
    with pytest.raises(ValueError, match=r"fxquant\.quantize: top12 is top-N truncation"):
        fxquant.quantize(torch.ones(4), "top12")


def test_half_inputs_are_computed_in_float32_and_saturate():
    """float16/bfloat16 round through float32; a result past the dtype saturates at its
    largest finite value for formats without inf."""
    x = torch.tensor([[65504.0, -65504.0, 3.0, 0.1]], dtype=torch.float16)
    expected = fxquant.quantize(x.float(), "e2m1", scale="tensor").to(torch.float16)
    assert torch.equal(fxquant.quantize(x, "e2m1", scale="tensor"), expected)
    b = torch.tensor([[1.0, 2.5, -7.0]], dtype=torch.bfloat16)
    assert fxquant.quantize(b, "int4", scale="row").tolist() == [[1.0, 2.0, -7.0]]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "scale"), [("e3m2", "tensor"), ("e4m3", "row"),
                                             ("int8", "tensor"), ("int4:asym", "row"),
                                             ("e2m1", "block32"), ("int8", "block32"),
                                             ("uint8", "tensor"), ("uint4", "row"),
                                             ("fp16", "tensor"), ("bf16", "none"),
                                             ("e5m2", "tensor-pow2")])
def test_compiled_equals_eager(name, scale):
    """The inductor decomposition (fused) computes the eager kernel's values."""
    torch._dynamo.reset()  # one lambda per case: no recompile limit
    x = torch.cat([data(), random_floats(96 * 32, seed=4)[: 96 * 32].view(-1, 96)])
    x[7, 7], x[9, 9] = math.nan, math.inf
    f = torch.compile(lambda t: fxquant.quantize(t, name, scale=scale), fullgraph=True)
    assert same(f(x), fxquant.quantize(x, name, scale=scale)).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", ["tensor-pow2", "row-pow2"])
def test_power_of_two_scale_of_the_largest_values_stays_finite(dtype, scale):
    """A power-of-two scale is the dtype's largest at most: ceiling int2's scale of
    float32's largest value gave 2**128 = inf, and every value NaN."""
    big = torch.finfo(dtype).max
    x = torch.tensor([[0.0, 1.0, big, -big]], dtype=dtype)
    y = fxquant.quantize(x, "int2", "nearest", scale=scale)
    assert bool(torch.isfinite(y).all()), y
    assert torch.equal(torch.signbit(y[y != 0]), torch.signbit(x[y != 0]))
