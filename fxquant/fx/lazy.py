"""Lazy layers (``GCNConv(-1, 16)``, ``nn.LazyLinear``): refused, with what to do, before a
trace, a transform or a recipe touches them.

A lazy layer's parameters are :class:`torch.nn.parameter.UninitializedParameter` until its
first forward gives them a shape. Tracing, copying or rewriting the model before that fails
inside torch ("Attempted to use an uninitialized parameter"); :func:`refuse_lazy` names the
tensor and the fix instead.
"""

from __future__ import annotations

from torch import nn

from fxquant.errors import FxquantValueError

__all__ = ["refuse_lazy"]


def refuse_lazy(model: nn.Module, api: str) -> None:
    """Raise where ``model`` holds a parameter or buffer still uninitialized (a lazy layer
    that has not run yet), naming it, ``fxquant.{api}``, and the fix: run the model once.

    Args:
        model (torch.nn.Module): the model handed to fxquant.
        api (str): the call, as the user wrote it after ``fxquant.`` (``"trace"``,
            ``"recipes.LsqProtect.prepare"``).

    Example:
        >>> refuse_lazy(nn.Sequential(nn.LazyLinear(4)), "trace")
        Traceback (most recent call last):
        ...
        fxquant.errors.FxquantValueError: fxquant.trace: the tensor '0.weight' is not \
initialized yet (a lazy layer, e.g. GCNConv(-1, 16) or nn.LazyLinear, takes its shape from \
the first forward); please run the model once on example inputs, then call fxquant.trace
    """
    if not isinstance(model, nn.Module):  # (the caller's own check names what it takes)
        return
    lazy = next((name for name, p in (*model.named_parameters(), *model.named_buffers())
                 if nn.parameter.is_lazy(p)), None)
    if lazy is not None:
        raise FxquantValueError(
            f"fxquant.{api}: the tensor {lazy!r} is not initialized yet (a lazy layer, "
            "e.g. GCNConv(-1, 16) or nn.LazyLinear, takes its shape from the first forward); "
            f"please run the model once on example inputs, then call fxquant.{api}")
