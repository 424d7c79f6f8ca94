"""A converted quantization point: float32 values in, the codes the trained point rounds
them to out (:class:`~fxquant.execution.kernels.QTensor`).

It computes what the point's evaluation forward computes, with the same float32
operations in the same order (so the codes match): the step learned, taken from an
observer's range, or from the min/max (percentile) of the values themselves, per tensor
or per row; per-node widths looked up by global node id; a mid-rise grid's half step and
an asymmetric grid's zero point.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from fxquant._ops.quantize import bounds_of, int_scale
from fxquant.errors import FxquantValueError
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
from fxquant.execution.kernels import CHUNK, QTensor, codes_of, f32
from fxquant.formats import IntFormat
from fxquant.modes import Scale
from fxquant.quant.observers import percentile_bounds

__all__ = ["IntQuantizer", "RoundPlan", "tensor_range"]

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
                num_nodes: int | None = None,
                bounds: Tensor | tuple[float, float] | None = None) -> QTensor:
        """The codes of ``v`` (float32). Rows are nodes (``ids``: their global ids), or, with
        ``row_nodes``, rows of the nodes ``row_nodes`` names (a message's target) among
        ``num_nodes``. ``bounds``: the ``(lo, hi)`` a range taken from the values would
        give, where the caller knows it (the values are a part of what the point rounds)."""
        v = _float32(v)
        n = num_nodes if num_nodes is not None else (v.shape[0] if v.dim() else 1)

        def node_range() -> Tensor:
            rows = _row_magnitudes(v)
            if row_nodes is None:
                return rows
            out = torch.zeros(n, dtype=rows.dtype, device=v.device)
            return out.scatter_reduce(0, row_nodes, rows, "amax")

        if bounds is None and self.needs_range:
            if self.spec.step_kind == STEP_PERCENTILE:
                assert self.spec.percentile is not None
                bounds = percentile_bounds(v, self.spec.percentile)
            elif self.spec.step_kind == STEP_BATCH:
                bounds = tensor_range(v)
        plan = self.plan(bounds, ids=ids, num_nodes=n, node_range=node_range)
        return plan.codes(v, row_nodes)

    @property
    def needs_range(self) -> bool:
        """Whether rounding needs the range of what it rounds (per tensor), computed from
        the values each forward."""
        return self.spec.step_kind in (STEP_BATCH, STEP_PERCENTILE)

    @property
    def code_range(self) -> tuple[int, int]:
        lo, hi = self.grid.code_range()
        return int(lo), int(hi)

    def plan(self, bounds: Tensor | tuple[float, float] | None = None, *,
             ids: Tensor | None = None,
             num_nodes: int = 0, node_range: Callable[[], Tensor] | None = None) -> RoundPlan:
        """How this point rounds in this forward: its step (from ``bounds``, the ``(lo,
        hi)`` of everything it rounds, where the step comes from the values; per row it
        comes from each row) and, with per-node widths, each node's width (by global id,
        ``num_nodes`` of them). The plan rounds any part of the values
        (:meth:`RoundPlan.codes`): messages chunk by chunk."""
        spec = self.spec
        node_bits = None
        if self.widths is not None:
            if ids is not None and ids.shape[0] != num_nodes:
                raise FxquantValueError(f"fxquant: node_ids has {ids.shape[0]} entries, but the "
                                        f"{spec.label} has {num_nodes} nodes; pass one global "
                                        "id per node of the batch (batch.n_id)")
            node_bits = node_widths(spec, ids, num_nodes, node_range)
        if spec.step_kind == STEP_LEARNED:
            assert self.step is not None
            return RoundPlan(self, self.step, None, node_bits, None, True)
        if spec.step_kind == STEP_OBSERVED:
            assert self.step is not None
            if node_bits is not None:
                return RoundPlan(self, None, None, node_bits, self.step, True)
            return RoundPlan(self, self.step, self.zero_point, None, None, False)
        if spec.step_kind == STEP_BATCH_ROW:
            return RoundPlan(self, None, None, node_bits, None, node_bits is not None)
        assert bounds is not None
        lo, hi = (float(b) for b in bounds.tolist()) if isinstance(bounds, Tensor) else bounds
        if node_bits is not None:
            return RoundPlan(self, None, None, node_bits,
                             torch.tensor(max(abs(lo), abs(hi), 0.0)), True)
        if spec.pow2:
            fmt = IntFormat(self.grid.bits, self.grid.signed, self.grid.asymmetric,
                            self.grid.midrise)
            scale_t, zp_t = int_scale(torch.tensor([lo, hi]), fmt, Scale.TENSOR_POW2)
            return RoundPlan(self, scale_t, zp_t, None, None, False)
        scale, zp = self._tensor_scale(lo, hi)
        return RoundPlan(self, scale, zp, None, None, False)

    def _tensor_scale(self, lo: float, hi: float) -> tuple[float, float | None]:
        """:func:`~fxquant._ops.quantize.int_scale` of one ``(lo, hi)``, in float32."""
        grid = self.grid
        qmin, qmax = self.code_range
        zp = None
        if grid.asymmetric:
            lo, hi = min(lo, 0.0), max(hi, 0.0)
            span, levels = f32(hi - lo), float(qmax - qmin)
        elif grid.signed:
            span, levels = max(abs(lo), abs(hi)), qmax + grid.offset
        else:
            span, levels = max(hi, 0.0), float(qmax)
        scale = f32(span / levels)
        if not (scale > 0 and math.isfinite(scale) and scale >= _TINY):
            scale = 1.0
        if grid.asymmetric:
            zp = float(min(max(qmin - round(f32(lo / scale)), qmin), qmax))
        return scale, zp


class RoundPlan:
    """A point's rounding in one forward, fixed: :meth:`codes` rounds any rows of what
    the point rounds (all of them, or a chunk of messages) as the whole would be.

    ``scale``: a per-tensor scale (multiplied by its reciprocal, as ``fxquant.quantize``
    does) or learned step (divided by, as LSQ does); None: per row (from each row's range,
    or from per-node widths). ``node_bits``: each node's width; ``amax``: the range a
    per-node step is taken from (``amax / (qmax_row + offset)``).
    """

    def __init__(self, quantizer: IntQuantizer, scale: float | Tensor | None,
                 zero_point: float | Tensor | None, node_bits: Tensor | None,
                 amax: Tensor | None, divide: bool) -> None:
        self.q = quantizer
        self.scale = scale
        self.zero_point = zero_point
        self.node_bits = node_bits
        self.amax = amax
        self.divide = divide

    def _terms(self, v: Tensor, row_nodes: Tensor | None) -> dict[str, Any]:
        """What :func:`~fxquant.execution.kernels.codes_of` needs for the rows ``v``."""
        q, grid = self.q, self.q.grid
        off = grid.offset
        if self.node_bits is not None:
            bits = self.node_bits if row_nodes is None else \
                self.node_bits.index_select(0, row_nodes)
            qmin_t, qmax_t = grid.code_range(bits)
            assert isinstance(qmin_t, Tensor) and isinstance(qmax_t, Tensor)
            if self.scale is not None:  # a learned step
                step = self.scale
            else:
                amax = self.amax if self.amax is not None else _row_magnitudes(v).clamp(min=0)
                step = (amax.reshape(-1) / (qmax_t.to(torch.float32) + off)).clamp(min=_TINY)
            return {"factor": step, "divide": True, "offset": off, "zero_point": None,
                    "qmin": qmin_t, "qmax": qmax_t, "scale": step, "bits": bits}
        qmin, qmax = q.code_range
        scale = self.scale
        zp = self.zero_point
        if scale is None:  # a range per row
            fmt = IntFormat(grid.bits, grid.signed, grid.asymmetric, grid.midrise)
            mode = Scale.ROW_POW2 if q.spec.pow2 else Scale.ROW
            scale, zp = int_scale(bounds_of(v, per_row=v.dim() > 0).to(torch.float32), fmt,
                                  mode)
        if self.divide:
            factor: float | Tensor = scale
        elif isinstance(scale, Tensor):
            factor = torch.reciprocal(scale)
        else:
            factor = f32(1.0 / scale)
        return {"factor": factor, "divide": self.divide, "offset": off, "zero_point": zp,
                "qmin": qmin, "qmax": qmax, "scale": scale, "bits": grid.bits}

    def codes(self, v: Tensor, row_nodes: Tensor | None = None) -> QTensor:
        """The codes of the rows ``v`` (rows of the nodes ``row_nodes``, or nodes in order
        where per-node widths apply)."""
        q = self.q
        v = _float32(v)
        t = self._terms(v, row_nodes)
        codes = codes_of(v, t["factor"], divide=t["divide"], offset=t["offset"],
                         zero_point=t["zero_point"], qmin=t["qmin"], qmax=t["qmax"],
                         bias=q.bias, toward_zero=q.spec.rounding == "toward_zero")
        scale = t["scale"]
        if isinstance(scale, Tensor):
            scale = scale.to(torch.float32)
            if not scale.dim():
                scale = float(scale)
        shift: Tensor | float = float(q.bias + t["offset"])
        zp = t["zero_point"]
        if self.node_bits is None and zp is not None:
            shift = shift - zp if not isinstance(zp, Tensor) or zp.dim() else shift - float(zp)
        per_row = q.spec.step_kind == STEP_BATCH_ROW if self.node_bits is not None \
            else isinstance(scale, Tensor)
        return QTensor(codes, scale, shift, q.bias, t["qmin"], t["qmax"], t["bits"], per_row)

    def near_boundary(self, v: Tensor, tolerance: float = 1e-4) -> Tensor:
        """The rows of ``v`` (rows of nodes) with a value within ``tolerance`` steps of a
        rounding boundary: where float32 rounding noise decides the code. Chunks of rows,
        so that the passes stay in cache: ``y = v * factor - offset`` lies near ``k + 1/2``
        where ``(y + 1/2 + tolerance) mod 1 < 2 tolerance``."""
        v = _float32(v)
        t = self._terms(v, None)
        rows = v.shape[0] if v.dim() else 1
        flat = v.reshape(rows, -1)
        out = torch.zeros(rows, dtype=torch.bool, device=v.device)
        if not flat.numel():
            return out
        f = t["factor"]
        per = isinstance(f, Tensor) and f.dim() > 0
        step = max(1, CHUNK // max(flat.shape[1], 1))
        for start in range(0, rows, step):
            part = flat[start:start + step]
            fs = f[start:start + step].view(-1, 1) if per else f
            y = part / fs if t["divide"] else part * fs
            y.add_(0.5 + tolerance - t["offset"]).remainder_(1.0)
            out[start:start + step] = (y < 2 * tolerance).any(1)
        return out


#: float32's smallest normal number (a step below it is taken as unusable)
_TINY = torch.finfo(torch.float32).tiny


def _float32(v: Tensor) -> Tensor:
    return v if v.dtype == torch.float32 else v.to(torch.float32)


def tensor_range(v: Tensor) -> tuple[float, float]:
    """``(lo, hi)`` of ``v``'s finite values (zeros where there are none), read once."""
    if not v.numel():
        return 0.0, 0.0
    lo_t, hi_t = torch.aminmax(v)
    lo, hi = lo_t.item(), hi_t.item()
    if math.isfinite(lo) and math.isfinite(hi):
        return lo, hi
    lo_t, hi_t = bounds_of(v, per_row=False).tolist()
    return float(lo_t), float(hi_t)


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
