"""What the recipes' settings and the training loop's arguments must be, checked in one
place: every ``bool``, ``int``, ``float`` and ``str`` setting against its annotation
(:func:`check_settings`, :func:`check_fields`), then ranges and choices. A wrong type is an
:class:`~fxquant.errors.FxquantTypeError` naming the argument, its value and the type
expected (``"False"`` is not ``False``: a non-empty string is true, so a setting given as a
string would silently act as ``True``); a right type with a wrong value an
:class:`~fxquant.errors.FxquantValueError`. ``1`` is not ``True``, ``2.0`` is not an int, a
string is not a number; numpy's numbers are taken, as the plain ``int`` or ``float``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import operator
import types
import typing
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from fxquant.errors import FxquantTypeError, FxquantValueError

__all__ = ["check_count", "check_fields", "check_flag", "check_positive", "check_rounding",
           "check_settings", "check_type", "hints", "real_number"]

#: what each scalar annotation accepts, and how an error names it
_KINDS: dict[type, str] = {bool: "a bool (True or False)", int: "an int",
                           float: "a number (an int or a float)", str: "a str"}


def _is(value: object, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:  # numpy's integers too; a bool is not a count
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    return isinstance(value, kind)


def _got(value: object) -> str:
    return f"{value!r} (a {type(value).__name__})"


def check_type(value: object, name: str, hint: Any) -> Any:
    """``value`` if it has the type ``hint`` says (``bool``, ``int``, ``float``, ``str``, or
    one of them ``| None``), else an error naming ``name``; a float must also be finite. A
    numpy number is returned as the plain ``int`` or ``float``. Other annotations (tuples,
    tensors) are left to the checks of their own.

    Example:
        >>> import numpy as np
        >>> check_type(np.int64(3), "anneal_every", int)
        3
        >>> check_type("False", "midrise", bool)
        Traceback (most recent call last):
        ...
        fxquant.errors.FxquantTypeError: midrise must be a bool (True or False), got 'False' (a str)
    """
    kinds: tuple[Any, ...] = typing.get_args(hint) if isinstance(hint, types.UnionType) \
        or typing.get_origin(hint) is typing.Union else (hint,)
    optional = type(None) in kinds
    scalar = [k for k in kinds if k in _KINDS]
    if not scalar or (optional and value is None):
        return value
    if not any(_is(value, k) for k in scalar):
        expected = " or ".join(_KINDS[k] for k in scalar) + (" or None" if optional else "")
        raise FxquantTypeError(f"{name} must be {expected}, got {_got(value)}")
    if isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):
        return value if type(value) is int else int(value)
    if isinstance(value, numbers.Real):
        if not math.isfinite(value):
            raise FxquantValueError(f"{name} must be a finite number, got {value!r}")
        return value if type(value) is float else float(value)
    return value


@functools.cache
def hints(owner: Any) -> dict[str, Any]:
    """The resolved annotations of a class or function (cached). Where one cannot be
    resolved (a name imported only for type checkers, in a recipe of one's own), the
    annotations are read as written: ``"bool"``, ``"int | None"`` and the like still
    check, the others are left alone."""
    try:
        return typing.get_type_hints(owner)
    except (NameError, TypeError, AttributeError):
        written: dict[str, Any] = {}
        for cls in reversed(getattr(owner, "__mro__", (owner,))):
            written.update(getattr(cls, "__annotations__", {}))
        return {name: _written(hint) for name, hint in written.items()}


def _written(hint: Any) -> Any:
    """A scalar annotation written as a string (``"float | None"``), else None."""
    if not isinstance(hint, str):
        return hint
    names = {**{k.__name__: k for k in _KINDS}, "None": type(None)}
    parts = [names.get(part.strip()) for part in hint.split("|")]
    if any(part is None for part in parts):
        return None
    return functools.reduce(operator.or_, parts)


def check_settings(owner: Any, settings: Mapping[str, object], prefix: str = ""
                   ) -> dict[str, Any]:
    """:func:`check_type` of each of ``settings`` against ``owner``'s annotation of it
    (``owner``: a function, e.g. ``QuantTraining.__init__``, or a class); the settings as
    :func:`check_type` returns them."""
    annotations = hints(owner)
    return {name: check_type(value, prefix + name, annotations[name])
            if name in annotations else value for name, value in settings.items()}


def check_fields(obj: Any) -> None:
    """:func:`check_type` of every field of the dataclass ``obj`` (a recipe, frozen or not)
    against its annotation; the error names the class and the field. A numpy number
    becomes the plain ``int`` or ``float``."""
    given = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    checked = check_settings(type(obj), given, prefix=f"{type(obj).__name__}: ")
    for name, value in checked.items():
        if value is not given[name]:
            object.__setattr__(obj, name, value)


def check_count(value: object, name: str) -> None:
    """An int ``>= 0`` (epochs, bits)."""
    if check_type(value, name, int) < 0:
        raise FxquantValueError(f"{name} must be a whole number >= 0, got {value!r}")


def check_flag(value: object, name: str) -> None:
    """``True`` or ``False`` (not a string, not 0 or 1)."""
    check_type(value, name, bool)


def check_rounding(value: object, name: str) -> None:
    """An integer grid's rounding: ``"nearest"`` or ``"stochastic"``."""
    if value not in ("nearest", "stochastic"):
        raise FxquantValueError(f"{name} must be 'nearest' or 'stochastic', got {value!r}")


def check_positive(value: object, name: str, zero: bool = False) -> None:
    """A finite number ``> 0`` (``>= 0`` with ``zero``)."""
    number = float(check_type(value, name, float))
    if not (number >= 0 if zero else number > 0):
        raise FxquantValueError(f"{name} must be a finite number {'>= 0' if zero else '> 0'}, "
                                f"got {value!r}")


def real_number(value: object, name: str) -> float:
    """``value`` as a float: an int or float, or a real tensor of one element (what an
    accuracy computed with torch is); anything else, a bool included, is an error naming
    ``name``. NaN and infinities pass (the caller says what they mean).

    Example:
        >>> import torch
        >>> real_number(torch.tensor(0.75), "val")
        0.75
    """
    if isinstance(value, Tensor) and value.numel() == 1 and not value.is_complex() \
            and value.dtype != torch.bool:
        return float(value)
    if _is(value, float):
        return float(value)  # type: ignore[arg-type]
    raise FxquantTypeError(f"{name} must be a number (an int, a float or a one-element "
                           f"tensor), got {_got(value)}")
