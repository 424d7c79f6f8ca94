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

import math
import re
from abc import ABC, abstractmethod
from enum import Enum
from typing import TYPE_CHECKING, TypeVar

from fxquant.errors import FxquantTypeError, FxquantValueError, UnregisteredError

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "AnyScale",
    "Grad",
    "Rounding",
    "Scale",
    "ScaleKind",
    "op_grad",
    "register_scale",
    "registered_scales",
    "unregister_scale",
]

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
    def parse(cls, value: object, arg: str | None = None) -> AnyScale:  # type: ignore[override]
        """Like the other vocabularies, and :obj:`None` means ``NONE``; the name of a
        registered :class:`ScaleKind` (or the kind itself) gives that kind."""
        if value is None:
            return cls.NONE
        if isinstance(value, ScaleKind):
            return value
        if isinstance(value, str) and value in _REGISTERED:
            return _REGISTERED[value]
        try:
            return super().parse(value, arg)
        except FxquantValueError:
            allowed = [m.value for m in cls] + sorted(_REGISTERED)
            raise UnregisteredError(
                f"{arg or 'scale'}={value!r} is not one of {allowed}; a scale of one's own "
                "must be registered first, in this process: fxquant.register_scale("
                "<a fxquant.ScaleKind>)") from None

    def storage_bits(self, rows: int, width: int) -> int:
        """The bits the scales of one rounded tensor take (``rows``: its dim 0, ``width``:
        values per row): a float32 per tensor or per row, an E8M0 byte per block of 32."""
        if self is Scale.NONE:
            return 0
        if self.per_row:
            return 32 * rows
        if self.per_block:  # each row padded to blocks of 32
            return 8 * rows * math.ceil(width / 32)
        return 32

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


class ScaleKind(ABC):
    """A scale of one's own: where a scaled format's scales come from, registered with
    :func:`register_scale` (an instance: a kind may carry settings, such as a group size).

    A kind gives the range ``(lo, hi)`` of each group of values that shares a scale
    (:meth:`bounds`); fxquant turns it into scales as it does for the built-in per-tensor
    and per-row kinds (``max_finite / amax`` for float formats; ``amax / qmax``, or the
    affine grid's scale and zero point, for integers; rounded to a power of two with
    :attr:`pow2`). The ranges come from each tensor itself: running, percentile and
    learned ranges stay the built-in kinds'. It counts its scales' storage for
    :func:`fxquant.bit_report` (:meth:`storage_bits`).

    Example:
        >>> import torch
        >>> class PerColumn(ScaleKind):
        ...     name = "column"
        ...     def bounds(self, x):
        ...         finite = torch.isfinite(x)
        ...         lo = torch.where(finite, x, 0.0).amin(0, keepdim=True)
        ...         hi = torch.where(finite, x, 0.0).amax(0, keepdim=True)
        ...         return torch.stack([lo, hi], dim=-1)
        ...     def storage_bits(self, rows, width):
        ...         return 32 * width
        >>> column = register_scale(PerColumn())
        >>> Scale.parse("column") is column, column.value
        (True, 'column')
        >>> import fxquant
        >>> fxquant.quantize(torch.tensor([[1.0, 100.0], [-2.0, 30.0]]), "int4", scale="column")
        tensor([[  0.8571, 100.0000],
                [ -2.0000,  28.5714]])
        >>> unregister_scale("column")
    """

    #: the name configs, saved files and the registered op write (lower case)
    name: str = ""
    #: round each scale to a power of two (up for integers, so the range stays on the grid)
    pow2: bool = False

    @abstractmethod
    def bounds(self, x: Tensor) -> Tensor:
        """``(lo, hi)`` of the finite values of each group of ``x`` that shares a scale,
        in the last dim: shaped so that ``bounds[..., 0]`` broadcasts against ``x``
        (zeros for a group without finite values). Pure tensor operations (it compiles)."""

    @abstractmethod
    def storage_bits(self, rows: int, width: int) -> int:
        """The bits the scales of one tensor with ``rows`` rows of ``width`` values take."""

    @property
    def value(self) -> str:
        """The kind's name (as :attr:`Scale.value` is a built-in kind's)."""
        return self.name

    per_tensor = per_row = per_block = False  # (no built-in kind's machinery applies)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


#: A scale: a built-in kind or a registered one.
AnyScale = Scale | ScaleKind

_REGISTERED: dict[str, ScaleKind] = {}
_SCALE_NAME = re.compile(r"[a-z][a-z0-9_-]*")
#: the words after a format's ":" that are variants of it, which no scale may be called
#: (a spec's last ":" field is its scale where it names one: :func:`fxquant.formats.parse_scaled`)
_FORMAT_VARIANTS = frozenset({"asym", "midrise"})


def register_scale(kind: ScaleKind) -> ScaleKind:
    """Make ``kind`` known by its name: :meth:`Scale.parse` (and with it every config,
    saved file and the registered op) accepts it from then on. Register it in every
    process that uses or loads it (a file that names an unregistered scale is refused,
    naming it). Returns ``kind``.

    Args:
        kind (ScaleKind): an instance whose ``name`` (lower case, no built-in kind's name)
            is not registered yet.
    """
    if not isinstance(kind, ScaleKind):
        raise FxquantTypeError(f"register_scale expects a fxquant.ScaleKind instance, got "
                               f"{kind!r}")
    name = kind.name
    if not isinstance(name, str) or not _SCALE_NAME.fullmatch(name):
        raise FxquantValueError(f"register_scale: the name of {type(kind).__name__} must be a "
                                f"lower-case word (letters, digits, - and _), got {name!r}")
    if name in [m.value for m in Scale]:
        raise FxquantValueError(f"register_scale: {name!r} is a built-in scale; please choose "
                                "another name")
    if name in _FORMAT_VARIANTS:  # "int8:asym" is a format, not int8 with a scale
        raise FxquantValueError(f"register_scale: {name!r} is a variant of the integer "
                                "formats ('int8:asym'); please choose another name")
    if name in _REGISTERED and _REGISTERED[name] is not kind:
        raise FxquantValueError(f"register_scale: {name!r} is registered already "
                                f"({_REGISTERED[name]!r}); please unregister_scale({name!r}) "
                                "first, or choose another name")
    _REGISTERED[name] = kind
    return kind


def unregister_scale(name: str) -> None:
    """Forget the registered scale ``name``."""
    if _REGISTERED.pop(name, None) is None:
        raise FxquantValueError(f"unregister_scale: no scale {name!r} is registered; "
                                f"registered: {sorted(_REGISTERED)}")


def registered_scales() -> dict[str, ScaleKind]:
    """The registered scale kinds by name (a copy)."""
    return dict(_REGISTERED)


def op_grad(value: object, arg: str = "grad") -> Grad:
    """:meth:`Grad.parse` for the rounding ops themselves, which implement ``"ste"`` and
    ``"zero"``; ``"clipped"`` needs the scale and range a quantization point knows."""
    grad = Grad.parse(value, arg)
    if grad is Grad.CLIPPED:
        raise FxquantValueError(
            f"{arg}='clipped' is a rule of a quantization point (QuantConfig(grad='clipped')), "
            "which knows the grid's range; the rounding functions take 'ste' or 'zero'")
    return grad

