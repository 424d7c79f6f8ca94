"""Observers: modules that watch what flows through a quantization point and hand its op a
range, ``bounds = (lo, hi)``.

- :class:`RangeObserver`: min/max or a percentile range (Degree-Quant's, robust to the
  outliers high-degree aggregation makes), of the current batch in training and, with
  ``decay``, of a running average in eval (as BatchNorm keeps its statistics).

Under ``torch.distributed`` (a default process group with more than one rank), a
per-tensor range is synchronized in training the way ``SyncBatchNorm`` synchronizes its
statistics: each rank's batch range is all-reduced (min of the lows and max of the highs;
the mean of percentile bounds) before it is used and blended into the running range. Every
rank therefore rounds with the range of the global batch and keeps the same running range,
so all ranks evaluate the same model. Per-row ranges (rows are each rank's own nodes) are
not synchronized.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.fx.experimental.symbolic_shapes import guard_or_true

from fxquant._ops.scales import finite_bounds
from fxquant.errors import FxquantValueError, warn_renamed
from fxquant.modes import Grad
from fxquant.quant.config import QuantConfig, check_decay

__all__ = ["SAMPLE", "RangeObserver", "percentile_bounds"]

#: Values a percentile is taken over at most (a strided sample of the tensor).
SAMPLE = 1 << 16


def percentile_bounds(x: Tensor, q: float) -> Tensor:
    """``(lo, hi)``: the ``100 - q`` and ``q`` percentiles of the finite values of ``x``
    (zeros where there are none).

    Taken on an evenly strided sample of at most :data:`SAMPLE` values (deterministic: no
    random numbers are drawn), so an observer step costs less than one pass over ``x``.

    Example:
        >>> x = torch.cat([torch.linspace(-1, 1, 1001), torch.tensor([1000.0])])
        >>> percentile_bounds(x, 99.0)
        tensor([-0.9800,  0.9800])
    """
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 50 < q <= 100:
        raise FxquantValueError(f"percentile_bounds: q must be a number in (50, 100], got {q!r}")
    return _percentiles(x, q)[0]


def _percentiles(x: Tensor, q: float, exclude: Tensor | None = None
                 ) -> tuple[Tensor, Tensor]:
    """:func:`percentile_bounds`, and whether the sample held a finite value; rows (dim 0)
    where ``exclude`` is True are left out."""
    flat = x.detach().reshape(-1)
    if flat.numel() == 0:  # nanquantile refuses an empty tensor
        return x.new_zeros(2, dtype=torch.float32), torch.zeros((), dtype=torch.bool,
                                                                device=x.device)
    stride = max(1, math.ceil(flat.numel() / SAMPLE))
    sample = flat[::stride].float()
    # Non-finite values are left out (as NaN, which nanquantile skips): fixed shapes compile.
    keep = torch.isfinite(sample)
    if exclude is not None:  # the sampled values' rows, without a pass over all of x
        per_row = max(1, flat.numel() // max(x.shape[0], 1))
        rows = torch.arange(0, flat.numel(), stride, device=x.device) // per_row
        keep = keep & ~exclude[rows]
    # torch.nanquantile(sample, qs, interpolation="lower") over the kept values, from the
    # few values at each end (topk) instead of a sort of the whole sample: the same ranks,
    # computed as ATen computes them, in float32
    qs = torch.tensor([1.0 - q / 100.0, q / 100.0], dtype=sample.dtype, device=sample.device)
    count = keep.sum()
    ranks = (qs * (count - 1)).floor().clamp(min=0)
    k = min(sample.numel(), math.ceil((1.0 - q / 100.0) * sample.numel()) + 2)
    low = _top_values(torch.where(keep, sample, math.inf), k, largest=False)  # ascending
    high = _top_values(torch.where(keep, sample, -math.inf), k, largest=True)  # descending
    at_low = ranks[0].clamp(max=k - 1).long().reshape(1)
    at_high = ((count - 1) - ranks[1]).clamp(0, k - 1).long().reshape(1)
    bounds = torch.cat([low.index_select(0, at_low), high.index_select(0, at_high)])
    found = count > 0
    return torch.where(found, bounds, 0.0), found


#: values per group in :func:`_top_values`
_GROUP = 16


def _top_values(v: Tensor, k: int, largest: bool) -> Tensor:
    """``v.topk(k, largest=largest).values`` (1-d ``v`` without NaN), computed from the
    ``k`` best of ``v``'s groups instead of a selection over all of ``v``: several times
    faster for a few values out of many.

    ``v`` is split into groups of :data:`_GROUP` values (strided, so one reduction over a
    contiguous view gives each group's best); the ``k`` values are among the ``k`` groups
    with the best bests. Any top value that lies outside those groups is tied with values
    inside them (each of the ``k`` groups holds one at least as good), so the values
    returned, sorted, are exactly topk's.
    """
    n = v.numel()
    # groups that would not save a selection, or sizes known only at run time (compiled
    # with data-dependent shapes: undecided counts as too small)
    if guard_or_true(2 * _GROUP * k > n):
        return v.topk(k, largest=largest).values
    pad = (-n) % _GROUP
    if pad:  # with the worst value, which every value beats or ties
        v = torch.nn.functional.pad(v, (0, pad), value=-math.inf if largest else math.inf)
    groups = v.view(_GROUP, -1)  # group j: v[j], v[j + n / GROUP], ...
    best = groups.amax(0) if largest else groups.amin(0)
    chosen = best.topk(k, largest=largest, sorted=False).indices
    return groups.index_select(1, chosen).reshape(-1).topk(k, largest=largest).values


class RangeObserver(nn.Module):
    """Gives the range ``(lo, hi)`` of what flows through it (a tensor of shape ``(2,)``, or
    ``(rows, 2)`` with ``per_row``).

    Args:
        per_row (bool, optional): one range per row (dim 0). (default: :obj:`False`)
        decay (float, optional): keep ``running = decay * running + (1 - decay) *
            current`` (the first batch sets it; ``decay`` is the old range's weight, the
            complement of BatchNorm's ``momentum``) and use it in eval; per tensor only.
            (default: :obj:`None`: always the current range)
        percentile (float, optional): ``q`` in ``(50, 100]``: the range is the ``100 - q``
            to ``q`` percentile instead of min to max. (default: :obj:`None`)
        widen (bool, optional): keep the widest range seen in training (the first batch
            sets it, later ones only widen it: :class:`torch.ao.quantization.MinMaxObserver`)
            and use it in training and eval; per tensor only. (default: :obj:`False`)
        momentum (float, optional): the old name of ``decay`` (the same number);
            deprecated, with a :class:`FutureWarning`.

    ``forward(x, exclude)`` leaves the rows where ``exclude`` is True out of the range
    (Degree-Quant's protected rows, which are not rounded).

    Example:
        >>> obs = RangeObserver(decay=0.5)
        >>> obs(torch.tensor([1.0, -4.0])), obs(torch.tensor([2.0, 0.0])), obs.running
        (tensor([-4.,  1.]), tensor([0., 2.]), tensor([-2.0000,  1.5000]))
        >>> obs.eval()(torch.tensor([100.0]))
        tensor([-2.0000,  1.5000])
    """

    running: Tensor
    seen: Tensor

    def __init__(self, per_row: bool = False, decay: float | None = None,
                 percentile: float | None = None, widen: bool = False, *,
                 momentum: float | None = None) -> None:
        super().__init__()
        decay = check_decay(decay, momentum, "RangeObserver: ")
        if widen and (per_row or decay is not None):
            raise FxquantValueError("a widening range is kept per tensor and without a decay")
        if decay is not None and (isinstance(decay, bool) or not isinstance(
                decay, (int, float)) or not 0 <= decay < 1):
            raise FxquantValueError(f"decay must be a number in [0, 1) (the old range's "
                                    f"weight), got {decay!r}")
        if decay is not None and per_row:
            raise FxquantValueError("a running range is kept per tensor; rows are different nodes in "
                             "every batch, so per-row ranges are always the current ones")
        if percentile is not None and (isinstance(percentile, bool) or not isinstance(
                percentile, (int, float)) or not 50 < percentile <= 100):
            raise FxquantValueError(f"percentile must be a number in (50, 100], got {percentile!r}")
        if percentile is not None and per_row:
            raise FxquantValueError("percentile ranges are taken per tensor; please use scale='tensor'")
        self.per_row = per_row
        self.decay = None if decay is None else float(decay)
        self.percentile = None if percentile is None else float(percentile)
        self.widen = bool(widen)
        self.register_buffer("running", torch.zeros(2))
        self.register_buffer("seen", torch.zeros((), dtype=torch.bool))
        #: a training batch has set ``running`` (a Python flag, so compiled code does not
        #: branch on a tensor)
        self.calibrated = False

    @classmethod
    def from_config(cls, config: QuantConfig) -> RangeObserver | None:
        """The observer a point with ``config`` needs: one for a running, widening or
        percentile range, a clipped gradient or ranges over unprotected rows (else the op
        takes each tensor's own range, and None is returned)."""
        protect = config.protect
        if config.decay is not None or config.percentile is not None \
                or config.observe == "widen" or config.grad is Grad.CLIPPED \
                or (protect is not None and protect.ranges == "unprotected"):
            return cls(config.scale.per_row, config.decay, config.percentile,
                       widen=config.observe == "widen")
        return None

    @property
    def momentum(self) -> float | None:
        """The old name of :attr:`decay` (the same number); deprecated."""
        warn_renamed("RangeObserver.momentum", "RangeObserver.decay (the same number)")
        return self.decay

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "momentum" in state:  # pickled before the rename
            state["decay"] = state.pop("momentum")
        super().__setstate__(state)

    @property
    def stored(self) -> bool:
        """Whether evaluation uses a range kept in the state (running or widened, once a
        training batch set it), not the tensor's own."""
        return (self.decay is not None or self.widen) and self.calibrated

    def eval_bounds(self, x: Tensor) -> Tensor:
        """The range evaluation rounds ``x`` with (what :meth:`forward` returns in
        evaluation), without changing any state."""
        if self.stored:
            return self.running.clone()
        return self._current(x)[0]

    def current(self, x: Tensor) -> Tensor:
        """The range of the finite values of ``x`` itself (zeros where there are none)."""
        return self._current(x)[0]

    def _current(self, x: Tensor, exclude: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The range, and whether ``x`` held a finite value to take it from."""
        if exclude is not None and not x.dim():
            exclude = None
        if self.percentile is not None:
            return _percentiles(x, self.percentile, exclude)
        if exclude is not None:  # left out as NaN, which the range skips (compiles)
            x = torch.where(exclude.view((-1,) + (1,) * (x.dim() - 1)), math.nan, x.detach())
        bounds, found = finite_bounds(x.detach(), self.per_row)
        return bounds.float(), found

    def forward(self, x: Tensor, exclude: Tensor | None = None) -> Tensor:
        if exclude is not None and not x.is_floating_point():
            exclude = None
        if self.decay is None and not self.widen:
            return self._synced(self._current(x, exclude)[0])
        if not self.training:  # before any training batch: the current range, not (0, 0)
            return self.running if self.calibrated else self._current(x, exclude)[0]
        now, found = self._current(x, exclude)
        now, found = self._synced_found(now.to(self.running.dtype), found)
        with torch.no_grad():  # a batch without finite values leaves the running range
            if self.widen:
                kept = torch.stack([torch.minimum(self.running[0], now[0]),
                                    torch.maximum(self.running[1], now[1])])
            else:
                assert self.decay is not None
                kept = self.decay * self.running + (1 - self.decay) * now
            self.running.copy_(torch.where(found, torch.where(self.seen, kept, now),
                                           self.running))
            self.seen.logical_or_(found)
        self.calibrated = True
        return self.running.clone() if self.widen else now

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args)
        self.calibrated = bool(self.seen)

    def _synced(self, now: Tensor) -> Tensor:
        """The range over all ranks' batches (training, per tensor, distributed only)."""
        return self._synced_found(now, None)[0]

    def _synced_found(self, now: Tensor, found: Tensor | None) -> tuple[Tensor, Tensor]:
        """:meth:`_synced`, leaving out ranks whose batch held no finite value (``found``
        False), and whether any rank's did."""
        yes = torch.ones((), dtype=torch.bool, device=now.device)
        if self.per_row or not self.training or not dist.is_available() \
                or not dist.is_initialized() or dist.get_world_size() < 2:
            return now, yes if found is None else found
        if self.percentile is not None:
            mine = yes.to(now.dtype) if found is None else found.to(now.dtype)
            total = torch.cat([now * mine, mine.reshape(1)])
            dist.all_reduce(total, op=dist.ReduceOp.SUM)
            return total[:2] / total[2].clamp(min=1), total[2] > 0
        lo, hi = now[0], now[1]
        if found is not None:  # no finite value: no say in the min and max
            lo = torch.where(found, lo, math.inf)
            hi = torch.where(found, hi, -math.inf)
        flipped = torch.stack([-lo, hi])  # one MAX gives min of lows, max of highs
        dist.all_reduce(flipped, op=dist.ReduceOp.MAX)
        out = torch.stack([-flipped[0], flipped[1]])
        anywhere = torch.isfinite(out[0])
        return torch.where(anywhere, out, 0.0), anywhere

    def extra_repr(self) -> str:
        parts = ["per_row" if self.per_row else "per tensor"]
        if self.percentile is not None:
            parts.append(f"percentile={self.percentile}")
        if self.decay is not None:
            parts.append(f"decay={self.decay}")
        if self.widen:
            parts.append("widen")
        return ", ".join(parts)
