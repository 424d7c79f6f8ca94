"""Messages rounded to a point's codes and summed exactly, and the sums rounded to the next
point's codes as the simulation rounds its float32 sums.

A layer's messages are ``coef_e * values[src_e]`` (GCN's normalization, GAT's attention)
or the sender's own values (SAGE, GIN). Their codes are summed exactly: float32 holds
every integer up to ``2**24``, so where every sum stays below it (in-degree x the largest
code <= ``2**24``) the codes are summed in float32 (``accumulate="auto"``), else (and with
``accumulate="int32"``) in ``int32`` by ``index_add_``. In float32 the sums are a sparse
product: the graph's adjacency (messages that are the sender's codes: each sender's codes
once, ``A @ codes``) or a segment sum over the edges sorted by target (per-edge messages),
which torch's CPU sparse kernels run several times faster than a scatter. On large graphs
per-edge messages are streamed in chunks of edges sorted by target and never materialized
whole; the range a per-tensor step is taken from comes from each node's row range and each
edge's coefficient (rounding is monotonic, so the extremes of the products are the
products of the extremes).

The point after the sums (the aggregate point) rounds them as the simulation rounds its
float32 sums. The two agree except where a sum lies on a rounding boundary of that point,
or sets the range its step is taken from: there the simulation's own float32 rounding
error (it adds the messages' values one by one, in edge order) picks the code. Sums of
codes land on such boundaries exactly and often (a step taken from the largest sum makes
every sum a fraction of it), so with ``ties="simulation"`` those elements, and only
those, are summed again as the simulation sums them: its message values added in edge
order in float32. Where the simulation's float32 sums are themselves exact (a step of few
mantissa bits, such as a power of two), nothing is summed again.
"""

from __future__ import annotations

import math
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fxquant.execution.kernels import QTensor
from fxquant.execution.quantizer import (
    IntQuantizer,
    RoundPlan,
    finite_row_magnitudes,
    round_levels,
    tensor_range,
)
from fxquant.quant.observers import percentile_bounds

__all__ = ["EXACT_FLOAT", "TIE_TOLERANCE", "EdgeOrder", "GraphCache", "Messages",
           "accumulator", "aggregate", "extreme_rows", "round_sums", "tie_rows"]

#: message values per chunk (per-edge messages on a large graph)
CHUNK = 1 << 18

#: the largest sum of codes a float32 accumulator holds exactly (every integer up to 2**24)
EXACT_FLOAT = 1 << 24

#: how close (in steps) to a rounding boundary a sum must lie to be summed again the
#: simulation's way
TIE_TOLERANCE = 1e-4

#: how close (relative) to the extremes of the sums a sum must lie to be summed again
#: where the next step is taken from their range
EXTREME_TOLERANCE = 1e-4

#: elements per block where :func:`beyond` looks for values past a threshold
BLOCK = 256
#: the fewest elements :func:`beyond` looks at block by block (fewer: each one)
_BLOCKED_FROM = 1 << 16

#: (element, message) slots a replay may pad beyond twice the pairs it sums (more: one
#: slot per pair)
_PADDED_EXTRA = 4096
#: sums replayed at once where every sum is (a percentile step)
_REPLAYED = 1 << 14


class EdgeOrder:
    """A graph's edges sorted by target (stable: each node's edges keep their order), with
    each node's in-degree and the sparse matrices that sum messages by target."""

    def __init__(self, src: Tensor, dst: Tensor, n: int) -> None:
        self.src, self.dst, self.n = src, dst, n
        self.perm = torch.argsort(dst, stable=True)
        self.sorted_dst = dst.index_select(0, self.perm)
        self.sorted_src = src.index_select(0, self.perm)
        self.degree = torch.bincount(dst, minlength=n) if dst.numel() \
            else torch.zeros(n, dtype=torch.long, device=dst.device)
        self.count = self.degree.to(torch.float32)
        self.ptr = torch.zeros(n + 1, dtype=torch.long, device=dst.device)
        torch.cumsum(self.degree, 0, out=self.ptr[1:])
        self.max_degree = int(self.degree.max()) if n else 0
        self._edge_sum: Tensor | None = None
        self._node_sum: Tensor | None = None
        self._senders: tuple[Tensor | None] | None = None

    @property
    def edges(self) -> int:
        return int(self.perm.shape[0])

    def edge_sum(self) -> Tensor:
        """``(n, edges)`` CSR of ones: ``edge_sum() @ m`` sums the rows of ``m`` (one per
        edge, sorted by target) into their targets."""
        if self._edge_sum is None:
            e = self.edges
            self._edge_sum = _csr(self.ptr, torch.arange(e, device=self.ptr.device),
                                  torch.ones(e, device=self.ptr.device), (self.n, e))
        return self._edge_sum

    def node_sum(self) -> Tensor:
        """``(n, n)`` CSR adjacency (repeated edges counted): ``node_sum() @ c`` sums each
        node's senders' rows of ``c``."""
        if self._node_sum is None:
            n = self.n
            pairs, counts = torch.unique(self.sorted_dst * max(n, 1) + self.sorted_src,
                                         return_counts=True)
            rows, cols = pairs // max(n, 1), pairs % max(n, 1)
            ptr = torch.zeros(n + 1, dtype=torch.long, device=rows.device)
            torch.cumsum(torch.bincount(rows, minlength=n), 0, out=ptr[1:])
            self._node_sum = _csr(ptr, cols, counts.to(torch.float32), (n, n))
        return self._node_sum

    def senders(self) -> Tensor | None:
        """The nodes that send a message (None: every node does)."""
        if self._senders is None:
            sends = torch.zeros(self.n, dtype=torch.bool, device=self.src.device)
            sends[self.src] = True
            self._senders = (None if bool(sends.all()) else sends.nonzero().view(-1),)
        return self._senders[0]


