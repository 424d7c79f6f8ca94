"""The one place that reads a trained :class:`~fxquant.quant.points.QuantPoint`: what its
evaluation forward rounds to, as the integer kernels need it.

Everything else in :mod:`fxquant.execution` sees a point only through :class:`PointSpec`
(the integer grid, where its step comes from, the per-node widths, what cannot run on
integers) and :func:`node_widths` (which mirrors the point's evaluation lookup of per-node
widths). If the layout of ``QuantPoint`` changes, this module is the one to follow it.

A point is read through its documented interface only: :meth:`QuantPoint.grid
<fxquant.quant.points.QuantPoint.grid>` (an :class:`~fxquant.quant.grid.IntegerGrid`:
format, rounding, scale, where the step comes from, the learned or stored step and zero
point, whether codes take the step's reciprocal), its ``config`` (``range``,
``percentile``, ``node_bits``, ``protect``), its parts ``node_widths`` (``bits``,
``seen_range``, ``learned``), ``observer`` (``stored``, ``running``: the range per-node
steps are taken from) and ``override`` (``format``), and ``layer``, ``site``, ``tensor``,
``name``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from fxquant.formats import IntFormat, TopN
from fxquant.modes import Rounding, Scale, ScaleKind
from fxquant.quant import IntegerGrid, QuantPoint

__all__ = ["Grid", "PointSpec", "node_widths", "read_point"]

#: how a point's step is found in evaluation
STEP_LEARNED = "learned"  # a learned step (range="lsq"): fixed
STEP_OBSERVED = "observed"  # an observer's running or widest range: fixed
STEP_BATCH = "batch"  # the min/max of what it rounds, per tensor: computed each forward
STEP_BATCH_ROW = "batch-row"  # the min/max of each row: computed each forward
STEP_PERCENTILE = "percentile"  # a percentile of what it rounds: computed each forward


@dataclass(frozen=True)
class Grid:
    """An integer grid: codes ``qmin..qmax`` standing for ``code + offset`` steps (``offset``
    0.5 on a mid-rise grid), read with a zero point on an asymmetric one."""

    bits: int
    signed: bool
    asymmetric: bool
    midrise: bool

    @classmethod
    def of(cls, fmt: IntFormat) -> Grid:
        return cls(fmt.bits, fmt.signed, fmt.asymmetric, fmt.midrise)

    @property
    def offset(self) -> float:
        return 0.5 if self.midrise else 0.0

    def code_range(self, bits: Tensor | int | None = None) -> tuple[Tensor | int, Tensor | int]:
        """``(qmin, qmax)`` at this grid's width, or at per-node ``bits`` (then symmetric:
        ``-qmax..qmax`` on a signed grid that is not mid-rise, as per-node widths round)."""
        if bits is None:
            return _whole_range(self)
        if isinstance(bits, Tensor):
            b = bits.to(torch.int64)
            one = torch.ones_like(b)
            qmax = (one << (b - 1)) - 1 if self.signed else (one << b) - 1
            qmin = (-qmax - 1 if self.midrise else -qmax) if self.signed else qmax * 0
            return qmin, qmax
        qmax_i = 2 ** (bits - 1) - 1 if self.signed else 2 ** bits - 1
        qmin_i = (-qmax_i - 1 if self.midrise else -qmax_i) if self.signed else 0
        return qmin_i, qmax_i

    def spec(self) -> str:
        return IntFormat(self.bits, self.signed, self.asymmetric, self.midrise).spec()


@functools.lru_cache(maxsize=64)
def _whole_range(grid: Grid) -> tuple[int, int]:
    fmt = IntFormat(grid.bits, grid.signed, grid.asymmetric, grid.midrise)
    return fmt.qmin, fmt.qmax


@dataclass
class PointSpec:
    """What a trained point's evaluation forward does, in the terms integer kernels need.

    ``problems`` lists why it cannot run on integers (empty when it can); the other fields
    are then only partly filled.
    """

    module: str  # its name in the GraphModule
    label: str  # "output of 'conv1'": how messages name it
    layer: str
    site: str
    tensor: str
    grid: Grid | None
    rounding: str
    step_kind: str
    #: the fixed step (learned, or from an observer's range) and zero point; None when
    #: computed each forward
    step: Tensor | None
    zero_point: Tensor | None
    pow2: bool
    per_row: bool
    percentile: float | None
    #: per-node widths: the table over global node ids (float bits), its range, whether
    #: learned, which nodes training saw (learned only; -inf: unseen), and whether a
    #: decoder needs the table stored (False: it follows from the graph)
    widths: Tensor | None
    min_bits: int
    max_bits: int
    widths_learned: bool
    seen_range: Tensor | None
    widths_stored: bool
    protection: str | None  # training only: evaluation rounds every node
    #: codes are ``round(x * (1 / step))`` (the registered op's way) rather than
    #: ``round(x / step)`` (learned steps, per-node widths): IntegerGrid.reciprocal
    reciprocal: bool = True
    problems: list[str] = field(default_factory=list)

    @property
    def integer(self) -> bool:
        return not self.problems

    @property
    def uses_nodes(self) -> bool:
        return self.widths is not None

    def describe(self) -> str:
        if self.grid is None:
            return "-"
        text = self.grid.spec()
        if self.widths is not None:
            text += f" ({self.min_bits}..{self.max_bits} bits per node)"
        return f"{text}, step {self.step_kind}" + (" per row" if self.per_row else "")


def read_point(module: str, point: QuantPoint) -> PointSpec:
    """The :class:`PointSpec` of ``point`` (named ``module`` in its GraphModule) as its
    evaluation forward rounds; never changes the point."""
    config = point.config
    fmt = config.format
    problems = _problems(point)
    grid = Grid.of(fmt) if isinstance(fmt, IntFormat) else None
    read: IntegerGrid | None = None
    if not problems:
        # the grid of a probe: its step where the step is learned or stored (the data's own
        # range sets it otherwise, each forward), and how codes are computed
        read = point.grid(torch.zeros(1, 1))
        if read.source == "none":
            problems.append("it rounds to the integers themselves (no scale); please give it "
                            "a scale ('tensor' or 'row') or a learned step (range='lsq')")
            read = None
    scale = Scale.parse(config.scale)
    pow2 = bool(getattr(scale, "pow2", False))
    per_row = bool(getattr(scale, "per_row", False))
    step: Tensor | None = None
    zero_point: Tensor | None = None
    widths = point.node_widths
    source = read.source if read is not None else "data"
    if source == "learned":
        step_kind = STEP_LEARNED
        assert read is not None
        step = read.step.detach().to(torch.float32).reshape(()).clone()
    elif source == "stored":
        step_kind = STEP_OBSERVED
        assert read is not None
        if widths is None:
            step = read.step.detach().to(torch.float32).reshape(()).clone()
            zero_point = None if read.zero_point is None else \
                read.zero_point.detach().to(torch.float32).reshape(()).clone()
        else:  # per-node widths: each row's step is the stored range's magnitude / its levels
            observer = point.observer
            assert observer is not None and observer.stored
            step = observer.running.detach().to(torch.float32).abs().amax().clone()
    elif config.percentile is not None:
        step_kind = STEP_PERCENTILE
    elif per_row:
        step_kind = STEP_BATCH_ROW
    else:
        step_kind = STEP_BATCH
    seen = None
    rb = config.node_bits
    table = None
    if widths is not None and rb is not None:
        table = widths.bits.detach().to(torch.float32).clone()
        if widths.learned and widths.seen_range is not None:
            seen = widths.seen_range.detach().clone()
    protect = config.protect
    return PointSpec(
        module=module, label=point.name, layer=point.layer, site=point.site.value,
        tensor=point.tensor, grid=grid, rounding=Rounding.parse(config.rounding).value,
        step_kind=step_kind, step=step, zero_point=zero_point, pow2=pow2, per_row=per_row,
        percentile=config.percentile, widths=table,
        min_bits=rb.min_bits if rb is not None else 0,
        max_bits=rb.max_bits if rb is not None else 0,
        widths_learned=bool(rb is not None and rb.learned), seen_range=seen,
        widths_stored=bool(rb is None or rb.stored),
        protection=None if protect is None else protect.describe(),
        reciprocal=read.reciprocal if read is not None else True, problems=problems)


def _problems(point: QuantPoint) -> list[str]:
    """Why ``point`` cannot run on integers (empty when it can)."""
    config = point.config
    fmt = config.format
    problems: list[str] = []
    if not isinstance(fmt, IntFormat):
        kind = "top-N truncation" if isinstance(fmt, TopN) else "a float format"
        problems.append(f"its format {fmt.spec()} is {kind}, which has no integer codes; "
                        "please round it to an integer format (e.g. 'int8')")
    elif fmt.bits > 8:
        problems.append(f"its grid {fmt.spec()} is wider than 8 bits; the integer kernels "
                        "multiply and store 8-bit codes. Please train it at 8 bits or fewer")
    if Rounding.parse(config.rounding) is Rounding.STOCHASTIC:
        problems.append("it rounds stochastically, which draws random numbers in evaluation; "
                        "please train it with rounding='nearest'")
    scale = Scale.parse(config.scale)
    if isinstance(scale, ScaleKind):
        problems.append(f"its registered scale kind {scale.value!r} takes ranges the integer "
                        "kernels do not compute; please use scale='tensor' or 'row'")
    elif scale.per_block:
        problems.append("its block-32 scales are not supported by the integer kernels; please "
                        "use scale='tensor' or 'row'")
    if point.override is not None:
        problems.append("it rounds some nodes to another format (a node override), which the "
                        "integer kernels do not support; please use per-node bit-widths "
                        "(NodeBits) instead")
    return problems


def node_widths(spec: PointSpec, ids: Tensor | None, num_nodes: int,
                node_range: Callable[[], Tensor] | None = None) -> Tensor:
    """Each node's bit-width (float, whole numbers) as the point's evaluation looks it up:
    by global id (``ids``) or row ``i`` is node ``i``; nodes outside the table, and learned
    nodes training never saw, take the width of the seen node whose range is nearest
    (``node_range()``: each node's ``max |value|``, asked for only then; the table's mean
    where nothing was seen)."""
    table = spec.widths
    assert table is not None
    device = table.device
    nodes = ids.to(torch.int64) if ids is not None else torch.arange(num_nodes, device=device)
    known = (nodes >= 0) & (nodes < table.shape[0])
    if spec.seen_range is not None:
        seen_at = spec.seen_range[nodes.clamp(0, max(table.shape[0] - 1, 0))]
        known = known & torch.isfinite(seen_at)
    bits = table[nodes.clamp(0, max(table.shape[0] - 1, 0))] if table.numel() else \
        torch.zeros(nodes.shape, device=device)
    if not bool(known.all()):
        ranges = node_range() if node_range is not None and spec.seen_range is not None \
            else None
        bits = torch.where(known, bits, _nearest_seen(spec, ranges, table, nodes.shape[0]))
    bits = bits.clamp(spec.min_bits, spec.max_bits)
    return bits.round() if spec.widths_learned else bits


def _nearest_seen(spec: PointSpec, node_range: Tensor | None, table: Tensor, n: int) -> Tensor:
    """A2Q's rule for nodes the table does not know (as the point's evaluation applies it)."""
    seen = spec.seen_range
    if seen is None or node_range is None:
        if not table.numel():
            return torch.full((n,), float(spec.max_bits), device=table.device)
        return table.mean().expand(n)
    order = torch.sort(seen)
    count = torch.isfinite(seen).sum()
    first = seen.shape[0] - count
    pos = torch.searchsorted(order.values, node_range.to(seen.dtype).contiguous())
    hi = torch.minimum(torch.maximum(pos, first), torch.full_like(pos, seen.shape[0] - 1))
    lo = torch.minimum(torch.maximum(hi - 1, first), hi)
    closer_lo = (node_range - order.values[lo]).abs() < (order.values[hi] - node_range).abs()
    pick = torch.where(closer_lo, lo, hi)
    return torch.where(count > 0, table[order.indices[pick]], table.mean())
