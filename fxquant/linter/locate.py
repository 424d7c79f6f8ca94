"""Finding the line of a write no instrument sees, by watching the user's lines run.

A write through a NumPy view (``y.detach().numpy()[mask] = 0``), a C extension or a
kernel that stores into its inputs goes past autograd's version counter and past every
torch mode: nothing records it when it happens. What can be seen is its effect: a value
autograd saved differs from its copy taken when it was saved. :func:`first_line_after`
runs a block with a line tracer on the user's frames (library frames are not traced) and
asks, before each line of the user's code runs and when each user function returns,
whether the effect is there yet; the line that ran just before it first is the writer.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from fxquant.fx.locations import Location, is_internal

__all__ = ["first_line_after"]


@contextlib.contextmanager
def first_line_after(happened: Callable[[], bool]) -> Iterator[list[Location]]:
    """While the block runs, find the user's line after which ``happened()`` first holds.

    Yields a list that holds that line (or nothing) once the block exits. The tracer that
    was set before (a coverage tool, a debugger) is put back afterwards.

    Example:
        >>> import torch
        >>> t = torch.zeros(3)
        >>> def model():
        ...     a = t + 1
        ...     t.numpy()[0] = 5.0
        ...     return a
        >>> with first_line_after(lambda: bool(t[0] == 5)) as found:
        ...     _ = model()
        >>> found[0].line  # the second line of model()
        3
    """
    found: list[Location] = []
    last: list[Location | None] = [None]

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if found:
            return None
        if event in ("line", "return"):
            if happened():
                if last[0] is not None:
                    found.append(last[0])
                return None
            if event == "line":
                last[0] = Location(frame.f_code.co_filename, frame.f_lineno)
        return local

    def calls(frame: FrameType, event: str, arg: Any) -> Any:
        if found or is_internal(frame.f_code.co_filename):
            return None
        return local(frame, event, arg)

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        yield found
    finally:
        sys.settrace(previous)
