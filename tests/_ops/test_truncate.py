"""fxquant.truncate: bit-exact against NumPy and torch's bfloat16 cast, specials, gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fxquant
from fxquant._ops.layouts import layout_of
from fxquant._ops.truncate import random_bits, truncate_exact, truncate_fast, truncate_fused

ROUNDINGS = ["toward_zero", "nearest", "stochastic"]
WIDTH = {torch.float32: 32, torch.float64: 64, torch.float16: 16, torch.bfloat16: 16}
EXP = {torch.float32: 8, torch.float64: 11, torch.float16: 5, torch.bfloat16: 8}
UINT = {16: np.uint16, 32: np.uint32, 64: np.uint64}
INT = {16: torch.int16, 32: torch.int32, 64: torch.int64}


# -- an independent reference on unsigned NumPy patterns ----------------------------------


def np_reference(patterns: np.ndarray, width: int, exp_bits: int, bits: int, rounding: str):
    """Round unsigned ``width``-bit patterns in Python ints, one value at a time."""
    man = width - 1 - exp_bits
    inf = ((1 << exp_bits) - 1) << man
    out = []
    for p in patterns.tolist():
        sign, a = p >> (width - 1), p & ((1 << (width - 1)) - 1)
        if a >= inf or bits == width:
            out.append(p)
            continue
        d = width - bits
        q, rem, half = a >> d, a & ((1 << d) - 1), 1 << (d - 1)
        if rounding == "nearest" and (rem > half or (rem == half and q & 1)):
            q += 1
        r = q << d
        out.append((sign << (width - 1)) | (inf if r >= inf else r))
    return np.array(out, dtype=UINT[width])


def patterns_for(dtype: torch.dtype, n: int = 4000, seed: int = 0) -> torch.Tensor:
    """Random patterns plus every special class: NaNs, infs, zeros, subnormals, max finite."""
    width, exp_bits = WIDTH[dtype], EXP[dtype]
    man = width - 1 - exp_bits
    inf = ((1 << exp_bits) - 1) << man
    g = np.random.default_rng(seed)
    rand = g.integers(0, 1 << width, size=n, dtype=np.uint64 if width == 64 else np.int64)
    special = [0, 1, 2, (1 << man) - 1, 1 << man, inf - 1, inf, inf + 1, inf | (1 << (man - 1)),
               (1 << (width - 1)) - 1, 0x7 << (man - 3), (1 << man) | (1 << (man - 1))]
    # Exact ties for every drop width: kept part odd and even, dropped part exactly half.
    ties = [(3 << d) | (1 << (d - 1)) for d in range(1, man)] + [(2 << d) | (1 << (d - 1))
                                                                 for d in range(1, man)]
    values = [int(v) for v in rand] + special + ties
    values += [v | (1 << (width - 1)) for v in special + ties]
    arr = np.array([v & ((1 << width) - 1) for v in values], dtype=UINT[width])
    signed = arr.view({16: np.int16, 32: np.int32, 64: np.int64}[width])
    return torch.from_numpy(signed.copy()).view(dtype)


def as_uint(t: torch.Tensor) -> np.ndarray:
    width = WIDTH[t.dtype]
    return t.view(INT[width]).numpy().view(UINT[width])


def assert_same_bits(actual: torch.Tensor, expected: np.ndarray, context: str) -> None:
    width = WIDTH[actual.dtype]
    got = as_uint(actual)
    exp_t = torch.from_numpy(expected.view({16: np.int16, 32: np.int32, 64: np.int64}[width]))
    both_nan = actual.isnan() & exp_t.view(actual.dtype).isnan()
    bad = (got != expected) & ~both_nan.numpy()
    assert not bad.any(), f"{context}: {bad.sum()} mismatches, e.g. {got[bad][:3]} vs {expected[bad][:3]}"


@pytest.mark.parametrize("rounding", ["toward_zero", "nearest"])
@pytest.mark.parametrize("bits", range(1, 33))
def test_float32_matches_numpy_reference(bits, rounding):
    """Every float32 bit width, both deterministic roundings, random and special patterns."""
    x = patterns_for(torch.float32)
    expected = np_reference(as_uint(x), 32, 8, bits, rounding)
    assert_same_bits(fxquant.truncate(x, bits, rounding), expected, f"bits={bits} {rounding}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rounding", ["toward_zero", "nearest"])
def test_other_dtypes_match_numpy_reference(dtype, rounding):
    """bits counts from the top of each dtype's own pattern, at every width."""
    x = patterns_for(dtype, n=1500)
    for bits in range(1, WIDTH[dtype] + 1):
        expected = np_reference(as_uint(x), WIDTH[dtype], EXP[dtype], bits, rounding)
        assert_same_bits(fxquant.truncate(x, bits, rounding), expected, f"{dtype} bits={bits}")


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64))
def test_bits16_oracles(raw):
    """bits=16: toward_zero is the 0xFFFF0000 mask, nearest is torch's bfloat16 cast."""
    x = torch.tensor(np.array(raw, dtype=np.uint32).view(np.int32)).view(torch.float32)
    masked = (x.view(torch.int32) & -65536).view(torch.float32)
    tz = fxquant.truncate(x, 16)
    assert torch.equal(tz.view(torch.int32)[~x.isnan()], masked.view(torch.int32)[~x.isnan()])
    bf = x.to(torch.bfloat16).float()
    near = fxquant.truncate(x, 16, "nearest")
    assert torch.equal(near.isnan(), bf.isnan())
    keep = ~x.isnan()
    assert torch.equal(near.view(torch.int32)[keep], bf.view(torch.int32)[keep])


