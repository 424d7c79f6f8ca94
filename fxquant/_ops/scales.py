"""Where a scaled format's scales come from: the finite range of a tensor, of each row or
each block of 32 (:func:`bounds_of`, :func:`finite_bounds`), and the scale (and zero
point) a range gives a float format (:func:`format_factor`, :func:`mx_factor`) or an
integer grid (:func:`int_scale`, :func:`int_grid_scale`); with the block layout of the OCP
MX scheme (:func:`to_blocks`, :func:`from_blocks`)."""

from __future__ import annotations

import math
from typing import Final

import torch
from torch import Tensor

from fxquant._ops.layouts import COMPUTE_DTYPE, EXPONENT_BIAS, layout_of
from fxquant._ops.rounding import finite_value, pow2
from fxquant.formats import CustomFormat, Format, IntFormat
from fxquant.modes import AnyScale, Scale, ScaleKind

__all__ = [
    "amax_of",
    "block_bounds",
    "bounds_of",
    "broadcast_scale",
    "exponent_of",
    "finite_bounds",
    "floor_pow2",
    "format_factor",
    "from_blocks",
    "int_grid_scale",
    "int_scale",
    "mx_factor",
    "row_bounds",
    "tensor_bounds",
    "to_blocks",
]

#: Elements per chunk of the masked pass over a tensor with non-finite values.
CHUNK: Final = 1 << 18


def bounds_of(x: Tensor, per_row: bool, sync: bool = True) -> Tensor:
    """``(lo, hi)`` over the finite values of ``x`` (shape ``(2,)``) or of each row (``(n, 2)``);
    zeros where there are none. With ``sync`` (eager, on the CPU) one read of the extremes
    decides whether the masked pass over non-finite values is needed; off the CPU, or
    compiled, it always runs."""
    return finite_bounds(x, per_row, sync)[0]


def finite_bounds(x: Tensor, per_row: bool, sync: bool = True) -> tuple[Tensor, Tensor]:
    """:func:`bounds_of`, and whether there was any finite value (a bool, per row with
    ``per_row``): a range fitted over time skips a batch that has none.

    Example:
        >>> finite_bounds(torch.tensor([1.0, float("nan"), -2.0]), per_row=False)
        (tensor([-2.,  1.]), tensor(True))
        >>> finite_bounds(torch.tensor([float("inf"), float("nan")]), per_row=False)
        (tensor([0., 0.]), tensor(False))
    """
    flat = x.reshape(x.shape[0], -1) if per_row else x.reshape(1, -1)
    if flat.shape[1] == 0:
        out = x.new_zeros((flat.shape[0], 2))
        found = torch.zeros(flat.shape[0], dtype=torch.bool, device=x.device)
        return (out, found) if per_row else (out[0], found[0])
    compute = COMPUTE_DTYPE[x.dtype]
    flat = flat.to(compute)
    # per tensor: a whole-tensor reduction (over dim 1 of a (1, n) view, ATen's CPU
    # reduction ran ~20x slower: one thread walks the row)
    dims = (1,) if per_row else (0, 1)
    if per_row:
        lo, hi = torch.aminmax(flat, dim=1)
    else:
        lo, hi = (v.reshape(1) for v in torch.aminmax(flat))
    clean = sync and x.device.type == "cpu" and not torch.compiler.is_compiling() and bool(
        torch.isfinite(lo).all() & torch.isfinite(hi).all())
    if not clean and not per_row and not torch.compiler.is_compiling():
        # eager: the masked pass chunk by chunk (a whole-tensor mask and masked copy would
        # take 1.25x the input on top of the output)
        los, his = [], []
        for part in flat.contiguous().view(-1).split(CHUNK):
            finite = torch.isfinite(part)
            los.append(torch.where(finite, part, math.inf).amin().reshape(1))
            his.append(torch.where(finite, part, -math.inf).amax().reshape(1))
        lo, hi = torch.cat(los).amin().reshape(1), torch.cat(his).amax().reshape(1)
    elif not clean:
        finite = torch.isfinite(flat)
        lo = torch.where(finite, flat, math.inf).amin(dim=dims).reshape(-1)
        hi = torch.where(finite, flat, -math.inf).amax(dim=dims).reshape(-1)
    if clean:
        found = torch.ones(lo.shape, dtype=torch.bool, device=lo.device)
    else:  # no finite value: lo is +inf there; the range is 0
        found = torch.isfinite(lo)
        lo = torch.where(found, lo, 0.0)
        hi = torch.where(found, hi, 0.0)
    out = torch.stack([lo, hi], dim=1)
    return (out, found) if per_row else (out[0], found[0])


