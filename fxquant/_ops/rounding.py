"""Rounding onto a format's grid, element by element: the functions the eager kernels and
the inductor decomposition of ``fxquant::quantize`` share (:mod:`fxquant._ops.quantize`).

Minifloats (:func:`round_float`) round ``|x|`` to the format's spacing at its exponent
(half to even, toward zero, or stochastically with ``U[0, 1)`` noise), then apply the
format's overflow, subnormal and inf rules; integers (:func:`round_int`) round to codes,
clamped to the grid.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fxquant._ops.layouts import EXPONENT_BIAS, FloatLayout, layout_of
from fxquant.formats import Format, IntFormat
from fxquant.modes import Rounding

__all__ = ["finite_value", "isnan_fast", "pow2", "round_float", "round_int"]


def finite_value(value: float, dtype: torch.dtype) -> float:
    """A format constant as a finite number of ``dtype`` (formats may reach beyond it)."""
    return min(value, torch.finfo(dtype).max)


def pow2(k: Tensor, layout: FloatLayout, dtype: torch.dtype) -> Tensor:
    """``2.0 ** k`` for integer tensors ``k`` in the dtype's normal exponent range, exactly."""
    bias = EXPONENT_BIAS[layout.width]
    return ((k + bias) << layout.man_bits).view(dtype)


def round_float(y: Tensor, fmt: Format, rounding: str, noise: Tensor | None = None) -> Tensor:
    """Every element of ``y`` (float32 or float64) rounded to a value of ``fmt``.

    Example:
        >>> from fxquant.formats import parse
        >>> round_float(torch.tensor([0.3, 5.0, 7.0, -1e9, float("nan")]), parse("e2m1"), "nearest")
        tensor([ 0.5000,  4.0000,  6.0000, -6.0000,     nan])
    """
    layout = layout_of(y.dtype)
    a = y.abs()
    if _rounds_by_pattern(fmt, rounding, layout):
        r = _round_pattern(a, fmt, rounding, layout)
    else:
        r = _round_by_spacing(a, fmt, rounding, layout, noise)
    big = finite_value(fmt.max_finite, y.dtype)
    if fmt.overflow == "inf" and rounding != Rounding.TOWARD_ZERO:  # IEEE: toward zero saturates
        r = torch.where(r > big, math.inf, r)
    else:
        r = torch.clamp(r, max=big)
    if not fmt.subnormals:
        r = torch.where(r < fmt.min_normal, 0.0, r)
    r = torch.where(a == math.inf, math.inf if fmt.special == "ieee" else big, r)
    r = torch.copysign(r, y)
    return torch.where(isnan_fast(y), y, r)


def _rounds_by_pattern(fmt: Format, rounding: str, layout: FloatLayout) -> bool:
    """Whether :func:`_round_pattern` gives what :func:`_round_by_spacing` gives: nearest or
    toward zero, at least one mantissa bit (the tie rule of formats without them is
    the exponent's), fewer mantissa bits than the dtype, and normals inside the dtype's."""
    return (rounding != Rounding.STOCHASTIC and fmt.exp_bits >= 1
            and 1 <= fmt.man_bits < layout.man_bits and fmt.emin >= 1 - EXPONENT_BIAS[layout.width])


def _round_pattern(a: Tensor, fmt: Format, rounding: str, layout: FloatLayout) -> Tensor:
    """Magnitudes ``a`` rounded to ``fmt``'s spacing on its bit pattern (no overflow rule).

    At or above the format's smallest normal the spacing is one unit in the format's last
    mantissa bit, so rounding the pattern does it: nearest-even adds half a unit less one
    plus the kept last bit and clears the dropped bits (a carry moves into the exponent,
    as it should); toward zero clears them. Below it (the format's subnormals, a fixed
    spacing ``2**(emin - man_bits)``), ``a`` is scaled by powers of two, rounded to an
    integer and scaled back, exactly. Where the format's smallest normal is the dtype's,
    the dtype's own subnormals have that spacing and the pattern serves them too.
    Two bit casts and a dozen integer and float operations per element, all of which
    inductor vectorizes (the exponent arithmetic of :func:`_round_by_spacing` takes five
    casts and ~25 operations)."""
    drop = layout.man_bits - fmt.man_bits
    bits = a.view(layout.int_dtype)
    if rounding == Rounding.NEAREST:  # NaN patterns capped first: the sum stays in range
        bits = torch.clamp(bits, max=layout.inf)
        bits = bits + (((bits >> drop) & 1) + ((1 << (drop - 1)) - 1))
    r = (bits & -(1 << drop)).view(a.dtype)
    if fmt.emin == 1 - EXPONENT_BIAS[layout.width]:
        return r
    k = fmt.emin - fmt.man_bits  # the subnormal spacing is 2**k (2**-k may pass the
    # dtype's range: two factors, each within it)
    up1, up2 = -k // 2, -k - (-k // 2)
    v = a * (2.0 ** up1) * (2.0 ** up2)
    n = torch.round(v) if rounding == Rounding.NEAREST else torch.trunc(v)
    small = n * (2.0 ** -up1) * (2.0 ** -up2)
    return torch.where(a < 2.0 ** fmt.emin, small, r)