@given(
    st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=32),
    st.integers(1, 32),
    st.sampled_from(ROUNDINGS),
)
def test_special_values_and_sign(raw, bits, rounding):
    """NaN stays NaN, +-inf stays +-inf, the sign never flips, no finite input becomes NaN."""
    x = torch.tensor(np.array(raw, dtype=np.uint32).view(np.int32)).view(torch.float32)
    y = fxquant.truncate(x, bits, rounding)
    assert torch.equal(y.isnan(), x.isnan())
    inf = x.isinf()
    assert torch.equal(y[inf], x[inf])
    assert torch.equal(torch.signbit(y), torch.signbit(x))


@pytest.mark.parametrize("dtype", list(WIDTH))
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_fast_kernel_equals_exact_kernel(dtype, rounding):
    """The eager fast path, the exact kernel and the one torch.compile fuses agree."""
    x = patterns_for(dtype, n=3000, seed=1)
    layout = layout_of(dtype)
    for bits in range(EXP[dtype] + 1, WIDTH[dtype]):
        random = random_bits(x, layout, torch.Generator().manual_seed(bits))
        gen = torch.Generator().manual_seed(bits)
        fast = truncate_fast(x, bits, rounding, layout, gen)
        exact = truncate_exact(x, bits, rounding, random)
        fused = truncate_fused(x, bits, rounding, random)
        for other in (exact, fused):
            same = (fast.view(layout.int_dtype) == other.view(layout.int_dtype)) | (
                fast.isnan() & other.isnan()
            )
            assert same.all(), (bits, x[~same][:4], fast[~same][:4], other[~same][:4])


def test_nan_patch_is_taken_on_the_device_path_too(monkeypatch):
    """The unconditional NaN `where` used off-CPU gives the same bits as the CPU check."""
    x = patterns_for(torch.float32, n=500)
    cpu = fxquant.truncate(x, 12, "nearest")
    monkeypatch.setattr("fxquant._ops.truncate._needs_nan_fix", lambda x: True)
    forced = fxquant.truncate(x, 12, "nearest")
    assert torch.equal(cpu.view(torch.int32), forced.view(torch.int32))