def _csr(ptr: Tensor, cols: Tensor, values: Tensor, size: tuple[int, int]) -> Tensor:
    """A sparse CSR matrix (its layout built here, valid by construction)."""
    with warnings.catch_warnings():  # (torch says once that sparse CSR is in beta)
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(ptr, cols, values, size, check_invariants=False)


class GraphCache:
    """What a model computes once per graph (a normalization, the edge order), kept per
    kind of preparation while the same ``edge_index`` tensor (and edge weights) is passed
    again unchanged: the tensor itself (held by a weak reference, so a new tensor at a
    freed one's address is a new graph) and its version counter (an in-place change is a
    new graph)."""

    def __init__(self) -> None:
        self.entries: dict[Any, tuple[Any, Any, Any]] = {}

    def get(self, key: Any, edge_index: Tensor, extra: Tensor | None, n: int,
            build: Callable[[], Any]) -> Any:
        ident = (_identity(edge_index), None if extra is None else _identity(extra), n)
        found = self.entries.get(key)
        if found is not None and ident[0] is not None and _same(found[0], ident):
            return found[2]
        value = build()
        if ident[0] is not None and (extra is None or ident[1] is not None):
            self.entries[key] = (ident, None, value)
        return value


def _identity(t: Tensor) -> tuple[weakref.ref[Tensor], int] | None:
    try:
        return weakref.ref(t), t._version
    except (RuntimeError, TypeError):  # (inference tensors have no version counter)
        return None


def _same(kept: Any, now: Any) -> bool:
    def one(a: Any, b: Any) -> bool:
        if a is None or b is None:
            return a is None and b is None
        return a[0]() is not None and a[0]() is b[0]() and a[1] == b[1]
    return one(kept[0], now[0]) and one(kept[1], now[1]) and kept[2] == now[2]


