"""Gradient rules of the learned parameters of a quantization point (its step, its
per-node bit-widths): a clamp that lets a descent step come back, and a gradient that
skips non-finite values."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["clamp_inward", "finite_grad"]


class _ClampInward(torch.autograd.Function):
    """``x.clamp(lo, hi)`` whose gradient also reaches values outside the range, but only
    where a descent step moves them back in. A learned bit-width that an optimizer's
    momentum carried below ``min_bits`` would get no gradient from a plain clamp and stay
    at ``min_bits`` for good, whatever the penalty or the loss say; a straight-through
    clamp would let it drift further out on gradients that cannot change the forward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, lo: float, hi: float) -> Tensor:
        ctx.save_for_backward(x)
        ctx.lo, ctx.hi = lo, hi
        return x.clamp(lo, hi)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (x,) = ctx.saved_tensors
        back = x.clamp(ctx.lo, ctx.hi) - x  # 0 inside the range (NaN for NaN x)
        inward = (back == 0) | (back * grad < 0)  # (a descent step moves x by -grad)
        return torch.where(inward, grad, 0.0), None, None


class _FiniteGrad(torch.autograd.Function):
    """The identity, whose gradient is 0 where it is not finite: a learned step's
    gradient summed over values of which one was NaN is NaN, and would make the step NaN
    for good."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return torch.where(torch.isfinite(grad), grad, torch.zeros_like(grad))


def clamp_inward(x: Tensor, lo: float, hi: float) -> Tensor:
    """``x.clamp(lo, hi)``; its gradient reaches values outside ``[lo, hi]`` only where a
    descent step moves them back in.

    Example:
        >>> x = torch.tensor([0.0, 5.0, 9.0], requires_grad=True)
        >>> clamp_inward(x, 1.0, 8.0).sum().backward()
        >>> x.grad  # descent moves 0 further out (no gradient), 9 back in
        tensor([0., 1., 1.])
    """
    return _ClampInward.apply(x, lo, hi)


def finite_grad(x: Tensor) -> Tensor:
    """A copy of ``x`` whose gradient is 0 where the incoming gradient is not finite."""
    return _FiniteGrad.apply(x)
