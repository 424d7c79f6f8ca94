"""The words fxquant's calls share: rounding modes, gradient rules and scale modes.

Each vocabulary is a ``str`` Enum, so users keep writing plain strings (``"nearest"``,
``"ste"``, ``"tensor"``) and every layer of the library (the registered ops, the config,
the observers) validates them with the same ``parse`` and the same message.

Example:
    >>> Rounding.parse("nearest") is Rounding.NEAREST, Rounding.NEAREST == "nearest"
    (True, True)
    >>> Scale.parse(None), Scale.parse("row-pow2").per_row, Scale.parse("row-pow2").pow2
    (<Scale.NONE: 'none'>, True, True)
    >>> Grad.parse("identity")
    Traceback (most recent call last):
    ...
    fxquant.errors.FxquantValueError: grad='identity' is not one of ['ste', 'zero', 'clipped']
"""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

from fxquant.errors import FxquantValueError

__all__ = ["Grad", "Rounding", "Scale", "op_grad"]

_E = TypeVar("_E", bound="_Vocabulary")


class _Vocabulary(str, Enum):
    """A ``str`` Enum with one validator: ``parse`` accepts a member or its string value."""

    @classmethod
    def parse(cls: type[_E], value: object, arg: str | None = None) -> _E:
        """The member for ``value``; raises ValueError naming ``arg`` and the allowed values."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls(value)
            except ValueError:
                pass
        allowed = [m.value for m in cls]
        raise FxquantValueError(f"{arg or cls.__name__.lower()}={value!r} is not one of {allowed}")

    def __str__(self) -> str:
        return str(self.value)


class Rounding(_Vocabulary):
    """How a value between two representable ones is rounded.

    ``TOWARD_ZERO`` drops what does not fit, ``NEAREST`` rounds half to even,
    ``STOCHASTIC`` goes to one of the two neighbours at random, the farther one with
    probability equal to the distance to the nearer (in steps), so that between two
    neighbours it carries no bias (a value clamped to a grid's edge, or rounded to inf,
    still is). On a pattern's magnitude (truncation) that is away from zero with probability
    equal to the dropped fraction; on an integer grid, up with probability equal to the
    fraction of a step above the level below.
    """

    TOWARD_ZERO = "toward_zero"
    NEAREST = "nearest"
    STOCHASTIC = "stochastic"


class Grad(_Vocabulary):
    """The gradient rule of a rounding step.

    ``STE`` passes the incoming gradient through unchanged (straight-through estimator);
    ``ZERO`` is the true derivative of rounding, zero almost everywhere; ``CLIPPED``
    (integer grids with a scale) is straight-through except where the value rounds to
    the grid's smallest or largest code or beyond, where it is zero (Degree-Quant's
    "GC", which also zeroes the end codes themselves; PyTorch's fake quantization zeroes
    only values beyond them).
    """

    STE = "ste"
    ZERO = "zero"
    CLIPPED = "clipped"


class Scale(_Vocabulary):
    """Where the scale of a scaled format comes from.

    ``NONE`` casts without scaling; ``TENSOR`` uses one scale for the whole tensor, ``ROW``
    one per row (dim 0: one per node of a GNN activation, one per edge of a message
    tensor). The ``-pow2`` variants make each scale a power of two (the step between
    levels rounded up, so that the largest value still fits), so that scaling itself is
    exact. ``BLOCK32`` is the OCP Microscaling (MX) scheme: one shared
    power-of-two (E8M0) scale per block of 32 consecutive values along the last dim.
    """

    NONE = "none"
    TENSOR = "tensor"
    ROW = "row"
    TENSOR_POW2 = "tensor-pow2"
    ROW_POW2 = "row-pow2"
    BLOCK32 = "block32"

    @classmethod
    def parse(cls, value: object, arg: str | None = None) -> Scale:
        """Like the other vocabularies, and :obj:`None` means ``NONE``."""
        return cls.NONE if value is None else super().parse(value, arg)

    @property
    def per_tensor(self) -> bool:
        return self in (Scale.TENSOR, Scale.TENSOR_POW2)

    @property
    def per_row(self) -> bool:
        return self in (Scale.ROW, Scale.ROW_POW2)

    @property
    def per_block(self) -> bool:
        return self is Scale.BLOCK32

    @property
    def pow2(self) -> bool:
        """Scales are powers of two (exact scaling)."""
        return self.value.endswith("-pow2") or self is Scale.BLOCK32


def op_grad(value: object, arg: str = "grad") -> Grad:
    """:meth:`Grad.parse` for the rounding ops themselves, which implement ``"ste"`` and
    ``"zero"``; ``"clipped"`` needs the scale and range a quantization point knows."""
    grad = Grad.parse(value, arg)
    if grad is Grad.CLIPPED:
        raise FxquantValueError(
            f"{arg}='clipped' is a rule of a quantization point (QuantConfig(grad='clipped')), "
            "which knows the grid's range; the rounding functions take 'ste' or 'zero'")
    return grad

