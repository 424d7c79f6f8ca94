"""The rounding functions on tensors: :func:`truncate` and :func:`quantize`.

Both read alike: ``f(x, number, rounding, *, grad=..., generator=...)``, return a new
tensor of ``x``'s dtype, never write into ``x``, and call one registered op
(``torch.ops.fxquant.truncate`` / ``quantize``) with a straight-through gradient by default.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from fxquant._ops.version import NUMERICS
from fxquant.errors import FxquantTypeError, FxquantValueError, same_kind, user_stacklevel
from fxquant.formats import Format, IntFormat, TopN, parse_scaled, split_scale
from fxquant.modes import Rounding, Scale, op_grad
from fxquant.quant.config import merge_scale

__all__ = ["quantize", "truncate"]


def _check_tensor(x: object, fn: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise FxquantTypeError(f"fxquant.{fn}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided or x.is_nested:
        raise FxquantTypeError(f"fxquant.{fn}: x must be a dense (strided) tensor, got "
                        f"{'a nested tensor' if x.is_nested else f'layout {x.layout}'}; please "
                        "pass x.to_dense() (or the sparse tensor's .values())")
    return x


def _check_generator(generator: object, x: Tensor, fn: str) -> None:
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise FxquantTypeError(f"fxquant.{fn}: generator must be a torch.Generator or None, got "
                        f"{type(generator).__name__}")
    if x.device.type != "meta" and generator.device.type != x.device.type:
        raise FxquantValueError(
            f"fxquant.{fn}: generator is on {generator.device} but x is on {x.device}; "
            "please create it with torch.Generator(device=x.device)."
        )


def truncate(
    x: Tensor,
    bits: int,
    rounding: str = "toward_zero",
    *,
    grad: str = "ste",
    generator: torch.Generator | None = None,
) -> Tensor:
    """Keep the top ``bits`` of each element's IEEE-754 pattern; returns a new tensor.

    Args:
        x (Tensor): a float32, float64, float16 or bfloat16 tensor on any device. Never
            written to.
        bits (int): how many bits to keep, counted from the top (sign first) of ``x``'s own
            pattern: ``1 <= bits <= 32`` for float32, 64 for float64, 16 for half types.
        rounding (str, optional): ``"toward_zero"`` drops the low bits (default),
            ``"nearest"`` rounds half to even, ``"stochastic"`` rounds the magnitude up
            with probability equal to the dropped fraction (unbiased on the pattern;
            reproducible under ``torch.manual_seed`` or ``generator``).
        grad (str, optional): ``"ste"`` passes the gradient through unchanged
            (straight-through estimator, default); ``"zero"`` is the true derivative of the
            truncation, zero.
        generator (torch.Generator, optional): source of randomness for ``"stochastic"``,
            on ``x``'s device. (default: :obj:`None`, the global generator)

    NaN stays NaN and +-inf stays +-inf; the sign bit is never changed; a magnitude rounded
    past the largest finite value becomes inf. See :mod:`fxquant._ops.truncate` for ``bits``
    below the exponent width.

    Example:
        >>> x = torch.tensor([1.0 + 2**-8 + 2**-9, -3.14159, float("nan")])
        >>> truncate(x, 16)
        tensor([ 1.0000, -3.1406,     nan])
        >>> truncate(x, 16, "nearest")  # bit-identical to x.to(torch.bfloat16).float()
        tensor([ 1.0078, -3.1406,     nan])
        >>> truncate(x, 9)  # sign and exponent: signed powers of two
        tensor([ 1., -2., nan])
    """
    x = _check_tensor(x, "truncate")
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise FxquantTypeError(f"fxquant.truncate: bits must be an int (the number of kept bits), "
                        f"got {bits!r}")
    rounding = Rounding.parse(rounding).value
    grad = op_grad(grad).value
    _check_generator(generator, x, "truncate")
    return torch.ops.fxquant.truncate(x, bits, rounding, grad, generator, numerics=NUMERICS)


def quantize(
    x: Tensor,
    format: str | Format | tuple[int, int],
    rounding: str = "nearest",
    *,
    scale: str | None = None,
    grad: str = "ste",
    generator: torch.Generator | None = None,
) -> Tensor:
    """Round ``x`` to the values of a number format; returns a new tensor of ``x``'s dtype.

    Args:
        x (Tensor): a floating-point tensor on any device; never written to.
        format (str, Format or tuple): a preset (``"e4m3"``, ``"e5m2"``, ``"fp16"``,
            ``"bf16"``, ``"e3m2"``, ``"e2m3"``, ``"e2m1"``), ``"eXmY"`` / ``(X, Y)`` for a
            custom format (no inf/NaN codes, subnormals, saturating), an integer format
            (``"int8"``, ``"int8:asym"``), a torch dtype (``torch.float8_e4m3fn``), a
            :class:`~fxquant.formats.Format`, or a spec with its scale (``"int8:row"``,
            ``"mxfp4"``: see :mod:`fxquant.formats`).
        rounding (str, optional): ``"nearest"`` (half to even, default), ``"toward_zero"``
            or ``"stochastic"``.
        scale (str, optional): ``"none"`` (a plain cast), ``"tensor"``, ``"row"``,
            ``"tensor-pow2"``, ``"row-pow2"`` or ``"block32"``. (default: :obj:`None`:
            the format's spec's, else a plain cast; an integer format then warns: its grid
            has a step of 1, so ``quantize(x, "int8")`` rounds ``x`` to whole numbers)
        grad (str, optional): ``"ste"`` (straight-through, default) or ``"zero"``.
        generator (torch.Generator, optional): for ``"stochastic"``.

    Example:
        >>> x = torch.tensor([0.3, 300.0, 1000.0, -float("inf"), float("nan")])
        >>> quantize(x, "e4m3").tolist()  # saturates at 448 (E4M3 has no inf)
        [0.3125, 288.0, 448.0, -448.0, nan]
        >>> quantize(x, "e5m2").tolist()  # overflows to inf, like torch.float8_e5m2
        [0.3125, 320.0, 1024.0, -inf, nan]
        >>> quantize(torch.tensor([0.01, 0.2, 3.0]), "e2m1", scale="tensor").tolist()  # FP4
        [0.0, 0.25, 3.0]
        >>> quantize(torch.tensor([0.3, -1.7, 20.0]), "int8:tensor").tolist()  # scale in the spec
        [0.31496062874794006, -1.7322834730148315, 20.0]
    """
    if torch.compiler.is_compiling() and isinstance(format, str):
        # The op's fake kernel validates; keep Python-side parsing out of the traced code
        # (the spec's scale is split off by string operations)
        body, word = split_scale(format)
        chosen = None if scale is None else Scale.parse(scale).value
        if word is None or chosen is None or word == chosen:
            return torch.ops.fxquant.quantize(x, body, rounding, chosen or word or "none", grad,
                                              generator, numerics=NUMERICS)
    x = _check_tensor(x, "quantize")
    try:
        number, named = parse_scaled(format)
        mode, scale_given = merge_scale(scale, named, format)
    except (TypeError, ValueError) as e:
        raise same_kind(e, f"fxquant.quantize: format must be a preset name, 'eXmY', (exp_bits, "
                      f"man_bits) or a Format: {e}") from e
    if isinstance(number, IntFormat) and not scale_given and not torch.compiler.is_compiling():
        warnings.warn(
            f"fxquant.quantize: {number.spec()} without a scale rounds x to the grid's levels "
            f"{number.level(number.qmin):g}..{number.max_finite:g} themselves (a step of 1). "
            "Please give a scale, e.g. scale='tensor' (or 'row', 'tensor-pow2', 'row-pow2', "
            f"'block32'; '{number.spec()}:tensor' in the spec), or scale='none' for the "
            "unscaled grid without this warning.", UserWarning, stacklevel=user_stacklevel())
    scale_arg = mode.value
    if isinstance(number, TopN):
        raise FxquantValueError(f"fxquant.quantize: {number.spec()} is top-N truncation; please call "
                         f"fxquant.truncate(x, {number.bits}) instead")
    rounding = Rounding.parse(rounding).value
    grad = op_grad(grad).value
    _check_generator(generator, x, "quantize")
    return torch.ops.fxquant.quantize(x, number.spec(), rounding, scale_arg, grad, generator,
                                      numerics=NUMERICS)
