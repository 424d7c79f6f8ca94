"""Round to a number format, with optional scaling: the ``fxquant::quantize`` op.

AnyFormats (:mod:`fxquant.formats`): minifloats (:class:`~fxquant.formats.Format`), integers
(:class:`~fxquant.formats.IntFormat`) and top-N truncation (:class:`~fxquant.formats.TopN`,
which calls the truncation kernels). float32, float16 and bfloat16 inputs are computed in
float32, float64 inputs in float64; nothing is ever widened beyond that.

**Minifloats.** ``scale="none"`` rounds every value to the format's grid: with ``e`` the
exponent of ``|x|`` (at least the format's ``emin``) the spacing there is ``q = 2**(e -
man_bits)`` and ``|x| / q`` (exact: a power of two) is rounded to an integer (half to
even; ``trunc``; or ``floor(. + U[0, 1))``). Ties of formats without mantissa bits go to
the even exponent field. (Nearest and toward zero compute the same values on the bit
pattern of ``|x|``, which vectorizes better: :func:`_round_pattern`.) Then the format's
overflow rule applies (saturate, or inf when the format has inf and the rounding is not
toward zero), subnormals flush to zero when the format has none, NaN stays NaN (with its
payload) and +-inf stays +-inf where the format has inf (else it saturates). For
``"e4m3"``, ``"e5m2"``, ``"fp16"`` and ``"bf16"`` this is bit-identical to torch's casts
(and uses them in eager, as it does for the saturating formats whose grid is an fp8
type's moved by a power of two, such as E2M3 and E3M2: :func:`_cast_route`).

With a scale, ``y = x * factor`` is rounded and divided back: ``factor = max_finite /
amax`` per tensor or per row (``amax`` over finite values, from the data or from an
observer's ``bounds``; a zero or non-finite ``amax`` gives factor 1; a factor past the
dtype's range is capped, so a tiny ``amax`` never turns into inf or NaN); ``-pow2`` modes
round the factor down to a power of two; ``"block32"`` is OCP MX: per block of 32 values
along the last dim, ``factor = 2**(emax - floor(log2 amax_block))`` (an E8M0 scale,
exponent clamped to [-127, 127]) and overflow saturates. A result past the input dtype's
range (float16: a scaled value rounded up, then divided back) saturates at the dtype's
largest finite value for formats without inf, and is inf for formats with inf.

**Formats and scales of one's own** (:class:`~fxquant.formats.CustomFormat`,
:class:`~fxquant.modes.ScaleKind`, registered): a custom format rounds where a minifloat
does (its own ``round``, with the same scaling, infinite inputs saturating unless it has
inf, NaN kept); a custom scale's ``bounds`` give each group's range, turned into scales
as for the built-in kinds. Both take the whole-tensor path (no chunks).

**Integers** (``y`` read as ``round(x / scale)`` clamped to ``[qmin, qmax]``, times
``scale``), as ``torch.fake_quantize_per_tensor_affine`` computes them (which eager
nearest rounding calls): ``inv = 1 / scale`` in the compute dtype,
``out = (clamp(round(x * inv) + zp, qmin, qmax) - zp) * scale``. Symmetric signed:
``scale = amax / qmax``; unsigned: ``scale = max(hi, 0) / qmax``; ``":asym"``: ``[lo, hi]``
(extended to include 0) onto ``[0, 2**bits - 1]``, ``zp = qmin - round(lo / scale)``; a
zero range gives scale 1; ``"block32"``: ``scale = 2**ceil(log2(amax / qmax))`` per block.
``scale="none"`` rounds to the integers themselves (clamped), the building block of
learned step sizes. NaN stays NaN; +-inf clamps to the extreme codes.

Eager evaluation goes through the tensor in chunks of about a million elements, so the
temporaries of the elementwise chain stay small: extra peak memory is the output plus a
few chunks. Under ``torch.compile`` the op decomposes into the same per-element functions,
which inductor fuses into one loop (stochastic rounding stays one opaque call, so it
follows ``torch.manual_seed`` exactly).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator
from typing import Final

import torch
from torch import Tensor

from fxquant._ops.layouts import FloatLayout, layout_of
from fxquant._ops.rows import row_mask
from fxquant._ops.truncate import check_bits, truncate_values
from fxquant.errors import FxquantValueError, same_kind
from fxquant.formats import PRESETS, AnyFormat, CustomFormat, Format, IntFormat, TopN, parse
from fxquant.modes import AnyScale, Grad, Rounding, Scale, ScaleKind, op_grad

__all__ = [
    "ARGS",
    "SIGNATURE",
    "bounds_of",
    "finite_bounds",
    "int_grid_scale",
    "int_scale",
    "quantize_values",
    "round_float",
    "round_int",
]

#: Elements per chunk of the eager kernels (temporaries stay this small). 1 MiB of float32:
#: at 4 MiB the temporaries outgrow the allocator's reuse and E2M3 ran 7.2x clone, at
#: 1 MiB 4.0x (1,000,000 x 64 on the 2-core VM; 256 KiB chunks measured the same).
CHUNK: Final = 1 << 18
_COMPUTE = {torch.float32: torch.float32, torch.float16: torch.float32,
            torch.bfloat16: torch.float32, torch.float64: torch.float64}
#: torch's own casts from float32, each rounding to nearest even onto the format it names
_TORCH_CASTS = {PRESETS["e4m3"]: torch.float8_e4m3fn, PRESETS["e5m2"]: torch.float8_e5m2,
                PRESETS["fp16"]: torch.float16, PRESETS["bf16"]: torch.bfloat16}
_BIAS = {32: 127, 64: 1023}


# -- per-element rounding: shared by the eager chunks and the inductor decomposition ----------


def _finite(value: float, dtype: torch.dtype) -> float:
    """A format constant as a finite number of ``dtype`` (formats may reach beyond it)."""
    return min(value, torch.finfo(dtype).max)


def _pow2(k: Tensor, layout: FloatLayout, dtype: torch.dtype) -> Tensor:
    """``2.0 ** k`` for integer tensors ``k`` in the dtype's normal exponent range, exactly."""
    bias = _BIAS[layout.width]
    return ((k + bias) << layout.man_bits).view(dtype)


