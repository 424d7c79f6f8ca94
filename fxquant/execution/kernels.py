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

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["CHUNK", "QTensor", "codes_of", "f32", "int_matmul", "int_mm", "number", "per_row",
           "segment_sum"]

#: values per chunk of :func:`codes_of` (its float32 scratch stays in cache)
CHUNK = 1 << 16


@dataclass
class QTensor:
    """Codes and how to read them: ``value = (codes + shift) * scale`` (row-wise where
    ``scale`` / ``shift`` have one entry per row).

    Args:
        codes (Tensor): ``int8`` codes (the grid's codes minus ``bias``).
        scale (Tensor or float): one number, or float32 with one per row.
        shift (Tensor or float): one number, or one per row: ``bias - zero_point +
            offset``.
        bias (int): what was subtracted from the grid's codes to fit ``int8`` (0 or 128).
        qmin, qmax (int or Tensor): the grid's code range (per row with per-node widths).
        bits (int or Tensor): bits per value (per row with per-node widths).
        scale_per_row (bool): whether the scale is one per row (stored with the values).
    """

    codes: Tensor
    scale: Tensor | float
    shift: Tensor | float
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

    def _rows(self, t: Tensor | float) -> Tensor | float:
        return t.view((-1,) + (1,) * (self.codes.dim() - 1)) if per_row(t) else t  # type: ignore[union-attr]

    def levels(self) -> Tensor:
        """``code + shift`` as float32 (the value in units of the scale)."""
        codes = self.codes.to(torch.float32)
        if not per_row(self.shift) and number(self.shift) == 0.0:
            return codes
        return codes + self._rows(self.shift)

    def dequantize(self) -> Tensor:
        """The values, float32."""
        return self.levels().mul_(self._rows(self.scale))  # (levels() is a new tensor)

    def grid_codes(self) -> Tensor:
        """The grid's own codes (``qmin..qmax``; int16 so that 8-bit unsigned codes fit)."""
        return self.codes.to(torch.int16) + self.bias

    def with_codes(self, codes: Tensor) -> QTensor:
        return QTensor(codes, self.scale, self.shift, self.bias, self.qmin, self.qmax,
                       self.bits, self.scale_per_row)

    def slice_rows(self, start: int, stop: int) -> QTensor:
        """The rows ``start:stop`` (views of the codes and per-row terms)."""
        return self._rows_by(lambda t: t[start:stop])

    def index_rows(self, index: Tensor) -> QTensor:
        """The rows ``index`` (with their per-row scale, shift, range and width)."""
        return self._rows_by(lambda t: t.index_select(0, index))

    def _rows_by(self, select: Callable[[Tensor], Tensor]) -> QTensor:
        """Some rows: ``select`` applied to the codes and to every per-row term."""
        def pick(v: Any) -> Any:
            return select(v) if isinstance(v, Tensor) and v.dim() else v
        return QTensor(select(self.codes), pick(self.scale), pick(self.shift), self.bias,
                       pick(self.qmin), pick(self.qmax), pick(self.bits), self.scale_per_row)


def f32(value: float) -> float:
    """``value`` rounded to the nearest float32 (a scale computed in Python's float64 from
    float32 operands, rounded once, is the float32 operation's result)."""
    return struct.unpack("f", struct.pack("f", value))[0]


