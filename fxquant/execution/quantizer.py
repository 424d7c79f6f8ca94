"""A converted quantization point: float32 values in, the codes the trained point rounds
them to out (:class:`~fxquant.execution.kernels.QTensor`).

It computes what the point's evaluation forward computes, with the same float32
operations in the same order (so the codes match): the step learned, taken from an
observer's range, or from the min/max (percentile) of the values themselves, per tensor
or per row; per-node widths looked up by global node id; a mid-rise grid's half step and
an asymmetric grid's zero point.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from fxquant._ops.quantize import bounds_of, int_scale
from fxquant.execution._points import (
    STEP_BATCH,
    STEP_BATCH_ROW,
    STEP_LEARNED,
    STEP_OBSERVED,
    STEP_PERCENTILE,
    Grid,
    PointSpec,
    node_widths,
)
from fxquant.execution.kernels import QTensor, lsq_codes, rounded_codes
from fxquant.formats import IntFormat
from fxquant.modes import Scale
from fxquant.quant.observers import percentile_bounds

__all__ = ["IntQuantizer"]

#: the fields of a :class:`PointSpec` that are plain values (saved as JSON)
_META = ("module", "label", "layer", "site", "tensor", "rounding", "step_kind", "pow2",
         "per_row", "percentile", "min_bits", "max_bits", "widths_learned", "widths_stored",
         "protection")
_TENSORS = ("step", "zero_point", "widths", "seen_range")


class IntQuantizer(nn.Module):
    """Rounds float32 values to a trained point's codes.

    Args:
        spec (PointSpec): the point, as :func:`~fxquant.execution._points.read_point`
            reads it (its ``problems`` must be empty).
    """

    step: Tensor | None
    zero_point: Tensor | None
    widths: Tensor | None
    seen_range: Tensor | None

    def __init__(self, spec: PointSpec) -> None:
        super().__init__()
        assert spec.grid is not None and not spec.problems
        self.spec = spec
        self.grid: Grid = spec.grid
        for name in _TENSORS:
            value = getattr(spec, name)
            self.register_buffer(name, None if value is None else value.clone())
        top = self.grid.code_range(spec.max_bits if spec.widths is not None else None)[1]
        #: subtracted from the grid's codes so that they fit int8 (8-bit unsigned grids)
        self.bias = 128 if int(top) > 127 else 0

    # -- saving ---------------------------------------------------------------------------

    def meta(self) -> dict[str, Any]:
        """What :meth:`from_meta` rebuilds it from (the tensors travel in the state dict)."""
        spec = self.spec
        out = {name: getattr(spec, name) for name in _META}
        out["grid"] = [self.grid.bits, self.grid.signed, self.grid.asymmetric, self.grid.midrise]
        out["tensors"] = [n for n in _TENSORS if getattr(self, n) is not None]
        return out

    @classmethod
    def from_meta(cls, meta: dict[str, Any], tensors: dict[str, Tensor]) -> IntQuantizer:
        values = {name: meta[name] for name in _META}
        values.update({name: tensors.get(name) for name in _TENSORS})
        spec = PointSpec(grid=Grid(*meta["grid"]), **values)
        return cls(spec)

    # -- rounding -------------------------------------------------------------------------

    def forward(self, v: Tensor, *, ids: Tensor | None = None, row_nodes: Tensor | None = None,
                num_nodes: int | None = None, bounds: Tensor | None = None) -> QTensor:
        """The codes of ``v`` (float32). Rows are nodes (``ids``: their global ids), or, with
        ``row_nodes``, rows of the nodes ``row_nodes`` names (a message's target) among
        ``num_nodes``. ``bounds``: the ``(lo, hi)`` a range taken from the values would
        give, where the caller knows it (the values are a part of what the point rounds)."""
        v = v.to(torch.float32)
        if self.widths is not None:
            return self._per_node(v, ids, row_nodes, num_nodes)
        spec, grid = self.spec, self.grid
        qmin, qmax = grid.code_range()
        off = grid.offset
        toward_zero = spec.rounding == "toward_zero"
        if spec.step_kind == STEP_LEARNED:
            assert self.step is not None
            s = self.step
            y = v / s
            if off:
                y = y.sub_(off)
            codes = lsq_codes(y, qmin, qmax, self.bias)
            zero = torch.zeros((), device=v.device)
            return QTensor(codes, s, zero + (self.bias + off), self.bias, qmin, qmax, grid.bits)
        scale, zp = self._scale(v, bounds)
        per_row = scale.dim() > 0
        shape = (-1,) + (1,) * (v.dim() - 1)
        inv = torch.reciprocal(scale)
        y = v * (inv.view(shape) if per_row else inv)
        if off:
            y = y.sub_(off)
        if zp is not None:  # round first, then the zero point (as the simulation does)
            n = torch.trunc(y) if toward_zero else torch.round(y)
            n = n + (zp.view(shape) if per_row else zp)
            codes = rounded_codes(n, qmin, qmax, self.bias)
        else:
            codes = rounded_codes(y, qmin, qmax, self.bias, toward_zero)
        shift = torch.full_like(scale, float(self.bias + off))
        if zp is not None:
            shift = shift - zp
        return QTensor(codes, scale, shift, self.bias, qmin, qmax, grid.bits, per_row)

    def _scale(self, v: Tensor, bounds: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """``(scale, zero point)``: fixed, or from the values (finite ones) as the point's
        evaluation takes it."""
        spec = self.spec
        fmt = IntFormat(self.grid.bits, self.grid.signed, self.grid.asymmetric,
                        self.grid.midrise)
        mode = Scale.ROW if spec.per_row else Scale.TENSOR
        if spec.pow2:
            mode = Scale.ROW_POW2 if spec.per_row else Scale.TENSOR_POW2
        if spec.step_kind == STEP_OBSERVED:
            assert self.step is not None
            return self.step, self.zero_point
        if bounds is not None:
            pass
        elif spec.step_kind == STEP_PERCENTILE:
            assert spec.percentile is not None
            bounds = percentile_bounds(v, spec.percentile)
        else:
            bounds = bounds_of(v, per_row=spec.step_kind == STEP_BATCH_ROW and v.dim() > 0)
        return int_scale(bounds.to(torch.float32), fmt, mode)

    def _per_node(self, v: Tensor, ids: Tensor | None, row_nodes: Tensor | None,
                  num_nodes: int | None) -> QTensor:
        """Rows on their own node's width (the point's ``_round_row_bits``)."""
        spec, grid = self.spec, self.grid
        n = num_nodes if num_nodes is not None else (v.shape[0] if v.dim() else 1)

        def node_range() -> Tensor:
            rows = _row_magnitudes(v)
            if row_nodes is None:
                return rows
            out = torch.zeros(n, dtype=rows.dtype, device=v.device)
            return out.scatter_reduce(0, row_nodes, rows, "amax")

        bits_nodes = node_widths(spec, ids, n, node_range)
        bits = bits_nodes if row_nodes is None else bits_nodes.index_select(0, row_nodes)
        qmin, qmax = grid.code_range(bits)
        assert isinstance(qmin, Tensor) and isinstance(qmax, Tensor)
        shape = (-1,) + (1,) * (v.dim() - 1)
        off = grid.offset
        if spec.step_kind == STEP_LEARNED:
            assert self.step is not None
            step: Tensor = self.step
            y = v / step
        else:
            if spec.step_kind == STEP_OBSERVED:
                assert self.step is not None
                amax = self.step
            elif spec.step_kind == STEP_BATCH_ROW and v.dim() > 0:
                amax = _row_magnitudes(v).clamp(min=0)
            elif spec.step_kind == STEP_PERCENTILE:
                assert spec.percentile is not None
                amax = percentile_bounds(v, spec.percentile).abs().amax()
            else:
                amax = _row_magnitudes(v.reshape(1, -1)).clamp(min=0)[0] if v.numel() \
                    else v.new_zeros(())
            step = (amax.view(-1) / (qmax.to(v.dtype) + off)).clamp(min=torch.finfo(v.dtype).tiny) \
                if amax.dim() or v.dim() else amax
            if step.dim() == 0:
                step = step.expand(v.shape[0] if v.dim() else 1)
            y = v / step.view(shape)
        if off:
            y = y - off
        codes = lsq_codes(y, qmin, qmax, self.bias)
        shift = torch.full((), float(self.bias + off), device=v.device)
        return QTensor(codes, step.to(torch.float32), shift, self.bias, qmin, qmax, bits,
                       spec.step_kind == STEP_BATCH_ROW)


def _row_magnitudes(x: Tensor) -> Tensor:
    """``max |value|`` of each row's finite values (0 for an empty row)."""
    if x.dim() == 0:
        return x.abs().reshape(1)
    flat = x.reshape(x.shape[0], -1)
    if flat.shape[1] == 0:
        return flat.new_zeros(flat.shape[0])
    mag = flat.abs()
    if not bool(torch.isfinite(mag).all()):
        mag = mag.nan_to_num(nan=0.0, posinf=0.0)
    return mag.amax(1)
