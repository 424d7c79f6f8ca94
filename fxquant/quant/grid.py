"""What an integer quantization point rounds to, as integer codes and a step: the read
interface for converting a trained model to integer kernels.

:meth:`fxquant.QuantPoint.grid` gives an :class:`IntegerGrid`; its :meth:`~IntegerGrid.codes`
are the integers a tensor rounds to in evaluation and :meth:`~IntegerGrid.values` turns
them back into exactly what the point returns (``torch.equal``; a signed grid's zero may
come back as ``+0.0`` where the point gives ``-0.0``). Stochastic rounding draws its own
numbers here, so only its grid is the point's, not its draws.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fxquant.formats import IntFormat
from fxquant.modes import AnyScale, Rounding

__all__ = ["SOURCES", "IntegerGrid"]

#: where a grid's step comes from
SOURCES = ("learned", "stored", "data", "none")


@dataclass(frozen=True)
class IntegerGrid:
    """An integer grid: ``value = (code - zero_point + offset) * step`` for codes in
    ``[qmin, qmax]``.

    Attributes:
        format (IntFormat): bits, signed, asymmetric (a zero point) or mid-rise (levels
            ``code + 1/2``, :attr:`offset`).
        rounding (Rounding): ``nearest`` (half to even), ``toward_zero`` or ``stochastic``.
        scale (Scale or ScaleKind): how steps are shared: ``Scale.TENSOR`` (one step),
            ``ROW`` (one per row), ``BLOCK32`` (one per block of 32 along the last dim,
            given here expanded to the tensor's shape), ``NONE`` (step 1), a ``-pow2``
            kind, or a registered :class:`~fxquant.modes.ScaleKind`.
        source (str): where the step comes from: ``"learned"`` (``range="lsq"``: the
            learned step), ``"stored"`` (a running or widened range kept in the point's
            state: the same step for every input), ``"data"`` (each tensor's own range,
            or a percentile of it), ``"none"`` (unscaled).
        step (Tensor): the step actually used, float32 (or the input's dtype for a
            learned step), shaped to broadcast against the values (``()``, ``(rows, 1,
            ...)``, or the values' shape).
        zero_point (Tensor or None): the code of 0, asymmetric formats only (broadcasts
            like ``step``; a float holding an integer).
        qmin, qmax (int or Tensor): the code range; per row (``(rows, 1, ...)``) with
            per-node widths or a node override (whose rows have their format's range).
        bits (Tensor or None): each row's bit-width with per-node widths, ``(rows,)``.
        reciprocal (bool): the codes are ``round(x * (1 / step) - offset) +
            zero_point`` (the registered op's way) rather than ``round(x / step -
            offset)`` (learned steps and per-node widths); the two differ by an ulp at a
            few ties.

    Example:
        >>> import fxquant
        >>> point = fxquant.QuantPoint(fxquant.QuantConfig("int2:midrise", scale="tensor"), "c")
        >>> grid = point.grid(torch.tensor([0.9, -0.2, 3.0]))
        >>> grid.offset, grid.qmin, grid.qmax, grid.step
        (0.5, -2, 1, tensor(2.))
        >>> grid.codes(torch.tensor([0.9, -0.2, 3.0])).tolist()
        [0, -1, 1]
    """

    format: IntFormat
    rounding: Rounding
    scale: AnyScale
    source: str
    step: Tensor
    zero_point: Tensor | None
    qmin: int | Tensor
    qmax: int | Tensor
    bits: Tensor | None
    reciprocal: bool

    @property
    def offset(self) -> float:
        """What a code stands for minus the code (0.5 on a mid-rise grid, else 0)."""
        return self.format.offset

    def codes(self, x: Tensor) -> Tensor:
        """The codes of ``x`` (int32) as the point rounds it in evaluation."""
        compute = self.step.dtype
        y = x.to(compute)
        y = y * torch.reciprocal(self.step) if self.reciprocal else y / self.step
        if self.offset:
            y = y - self.offset
        if not self.reciprocal:  # (learned steps clamp before rounding)
            y = torch.clamp(y, _bound(self.qmin, y), _bound(self.qmax, y))
        if self.rounding is Rounding.NEAREST:
            y = torch.round(y)
        elif self.rounding is Rounding.TOWARD_ZERO:
            y = torch.trunc(y)
        else:
            y = torch.floor(y + torch.rand_like(y))
        if self.zero_point is not None:
            y = y + self.zero_point
        y = torch.clamp(y, _bound(self.qmin, y), _bound(self.qmax, y))
        return torch.where(y == y, y, 0).to(torch.int32)  # (NaN has no code: 0)

    def values(self, codes: Tensor) -> Tensor:
        """What ``codes`` stand for: ``(codes - zero_point + offset) * step``."""
        c = codes.to(self.step.dtype)
        if self.zero_point is not None:
            c = c - self.zero_point
        if self.offset:
            c = c + self.offset
        return c * self.step


def _bound(bound: int | Tensor, like: Tensor) -> Tensor:
    return bound.to(like.dtype) if isinstance(bound, Tensor) else \
        torch.tensor(float(bound), dtype=like.dtype, device=like.device)