def round_float(y: Tensor, fmt: Format, rounding: str, noise: Tensor | None = None) -> Tensor:
    """Every element of ``y`` (float32 or float64) rounded to a value of ``fmt``.

    Example:
        >>> round_float(torch.tensor([0.3, 5.0, 7.0, -1e9, float("nan")]), parse("e2m1"), "nearest")
        tensor([ 0.5000,  4.0000,  6.0000, -6.0000,     nan])
    """
    layout = layout_of(y.dtype)
    a = y.abs()
    if _rounds_by_pattern(fmt, rounding, layout):
        r = _round_pattern(a, fmt, rounding, layout)
    else:
        r = _round_by_spacing(a, fmt, rounding, layout, noise)
    big = _finite(fmt.max_finite, y.dtype)
    if fmt.overflow == "inf" and rounding != Rounding.TOWARD_ZERO:  # IEEE: toward zero saturates
        r = torch.where(r > big, math.inf, r)
    else:
        r = torch.clamp(r, max=big)
    if not fmt.subnormals:
        r = torch.where(r < fmt.min_normal, 0.0, r)
    r = torch.where(a == math.inf, math.inf if fmt.special == "ieee" else big, r)
    r = torch.copysign(r, y)
    return torch.where(_isnan(y), y, r)


def _rounds_by_pattern(fmt: Format, rounding: str, layout: FloatLayout) -> bool:
    """Whether :func:`_round_pattern` gives what :func:`_round_by_spacing` gives: nearest or
    toward zero, at least one mantissa bit (the tie rule of formats without them is
    the exponent's), fewer mantissa bits than the dtype, and normals inside the dtype's."""
    return (rounding != Rounding.STOCHASTIC and fmt.exp_bits >= 1
            and 1 <= fmt.man_bits < layout.man_bits and fmt.emin >= 1 - _BIAS[layout.width])


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
    if fmt.emin == 1 - _BIAS[layout.width]:
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
    bias = _BIAS[layout.width]
    exponent = a.view(layout.int_dtype) >> layout.man_bits  # biased; all ones for inf and NaN
    if fmt.emin < 1 - bias:  # normals below the dtype's: subnormal inputs need their exponent
        _, e2 = torch.frexp(a)
        exponent = torch.where(exponent == 0, e2.to(layout.int_dtype) - 1 + bias, exponent)
    e = torch.clamp(exponent - bias, min=fmt.emin)
    k = e - fmt.man_bits  # the spacing of the format around |y| is 2**k
    h1 = k >> 1
    h2 = k - h1
    v = a * _pow2(-h1, layout, a.dtype) * _pow2(-h2, layout, a.dtype)  # exact
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
    return n * _pow2(h1, layout, a.dtype) * _pow2(h2, layout, a.dtype)


def _isnan(v: Tensor) -> Tensor:
    """``v != v``: NaN test that inductor's CPU code vectorizes (its ``isnan`` is a scalar
    loop, which made the fused kernels ~1.5x clone). Inductor compiles without
    ``-ffinite-math-only``, so the comparison is kept."""
    return v != v