def amax_of(bounds: Tensor) -> Tensor:
    return torch.maximum(bounds[..., 0].abs(), bounds[..., 1].abs())


def floor_pow2(t: Tensor) -> Tensor:
    """Positive normal floats rounded down to a power of two (mantissa bits cleared)."""
    layout = layout_of(t.dtype)
    return (t.view(layout.int_dtype) & ~((1 << layout.man_bits) - 1)).view(t.dtype)


def exponent_of(t: Tensor) -> Tensor:
    """``floor(log2 t)`` of positive normal floats, as integers."""
    layout = layout_of(t.dtype)
    return (t.view(layout.int_dtype) >> layout.man_bits) - EXPONENT_BIAS[layout.width]


def format_factor(amax: Tensor, fmt: Format | CustomFormat, mode: AnyScale) -> Tensor:
    """``max_finite / amax`` where amax is positive and finite, else 1; capped at the largest
    power of two of the dtype; floored to a power of two for ``-pow2`` modes."""
    dtype = amax.dtype
    layout = layout_of(dtype)
    usable = (amax > 0) & torch.isfinite(amax)
    # torch.div on tensors: `scalar / tensor` would multiply by the reciprocal instead.
    big = torch.full_like(amax, finite_value(fmt.max_finite, dtype))
    factor = torch.where(usable, torch.div(big, torch.where(usable, amax, 1.0)), 1.0)
    cap = 2.0 ** (EXPONENT_BIAS[layout.width] - 1)
    factor = torch.clamp(factor, max=cap)
    if mode.pow2:
        factor = floor_pow2(torch.clamp(factor, min=torch.finfo(dtype).tiny))
    return factor.to(dtype)


def mx_factor(amax: Tensor, emax: int) -> Tensor:
    """OCP MX: ``1 / X`` with ``X = 2**(floor(log2 amax) - emax)``, the E8M0 exponent
    clamped to [-127, 127] (factor 1 where amax is 0 or not finite)."""
    layout = layout_of(amax.dtype)
    emax = min(emax, EXPONENT_BIAS[layout.width])  # (8 exponent bits: the dtype's largest binade)
    usable = (amax > 0) & torch.isfinite(amax) & (amax >= torch.finfo(amax.dtype).tiny)
    shared = torch.clamp(exponent_of(torch.where(usable, amax, 1.0)) - emax, -127, 127)
    shared = torch.where(usable, shared, 0)
    h1 = (-shared) >> 1
    return pow2(h1, layout, amax.dtype) * pow2(-shared - h1, layout, amax.dtype)


def int_scale(bounds: Tensor, fmt: IntFormat, mode: AnyScale) -> tuple[Tensor, Tensor | None]:
    """``(scale, zero_point)`` of an integer format from ``(lo, hi)`` bounds."""
    lo, hi = bounds[..., 0], bounds[..., 1]
    zero_point = None
    levels: float
    if fmt.asymmetric:
        lo, hi = torch.clamp(lo, max=0.0), torch.clamp(hi, min=0.0)
        span, levels = hi - lo, fmt.qmax - fmt.qmin
    elif fmt.signed:
        span, levels = amax_of(bounds), fmt.max_finite
    else:
        span, levels = torch.clamp(hi, min=0.0), fmt.qmax
    # a tensor divisor: CUDA computes `tensor / python_number` as a product with the
    # number's reciprocal, one ulp off the CPU's division for most spans
    scale = torch.div(span, torch.full_like(span, float(levels)))
    usable = (scale > 0) & torch.isfinite(scale) & (scale >= torch.finfo(scale.dtype).tiny)
    scale = torch.where(usable, scale, 1.0)
    if mode.pow2:  # ceil to a power of two, so the largest value stays on the grid
        floor = floor_pow2(scale)
        # (but not past the dtype's largest power of two: 2x that is inf, and inf * 0 NaN;
        # the few values above it are clipped)
        top = floor_pow2(torch.full_like(scale, torch.finfo(scale.dtype).max))
        scale = torch.where((floor < scale) & (floor < top), floor * 2, floor)
    if fmt.asymmetric:
        zero_point = torch.clamp(fmt.qmin - torch.round(lo / scale), fmt.qmin, fmt.qmax)
    return scale, zero_point


