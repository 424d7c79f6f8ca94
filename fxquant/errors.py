"""The exceptions fxquant raises on purpose, under one base class.

Every error fxquant raises for a reason it can name derives from :class:`FxquantError`;
those about an argument also derive from the built-in :class:`ValueError` or
:class:`TypeError`, and those about what a model did from :class:`RuntimeError`, so
``except ValueError`` clauses written before this base existed keep working.

Example:
    >>> import fxquant
    >>> try:
    ...     fxquant.QuantConfig("int4", scale="tensor", decay=2.0)
    ... except fxquant.FxquantError as e:
    ...     print(type(e).__name__, isinstance(e, ValueError))
    FxquantValueError True
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Any

__all__ = [
    "BackwardSafetyError",
    "FxquantError",
    "FxquantFileNotFoundError",
    "FxquantImportError",
    "FxquantIndexError",
    "FxquantKeyError",
    "FxquantRuntimeError",
    "FxquantTypeError",
    "FxquantValueError",
    "UnregisteredError",
    "same_kind",
    "user_stacklevel",
    "warn_renamed",
]


class FxquantError(Exception):
    """Base class of every error fxquant raises on purpose."""


class FxquantValueError(FxquantError, ValueError):
    """An argument has the right type but a value fxquant cannot use; the message names
    the argument and how to fix it."""


class FxquantTypeError(FxquantError, TypeError):
    """An argument has a type fxquant cannot use; the message names the argument."""


class FxquantRuntimeError(FxquantError, RuntimeError):
    """Something a model or a file did (not an argument) stops fxquant; the message says
    what and where."""


class FxquantIndexError(FxquantError, IndexError):
    """A node id lies outside the graph or table it indexes."""


class FxquantFileNotFoundError(FxquantError, FileNotFoundError):
    """Data fxquant was asked to read is not where it looked; the message lists the places."""


class FxquantImportError(FxquantError, ImportError):
    """An optional package a call needs is missing; the message names the install command."""


class BackwardSafetyError(FxquantError, AssertionError):
    """:func:`fxquant.testing.assert_backward_safe` found a finding it does not allow."""


class UnregisteredError(FxquantValueError):
    """A format, scale or site of one's own is named (in a config or a saved file) but not
    registered in this process; the message names the call that registers it."""


class FxquantKeyError(FxquantError, KeyError):
    """A saved file lacks an entry fxquant needs; the message names it."""

    def __str__(self) -> str:  # KeyError quotes its message; say it plainly
        return str(self.args[0]) if self.args else ""


def same_kind(error: BaseException, message: str) -> FxquantError:
    """An fxquant error of the same built-in kind as ``error`` (a ValueError stays a
    ValueError) carrying ``message``: for re-raising with context, ``from error``."""
    if isinstance(error, UnregisteredError):
        return UnregisteredError(message)
    if isinstance(error, TypeError):
        return FxquantTypeError(message)
    if isinstance(error, IndexError):
        return FxquantIndexError(message)
    if isinstance(error, KeyError):
        return FxquantKeyError(message)
    if isinstance(error, ValueError):
        return FxquantValueError(message)
    return FxquantRuntimeError(message)


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """A :class:`FutureWarning` that ``old`` is a deprecated name of ``new`` (kept for one
    release)."""
    warnings.warn(f"{old} is deprecated and will be removed in the next release; please use "
                  f"{new}", FutureWarning, stacklevel=stacklevel)


#: where fxquant's own frames are (a warning skips them to reach the user's line)
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning issued by the caller point at the innermost
    frame outside fxquant (and outside ``contextlib``, which runs context managers): the
    user's line, however many of fxquant's calls lie between (``transform`` calling
    ``QuantConfig``, a recipe calling ``transform``).

    Example:
        >>> import warnings
        >>> def inside_fxquant():  # (a doctest's frame is the user's)
        ...     warnings.warn("careful", UserWarning, stacklevel=user_stacklevel())
        >>> user_stacklevel()
        1
    """
    skipped = (_PACKAGE, contextlib.__file__)
    frame: Any = sys._getframe(1)  # the caller: stacklevel 1
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(skipped):
        frame, level = frame.f_back, level + 1
    return level
