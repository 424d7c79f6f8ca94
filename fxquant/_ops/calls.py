"""Recognise a call of one of fxquant's registered ops and read its arguments by name.

This is the one place outside the op definitions that reads their arguments: both lints
(the symbolic one on FX nodes, the dynamic one on dispatched calls) and the summary ask
it, instead of indexing arguments by position. Binding is Python's own
(:meth:`inspect.Signature.bind`) on the functions that define the ops, whose names and
defaults are the schema's.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import torch

from fxquant._ops import quantize as _quantize
from fxquant._ops import truncate as _truncate
from fxquant.modes import Grad

__all__ = ["OPS", "OpCall", "op_call"]

#: The registered ops by name: their default overload and Python signature.
OPS: Final[dict[str, tuple[Any, inspect.Signature]]] = {
    "truncate": (torch.ops.fxquant.truncate.default, _truncate.SIGNATURE),
    "quantize": (torch.ops.fxquant.quantize.default, _quantize.SIGNATURE),
}


@dataclass(frozen=True)
class OpCall:
    """A call of ``fxquant::truncate`` or ``fxquant::quantize``, arguments bound by name."""

    op: str
    arguments: Mapping[str, Any]

    @property
    def grad(self) -> Grad:
        return Grad.parse(self.arguments["grad"])

    @property
    def zero_gradient(self) -> bool:
        """Whether the gradient rule is the true (zero) derivative of rounding."""
        return self.grad is Grad.ZERO


def op_call(target: object, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> OpCall | None:
    """The bound call if ``target`` is one of fxquant's ops (overload or packet), else None.

    Example:
        >>> call = op_call(torch.ops.fxquant.truncate.default, (torch.ones(2), 8), {"grad": "zero"})
        >>> call.op, call.arguments["rounding"], call.zero_gradient
        ('truncate', 'toward_zero', True)
        >>> op_call(torch.ops.aten.add.Tensor, (), {}) is None
        True
    """
    for name, (overload, signature) in OPS.items():
        if target is overload or target is overload.overloadpacket:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return OpCall(name, dict(bound.arguments))
    return None
