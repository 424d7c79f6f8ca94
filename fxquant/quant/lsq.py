"""``s * round(clamp(x / s, qmin, qmax))`` with LSQ's gradients, as one autograd function.

The same values and gradients as the chain of torch ops (divide, clamp to the grid's
range, round with a straight-through gradient, multiply back), but autograd keeps only
``x`` and the small ``s``/``qmin``/``qmax`` instead of every intermediate, and the
backward is one expression instead of the chain's masks and ``where``\\ s (on a GCN with
learned per-node bits, the chain's backward was most of the quantization's time).

Gradients (Esser et al., "Learned Step Size Quantization", ICLR 2020), with ``u = x / s``:

- ``x``: ``grad`` where ``qmin <= u <= qmax``, else 0 (straight-through inside the range);
- ``s``: ``gain * sum(grad * d)`` with ``d = round(u) - u`` inside, ``qmin`` below and
  ``qmax`` above the range (``gain``: LSQ's ``1 / sqrt(numel * qmax)``);
- ``qmin`` / ``qmax`` (per-row ranges from learned bit-widths): ``s * grad`` summed over
  the values clamped at that bound.

Each is summed down to its input's shape, so ``s``, ``qmin`` and ``qmax`` may be scalars
or broadcast per row.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["lsq_round"]


def _reduce(grad: Tensor, like: Tensor, factor: float | Tensor = 1.0) -> Tensor:
    """``grad`` summed down to ``like``'s shape, times ``factor`` (after the sum)."""
    return (grad.sum_to_size(like.shape) * factor).to(like.dtype)


def _reduce_times(grad: Tensor, like: Tensor, s: Tensor) -> Tensor:
    """``(grad * s)`` summed down to ``like``'s shape: the product after the sum where
    ``s`` is one number or already has that shape."""
    if s.numel() == 1:
        return _reduce(grad, like, s.reshape(()))
    if s.shape == like.shape:
        return _reduce(grad, like, s)
    return _reduce(grad * s, like)


class _LsqRound(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, s: Tensor, qmin: Tensor, qmax: Tensor,
                gain: float) -> Tensor:
        sx = s.to(x.dtype)
        y = x / sx
        torch.minimum(y, qmax.to(x.dtype), out=y)
        torch.maximum(y, qmin.to(x.dtype), out=y)
        y.round_().mul_(sx)
        ctx.save_for_backward(x, s, qmin, qmax)
        ctx.gain = gain
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, s, qmin, qmax = ctx.saved_tensors
        sx, lo, hi = s.to(x.dtype), qmin.to(x.dtype), qmax.to(x.dtype)
        # (in place on fresh buffers, masks by comparison with the clamped value: a
        # `where` against a per-row range is the slowest step of the chain on the CPU)
        u = x / sx
        c = torch.clamp(u, lo, hi)
        outside = c != u
        grad_x = grad.masked_fill(outside, 0)
        grad_lo = grad_hi = None
        if qmin.requires_grad or qmax.requires_grad:
            # outside the range, above it where u > 0 (qmin <= 0 <= qmax)
            g_out = grad - grad_x
            g_hi = g_out.masked_fill_(u <= 0, 0) if not qmin.requires_grad else \
                g_out.masked_fill(u <= 0, 0)
            if qmax.requires_grad:
                grad_hi = _reduce_times(g_hi, qmax, sx)
            if qmin.requires_grad:
                grad_lo = _reduce_times(g_out.sub_(g_hi), qmin, sx)
        grad_s = None
        if s.requires_grad:  # d = round(u) - u inside, the bound outside
            d = c.round_().sub_(u.masked_fill_(outside, 0))
            grad_s = _reduce(d.mul_(grad), s, ctx.gain)
        return grad_x if ctx.needs_input_grad[0] else None, grad_s, grad_lo, grad_hi, None


def lsq_round(x: Tensor, s: Tensor, qmin: Tensor | float, qmax: Tensor | float,
              gain: float = 1.0) -> Tensor:
    """``s * round(clamp(x / s, qmin, qmax))`` (round half to even) with LSQ's gradients
    (see the module docstring); ``gain`` scales the gradient of ``s`` only.

    Example:
        >>> s = torch.tensor(0.5, requires_grad=True)
        >>> x = torch.tensor([0.3, -2.0, 0.74], requires_grad=True)
        >>> y = lsq_round(x, s, -2, 1)
        >>> y
        tensor([ 0.5000, -1.0000,  0.5000], grad_fn=<_LsqRoundBackward>)
        >>> y.sum().backward()
        >>> x.grad, s.grad
        (tensor([1., 0., 0.]), tensor(-0.6000))
    """
    lo = qmin if isinstance(qmin, Tensor) else torch.tensor(float(qmin), device=x.device)
    hi = qmax if isinstance(qmax, Tensor) else torch.tensor(float(qmax), device=x.device)
    return _LsqRound.apply(x, s, lo, hi, gain)
