"""Custom ``autograd.Function`` backwards that write into the gradient they receive.

Autograd hands one gradient tensor to several consumers when a value fans out (``a + b``
passes the same tensor on to both sides). A custom backward that changes its incoming
gradient in place (``grad_output *= 2``, ``grad += 1``) then changes the gradient of
the other branches too, silently. PyTorch does not check it.

- :func:`gradient_writes`: the lines of a Function's ``backward`` that write in place into
  one of its gradient arguments (from its source, with ``ast``): what :func:`fxquant.lint`
  reports without running backward (FXQ015).
- :class:`GradientGuard`: during the check's protected backward, each custom node gets a
  copy of its incoming gradients (so the protected gradients are what the forward
  implies) and the copies' version counters say which backward wrote into them; the check
  compares with the real gradients to tell whether it changed any (FXQ012) or not (FXQ015).
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from fxquant.fx.locations import Location, is_internal
from fxquant.linter.rules import out_of_place
from fxquant.linter.torch_internals import (
    autograd_nodes,
    forward_class,
    is_custom_function_node,
    version,
)

__all__ = ["GradientGuard", "GradientWrite", "custom_functions", "gradient_hint",
           "gradient_writes"]


@dataclass(frozen=True)
class GradientWrite:
    """A line of a custom backward (or a tensor hook) that writes in place into an incoming
    gradient."""

    function: str  # the Function's class name
    where: Location
    code: str
    #: a tensor hook (``Tensor.register_hook`` at ``where``), not a custom backward
    hook: bool = False


@functools.lru_cache(maxsize=128)
def gradient_writes(function: type) -> tuple[GradientWrite, ...]:
    """The lines of ``function.backward`` that write in place into a gradient argument
    (or a name bound to one): ``g *= 2``, ``g[m] = 0``, ``g.mul_(2)``, ``g.zero_()``.

    Example:
        >>> import torch
        >>> class Twice(torch.autograd.Function):
        ...     @staticmethod
        ...     def forward(ctx, x):
        ...         return x * 2
        ...     @staticmethod
        ...     def backward(ctx, grad):
        ...         grad *= 2
        ...         return grad
        >>> [(w.function, w.code) for w in gradient_writes(Twice)]
        [('Twice', 'grad *= 2')]
    """
    backward = getattr(function, "backward", None)
    if backward is None:
        return ()
    try:
        path = inspect.getsourcefile(backward)
        lines, start = inspect.getsourcelines(backward)
    except (OSError, TypeError):
        return ()
    if path is None or is_internal(path):
        return ()
    source = textwrap.dedent("".join(lines))
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ()
    body = tree.body[0] if tree.body else None
    if not isinstance(body, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return ()
    grads = {a.arg for a in body.args.args[1:]}  # after ctx
    if body.args.vararg is not None:
        grads.add(body.args.vararg.arg)
    found: list[GradientWrite] = []
    for node in sorted(ast.walk(body), key=lambda n: getattr(n, "lineno", 0)):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) \
                and node.value.id in grads:
            grads |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        target = _written(node)
        if target is not None and target in grads:
            line = start + node.lineno - 1  # type: ignore[attr-defined]
            found.append(GradientWrite(function.__name__, Location(path, line),
                                       ast.get_source_segment(source, node) or ""))
    return tuple(found)


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _written(node: ast.AST) -> str | None:
    """The name a statement or call writes into in place, or None."""
    if isinstance(node, ast.AugAssign):
        return _root_name(node.target)
    if isinstance(node, ast.Assign):
        for target in node.targets:
            if isinstance(target, ast.Subscript):
                return _root_name(target)
        return None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        name = node.func.attr
        if name.endswith("_") and not name.startswith("_") and name not in (
                "requires_grad_", "retain_grad", "register_hook"):
            return _root_name(node.func.value)
    return None


def custom_functions(outputs: Any) -> list[Any]:
    """The custom Function nodes of the autograd graph behind ``outputs`` (tensors)."""
    return [node for node in autograd_nodes(outputs) if is_custom_function_node(node)]


@dataclass
class GradientGuard:
    """Hooks on the custom Function nodes behind ``outputs``: each gets copies of its
    incoming gradients, and :attr:`written` lists the Functions whose backward changed
    them (with the lines from :func:`gradient_writes`, or the ``def backward`` line)."""

    outputs: Any
    written: list[GradientWrite] = field(default_factory=list)
    _handles: list[Any] = field(default_factory=list, repr=False)

    def __enter__(self) -> GradientGuard:
        for node in custom_functions(self.outputs):
            copies: list[tuple[Tensor, int]] = []

            def pre(grads: tuple[Any, ...], copies: list[tuple[Tensor, int]] = copies
                    ) -> tuple[Any, ...]:
                fresh = tuple(g.clone() if isinstance(g, Tensor) else g for g in grads)
                copies[:] = [(g, version(g)) for g in fresh if isinstance(g, Tensor)]
                return fresh

            def post(grad_inputs: Any, grad_outputs: Any, node: Any = node,
                     copies: list[tuple[Tensor, int]] = copies) -> None:
                if any(version(g) != v for g, v in copies):
                    self._record(node)

            self._handles.append(node.register_prehook(pre))
            self._handles.append(node.register_hook(post))
        return self

    def _record(self, node: Any) -> None:
        function = forward_class(node)
        if function is None:
            return
        lines = gradient_writes(function)
        if not lines:
            where = _def_line(function)
            lines = (GradientWrite(function.__name__, where, "def backward(...)"),) \
                if where is not None else ()
        self.written += [w for w in lines if w not in self.written]

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _def_line(function: type) -> Location | None:
    try:
        path = inspect.getsourcefile(function.backward)  # type: ignore[attr-defined]
        _, start = inspect.getsourcelines(function.backward)  # type: ignore[attr-defined]
    except (OSError, TypeError):
        return None
    return Location(path, start) if path is not None else None


def gradient_hint(code: str) -> str:
    """How to write the gradient write ``code`` into a new tensor: the same statement out
    of place where it is an augmented assignment (``g *= 2`` -> ``g = g * 2``)."""
    rewritten = out_of_place(code)
    example = f"`{rewritten}`" if rewritten else "`grad = grad * 2` for `grad *= 2`"
    return (f"compute a new tensor instead of changing the gradient received: {example} "
            "(autograd may hand the same gradient tensor to other branches, which would "
            "see the change)")