def codes_of(v: Tensor, factor: float | Tensor, *, divide: bool = False, offset: float = 0.0,
             zero_point: float | Tensor | None = None, qmin: Tensor | int = -128,
             qmax: Tensor | int = 127, bias: int = 0, toward_zero: bool = False) -> Tensor:
    """``int8`` codes ``clamp(round(v * factor - offset) + zero_point, qmin, qmax) - bias``
    (``v / factor`` with ``divide``; ``trunc`` for ``toward_zero``), in the simulation's
    order of float32 operations. ``factor``, ``zero_point``, ``qmin`` and ``qmax`` are one
    number or one per row (dim 0). Computed over chunks of rows in a float32 scratch that
    stays in cache, written straight into the ``int8`` result."""
    if not v.numel():
        return torch.empty(v.shape, dtype=torch.int8, device=v.device)
    rows = v.shape[0] if v.dim() else 1
    flat = v.reshape(rows, -1)
    width = flat.shape[1]
    step = max(1, CHUNK // max(width, 1))
    per = [isinstance(t, Tensor) and t.dim() > 0 for t in (factor, zero_point, qmin, qmax)]
    lo_f = float(qmin) if not per[2] else 0.0
    hi_f = float(qmax) if not per[3] else 0.0

    def chunk(start: int, stop: int, buf: Tensor | None) -> Tensor:
        part = flat[start:stop] if (start, stop) != (0, rows) else flat

        def rows_of(t: Tensor) -> Tensor:
            t = t if (start, stop) == (0, rows) else t[start:stop]
            return t.view(-1, 1).to(torch.float32)

        f = rows_of(factor) if per[0] else factor  # type: ignore[arg-type]
        op = torch.div if divide else torch.mul
        y = op(part, f) if buf is None else op(part, f, out=buf)
        if offset:
            y.sub_(offset)
        y.trunc_() if toward_zero else y.round_()
        if zero_point is not None:
            y.add_(rows_of(zero_point) if per[1] else zero_point)  # type: ignore[arg-type]
        if per[2] or per[3]:
            torch.maximum(y, rows_of(qmin) if per[2] else torch.tensor(lo_f, device=y.device), out=y)  # type: ignore[arg-type]
            torch.minimum(y, rows_of(qmax) if per[3] else torch.tensor(hi_f, device=y.device), out=y)  # type: ignore[arg-type]
        else:
            y.clamp_(lo_f, hi_f)
        if bias:
            y.sub_(bias)
        return y

    if rows <= step:  # one chunk: no scratch, no copy
        return chunk(0, rows, None).to(torch.int8).view(v.shape)
    out = torch.empty(v.shape, dtype=torch.int8, device=v.device)
    dest = out.view(rows, -1)
    scratch = torch.empty(step, width, dtype=torch.float32, device=v.device)
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        dest[start:stop].copy_(chunk(start, stop, scratch[:stop - start]))
    return out


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
    a = x.codes.reshape(lead.numel(), k)
    acc = int_mm(a, w.codes.t()).to(torch.float32)
    sx = x.shift.reshape(-1, 1) if per_row(x.shift) else number(x.shift)  # type: ignore[union-attr]
    sw = w.shift.reshape(1, -1) if per_row(w.shift) else number(w.shift)  # type: ignore[union-attr]
    if _nonzero(sx):
        acc = acc + sx * w.codes.sum(1, dtype=torch.int32).to(torch.float32).view(1, -1)
    if _nonzero(sw):
        acc = acc + a.sum(1, dtype=torch.int32).to(torch.float32).view(-1, 1) * sw
        acc = acc + (k * sx) * sw
    scale_x = x.scale.reshape(-1, 1) if per_row(x.scale) else number(x.scale)  # type: ignore[union-attr]
    scale_w = w.scale.reshape(1, -1) if per_row(w.scale) else number(w.scale)  # type: ignore[union-attr]
    out = acc * (scale_x * scale_w)
    return out.view(*lead, w.codes.shape[0])


def _nonzero(t: Tensor | float) -> bool:
    return bool((t != 0).any()) if isinstance(t, Tensor) else t != 0


def per_row(t: Tensor | float) -> bool:
    """Whether a scale or shift has one entry per row (else it is one number)."""
    return isinstance(t, Tensor) and t.dim() > 0


def number(t: Tensor | float) -> float:
    """A one-number scale or shift as a Python float."""
    return float(t) if isinstance(t, Tensor) else t


def segment_sum(codes: Tensor, index: Tensor, num_nodes: int) -> Tensor:
    """``int32`` sums of the rows of ``codes`` (``int8``) into ``num_nodes`` rows by
    ``index``. ``index_add_`` into ``int32``: of the integer routes torch has on the CPU
    (``scatter_add_``, a cumulative sum over sorted rows; its sparse products and
    ``segment_reduce`` take no integers) the one measured fastest."""
    out = torch.zeros((num_nodes, *codes.shape[1:]), dtype=torch.int32,
                      device=codes.device)
    if codes.shape[0]:
        out.index_add_(0, index, codes.to(torch.int32))
    return out
