"""Keep the top ``bits`` of a float's bit pattern: the numerics behind every truncation node.

A float is read as its IEEE-754 pattern through an integer view of the same width
(``x.view(torch.int32)`` for float32); nothing is ever expanded into bit-planes. Rounding
acts on the magnitude (the pattern without its sign bit), so the sign is never changed.

Rules, in order (every dtype, bit width and rounding):

1. NaN stays NaN (with its payload) and +-inf stays +-inf.
2. The magnitude is rounded to a multiple of ``2 ** (width - bits)``:
   ``"toward_zero"`` drops the low bits, ``"nearest"`` rounds half to even,
   ``"stochastic"`` rounds the magnitude up with probability equal to the dropped
   fraction (unbiased on the pattern; see below).
3. A rounded magnitude past the largest finite pattern becomes inf of the same sign.

``bits`` counts from the top of the tensor's own pattern (float32: 32, float64: 64,
float16 and bfloat16: 16). With fewer bits than sign + exponent, the exponent itself is cut
and the same rules apply to the pattern; for float32 the values that come out are:

=====  ========================================  ==========================================
bits   ``"toward_zero"`` (finite inputs)         ``"nearest"`` differs
=====  ========================================  ==========================================
32     the input, bit for bit                    (same)
16     bfloat16 values                           equals ``x.to(torch.bfloat16).float()``
9      0 and signed powers of two ``+-2**e``,    rounds to the nearer power of two in the
       ``-126 <= e <= 127``; subnormals give 0   pattern; the max finite value gives inf
5      0 and ``+-2**(16k - 127)``, k = 1..15     ``|x| >= 2**121`` gives inf
       (2**-111, 2**-95, ..., 2**113)
2      0 and +-2                                 ``2**-63 < |x| < 2**65`` gives +-2,
                                                 ``|x| >= 2**65`` gives +-inf
1      +-0                                       ``|x| > 2`` gives +-inf
=====  ========================================  ==========================================

Below 9 bits, stochastic rounding is unbiased on the pattern, not on the value (consecutive
kept patterns are no longer evenly spaced in value).

The registered op ``torch.ops.fxquant.truncate`` carries the gradient rule, an optional
per-row override and the name of the quantization point it serves (for error messages),
so a graph that calls it needs nothing else to run, compile or reload.
"""

from __future__ import annotations

import inspect
from typing import Final

import torch
from torch import Tensor

from fxquant._ops.layouts import FloatLayout, layout_of
from fxquant._ops.rows import row_mask
from fxquant.errors import FxquantTypeError, FxquantValueError
from fxquant.modes import Grad, Rounding, op_grad

__all__ = [
    "ARGS",
    "SIGNATURE",
    "check_bits",
    "random_bits",
    "truncate_eager",
    "truncate_exact",
    "truncate_fast",
    "truncate_fused",
    "truncate_values",
]


def _where(name: str) -> str:
    return f"fxquant.truncate (quantization point {name!r})" if name else "fxquant.truncate"


