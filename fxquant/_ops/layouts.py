"""Bit layouts of the floating dtypes fxquant reads as IEEE-754 patterns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import torch

from fxquant.errors import FxquantTypeError

__all__ = ["COMPUTE_DTYPE", "EXPONENT_BIAS", "FloatLayout", "bit_width", "layout_of"]


@dataclass(frozen=True)
class FloatLayout:
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
        """The sign bit as a value of the signed integer dtype."""
        return -(1 << (self.width - 1))


_LAYOUTS: Final = {
    torch.float32: FloatLayout(torch.int32, 32, 8),
    torch.float64: FloatLayout(torch.int64, 64, 11),
    torch.float16: FloatLayout(torch.int16, 16, 5),
    torch.bfloat16: FloatLayout(torch.int16, 16, 8),
}


def layout_of(dtype: torch.dtype, what: str = "x") -> FloatLayout:
    """The layout of ``dtype``; a TypeError naming ``what`` and the supported dtypes if none.

    Example:
        >>> layout_of(torch.bfloat16).man_bits
        7
        >>> layout_of(torch.int64)
        Traceback (most recent call last):
        ...
        fxquant.errors.FxquantTypeError: x has dtype torch.int64, but fxquant reads a floating-point bit \
pattern; supported dtypes: torch.float32, torch.float64, torch.float16, torch.bfloat16. Please convert \
it with `.float()` first.
    """
    layout = _LAYOUTS.get(dtype)
    if layout is None:
        supported = ", ".join(str(d) for d in _LAYOUTS)
        raise FxquantTypeError(
            f"{what} has dtype {dtype}, but fxquant reads a floating-point bit pattern; "
            f"supported dtypes: {supported}. Please convert it with `.float()` first."
        )
    return layout


def bit_width(dtype: torch.dtype) -> int:
    """The bits in the pattern of a floating ``dtype`` (the largest valid ``bits``).

    Example:
        >>> bit_width(torch.float32), bit_width(torch.float64), bit_width(torch.bfloat16)
        (32, 64, 16)
    """
    return layout_of(dtype).width


#: The dtype each floating dtype is computed in: float32 for the half types, else itself.
COMPUTE_DTYPE: Final = {torch.float32: torch.float32, torch.float16: torch.float32,
                        torch.bfloat16: torch.float32, torch.float64: torch.float64}
#: The exponent bias of the float32 and float64 patterns, by width.
EXPONENT_BIAS: Final = {32: 127, 64: 1023}
