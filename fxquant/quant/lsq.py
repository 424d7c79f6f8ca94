"""``s * round(clamp(x / s, qmin, qmax))`` with LSQ's gradients, as one autograd function.

The same values and gradients as the chain of torch ops (divide, clamp to the grid's
range, round with a straight-through gradient, multiply back), but autograd keeps only
``x`` and the small ``s``/``qmin``/``qmax`` instead of every intermediate, and in eager
mode forward and backward run over chunks of rows, in place on cache-sized buffers (on
a GCN with learned per-node bits the chain made an epoch 2.5x FP32, this 1.75x).

Gradients (Esser et al., "Learned Step Size Quantization", ICLR 2020), with ``u = x / s``:

- ``x``: ``grad`` where ``qmin <= u <= qmax``, else 0 (straight-through inside the range);
- ``s``: ``gain * sum(grad * d)`` with ``d = round(u) - u`` inside, ``qmin`` below and
  ``qmax`` above the range (``gain``: LSQ's ``1 / sqrt(numel * qmax)``);
- ``qmin`` / ``qmax`` (per-row ranges from learned bit-widths): ``s * grad`` summed over
  the values clamped at that bound.

Each is summed down to its input's shape, so ``s``, ``qmin`` and ``qmax`` may be scalars
or broadcast per row. A NaN value adds nothing to the gradients of ``s``, ``qmin`` and
``qmax`` (it would make them NaN, and the step or bit-widths NaN for good); an infinite
one counts as clipped.

A mid-rise grid (``offset=0.5``, :class:`~fxquant.formats.IntFormat` ``midrise``) rounds
to ``s * (round(clamp(x / s - 1/2, qmin, qmax)) + 1/2)``; with ``u = x / s - 1/2`` the
gradients are the same, except that ``d`` outside the range is the bound plus 1/2 (the
level there).
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from fxquant.errors import FxquantValueError
from fxquant.quant._last import LastInput

__all__ = ["RoundedFeatures", "lsq_round", "lsq_round_features", "lsq_round_stochastic"]


#: values per chunk of rows in eager mode (the temporaries stay in cache)
CHUNK = 1 << 16


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


def _row_chunks(x: Tensor, *per: Tensor) -> Iterator[tuple[slice, tuple[Tensor, ...]]]:
    """Slices of the rows of ``x`` (at least 1-d) holding about :data:`CHUNK` values, with
    each of ``per`` (one number, or one value per row) sliced alike. One chunk when
    compiling (inductor fuses the whole expression; sizes may be symbolic)."""
    rows = x.shape[0]
    if torch.compiler.is_compiling() or rows == 0:
        yield slice(None), per
        return
    step = max(1, CHUNK // max(1, math.prod(x.shape[1:])))
    for start in range(0, rows, step):
        sl = slice(start, start + step)
        yield sl, tuple(p[sl] if p.dim() and p.shape[0] == rows and rows > 1 else p
                        for p in per)


def _forward(x: Tensor, s: Tensor, lo: Tensor, hi: Tensor, out: Tensor, offset: float) -> None:
    torch.div(x, s, out=out)
    if offset:
        out.sub_(offset)
    torch.minimum(out, hi, out=out)
    torch.maximum(out, lo, out=out)
    out.round_()
    if offset:
        out.add_(offset)
    out.mul_(s)


def _row_sums(t: Tensor) -> Tensor:
    return t.sum(tuple(range(1, t.dim()))) if t.dim() > 1 else t.clone()  # (written after)


class _LsqRound(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, s: Tensor, qmin: Tensor, qmax: Tensor,
                gain: float, offset: float, features: bool = False) -> Tensor:
        sx, lo, hi = s.to(x.dtype), qmin.to(x.dtype), qmax.to(x.dtype)
        ctx.save_for_backward(x, s, qmin, qmax)
        ctx.gain = gain
        ctx.offset = offset
        ctx.entries = None
        if not ctx.needs_input_grad[0] and not offset:
            ctx.entries = _sparse_entries(x, sx, lo, hi)
        if ctx.entries is not None:  # mostly zeros, which stay zeros: round the others
            flat, row, values, negative_zero = ctx.entries
            y = x * 0 if negative_zero else _SCRATCH.zeros(x, flat)  # x's zeros, signs kept
            s_e, lo_e, hi_e = (_per_entry(t, row) for t in (sx, lo, hi))
            y.view(-1).index_copy_(0, flat, torch.maximum(torch.minimum(values / s_e, hi_e),
                                                          lo_e).round_().mul_(s_e))
            if features:  # what its dropout and linear transform need (lsq_round_features)
                return _as_features(y, _Features(ctx.entries, s, qmin, qmax, gain, None, 0))
            return y
        rows = x.shape or (1,)  # written through views of at least one dimension
        xc = x.contiguous().reshape(rows)
        y = torch.empty_like(x, memory_format=torch.contiguous_format)
        y_rows = y.view(rows)
        for sl, (s_c, lo_c, hi_c) in _row_chunks(xc, sx, lo, hi):
            _forward(xc[sl], s_c, lo_c, hi_c, y_rows[sl], offset)
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, s, qmin, qmax = ctx.saved_tensors
        if ctx.entries is not None:
            return (None, *_sparse_backward(ctx, x, grad, s, qmin, qmax), None, None, None)
        return (*_dense_backward(ctx, x, grad, s, qmin, qmax), None, None, None)


def _dense_backward(ctx: Any, x: Tensor, grad: Tensor, s: Tensor, qmin: Tensor, qmax: Tensor,
                    codes: Tensor | None = None) -> tuple[Tensor | None, ...]:
    """The gradients of ``x``, ``s``, ``qmin`` and ``qmax`` (:func:`_grads`, ``codes``
    the drawn codes of a stochastic rounding), computed per chunk of rows, in place on
    small buffers: per-row sums for ``s``, and for per-row ranges of the gradient below
    the range and above it."""
    sx, lo, hi = s.to(x.dtype), qmin.to(x.dtype), qmax.to(x.dtype)
    rows = x.shape or (1,)
    xc, gc = x.contiguous().reshape(rows), grad.contiguous().reshape(rows)
    want_x = ctx.needs_input_grad[0]  # not for inputs such as a dataset's features
    grad_x = torch.empty_like(x, memory_format=torch.contiguous_format) if want_x else None
    grad_rows = grad_x.view(rows) if grad_x is not None else None
    want_s, want_range = s.requires_grad, qmin.requires_grad or qmax.requires_grad
    fast = _masks_as_floats(gc)
    per = (sx, lo, hi) if codes is None else (sx, lo, hi, codes)
    parts: list[tuple[Tensor | None, Tensor | None, Tensor | None]] = []
    for sl, (s_c, lo_c, hi_c, *q_c) in _row_chunks(xc, *per):
        u = xc[sl] / s_c
        if ctx.offset:
            u.sub_(ctx.offset)
        parts.append(_grads(u, lo_c, hi_c, gc[sl], ctx.offset,
                            None if grad_rows is None else grad_rows[sl], want_s, want_range,
                            _row_sums, fast, q_c[0] if q_c else None))
    per_row = (-1,) + (1,) * (x.dim() - 1)  # per-row sums, shaped to broadcast
    sums = [None if p[0] is None else torch.cat(p).view(per_row)  # (one chunk at least)
            for p in zip(*parts, strict=True)]
    return (grad_x, *_step_and_range_grads(ctx.gain, s, qmin, qmax, sx, *sums))


def _sparse_backward(ctx: Any, x: Tensor, grad: Tensor, s: Tensor, qmin: Tensor, qmax: Tensor
                     ) -> tuple[Tensor | None, ...]:
    """The gradients of ``s``, ``qmin`` and ``qmax`` from the non-zero entries of ``x``
    alone (a zero is on the grid and inside the range: it adds nothing to them)."""
    flat = ctx.entries[0]
    g = grad.contiguous().view(-1).index_select(0, flat)
    return _entry_grads(x, ctx.entries, g, s, qmin, qmax, ctx.gain)


def _entry_grads(x: Tensor, entries: tuple[Tensor, Tensor, Tensor, bool], g: Tensor,
                 s: Tensor, qmin: Tensor, qmax: Tensor, gain: float
                 ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The gradients of ``s``, ``qmin`` and ``qmax`` given the output's gradient ``g`` at
    the non-zero ``entries`` of ``x`` (see :func:`_sparse_entries`)."""
    _, row, values, _ = entries
    sx, lo, hi = s.to(x.dtype), qmin.to(x.dtype), qmax.to(x.dtype)
    s_e, lo_e, hi_e = (_per_entry(t, row) for t in (sx, lo, hi))
    rows = x.shape[0]
    per_row = (-1,) + (1,) * (x.dim() - 1)

    def row_sums(values: Tensor) -> Tensor:
        return values.new_zeros(rows).index_add_(0, row, values).view(per_row)

    sums = _grads(values / s_e, lo_e, hi_e, g, 0.0, None, s.requires_grad,
                  qmin.requires_grad or qmax.requires_grad, row_sums, _masks_as_floats(g))
    return _step_and_range_grads(gain, s, qmin, qmax, sx, *sums)


