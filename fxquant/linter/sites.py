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
import types
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType

import torch_geometric.nn
from torch import nn

from fxquant.fx.locations import Location, is_internal
from fxquant.linter.torch_internals import MODULE_CALL_FILE

__all__ = ["ModuleSite", "built_at", "container_site"]

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict, torch_geometric.nn.Sequential)


@dataclass(frozen=True)
class ModuleSite:
    """A library module run by a container: what it is, where it was built and called.

    ``built`` is the construction call as written (``nn.Dropout(p, inplace=inplace)``),
    ``fixed`` the same call with ``inplace=False`` ('' when it passes no ``inplace``);
    ``switched_at`` a line that set ``m.inplace = True`` on modules built without it
    (``for m in self.modules(): m.inplace = True``); ``in_container`` says that the
    module's own construction was not found and ``built_at`` is where its container was
    built instead.
    """

    name: str  # qualified name in the model, "mlp.2"
    kind: str  # the module's class, "Dropout"
    container: str  # the container's qualified name ('' for the model itself)
    container_kind: str  # its class, "MLP"
    built_at: Location | None
    built: str
    fixed: str
    called_at: Location | None  # the innermost user line above the container
    switched_at: Location | None = None
    in_container: bool = False

    @property
    def line(self) -> Location | None:
        """The line to fix: where in-place was switched on, else where it was built."""
        return self.switched_at or self.built_at

    def describe(self) -> str:
        """One phrase naming the module, where it was built and how it runs."""
        module = f"the {self.kind} `{self.name}`" if self.name else f"the {self.kind}"
        if self.built_at is None:
            built = ""
        elif self.in_container:
            built = f" (in the container built at {self.built_at}, `{self.built}`)"
        else:
            built = f" built at {self.built_at} (`{self.built}`)"
        switched = f", made in-place at {self.switched_at}" if self.switched_at else ""
        container = f"`{self.container}`" if self.container else "(the model itself)"
        called = f", called at {self.called_at}" if self.called_at else ""
        return (f"{module}{built}{switched}, run by the {self.container_kind} container "
                f"{container}{called}")


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
        rest = [g for g in frames[i + 1:] if g.f_code.co_filename != MODULE_CALL_FILE]
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
        found = _construction(name, module, modules)
        return ModuleSite(name, type(module).__name__, names.get(id(container), ""),
                          type(container).__name__, found.at, found.code, found.fixed,
                          called_at, found.switched_at, found.in_container)
    return None


def built_at(model: nn.Module, name: str) -> Location | None:
    """The line of the user's code that built the submodule ``name`` of ``model`` (or made
    it in-place), found in the source of the user's classes that own it; or None.

    Example:
        >>> import torch
        >>> class Net(torch.nn.Sequential):
        ...     def __init__(self):
        ...         super().__init__(torch.nn.Linear(2, 2), torch.nn.ReLU(inplace=True))
        >>> built_at(Net(), "1").line  # the line of ``super().__init__`` in Net's source
        3
        >>> built_at(Net(), "2") is None  # no such submodule
        True
    """
    modules = dict(model.named_modules())
    module = modules.get(name)
    if module is None:
        return None
    found = _construction(name, module, modules)
    return found.switched_at or found.at


@dataclass(frozen=True)
class _Found:
    at: Location | None = None
    code: str = ""
    fixed: str = ""
    switched_at: Location | None = None
    in_container: bool = False


def _owners(name: str) -> list[str]:
    """Qualified names of the modules that hold ``name``, nearest first ('' the model)."""
    parts = name.split(".") if name else []
    return [".".join(parts[:k]) for k in range(len(parts) - 1, -1, -1)]


def _user_classes(module: nn.Module) -> list[type]:
    return [c for c in type(module).__mro__ if c not in (object, nn.Module)]


