"""Integer kernels: codes with their scales (:class:`QTensor`), products that multiply 8-bit
codes and accumulate in int32, sums of codes into int32, and the rounding that turns a
rescaled accumulator into the next point's codes.

A :class:`QTensor` holds what a quantization point rounded to: ``int8`` codes, a scale
(one per tensor or one per row) and a shift, so that each value is ``(code + shift) *
scale``. The shift carries the grid's zero point (asymmetric grids), its mid-rise half
step and, for 8-bit unsigned grids whose codes ``0..255`` do not fit ``int8``, the bias
of 128 the codes are stored with. Rows of a point with per-node widths carry their own
``(qmin, qmax)``.

Pure tensor functions: no torch.fx, no modules.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["QTensor", "int_matmul", "int_mm", "lsq_codes", "rounded_codes", "segment_sum"]


@dataclass
class QTensor:
    """Codes and how to read them: ``value = (codes + shift) * scale`` (row-wise where
    ``scale`` / ``shift`` have one entry per row).

    Args:
        codes (Tensor): ``int8`` codes (the grid's codes minus ``bias``).
        scale (Tensor): float32, ``()`` or one per row.
        shift (Tensor): float32, ``()`` or one per row: ``bias - zero_point + offset``.
        bias (int): what was subtracted from the grid's codes to fit ``int8`` (0 or 128).
        qmin, qmax (int or Tensor): the grid's code range (per row with per-node widths).
        bits (int or Tensor): bits per value (per row with per-node widths).
        scale_per_row (bool): whether the scale is one per row (stored with the values).
    """

    codes: Tensor
    scale: Tensor
    shift: Tensor
    bias: int
    qmin: Tensor | int
    qmax: Tensor | int
    bits: Tensor | int
    scale_per_row: bool = False
    #: the point that rounded them, when they are a model's stored input
    point: str = ""

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    def _rows(self, t: Tensor) -> Tensor:
        return t.view((-1,) + (1,) * (self.codes.dim() - 1)) if t.dim() else t

    def levels(self) -> Tensor:
        """``code + shift`` as float32 (the value in units of the scale)."""
        return self.codes.to(torch.float32) + self._rows(self.shift)

    def dequantize(self) -> Tensor:
        """The values, float32."""
        return self.levels() * self._rows(self.scale)

    def grid_codes(self) -> Tensor:
        """The grid's own codes (``qmin..qmax``; int16 so that 8-bit unsigned codes fit)."""
        return self.codes.to(torch.int16) + self.bias

    def with_codes(self, codes: Tensor) -> QTensor:
        return QTensor(codes, self.scale, self.shift, self.bias, self.qmin, self.qmax,
                       self.bits, self.scale_per_row)

    def index_rows(self, index: Tensor) -> QTensor:
        """The rows ``index`` (with their per-row scale, shift, range and width)."""
        def pick(v: Tensor | int) -> Tensor | int:
            return v.index_select(0, index) if isinstance(v, Tensor) and v.dim() else v
        return QTensor(self.codes.index_select(0, index), pick(self.scale),  # type: ignore[arg-type]
                       pick(self.shift), self.bias, pick(self.qmin), pick(self.qmax),  # type: ignore[arg-type]
                       pick(self.bits), self.scale_per_row)


def rounded_codes(y: Tensor, qmin: Tensor | int, qmax: Tensor | int, bias: int,
                  toward_zero: bool = False) -> Tensor:
    """``int8`` codes of ``clamp(round(y), qmin, qmax) - bias`` (``y`` in units of the step,
    mid-rise offset and zero point already applied); rounds half to even as the
    simulation does."""
    n = torch.trunc(y) if toward_zero else torch.round(y)
    n = _clamp(n, qmin, qmax)
    if bias:
        n = n.sub_(bias)
    return n.to(torch.int8)


def lsq_codes(y: Tensor, qmin: Tensor | int, qmax: Tensor | int, bias: int) -> Tensor:
    """``int8`` codes of ``round(clamp(y, qmin, qmax)) - bias``: a learned step's order
    (clamp, then round), which gives the same codes for whole-number bounds."""
    n = _clamp(y, qmin, qmax).round_()
    if bias:
        n = n.sub_(bias)
    return n.to(torch.int8)


def _clamp(y: Tensor, lo: Tensor | int, hi: Tensor | int) -> Tensor:
    if isinstance(lo, Tensor) and lo.dim():
        shape = (-1,) + (1,) * (y.dim() - 1)
        return torch.maximum(torch.minimum(y, hi.view(shape).to(y.dtype)),  # type: ignore[union-attr]
                             lo.view(shape).to(y.dtype))
    return y.clamp(float(lo), float(hi))  # type: ignore[arg-type]


def int_mm(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` of ``int8`` matrices, accumulated in ``int32``: ``torch._int_mm`` (any shape
    on the CPU since torch 2.12), else an ``int32`` product (exact, slower)."""
    if a.device.type == "cpu" or (a.shape[0] > 16 and a.shape[1] % 8 == 0
                                   and b.shape[1] % 8 == 0):
        try:
            return torch._int_mm(a, b)
        except (RuntimeError, NotImplementedError):  # pragma: no cover (other builds)
            pass
    return (a.to(torch.int32) @ b.to(torch.int32)) if a.numel() and b.numel() else \
        torch.zeros(a.shape[0], b.shape[1], dtype=torch.int32, device=a.device)


def int_matmul(x: QTensor, w: QTensor) -> Tensor:
    """``x @ w.T`` (``w`` one row per output channel, as a linear layer's weight) in float32
    units: the codes multiplied as ``int8`` and summed in ``int32``, then each output
    rescaled by the row's and the channel's scales; the shifts (zero points, mid-rise
    halves, stored biases) enter as exact corrections from the codes' row sums."""
    k = x.codes.shape[-1]
    lead = x.codes.shape[:-1]
    a = x.codes.reshape(-1, k)
    acc = int_mm(a, w.codes.t()).to(torch.float32)
    sx = x.shift.reshape(-1, 1) if x.shift.dim() else x.shift
    sw = w.shift.reshape(1, -1) if w.shift.dim() else w.shift
    if bool((sx != 0).any()):
        acc = acc + sx * w.codes.sum(1, dtype=torch.int32).to(torch.float32).view(1, -1)
    if bool((sw != 0).any()):
        acc = acc + a.sum(1, dtype=torch.int32).to(torch.float32).view(-1, 1) * sw
        acc = acc + (k * sx) * sw
    scale_x = x.scale.reshape(-1, 1) if x.scale.dim() else x.scale
    scale_w = w.scale.reshape(1, -1) if w.scale.dim() else w.scale
    out = acc * (scale_x * scale_w)
    return out.view(*lead, -1)


def segment_sum(codes: Tensor, index: Tensor, num_nodes: int) -> Tensor:
    """``int32`` sums of the rows of ``codes`` (``int8``) into ``num_nodes`` rows by
    ``index``. ``index_add_`` into ``int32``: of the integer routes torch has on the CPU
    (``scatter_add_``, a cumulative sum over sorted rows; its sparse products and
    ``segment_reduce`` take no integers) the one measured fastest."""
    out = torch.zeros((num_nodes,) + tuple(codes.shape[1:]), dtype=torch.int32,
                      device=codes.device)
    if codes.shape[0]:
        out.index_add_(0, index, codes.to(torch.int32))
    return out