def _masks_as_floats(g: Tensor) -> bool:
    """Whether :func:`_grads` may compute with masks of 1.0 and 0.0 in ``g``'s dtype: in
    eager mode (a comparison written into a float tensor, and a product with it, run
    several times faster on the CPU than a bool mask and ``torch.where``), where every
    value of ``g`` is finite (``0 * inf`` is NaN where ``torch.where`` gives 0; a sum that
    overflows takes the ``where`` path too). Compiled code takes the ``where`` path, which
    inductor fuses."""
    return not torch.compiler.is_compiling() and bool(torch.isfinite(g.sum()))


def _grads(u: Tensor, lo: Tensor, hi: Tensor, g: Tensor, offset: float, grad_x: Tensor | None,
           want_s: bool, want_range: bool, row_sums: Callable[[Tensor], Tensor],
           floats: bool, codes: Tensor | None = None
           ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The gradients of one chunk, ``u = x / s - offset``: ``x``'s (``g``
    inside the range, else 0; NaN: 0) written to ``grad_x`` when given, and per-row sums
    of the rest: for ``s``, ``g * d`` with ``d = q - u`` inside (``q``: ``codes``, the
    drawn codes of a stochastic rounding, or ``round(u)``), the bound's level outside, 0
    for NaN; for the range, ``g`` below it and ``g`` above it (NaN: neither).
    ``floats``: compute with float masks (:func:`_masks_as_floats`)."""
    below = above = d = None
    c = torch.maximum(torch.minimum(u, hi), lo)  # (NaN stays NaN)

    def rounded() -> Tensor:  # q: a bound outside the range, as round(c) is there
        return c.round() if codes is None else codes.to(c.dtype)
    if not floats:
        zero = g.new_zeros(())
        within = c == u
        if grad_x is not None:
            torch.where(within, g, zero, out=grad_x)
        if want_range:
            below = row_sums(torch.where(u < lo, g, zero))
            above = row_sums(torch.where(u > hi, g, zero))
        if want_s:
            d = row_sums(rounded().sub_(torch.where(within, u, zero - offset))
                         .nan_to_num_(nan=0.0).mul_(g))
        return d, below, above
    inside = torch.eq(c, u, out=torch.empty_like(u))  # 1.0 inside the range, else 0.0
    if grad_x is not None:
        torch.mul(g, inside, out=grad_x)
    if want_range:  # (one buffer for both masks: each is summed before the next)
        mask = torch.empty_like(u)
        below = row_sums(torch.lt(u, lo, out=mask).mul_(g))
        above = row_sums(torch.gt(u, hi, out=mask).mul_(g))
    if want_s:  # round(c) - c is round(u) - u inside and 0 outside (c is a bound there)
        d = rounded().sub_(c)
        d.add_(c.add_(offset).mul_(inside.neg_().add_(1))).nan_to_num_(nan=0.0)
        d = row_sums(d.mul_(g))
    return d, below, above


def _step_and_range_grads(gain: float, s: Tensor, qmin: Tensor, qmax: Tensor, sx: Tensor,
                          d: Tensor | None, below: Tensor | None, above: Tensor | None
                          ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The gradients of ``s``, ``qmin`` and ``qmax`` from :func:`_grads`' per-row sums."""
    grad_s = grad_lo = grad_hi = None
    if d is not None:
        grad_s = _reduce(d, s, gain)
    if below is not None and above is not None:
        if qmax.requires_grad:
            grad_hi = _reduce_times(above, qmax, _rows_of(sx, above))
        if qmin.requires_grad:
            grad_lo = _reduce_times(below, qmin, _rows_of(sx, below))
    return grad_s, grad_lo, grad_hi