class Messages:
    """One call's messages, computable for any edges: ``coef[e] * values[src[e]]``
    (``coef`` one number per edge, or per edge and head for ``values`` of shape
    ``(nodes, heads, channels)``), or ``values[src[e]]`` without ``coef``."""

    def __init__(self, values: Tensor, order: EdgeOrder, coef: Tensor | None = None,
                 sorted_coef: Tensor | None = None,
                 settle: Callable[[Tensor], Tensor] | None = None) -> None:
        self.values, self.order, self.coef = values, order, coef
        self.src, self.dst = order.src, order.dst
        #: the rows of ``values`` (ids) as the simulation computes them in float32, where
        #: they are computed on integers here (a product): see :meth:`settle_extremes`
        self.settle = settle
        #: ``coef`` in the order of the targets (given where it is kept per graph)
        self.sorted_coef = sorted_coef if sorted_coef is not None or coef is None \
            else coef.index_select(0, order.perm)

    @property
    def width(self) -> int:
        return int(torch.Size(self.values.shape[1:]).numel())

    def sorted_floats(self, start: int, stop: int) -> Tensor:
        """The float32 messages of the edges ``start:stop`` in the order of the targets."""
        m = self.values.index_select(0, self.order.sorted_src[start:stop])
        if self.sorted_coef is not None:  # (in place: a product is the same either way)
            c = self.sorted_coef[start:stop]
            m.mul_(c.view(c.shape + (1,) * (m.dim() - c.dim())))
        return m

    def floats(self, edges: Tensor | None = None) -> Tensor:
        """The float32 messages of ``edges`` (all: None), as the simulation computes them."""
        src = self.src if edges is None else self.src.index_select(0, edges)
        m = self.values.index_select(0, src)
        if self.coef is not None:
            c = self.coef if edges is None else self.coef.index_select(0, edges)
            m = c.view(c.shape + (1,) * (m.dim() - c.dim())) * m
        return m

    def rows(self, positions: Tensor) -> Tensor:
        """The float32 messages at ``positions`` (edges in target order)."""
        m = self.values.index_select(0, self.order.sorted_src.index_select(0, positions))
        if self.sorted_coef is not None:
            c = self.sorted_coef.index_select(0, positions)
            m = c.view(c.shape + (1,) * (m.dim() - c.dim())) * m
        return m

    def elements(self, positions: Tensor, columns: Tensor) -> Tensor:
        """The float32 message values at ``positions`` (edges in target order) and
        ``columns`` (of a message flattened), one each."""
        values = self.values.reshape(self.values.shape[0], self.width)
        src = self.order.sorted_src.index_select(0, positions)
        m = values.reshape(-1).index_select(0, src * values.shape[1] + columns)
        if self.sorted_coef is not None:
            c = self.sorted_coef.index_select(0, positions)
            if c.dim() > 1:  # per head: the column's head
                per_head = values.shape[1] // c.shape[1]
                c = c.gather(1, (columns // per_head).view(-1, 1)).view(-1)
            m = c * m
        return m

    def _row_extremes(self) -> tuple[Tensor, Tensor]:
        """Each node's (and head's) smallest and largest value."""
        v = self.values
        keep = 1 if self.coef is None or self.coef.dim() == 1 else self.coef.dim()
        flat = v.reshape((*v.shape[:keep], -1))
        if flat.shape[-1] == 0:
            zero = flat.new_zeros(flat.shape[:-1])
            return zero, zero
        return flat.amin(-1), flat.amax(-1)

    def _edge_extremes(self) -> tuple[Tensor, Tensor]:
        """Each message's smallest and largest value, from its sender's row extremes and
        its coefficient (kept for the call)."""
        cached = self.__dict__.get("_extremes")
        if cached is not None:
            return cached
        rmin, rmax = self._row_extremes()
        lo_s, hi_s = rmin.index_select(0, self.src), rmax.index_select(0, self.src)
        if self.coef is not None:
            c = self.coef.view(self.coef.shape + (1,) * (lo_s.dim() - self.coef.dim()))
            a, b = c * lo_s, c * hi_s
            lo_s, hi_s = torch.minimum(a, b), torch.maximum(a, b)
        if lo_s.dim() > 1:
            lo_s, hi_s = lo_s.amin(tuple(range(1, lo_s.dim()))), hi_s.amax(
                tuple(range(1, hi_s.dim())))
        self.__dict__["_extremes"] = (lo_s, hi_s)
        return lo_s, hi_s

    def bounds(self) -> tuple[float, float]:
        """``(lo, hi)`` of every message, from the senders' row extremes and the
        coefficients, without the messages themselves."""
        if not self.src.numel() or not self.values.numel():
            return 0.0, 0.0
        if self.coef is None:  # the senders' own values
            senders = self.order.senders()
            return tensor_range(self.values if senders is None
                                else self.values.index_select(0, senders))
        lo_e, hi_e = self._edge_extremes()
        lo, hi = lo_e.amin().item(), hi_e.amax().item()
        if not (math.isfinite(lo) and math.isfinite(hi)):  # (the messages' own finite ones)
            return tensor_range(self.floats())
        return lo, hi

    def settle_extremes(self, bounds: tuple[float, float], signed: bool
                        ) -> tuple[float, float]:
        """The messages' range as the simulation has it: the senders of the messages at
        (or within :data:`EXTREME_TOLERANCE` of) the extremes recomputed its way
        (``settle``), in place, and the range taken again."""
        if self.settle is None or self.coef is None or not self.src.numel() \
                or not self.values.numel():
            return bounds
        lo, hi = bounds
        margin = EXTREME_TOLERANCE * max(abs(lo), abs(hi))
        lo_e, hi_e = self._edge_extremes()
        if signed:
            top = max(abs(lo), abs(hi)) - margin
            near = (lo_e <= -top) | (hi_e >= top)
        else:
            near = (lo_e <= lo + margin) | (hi_e >= hi - margin)
        rows = torch.unique(self.src[near])
        if not rows.numel():
            return bounds
        self.values[rows] = self.settle(rows).to(self.values.dtype)
        self.__dict__.pop("_extremes", None)
        return self.bounds()

    def settled(self, positions: Tensor) -> bool:
        """Recompute the senders of the messages at ``positions`` (flat indices of the
        messages in target order) as the simulation computes them (``settle``), kept in
        ``values``; whether any of their rows changed (see :meth:`resettle`)."""
        assert self.settle is not None
        edges = torch.div(positions, max(1, self.width), rounding_mode="floor")
        senders = self.order.sorted_src.index_select(0, edges)
        rows = self.settle(senders).to(self.values.dtype)
        changed = (rows != self.values.index_select(0, senders)).reshape(
            rows.shape[0], -1).any(1)
        if not bool(changed.any()):
            return False
        self.values[senders] = rows
        self.__dict__.pop("_extremes", None)
        self.__dict__["_settled"] = senders[changed]
        return True

    def resettle(self, whole: Tensor) -> None:
        """Every message of ``whole`` (the messages in target order, computed before
        :meth:`settled`) whose sender's row :meth:`settled` changed, computed again from
        that row: the extreme's sender sends other messages, whose values
        may be the extreme's simple fractions (a ratio of two normalization coefficients)
        and lie on a rounding boundary of the step taken from it."""
        senders = self.__dict__.pop("_settled", None)
        if senders is None or not whole.numel():
            return
        src = self.order.sorted_src
        # (a few senders: compared one by one, far faster than torch.isin's sort)
        sent = (src.view(-1, 1) == senders.view(1, -1)).any(1) if senders.numel() <= 8 \
            else torch.zeros(self.order.n, dtype=torch.bool, device=src.device).index_fill_(
                0, senders, True).index_select(0, src)
        positions = sent.nonzero().view(-1)
        whole[positions] = self.rows(positions)

    def target_range(self, n: int) -> Tensor:
        """Each target node's largest ``|message|`` (0 without messages)."""
        rmin, rmax = self._row_extremes()
        mag = torch.maximum(rmin.abs(), rmax.abs()).index_select(0, self.src)
        if self.coef is not None:
            mag = self.coef.abs().view(self.coef.shape + (1,) * (mag.dim() - self.coef.dim())) \
                * mag
        mag = mag.reshape(mag.shape[0], -1).amax(1) if mag.dim() > 1 else mag
        out = torch.zeros(n, dtype=mag.dtype, device=mag.device)
        return out.scatter_reduce(0, self.dst, mag, "amax")


def aggregate(point: IntQuantizer, messages: Messages, order: EdgeOrder, ids: Tensor | None,
              *, mean: bool = False, then: IntQuantizer | None = None,
              record: Callable[[IntQuantizer, QTensor], QTensor] | None = None,
              chunk: int = CHUNK, accumulate: str = "auto",
              ties: bool = True) -> Tensor | QTensor:
    """Each node's sum (``mean``: average) of its messages rounded to ``point``'s codes:
    the codes summed exactly, then rescaled to float32 values; with ``then`` (the point
    that rounds the sums next) its codes, as :func:`round_sums` gives them. ``record``
    receives every message's codes, in edge order; ``chunk``: message values per chunk;
    ``accumulate``: see :func:`accumulator`; ``ties``: sum again the simulation's way
    where its float32 error picks the next point's code."""
    n = order.n
    values = messages.values
    row_shape = tuple(values.shape[1:])
    width = max(1, messages.width)
    edges = order.edges
    nodes_send = messages.coef is None  # a message is its sender's own values
    whole: Tensor | None = None  # the messages in target order, where materialized
    bounds: tuple[float, float] | None = None
    if point.needs_range:
        if point.spec.step_kind == "percentile":  # (of the messages, in edge order)
            assert point.spec.percentile is not None
            lo_t, hi_t = percentile_bounds(messages.floats(), point.spec.percentile).tolist()
            bounds = (float(lo_t), float(hi_t))
        elif nodes_send or edges * width > chunk:
            bounds = messages.bounds()
            if ties and point.spec.step_kind == "batch":
                bounds = messages.settle_extremes(bounds, _reads_magnitude(point))
        else:
            whole = messages.sorted_floats(0, edges)
            bounds = tensor_range(whole)
            if ties and point.spec.step_kind == "batch" and messages.settle is not None \
                    and whole.numel():
                bounds = _settle_message_extremes(point, messages, whole, bounds)
    plan = point.plan(bounds, ids=ids, num_nodes=n,
                      node_range=lambda: messages.target_range(n))
    if record is not None:
        record(point, _edge_codes(plan, messages))
    shape = (-1,) + (1,) * len(row_shape)
    if plan.scale is None and plan.node_bits is None:
        # a step per message (its own range): summed as the simulation sums the values
        vals = plan.codes(messages.floats(), row_nodes=messages.dst).dequantize()
        index = messages.dst.view(shape).expand_as(vals)
        total = torch.zeros((n, *row_shape), device=values.device).scatter_add_(0, index, vals)
        if mean:
            total = total / order.count.clamp(min=1).view(shape)
        return total if then is None else then(total, ids=ids)
    exact = accumulator(accumulate, order, point)
    if nodes_send and plan.per_tensor:  # each sender's codes once, summed by the adjacency
        levels = plan.levels(values.reshape(values.shape[0], messages.width))
        if exact is torch.float32:
            sums = order.node_sum() @ levels if edges else levels.new_zeros(n, levels.shape[1])
        else:
            sums = torch.zeros((n, levels.shape[1]), dtype=torch.int32, device=values.device)
            sums.index_add_(0, order.sorted_dst, levels.to(torch.int32).index_select(
                0, order.sorted_src))
        del levels  # (a float32 copy of the values: freed before the sums are rescaled)
        sums = sums.view(n, *row_shape)
    else:
        sums = torch.zeros((n, *row_shape), dtype=exact, device=values.device)
        step = max(1, chunk // width)
        for start in range(0, edges, step):
            stop = min(start + step, edges)
            m = whole if whole is not None and (start, stop) == (0, edges) else \
                messages.sorted_floats(start, stop)
            levels = plan.levels(m, row_nodes=order.sorted_dst[start:stop])
            if exact is torch.float32 and (start, stop) == (0, edges):
                sums = (order.edge_sum() @ levels.reshape(edges, width)).view(n, *row_shape)
            else:
                sums.index_add_(0, order.sorted_dst[start:stop], levels.to(exact))
    total = _sum_values(plan, sums, order, shape, mean)
    if then is None:
        return total
    replay = None
    if ties and not _exact_in_float(plan, order):
        def replay(elements: Tensor) -> Tensor:
            return _replay_sums(plan, messages, order, width, mean, elements)
    return round_sums(then, total, replay, ids)


def _sum_values(plan: RoundPlan, sums: Tensor, order: EdgeOrder, shape: tuple[int, ...],
                mean: bool) -> Tensor:
    """The float32 values of the sums of codes: ``(sum + count x (offset - zero point)) x
    step`` (the step per target node with per-node widths over a range), divided by the
    count for a mean; ``sums`` (float32) is written in place."""
    total = sums.to(torch.float32)  # (written in place: the sums are the caller's own)
    shift = plan.q.grid.offset - (plan.zero_point or 0.0)
    if shift:
        total.add_((order.count * shift).view(shape))
    # one step (with per-node widths: a learned one), else the step of each target's rows
    total.mul_(plan.scale if plan.scale is not None else _node_steps(plan, order.n).view(shape))
    if mean:
        total.div_(order.count.clamp(min=1).view(shape))
    return total


def _node_steps(plan: RoundPlan, n: int) -> Tensor:
    """The step of each node's rows (per-node widths over a range)."""
    assert plan.node_bits is not None and plan.amax is not None
    _, qmax = plan.q.grid.code_range(plan.node_bits)
    assert isinstance(qmax, Tensor)
    return (plan.amax.reshape(-1) / (qmax.to(torch.float32) + plan.q.grid.offset)).clamp(
        min=torch.finfo(torch.float32).tiny)


def _edge_codes(plan: RoundPlan, messages: Messages) -> QTensor:
    """Every message's codes in edge order (what the simulation's point rounds)."""
    return plan.codes(messages.floats(), row_nodes=messages.dst)


def _exact_in_float(plan: RoundPlan, order: EdgeOrder) -> bool:
    """Whether the simulation's float32 sums of the message values are exact (then they
    equal the integer sums rescaled, bit for bit): one step whose mantissa, times every
    partial sum of the grid's levels, fits float32's 24 bits."""
    if not plan.per_tensor or plan.scale is None:
        return False
    mantissa, _ = math.frexp(plan.scale)
    bits = 1
    while mantissa != math.floor(mantissa):  # significant bits of the step
        mantissa *= 2
        bits += 1
        if bits > 24:
            return False
    lo, hi = plan.q.code_range
    zp = plan.zero_point or 0.0
    top = 2 * (max(abs(lo - zp), abs(hi - zp)) + 1)  # (twice: mid-rise halves)
    return bits + math.ceil(math.log2(top * max(order.max_degree, 1))) <= 24


def accumulator(accumulate: str, order: EdgeOrder, point: IntQuantizer | None = None
                ) -> torch.dtype:
    """The dtype codes are summed in: ``"int32"``, or with ``"auto"`` float32 where every
    sum is exact there (in-degree x the largest code <= 2**24: float32 holds every integer
    up to 2**24), which holds the same integers and which torch's CPU kernels sum faster
    (a sparse product; torch's sparse products take no integers)."""
    if accumulate == "int32":
        return torch.int32
    top = 128
    if point is not None:
        lo, hi = point.grid.code_range(point.spec.max_bits if point.widths is not None
                                       else None)
        top = max(abs(int(lo)), abs(int(hi)))
    if order.max_degree * top > EXACT_FLOAT:
        return torch.int32
    return torch.float32


def _replay_sums(plan: RoundPlan, messages: Messages, order: EdgeOrder, width: int,
                 mean: bool, elements: Tensor) -> Tensor:
    """The sums at ``elements`` (flat indices of the ``(nodes, width)`` sums) as the
    simulation computes them: each message's value rounded by the message point, added
    in float32 one by one in edge order from 0 (PyG's ``scatter_add_``), divided by the
    count for a mean. Laid out one row per element, padded with zeros to the largest
    in-degree among them (adding 0 leaves a float32 sum as it is)."""
    count = elements.shape[0]
    nodes = torch.div(elements, width, rounding_mode="floor")
    columns = torch.remainder(elements, width)
    degree = order.degree.index_select(0, nodes)
    slots = int(degree.max()) if count else 0
    if not slots:
        return torch.zeros(count, device=elements.device)
    valid: Tensor | None = None
    if count * slots <= _PADDED_EXTRA or count * slots <= 2 * int(degree.sum()) + _PADDED_EXTRA:
        # one row per element, padded
        slot = torch.arange(slots, device=elements.device)
        valid = (slot < degree.view(-1, 1)).view(-1)
        positions = (order.ptr.index_select(0, nodes).view(-1, 1) + slot).view(-1).clamp_(
            max=order.edges - 1)
        columns = columns.repeat_interleave(slots)
        owner = torch.arange(count, device=elements.device).repeat_interleave(slots)
    else:  # (a few nodes of far larger in-degree) each (element, message) pair once
        owner = torch.repeat_interleave(degree)
        first = torch.cumsum(degree, 0) - degree
        positions = order.ptr.index_select(0, nodes).index_select(0, owner) + torch.arange(
            owner.shape[0], device=elements.device) - first.index_select(0, owner)
        columns = columns.index_select(0, owner)
    targets = order.sorted_dst.index_select(0, positions) if plan.node_bits is not None \
        else None
    toward_zero = plan.q.spec.rounding == "toward_zero"
    if plan.node_bits is not None and plan.scale is None and plan.amax is None:
        # each message's step from its own row: rounded whole, the columns picked
        rows = messages.rows(positions)
        t = plan.terms(rows, targets)
        vals = plan.values(round_levels(rows, t, toward_zero), t).reshape(
            rows.shape[0], -1).gather(1, columns.view(-1, 1)).view(-1)
    else:
        m = messages.elements(positions, columns)
        t = plan.terms(m, targets)
        vals = plan.values(round_levels(m, t, toward_zero), t)
    if valid is not None:
        vals.masked_fill_(~valid, 0.0)
    sums = torch.zeros(count, device=elements.device).scatter_add_(0, owner, vals)
    if mean:
        sums.div_(order.count.index_select(0, nodes).clamp_(min=1))
    return sums


def round_sums(then: IntQuantizer, v: Tensor, replay: Callable[[Tensor], Tensor] | None,
               ids: Tensor | None) -> QTensor:
    """``v`` (sums computed on integers, float32; rows of nodes) rounded to ``then``'s codes
    as the simulation rounds its own float32 sums: where a sum lies within
    :data:`TIE_TOLERANCE` steps of a rounding boundary, or sets the range ``then``'s step
    is taken from, ``replay(elements)`` gives the simulation's value there (flat indices
    into ``v``), which is rounded instead (one replay of both, but where the settled range
    moves the step). ``v`` is written in place."""
    n = v.shape[0]
    flat = v.reshape(-1)
    bounds: tuple[float, float] | None = None
    kind = then.spec.step_kind
    replaying = replay is not None and bool(flat.numel())
    if then.needs_range:
        if replaying and kind == "percentile":  # (an order statistic of every sum)
            assert replay is not None
            for start in range(0, flat.numel(), _REPLAYED):  # (every sum, a block at a time)
                stop = min(start + _REPLAYED, flat.numel())
                flat[start:stop] = replay(torch.arange(start, stop, device=flat.device))
            replaying = False  # (every sum is the simulation's: rounded as it is)
        bounds = then.range_of(v)
    elif replaying and kind == "batch-row":
        assert replay is not None
        _settle_row_extremes(then, v.reshape(n, -1), replay)

    def rounded(bounds: tuple[float, float] | None, before: Tensor | None
                ) -> tuple[RoundPlan, dict[str, Any], Tensor]:
        plan = then.plan(bounds, ids=ids, num_nodes=n, node_range=lambda: finite_row_magnitudes(v))
        t = plan.terms(v)
        return plan, t, round_levels(v, t, toward_zero, keep=before)

    toward_zero = then.spec.rounding == "toward_zero"
    before = torch.empty_like(v) if replaying else None
    plan, t, levels = rounded(bounds, before)
    if replaying and before is not None:
        assert replay is not None
        # (twice the tolerance: a range settled below moves the step by far less)
        elements, extreme = _ties_and_extremes(
            then, flat, before.view(-1), toward_zero, 2 * TIE_TOLERANCE,
            bounds if kind == "batch" else None)
        if elements.numel():
            sums = replay(elements)
            flat[elements] = sums
            settled = bounds
            if extreme is not None and bounds is not None and bool(extreme.any()):
                settled = _settled_bounds(then, bounds, sums[extreme])
            steps = None if bounds is None or settled is None or settled == bounds \
                else (_steps(then, bounds), _steps(then, settled))
            if steps is not None and steps[0] != steps[1]:
                # the step moved: everything is rounded again with it
                moved = _moved(then, *steps)
                del levels  # (freed before the codes are taken again)
                plan, t, levels = rounded(settled, before if moved else None)
                if moved:  # (by more than the margin above: ties looked for again)
                    again = _near_ties(before.view(-1), toward_zero)
                    if again.numel():
                        flat[again] = replay(again)
                        levels = round_levels(v, t, toward_zero)
            else:
                rows = torch.div(elements, max(1, flat.numel() // max(n, 1)),
                                 rounding_mode="floor")
                levels.view(-1)[elements] = round_levels(sums, _terms_at(t, rows),
                                                         toward_zero)
    codes = (levels - then.bias if then.bias else levels).to(torch.int8)
    return plan.qtensor(codes, t)


def _steps(then: IntQuantizer, bounds: tuple[float, float]) -> tuple[float, float, float]:
    """What ``then``'s rounding reads from a range: its step, zero point (0 without one)
    and largest magnitude (per-node widths)."""
    scale, zp = then.tensor_scale(*bounds)
    return scale, zp or 0.0, max(abs(bounds[0]), abs(bounds[1]))


def _moved(then: IntQuantizer, before: tuple[float, float, float],
           after: tuple[float, float, float]) -> bool:
    """Whether the steps of a settled range (``after``, as :func:`_steps` gives them) move
    ``then``'s codes by more than :data:`TIE_TOLERANCE` steps anywhere from ``before``
    (or move its zero point)."""
    (s0, z0, m0), (s1, z1, m1) = before, after
    qmin, qmax = then.code_range
    tiny = torch.finfo(torch.float32).tiny
    change = max(abs(s1 - s0) / max(s0, tiny), abs(m1 - m0) / max(m0, tiny))
    return z0 != z1 or change * (qmax - qmin + 2) > TIE_TOLERANCE


def _near_ties(before: Tensor, toward_zero: bool, tolerance: float = TIE_TOLERANCE
               ) -> Tensor:
    """Where ``before`` (values in units of the step, before rounding; overwritten) lies
    within ``tolerance`` of a rounding boundary: a half for rounding to nearest, an
    integer for truncation (from either side)."""
    return beyond(*_tie_distance(before, toward_zero, tolerance))


def _tie_distance(before: Tensor, toward_zero: bool, tolerance: float
                  ) -> tuple[Tensor, float, float | None]:
    """``before`` (overwritten) as a tensor and the limits :func:`beyond` reads for
    :func:`_near_ties`."""
    frac = before.frac_().abs_()  # (in place: no second tensor of the sums' size)
    if toward_zero:
        return frac, tolerance, 1 - tolerance
    return frac.sub_(0.5).abs_(), tolerance, None


def _ties_and_extremes(then: IntQuantizer, flat: Tensor, before: Tensor, toward_zero: bool,
                       tolerance: float, bounds: tuple[float, float] | None
                       ) -> tuple[Tensor, Tensor | None]:
    """The elements of ``flat`` that :func:`_near_ties` (of ``before``, overwritten) and
    :func:`_near_extremes` (of ``bounds``; None: none) give, and which of them are near
    the extremes (a mask over them; None: none). Fewer than the elements :func:`beyond`
    looks at block by block: in one pass."""
    if bounds is None:
        return _near_ties(before, toward_zero, tolerance), None
    if flat.numel() >= _BLOCKED_FROM:
        extremes = _near_extremes(then, flat, bounds)
        ties = _near_ties(before, toward_zero, tolerance)
        elements = torch.cat([extremes, ties])
        return elements, torch.arange(elements.numel(), device=flat.device) < extremes.numel()
    near = _qualifies(flat, *_extreme_limits(then, bounds))
    elements = (_qualifies(*_tie_distance(before, toward_zero, tolerance)) | near).nonzero(
    ).view(-1)
    return elements, near.index_select(0, elements)


def beyond(flat: Tensor, below: float | None = None, above: float | None = None) -> Tensor:
    """The indices (ascending) of the elements of ``flat`` (1-D) at or below ``below`` or
    at or above ``above``. Blocks of :data:`BLOCK` elements whose least and largest value
    cannot qualify are skipped: on the CPU a reduction over long rows costs a fraction of
    a comparison of every element, and few elements qualify (NaN never does)."""
    n = flat.numel()
    if below is None and above is None:
        return torch.zeros(0, dtype=torch.long, device=flat.device)
    if n < _BLOCKED_FROM:  # (few: each one)
        return _qualifies(flat, below, above).nonzero().view(-1)
    body = n - n % BLOCK
    parts = []
    if body:
        blocks = flat[:body].view(-1, BLOCK)
        # (a block holding a NaN has a NaN extreme: looked at element by element)
        extreme = blocks.amax(1) if above is not None else None
        hit = None if extreme is None else (extreme >= float(above)) | extreme.isnan()  # type: ignore[arg-type]
        if below is not None:
            least = blocks.amin(1)
            low = (least <= below) | least.isnan()
            hit = low if hit is None else hit | low
        assert hit is not None
        found = hit.nonzero().view(-1)
        if found.numel():
            positions = (found.view(-1, 1) * BLOCK + torch.arange(
                BLOCK, device=flat.device)).view(-1)
            parts.append(positions[_qualifies(flat.index_select(0, positions), below, above)])
    if body < n:
        parts.append(_qualifies(flat[body:], below, above).nonzero().view(-1) + body)
    if not parts:
        return torch.zeros(0, dtype=torch.long, device=flat.device)
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def _qualifies(x: Tensor, below: float | None, above: float | None) -> Tensor:
    """Whether each element of ``x`` is at or below ``below`` or at or above ``above``
    (neither: none)."""
    if above is None:
        return x <= below if below is not None else torch.zeros_like(x, dtype=torch.bool)
    return x >= above if below is None else (x >= above) | (x <= below)


def _reads_magnitude(point: IntQuantizer) -> bool:
    """Whether ``point``'s step reads only the largest magnitude of its range (a signed
    symmetric grid, per-node widths)."""
    return not point.grid.asymmetric and (point.grid.signed or point.widths is not None)


def _near_extremes(point: IntQuantizer, flat: Tensor, bounds: tuple[float, float]) -> Tensor:
    """The indices of ``flat`` (1-D) within :data:`EXTREME_TOLERANCE` of the part of its
    range ``point``'s step is taken from."""
    return beyond(flat, *_extreme_limits(point, bounds))


def _extreme_limits(point: IntQuantizer, bounds: tuple[float, float]
                    ) -> tuple[float | None, float | None]:
    """The limits :func:`beyond` reads for :func:`_near_extremes`."""
    lo, hi = bounds
    margin = EXTREME_TOLERANCE * max(abs(lo), abs(hi))
    if point.grid.asymmetric:
        return lo + margin, hi - margin
    if _reads_magnitude(point):
        top = max(abs(lo), abs(hi)) - margin
        return -top if lo <= -top else None, top if hi >= top else None
    return None, hi - margin


def extreme_rows(point: IntQuantizer, v: Tensor) -> Tensor:
    """The rows of ``v`` (ids, ascending) holding the range ``point`` takes its step from
    (within :data:`EXTREME_TOLERANCE`), where it takes it from the min and max of the
    values."""
    if point.spec.step_kind != "batch" or not v.numel():
        return torch.zeros(0, dtype=torch.long, device=v.device)
    flat = v.reshape(-1)
    elements = _near_extremes(point, flat, tensor_range(v))
    return torch.unique(torch.div(elements, flat.numel() // v.shape[0], rounding_mode="floor"))


def tie_rows(point: IntQuantizer, v: Tensor, ids: Tensor | None = None) -> Tensor:
    """The rows of ``v`` (ids, ascending) holding a value within :data:`TIE_TOLERANCE`
    steps of a rounding boundary of ``point`` (rows of nodes, ``ids`` their global ids):
    products of codes are multiples of one scale, so a value is often exactly a simple
    fraction of another (half the extreme a step is taken from), and there the
    simulation's float32 product picks the code."""
    if not v.numel():
        return torch.zeros(0, dtype=torch.long, device=v.device)
    n = v.shape[0]
    bounds = point.range_of(v) if point.needs_range else None
    plan = point.plan(bounds, ids=ids, num_nodes=n, node_range=lambda: finite_row_magnitudes(v))
    toward_zero = point.spec.rounding == "toward_zero"
    before = torch.empty_like(v)
    round_levels(v, plan.terms(v), toward_zero, keep=before)
    ties = _near_ties(before.view(-1), toward_zero)
    return torch.unique(torch.div(ties, v.numel() // n, rounding_mode="floor"))


def _settle_message_extremes(point: IntQuantizer, messages: Messages, whole: Tensor,
                             bounds: tuple[float, float]) -> tuple[float, float]:
    """The range of the messages ``whole`` (in target order) as the simulation has it: the
    senders of the messages at (or within :data:`EXTREME_TOLERANCE` of) the extremes
    recomputed its way (:meth:`Messages.settled`), every message of those whose rows
    changed computed again in ``whole``; the extremes of those near them are the range's."""
    flat = whole.view(-1)
    elements = _near_extremes(point, flat, bounds)
    if not elements.numel() or not messages.settled(elements):
        return bounds
    messages.resettle(whole)
    return _settled_bounds(point, bounds, flat.index_select(0, elements))


def _settled_bounds(then: IntQuantizer, bounds: tuple[float, float], values: Tensor
                    ) -> tuple[float, float]:
    """The range ``then`` reads, from ``values`` (the simulation's values at every element
    near the extremes of ``bounds``)."""
    lo_s, hi_s = (float(b) for b in torch.aminmax(values))
    if then.grid.asymmetric:  # (both extremes were computed again)
        return lo_s, hi_s
    if _reads_magnitude(then):  # only the largest magnitude counts
        top = max(abs(lo_s), abs(hi_s))
        return -top, top
    return bounds[0], hi_s  # an unsigned grid reads the largest value only


def _settle_row_extremes(then: IntQuantizer, rows: Tensor,
                         replay: Callable[[Tensor], Tensor]) -> None:
    """The values of ``rows`` at (or within :data:`EXTREME_TOLERANCE` of) each row's
    extremes computed again the simulation's way (``replay``, flat indices), in place: a
    range per row (each row's own step)."""
    lo, hi = torch.aminmax(rows, dim=1)
    margin = (EXTREME_TOLERANCE * torch.maximum(lo.abs(), hi.abs())).view(-1, 1)
    near = (rows <= lo.view(-1, 1) + margin) | (rows >= hi.view(-1, 1) - margin)
    elements = near.view(-1).nonzero().view(-1)
    if elements.numel():
        rows.view(-1)[elements] = replay(elements)


def _terms_at(t: dict[str, Any], rows: Tensor) -> dict[str, Any]:
    """``t`` for single elements of the rows ``rows`` (per-row terms picked)."""
    out = dict(t)
    for key in ("factor", "zero_point", "qmin", "qmax", "scale"):
        value = t[key]
        if isinstance(value, Tensor) and value.dim():
            out[key] = value.reshape(-1).index_select(0, rows)
    return out

