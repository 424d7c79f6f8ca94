"""A converted quantization point: float32 values in, the codes the trained point rounds
them to out (:class:`~fxquant.execution.kernels.QTensor`).

It computes what the point's evaluation forward computes, with the same float32
operations in the same order (so the codes match): the step learned, taken from an
observer's range, or from the min/max (percentile) of the values themselves, per tensor
or per row; per-node widths looked up by global node id; a mid-rise grid's half step and
an asymmetric grid's zero point. A step taken from a range is computed as the
simulation's :class:`~fxquant.quant.grid.IntegerGrid` gives it (``span / levels`` in
float32, the codes ``round(x * (1 / step))``); tests hold the two equal bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

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
from fxquant.execution.kernels import QTensor, codes_of, f32
from fxquant.quant.observers import percentile_bounds

__all__ = ["IntQuantizer", "RoundPlan", "finite_row_magnitudes", "tensor_range"]

#: the fields of a :class:`PointSpec` that are plain values (saved as JSON)
_META = ("module", "label", "layer", "site", "tensor", "rounding", "step_kind", "pow2",
         "per_row", "percentile", "min_bits", "max_bits", "widths_learned", "widths_stored",
         "protection", "reciprocal")
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
        values = {name: meta[name] for name in _META if name in meta}
        values.update({name: tensors.get(name) for name in _TENSORS})
        spec = PointSpec(grid=Grid(*meta["grid"]), **values)
        return cls(spec)

    # -- rounding -------------------------------------------------------------------------

    def forward(self, v: Tensor, *, ids: Tensor | None = None, row_nodes: Tensor | None = None,
                num_nodes: int | None = None,
                bounds: tuple[float, float] | None = None) -> QTensor:
        """The codes of ``v`` (float32). Rows are nodes (``ids``: their global ids), or, with
        ``row_nodes``, rows of the nodes ``row_nodes`` names (a message's target) among
        ``num_nodes``. ``bounds``: the ``(lo, hi)`` a range taken from the values would
        give, where the caller knows it (the values are a part of what the point rounds)."""
        v = _float32(v)
        n = num_nodes if num_nodes is not None else (v.shape[0] if v.dim() else 1)

        def node_range() -> Tensor:
            rows = finite_row_magnitudes(v)
            if row_nodes is None:
                return rows
            out = torch.zeros(n, dtype=rows.dtype, device=v.device)
            return out.scatter_reduce(0, row_nodes, rows, "amax")

        if bounds is None and self.needs_range:
            bounds = self.range_of(v)
        plan = self.plan(bounds, ids=ids, num_nodes=n, node_range=node_range)
        return plan.codes(v, row_nodes)

    @property
    def needs_range(self) -> bool:
        """Whether rounding needs the range of what it rounds (per tensor), computed from
        the values each forward."""
        return self.spec.step_kind in (STEP_BATCH, STEP_PERCENTILE)

    @property
    def zero_is_code(self) -> bool:
        """Whether zero is one of its codes whatever the step (a ReLU of the codes is then
        a clamp, and codes): not on a mid-rise grid (which has no zero), nor with a zero
        point per row."""
        return not self.grid.midrise and not (self.grid.asymmetric and
                                              self.spec.step_kind == STEP_BATCH_ROW)

    @property
    def reads_every_row(self) -> bool:
        """Whether its step reads every row of what it rounds (a range per row) or an order
        statistic of all of it (a percentile): where those values come from a product of
        codes, every row is needed as the simulation computes it, not only those near
        the extremes of one range."""
        return self.spec.step_kind in (STEP_BATCH_ROW, STEP_PERCENTILE)

    def range_of(self, v: Tensor) -> tuple[float, float]:
        """``(lo, hi)`` a step is taken from: the values' finite min and max, or their
        percentiles."""
        if self.spec.step_kind == STEP_PERCENTILE:
            assert self.spec.percentile is not None
            lo, hi = percentile_bounds(v, self.spec.percentile).tolist()
            return float(lo), float(hi)
        return tensor_range(v)

    @property
    def code_range(self) -> tuple[int, int]:
        lo, hi = self.grid.code_range()
        return int(lo), int(hi)

    def plan(self, bounds: tuple[float, float] | None = None, *, ids: Tensor | None = None,
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
            return RoundPlan(self, _scalar(self.step), None, node_bits, None, True)
        if spec.step_kind == STEP_OBSERVED:
            assert self.step is not None
            if node_bits is not None:
                return RoundPlan(self, None, None, node_bits, self.step, True)
            zp = None if self.zero_point is None else _scalar(self.zero_point)
            return RoundPlan(self, _scalar(self.step), zp, None, None, False)
        if spec.step_kind == STEP_BATCH_ROW:
            return RoundPlan(self, None, None, node_bits, None, node_bits is not None)
        assert bounds is not None
        lo, hi = float(bounds[0]), float(bounds[1])
        if node_bits is not None:
            return RoundPlan(self, None, None, node_bits,
                             torch.tensor(max(abs(lo), abs(hi), 0.0), device=node_bits.device),
                             True)
        scale, zp = self.tensor_scale(lo, hi)
        return RoundPlan(self, scale, zp, None, None, False)

    def tensor_scale(self, lo: float, hi: float) -> tuple[float, float | None]:
        """The step and zero point a range ``(lo, hi)`` gives the grid (as the point's
        :class:`~fxquant.quant.grid.IntegerGrid` has them), in float32 arithmetic: a
        float32 quotient of float32 operands, computed in Python's float64 and rounded
        once, is the float32 operation's result."""
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
        if self.spec.pow2:  # up to a power of two (not past float32's largest)
            mantissa, exponent = math.frexp(scale)
            floor = math.ldexp(1.0, exponent - 1)
            scale = floor * 2 if mantissa != 0.5 and floor < 2.0 ** 127 else floor
        if grid.asymmetric:
            zp = float(min(max(qmin - round(f32(lo / scale)), qmin), qmax))
        return scale, zp

    def row_scales(self, v: Tensor) -> tuple[Tensor, Tensor | None]:
        """Each row's step and zero point from its own range (``scale="row"``), as
        :meth:`tensor_scale` for each row, in float32 tensor arithmetic."""
        grid = self.grid
        qmin, qmax = self.code_range
        lo, hi = _row_bounds(v)
        if grid.asymmetric:
            lo, hi = lo.clamp(max=0.0), hi.clamp(min=0.0)
            span, levels = hi - lo, float(qmax - qmin)
        elif grid.signed:
            span, levels = torch.maximum(lo.abs(), hi.abs()), qmax + grid.offset
        else:
            span, levels = hi.clamp(min=0.0), float(qmax)
        scale = torch.div(span, torch.full_like(span, float(levels)))
        usable = (scale > 0) & torch.isfinite(scale) & (scale >= _TINY)
        scale = torch.where(usable, scale, 1.0)
        if self.spec.pow2:
            bits = scale.view(torch.int32)
            floor = (bits & ~((1 << 23) - 1)).view(torch.float32)
            scale = torch.where((floor < scale) & (floor < 2.0 ** 127), floor * 2, floor)
        zp = None
        if grid.asymmetric:
            zp = torch.clamp(qmin - torch.round(lo / scale), qmin, qmax)
        return scale, zp


class RoundPlan:
    """A point's rounding in one forward, fixed: :meth:`codes` rounds any rows of what
    the point rounds (all of them, or a chunk of messages) as the whole would be.

    ``scale``: a per-tensor scale (multiplied by its reciprocal, as the registered op
    does) or learned step (divided by, as LSQ does); None: per row (from each row's range,
    or from per-node widths). ``node_bits``: each node's width; ``amax``: the range a
    per-node step is taken from (``amax / (qmax_row + offset)``).
    """

    def __init__(self, quantizer: IntQuantizer, scale: float | None,
                 zero_point: float | None, node_bits: Tensor | None,
                 amax: Tensor | None, divide: bool) -> None:
        self.q = quantizer
        self.scale = scale
        self.zero_point = zero_point
        self.node_bits = node_bits
        self.amax = amax
        self.divide = divide
        #: ``v * factor`` (or ``v / factor``) is in units of the step
        self.factor: float | None = None if scale is None else \
            (scale if divide else f32(1.0 / scale))

    @property
    def per_tensor(self) -> bool:
        """One step and zero point for every row (else per row or per node)."""
        return self.scale is not None and self.node_bits is None

    def terms(self, v: Tensor, row_nodes: Tensor | None = None) -> dict[str, Any]:
        """How the rows ``v`` round: ``factor`` (per row: a column), ``divide``,
        ``offset``, ``zero_point``, ``qmin``/``qmax`` (per row with per-node widths),
        ``scale`` (one number, or one per row) and ``bits``."""
        q, grid = self.q, self.q.grid
        off = grid.offset
        if self.node_bits is not None:
            bits = self.node_bits if row_nodes is None else \
                self.node_bits.index_select(0, row_nodes)
            qmin_t, qmax_t = grid.code_range(bits)
            assert isinstance(qmin_t, Tensor) and isinstance(qmax_t, Tensor)
            if self.scale is not None:  # a learned step
                step: float | Tensor = self.scale
            else:
                amax = self.amax if self.amax is not None else finite_row_magnitudes(v).clamp(min=0)
                step = (amax.reshape(-1) / (qmax_t.to(torch.float32) + off)).clamp(min=_TINY)
            return {"factor": step, "divide": True, "offset": off, "zero_point": None,
                    "qmin": qmin_t, "qmax": qmax_t, "scale": step, "bits": bits}
        qmin, qmax = q.code_range
        if self.scale is None:  # a range per row
            scale_t, zp_t = q.row_scales(v)
            return {"factor": torch.reciprocal(scale_t), "divide": False, "offset": off,
                    "zero_point": zp_t, "qmin": qmin, "qmax": qmax, "scale": scale_t,
                    "bits": grid.bits}
        return {"factor": self.factor, "divide": self.divide, "offset": off,
                "zero_point": self.zero_point, "qmin": qmin, "qmax": qmax,
                "scale": self.scale, "bits": grid.bits}

    def levels(self, v: Tensor, row_nodes: Tensor | None = None) -> Tensor:
        """The grid's codes of the rows ``v`` as float32 (``qmin..qmax``, zero point
        included), computed in place on a fresh tensor: what sums of codes add."""
        t = self.terms(v, row_nodes)
        return round_levels(v, t, self.q.spec.rounding == "toward_zero")

    def codes(self, v: Tensor, row_nodes: Tensor | None = None) -> QTensor:
        """The codes of the rows ``v`` (rows of the nodes ``row_nodes``, or nodes in order
        where per-node widths apply)."""
        q = self.q
        v = _float32(v)
        t = self.terms(v, row_nodes)
        codes = codes_of(v, t["factor"], divide=t["divide"], offset=t["offset"],
                         zero_point=t["zero_point"], qmin=t["qmin"], qmax=t["qmax"],
                         bias=q.bias, toward_zero=q.spec.rounding == "toward_zero")
        return self.qtensor(codes, t)

    def qtensor(self, codes: Tensor, t: dict[str, Any]) -> QTensor:
        """``codes`` (int8, the grid's codes minus the stored bias) with how to read them."""
        q = self.q
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

    def values(self, levels: Tensor, t: dict[str, Any]) -> Tensor:
        """What the point returns for the grid codes ``levels`` (float32): ``(code -
        zero_point + offset) * step``, in that order (the simulation's float32 values)."""
        out = levels
        zp = t["zero_point"]
        if zp is not None:
            out = out - (zp.view(-1, *([1] * (out.dim() - 1))) if isinstance(zp, Tensor)
                         and zp.dim() else zp)
        if t["offset"]:
            out = out + t["offset"]
        scale = t["scale"]
        return out * (scale.view(-1, *([1] * (out.dim() - 1))) if isinstance(scale, Tensor)
                      and scale.dim() else scale)


def round_levels(v: Tensor, t: dict[str, Any], toward_zero: bool = False,
                 keep: Tensor | None = None) -> Tensor:
    """``clamp(round(v * factor - offset) + zero_point, qmin, qmax)`` as float32 (``v /
    factor`` with ``divide``, whose codes are clamped before rounding as LSQ's are), the
    terms :meth:`RoundPlan.terms` gives. ``keep``: where to write ``v * factor - offset``
    before rounding (a tensor of ``v``'s shape), for a caller that looks for ties."""
    def rows(x: Any) -> Any:
        return x.view(-1, *([1] * (v.dim() - 1))) if isinstance(x, Tensor) and x.dim() else x

    f = rows(t["factor"])
    y = torch.div(v, f) if t["divide"] else torch.mul(v, f)
    if t["offset"]:
        y.sub_(t["offset"])
    qmin, qmax = rows(t["qmin"]), rows(t["qmax"])
    per = isinstance(qmin, Tensor) or isinstance(qmax, Tensor)
    if t["divide"]:  # (learned steps and per-node widths clamp before rounding)
        if per:
            torch.maximum(y, _as(qmin, y), out=y)
            torch.minimum(y, _as(qmax, y), out=y)
        else:
            y.clamp_(qmin, qmax)
    if keep is not None:
        keep.copy_(y)
    y.trunc_() if toward_zero else y.round_()
    zp = t["zero_point"]
    if zp is not None:
        y.add_(rows(zp))
    if per:
        torch.maximum(y, _as(qmin, y), out=y)
        torch.minimum(y, _as(qmax, y), out=y)
    else:
        y.clamp_(qmin, qmax)
    return y


def _as(bound: Any, like: Tensor) -> Tensor:
    return bound.to(like.dtype) if isinstance(bound, Tensor) else \
        torch.tensor(float(bound), dtype=like.dtype, device=like.device)


def _scalar(t: Tensor) -> float:
    return float(t.reshape(()))


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
    finite = torch.isfinite(v)
    if not bool(finite.any()):
        return 0.0, 0.0
    return float(torch.where(finite, v, math.inf).amin()), \
        float(torch.where(finite, v, -math.inf).amax())


def _row_bounds(v: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's finite min and max (zeros for a row without finite values)."""
    flat = v.reshape(v.shape[0], -1) if v.dim() else v.reshape(1, 1)
    if flat.shape[1] == 0:
        zero = flat.new_zeros(flat.shape[0])
        return zero, zero
    lo, hi = torch.aminmax(flat, dim=1)
    if bool(torch.isfinite(lo).all() & torch.isfinite(hi).all()):
        return lo, hi
    finite = torch.isfinite(flat)
    lo = torch.where(finite, flat, math.inf).amin(1)
    hi = torch.where(finite, flat, -math.inf).amax(1)
    found = torch.isfinite(lo)
    return torch.where(found, lo, 0.0), torch.where(found, hi, 0.0)


def finite_row_magnitudes(x: Tensor) -> Tensor:
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