#: density at or under which the rounding of an input that needs no gradient (a dataset's
#: bag-of-words features: 1.3% non-zero on Cora) runs over its non-zero entries only
SPARSE_DENSITY = 0.125


#: the non-zero entries of the last input seen (a dataset's features are the same tensor
#: every step)
_ENTRIES: LastInput[tuple[Tensor, Tensor, Tensor, bool] | None] = LastInput()


def _sparse_entries(x: Tensor, sx: Tensor, lo: Tensor, hi: Tensor
                    ) -> tuple[Tensor, Tensor, Tensor, bool] | None:
    """``(flat positions, rows, values, whether a zero is -0.0)`` of the non-zero entries of
    ``x`` where rounding may skip its zeros (eager, contiguous, mostly zeros, zero on every
    row's grid); else None."""
    if torch.compiler.is_compiling() or x.dim() == 0 or x.numel() < CHUNK \
            or not x.is_contiguous() or x.requires_grad:
        return None
    rows = x.shape[0]
    per_row = (rows,) + (1,) * (x.dim() - 1)
    if any(t.numel() != 1 and tuple(t.shape) != per_row for t in (sx, lo, hi)):
        return None
    if not bool((lo <= 0).all() & (hi >= 0).all()):
        return None
    return _ENTRIES.get(x, None, lambda: _nonzero_entries(x))


