"""Checks the config classes share when they read a value or their own JSON."""

from __future__ import annotations

from fxquant.errors import FxquantTypeError, FxquantValueError

__all__ = ["check_count", "require_keys"]


def require_keys(data: object, keys: tuple[str, ...], what: str) -> None:
    """``data`` is a dict with ``keys``, or an error naming the first missing one (``what``:
    the class whose ``from_dict`` reads it)."""
    if not isinstance(data, dict):
        raise FxquantTypeError(f"{what}.from_dict expects a dict, got {type(data).__name__}")
    for key in keys:
        if key not in data:
            raise FxquantValueError(f"{what}.from_dict: no {key!r} entry in {data!r}")


def check_count(value: object, what: str) -> None:
    """``value`` is an ``int >= 0``, or an error naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FxquantValueError(f"{what} must be an int >= 0, got {value!r}")