def check_bits(value: object, width: int, arg: str, where: str) -> int:
    """``value`` as a number of kept bits of a ``width``-bit pattern, or a clear error."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise FxquantTypeError(f"{where}: {arg} must be an int (the number of kept bits), got {value!r}")
    if not 1 <= value <= width:
        raise FxquantValueError(
            f"{where}: {arg}={value} is out of range: it counts the kept bits of the "
            f"{width}-bit pattern, so 1 <= {arg} <= {width}."
        )
    return value


def _check_args(x: Tensor, bits: int, rounding: str, grad: str, name: str,
                override_bits: int | None = None, grad_bits: int = 0) -> FloatLayout:
    """Validate everything but the tensor values; shared by the kernels and the fake kernel."""
    where = _where(name)
    what = f"the input of quantization point {name!r}" if name else "x"
    layout = layout_of(x.dtype, what)
    check_bits(bits, layout.width, "bits", where)
    if override_bits is not None:
        check_bits(override_bits, layout.width, "override_bits", where)
    if grad_bits:
        check_bits(grad_bits, layout.width, "grad_bits", where)
    Rounding.parse(rounding)
    op_grad(grad)
    return layout


def random_bits(x: Tensor, layout: FloatLayout, generator: torch.Generator | None) -> Tensor:
    """Uniform random integers in ``[0, 2**(width-1))`` with ``x``'s shape and int view dtype.

    ``random_`` on int64 fills 63 uniform bits per word; viewing those words as narrower
    integers gives uniform low bits (only each word's top bit is 0), which is all the
    rounding uses. One int64 draw is cheaper than ``torch.randint`` in the target dtype.
    """
    per_word = 64 // layout.width
    words = -(-x.numel() // per_word)
    raw = torch.empty(words, dtype=torch.int64, device=x.device).random_(generator=generator)
    return raw.view(layout.int_dtype)[: x.numel()].view(x.shape)


def _needs_nan_fix(x: Tensor) -> bool:
    """Whether the fast kernels' output must be patched where ``x`` is NaN.

    On the CPU a single reduction (NaN propagates through ``max``) is cheaper than an
    unconditional ``where`` pass. Elsewhere we never read a value back to the host: a
    device sync costs more than the pass.
    """
    if x.device.type != "cpu":
        return True
    return bool(torch.isnan(x.max()))


def truncate_fast(
    x: Tensor, bits: int, rounding: str, layout: FloatLayout, generator: torch.Generator | None
) -> Tensor:
    """Eager kernel for ``bits > exp_bits`` (exponent kept) in as few memory passes as we can.

    The arithmetic runs on the signed pattern: a finite magnitude plus at most ``2**d``
    stays below the sign bit, so the sign is untouched, a carry out of the mantissa is the
    correct rounding into the next binade, and a carry into the all-ones exponent is inf.
    inf itself stays inf. Only NaN can come out wrong (its payload may be rounded away or
    overflow), so it is patched from the input afterwards.
    """
    d = layout.width - bits
    i = x.view(layout.int_dtype)
    mask = -(1 << d)
    if rounding == "toward_zero":
        y = i & mask
    elif rounding == "nearest":
        # Round half to even: add 2**(d-1) - 1, plus 1 when the kept part is odd.
        y = i & (1 << d)
        y >>= d
        y += i
        y += (1 << (d - 1)) - 1
        y &= mask
    else:
        y = random_bits(x, layout, generator)
        y &= (1 << d) - 1
        y += i
        y &= mask
    if _needs_nan_fix(x):
        _patch_nan(y, i, x)
    return y.view(x.dtype)


#: Elements per chunk where a kernel needs temporaries (they stay this small).
CHUNK: Final = 1 << 20


def _chunks(t: Tensor) -> list[Tensor]:
    flat = t.view(-1)
    return [flat[start:start + CHUNK] for start in range(0, flat.numel(), CHUNK)]


def _patch_nan(y: Tensor, i: Tensor, x: Tensor) -> None:
    """Put the input's pattern back where it is NaN, in place, a chunk at a time."""
    for yp, ip, xp in zip(_chunks(y), _chunks(i), _chunks(x), strict=True):
        yp.copy_(torch.where(torch.isnan(xp), ip, yp))


def truncate_exact(x: Tensor, bits: int, rounding: str, random: Tensor | None) -> Tensor:
    """Branch-free reference kernel valid for every ``bits``; also what torch.compile fuses.

    Works on the magnitude's kept part ``q`` and dropped part ``rem`` separately, so no
    intermediate ever needs more bits than the pattern. ``random`` (stochastic only) holds
    uniform integers whose low ``width - bits`` bits are used; with the same random
    integers it rounds exactly like :func:`truncate_fast`.
    """
    layout = layout_of(x.dtype)
    d = layout.width - bits
    if d == 0:
        return x.clone()
    low = (1 << d) - 1
    i = x.view(layout.int_dtype)
    a = i & layout.magnitude
    q = a >> d
    if rounding != "toward_zero":
        rem = a & low
        if rounding == "nearest":
            half = 1 << (d - 1)
            up = (rem > half) | ((rem == half) & ((q & 1) == 1))
        else:
            assert random is not None
            up = rem > (low - (random & low))
        q = q + up.to(layout.int_dtype)
    limit = (layout.inf - 1) >> d  # largest q whose pattern q << d is finite
    out = torch.where(q > limit, layout.inf, torch.clamp(q, max=limit) << d)
    out = torch.where(a >= layout.inf, a, out)
    return (out | (i & layout.sign)).view(x.dtype)


def truncate_fused(x: Tensor, bits: int, rounding: str, random: Tensor | None) -> Tensor:
    """What torch.compile fuses: the fast kernel's arithmetic, NaN patched without a branch.

    Every step is an integer op on the pattern (the NaN test too), which inductor turns into
    one vectorized loop; measured at about clone speed (the speed results). Bit widths
    that cut the exponent use :func:`truncate_exact`. Rounds exactly like both.
    """
    layout = layout_of(x.dtype)
    d = layout.width - bits
    if d == 0 or bits <= layout.exp_bits:
        return truncate_exact(x, bits, rounding, random)
    i = x.view(layout.int_dtype)
    mask = -(1 << d)
    if rounding == "toward_zero":
        y = i & mask
    elif rounding == "nearest":
        y = (i + (((i >> d) & 1) + ((1 << (d - 1)) - 1))) & mask
    else:
        assert random is not None
        y = (i + (random & ((1 << d) - 1))) & mask
    is_nan = (i & layout.magnitude) > layout.inf
    return torch.where(is_nan, i, y).view(x.dtype)


def truncate_eager(
    x: Tensor, bits: int, rounding: str, layout: FloatLayout, generator: torch.Generator | None
) -> Tensor:
    """The eager kernel: in place on one output, chunk by chunk where it needs temporaries,
    so extra memory stays the output plus a few chunks."""
    if bits == layout.width or x.numel() == 0:
        return x.clone()
    x = x.contiguous()
    if bits > layout.exp_bits:
        return truncate_fast(x, bits, rounding, layout, generator)
    out = torch.empty_like(x)
    for op, xp in zip(_chunks(out), _chunks(x), strict=True):
        random = random_bits(xp, layout, generator) if rounding == "stochastic" else None
        op.copy_(truncate_exact(xp, bits, rounding, random))
    return out



def truncate_values(x: Tensor, bits: int, rounding: str,
                    generator: torch.Generator | None = None) -> Tensor:
    """The eager numerics without any checks or autograd (``bits`` already validated)."""
    return truncate_eager(x, bits, rounding, layout_of(x.dtype), generator)


# -- the registered op ------------------------------------------------------------------------

_SCHEMA: Final = (
    "(Tensor x, int bits, str rounding='toward_zero', str grad='ste', "
    "Generator? generator=None, Tensor? override_rows=None, int override_bits=32, "
    "int grad_bits=0, str name='', str numerics='') -> Tensor"
)


def _truncate_impl(
    x: Tensor,
    bits: int,
    rounding: str = "toward_zero",
    grad: str = "ste",
    generator: torch.Generator | None = None,
    override_rows: Tensor | None = None,
    override_bits: int = 32,
    grad_bits: int = 0,
    name: str = "",
    numerics: str = "",
) -> Tensor:
    layout = _check_args(x, bits, rounding, grad, name,
                         override_bits if override_rows is not None else None, grad_bits)
    y = truncate_eager(x, bits, rounding, layout, generator)
    if override_rows is not None:
        mask = row_mask(override_rows, x, _where(name))
        y = torch.where(mask, truncate_eager(x, override_bits, rounding, layout, generator), y)
    return y


_truncate_op = torch.library.custom_op("fxquant::truncate", mutates_args=(), schema=_SCHEMA)(
    _truncate_impl)
#: The Python signature of the op (names and defaults are the schema's; tested).
SIGNATURE: Final = inspect.signature(_truncate_impl)


@_truncate_op.register_fake
def _(
    x: Tensor,
    bits: int,
    rounding: str = "toward_zero",
    grad: str = "ste",
    generator: torch.Generator | None = None,
    override_rows: Tensor | None = None,
    override_bits: int = 32,
    grad_bits: int = 0,
    name: str = "",
    numerics: str = "",
) -> Tensor:
    _check_args(x, bits, rounding, grad, name,
                override_bits if override_rows is not None else None, grad_bits)
    if override_rows is not None:
        row_mask(override_rows, x, _where(name))
    return torch.empty_like(x)


#: The op's argument names, in schema order (the one place that knows its layout).
ARGS: Final = tuple(a.name for a in torch.ops.fxquant.truncate.default._schema.arguments)


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: Tensor) -> None:
    bound = dict(zip(ARGS, inputs, strict=True))
    ctx.rule = (bound["rounding"], bound["grad"], bound["grad_bits"])  # type: ignore[attr-defined]