def _nonzero_entries(x: Tensor) -> tuple[Tensor, Tensor, Tensor, bool] | None:
    flat = x.reshape(-1).nonzero().squeeze(1)
    if flat.numel() > SPARSE_DENSITY * x.numel():
        return None
    return (flat, torch.div(flat, x.numel() // x.shape[0], rounding_mode="floor"),
            x.reshape(-1).index_select(0, flat),
            bool((x == 0).logical_and_(x.signbit()).any()))


class _Scratch:
    """Zero-filled memory for the two tensors of a mostly-zero input's size that the
    features path makes every training step (the rounded features and their dropout).

    A fresh allocation that large is paged in anew by the CPU on many steps (several
    milliseconds on Cora's 2708 x 1433 features); here memory is reused from step to step,
    but only a block that no tensor refers to any more (its storage's use count: views,
    detached copies, tensors autograd saved and NumPy arrays all count), and it is zeroed
    in full each time, so nothing of an earlier step shows. At most ``slots`` blocks, held
    while the features they serve (``owner``: their non-zero positions, alive while the
    features are cached) are alive; CPU only (CUDA's allocator caches blocks itself)."""

    def __init__(self, slots: int = 2, min_bytes: int = 1 << 20) -> None:
        self.slots = slots
        self.min_bytes = min_bytes
        self._lock = threading.RLock()
        self._blocks: list[torch.UntypedStorage] = []
        self._owner: weakref.ref[Tensor] | None = None
        self._use_count: Callable[[int], int] | None = getattr(torch._C, "_storage_Use_Count",
                                                               None)

    def clear(self) -> None:
        """Let go of every block (tensors made from them keep theirs)."""
        with self._lock:
            self._blocks = []
            self._owner = None

    def zeros(self, like: Tensor, owner: Tensor) -> Tensor:
        """A contiguous tensor of zeros shaped as ``like``."""
        block = self._free_block(like, owner)
        if block is None:  # (small, not on the CPU, or every block in use)
            return torch.zeros_like(like, memory_format=torch.contiguous_format)
        strides = [math.prod(like.shape[i + 1:]) for i in range(like.dim())]
        return like.new_empty(0).set_(block, 0, like.shape, strides).zero_()

    def _free_block(self, like: Tensor, owner: Tensor) -> torch.UntypedStorage | None:
        """A block for ``like`` that no tensor refers to (a new one while fewer than
        ``slots`` are held), or None."""
        nbytes = like.numel() * like.element_size()
        count = self._use_count
        if count is None or like.device.type != "cpu" or nbytes < self.min_bytes:
            return None
        with self._lock:
            if self._owner is None or self._owner() is not owner:  # other features: let go
                self._blocks = []
                self._owner = weakref.ref(owner, lambda _: self.clear())
            block = next((b for b in self._blocks if b.nbytes() == nbytes
                          and count(b._cdata) == 1), None)  # only this list holds it
            if block is None and len(self._blocks) < self.slots:
                block = torch.UntypedStorage(nbytes, device=like.device)
                self._blocks.append(block)
            return block


_SCRATCH = _Scratch()


def _per_entry(t: Tensor, row: Tensor) -> Tensor:
    """``t`` (one number or one per row) for each entry, by the entry's row."""
    return t.reshape(()) if t.numel() == 1 else t.reshape(-1).index_select(0, row)


def _rows_of(s: Tensor, per_row: Tensor) -> Tensor:
    """``s`` against per-row sums: one number stays, a per-row ``s`` keeps its rows."""
    return s if s.numel() == 1 else s.reshape(per_row.shape[0], *([1] * (per_row.dim() - 1)))


def lsq_round(x: Tensor, s: Tensor, qmin: Tensor | float, qmax: Tensor | float,
              gain: float = 1.0, offset: float = 0.0) -> Tensor:
    """``s * round(clamp(x / s, qmin, qmax))`` (round half to even) with LSQ's gradients
    (see the module docstring); ``gain`` scales the gradient of ``s`` only. ``offset=0.5``
    rounds to a mid-rise grid, ``s * (round(clamp(x / s - 1/2, qmin, qmax)) + 1/2)``.

    Example:
        >>> s = torch.tensor(0.5, requires_grad=True)
        >>> x = torch.tensor([0.3, -2.0, 0.74], requires_grad=True)
        >>> y = lsq_round(x, s, -2, 1)
        >>> y
        tensor([ 0.5000, -1.0000,  0.5000], grad_fn=<_LsqRoundBackward>)
        >>> y.sum().backward()
        >>> x.grad, s.grad
        (tensor([1., 0., 0.]), tensor(-0.6000))
        >>> lsq_round(x, s, -1, 0, offset=0.5)  # 1 bit, mid-rise: the sign times s / 2
        tensor([ 0.2500, -0.2500,  0.2500], grad_fn=<_LsqRoundBackward>)
    """
    for name, value in (("gain", gain), ("offset", offset)):
        if torch.compiler.is_compiling() or isinstance(value, (torch.SymInt, torch.SymFloat)):
            continue  # fxquant's own call (a size while compiling with dynamic shapes)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value < 0:
            raise FxquantValueError(f"lsq_round: {name} must be a finite number >= 0, got "
                                    f"{value!r}")
    return _LsqRound.apply(x, s, _tensor(qmin, x), _tensor(qmax, x), gain, float(offset))


class _LsqStochastic(torch.autograd.Function):
    """:func:`lsq_round_stochastic`: over chunks of rows as :class:`_LsqRound`, keeping
    ``x``, the small ``s``/``qmin``/``qmax`` and the drawn codes (int16: half of a float32
    input) for the backward pass."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, s: Tensor, qmin: Tensor, qmax: Tensor, gain: float,
                offset: float) -> Tensor:
        sx, lo, hi = s.to(x.dtype), qmin.to(x.dtype), qmax.to(x.dtype)
        rows = x.shape or (1,)
        xc = x.contiguous().reshape(rows)
        y = torch.empty_like(x, memory_format=torch.contiguous_format)
        codes = torch.empty(rows, dtype=torch.int16, device=x.device)
        y_rows = y.view(rows)
        for sl, (s_c, lo_c, hi_c) in _row_chunks(xc, sx, lo, hi):
            s_f, lo_f, hi_f = (t.to(torch.float32) for t in (s_c, lo_c, hi_c))
            c = xc[sl].to(torch.float32) / s_f  # float32 draws: no bias on coarse dtypes
            if offset:
                c.sub_(offset)
            c = torch.maximum(torch.minimum(c, hi_f), lo_f)
            q = torch.rand_like(c).add_(c).floor_()  # up with probability c's fraction
            q = torch.maximum(torch.minimum(q, hi_f), lo_f)  # (c + r may round up)
            codes[sl] = q
            y_rows[sl] = q.add_(offset).mul_(s_f)
        ctx.save_for_backward(x, s, qmin, qmax, codes)
        ctx.gain, ctx.offset = gain, offset
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, s, qmin, qmax, codes = ctx.saved_tensors
        return (*_dense_backward(ctx, x, grad, s, qmin, qmax, codes), None, None)


def lsq_round_stochastic(x: Tensor, s: Tensor, qmin: Tensor | float, qmax: Tensor | float,
                         gain: float = 1.0, offset: float = 0.0) -> Tensor:
    """:func:`lsq_round` with stochastic rounding: ``c = clamp(x / s - offset, qmin, qmax)``
    rounds up with probability its fraction (``floor(c + r)``, ``r ~ U[0, 1)``, drawn in
    float32 from torch's generator), so the result is ``x`` on average inside the range.
    Inside and outside the range are judged on ``x`` itself, not on the draw; the
    gradients are :func:`lsq_round`'s with ``d = q - x / s + offset`` for the drawn code
    ``q`` inside the range.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> x = torch.full((100_000,), 0.3)
        >>> y = lsq_round_stochastic(x, torch.tensor(1.0), -1, 1)
        >>> sorted(y.unique().tolist()), round(float(y.mean()), 2)
        ([0.0, 1.0], 0.3)
    """
    for name, value in (("gain", gain), ("offset", offset)):
        if torch.compiler.is_compiling() or isinstance(value, (torch.SymInt, torch.SymFloat)):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value < 0:
            raise FxquantValueError(f"lsq_round_stochastic: {name} must be a finite number "
                                    f">= 0, got {value!r}")
    return _LsqStochastic.apply(x, s, _tensor(qmin, x), _tensor(qmax, x), gain, float(offset))


def _tensor(bound: Tensor | float, x: Tensor) -> Tensor:
    """A bound of the range as a tensor on ``x``'s device."""
    return bound if isinstance(bound, Tensor) else torch.tensor(float(bound), device=x.device)


class _Features(NamedTuple):
    """What a layer's linear transform needs to give a rounded mostly-zero input's step and
    range their gradients from the non-zero entries alone."""

    entries: tuple[Tensor, Tensor, Tensor, bool]  # (flat, rows, values, -0.0) of the input
    s: Tensor
    qmin: Tensor
    qmax: Tensor
    gain: float
    scale: Tensor | None  # per entry: what dropouts since the rounding multiplied it by
    version: int  # the rounded tensor's version counter when this was made


class RoundedFeatures(Tensor):
    """The output of :func:`lsq_round_features`: a plain tensor to every op except a
    dropout (in training, on the CPU) and ``F.linear`` (``torch.nn.Linear``, PyG's
    ``Linear``), which give the learned step and ranges their gradients without the dense
    gradient of the whole input (on Cora, 2708 x 1433 values of which 1.3% are non-zero).
    Every other op, and either of those two where the values were changed in place since,
    sees a plain tensor whose gradient flows as :func:`lsq_round`'s does. Results are plain
    tensors, except a dropout's, which keeps this type."""

    _fxquant_features: _Features | None = None

    @classmethod
    def __torch_function__(cls, func: Callable[..., Any], types: Any, args: tuple = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        first = args[0] if args else None
        if isinstance(first, RoundedFeatures):
            if func is F.linear:
                out = _fused_linear(first, *args[1:], **kwargs)
                if out is not None:
                    return out
            elif func is F.dropout:
                out = _features_dropout(first, *args[1:], **kwargs)
                if out is not None:
                    return out
            elif func is Tensor.__repr__:  # a tensor's, grad_fn included
                setattr(first, "__class__", Tensor)  # noqa: B010 (the type of this tensor)
                try:
                    return repr(first)
                finally:
                    setattr(first, "__class__", RoundedFeatures)  # noqa: B010
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def _valid_features(t: RoundedFeatures) -> _Features | None:
    info = t._fxquant_features
    if info is None or t._version != info.version or not torch.is_grad_enabled():
        return None  # changed in place since it was rounded: the plain path
    return info


def _as_features(t: Tensor, info: _Features) -> RoundedFeatures:
    """``t`` itself made a :class:`RoundedFeatures` (a view of it would refuse in-place
    ops where a custom autograd function made ``t``), carrying ``info``."""
    t.__class__ = RoundedFeatures
    out = cast(RoundedFeatures, t)
    out._fxquant_features = info._replace(version=out._version)
    return out


def _features_dropout(t: RoundedFeatures, p: Any = 0.5, training: Any = True,
                      inplace: Any = False) -> RoundedFeatures | None:
    """``F.dropout`` as torch runs it on the CPU (the same draws, the same values), noting
    what it multiplied each non-zero entry by; None where torch's own should run."""
    info = _valid_features(t)
    if info is None or inplace is not False or training is not True \
            or not isinstance(p, float) or not 0.0 < p < 1.0 or t.device.type != "cpu":
        return None
    with torch._C.DisableTorchFunctionSubclass():
        noise = torch.empty_like(t).bernoulli_(1 - p)
        noise.div_(1 - p)
        scale = noise.view(-1).index_select(0, info.entries[0])
        if info.entries[3] or not t.is_contiguous():  # (x had -0.0: its zeros keep signs)
            out = t * noise
        else:
            out = _DropFeatures.apply(t, noise, info.entries[0], scale)
    return _as_features(out, info._replace(
        scale=scale if info.scale is None else scale * info.scale))


class _DropFeatures(torch.autograd.Function):
    """``t * noise`` where ``t`` is zero (+0.0) outside its entries at ``flat``: zeros and
    the entries' products (``scale``: the noise there), the values of the dense product
    without reading the whole of ``t`` and ``noise``."""

    @staticmethod
    def forward(ctx: Any, t: Tensor, noise: Tensor, flat: Tensor, scale: Tensor) -> Tensor:
        ctx.save_for_backward(noise)
        out = _SCRATCH.zeros(t, flat)
        out.view(-1).index_copy_(0, flat, t.reshape(-1).index_select(0, flat) * scale)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (noise,) = ctx.saved_tensors
        return grad * noise, None, None, None


def _fused_linear(t: RoundedFeatures, weight: Any, bias: Any = None) -> Tensor | None:
    """``F.linear(t, weight, bias)`` with the gradients of ``t``'s step and ranges from its
    non-zero entries; None where the plain path should run."""
    info = _valid_features(t)
    if info is None or type(weight) not in (Tensor, nn.Parameter) \
            or (bias is not None and type(bias) not in (Tensor, nn.Parameter)) \
            or t.dim() != 2 or weight.dim() != 2 or weight.dtype != t.dtype \
            or weight.device != t.device or not t.is_contiguous() \
            or torch.is_autocast_enabled(t.device.type):
        return None
    with torch._C.DisableTorchFunctionSubclass():
        values = t.detach()
    return _FeaturesLinear.apply(values, weight, bias, info.s, info.qmin, info.qmax, info)


class _FeaturesLinear(torch.autograd.Function):
    """``F.linear`` of rounded features that need no gradient themselves: the gradient of
    their step and ranges gathered at their non-zero entries (``out_grad[row] . W[:, col]``)
    instead of through the dense ``out_grad @ W``."""

    @staticmethod
    def forward(ctx: Any, values: Tensor, weight: Tensor, bias: Tensor | None, s: Tensor,
                qmin: Tensor, qmax: Tensor, info: _Features) -> Tensor:
        ctx.save_for_backward(values, weight, s, qmin, qmax)
        ctx.info = info
        ctx.has_bias = bias is not None
        return F.linear(values, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        values, weight, s, qmin, qmax = ctx.saved_tensors
        info: _Features = ctx.info
        grad_w = grad.t().mm(values) if ctx.needs_input_grad[1] else None
        grad_b = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        flat, row = info.entries[0], info.entries[1]
        col = flat - row * values.shape[1]
        columns = weight.t().contiguous()  # (a gather from the transposed view is ~15x slower)
        g = (grad.index_select(0, row) * columns.index_select(0, col)).sum(1)
        if info.scale is not None:
            g = g * info.scale
        grads = _entry_grads(values, info.entries, g, s, qmin, qmax, info.gain)
        return (None, grad_w, grad_b, *grads, None)


def lsq_round_features(x: Tensor, s: Tensor, qmin: Tensor | float, qmax: Tensor | float,
                       gain: float = 1.0) -> Tensor:
    """:func:`lsq_round` of a layer's input features. Where ``x`` needs no gradient and is
    mostly zeros (a dataset's bag-of-words features), the result is a
    :class:`RoundedFeatures`, whose dropout and linear transform give the step and ranges
    their gradients from the non-zero entries alone; the values and gradients are those
    of :func:`lsq_round` (up to the order of a sum's terms).

    Example:
        >>> x = torch.zeros(300, 400)
        >>> x[::7, ::5] = 0.3
        >>> s = torch.tensor(0.1, requires_grad=True)
        >>> y = lsq_round_features(x, s, -8, 7)
        >>> type(y).__name__, torch.equal(y, lsq_round(x, s, -8, 7))
        ('RoundedFeatures', True)
    """
    lo, hi = _tensor(qmin, x), _tensor(qmax, x)
    wanted = torch.is_grad_enabled() and x.dim() == 2 and type(x) is Tensor \
        and (s.requires_grad or lo.requires_grad or hi.requires_grad)
    return _LsqRound.apply(x, s, lo, hi, gain, 0.0, wanted)
