"""Keep the top ``bits`` of a float's bit pattern: the numerics behind every truncation node.

A float is read as its IEEE-754 pattern through an integer view of the same width
(``x.view(torch.int32)`` for float32); nothing is ever expanded into bit-planes. Rounding
acts on the magnitude (the pattern without its sign bit), so the sign is never changed.

Rules, in order (every dtype, bit width and rounding):

1. NaN stays NaN (with its payload) and +-inf stays +-inf.
2. The magnitude is rounded to a multiple of ``2 ** (width - bits)``:
   ``"toward_zero"`` drops the low bits, ``"nearest"`` rounds half to even,
   ``"stochastic"`` rounds up with probability equal to the dropped fraction.
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

The registered op ``torch.ops.fxquant.truncate`` carries the node name, the gradient
rule and an optional per-row override, so a graph that calls it needs nothing else to run,
compile or reload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

import torch
from torch import Tensor

__all__ = ["GRADS", "ROUNDINGS", "bit_width", "truncate"]

Rounding = Literal["toward_zero", "nearest", "stochastic"]
Grad = Literal["ste", "zero"]

#: Rounding modes accepted by :func:`truncate`.
ROUNDINGS: Final = ("toward_zero", "nearest", "stochastic")
#: Gradient rules accepted by :func:`truncate`.
GRADS: Final = ("ste", "zero")


@dataclass(frozen=True)
class _Layout:
    """Bit layout of a floating dtype and the integer dtype that views it."""

    int_dtype: torch.dtype
    width: int
    exp_bits: int

    @property
    def man_bits(self) -> int:
        return self.width - 1 - self.exp_bits

    @property
    def inf(self) -> int:
        """Pattern of +inf, which is also the smallest pattern that is not finite."""
        return ((1 << self.exp_bits) - 1) << self.man_bits

    @property
    def magnitude(self) -> int:
        return (1 << (self.width - 1)) - 1

    @property
    def sign(self) -> int:
        # The sign bit as a value of the signed integer dtype.
        return -(1 << (self.width - 1))


_LAYOUTS: Final = {
    torch.float32: _Layout(torch.int32, 32, 8),
    torch.float64: _Layout(torch.int64, 64, 11),
    torch.float16: _Layout(torch.int16, 16, 5),
    torch.bfloat16: _Layout(torch.int16, 16, 8),
}


def bit_width(dtype: torch.dtype) -> int:
    """Number of bits in the pattern of a floating ``dtype`` (the largest valid ``bits``).

    Example:
        >>> bit_width(torch.float32), bit_width(torch.float64), bit_width(torch.bfloat16)
        (32, 64, 16)
    """
    return _layout(dtype).width


def _layout(dtype: torch.dtype, name: str = "") -> _Layout:
    layout = _LAYOUTS.get(dtype)
    if layout is None:
        where = f"the output of node {name!r}" if name else "x"
        supported = ", ".join(str(d) for d in _LAYOUTS)
        raise TypeError(
            f"fxquant.truncate: {where} has dtype {dtype}, but truncation reads a floating "
            f"point bit pattern; supported dtypes: {supported}. "
            + (
                f"Please make sure {name!r} produces a float tensor, or leave it out of "
                "`layers=`/`bits=`."
                if name
                else "Please convert x with `x.float()` first."
            )
        )
    return layout


def _check_args(
    x: Tensor, bits: int, rounding: str, grad: str, name: str, rows_bits: int | None = None
) -> _Layout:
    """Validate everything but the tensor values; shared by the kernels and the fake kernel."""
    layout = _layout(x.dtype, name)
    where = f" (node {name!r})" if name else ""
    for arg, value in (("bits", bits), ("rows_bits", rows_bits)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"fxquant.truncate{where}: {arg} must be an int, got {value!r}")
        if not 1 <= value <= layout.width:
            raise ValueError(
                f"fxquant.truncate{where}: {arg}={value} is out of range for {x.dtype}; "
                f"it counts the kept bits of the {layout.width}-bit pattern, so "
                f"1 <= {arg} <= {layout.width}."
            )
    if rounding not in ROUNDINGS:
        raise ValueError(
            f"fxquant.truncate{where}: rounding={rounding!r} is not one of {list(ROUNDINGS)}"
        )
    if grad not in GRADS:
        raise ValueError(f"fxquant.truncate{where}: grad={grad!r} is not one of {list(GRADS)}")
    return layout


def _random_bits(x: Tensor, layout: _Layout, generator: torch.Generator | None) -> Tensor:
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


def _truncate_fast(
    x: Tensor, bits: int, rounding: str, layout: _Layout, generator: torch.Generator | None
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
        y = _random_bits(x, layout, generator)
        y &= (1 << d) - 1
        y += i
        y &= mask
    if _needs_nan_fix(x):
        y = torch.where(torch.isnan(x), i, y)
    return y.view(x.dtype)


def _truncate_exact(x: Tensor, bits: int, rounding: str, random: Tensor | None) -> Tensor:
    """Branch-free reference kernel valid for every ``bits``; also what torch.compile fuses.

    Works on the magnitude's kept part ``q`` and dropped part ``rem`` separately, so no
    intermediate ever needs more bits than the pattern. ``random`` (stochastic only) holds
    uniform integers whose low ``width - bits`` bits are used; with the same random
    integers it rounds exactly like :func:`_truncate_fast`.
    """
    layout = _LAYOUTS[x.dtype]
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


def _truncate_fused(x: Tensor, bits: int, rounding: str, random: Tensor | None) -> Tensor:
    """What torch.compile fuses: the fast kernel's arithmetic, NaN patched without a branch.

    Every step is an integer op on the pattern (the NaN test too), which inductor turns into
    one vectorized loop; measured at about clone speed (benchmarks/RESULTS.md). Bit widths
    that cut the exponent use :func:`_truncate_exact`. Rounds exactly like both.
    """
    layout = _LAYOUTS[x.dtype]
    d = layout.width - bits
    if d == 0 or bits <= layout.exp_bits:
        return _truncate_exact(x, bits, rounding, random)
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


def _truncate_eager(
    x: Tensor, bits: int, rounding: str, layout: _Layout, generator: torch.Generator | None
) -> Tensor:
    if bits == layout.width or x.numel() == 0:
        return x.clone()
    if bits > layout.exp_bits:
        return _truncate_fast(x, bits, rounding, layout, generator)
    random = _random_bits(x, layout, generator) if rounding == "stochastic" else None
    return _truncate_exact(x, bits, rounding, random)


def _row_mask(rows: Tensor, x: Tensor, name: str) -> Tensor:
    """A bool mask over dim 0 of ``x`` from an index tensor or a bool mask, shaped to broadcast."""
    where = f"node {name!r}" if name else "x"
    if x.dim() == 0:
        raise ValueError(f"fxquant.truncate: a row override needs {where} to have rows (dim >= 1)")
    n = x.shape[0]
    if rows.dtype == torch.bool:
        if rows.dim() != 1 or rows.shape[0] != n:
            raise ValueError(
                f"fxquant.truncate: the row mask for {where} has shape {tuple(rows.shape)}, "
                f"but the output has {n} rows; please pass a bool mask of shape ({n},) "
                "or an index tensor."
            )
        mask = rows
    else:
        if rows.dim() != 1:
            raise ValueError(
                f"fxquant.truncate: row indices for {where} must be 1-D, got shape "
                f"{tuple(rows.shape)}"
            )
        if rows.device.type != "meta" and rows.numel() and int(rows.max()) >= n:
            raise IndexError(
                f"fxquant.truncate: row index {int(rows.max())} is out of range for {where}, "
                f"whose output has {n} rows; please pass indices in [0, {n})."
            )
        mask = torch.zeros(n, dtype=torch.bool, device=x.device).index_fill(0, rows, True)
    return mask.view((n,) + (1,) * (x.dim() - 1))


# -- the registered op ------------------------------------------------------------------------

_SCHEMA: Final = (
    "(Tensor x, int bits, str rounding='toward_zero', str grad='ste', "
    "Generator? generator=None, Tensor? rows=None, int rows_bits=32, int grad_bits=0, "
    "str name='') -> Tensor"
)


@torch.library.custom_op("fxquant::truncate", mutates_args=(), schema=_SCHEMA)
def _truncate_op(
    x: Tensor,
    bits: int,
    rounding: str = "toward_zero",
    grad: str = "ste",
    generator: torch.Generator | None = None,
    rows: Tensor | None = None,
    rows_bits: int = 32,
    grad_bits: int = 0,
    name: str = "",
) -> Tensor:
    layout = _check_args(x, bits, rounding, grad, name, rows_bits if rows is not None else None)
    if grad_bits:
        _check_args(x, grad_bits, rounding, grad, name)
    y = _truncate_eager(x, bits, rounding, layout, generator)
    if rows is not None:
        mask = _row_mask(rows, x, name)
        y = torch.where(mask, _truncate_eager(x, rows_bits, rounding, layout, generator), y)
    return y


@_truncate_op.register_fake
def _(
    x: Tensor,
    bits: int,
    rounding: str = "toward_zero",
    grad: str = "ste",
    generator: torch.Generator | None = None,
    rows: Tensor | None = None,
    rows_bits: int = 32,
    grad_bits: int = 0,
    name: str = "",
) -> Tensor:
    _check_args(x, bits, rounding, grad, name, rows_bits if rows is not None else None)
    return torch.empty_like(x)


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: Tensor) -> None:
    ctx.rule = (inputs[2], inputs[3], inputs[7])  # type: ignore[attr-defined]


def _backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple:
    # Straight-through: truncation is treated as the identity. "zero" is the true
    # derivative of a step function, kept for comparison. grad_bits also truncates the
    # gradient on its way back, with the forward's rounding.
    rounding, rule, grad_bits = ctx.rule  # type: ignore[attr-defined]
    grad_x = grad if rule == "ste" else torch.zeros_like(grad)
    if grad_bits:
        grad_x = _truncate_eager(grad_x, grad_bits, rounding, _layout(grad_x.dtype), None)
    return grad_x, None, None, None, None, None, None, None, None


_truncate_op.register_autograd(_backward, setup_context=_setup_context)


def _decomposed(
    x: Tensor,
    bits: int,
    rounding: str = "toward_zero",
    grad: str = "ste",
    generator: torch.Generator | None = None,
    rows: Tensor | None = None,
    rows_bits: int = 32,
    grad_bits: int = 0,
    name: str = "",
) -> Tensor:
    """What inductor compiles instead of the opaque op: elementwise, so it fuses.

    Stochastic rounding stays one opaque call (:func:`_stochastic_kernel`): inductor's CPU
    random numbers cost several times the eager kernel's single ``random_`` draw, and the
    eager kernel keeps following ``torch.manual_seed`` exactly.
    """
    if rounding == "stochastic":
        return torch.ops.fxquant._stochastic_kernel(x, bits, rows, rows_bits, name)
    y = _truncate_fused(x, bits, rounding, None)
    if rows is not None:
        y = torch.where(_row_mask(rows, x, name), _truncate_fused(x, rows_bits, rounding, None), y)
    return y


@torch.library.custom_op(
    "fxquant::_stochastic_kernel", mutates_args=(),
    schema="(Tensor x, int bits, Tensor? rows, int rows_bits, str name) -> Tensor",
)
def _stochastic_kernel(x: Tensor, bits: int, rows: Tensor | None, rows_bits: int,
                       name: str) -> Tensor:
    """The eager stochastic kernel as an op without a decomposition, for compiled graphs."""
    return _truncate_op(x, bits, "stochastic", "ste", None, rows, rows_bits, 0, name)


@_stochastic_kernel.register_fake
def _(x: Tensor, bits: int, rows: Tensor | None, rows_bits: int, name: str) -> Tensor:
    return torch.empty_like(x)


def _register_inductor_decomposition() -> None:
    # The ecosystem's way (torchao's quant primitives do the same): the op stays one opaque
    # node for FX, export and pickling, while inductor sees elementwise code it can fuse
    # with the neighbouring layers.
    from torch._inductor.decomposition import register_decomposition

    register_decomposition([torch.ops.fxquant.truncate.default])(_decomposed)


_register_inductor_decomposition()


# -- public function --------------------------------------------------------------------------


def truncate(
    x: Tensor,
    bits: int,
    rounding: Rounding = "toward_zero",
    grad: Grad = "ste",
    generator: torch.Generator | None = None,
) -> Tensor:
    """Keep the top ``bits`` of each element's IEEE-754 pattern; returns a new tensor.

    Args:
        x (Tensor): a float32, float64, float16 or bfloat16 tensor on any device. Never
            written to.
        bits (int): how many bits to keep, counted from the top (sign first) of ``x``'s own
            pattern: ``1 <= bits <= 32`` for float32, 64 for float64, 16 for half types.
        rounding (str, optional): ``"toward_zero"`` drops the low bits (default),
            ``"nearest"`` rounds half to even, ``"stochastic"`` rounds up with probability
            equal to the dropped fraction (unbiased; reproducible under
            ``torch.manual_seed`` or ``generator``).
        grad (str, optional): ``"ste"`` passes the gradient through unchanged
            (straight-through estimator, default); ``"zero"`` is the true derivative of the
            truncation, zero.
        generator (torch.Generator, optional): source of randomness for ``"stochastic"``,
            on ``x``'s device. (default: :obj:`None`, the global generator)

    NaN stays NaN and +-inf stays +-inf; the sign bit is never changed; a magnitude rounded
    past the largest finite value becomes inf. See the module docs for ``bits`` below the
    exponent width.

    Example:
        >>> x = torch.tensor([1.0 + 2**-8 + 2**-9, -3.14159, float("nan")])
        >>> truncate(x, 16)
        tensor([ 1.0000, -3.1406,     nan])
        >>> truncate(x, 16, "nearest")  # bit-identical to x.to(torch.bfloat16).float()
        tensor([ 1.0078, -3.1406,     nan])
        >>> truncate(x, 9)  # sign and exponent: signed powers of two
        tensor([ 1., -2., nan])
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"fxquant.truncate: x must be a torch.Tensor, got {type(x).__name__}")
    _check_args(x, bits, rounding, grad, "")
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(
                f"fxquant.truncate: generator must be a torch.Generator or None, "
                f"got {type(generator).__name__}"
            )
        if x.device.type != "meta" and generator.device.type != x.device.type:
            raise ValueError(
                f"fxquant.truncate: generator is on {generator.device} but x is on {x.device}; "
                "please create it with torch.Generator(device=x.device)."
            )
    return torch.ops.fxquant.truncate(x, bits, rounding, grad, generator)