def round_int(y: Tensor, fmt: IntFormat, rounding: str, noise: Tensor | None = None,
              zero_point: Tensor | None = None) -> Tensor:
    """Codes: ``clamp(round(y) + zero_point, qmin, qmax)`` (as floats); NaN stays NaN. On a
    mid-rise grid, the levels ``clamp(round(y - 1/2), qmin, qmax) + 1/2``.

    Example:
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


# -- ranges and scales ------------------------------------------------------------------------


def bounds_of(x: Tensor, per_row: bool, sync: bool = True) -> Tensor:
    """``(lo, hi)`` over the finite values of ``x`` (shape ``(2,)``) or of each row (``(n, 2)``);
    zeros where there are none. With ``sync`` (eager, on the CPU) one read of the extremes
    decides whether the masked pass over non-finite values is needed; off the CPU, or
    compiled, it always runs."""
    return finite_bounds(x, per_row, sync)[0]


def finite_bounds(x: Tensor, per_row: bool, sync: bool = True) -> tuple[Tensor, Tensor]:
    """:func:`bounds_of`, and whether there was any finite value (a bool, per row with
    ``per_row``): a range fitted over time skips a batch that has none.

    Example:
        >>> finite_bounds(torch.tensor([1.0, float("nan"), -2.0]), per_row=False)
        (tensor([-2.,  1.]), tensor(True))
        >>> finite_bounds(torch.tensor([float("inf"), float("nan")]), per_row=False)
        (tensor([0., 0.]), tensor(False))
    """
    flat = x.reshape(x.shape[0], -1) if per_row else x.reshape(1, -1)
    if flat.shape[1] == 0:
        out = x.new_zeros((flat.shape[0], 2))
        found = torch.zeros(flat.shape[0], dtype=torch.bool, device=x.device)
        return (out, found) if per_row else (out[0], found[0])
    compute = _COMPUTE[x.dtype]
    flat = flat.to(compute)
    # per tensor: a whole-tensor reduction (over dim 1 of a (1, n) view, ATen's CPU
    # reduction ran ~20x slower: one thread walks the row)
    dims = (1,) if per_row else (0, 1)
    if per_row:
        lo, hi = torch.aminmax(flat, dim=1)
    else:
        lo, hi = (v.reshape(1) for v in torch.aminmax(flat))
    clean = sync and x.device.type == "cpu" and not torch.compiler.is_compiling() and bool(
        torch.isfinite(lo).all() & torch.isfinite(hi).all())
    if not clean and not per_row and not torch.compiler.is_compiling():
        # eager: the masked pass chunk by chunk (a whole-tensor mask and masked copy would
        # take 1.25x the input on top of the output)
        los, his = [], []
        for part in _chunks(flat.contiguous()):
            finite = torch.isfinite(part)
            los.append(torch.where(finite, part, math.inf).amin().reshape(1))
            his.append(torch.where(finite, part, -math.inf).amax().reshape(1))
        lo, hi = torch.cat(los).amin().reshape(1), torch.cat(his).amax().reshape(1)
    elif not clean:
        finite = torch.isfinite(flat)
        lo = torch.where(finite, flat, math.inf).amin(dim=dims).reshape(-1)
        hi = torch.where(finite, flat, -math.inf).amax(dim=dims).reshape(-1)
    if clean:
        found = torch.ones(lo.shape, dtype=torch.bool, device=lo.device)
    else:  # no finite value: lo is +inf there; the range is 0
        found = torch.isfinite(lo)
        lo = torch.where(found, lo, 0.0)
        hi = torch.where(found, hi, 0.0)
    out = torch.stack([lo, hi], dim=1)
    return (out, found) if per_row else (out[0], found[0])


def _amax(bounds: Tensor) -> Tensor:
    return torch.maximum(bounds[..., 0].abs(), bounds[..., 1].abs())


def _floor_pow2(t: Tensor) -> Tensor:
    """Positive normal floats rounded down to a power of two (mantissa bits cleared)."""
    layout = layout_of(t.dtype)
    return (t.view(layout.int_dtype) & ~((1 << layout.man_bits) - 1)).view(t.dtype)


def _exponent(t: Tensor) -> Tensor:
    """``floor(log2 t)`` of positive normal floats, as integers."""
    layout = layout_of(t.dtype)
    return (t.view(layout.int_dtype) >> layout.man_bits) - _BIAS[layout.width]


def _format_factor(amax: Tensor, fmt: Format | CustomFormat, mode: AnyScale) -> Tensor:
    """``max_finite / amax`` where amax is positive and finite, else 1; capped at the largest
    power of two of the dtype; floored to a power of two for ``-pow2`` modes."""
    dtype = amax.dtype
    layout = layout_of(dtype)
    usable = (amax > 0) & torch.isfinite(amax)
    # torch.div on tensors: `scalar / tensor` would multiply by the reciprocal instead.
    big = torch.full_like(amax, _finite(fmt.max_finite, dtype))
    factor = torch.where(usable, torch.div(big, torch.where(usable, amax, 1.0)), 1.0)
    cap = 2.0 ** (_BIAS[layout.width] - 1)
    factor = torch.clamp(factor, max=cap)
    if mode.pow2:
        factor = _floor_pow2(torch.clamp(factor, min=torch.finfo(dtype).tiny))
    return factor.to(dtype)


def _mx_factor(amax: Tensor, emax: int) -> Tensor:
    """OCP MX: ``1 / X`` with ``X = 2**(floor(log2 amax) - emax)``, the E8M0 exponent
    clamped to [-127, 127] (factor 1 where amax is 0 or not finite)."""
    layout = layout_of(amax.dtype)
    emax = min(emax, _BIAS[layout.width])  # (8 exponent bits: the dtype's largest binade)
    usable = (amax > 0) & torch.isfinite(amax) & (amax >= torch.finfo(amax.dtype).tiny)
    shared = torch.clamp(_exponent(torch.where(usable, amax, 1.0)) - emax, -127, 127)
    shared = torch.where(usable, shared, 0)
    h1 = (-shared) >> 1
    return _pow2(h1, layout, amax.dtype) * _pow2(-shared - h1, layout, amax.dtype)


def int_scale(bounds: Tensor, fmt: IntFormat, mode: AnyScale) -> tuple[Tensor, Tensor | None]:
    """``(scale, zero_point)`` of an integer format from ``(lo, hi)`` bounds."""
    lo, hi = bounds[..., 0], bounds[..., 1]
    zero_point = None
    levels: float
    if fmt.asymmetric:
        lo, hi = torch.clamp(lo, max=0.0), torch.clamp(hi, min=0.0)
        span, levels = hi - lo, fmt.qmax - fmt.qmin
    elif fmt.signed:
        span, levels = _amax(bounds), fmt.max_finite
    else:
        span, levels = torch.clamp(hi, min=0.0), fmt.qmax
    # a tensor divisor: CUDA computes `tensor / python_number` as a product with the
    # number's reciprocal, one ulp off the CPU's division for most spans
    scale = torch.div(span, torch.full_like(span, float(levels)))
    usable = (scale > 0) & torch.isfinite(scale) & (scale >= torch.finfo(scale.dtype).tiny)
    scale = torch.where(usable, scale, 1.0)
    if mode.pow2:  # ceil to a power of two, so the largest value stays on the grid
        floor = _floor_pow2(scale)
        # (but not past the dtype's largest power of two: 2x that is inf, and inf * 0 NaN;
        # the few values above it are clipped)
        top = _floor_pow2(torch.full_like(scale, torch.finfo(scale.dtype).max))
        scale = torch.where((floor < scale) & (floor < top), floor * 2, floor)
    if fmt.asymmetric:
        zero_point = torch.clamp(fmt.qmin - torch.round(lo / scale), fmt.qmin, fmt.qmax)
    return scale, zero_point


def int_grid_scale(x: Tensor, fmt: IntFormat, scale: str | AnyScale,
                   bounds: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """``(scale, zero_point)`` the op rounds ``x`` with on ``fmt``'s grid, shaped to
    broadcast against ``x`` (per block: expanded to ``x``'s shape), in the compute dtype
    (float32 for half-precision inputs); ``bounds`` as the op takes them (else from ``x``).

    Example:
        >>> int_grid_scale(torch.tensor([[1.0, -2.0], [0.5, 0.25]]), parse("int4"), "row")
        (tensor([[0.2857],
                [0.0714]]), None)
    """
    mode = Scale.parse(scale)
    compute = _COMPUTE[x.dtype]
    xc = x.to(compute)
    if mode is Scale.NONE:
        return torch.ones((), dtype=compute, device=x.device), None
    if mode.per_block:
        blocks = _blocks(xc)
        step, zero_point = int_scale(_block_bounds(blocks, sync=True), fmt, mode)
        def expand(t: Tensor) -> Tensor:
            return _unblock(_broadcast(t, blocks, mode).expand_as(blocks), xc)
        return expand(step), None if zero_point is None else expand(zero_point)
    if isinstance(mode, ScaleKind):
        bounds = mode.bounds(xc)
    elif bounds is None:
        bounds = bounds_of(xc, mode.per_row)
    step, zero_point = int_scale(bounds.to(compute), fmt, mode)
    return _broadcast(step, xc, mode), None if zero_point is None else \
        _broadcast(zero_point, xc, mode)


# -- the whole op, on one chunk or one tensor -------------------------------------------------


def _scaled(x: Tensor, fmt: Format | IntFormat | CustomFormat, rounding: str, mode: AnyScale,
            bounds: Tensor | None, noise: Tensor | None) -> Tensor:
    """Quantize ``x`` (compute dtype) whose rows or blocks line up with ``bounds``."""
    if isinstance(fmt, (Format, CustomFormat)):
        if mode is Scale.NONE:
            return _round_values(x, fmt, rounding, noise)
        assert bounds is not None
        amax = _amax(bounds)
        factor = _mx_factor(amax, fmt.emax) if mode.per_block else _format_factor(amax, fmt, mode)
        factor = _broadcast(factor, x, mode)
        target = _saturating(fmt) if mode.per_block and isinstance(fmt, Format) else fmt
        return _round_values(x * factor, target, rounding, noise) / factor
    if mode is Scale.NONE:
        return torch.where(_isnan(x), x, round_int(x, fmt, rounding, noise))
    assert bounds is not None
    scale, zero_point = int_scale(bounds, fmt, mode)
    scale = _broadcast(scale, x, mode)
    inv = torch.reciprocal(scale)
    zp = None if zero_point is None else _broadcast(zero_point, x, mode)
    codes = round_int(x * inv, fmt, rounding, noise, zp)
    out = (codes - zp if zp is not None else codes) * scale
    return torch.where(_isnan(x), x, out)


def _round_values(y: Tensor, fmt: Format | CustomFormat, rounding: str,
                  noise: Tensor | None) -> Tensor:
    """:func:`round_float`, or a custom format's own ``round`` with the rules every format
    keeps: NaN stays NaN, an infinity saturates where the format has none (MX blocks
    saturate every format)."""
    if isinstance(fmt, Format):
        return round_float(y, fmt, rounding, noise)
    r = fmt.round(y, rounding, noise)
    if not fmt.has_inf:
        big = torch.full_like(y, _finite(fmt.max_finite, y.dtype))
        r = torch.where(y.abs() == math.inf, torch.copysign(big, y), r)
    return torch.where(_isnan(y), y, r)


def _broadcast(per: Tensor, x: Tensor, mode: AnyScale) -> Tensor:
    """A per-tensor, per-row or per-block value shaped to broadcast against ``x`` (a
    registered scale kind's already is)."""
    if mode.per_row:
        return per.view((x.shape[0],) + (1,) * (x.dim() - 1))
    if mode.per_block:
        return per.unsqueeze(-1)  # x is (..., blocks, 32) here
    return per


def _blocks(x: Tensor) -> Tensor:
    """``x`` as ``(rows, blocks, 32)``, zero-padded along the last dim."""
    last = x.shape[-1] if x.dim() else 1
    pad = -last % 32
    flat = x.reshape(-1, last) if x.dim() else x.reshape(1, 1)
    if pad:
        flat = torch.nn.functional.pad(flat, (0, pad))
    return flat.reshape(flat.shape[0], -1, 32)


def _unblock(blocks: Tensor, like: Tensor) -> Tensor:
    """:func:`_blocks`' ``(rows, blocks, 32)`` back in ``like``'s shape, the padding cut
    off, in memory of its own (contiguous, as the input was: a view into the padded blocks
    would hold up to 32x the memory and break a caller's ``.view``)."""
    last = like.shape[-1] if like.dim() else 1
    return blocks.reshape(blocks.shape[0], -1)[:, :last].contiguous().reshape(like.shape)


def _noise(shape: torch.Size, dtype: torch.dtype, device: torch.device,
           generator: torch.Generator | None) -> Tensor:
    return torch.rand(shape, dtype=dtype, device=device, generator=generator)


def _whole(x: Tensor, fmt: Format | IntFormat | CustomFormat, rounding: str, mode: AnyScale,
           bounds: Tensor | None, generator: torch.Generator | None, sync: bool = True) -> Tensor:
    """The op on the whole tensor at once: what the decomposition compiles (``sync=False``:
    no value is read back to the host)."""
    compute = _COMPUTE[x.dtype]
    xc = x.to(compute)
    noise = (_noise(xc.shape, compute, x.device, generator)
             if rounding == Rounding.STOCHASTIC else None)
    if mode.per_block:
        blocks = _blocks(xc)
        block_bounds = _block_bounds(blocks, sync) if bounds is None else None
        if noise is not None:
            noise = _blocks(noise)
        out = _unblock(_scaled(blocks, fmt, rounding, mode,
                               block_bounds if bounds is None else bounds, noise), xc)
    else:
        if isinstance(mode, ScaleKind):
            bounds = mode.bounds(xc).to(compute)
        elif mode is not Scale.NONE and bounds is None:
            bounds = bounds_of(xc, mode.per_row, sync)
        out = _scaled(xc, fmt, rounding, mode, bounds, noise)
    return _to_dtype(out, fmt, x.dtype, mode is not Scale.NONE, x, sync)


def _to_dtype(out: Tensor, fmt: Format | IntFormat | CustomFormat, dtype: torch.dtype,
              scaled: bool,
              x: Tensor, sync: bool = True) -> Tensor:
    """``out`` in the input's dtype ``x.dtype``, never inf from a finite input by accident.

    Dividing a rounded value by a scale can step past the dtype's largest value (the
    rounding went up at the top of the range): scaled results are clamped to the dtype's
    finite range, and infinite inputs stay infinite where the format has inf. Unscaled, a
    narrower input dtype may not hold the format's largest value: formats without inf
    saturate there, formats with inf overflow to it (as a cast does).
    """
    ieee = (isinstance(fmt, Format) and fmt.special == "ieee") or (
        isinstance(fmt, CustomFormat) and fmt.has_inf)
    if scaled or (not ieee and out.dtype != dtype):
        big = torch.finfo(dtype).max
        # In place on the fresh output in eager; out of place where the compiler traces.
        out = out.clamp_(-big, big) if sync else torch.clamp(out, -big, big)
        if scaled and ieee and (not sync or x.device.type != "cpu" or _any_inf(x)):
            # compiled: |x| == inf, which inductor vectorizes (its isinf is a scalar loop)
            inf = torch.isinf(x) if sync else x.abs() == math.inf
            out = torch.where(inf, x.to(out.dtype), out)
    return out.to(dtype)


def _any_inf(x: Tensor) -> bool:
    """Whether ``x`` holds an infinity, chunk by chunk (``isinf`` of the whole tensor
    takes 1.25x its memory: a float ``abs`` and a bool mask)."""
    if not x.is_contiguous():
        return bool(torch.isinf(x).any())
    return any(bool(torch.isinf(part).any()) for part in _chunks(x))


def _block_bounds(blocks: Tensor, sync: bool) -> Tensor:
    """``(-amax, amax)`` per block of 32 over finite values (two fast reductions when clean)."""
    lo, hi = blocks.amin(dim=-1), blocks.amax(dim=-1)
    amax = torch.maximum(lo.abs(), hi.abs())
    if not (sync and blocks.device.type == "cpu" and bool(torch.isfinite(amax).all())):
        finite = torch.isfinite(blocks)
        amax = torch.where(finite, blocks.abs(), 0.0).amax(dim=-1)
    return torch.stack([-amax, amax], dim=-1)


def _per_tensor_bounds(x: Tensor) -> Tensor:
    """``(lo, hi)`` of finite values: one fast full reduction, masked only when needed."""
    lo, hi = torch.aminmax(x)
    if bool(torch.isfinite(lo) & torch.isfinite(hi)):
        return torch.stack([lo, hi])
    return bounds_of(x, per_row=False, sync=False)


def _per_row_bounds(x: Tensor) -> Tensor:
    """``(lo, hi)`` per row; ``amin``/``amax`` along a dim are faster than ``aminmax`` there."""
    flat = x.reshape(x.shape[0], -1)
    if flat.shape[1] == 0:
        return x.new_zeros((x.shape[0], 2))
    lo, hi = flat.amin(dim=1), flat.amax(dim=1)
    if bool(torch.isfinite(lo).all() & torch.isfinite(hi).all()):
        return torch.stack([lo, hi], dim=1)
    return bounds_of(x, per_row=True, sync=False)


def _chunks(t: Tensor) -> Iterator[Tensor]:
    flat = t.view(-1)
    for start in range(0, flat.numel(), CHUNK):
        yield flat[start:start + CHUNK]


def _saturating(fmt: Format) -> Format:
    """The same format with overflow clamped to its largest value (MX scaling saturates)."""
    if fmt.overflow == "saturate":
        return fmt
    return Format(fmt.exp_bits, fmt.man_bits, fmt.bias, fmt.special, fmt.subnormals, "saturate")


def _split_rounds(fmt: Format, rounding: str, compute: torch.dtype = torch.float32) -> bool:
    """Whether :func:`_round_nearest_split` computes exactly what :func:`round_float` does
    (with fewer mantissa bits than ``compute``: its subnormal step needs one to spare)."""
    return (rounding == Rounding.NEAREST and 1 <= fmt.man_bits < layout_of(compute).man_bits
            and fmt.subnormals and fmt.overflow == "saturate" and fmt.special != "ieee"
            and fmt.exp_bits >= 1)


def _round_nearest_split(part: Tensor, fmt: Format) -> None:
    """Round ``part`` in place to ``fmt`` (nearest, saturating), as :func:`round_float` does.

    Normal values: Veltkamp's splitting (``c = y * (2**s + 1)``, ``hi = c - (c - y)``) keeps
    ``man_bits + 1`` significant bits, rounded to nearest even by the hardware (values so
    large that ``c`` would overflow are split scaled down by ``2**-(s + 1)``); values below
    the smallest normal: adding and subtracting ``1.5 * 2**(emin - man_bits + p - 1)`` rounds
    them to the subnormal spacing. Each step is its own kernel, so nothing fuses them into
    a fused multiply-add (which would change the result); the tests check every tie.
    """
    layout = layout_of(part.dtype)
    big = _finite(fmt.max_finite, part.dtype)
    part.clamp_(-big, big)
    shift = layout.man_bits - fmt.man_bits
    c = part * float(2 ** shift + 1)
    c.sub_(c - part)
    top = math.floor(math.log2(torch.finfo(part.dtype).max)) - shift - 1
    if big >= 2.0 ** top:  # (8 exponent bits: y * (2**s + 1) overflows for the largest y)
        down = part * 2.0 ** -(shift + 1)  # exact: these values stay normal
        high = down * float(2 ** shift + 1)
        high.sub_(high - down).mul_(2.0 ** (shift + 1))
        fmax = torch.finfo(part.dtype).max  # (a value rounded up past the dtype saturates)
        high.clamp_(-fmax, fmax)
        torch.where(part.abs() >= 2.0 ** top, high, c, out=c)
    magic = 1.5 * 2.0 ** (fmt.emin - fmt.man_bits + layout.man_bits)
    small = (part + magic).sub_(magic).copysign_(part)
    torch.where(part.abs() < 2.0 ** fmt.emin, small, c, out=part)


def _cast_route(fmt: Format, rounding: str, compute: torch.dtype) -> tuple[torch.dtype, int] | None:
    """A torch cast that rounds float32 to ``fmt`` (to nearest) once the values are scaled
    by ``2**shift``, and the shift; None where there is none.

    A format of torch's rounds by its own cast (shift 0). A saturating format without inf
    rounds by the cast of a format with as many mantissa bits whose grid holds it, moved
    down to the same smallest normal: E2M3 (smallest normal 1, subnormal spacing 2**-3)
    is E4M3 (2**-6 and 2**-9) scaled by 2**6, E3M2 is E5M2 scaled by 2**12. Values are
    clamped to the format's largest first (saturation; inf goes there, NaN stays NaN).
    Powers of two scale float32 exactly down to its subnormals, and the cast's own
    smallest half spacing must lie above them (values below it round to zero either way;
    so not bfloat16, whose subnormals are float32's)."""
    if rounding != Rounding.NEAREST or compute != torch.float32:
        return None
    if fmt in _TORCH_CASTS:
        return _TORCH_CASTS[fmt], 0
    if not (fmt.subnormals and fmt.overflow == "saturate" and fmt.special != "ieee"
            and fmt.exp_bits >= 1):
        return None
    for cast_fmt, dtype in _TORCH_CASTS.items():
        shift = cast_fmt.emin - fmt.emin
        if cast_fmt.man_bits == fmt.man_bits and cast_fmt.subnormals and shift <= 0 \
                and fmt.max_finite * 2.0 ** shift <= cast_fmt.max_finite \
                and cast_fmt.emin - cast_fmt.man_bits - 1 >= 1 - _BIAS[32]:
            return dtype, shift
    return None


def _cast_into(part: Tensor, dtype: torch.dtype, shift: int, lim: float,
               table: Tensor | None) -> None:
    """``part`` (float32) rounded in place by torch's cast to ``dtype`` and back, along a
    route of :func:`_cast_route` (with a shift: saturated at ``lim``, already scaled, and
    moved onto the cast's grid and back). An 8-bit float comes back through ``table``, its
    256 values as float32: torch's own fp8 to float32 conversion is a scalar loop on CPU
    (5x the lookup on 256K values here)."""
    if shift:
        part.mul_(2.0 ** shift).clamp_(-lim, lim)
    rounded = part.to(dtype)
    if table is None:
        part.copy_(rounded)
    else:
        torch.index_select(table, 0, rounded.view(torch.uint8).to(torch.int32), out=part)
    if shift:
        part.mul_(2.0 ** -shift)


def _fp8_table(dtype: torch.dtype, device: torch.device) -> Tensor | None:
    """Every value of an 8-bit float ``dtype`` as float32, indexed by its bit pattern."""
    if torch.finfo(dtype).bits != 8:
        return None
    return torch.arange(256, dtype=torch.uint8, device=device).view(dtype).to(torch.float32)


def _eager(x: Tensor, fmt: Format | IntFormat | CustomFormat, rounding: str, mode: AnyScale,
           bounds: Tensor | None, generator: torch.Generator | None) -> Tensor:
    """The same values as :func:`_whole`, computed into one output buffer: the scaling and
    integer steps in place on it, the float rounding in chunks (so temporaries stay small
    and the allocator reuses them). Extra memory: the output and a few chunks."""
    if x.device.type == "meta" or isinstance(fmt, CustomFormat) \
            or isinstance(mode, ScaleKind):
        return _whole(x, fmt, rounding, mode, bounds, generator)
    compute = _COMPUTE[x.dtype]
    xc = (x if x.dtype == compute else x.to(compute)).contiguous()
    view = _blocks(xc) if mode.per_block else xc
    if mode.per_block:
        bounds = _block_bounds(view, sync=True)
    elif mode is not Scale.NONE and bounds is None:
        bounds = _per_row_bounds(xc) if mode.per_row else _per_tensor_bounds(xc)
    stochastic = rounding == Rounding.STOCHASTIC
    if isinstance(fmt, IntFormat):
        out = _eager_int(view, fmt, rounding, mode, bounds, generator)
    else:
        target = _saturating(fmt) if mode.per_block else fmt
        factor = None
        if mode is not Scale.NONE:
            assert bounds is not None
            amax = _amax(bounds)
            per = _mx_factor(amax, fmt.emax) if mode.per_block else _format_factor(amax, fmt, mode)
            factor = _broadcast(per, view, mode)
        # one factor for the whole tensor: scaled, rounded and unscaled per chunk while it
        # is in cache (two whole-tensor passes fewer); the same operations, the same values
        whole = factor is None or factor.numel() == 1
        if whole:
            out = torch.empty_like(view)
            if factor is not None:
                factor = factor.reshape(())
        else:
            assert factor is not None
            out = torch.mul(view, factor)
        route = _cast_route(target, rounding, compute)
        if route is not None:  # the same for every chunk
            cast, shift = route
            lim = _finite(target.max_finite, compute) * 2.0 ** shift
            table = _fp8_table(cast, x.device)
        split = _split_rounds(target, rounding, compute)
        for part, source in zip(_chunks(out), _chunks(view), strict=True):
            if whole:
                if factor is None:
                    part.copy_(source)
                else:
                    torch.mul(source, factor, out=part)
            if route is not None:
                _cast_into(part, cast, shift, lim, table)
            elif split:
                _round_nearest_split(part, target)
            else:
                noise = _noise(part.shape, compute, x.device, generator) if stochastic else None
                part.copy_(round_float(part, target, rounding, noise))
            if whole and factor is not None:
                part.div_(factor)
        if not whole:
            assert factor is not None
            out.div_(factor)
    if mode.per_block:
        out = _unblock(out, xc)
    return _to_dtype(out, fmt, x.dtype, mode is not Scale.NONE, x)


def _eager_int(view: Tensor, fmt: IntFormat, rounding: str, mode: Scale, bounds: Tensor | None,
               generator: torch.Generator | None) -> Tensor:
    """``(clamp(round(x * inv) + zp, qmin, qmax) - zp) * scale``, in place on the output."""
    if mode is Scale.NONE:
        out = view.clone()
        scale = zero_point = None
    else:
        assert bounds is not None
        per_scale, per_zero = int_scale(bounds, fmt, mode)
        scale = _broadcast(per_scale, view, mode)
        zero_point = None if per_zero is None else _broadcast(per_zero, view, mode)
        out = torch.mul(view, torch.reciprocal(scale))
    # one scale for the whole tensor: every step on a chunk while it is in cache
    whole = scale is None or scale.numel() == 1
    if whole and scale is not None:  # a scalar, to broadcast against a flat chunk
        scale = scale.reshape(())
        zero_point = None if zero_point is None else zero_point.reshape(())
    for part in _chunks(out):
        if fmt.midrise:
            part.sub_(fmt.offset)
        if rounding == Rounding.STOCHASTIC:
            part.add_(_noise(part.shape, part.dtype, part.device, generator)).floor_()
        elif rounding == Rounding.NEAREST:
            part.round_()
        else:
            part.trunc_()
        if whole:
            _finish_codes(part, fmt, scale, zero_point)
    if not whole:
        _finish_codes(out, fmt, scale, zero_point)
    return out


def _finish_codes(out: Tensor, fmt: IntFormat, scale: Tensor | None,
                  zero_point: Tensor | None) -> None:
    """Rounded ``out`` (in place): ``(clamp(out + zp, qmin, qmax) - zp) * scale``."""
    if zero_point is not None:
        out.add_(zero_point).clamp_(fmt.qmin, fmt.qmax).sub_(zero_point)
    else:
        out.clamp_(fmt.qmin, fmt.qmax)
        if fmt.qmin >= 0:  # +0, never -0, on an unsigned grid (as round_int)
            out.abs_()
        if fmt.midrise:
            out.add_(fmt.offset)
    if scale is not None:
        out.mul_(scale)


def quantize_values(x: Tensor, fmt: AnyFormat, rounding: str, scale: str = "none",
                    bounds: Tensor | None = None,
                    generator: torch.Generator | None = None) -> Tensor:
    """The eager numerics without checks or autograd (arguments already validated)."""
    if isinstance(fmt, TopN):
        return truncate_values(x, fmt.bits, rounding, generator)
    if x.numel() == 0:
        return x.clone()
    mode = Scale.parse(scale)
    if bounds is not None:
        bounds = bounds.to(_COMPUTE[x.dtype])
    return _eager(x, fmt, rounding, mode, bounds, generator)


# -- validation -------------------------------------------------------------------------------


def _where(name: str) -> str:
    return f"fxquant.quantize (quantization point {name!r})" if name else "fxquant.quantize"


def _check(x: Tensor, format: str, rounding: str, scale: str, grad: str, override_format: str,
           grad_format: str, name: str, bounds: Tensor | None = None) -> tuple[AnyFormat, AnyFormat | None]:
    where = _where(name)
    what = f"the input of quantization point {name!r}" if name else "x"
    layout = layout_of(x.dtype, what)
    Rounding.parse(rounding)
    op_grad(grad)
    mode = Scale.parse(scale)
    if mode.per_row and x.dim() < 2:
        raise FxquantValueError(
            f"{where}: scale={scale!r} gives each row (dim 0) its own scale, so it needs a "
            f"tensor with rows and columns; got shape {tuple(x.shape)}. Please use "
            "scale='tensor' for a 1-D tensor."
        )
    numbers = []
    for arg, spec in (("format", format), ("override_format", override_format),
                      ("grad_format", grad_format)):
        if not spec:
            continue
        try:
            number = parse(spec)
        except (TypeError, ValueError) as e:
            raise same_kind(e, f"{where}: {arg}: {e}") from e
        if isinstance(number, TopN):
            check_bits(number.bits, layout.width, arg, where)
        numbers.append(number)
    main = numbers[0]
    if rounding == Rounding.TOWARD_ZERO and any(
            isinstance(n, IntFormat) and n.midrise for n in numbers):
        raise FxquantValueError(f"{where}: a mid-rise grid ('intN:midrise') has no zero to round "
                         "toward; please use rounding='nearest' or 'stochastic'")
    if isinstance(main, TopN) and mode is not Scale.NONE:
        raise FxquantValueError(f"{where}: scale={scale!r} applies to formats, not to top-N "
                         f"truncation ({main.spec()})")
    if bounds is not None:
        expected = (x.shape[0], 2) if mode.per_row else (2,)
        if mode is Scale.NONE or mode.per_block or isinstance(mode, ScaleKind) \
                or tuple(bounds.shape) != expected:
            raise FxquantValueError(
                f"{where}: bounds must have shape {expected} for scale={scale!r} (got "
                f"{tuple(bounds.shape)}); block scales and registered scales come from the data")
    return main, parse(override_format) if override_format else None


# -- the registered op ------------------------------------------------------------------------

_SCHEMA: Final = (
    "(Tensor x, str format, str rounding='nearest', str scale='none', str grad='ste', "
    "Generator? generator=None, Tensor? bounds=None, Tensor? override_rows=None, "
    "str override_format='', str grad_format='', str name='', str numerics='') -> Tensor"
)


def _quantize_impl(
    x: Tensor,
    format: str,
    rounding: str = "nearest",
    scale: str = "none",
    grad: str = "ste",
    generator: torch.Generator | None = None,
    bounds: Tensor | None = None,
    override_rows: Tensor | None = None,
    override_format: str = "",
    grad_format: str = "",
    name: str = "",
    numerics: str = "",
) -> Tensor:
    fmt, override_fmt = _check(x, format, rounding, scale, grad, override_format, grad_format,
                               name, bounds)
    y = quantize_values(x, fmt, rounding, scale, bounds, generator)
    if override_rows is not None and override_fmt is not None:
        mask = row_mask(override_rows, x, _where(name))
        y = torch.where(mask, quantize_values(x, override_fmt, rounding, scale, bounds,
                                              generator), y)
    return y


_quantize_op = torch.library.custom_op("fxquant::quantize", mutates_args=(), schema=_SCHEMA)(
    _quantize_impl)
#: The Python signature of the op (names and defaults are the schema's; tested).
SIGNATURE: Final = inspect.signature(_quantize_impl)


@_quantize_op.register_fake
def _(
    x: Tensor,
    format: str,
    rounding: str = "nearest",
    scale: str = "none",
    grad: str = "ste",
    generator: torch.Generator | None = None,
    bounds: Tensor | None = None,
    override_rows: Tensor | None = None,
    override_format: str = "",
    grad_format: str = "",
    name: str = "",
    numerics: str = "",
) -> Tensor:
    _check(x, format, rounding, scale, grad, override_format, grad_format, name, bounds)
    if override_rows is not None:
        row_mask(override_rows, x, _where(name))
    return torch.empty_like(x)


#: The op's argument names, in schema order (the one place that knows its layout).
ARGS: Final = tuple(a.name for a in torch.ops.fxquant.quantize.default._schema.arguments)


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: Tensor) -> None:
    b = dict(zip(ARGS, inputs, strict=True))
    ctx.rule = (b["rounding"], b["scale"], b["grad"], b["grad_format"])  # type: ignore[attr-defined]


def _backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple:
    rounding, scale, rule, grad_format = ctx.rule  # type: ignore[attr-defined]
    grad_x = grad if rule == Grad.STE else torch.zeros_like(grad)
    if grad_format:
        # The gradient is quantized like the forward value: same rounding and scaling mode,
        # with the scale taken from the gradient itself.
        number = parse(grad_format)
        mode = "none" if isinstance(number, TopN) or (Scale.parse(scale).per_row and grad_x.dim() < 2) \
            else scale
        grad_x = quantize_values(grad_x, number, rounding, mode)
    return (grad_x,) + (None,) * (len(ARGS) - 1)


_quantize_op.register_autograd(_backward, setup_context=_setup_context)


def _decomposed(
    x: Tensor,
    format: str,
    rounding: str = "nearest",
    scale: str = "none",
    grad: str = "ste",
    generator: torch.Generator | None = None,
    bounds: Tensor | None = None,
    override_rows: Tensor | None = None,
    override_format: str = "",
    grad_format: str = "",
    name: str = "",
    numerics: str = "",
) -> Tensor:
    """What inductor compiles: the per-element functions on the whole tensor, fused."""
    fmt, override_fmt = parse(format), parse(override_format) if override_format else None
    if rounding == Rounding.STOCHASTIC:
        return torch.ops.fxquant._stochastic_quantize(x, format, scale, bounds, override_rows,
                                                       override_format, name)

    def one(number: AnyFormat) -> Tensor:
        if isinstance(number, TopN):
            return torch.ops.fxquant.truncate.default(x, number.bits, rounding)
        given = None if bounds is None else bounds.to(_COMPUTE[x.dtype])
        return _whole(x, number, rounding, Scale.parse(scale), given, None, sync=False)

    y = one(fmt)
    if override_rows is not None and override_fmt is not None:
        y = torch.where(row_mask(override_rows, x, _where(name)), one(override_fmt), y)
    return y


@torch.library.custom_op(
    "fxquant::_stochastic_quantize", mutates_args=(),
    schema="(Tensor x, str format, str scale, Tensor? bounds, Tensor? override_rows, "
           "str override_format, str name) -> Tensor",
)
def _stochastic_quantize(x: Tensor, format: str, scale: str, bounds: Tensor | None,
                         override_rows: Tensor | None, override_format: str, name: str) -> Tensor:
    """The eager stochastic kernel as an op without a decomposition, for compiled graphs."""
    return _quantize_impl(x, format, "stochastic", scale, "ste", None, bounds, override_rows,
                          override_format, "", name)


@_stochastic_quantize.register_fake
def _(x: Tensor, format: str, scale: str, bounds: Tensor | None, override_rows: Tensor | None,
      override_format: str, name: str) -> Tensor:
    return torch.empty_like(x)


def _register_inductor_decomposition() -> None:
    from torch._inductor.decomposition import register_decomposition

    register_decomposition([torch.ops.fxquant.quantize.default])(_decomposed)


_register_inductor_decomposition()
