"""Forward arguments fixed by name (``concrete_args``), as lint, check and
functionalize_inplace take them: the same idea as :func:`fxquant.trace`'s, where a fixed
argument specializes the traced graph; with example inputs the forward runs with it."""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn
from torch.fx import PH

from fxquant.errors import FxquantTypeError

__all__ = ["with_concrete_args"]


def with_concrete_args(model: nn.Module, example_inputs: tuple[Any, ...],
                       concrete_args: dict[str, Any] | None, api: str) -> tuple[Any, ...]:
    """``example_inputs`` with the arguments ``concrete_args`` fixes put in their places
    of ``model.forward``'s signature (the defaults of those between), positionally; a
    placeholder (``torch.fx.PH``) fixes nothing.

    Example:
        >>> class Model(torch.nn.Module):
        ...     def forward(self, x, scale=1.0, twice=False):
        ...         return x * scale * (2 if twice else 1)
        >>> with_concrete_args(Model(), (3,), {"twice": True}, "check")
        (3, 1.0, True)
    """
    if concrete_args is None:
        return example_inputs
    if not isinstance(concrete_args, dict):
        raise FxquantTypeError(f"fxquant.{api}: concrete_args must be a dict of forward "
                               f"arguments by name, got {type(concrete_args).__name__}")
    fixed = {k: v for k, v in concrete_args.items() if v is not PH}
    if not fixed:
        return example_inputs
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError) as e:
        raise FxquantTypeError(f"fxquant.{api}: concrete_args names forward arguments, but "
                               f"the signature of {type(model).__name__}.forward cannot be "
                               "read: please pass them positionally") from e
    names = list(signature.parameters)
    try:
        bound = signature.bind(*example_inputs, **fixed)
    except TypeError as e:
        raise FxquantTypeError(f"fxquant.{api}: concrete_args {sorted(fixed)} do not fit "
                               f"forward({', '.join(names)}) with {len(example_inputs)} example "
                               f"input(s): {e}") from e
    bound.apply_defaults()
    keyword_only = [k for k in bound.kwargs if k in fixed]
    if keyword_only:
        raise FxquantTypeError(f"fxquant.{api}: concrete_args {keyword_only} name keyword-only "
                               "arguments of forward, which fxquant passes positionally only; "
                               "please make them positional or leave them at their defaults")
    return tuple(bound.args)
