"""Where in the user's code something happened: one idea of "user code" for every tool.

A frame is *internal* when it belongs to torch, torch_geometric, fxquant itself or
Python's standard library (site-packages excepted), or is generated code (``<string>``,
FX's ``<eval_with_key>``, the modules PyG writes from its templates); code typed at a
prompt or in a doctest is the user's.
Everything fxquant reports (trace errors, lint findings, exceptions raised by a model)
points at the innermost frame that is not internal.
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import tempfile
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from types import FrameType

import torch
import torch_geometric

__all__ = [
    "Location",
    "caller_location",
    "innermost_user",
    "is_internal",
    "stack_trace_location",
    "traceback_location",
]

_FXQUANT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_LIBRARY_DIRS = (
    *(os.path.dirname(m.__file__) + os.sep for m in (torch, torch_geometric) if m.__file__),
    _FXQUANT_DIR,
)
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
_PURELIB = sysconfig.get_paths()["purelib"] + os.sep
_PLATLIB = sysconfig.get_paths()["platlib"] + os.sep


@dataclass(frozen=True)
class Location:
    """A line of the user's code: ``path`` (as the interpreter saw it) and 1-based ``line``.

    ``str(location)`` is ``"path:LINE"`` with the path relative to the working directory
    where it lies below it; reports render it that way, tools read the fields.
    """

    path: str
    line: int

    @property
    def code(self) -> str:
        """The stripped source line ('' when the file cannot be read)."""
        return linecache.getline(self.path, self.line).strip()

    @property
    def display_path(self) -> str:
        try:
            rel = os.path.relpath(self.path)
        except ValueError:  # another drive on Windows
            return self.path
        return self.path if rel.startswith("..") else rel

    def __str__(self) -> str:
        return f"{self.display_path}:{self.line}"


#: Pseudo-files of generated code (FX's ``<eval_with_key>.N``, dataclasses, frozen
#: imports); other ``<...>`` names are code a person typed (``<stdin>``, ``<doctest ...>``).
_GENERATED = ("<eval_with_key", "<string>", "<frozen", "<built-in", "<unknown")


def is_internal(filename: str) -> bool:
    """Whether a frame in ``filename`` is library code rather than the user's."""
    if filename.startswith("<"):
        return filename.startswith(_GENERATED)
    if filename.startswith(_LIBRARY_DIRS) or _from_template(filename):
        return True
    in_site = filename.startswith((_PURELIB, _PLATLIB))
    return filename.startswith(_STDLIB) and not in_site


def _from_template(filename: str) -> bool:
    """Whether ``filename`` is a module PyG generated from a template into a temporary file
    (``torch_geometric.nn.Sequential``'s forward, a layer's ``propagate``): written as
    ``<module name>_<8 random characters>.py`` and imported under that module name."""
    if not filename.endswith(".py") or \
            not filename.startswith(os.path.join(tempfile.gettempdir(), "")):
        return False
    module = sys.modules.get(os.path.basename(filename)[:-len("_12345678.py")])
    return module is not None and getattr(module, "__file__", None) == filename



def innermost_user(frames: Iterable[tuple[str, int | None]]) -> Location | None:
    """The last (innermost) of ``(filename, line)`` pairs, outermost first, that is user code."""
    found = None
    for filename, line in frames:
        if line is not None and not is_internal(filename):
            found = Location(filename, line)
    return found


def caller_location(boundary: FrameType | None = None) -> Location | None:
    """The innermost user frame of the running stack, not looking past ``boundary``."""
    frames: list[tuple[str, int | None]] = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame is not boundary:
        frames.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return innermost_user(reversed(frames))


def traceback_location(exc: BaseException) -> Location | None:
    """The innermost user frame of an exception's traceback."""
    return innermost_user((f.filename, f.lineno) for f in traceback.extract_tb(exc.__traceback__))


def stack_trace_frames(stack_trace: str | None) -> list[tuple[str, int | None]]:
    """``(filename, line)`` of each frame of an FX ``node.meta["stack_trace"]``, outermost
    first."""
    frames: list[tuple[str, int | None]] = []
    for line in (stack_trace or "").splitlines():
        line = line.strip()
        if line.startswith('File "'):
            path, _, rest = line[6:].partition('", line ')
            number = rest.split(",")[0]
            if number.isdigit():
                frames.append((path, int(number)))
    return frames


def stack_trace_location(stack_trace: str | None) -> Location | None:
    """The innermost user frame of an FX ``node.meta["stack_trace"]``."""
    return innermost_user(stack_trace_frames(stack_trace))
