"""Inverted dropout with its mask drawn by one ``torch.rand`` call.

On CPU, ``torch.nn.functional.dropout`` draws its mask with ``bernoulli_``, and Inductor
compiles it to a random number per value generated one at a time; both take several times
as long as one vectorized ``torch.rand`` draw over the same values (about 45 ms against
13 ms for Cora's 2708 x 1433 input features on one thread).

``torch.ops.fxquant.uniform`` is that draw, opaque to ``torch.compile``: compiled graphs
call the eager kernel, which follows ``torch.manual_seed`` as eager code does (tagged
``nondeterministic_seeded``, so that no graph pass merges two draws or recomputes one).
:func:`apply` builds the dropout around it from plain tensor operations, which Inductor
fuses into one pass with what reads the result (the mask kept as ``bool`` for the
backward, as ``F.dropout`` keeps its own); ``torch.ops.fxquant.dropout`` is the same
dropout as one opaque op.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["apply", "dropout", "uniform"]


def _scale(p: float) -> float:
    return 0.0 if p >= 1.0 else 1.0 / (1.0 - p)


@torch.library.custom_op("fxquant::uniform", mutates_args=(), schema="(Tensor like) -> Tensor",
                         tags=(torch.Tag.nondeterministic_seeded,))
def uniform(like: Tensor) -> Tensor:
    """float32 random numbers in ``[0, 1)`` (``torch.rand``) of ``like``'s shape, on its
    device; ``like``'s values are not read."""
    return torch.rand(like.shape, dtype=torch.float32, device=like.device)


@uniform.register_fake
def _(like: Tensor) -> Tensor:
    return torch.empty(like.shape, dtype=torch.float32, device=like.device)


def apply(x: Tensor, p: float) -> Tensor:
    """``x * keep / (1 - p)`` with ``keep = uniform >= p`` (all zeros at ``p = 1``): the
    values of ``torch.ops.fxquant.dropout(x, p)[0]`` under the same seed, bit for bit,
    from operations ``torch.compile`` fuses."""
    keep = torch.ops.fxquant.uniform(x.detach()) >= p
    return x * keep * _scale(p)


@torch.library.custom_op("fxquant::dropout", mutates_args=(), schema="(Tensor x, float p) "
                         "-> (Tensor, Tensor)")
def dropout(x: Tensor, p: float) -> tuple[Tensor, Tensor]:
    """``(x * keep / (1 - p), keep)`` with ``keep = rand >= p`` (float32 random numbers
    whatever ``x``'s dtype; all zeros at ``p = 1``); ``x`` floating point,
    ``0 <= p <= 1``."""
    keep = uniform(x) >= p
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
