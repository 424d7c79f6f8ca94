"""Round to a number format, with optional scaling: :func:`quantize` and its registered op.

``quantize(x, "e4m3")`` with ``scale=None`` is a plain cast: for ``"e4m3"``, ``"e5m2"``,
``"fp16"`` and ``"bf16"`` it is bit-identical to ``x.to(torch.float8_e4m3fn).float()`` and
friends (ties to even, subnormals, saturation or inf on overflow), NaN stays NaN and the
sign never flips. Formats torch lacks (``"e3m2"``, ``"e2m3"``, ``"e2m1"``, any ``(e, m)``)
follow the same rules.

Scaling lets small formats cover the data: ``scale="tensor"`` multiplies by
``max_finite / amax`` (amax over the finite values of the whole tensor), casts, and
divides back; ``scale="row"`` does the same per row (dim 0: nodes of a GNN activation).
The ``"-pow2"`` variants round each scale down to a power of two, so scaling is exact.
A running per-tensor amax for eval comes from an observer module
(:class:`fxquant.quant.RunningAmax`), handed to the op as ``amax``.

The rounding works on the value grid of the format: with ``q`` the spacing of the format's
values around ``|x|``, ``|x| / q`` is rounded to an integer (``torch.round``: half to even;
``trunc``; or ``floor(. + U[0, 1))``) in float64, where all these steps are exact. Ties go
to the even code (for formats without mantissa bits: the even exponent field).
"""

from __future__ import annotations

import inspect
from typing import Final

import torch
from torch import Tensor

from fxquant._ops.layouts import layout_of
from fxquant._ops.rows import row_mask
from fxquant._ops.truncate import check_bits, truncate_values
from fxquant.formats import Format, TopN, parse
from fxquant.modes import Grad, Rounding, Scale

__all__ = ["ARGS", "SIGNATURE", "amax_of", "quantize_values"]


def _cast(x: Tensor, fmt: Format, rounding: str, generator: torch.Generator | None) -> Tensor:
    """Round every element of ``x`` to a value of ``fmt``; float64 in, float64 out."""
    a = x.abs()
    finite = torch.isfinite(x)
    if fmt.exp_bits == 0:
        exponent = torch.full_like(a, fmt.emin)
    else:
        _, e = torch.frexp(torch.where(finite, a, 0.0))
        exponent = torch.clamp(e.to(a.dtype) - 1, min=fmt.emin)
    step = torch.exp2(exponent - fmt.man_bits)  # spacing of the format's values around |x|
    scaled = a / step  # exact: a power-of-two division
    if rounding == "nearest":
        units = torch.round(scaled)  # half to even
        if fmt.man_bits == 0 and fmt.exp_bits > 0:
            # Without mantissa bits every normal significand is 1: "even" is the code's last
            # bit, the exponent field's parity, as in a bit-pattern implementation.
            tie = (scaled - torch.floor(scaled) == 0.5) & (scaled >= 1)
            down = ((exponent + int(fmt.bias)) % 2) == 0  # type: ignore[arg-type]
            units = torch.where(tie, torch.floor(scaled) + (~down).to(scaled.dtype), units)
    elif rounding == "toward_zero":
        units = torch.trunc(scaled)
    else:
        noise = torch.rand(x.shape, dtype=a.dtype, device=x.device, generator=generator)
        units = torch.floor(scaled + noise)
    y = units * step
    if not fmt.subnormals:
        y = torch.where(y < fmt.min_normal, 0.0, y)
    big = fmt.max_finite
    if fmt.overflow == "inf" and rounding != "toward_zero":  # IEEE: toward zero saturates
        y = torch.where(y > big, torch.inf, y)
    else:
        y = torch.clamp(y, max=big)
    y = torch.where(torch.isinf(x), torch.inf if fmt.special == "ieee" else big, y)
    y = torch.copysign(y, x)
    return torch.where(torch.isnan(x), x, y)


def amax_of(x: Tensor, scale: str) -> Tensor:
    """Largest finite magnitude: one value, or one per row shaped to broadcast."""
    magnitude = torch.where(torch.isfinite(x), x.abs(), 0.0)
    if scale.startswith("tensor"):
        return magnitude.amax() if x.numel() else magnitude.new_zeros(())
    rows = magnitude.reshape(x.shape[0], -1)
    per_row = rows.amax(dim=1) if rows.shape[1] else rows.new_zeros(x.shape[0])
    return per_row.view((x.shape[0],) + (1,) * (x.dim() - 1))