@pytest.mark.parametrize("bits", [1, 5, 9, 12, 20, 31])
def test_stochastic_gives_a_neighbour_with_the_dropped_fraction(bits):
    """Each result is the pattern rounded down or up, up with probability = dropped fraction;
    with the exponent kept (bits >= 9) that makes the mean equal the input."""
    n, d = 20000, 32 - bits
    x = torch.tensor([1.0 + 2**-10 + 2**-13, -0.3, 3.0e-39, 1.7e38, 0.7])
    y = fxquant.truncate(x.repeat(n, 1), bits, "stochastic")
    down = fxquant.truncate(x, bits)
    up = _next_up(down, d)
    assert ((y == down) | (y == up)).all()
    p_up = (y == up).double().mean(0)
    frac = (x.view(torch.int32).long() & ((1 << d) - 1)).double() / 2**d
    # Bernoulli standard error is at most 0.5 / sqrt(n); allow 6 of them.
    assert ((p_up - frac).abs() <= 6 * 0.5 / n**0.5).all(), (p_up, frac)
    if bits >= 9:
        finite = up.isfinite()
        spread = (up - down).abs().double()[finite]
        mean_err = (y.double().mean(0) - x.double())[finite].abs()
        assert (mean_err <= 6 * spread / (2 * n**0.5)).all()


def _next_up(t: torch.Tensor, d: int) -> torch.Tensor:
    """Pattern one kept step further from zero (inf when it leaves the finite range)."""
    a = t.view(torch.int32).long() & 0x7FFFFFFF
    up = ((a >> d) + 1) << d
    up = torch.where(up >= 0x7F800000, torch.full_like(up, 0x7F800000), up)
    signed = up | (t.view(torch.int32).long() & -(2**31))
    return signed.to(torch.int32).view(torch.float32)


def test_stochastic_is_reproducible():
    """Same seed or same generator state: same result; different state: different result."""
    x = torch.randn(1000)
    torch.manual_seed(3)
    a = fxquant.truncate(x, 10, "stochastic")
    torch.manual_seed(3)
    b = fxquant.truncate(x, 10, "stochastic")
    assert torch.equal(a, b)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    c = fxquant.truncate(x, 10, "stochastic", generator=g1)
    assert torch.equal(c, fxquant.truncate(x, 10, "stochastic", generator=g2))
    assert not torch.equal(c, fxquant.truncate(x, 10, "stochastic", generator=g1))


def test_bits_width_is_identity_and_bits9_keeps_powers_of_two():
    """bits=32 returns x bit for bit (a new tensor); bits=9 keeps signed powers of two."""
    x = patterns_for(torch.float32, n=300)
    y = fxquant.truncate(x, 32)
    assert y.data_ptr() != x.data_ptr()
    assert torch.equal(y.view(torch.int32), x.view(torch.int32))
    z = fxquant.truncate(torch.tensor([3.0, -0.7, 1e-40, 0.0]), 9)
    assert z.tolist() == [2.0, -0.5, 0.0, 0.0]


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_input_is_never_written(rounding):
    """Out of place: neither the values nor the version counter of x change."""
    x = torch.randn(64, 8)
    before, version = x.clone(), x._version
    fxquant.truncate(x, 7, rounding)
    assert torch.equal(x, before) and x._version == version


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_straight_through_and_zero_gradient(rounding):
    """grad='ste' passes the upstream gradient unchanged; grad='zero' gives zeros."""
    x = torch.randn(32, 4, requires_grad=True)
    upstream = torch.randn(32, 4)
    fxquant.truncate(x, 6, rounding).backward(upstream)
    assert torch.equal(x.grad, upstream)
    x.grad = None
    fxquant.truncate(x, 6, rounding, grad="zero").backward(upstream)
    assert torch.equal(x.grad, torch.zeros_like(upstream))


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_meta_empty_scalar_and_strided(rounding):
    """Runs on the meta device, on empty and 0-dim tensors, and on non-contiguous views."""
    m = fxquant.truncate(torch.empty(5, 3, device="meta"), 10, rounding)
    assert m.device.type == "meta" and m.shape == (5, 3)
    assert fxquant.truncate(torch.empty(0, 4), 10, rounding).shape == (0, 4)
    assert fxquant.truncate(torch.tensor(3.0), 9, rounding).item() in (2.0, 4.0)
    base = torch.randn(8, 6)
    view = base.t()[::2]
    ref = fxquant.truncate(view.contiguous(), 12, "nearest")
    assert torch.equal(fxquant.truncate(view, 12, "nearest"), ref)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.uint8])