def _construction(name: str, module: nn.Module, modules: Mapping[str, nn.Module]) -> _Found:
    """Where ``module`` (qualified ``name``) was built: a call of its class in the source
    of the user's classes that own it, nearest owner first; where ``inplace`` was switched
    on after; else where its container was built."""
    kind = type(module)
    inplace = getattr(module, "inplace", None)
    inplace = inplace if isinstance(inplace, bool) else None
    call: _Call | None = None
    switched: Location | None = None
    for owner in _owners(name):
        holder = modules.get(owner)
        classes = _user_classes(holder) if holder is not None else []
        attribute = name[len(owner):].lstrip(".").split(".")[0]
        own = [s for cls in classes for s in _sources(cls)]
        assigned, others = _helper_sources(tuple(classes), attribute) if own else ((), ())
        # nearest first: a call assigned to the attribute (``self.body = nn.Sequential(...)``
        # or ``self.body = make_block(...)``), then any call in the class, then any helper;
        # not another call in the class when a helper of the user's built the attribute
        named = bool(assigned)
        for source, within in [*((s, attribute) for s in own), *((s, None) for s in assigned),
                               *((s, None) for s in own if not named),
                               *((s, None) for s in others)]:
            call = call or source.call_of(kind, within, inplace)
            switched = switched or source.switch
        if call is not None:
            break
    if call is not None:
        return _Found(call.at, call.code, call.fixed,
                      switched if not call.passes_inplace else None)
    parent = _owners(name)[0] if name else None
    if parent is not None and parent in modules and parent:
        found = _construction(parent, modules[parent], modules)
        return _Found(found.at, found.code, "", switched or found.switched_at,
                      in_container=found.at is not None)
    return _Found(switched_at=switched)


@functools.lru_cache(maxsize=256)
def _helper_sources(classes: tuple[type, ...], attribute: str
                    ) -> tuple[tuple[_Source, ...], tuple[_Source, ...]]:
    """The parsed source of the user's functions that ``classes`` call, to a depth of
    :data:`_HELPER_DEPTH` (a container built by ``self.mlp = make_mlp(16)`` was built in
    ``make_mlp``): those called in an assignment to ``.attribute`` and what they call, and
    the others."""
    assigned: list[_Source] = []
    others: list[_Source] = []
    seen: set[object] = set()
    frontier: list[tuple[_Source, Mapping[str, object], bool]] = [
        (s, {**_namespace(cls), "self": cls}, False)  # (self.method())
        for cls in classes for s in _sources(cls)]
    for depth in range(_HELPER_DEPTH):
        called: list[tuple[_Source, Mapping[str, object], bool]] = []
        for source, namespace, inherited in frontier:
            for call, targets in zip(source.calls, source.assigned, strict=True):
                function = _resolve(call.func, namespace)
                if function is None or function in seen:
                    continue
                seen.add(function)
                near = inherited or (depth == 0 and attribute in targets)
                called += [(parsed, function.__globals__, near)
                           for parsed in _function_sources(function)]
        assigned += [parsed for parsed, _, near in called if near]
        others += [parsed for parsed, _, near in called if not near]
        frontier = called
    return tuple(assigned), tuple(others)


#: how many calls deep :func:`_helper_sources` follows the user's helper functions
_HELPER_DEPTH = 3


def _namespace(cls: type) -> Mapping[str, object]:
    module = sys.modules.get(cls.__module__)
    return vars(module) if module is not None else {}


def _resolve(func: ast.expr, namespace: Mapping[str, object]) -> types.FunctionType | None:
    """The user's Python function a call's callee names (``make_mlp``, ``helpers.make_mlp``)
    in ``namespace``; None for anything else (classes, methods, library functions)."""
    parts: list[str] = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    value = namespace.get(func.id)
    for part in reversed(parts):
        if not isinstance(value, types.ModuleType | type):
            return None
        value = getattr(value, part, None)
    while isinstance(value, functools.partial):
        value = value.func
    if not isinstance(value, types.FunctionType):
        return None
    path = value.__code__.co_filename
    return None if is_internal(path) else value


@functools.lru_cache(maxsize=256)
def _function_sources(function: types.FunctionType) -> tuple[_Source, ...]:
    try:
        parsed = _parse(inspect.getsourcefile(function), *inspect.getsourcelines(function))
    except (OSError, TypeError):
        return ()
    return (parsed,) if parsed is not None else ()


@dataclass(frozen=True)
class _Call:
    at: Location
    code: str  # as written, on one line
    fixed: str  # with inplace=False ('' when it passes no inplace)
    passes_inplace: bool