def _backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple:
    # Straight-through: truncation is treated as the identity. "zero" is the true
    # derivative of a step function, kept for comparison. grad_bits also truncates the
    # gradient on its way back, with the forward's rounding.
    rounding, rule, grad_bits = ctx.rule  # type: ignore[attr-defined]
    grad_x = grad if rule == Grad.STE else torch.zeros_like(grad)
    if grad_bits:
        grad_x = truncate_eager(grad_x, grad_bits, rounding, layout_of(grad_x.dtype), None)
    return (grad_x,) + (None,) * (len(ARGS) - 1)


_truncate_op.register_autograd(_backward, setup_context=_setup_context)


def _decomposed(
    x: Tensor,
    bits: int,
    rounding: str = "toward_zero",
    grad: str = "ste",
    generator: torch.Generator | None = None,
    override_rows: Tensor | None = None,
    override_bits: int = 32,
    grad_bits: int = 0,
    name: str = "",
    numerics: str = "",
) -> Tensor:
    """What inductor compiles instead of the opaque op: elementwise, so it fuses.

    Stochastic rounding stays one opaque call (``fxquant::_stochastic_truncate``):
    inductor's CPU random numbers cost several times the eager kernel's single ``random_``
    draw, and the eager kernel keeps following ``torch.manual_seed`` exactly.
    """
    if rounding == Rounding.STOCHASTIC:
        return torch.ops.fxquant._stochastic_truncate(x, bits, override_rows, override_bits, name)
    y = truncate_fused(x, bits, rounding, None)
    if override_rows is not None:
        mask = row_mask(override_rows, x, _where(name))
        y = torch.where(mask, truncate_fused(x, override_bits, rounding, None), y)
    return y


@torch.library.custom_op(
    "fxquant::_stochastic_truncate", mutates_args=(),
    schema="(Tensor x, int bits, Tensor? override_rows, int override_bits, str name) -> Tensor",
)
def _stochastic_truncate(x: Tensor, bits: int, override_rows: Tensor | None,
                         override_bits: int, name: str) -> Tensor:
    """The eager stochastic kernel as an op without a decomposition, for compiled graphs."""
    return _truncate_op(x, bits, "stochastic", "ste", None, override_rows, override_bits, 0, name)


@_stochastic_truncate.register_fake
def _(x: Tensor, bits: int, override_rows: Tensor | None, override_bits: int,
      name: str) -> Tensor:
    return torch.empty_like(x)


def _register_inductor_decomposition() -> None:
    # The ecosystem's way (torchao's quant primitives do the same): the op stays one opaque
    # node for FX, export and pickling, while inductor sees elementwise code it can fuse
    # with the neighbouring layers.
    from torch._inductor.decomposition import register_decomposition

    register_decomposition([torch.ops.fxquant.truncate.default])(_decomposed)


_register_inductor_decomposition()