def test_integer_and_bool_inputs_raise_type_error(dtype):
    """The message names the dtype."""
    with pytest.raises(TypeError, match=str(dtype)):
        fxquant.truncate(torch.zeros(3, dtype=dtype), 8)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"bits": 0}, ValueError, r"1 <= bits <= 32"),
        ({"bits": 33}, ValueError, r"1 <= bits <= 32"),
        ({"bits": True}, TypeError, "bits must be an int"),
        ({"bits": 8.0}, TypeError, "bits must be an int"),
        ({"bits": 8, "rounding": "up"}, ValueError, "rounding='up'"),
        ({"bits": 8, "grad": "identity"}, ValueError, "grad='identity'"),
        ({"bits": 8, "generator": 3}, TypeError, "generator"),
        ({"bits": None}, TypeError, "bits must be an int"),
    ],
)
def test_bad_arguments(kwargs, exc, match):
    """Every bad argument names itself and the allowed values."""
    with pytest.raises(exc, match=match):
        fxquant.truncate(torch.randn(4), **kwargs)


def test_float64_accepts_up_to_64_bits():
    """bits=16 on float64 keeps sign, 11 exponent and 4 mantissa bits."""
    x = torch.tensor([1.0 + 2**-4 + 2**-5], dtype=torch.float64)
    assert fxquant.truncate(x, 16).item() == 1.0 + 2**-4
    assert fxquant.truncate(x, 64).item() == x.item()
    with pytest.raises(ValueError, match="1 <= bits <= 64"):
        fxquant.truncate(x, 65)


@pytest.mark.slow
def test_torch_compile_fullgraph_matches_eager():
    """The op compiles without graph breaks, fuses, and agrees with eager bit for bit."""
    from torch._inductor.utils import run_and_get_code

    def f(x):
        return (fxquant.truncate(x * 2, 11, "nearest"), fxquant.truncate(x, 5),
                fxquant.truncate(x, 16), fxquant.truncate(x, 3, "nearest"))

    compiled = torch.compile(f, fullgraph=True)
    x = patterns_for(torch.float32, n=2000)
    outs, (code,) = run_and_get_code(compiled, x)
    for got, expected in zip(outs, f(x), strict=True):
        same = (got.view(torch.int32) == expected.view(torch.int32)) | (got.isnan() & expected.isnan())
        assert same.all()
    assert "fxquant" not in code.replace("fxquant_truncate", "")  # no opaque fallback call


@pytest.mark.slow
def test_torch_compile_stochastic_follows_the_global_seed():
    """Compiled stochastic rounding calls the eager kernel: same draws under the same seed."""
    compiled = torch.compile(lambda t: fxquant.truncate(t, 10, "stochastic") * 2, fullgraph=True)
    x = torch.randn(500, 8)
    torch.manual_seed(5)
    got = compiled(x)
    torch.manual_seed(5)
    assert torch.equal(got, fxquant.truncate(x, 10, "stochastic") * 2)


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_kernel_touches_only_the_input_device(rounding):
    """On the meta device every tensor inside the op is meta: no constant on the CPU."""
    from fxquant.testing import devices_touched

    x = torch.empty(4, 4, device="meta")
    assert devices_touched(fxquant.truncate, x, 10, rounding) == {"meta"}
    assert devices_touched(fxquant.quantize, x, "e3m2", rounding, scale="row") == {"meta"}