@dataclass(frozen=True)
class _Source:
    path: str
    start: int
    text: str
    calls: tuple[ast.Call, ...]
    switch: Location | None  # the first `x.inplace = True` in the class

    assigned: tuple[frozenset[str], ...] = ()  # per call: the attributes its value is assigned to
    attributes: frozenset[str] = frozenset()  # every attribute the source assigns

    def call_of(self, kind: type, within: str | None = None,
                inplace: bool | None = None) -> _Call | None:
        """The first call of ``kind`` (by name) in the class, one passing ``inplace`` first;
        with ``within``, only calls in an assignment to ``.within``; with ``inplace`` (the
        module's own), none that passes the other value as a literal (another module)."""
        named = [n for n, targets in zip(self.calls, self.assigned, strict=True)
                 if _callee(n) == kind.__name__ and (within is None or within in targets)
                 and (inplace is None or _literal_inplace(n, kind) in (None, inplace))]
        chosen = next((n for n in named if _inplace_argument(n, kind) is not None),
                      named[0] if named else None)
        if chosen is None:
            return None
        code = " ".join((ast.get_source_segment(self.text, chosen) or ast.unparse(chosen)).split())
        position = _inplace_argument(chosen, kind)
        fixed = ""
        if position is not None:
            copy = ast.parse(ast.unparse(chosen), mode="eval").body
            if isinstance(copy, ast.Call):
                if isinstance(position, int):
                    copy.args[position] = ast.Constant(False)
                for k in copy.keywords:
                    if k.arg == "inplace":
                        k.value = ast.Constant(False)
            fixed = ast.unparse(copy)
        return _Call(Location(self.path, self.start + chosen.lineno - 1), code, fixed,
                     position is not None)


def _callee(n: ast.Call) -> str:
    f = n.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _literal_inplace(n: ast.Call, kind: type) -> bool | None:
    """The ``inplace`` a call of ``kind`` passes as a literal True/False; None otherwise."""
    position = _inplace_argument(n, kind)
    if position is None:
        return None
    value = n.args[position] if isinstance(position, int) else \
        next(k.value for k in n.keywords if k.arg == "inplace")
    return value.value if isinstance(value, ast.Constant) and isinstance(value.value, bool) \
        else None


def _inplace_argument(n: ast.Call, kind: type) -> int | str | None:
    """Where a call of ``kind`` passes ``inplace``: "keyword", its position, or None."""
    if any(k.arg == "inplace" for k in n.keywords):
        return "keyword"
    try:
        names = [p for p in inspect.signature(kind).parameters]
    except (TypeError, ValueError):
        return None
    if "inplace" in names and names.index("inplace") < len(n.args) \
            and not any(isinstance(a, ast.Starred) for a in n.args):
        return names.index("inplace")
    return None


@functools.lru_cache(maxsize=256)
def _sources(cls: type) -> tuple[_Source, ...]:
    """The parsed source of the user's class ``cls`` (none for library classes): the class
    as a whole, or, where Python cannot find it (a module loaded from a file path and
    not registered, a notebook), each of its methods."""
    try:
        return tuple(s for s in [_parse(inspect.getsourcefile(cls),
                                        *inspect.getsourcelines(cls))] if s is not None)
    except (OSError, TypeError):
        pass
    found = []
    for value in vars(cls).values():
        function = getattr(value, "__func__", value)
        if not inspect.isfunction(function):
            continue
        try:
            parsed = _parse(inspect.getsourcefile(function), *inspect.getsourcelines(function))
        except (OSError, TypeError):
            continue
        if parsed is not None:
            found.append(parsed)
    return tuple(found)


def _parse(path: str | None, lines: list[str], start: int) -> _Source | None:
    if path is None or is_internal(path):
        return None
    text = textwrap.dedent("".join(lines))
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)),
                   key=lambda n: (n.lineno, n.col_offset))
    switch = next((Location(path, start + n.lineno - 1) for n in sorted(
        (n for n in ast.walk(tree) if isinstance(n, ast.Assign)), key=lambda n: n.lineno)
        if any(isinstance(t, ast.Attribute) and t.attr == "inplace" for t in n.targets)
        and not (isinstance(n.value, ast.Constant) and n.value.value is False)), None)
    targets: dict[int, set[str]] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign):
            names = {t.attr for t in n.targets if isinstance(t, ast.Attribute)}
            for inner in ast.walk(n.value):
                targets.setdefault(id(inner), set()).update(names)
    attributes = frozenset(t.attr for n in ast.walk(tree) if isinstance(n, ast.Assign)
                           for t in n.targets if isinstance(t, ast.Attribute))
    return _Source(path, start, text, tuple(calls), switch,
                   tuple(frozenset(targets.get(id(c), ())) for c in calls), attributes)
