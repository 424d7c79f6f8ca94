"""Inverted dropout with its mask drawn by one ``torch.rand`` call.

On CPU, ``torch.nn.functional.dropout`` draws its mask with ``bernoulli_``, and Inductor
compiles it to a random number per value generated one at a time; both take several times
as long as one vectorized ``torch.rand`` draw over the same values (about 45 ms against
13 ms for Cora's 2708 x 1433 input features on one thread).

``torch.ops.fxquant.uniform_`` is that draw, opaque to ``torch.compile``: compiled graphs
call the eager kernel, which follows ``torch.manual_seed`` as eager code does. It fills a
tensor in place, as ``Tensor.uniform_`` does, so that no graph pass merges two draws, and
is tagged ``nondeterministic_seeded``, so that none recomputes one.
:func:`apply` builds the dropout around it from plain tensor operations, which Inductor
fuses into one pass with what reads the result (the mask kept as ``bool`` for the
backward, as ``F.dropout`` keeps its own); ``torch.ops.fxquant.dropout`` is the same
dropout as one opaque op.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["apply", "dropout", "uniform_"]


def _scale(p: float) -> float:
    return 0.0 if p >= 1.0 else 1.0 / (1.0 - p)


@torch.library.custom_op("fxquant::uniform_", mutates_args=("out",),
                         schema="(Tensor(a!) out) -> ()",
                         tags=(torch.Tag.nondeterministic_seeded,))
def uniform_(out: Tensor) -> None:
    """Fills ``out`` with random numbers in ``[0, 1)`` (``Tensor.uniform_``, which
    ``torch.rand`` calls: a float32 ``out`` holds ``torch.rand(out.shape)``'s numbers under
    the same seed). In place: no graph pass merges two calls."""
    out.uniform_()


def _keep(x: Tensor, p: float) -> Tensor:
    """The dropout's mask: one float32 draw of ``x``'s shape, ``>= p``."""
    u = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    torch.ops.fxquant.uniform_(u)
    return u >= p


def apply(x: Tensor, p: float) -> Tensor:
    """``x * keep / (1 - p)`` with ``keep = u >= p`` for ``u`` one float32 ``torch.rand``
    draw of ``x``'s shape (all zeros at ``p = 1``): in eager, and compiled in float32, the
    values of ``torch.ops.fxquant.dropout(x, p)[0]`` under the same seed, bit for bit, from
    operations ``torch.compile`` fuses with what reads the result."""
    return x.mul(_keep(x, p)).mul_(_scale(p))


@torch.library.custom_op("fxquant::dropout", mutates_args=(), schema="(Tensor x, float p) "
                         "-> (Tensor, Tensor)")
def dropout(x: Tensor, p: float) -> tuple[Tensor, Tensor]:
    """``(x * keep / (1 - p), keep)`` with ``keep = rand >= p`` (float32 random numbers
    whatever ``x``'s dtype; all zeros at ``p = 1``); ``x`` floating point,
    ``0 <= p <= 1``."""
    keep = _keep(x, p)
    return x.mul(keep).mul_(_scale(p)), keep


@dropout.register_fake
def _(x: Tensor, p: float) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x), torch.empty_like(x, dtype=torch.bool)


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple[Tensor, float],
                   output: tuple[Tensor, Tensor]) -> None:
    ctx.save_for_backward(output[1])
    ctx.p = inputs[1]  # type: ignore[attr-defined]
    ctx.mark_non_differentiable(output[1])


def _backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor, _grad_keep: Tensor | None
              ) -> tuple[Tensor, None]:
    (keep,) = ctx.saved_tensors  # type: ignore[attr-defined]
    return grad * keep * _scale(ctx.p), None  # type: ignore[attr-defined]


dropout.register_autograd(_backward, setup_context=_setup_context)
