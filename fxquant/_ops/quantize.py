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

import functools
import inspect
import math
from collections.abc import Iterator
from typing import Final

import torch
from torch import Tensor

from fxquant._ops.layouts import COMPUTE_DTYPE, EXPONENT_BIAS, layout_of
from fxquant._ops.rounding import finite_value, isnan_fast, round_float, round_int
from fxquant._ops.rows import row_mask
from fxquant._ops.scales import (
    amax_of,
    block_bounds,
    bounds_of,
    broadcast_scale,
    finite_bounds,
    format_factor,
    from_blocks,
    int_grid_scale,
    int_scale,
    mx_factor,
    row_bounds,
    tensor_bounds,
    to_blocks,
)
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
#: torch's own casts from float32, each rounding to nearest even onto the format it names
_TORCH_CASTS = {PRESETS["e4m3"]: torch.float8_e4m3fn, PRESETS["e5m2"]: torch.float8_e5m2,
                PRESETS["fp16"]: torch.float16, PRESETS["bf16"]: torch.bfloat16}


@functools.cache
def _cast_saturates(dtype: torch.dtype) -> bool:
    """Whether torch's cast to ``dtype`` clamps overflow to the largest finite value.

    torch 2.13 saturates float8_e4m3fn (it has no inf); torch 2.12 gives NaN. Where the cast
    does not saturate, a saturating format is clamped before it (the same values)."""
    probe = torch.tensor([1e30, -math.inf], dtype=torch.float32).to(dtype).to(torch.float32)
    return bool(probe.isfinite().all())


# -- the whole op, on one chunk or one tensor -------------------------------------------------


def _scaled(x: Tensor, fmt: Format | IntFormat | CustomFormat, rounding: str, mode: AnyScale,
            bounds: Tensor | None, noise: Tensor | None) -> Tensor:
    """Quantize ``x`` (compute dtype) whose rows or blocks line up with ``bounds``."""
    if isinstance(fmt, (Format, CustomFormat)):
        if mode is Scale.NONE:
            return _round_values(x, fmt, rounding, noise)
        assert bounds is not None
        amax = amax_of(bounds)
        factor = mx_factor(amax, fmt.emax) if mode.per_block else format_factor(amax, fmt, mode)
        factor = broadcast_scale(factor, x, mode)
        target = _saturating(fmt) if mode.per_block and isinstance(fmt, Format) else fmt
        return _round_values(x * factor, target, rounding, noise) / factor
    if mode is Scale.NONE:
        return torch.where(isnan_fast(x), x, round_int(x, fmt, rounding, noise))
    assert bounds is not None
    scale, zero_point = int_scale(bounds, fmt, mode)
    scale = broadcast_scale(scale, x, mode)
    inv = torch.reciprocal(scale)
    zp = None if zero_point is None else broadcast_scale(zero_point, x, mode)
    codes = round_int(x * inv, fmt, rounding, noise, zp)
    out = (codes - zp if zp is not None else codes) * scale
    return torch.where(isnan_fast(x), x, out)


def _round_values(y: Tensor, fmt: Format | CustomFormat, rounding: str,
                  noise: Tensor | None) -> Tensor:
    """:func:`round_float`, or a custom format's own ``round`` with the rules every format
    keeps: NaN stays NaN, an infinity saturates where the format has none (MX blocks
    saturate every format)."""
    if isinstance(fmt, Format):
        return round_float(y, fmt, rounding, noise)
    r = fmt.round(y, rounding, noise)
    if not fmt.has_inf:
        big = torch.full_like(y, finite_value(fmt.max_finite, y.dtype))
        r = torch.where(y.abs() == math.inf, torch.copysign(big, y), r)
    return torch.where(isnan_fast(y), y, r)


def _noise(shape: torch.Size, dtype: torch.dtype, device: torch.device,
           generator: torch.Generator | None) -> Tensor:
    return torch.rand(shape, dtype=dtype, device=device, generator=generator)