def int_grid_scale(x: Tensor, fmt: IntFormat, scale: str | AnyScale,
                   bounds: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """``(scale, zero_point)`` the op rounds ``x`` with on ``fmt``'s grid, shaped to
    broadcast against ``x`` (per block: expanded to ``x``'s shape), in the compute dtype
    (float32 for half-precision inputs); ``bounds`` as the op takes them (else from ``x``).

    Example:
        >>> from fxquant.formats import parse
        >>> int_grid_scale(torch.tensor([[1.0, -2.0], [0.5, 0.25]]), parse("int4"), "row")
        (tensor([[0.2857],
                [0.0714]]), None)
    """
    mode = Scale.parse(scale)
    compute = COMPUTE_DTYPE[x.dtype]
    xc = x.to(compute)
    if mode is Scale.NONE:
        return torch.ones((), dtype=compute, device=x.device), None
    if mode.per_block:
        blocks = to_blocks(xc)
        step, zero_point = int_scale(block_bounds(blocks, sync=True), fmt, mode)
        def expand(t: Tensor) -> Tensor:
            return from_blocks(broadcast_scale(t, blocks, mode).expand_as(blocks), xc)
        return expand(step), None if zero_point is None else expand(zero_point)
    if isinstance(mode, ScaleKind):
        bounds = mode.bounds(xc)
    elif bounds is None:
        bounds = bounds_of(xc, mode.per_row)
    step, zero_point = int_scale(bounds.to(compute), fmt, mode)
    return broadcast_scale(step, xc, mode), None if zero_point is None else \
        broadcast_scale(zero_point, xc, mode)


def broadcast_scale(per: Tensor, x: Tensor, mode: AnyScale) -> Tensor:
    """A per-tensor, per-row or per-block value shaped to broadcast against ``x`` (a
    registered scale kind's already is)."""
    if mode.per_row:
        return per.view((x.shape[0],) + (1,) * (x.dim() - 1))
    if mode.per_block:
        return per.unsqueeze(-1)  # x is (..., blocks, 32) here
    return per


def to_blocks(x: Tensor) -> Tensor:
    """``x`` as ``(rows, blocks, 32)``, zero-padded along the last dim."""
    last = x.shape[-1] if x.dim() else 1
    pad = -last % 32
    flat = x.reshape(-1, last) if x.dim() else x.reshape(1, 1)
    if pad:
        flat = torch.nn.functional.pad(flat, (0, pad))
    return flat.reshape(flat.shape[0], -1, 32)


def from_blocks(blocks: Tensor, like: Tensor) -> Tensor:
    """:func:`to_blocks`' ``(rows, blocks, 32)`` back in ``like``'s shape, the padding cut
    off, in memory of its own (contiguous, as the input was: a view into the padded blocks
    would hold up to 32x the memory and break a caller's ``.view``)."""
    last = like.shape[-1] if like.dim() else 1
    return blocks.reshape(blocks.shape[0], -1)[:, :last].contiguous().reshape(like.shape)


def block_bounds(blocks: Tensor, sync: bool) -> Tensor:
    """``(-amax, amax)`` per block of 32 over finite values (two fast reductions when clean)."""
    lo, hi = blocks.amin(dim=-1), blocks.amax(dim=-1)
    amax = torch.maximum(lo.abs(), hi.abs())
    if not (sync and blocks.device.type == "cpu" and bool(torch.isfinite(amax).all())):
        finite = torch.isfinite(blocks)
        amax = torch.where(finite, blocks.abs(), 0.0).amax(dim=-1)
    return torch.stack([-amax, amax], dim=-1)


def tensor_bounds(x: Tensor) -> Tensor:
    """``(lo, hi)`` of finite values: one fast full reduction, masked only when needed."""
    lo, hi = torch.aminmax(x)
    if bool(torch.isfinite(lo) & torch.isfinite(hi)):
        return torch.stack([lo, hi])
    return bounds_of(x, per_row=False, sync=False)


def row_bounds(x: Tensor) -> Tensor:
    """``(lo, hi)`` per row; ``amin``/``amax`` along a dim are faster than ``aminmax`` there."""
    flat = x.reshape(x.shape[0], -1)
    if flat.shape[1] == 0:
        return x.new_zeros((x.shape[0], 2))
    lo, hi = flat.amin(dim=1), flat.amax(dim=1)
    if bool(torch.isfinite(lo).all() & torch.isfinite(hi).all()):
        return torch.stack([lo, hi], dim=1)
    return bounds_of(x, per_row=True, sync=False)