def _apply(x: Tensor, fmt: Format | TopN, rounding: str, scale: str, amax: Tensor | None,
           generator: torch.Generator | None) -> Tensor:
    if isinstance(fmt, TopN):
        return truncate_values(x, fmt.bits, rounding, generator)
    if x.numel() == 0:
        return x.clone()
    xd = x.double()
    if scale == "none":
        return _cast(xd, fmt, rounding, generator).to(x.dtype)
    m = (amax if amax is not None else amax_of(x, scale)).double()
    usable = (m > 0) & torch.isfinite(m)
    factor = torch.where(usable, fmt.max_finite / torch.where(usable, m, 1.0), 1.0)
    if scale.endswith("pow2"):
        factor = torch.exp2(torch.floor(torch.log2(factor)))
    return (_cast(xd * factor, fmt, rounding, generator) / factor).to(x.dtype)


def _where(name: str) -> str:
    return f"fxquant.quantize (quantization point {name!r})" if name else "fxquant.quantize"


def _check(x: Tensor, format: str, rounding: str, scale: str, grad: str, rows_format: str,
           grad_format: str, name: str) -> tuple[Format | TopN, Format | TopN | None]:
    where = _where(name)
    what = f"the input of quantization point {name!r}" if name else "x"
    layout = layout_of(x.dtype, what)
    Rounding.parse(rounding)
    Grad.parse(grad)
    mode = Scale.parse(scale)
    if mode.per_row and x.dim() < 2:
        raise ValueError(
            f"{where}: scale={scale!r} gives each row (dim 0) its own scale, so it needs a "
            f"tensor with rows and columns; got shape {tuple(x.shape)}. Please use "
            "scale='tensor' for a 1-D tensor."
        )
    fmts = []
    for arg, spec in (("format", format), ("rows_format", rows_format),
                      ("grad_format", grad_format)):
        if not spec:
            continue
        try:
            fmt = parse(spec)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{where}: {arg}: {e}") from e
        if isinstance(fmt, TopN):
            check_bits(fmt.bits, layout.width, arg, where)
        fmts.append(fmt)
    main = fmts[0]
    if isinstance(main, TopN) and mode is not Scale.NONE:
        raise ValueError(f"{where}: scale={scale!r} applies to formats, not to top-N "
                         f"truncation ({main.spec()})")
    return main, parse(rows_format) if rows_format else None


# -- the registered op ------------------------------------------------------------------------

_SCHEMA: Final = (
    "(Tensor x, str format, str rounding='nearest', str scale='none', str grad='ste', "
    "Generator? generator=None, Tensor? amax=None, Tensor? rows=None, str rows_format='', "
    "str grad_format='', str name='', str numerics='') -> Tensor"
)


def _quantize_impl(
    x: Tensor,
    format: str,
    rounding: str = "nearest",
    scale: str = "none",
    grad: str = "ste",
    generator: torch.Generator | None = None,
    amax: Tensor | None = None,
    rows: Tensor | None = None,
    rows_format: str = "",
    grad_format: str = "",
    name: str = "",
    numerics: str = "",
) -> Tensor:
    fmt, rows_fmt = _check(x, format, rounding, scale, grad, rows_format, grad_format, name)
    y = _apply(x, fmt, rounding, scale, amax, generator)
    if rows is not None and rows_fmt is not None:
        mask = row_mask(rows, x, _where(name))
        y = torch.where(mask, _apply(x, rows_fmt, rounding, scale, amax, generator), y)
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
    amax: Tensor | None = None,
    rows: Tensor | None = None,
    rows_format: str = "",
    grad_format: str = "",
    name: str = "",
    numerics: str = "",
) -> Tensor:
    _check(x, format, rounding, scale, grad, rows_format, grad_format, name)
    if rows is not None:
        row_mask(rows, x, _where(name))
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
        fmt = parse(grad_format)
        grad_x = _apply(grad_x, fmt, rounding, "none" if isinstance(fmt, TopN) else scale,
                        None, None)
    return (grad_x,) + (None,) * (len(ARGS) - 1)


_quantize_op.register_autograd(_backward, setup_context=_setup_context)


def quantize_values(x: Tensor, fmt: Format | TopN, rounding: str, scale: str = "none",
                    amax: Tensor | None = None,
                    generator: torch.Generator | None = None) -> Tensor:
    """The eager numerics without checks or autograd (arguments already validated)."""
    return _apply(x, fmt, rounding, scale, amax, generator)