def _whole(x: Tensor, fmt: Format | IntFormat | CustomFormat, rounding: str, mode: AnyScale,
           bounds: Tensor | None, generator: torch.Generator | None, sync: bool = True) -> Tensor:
    """The op on the whole tensor at once: what the decomposition compiles (``sync=False``:
    no value is read back to the host)."""
    compute = COMPUTE_DTYPE[x.dtype]
    xc = x.to(compute)
    noise = (_noise(xc.shape, compute, x.device, generator)
             if rounding == Rounding.STOCHASTIC else None)
    if mode.per_block:
        blocks = to_blocks(xc)
        per_block = block_bounds(blocks, sync) if bounds is None else None
        if noise is not None:
            noise = to_blocks(noise)
        out = from_blocks(_scaled(blocks, fmt, rounding, mode,
                                  per_block if bounds is None else bounds, noise), xc)
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
    return any(bool(torch.isinf(part).any()) for part in chunks(x))


def chunks(t: Tensor) -> Iterator[Tensor]:
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
    big = finite_value(fmt.max_finite, part.dtype)
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
                and cast_fmt.emin - cast_fmt.man_bits - 1 >= 1 - EXPONENT_BIAS[32]:
            return dtype, shift
    return None


def _cast_into(part: Tensor, dtype: torch.dtype, shift: int, lim: float | None,
               table: Tensor | None) -> None:
    """``part`` (float32) rounded in place by torch's cast to ``dtype`` and back, along a
    route of :func:`_cast_route` (with a shift: saturated at ``lim``, already scaled, and
    moved onto the cast's grid and back). An 8-bit float comes back through ``table``, its
    256 values as float32: torch's own fp8 to float32 conversion is a scalar loop on CPU
    (5x the lookup on 256K values here)."""
    if shift:
        part.mul_(2.0 ** shift)
    if lim is not None:
        part.clamp_(-lim, lim)
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
    compute = COMPUTE_DTYPE[x.dtype]
    xc = (x if x.dtype == compute else x.to(compute)).contiguous()
    view = to_blocks(xc) if mode.per_block else xc
    if mode.per_block:
        bounds = block_bounds(view, sync=True)
    elif mode is not Scale.NONE and bounds is None:
        bounds = row_bounds(xc) if mode.per_row else tensor_bounds(xc)
    stochastic = rounding == Rounding.STOCHASTIC
    if isinstance(fmt, IntFormat):
        out = _eager_int(view, fmt, rounding, mode, bounds, generator)
    else:
        target = _saturating(fmt) if mode.per_block else fmt
        factor = None
        if mode is not Scale.NONE:
            assert bounds is not None
            amax = amax_of(bounds)
            per = mx_factor(amax, fmt.emax) if mode.per_block else format_factor(amax, fmt, mode)
            factor = broadcast_scale(per, view, mode)
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
            # saturation: by the clamp where the cast alone would not saturate
            lim: float | None = finite_value(target.max_finite, compute) * 2.0 ** shift
            if not shift and (target.overflow != "saturate" or _cast_saturates(cast)):
                lim = None
            table = _fp8_table(cast, x.device)
        split = _split_rounds(target, rounding, compute)
        for part, source in zip(chunks(out), chunks(view), strict=True):
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
        out = from_blocks(out, xc)
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
        scale = broadcast_scale(per_scale, view, mode)
        zero_point = None if per_zero is None else broadcast_scale(per_zero, view, mode)
        out = torch.mul(view, torch.reciprocal(scale))
    # one scale for the whole tensor: every step on a chunk while it is in cache
    whole = scale is None or scale.numel() == 1
    if whole and scale is not None:  # a scalar, to broadcast against a flat chunk
        scale = scale.reshape(())
        zero_point = None if zero_point is None else zero_point.reshape(())
    for part in chunks(out):
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
        bounds = bounds.to(COMPUTE_DTYPE[x.dtype])
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
        given = None if bounds is None else bounds.to(COMPUTE_DTYPE[x.dtype])
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
