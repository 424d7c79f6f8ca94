"""Where a library module that runs inside a container was built, and where the container
is called.

A module from ``torch.nn`` that a container runs (an ``nn.Sequential``, or a subclass of
it that appends ``nn.ReLU(inplace=True)`` and ``nn.Dropout(inplace=True)`` in its
``__init__``) runs with no line of the user's code on the stack below the container's
call; and when the container is the model itself, with none at all. What a user can open
and fix is the line that built the module (``inplace=True`` goes there) and the line that
calls the container. :func:`container_site` finds both while the module runs: the module
from the stack, its name in the model, the construction call from the source of the
user's classes that own it (the nearest one first), and the innermost user frame above
the container.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType

from torch import nn

from fxquant.fx.locations import Location, is_internal

__all__ = ["ModuleSite", "built_at", "container_site"]

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
_MODULE_PY = nn.Module.__call__.__code__.co_filename


@dataclass(frozen=True)
class ModuleSite:
    """A library module run by a container: what it is, where it was built and called.

    ``built`` is the construction call as written (``nn.Dropout(p, inplace=inplace)``),
    ``fixed`` the same call with ``inplace=False`` ('' when it has no ``inplace``).
    """

    name: str  # qualified name in the model, "mlp.2"
    kind: str  # the module's class, "Dropout"
    container: str  # the container's qualified name ('' for the model itself)
    container_kind: str  # its class, "MLP"
    built_at: Location | None
    built: str
    fixed: str
    called_at: Location | None  # the innermost user line above the container

    def describe(self) -> str:
        """One phrase naming the module, where it was built and how it runs."""
        module = f"the {self.kind} `{self.name}`" if self.name else f"the {self.kind}"
        built = f" built at {self.built_at} (`{self.built}`)" if self.built_at else ""
        container = f"`{self.container}`" if self.container else "(the model itself)"
        called = f", called at {self.called_at}" if self.called_at else ""
        return f"{module}{built}, run by the {self.container_kind} container {container}{called}"


def _module_of(frame: FrameType) -> nn.Module | None:
    if frame.f_code.co_name != "forward":
        return None
    owner = frame.f_locals.get("self")
    return owner if isinstance(owner, nn.Module) else None


def container_site(boundary: FrameType | None, names: Mapping[int, str],
                   modules: Mapping[str, nn.Module]) -> ModuleSite | None:
    """The site of the library module whose forward is running, when a container (not
    the user's code) called it; None otherwise. ``names`` maps ``id(module)`` to its
    qualified name and ``modules`` the reverse, both for the model being run."""
    frames: list[FrameType] = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame is not boundary:
        frames.append(frame)
        frame = frame.f_back
    for i, f in enumerate(frames):
        module = _module_of(f)
        if module is None:
            continue
        if not is_internal(f.f_code.co_filename) or id(module) not in names:
            return None  # the write is in the user's own forward, or outside the model
        rest = [g for g in frames[i + 1:] if g.f_code.co_filename != _MODULE_PY]
        if not rest:
            return None
        caller = rest[0]
        container = _module_of(caller)
        if container is None or not isinstance(container, _CONTAINERS) \
                or not is_internal(caller.f_code.co_filename):
            return None
        called_at = next((Location(g.f_code.co_filename, g.f_lineno) for g in rest[1:]
                          if not is_internal(g.f_code.co_filename)), None)
        name = names[id(module)]
        built_at, built, fixed = _construction(name, module, modules)
        return ModuleSite(name, type(module).__name__, names.get(id(container), ""),
                          type(container).__name__, built_at, built, fixed, called_at)
    return None


def built_at(model: nn.Module, name: str) -> Location | None:
    """The line of the user's code that built the submodule ``name`` of ``model`` (found
    in the source of the user's classes that own it), or None.

    Example:
        >>> import torch
        >>> class Net(torch.nn.Sequential):
        ...     def __init__(self):
        ...         super().__init__(torch.nn.Linear(2, 2), torch.nn.ReLU(inplace=True))
        >>> built_at(Net(), "1") is None  # a doctest's classes have no source file
        True
    """
    modules = dict(model.named_modules())
    module = modules.get(name)
    return _construction(name, module, modules)[0] if module is not None else None


def _construction(name: str, module: nn.Module, modules: Mapping[str, nn.Module]
                  ) -> tuple[Location | None, str, str]:
    """Where ``module`` (qualified ``name``) was built: a call of its class in the source
    of the user's classes that own it, nearest owner first."""
    parts = name.split(".")
    owners = [".".join(parts[:k]) for k in range(len(parts) - 1, -1, -1)]
    for owner in owners:
        container = modules.get(owner)
        if container is None:
            continue
        for cls in type(container).__mro__:
            found = _calls_in(cls, type(module).__name__)
            if found is not None:
                return found
    return None, "", ""


@functools.lru_cache(maxsize=256)
def _calls_in(cls: type, kind: str) -> tuple[Location, str, str] | None:
    """The first call building a ``kind`` in the source of the user's class ``cls`` (one
    passing ``inplace`` preferred); else the first call passing ``inplace`` at all (a
    module built through a factory argument, ``activation_layer(inplace=inplace)``)."""
    if cls in (object, nn.Module) or not isinstance(cls, type):
        return None
    try:
        path = inspect.getsourcefile(cls)
        lines, start = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return None
    if path is None or is_internal(path):
        return None
    source = textwrap.dedent("".join(lines))
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    calls.sort(key=lambda n: (n.lineno, n.col_offset))

    def callee(n: ast.Call) -> str:
        f = n.func
        return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""

    def passes_inplace(n: ast.Call) -> bool:
        return any(k.arg == "inplace" for k in n.keywords)

    named = [n for n in calls if callee(n) == kind]
    chosen = next((n for n in named if passes_inplace(n)), named[0] if named else None)
    if chosen is None:
        chosen = next((n for n in calls if passes_inplace(n)), None)
    if chosen is None:
        return None
    built = ast.get_source_segment(source, chosen) or ast.unparse(chosen)
    fixed = ""
    if passes_inplace(chosen):
        copy = ast.parse(ast.unparse(chosen), mode="eval").body
        for k in copy.keywords if isinstance(copy, ast.Call) else ():
            if k.arg == "inplace":
                k.value = ast.Constant(False)
        fixed = ast.unparse(copy)
    return Location(path, start + chosen.lineno - 1), " ".join(built.split()), fixed