def _round_by_spacing(a: Tensor, fmt: Format, rounding: str, layout: FloatLayout,
                      noise: Tensor | None) -> Tensor:
    """Magnitudes ``a`` rounded to ``fmt``'s spacing, from the exponent of each value (every
    rounding; no overflow rule)."""
    bias = EXPONENT_BIAS[layout.width]
    exponent = a.view(layout.int_dtype) >> layout.man_bits  # biased; all ones for inf and NaN
    if fmt.emin < 1 - bias:  # normals below the dtype's: subnormal inputs need their exponent
        _, e2 = torch.frexp(a)
        exponent = torch.where(exponent == 0, e2.to(layout.int_dtype) - 1 + bias, exponent)
    e = torch.clamp(exponent - bias, min=fmt.emin)
    k = e - fmt.man_bits  # the spacing of the format around |y| is 2**k
    h1 = k >> 1
    h2 = k - h1
    v = a * pow2(-h1, layout, a.dtype) * pow2(-h2, layout, a.dtype)  # exact
    if rounding == Rounding.NEAREST:
        n = torch.round(v)  # half to even
        if fmt.man_bits == 0 and fmt.exp_bits > 0:
            # Every normal significand is 1: "even" is the exponent field's last bit.
            floor = torch.floor(v)
            tie = (v - floor == 0.5) & (v >= 1)
            n = torch.where(tie, floor + ((e + int(fmt.bias)) & 1).to(a.dtype), n)  # type: ignore[arg-type]
    elif rounding == Rounding.TOWARD_ZERO:
        n = torch.trunc(v)
    else:
        assert noise is not None
        n = torch.floor(v + noise)
    return n * pow2(h1, layout, a.dtype) * pow2(h2, layout, a.dtype)


def isnan_fast(v: Tensor) -> Tensor:
    """``v != v``: NaN test that inductor's CPU code vectorizes (its ``isnan`` is a scalar
    loop, which made the fused kernels ~1.5x clone). Inductor compiles without
    ``-ffinite-math-only``, so the comparison is kept."""
    return v != v


def round_int(y: Tensor, fmt: IntFormat, rounding: str, noise: Tensor | None = None,
              zero_point: Tensor | None = None) -> Tensor:
    """Codes: ``clamp(round(y) + zero_point, qmin, qmax)`` (as floats); NaN stays NaN. On a
    mid-rise grid, the levels ``clamp(round(y - 1/2), qmin, qmax) + 1/2``.

    Example:
        >>> from fxquant.formats import parse
        >>> round_int(torch.tensor([-9.0, -2.5, 0.5, 1.5, 300.0]), parse("int4"), "nearest")
        tensor([-8., -2.,  0.,  2.,  7.])
        >>> round_int(torch.tensor([-9.0, -0.2, 0.1, 1.2]), parse("int2:midrise"), "nearest")
        tensor([-1.5000, -0.5000,  0.5000,  1.5000])
    """
    if fmt.midrise:
        assert rounding != Rounding.TOWARD_ZERO, "a mid-rise grid has no zero to round toward"
        y = y - fmt.offset
    if rounding == Rounding.NEAREST:
        n = torch.round(y)
    elif rounding == Rounding.TOWARD_ZERO:
        n = torch.trunc(y)
    else:
        assert noise is not None
        n = torch.floor(y + noise)
    if zero_point is not None:
        n = n + zero_point
    n = torch.clamp(n, fmt.qmin, fmt.qmax)
    if fmt.midrise:
        return n + fmt.offset
    # an unsigned grid has no -0: a small negative rounds to +0 like a large one clamps to it
    # (clamp keeps -0, and inductor's clamp does not: abs makes eager and compiled agree)
    return n.abs() if fmt.qmin >= 0 else n
