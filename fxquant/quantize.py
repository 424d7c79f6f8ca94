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
A running per-tensor amax for eval lives in a :class:`RunningAmax` module the graph pass
inserts (``transform(..., momentum=0.9)``).

The rounding works on the value grid of the format: with ``q`` the spacing of the format's
values around ``|x|``, ``|x| / q`` is rounded to an integer (``torch.round``: half to even;
``trunc``; or ``floor(. + U[0, 1))``) in float64, where all these steps are exact. Ties go
to the even code (for formats without mantissa bits: the even exponent field).
"""

from __future__ import annotations

from typing import Final

import torch
from torch import Tensor, nn

from fxquant.formats import Format, TopN, parse
from fxquant.numerics import GRADS, ROUNDINGS, _layout, _row_mask, _truncate_eager

__all__ = ["SCALES", "RunningAmax", "quantize"]

#: Scaling modes of :func:`quantize` (None means "none").
SCALES: Final = ("none", "tensor", "row", "tensor-pow2", "row-pow2")


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


def _amax(x: Tensor, scale: str) -> Tensor:
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
        return _truncate_eager(x, fmt.bits, rounding, _layout(x.dtype), generator)
    if x.numel() == 0:
        return x.clone()
    xd = x.double()
    if scale == "none":
        return _cast(xd, fmt, rounding, generator).to(x.dtype)
    m = (amax if amax is not None else _amax(x, scale)).double()
    usable = (m > 0) & torch.isfinite(m)
    factor = torch.where(usable, fmt.max_finite / torch.where(usable, m, 1.0), 1.0)
    if scale.endswith("pow2"):
        factor = torch.exp2(torch.floor(torch.log2(factor)))
    return (_cast(xd * factor, fmt, rounding, generator) / factor).to(x.dtype)


def _check(x: Tensor, format: str, rounding: str, scale: str, grad: str, rows_format: str,
           grad_format: str, name: str) -> tuple[Format | TopN, Format | TopN | None]:
    where = f" (node {name!r})" if name else ""
    layout = _layout(x.dtype, name)
    if rounding not in ROUNDINGS:
        raise ValueError(f"fxquant.quantize{where}: rounding={rounding!r} is not one of "
                         f"{list(ROUNDINGS)}")
    if grad not in GRADS:
        raise ValueError(f"fxquant.quantize{where}: grad={grad!r} is not one of {list(GRADS)}")
    if scale not in SCALES:
        raise ValueError(f"fxquant.quantize{where}: scale={scale!r} is not one of "
                         f"{[None, *SCALES[1:]]}")
    if scale.startswith("row") and x.dim() == 0:
        raise ValueError(f"fxquant.quantize{where}: scale='row' needs a tensor with rows")
    fmts = [parse(f) for f in (format, rows_format, grad_format) if f]
    for f in fmts:
        if isinstance(f, TopN) and f.bits > layout.width:
            raise ValueError(f"fxquant.quantize{where}: {f.spec()} keeps more bits than the "
                             f"{layout.width}-bit pattern of {x.dtype}")
    main = fmts[0]
    if isinstance(main, TopN) and scale != "none":
        raise ValueError(f"fxquant.quantize{where}: scale={scale!r} applies to formats, not to "
                         f"top-N truncation ({main.spec()})")
    return main, parse(rows_format) if rows_format else None


# -- the registered op ------------------------------------------------------------------------

_SCHEMA: Final = (
    "(Tensor x, str format, str rounding='nearest', str scale='none', str grad='ste', "
    "Generator? generator=None, Tensor? amax=None, Tensor? rows=None, str rows_format='', "
    "str grad_format='', str name='') -> Tensor"
)


@torch.library.custom_op("fxquant::quantize", mutates_args=(), schema=_SCHEMA)
def _quantize_op(
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
) -> Tensor:
    fmt, rows_fmt = _check(x, format, rounding, scale, grad, rows_format, grad_format, name)
    y = _apply(x, fmt, rounding, scale, amax, generator)
    if rows is not None and rows_fmt is not None:
        mask = _row_mask(rows, x, name)
        y = torch.where(mask, _apply(x, rows_fmt, rounding, scale, amax, generator), y)
    return y


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
) -> Tensor:
    _check(x, format, rounding, scale, grad, rows_format, grad_format, name)
    return torch.empty_like(x)


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: Tensor) -> None:
    ctx.rule = (inputs[2], inputs[3], inputs[4], inputs[9])  # type: ignore[attr-defined]


def _backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple:
    rounding, scale, rule, grad_format = ctx.rule  # type: ignore[attr-defined]
    grad_x = grad if rule == "ste" else torch.zeros_like(grad)
    if grad_format:
        # The gradient is quantized like the forward value: same rounding and scaling mode,
        # with the scale taken from the gradient itself.
        fmt = parse(grad_format)
        grad_x = _apply(grad_x, fmt, rounding, "none" if isinstance(fmt, TopN) else scale,
                        None, None)
    return (grad_x, *([None] * 10))


_quantize_op.register_autograd(_backward, setup_context=_setup_context)


def _format_spec(value: object, arg: str = "format") -> str:
    try:
        return parse(value).spec()
    except TypeError as e:
        raise TypeError(f"fxquant.quantize: {arg} must be a preset name, 'eXmY', "
                        f"(exp_bits, man_bits) or a Format, got {value!r}") from e


def _scale_arg(scale: str | None) -> str:
    return "none" if scale is None else scale


def quantize(
    x: Tensor,
    format: str | Format | tuple[int, int],
    rounding: str = "nearest",
    scale: str | None = None,
    grad: str = "ste",
    generator: torch.Generator | None = None,
) -> Tensor:
    """Round ``x`` to the values of a number format; returns a new tensor of ``x``'s dtype.

    Args:
        x (Tensor): a floating-point tensor on any device; never written to.
        format (str, Format or tuple): a preset (``"e4m3"``, ``"e5m2"``, ``"fp16"``,
            ``"bf16"``, ``"e3m2"``, ``"e2m3"``, ``"e2m1"``), ``"eXmY"`` / ``(X, Y)`` for a
            custom format (no inf/NaN codes, subnormals, saturating), or a :class:`Format`.
        rounding (str, optional): ``"nearest"`` (half to even, default), ``"toward_zero"``
            or ``"stochastic"``.
        scale (str, optional): :obj:`None` (a plain cast, default), ``"tensor"``, ``"row"``,
            ``"tensor-pow2"`` or ``"row-pow2"``.
        grad (str, optional): ``"ste"`` (straight-through, default) or ``"zero"``.
        generator (torch.Generator, optional): for ``"stochastic"``.

    Example:
        >>> x = torch.tensor([0.3, 300.0, 1000.0, -float("inf"), float("nan")])
        >>> quantize(x, "e4m3").tolist()  # saturates at 448, like torch.float8_e4m3fn
        [0.3125, 288.0, 448.0, -448.0, nan]
        >>> quantize(x, "e5m2").tolist()  # overflows to inf, like torch.float8_e5m2
        [0.3125, 320.0, 1024.0, -inf, nan]
        >>> quantize(torch.tensor([0.01, 0.2, 3.0]), "e2m1", scale="tensor").tolist()  # FP4
        [0.0, 0.25, 3.0]
    """
    scale_arg = _scale_arg(scale)
    if torch.compiler.is_compiling() and isinstance(format, str):
        # The op's fake kernel validates; keep Python-side parsing out of the traced code.
        return torch.ops.fxquant.quantize(x, format, rounding, scale_arg, grad, generator)
    if not isinstance(x, Tensor):
        raise TypeError(f"fxquant.quantize: x must be a torch.Tensor, got {type(x).__name__}")
    spec = _format_spec(format)
    _check(x, spec, rounding, scale_arg, grad, "", "", "")
    return torch.ops.fxquant.quantize(x, spec, rounding, scale_arg, grad, generator)


class RunningAmax(nn.Module):
    """Tracks the per-tensor amax of what flows through it, for eval-time scaling.

    In training mode it returns the current amax and updates
    ``running_amax = momentum * running_amax + (1 - momentum) * amax`` (the first batch sets
    it); in eval mode it returns ``running_amax``. The buffer is saved in ``state_dict``.

    Args:
        momentum (float): weight of the history, in ``[0, 1)``.
    """

    running_amax: Tensor

    def __init__(self, momentum: float = 0.9) -> None:
        super().__init__()
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
            raise ValueError(f"momentum must be a number in [0, 1), got {momentum!r}")
        self.momentum = float(momentum)
        self.register_buffer("running_amax", torch.zeros(()))

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            return self.running_amax
        amax = _amax(x.detach(), "tensor").to(self.running_amax.dtype)
        with torch.no_grad():
            fresh = self.running_amax == 0
            blended = self.momentum * self.running_amax + (1 - self.momentum) * amax
            self.running_amax.copy_(torch.where(fresh, amax, blended))
        return amax

    def extra_repr(self) -> str:
        return f"momentum={self.momentum}"
