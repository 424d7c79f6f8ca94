"""Converted GNN layers: PyG's ``GCNConv``, ``SAGEConv``, ``GINConv`` and ``GATConv``, and
linear layers called on their own, as their transformed copies compute them in
evaluation, on integer codes.

Each layer takes its input as a :class:`~fxquant.execution.kernels.QTensor` (the codes an
input point rounded it to) or as float32 values, and returns float32 values (the top-level
output point, if any, rounds them). Inside, a product of codes by weight codes runs as
``int8 x int8 -> int32``, messages are rounded to the message point's codes, which are
summed into ``int32``, and the aggregate point rounds the sum; between two of these the
accumulators are rescaled in float32 exactly where the simulation computes in float32
(normalization coefficients, biases, a mean's division). What cannot run on integers
here (a product whose operand no point rounds, GAT's attention softmax) runs in float32,
and each layer lists what runs where in :attr:`IntLayer.placements`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GATConv, GCNConv, GINConv, MessagePassing, SAGEConv
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.nn.dense.linear import Linear as PygLinear
from torch_geometric.nn.models import MLP
from torch_geometric.utils import add_self_loops, remove_self_loops, softmax

from fxquant.errors import FxquantTypeError, FxquantValueError
from fxquant.execution.aggregate import (
    EdgeOrder,
    GraphCache,
    Messages,
    aggregate,
    extreme_rows,
    tie_rows,
)
from fxquant.execution.kernels import QTensor, int_matmul, number, per_row
from fxquant.execution.packing import PackedCodes, pack, unpack
from fxquant.execution.quantizer import IntQuantizer

__all__ = [
    "FLOAT",
    "INTEGER",
    "RESCALE",
    "Context",
    "IntLayer",
    "IntLinear",
    "Placement",
    "Unconvertible",
    "Value",
    "WeightCodes",
    "as_float",
    "conv_from",
    "layer_classes",
    "nn_path",
    "relu_codes",
]

INTEGER, RESCALE, FLOAT = "integer", "rescale", "float32"

#: a value between steps: codes with their scale, or float32 values
Value = QTensor | Tensor


class Unconvertible(FxquantValueError):
    """A layer's settings have no integer form here (the converter turns it into a
    refusal, or a layer kept as its simulation)."""


@dataclass(frozen=True)
class Placement:
    """One part of the converted model and where it runs.

    ``runs`` is ``"integer"`` (codes multiplied or summed in int32, or rounded to a
    point's codes), ``"rescale"`` (float32 arithmetic on an integer accumulator on its
    way to the next point's codes: scales, normalization coefficients, biases) or
    ``"float32"`` (computed on float values: not integer execution); ``why`` says why a
    float32 part is, and how to make it integer.
    """

    where: str
    runs: str
    how: str
    why: str = ""


class Context:
    """What one forward shares between steps: the batch's global node ids, and per-graph
    values computed once per ``edge_index`` (a normalization, a sort), kept by the model
    across forwards (:class:`~fxquant.execution.aggregate.GraphCache`)."""

    def __init__(self, ids: Tensor | None = None, meter: list[Any] | None = None,
                 graphs: GraphCache | None = None) -> None:
        self.ids = ids
        #: what the forward computes, when counted (:func:`fxquant.execution.bit_operations`)
        self.meter = meter
        self.graphs = graphs if graphs is not None else GraphCache()

    def graph(self, key: Any, edge_index: Tensor, extra: Tensor | None, n: int,
              build: Any, layer: str = "") -> Any:
        """``build()``, or what it returned for this ``edge_index`` (and ``extra``) and
        ``key`` before; ``edge_index`` checked first (``layer``: the layer that takes it)."""
        _check_edges(layer, edge_index)
        return self.graphs.get(key, edge_index, extra, n, build)


def _check_edges(layer: str, edge_index: Any) -> None:
    """A converted layer takes the graph as a ``[2, num_edges]`` tensor of node ids."""
    where = f"the converted layer {layer!r}" if layer else "a converted layer"
    if not isinstance(edge_index, Tensor) or edge_index.layout != torch.strided:
        got = type(edge_index).__name__ if not isinstance(edge_index, Tensor) \
            else f"a tensor of layout {edge_index.layout}"
        raise FxquantTypeError(
            f"{where} takes edge_index as a [2, num_edges] tensor of node ids, got {got} "
            "(a sparse adjacency); please pass the plain edge_index (of PyG's transposed "
            "adj_t, whose rows are the targets: adj_t.to_sparse_coo().coalesce().indices()"
            ".flip(0) for a torch sparse tensor, torch.stack(adj_t.coo()[:2]).flip(0) "
            "for a torch_sparse SparseTensor)")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2 or edge_index.is_floating_point() \
            or edge_index.dtype == torch.bool:
        raise FxquantValueError(
            f"{where} takes edge_index as a [2, num_edges] integer tensor of node ids, got "
            f"shape {tuple(edge_index.shape)} of {edge_index.dtype}; please pass it in PyG's "
            "layout (edge_index.t() if it is [num_edges, 2])")


#: float32 values a product of codes and float32 weights dequantizes at once
_PRODUCT_VALUES = 1 << 18
#: the fewest rows of such a block
_PRODUCT_ROWS = 128
#: the rows torch's CPU float32 product kernels block a matrix by divide this number (on
#: x86, 4 rows for a product of few columns): a row's sum depends on its place in its block
#: and on whether it lies in the final partial block, so a row recomputed alone, or at
#: another place modulo the block, can be added in another order than in the whole matrix
_ROW_BLOCK = 48
#: the most rows :func:`_aligned_rows` lays out in Python
_FEW_ROWS = 32


def _aligned_rows(rows: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """The rows of an ``n``-row matrix to compute so that ``rows`` come out as in the whole
    product (``layout``), and where each of ``rows`` is in it (``positions``): the blocks
    of :data:`_ROW_BLOCK` rows that hold them, each row at its place modulo the block, the
    final partial block last (after at least one whole block)."""
    block = _ROW_BLOCK
    tail_start = n - n % block
    if rows.numel() <= _FEW_ROWS:  # (a few: in Python, far fewer tensor operations)
        return _aligned_few(rows.tolist(), n, rows.device)
    ids = torch.div(rows, block, rounding_mode="floor")
    blocks = torch.unique(ids)
    whole = blocks[blocks * block < tail_start]
    in_tail = rows >= tail_start
    tail = bool(in_tail.any())
    if tail and not whole.numel():
        whole = blocks.new_zeros(1)
    span = torch.arange(block, device=rows.device)
    parts = [(whole.view(-1, 1) * block + span).view(-1)]
    if tail:
        parts.append(torch.arange(tail_start, n, device=rows.device))
    positions = torch.searchsorted(whole, ids) * block + rows - ids * block
    positions = torch.where(in_tail, whole.numel() * block + rows - tail_start, positions)
    return torch.cat(parts), positions


def _aligned_few(rows: list[int], n: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """:func:`_aligned_rows` of a few rows, given as a list."""
    block = _ROW_BLOCK
    tail_start = n - n % block
    whole = sorted({r // block for r in rows if r < tail_start})
    tail = any(r >= tail_start for r in rows)
    if tail and not whole:
        whole = [0]
    layout = [b * block + i for b in whole for i in range(block)]
    if tail:
        layout.extend(range(tail_start, n))
    place = {b: k * block for k, b in enumerate(whole)}
    positions = [len(whole) * block + r - tail_start if r >= tail_start
                 else place[r // block] + r % block for r in rows]
    return (torch.tensor(layout, dtype=torch.long, device=device),
            torch.tensor(positions, dtype=torch.long, device=device))


def _float_linear(x: Value, w: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ w.T (+ bias)`` in float32 (``F.linear``, the bias added as the simulation's
    linear layer adds it); codes are dequantized a block of rows at a time, so that a
    product of wide rows of codes never holds all of them as float32 (each row's result
    is the whole matrix's product's: blocks of at least :data:`_PRODUCT_ROWS` rows,
    starting at multiples of :data:`_ROW_BLOCK`, the last one holding the final rows)."""
    if not isinstance(x, QTensor) or x.codes.dim() != 2:
        return F.linear(as_float(x), w, bias)
    n, inner = x.codes.shape
    size = max(_PRODUCT_ROWS, _PRODUCT_VALUES // max(inner, 1))
    size = -(-size // _ROW_BLOCK) * _ROW_BLOCK
    if n < 2 * size:
        return F.linear(x.dequantize(), w, bias)
    out = torch.empty((n, w.shape[0]), dtype=torch.float32, device=x.codes.device)
    starts = list(range(0, n - size, size))  # (the last block: size to 2 x size rows)
    for start, stop in zip(starts, [*starts[1:], n], strict=True):
        out[start:stop] = F.linear(x.slice_rows(start, stop).dequantize(), w, bias)
    return out


def as_float(v: Value) -> Tensor:
    """Float32 values of a step's output."""
    return v.dequantize() if isinstance(v, QTensor) else v


class WeightCodes(nn.Module):
    """A weight rounded by its point, stored packed (``data``) with its scale and shift;
    :meth:`qtensor` unpacks it for a product."""

    data: Tensor
    scale: Tensor
    shift: Tensor

    def __init__(self, q: QTensor | None = None, meta: dict[str, Any] | None = None) -> None:
        super().__init__()
        if q is not None:
            packed = pack(q)
            ((slot, data),) = packed.groups.items()
            meta = {"shape": list(q.codes.shape), "bits": int(q.bits), "slot": slot,
                    "qmin": int(q.qmin), "qmax": int(q.qmax), "bias": q.bias,
                    "per_row": per_row(q.scale)}
            self.register_buffer("data", data)
            self.register_buffer("scale", torch.as_tensor(q.scale, dtype=torch.float32).clone())
            self.register_buffer("shift", torch.as_tensor(q.shift, dtype=torch.float32).clone())
        else:
            assert meta is not None
            self.register_buffer("data", torch.zeros(0, dtype=torch.uint8))
            self.register_buffer("scale", torch.zeros(()))
            self.register_buffer("shift", torch.zeros(()))
        self.meta = dict(meta)

    def qtensor(self) -> QTensor:
        """The codes, unpacked (kept unpacked while the packed bytes are unchanged)."""
        key = (self.data.data_ptr(), self.data._version, self.scale._version)
        cached = self.__dict__.get("_unpacked")
        if cached is not None and cached[0] == key:
            return cached[1]
        q = self._unpack()
        self.__dict__["_unpacked"] = (key, q)
        return q

    def values(self) -> Tensor:
        """The weight's float32 values, row by row as the simulation's weight is laid out
        (a product adds in the order its operands' layout gives); made on each call, so
        that a converted model holds no float32 copy of its weights."""
        return self.qtensor().dequantize().contiguous()

    def _unpack(self) -> QTensor:
        m = self.meta
        scale = self.scale if self.scale.dim() else float(self.scale)
        shift = self.shift if self.shift.dim() else float(self.shift)
        like = QTensor(torch.empty(0, dtype=torch.int8), scale, shift, m["bias"],
                       m["qmin"], m["qmax"], m["bits"], m["per_row"])
        codes = unpack(PackedCodes({m["slot"]: self.data}, torch.Size(m["shape"]), None), like)
        if codes.dim() == 2:  # (kept column by column: the layout torch._int_mm reads fastest)
            codes = codes.t().contiguous().t()
        return like.with_codes(codes)

    @property
    def nbytes(self) -> int:
        return int(self.data.numel()) + 4 * int(self.scale.numel() + self.shift.numel())

    def extra_repr(self) -> str:
        m = self.meta
        return f"{tuple(m['shape'])}, {m['bits']} bits" + (", per row" if m["per_row"] else "")




#: how the converted layers sum message codes (:func:`~fxquant.execution.aggregate.accumulator`)
SUM_HOW = ("exact integer sums of the message codes: float32 sparse product where in-degree "
           "x largest code <= 2**24, else int32 index_add_ (accumulate='int32': always)")


class IntLayer(nn.Module):
    """Shared by the converted layers: the layer's points, its placements."""

    kind = ""
    #: the points (site and tensor, as ``"weight.lin.weight"``) the converted layer applies
    sites: tuple[str, ...] = ()

    def __init__(self, name: str, points: dict[str, IntQuantizer],
                 rebuild: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.name = name
        #: how to build an untrained layer of the same shape (:func:`conv_from`), which
        #: loading converts again before it reads the state
        self.rebuild = dict(rebuild or {})
        self.points = nn.ModuleDict({k.replace(".", "__"): v for k, v in points.items()})
        self.placements: list[Placement] = []
        #: each weight point's codes, by the point's name in the transformed model
        self.weight_codes: dict[str, WeightCodes] = {}

    def _weight(self, param: Tensor, key: str) -> WeightCodes | None:
        """``param`` rounded by the weight point ``key`` (None: no such point)."""
        point = self.point(key)
        if point is None:
            return None
        with torch.no_grad():
            codes = WeightCodes(point(param.detach().to(torch.float32)))
        self.weight_codes[point.spec.module] = codes
        self.place(f"weight {point.spec.tensor}", INTEGER,
                   f"stored as {point.spec.describe()} codes ({codes.meta['slot']} bits a code)")
        return codes

    def applies(self, key: str) -> bool:
        """Whether this layer applies a point at ``key`` (``"weight.lin.weight"``)."""
        return key in self.sites

    def settles_output(self) -> bool:
        """Whether the point after this layer reads its step from a product of codes, whose
        rows :meth:`_settle` recomputes as the simulation computes them."""
        return False

    def point(self, key: str) -> IntQuantizer | None:
        key = key.replace(".", "__")
        return self.points[key] if key in self.points else None  # type: ignore[return-value]  # noqa: SIM401

    def place(self, what: str, runs: str, how: str, why: str = "") -> None:
        self.placements.append(Placement(f"{self.name}: {what}", runs, how, why))

    #: why the product ``x W`` runs as the simulation's where :attr:`_simulated_product`
    _simulated_why = ""

    @property
    def _simulated_product(self) -> bool:
        """Whether the product ``x W`` runs as the simulation's float32 product."""
        return False

    def configure(self, input_integer: bool, accumulate: str, ties: str) -> None:
        """Set the conversion's options (kept in ``rebuild``, which :func:`save` writes)."""
        self.rebuild.update(input_integer=input_integer, accumulate=accumulate, ties=ties)
        if self._simulated_product and getattr(self, "weight", None) is not None \
                and input_integer:
            self._simulated_placement("product x W", self._simulated_why)
        then = self.point("aggregate")
        if self._exact_ties and then is not None and self.point("message") is not None \
                and then.spec.step_kind == "percentile":
            self.place("sums for the aggregate's percentile", FLOAT, "every sum added again "
                       "in float32 as the simulation adds it",
                       "the aggregate point reads its step from a percentile of the sums, "
                       "an order statistic of the simulation's float32 sums; convert with "
                       "ties='nearest' to round the integer sums")

    # -- shared steps ---------------------------------------------------------------------

    def _simulated_placement(self, what: str, why: str) -> None:
        """Record that the product ``what`` runs as the simulation's float32 product."""
        where = f"{self.name}: {what}"
        self.placements = [Placement(where, FLOAT, "float32 product of the codes' values, as "
                                     "the simulation computes it", why)
                           if p.where == where else p for p in self.placements]

    def _place_product(self, what: str, x_integer: bool, weight: WeightCodes | None,
                       fix: str) -> None:
        """Record where ``x @ W.T`` runs."""
        if x_integer and weight is not None:
            self.place(what, INTEGER, "int8 x int8 -> int32 (torch._int_mm), rescaled to float32")
        elif weight is None and x_integer:
            self.place(what, FLOAT, "float32 product of the codes' values and float32 weights",
                       f"its weight has no quantization point; {fix}")
        elif weight is not None:
            self.place(what, FLOAT, "float32 product of float32 values and the weight's codes",
                       "its input has no quantization point; round the layer's input "
                       "(site='input') to run it on integers")
        else:
            self.place(what, FLOAT, "float32 product", "neither operand is rounded")

    def _messages(self, values_integer: bool, per_edge_float: bool) -> None:
        message = self.point("message")
        if message is None:
            self.place("messages", FLOAT, "float32 messages",
                       "the layer has no message point; round the messages (site='message') "
                       "to aggregate integers")
        elif per_edge_float:
            self.place("messages", FLOAT, "float32 coefficients per edge, then rounded "
                       "to the message point's codes",
                       "the coefficients are computed in float32 (a softmax); this part of "
                       "the layer cannot run on integers")
        else:
            self.place("messages", RESCALE if values_integer else FLOAT,
                       "rounded to the message point's codes" +
                       (" (values rescaled in float32)" if values_integer else ""),
                       "" if values_integer else "the values sent have no point before the "
                       "messages")
        agg = SUM_HOW if message is not None else "float32 sum"
        self.place("aggregation", INTEGER if message is not None else FLOAT, agg,
                   "" if message is not None else "the messages are float32")

    def _round(self, key: str, v: Tensor, ctx: Context, **kwargs: Any) -> Value:
        point = self.point(key)
        if point is None:
            return v
        return self.record(point, point(v, ids=ctx.ids, **kwargs))

    @property
    def then(self) -> IntQuantizer | None:
        """The point that rounds this layer's output, if any (set by the model)."""
        return self.__dict__.get("then")

    def _settle(self, point: IntQuantizer | None, y: Tensor,
                simulate: Callable[[Tensor], Tensor], ids: Tensor | None = None) -> Tensor:
        """``y`` (computed on integers, rescaled to float32), with the rows holding the
        range ``point`` takes its step from computed as the simulation computes them
        (``simulate(rows)``, its float32 products), so that the step is the simulation's
        to the bit: every code after it is read with that step; then the rows holding a
        value on a rounding boundary of that step (``ids``: the rows' global node ids,
        for per-node widths), where the simulation's float32 product picks the code. A
        point whose step reads every row (per row, a percentile) takes every row the
        simulation's way."""
        if point is None or not self._exact_ties:
            return y
        if point.reads_every_row:  # (every row holds a range, or may hold the percentile)
            return simulate(torch.arange(y.shape[0], device=y.device)).to(y.dtype)
        rows = extreme_rows(point, y)
        if rows.numel():
            y[rows] = self._simulate_rows(rows, y.shape[0], simulate).to(y.dtype)
        rows = tie_rows(point, y, ids)
        if rows.numel():
            y[rows] = self._simulate_rows(rows, y.shape[0], simulate).to(y.dtype)
        return y

    @property
    def _exact_ties(self) -> bool:
        return self.rebuild.get("ties", "simulation") == "simulation"

    @staticmethod
    def _simulate_rows(rows: Tensor, n: int, simulate: Callable[[Tensor], Tensor]) -> Tensor:
        """``simulate(rows)`` as those rows come out of the whole ``n``-row product: computed
        within the blocks of :data:`_ROW_BLOCK` rows that hold them, each at its place
        (:func:`_aligned_rows`); of a matrix of at most twice that many rows, its whole
        product."""
        if not rows.numel():
            return simulate(rows)
        if n <= 2 * _ROW_BLOCK:  # the whole product, each row where it was
            return simulate(torch.arange(n, device=rows.device)).index_select(0, rows)
        layout, positions = _aligned_rows(rows, n)
        return simulate(layout).index_select(0, positions)

    def _projected(self, x: Value, weight: WeightCodes | None, fallback: Tensor, ctx: Context
                   ) -> tuple[Tensor, Callable[[Tensor], Tensor], IntQuantizer | None]:
        """``x @ W.T`` of a layer whose messages are its projected features (GCN, GAT),
        rounded by its ``linear.lin`` point where it has one; with ``simulate(rows)``, those
        rows as the simulation computes them, and that point."""
        h = self._mm(x, weight, fallback, ctx)
        n = h.shape[0]

        def simulate(rows: Tensor) -> Tensor:  # (rows of x @ W.T as the simulation has them)
            return self._simulate_rows(rows, n, lambda r: F.linear(
                _rows_float(x, r), _dequantized(weight, fallback)))

        linear = self.point("linear.lin")
        if linear is not None:
            h = as_float(self._round("linear.lin", self._settle(linear, h, simulate, ctx.ids),
                                     ctx))
        return h, simulate, linear

    def _mm(self, x: Value, weight: WeightCodes | None, fallback: Tensor, ctx: Context,
            what: str = "product", simulated: bool = False, bias: Tensor | None = None,
            in_float32: bool = True) -> Tensor:
        """``x @ W.T (+ bias)``: on codes where both are codes (``simulated``: in float32 on
        their values, as the simulation computes it), else in float32 (the bias added as
        the simulation's linear layer adds it); counted in ``ctx.meter`` (rows x inner x
        outer multiply-accumulates at the bits of the operands, 32 x 32 in float32;
        ``in_float32``: whether the float32 model computes this product too)."""
        integer = isinstance(x, QTensor) and weight is not None and not simulated
        if ctx.meter is not None:
            shape = x.codes.shape if isinstance(x, QTensor) else x.shape
            rows = int(torch.Size(shape[:-1]).numel()) if len(shape) > 1 else 1
            bits = (32.0, 32.0) if simulated else \
                (_bits(x), _bits(weight) if weight is not None else 32.0)
            ctx.meter.append(("product", f"{self.name}: {what}",
                              rows * shape[-1] * fallback.shape[0], *bits, in_float32))
        if integer:
            assert isinstance(x, QTensor) and weight is not None
            y = int_matmul(x, weight.qtensor())
            return y if bias is None else y + bias
        w = weight.values() if weight is not None else fallback
        return _float_linear(x, w.to(torch.float32), bias)

    def record(self, point: IntQuantizer, q: QTensor) -> QTensor:
        """``q``, kept as ``point``'s codes while :meth:`ConvertedModel.record` runs."""
        recording = self.__dict__.get("recording")
        if recording is not None:
            recording[point.spec.module] = q
        return q

    def _aggregate(self, messages: Messages, order: EdgeOrder, ctx: Context,
                   mean: bool = False) -> Value:
        """Each node's sum (or mean) of its messages: codes summed exactly where the
        layer rounds its messages, else float32; rounded by the aggregate point, if the
        layer has one (its codes)."""
        point = self.point("message")
        then = self.point("aggregate")
        if ctx.meter is not None:
            width = int(torch.Size(messages.values.shape[1:]).numel())
            bits = 32.0
            if point is not None:
                sample = point(messages.floats(),
                               ids=ctx.ids, row_nodes=order.dst, num_nodes=order.n)
                bits = _bits(sample)
            ctx.meter.append(("sum", f"{self.name}: aggregation", order.edges * width,
                              bits, 0.0))
        if point is None:
            m = messages.floats()
            total = torch.zeros((order.n, *m.shape[1:]), dtype=torch.float32,
                                device=m.device).index_add_(0, messages.dst, m)
            if mean:
                total = total / order.count.clamp(min=1).view((-1,) + (1,) * (m.dim() - 1))
            return self._round("aggregate", total, ctx)
        recording = self.__dict__.get("recording") is not None
        out = aggregate(point, messages, order, ctx.ids, mean=mean, then=then,
                        record=self.record if recording else None,
                        accumulate=self.rebuild.get("accumulate", "auto"),
                        ties=self.rebuild.get("ties", "simulation") == "simulation")
        if then is not None:
            assert isinstance(out, QTensor)
            return self.record(then, out)
        return out


def _rows_float(v: Value, rows: Tensor) -> Tensor:
    """The float32 values of the rows ``rows`` of ``v``."""
    return as_float(v.index_rows(rows) if isinstance(v, QTensor) else v.index_select(0, rows))


def _dequantized(weight: WeightCodes | None, fallback: Tensor) -> Tensor:
    """A weight as the simulation multiplies by it: its point's values, else float32."""
    return weight.values() if weight is not None else fallback


def _bits(v: Value | WeightCodes | None) -> float:
    """Bits of one value of ``v``: its codes' (the mean over rows with per-node widths),
    32 for float32."""
    if isinstance(v, WeightCodes):
        return float(v.meta["bits"])
    if isinstance(v, QTensor):
        return float(v.bits.float().mean()) if isinstance(v.bits, Tensor) and v.bits.numel() \
            else float(v.bits)
    return 32.0


class IntGCNConv(IntLayer):
    """``GCNConv`` (normalized, self-loops as the layer adds them) on codes."""

    kind = "GCNConv"
    sites = ("weight.lin.weight", "linear.lin", "edge", "message", "aggregate")
    lin_weight: Tensor
    bias: Tensor | None

    def __init__(self, name: str, conv: GCNConv, points: dict[str, IntQuantizer],
                 input_integer: bool) -> None:
        _aggregation(name, conv, ("sum",))
        super().__init__(name, points, {
            "cls": "GCNConv", "in_channels": conv.in_channels,
            "out_channels": conv.out_channels, "improved": conv.improved,
            "add_self_loops": conv.add_self_loops, "normalize": conv.normalize,
            "bias": conv.bias is not None, "flow": conv.flow})
        self.normalize, self.improved = conv.normalize, conv.improved
        self.add_loops, self.flow = conv.add_self_loops, conv.flow
        self.register_buffer("lin_weight", conv.lin.weight.detach().clone())
        self.weight = self._weight(conv.lin.weight, "weight.lin.weight")
        self.register_buffer("bias", None if conv.bias is None else conv.bias.detach().clone())
        self._place_product("product x W", input_integer, self.weight,
                      "round it (site='weight') to run the product on integers")
        if self.point("linear.lin") is not None:
            self.place("product rounded", INTEGER, "rounded to the linear point's codes")
        self.place("normalization", RESCALE, "float32 coefficient per edge (gcn_norm), applied "
                   "to the product's rescaled values")
        self._messages(True, False)
        if self.point("aggregate") is not None:
            self.place("aggregate", INTEGER, "int32 sums rescaled and rounded to the aggregate "
                       "point's codes")
        if self.bias is not None:
            self.place("bias", RESCALE, "float32 bias added to the aggregate's values")

    @property
    def _simulated_product(self) -> bool:
        """Whether the product runs as the simulation's (``ties="simulation"``, no point
        rounding it, and a message point whose step reads every message)."""
        message = self.point("message")
        return self._exact_ties and self.point("linear.lin") is None and \
            message is not None and message.reads_every_row

    _simulated_why = ("its message point reads its step from every message (per row, or a "
                      "percentile), each a product's value times a coefficient, which the "
                      "integer product gives an ulp apart: round its output (site='linear'), "
                      "or convert with ties='nearest' to run it on integers")

    def forward(self, x: Value, edge_index: Tensor, edge_weight: Tensor | None = None, *,
                ctx: Context) -> Tensor:
        if self._simulated_product:
            h = self._mm(x, self.weight, self.lin_weight, ctx, simulated=True)
            simulate, linear = None, None
        else:
            h, simulate, linear = self._projected(x, self.weight, self.lin_weight, ctx)
        n = h.shape[0]
        key = ("gcn", self.normalize, self.improved, self.add_loops, self.flow)
        ew, sorted_ew, order = ctx.graph(key, edge_index, edge_weight, n,
                                         lambda: self._prepare(edge_index, edge_weight, n),
                                         self.name)
        if ew is not None and self.point("edge") is not None:
            ew = as_float(self._round("edge", ew, ctx, row_nodes=order.dst, num_nodes=n))
            sorted_ew = None
        settle = simulate if linear is None and self._exact_ties else None
        out = as_float(self._aggregate(Messages(h, order, ew, sorted_ew, settle), order, ctx))
        if self.bias is not None:
            out = out + self.bias
        return out

    def _prepare(self, edge_index: Tensor, edge_weight: Tensor | None, n: int
                 ) -> tuple[Tensor | None, Tensor | None, EdgeOrder]:
        """The normalized graph (PyG's ``gcn_norm``), its edge order and the coefficients
        in that order, once per graph."""
        if self.normalize:
            edge_index, edge_weight = gcn_norm(edge_index, edge_weight, n, self.improved,
                                               self.add_loops, self.flow, torch.float32)
        order = _order(edge_index, self.flow, n)
        sorted_ew = None if edge_weight is None else edge_weight.index_select(0, order.perm)
        return edge_weight, sorted_ew, order


class IntSAGEConv(IntLayer):
    """``SAGEConv`` (mean, sum or max aggregation of the neighbours' codes; root weight)."""

    kind = "SAGEConv"
    sites = ("weight.lin_l.weight", "weight.lin_r.weight", "message", "aggregate")
    wl: Tensor
    bl: Tensor | None
    wr: Tensor | None
    br: Tensor | None

    def __init__(self, name: str, conv: SAGEConv, points: dict[str, IntQuantizer],
                 input_integer: bool) -> None:
        if conv.project:
            raise Unconvertible(f"{name}: SAGEConv(project=True) is not converted")
        aggr = _aggregation(name, conv, ("sum", "mean", "max", "min"))
        super().__init__(name, points, {
            "cls": "SAGEConv", "in_channels": conv.in_channels,
            "out_channels": conv.out_channels, "aggr": aggr,
            "normalize": conv.normalize, "root_weight": conv.root_weight,
            "bias": conv.lin_l.bias is not None, "flow": conv.flow})
        self.aggr = aggr
        self.flow = conv.flow
        self.root = conv.root_weight
        self.normalize = conv.normalize
        self.register_buffer("wl", conv.lin_l.weight.detach().clone())
        self.register_buffer("bl", None if conv.lin_l.bias is None
                             else conv.lin_l.bias.detach().clone())
        self.weight_l = self._weight(conv.lin_l.weight, "weight.lin_l.weight")
        self.weight_r = None
        self.register_buffer("wr", None)
        self.register_buffer("br", None)
        if self.root:
            self.wr = conv.lin_r.weight.detach().clone()
            self.br = None if conv.lin_r.bias is None else conv.lin_r.bias.detach().clone()
            self.weight_r = self._weight(conv.lin_r.weight, "weight.lin_r.weight")
        message = self.point("message")
        self.place("messages", RESCALE if input_integer and message is not None else FLOAT,
                   "each neighbour's codes rounded to the message point's codes"
                   if message is not None else "float32 messages",
                   "" if message is not None else "the layer has no message point; round "
                   "the messages (site='message') to aggregate integers")
        self.place(f"{self.aggr} aggregation", INTEGER if message is not None else FLOAT,
                   SUM_HOW + (", divided by the count in float32" if self.aggr == "mean"
                              else ""),
                   "" if message is not None else "the messages are float32")
        if self.point("aggregate") is not None:
            self.place("aggregate", INTEGER, "rounded to the aggregate point's codes")
        agg_integer = self.point("aggregate") is not None
        self._place_product("product aggregate W_l", agg_integer, self.weight_l,
                      "round lin_l's weight (site='weight')")
        if self.root:
            self._place_product("product x W_r", input_integer, self.weight_r,
                          "round lin_r's weight (site='weight')")
        self.place("bias and sum", RESCALE, "float32 bias and the two rescaled products added")
        if self.aggr not in ("mean", "sum"):
            self.placements[1] = Placement(f"{name}: {self.aggr} aggregation", FLOAT,
                                           f"float32 {self.aggr}",
                                           "only sum and mean aggregation run on integers")
        if self.normalize:
            self.place("normalize", FLOAT, "float32 L2 normalization",
                       "normalize=True divides by a float32 norm")

    def settles_output(self) -> bool:
        return True

    def forward(self, x: Value, edge_index: Tensor, size: Any = None, *,
                ctx: Context) -> Tensor:
        _no_size(self.name, size)
        n = x.shape[0]
        order = ctx.graph(("order", self.flow), edge_index, None, n,
                          lambda: _order(edge_index, self.flow, n), self.name)
        a = _node_messages(self, x, order, ctx, self.aggr)
        y = self._mm(a, self.weight_l, self.wl, ctx, "product aggregate W_l", bias=self.bl)
        if self.root:
            assert self.wr is not None
            y = y + self._mm(x, self.weight_r, self.wr, ctx, "product x W_r", bias=self.br)

        def simulate(rows: Tensor) -> Tensor:  # (rows as the transformed layer computes them)
            out = F.linear(_rows_float(a, rows), _dequantized(self.weight_l, self.wl), self.bl)
            if self.root:
                assert self.wr is not None
                out = out + F.linear(_rows_float(x, rows), _dequantized(self.weight_r, self.wr),
                                     self.br)
            return F.normalize(out, p=2.0, dim=-1) if self.normalize else out

        if self.normalize:  # (row by row: rows recomputed alone are normalized alike)
            y = F.normalize(y, p=2.0, dim=-1)
        return self._settle(self.then, y, simulate, ctx.ids)


class IntLinear(IntLayer):
    """A linear layer called on its own (``torch.nn.Linear``, PyG's ``Linear``: a head
    after pooling, a classifier after the graph layers): its product on codes where its
    input and weight are rounded."""

    kind = "Linear"
    sites = ("weight.weight",)
    w: Tensor
    b: Tensor | None

    def __init__(self, name: str, conv: nn.Module, points: dict[str, IntQuantizer],
                 input_integer: bool) -> None:
        weight = getattr(conv, "weight", None)
        if not isinstance(weight, Tensor) or isinstance(weight, nn.parameter.UninitializedParameter):
            raise Unconvertible(f"{name}: its weight is not initialized (a lazy Linear): run "
                                "the model once before converting it")
        bias = getattr(conv, "bias", None)
        super().__init__(name, points, {"cls": "Linear", "in_channels": int(weight.shape[1]),
                                        "out_channels": int(weight.shape[0]),
                                        "bias": bias is not None})
        self.register_buffer("w", weight.detach().clone())
        self.register_buffer("b", None if bias is None else bias.detach().clone())
        self.weight = self._weight(weight, "weight.weight")
        self._place_product("product x W", input_integer, self.weight,
                            "round it (site='weight') to run the product on integers")
        last = self.placements[-1]
        if last.runs == INTEGER:  # (an input of more dimensions: as the simulation)
            self.placements[-1] = Placement(last.where, last.runs, last.how + "; an input of "
                                            "more than two dimensions: float32, as the "
                                            "simulation computes it", last.why)
        if self.b is not None:
            self.place("bias", RESCALE, "float32 bias added to the product's values")

    def settles_output(self) -> bool:
        return True

    def forward(self, x: Value, *, ctx: Context) -> Tensor:
        if len(x.shape) != 2:  # (rows of rows: as the simulation computes them)
            return self._mm(x, self.weight, self.w, ctx, simulated=True, bias=self.b)
        y = self._mm(x, self.weight, self.w, ctx, bias=self.b)

        def simulate(rows: Tensor) -> Tensor:  # (rows as the transformed layer computes them)
            return F.linear(_rows_float(x, rows), _dequantized(self.weight, self.w), self.b)

        return self._settle(self.then, y, simulate, ctx.ids)


#: PyG's aggregation modules the converted layers compute, by the name they take
_AGGREGATIONS = {"SumAggregation": "sum", "MeanAggregation": "mean", "MaxAggregation": "max",
                 "MinAggregation": "min"}


def _aggregation(name: str, conv: MessagePassing, computed: tuple[str, ...]) -> str:
    """The name of ``conv``'s aggregation, one of ``computed``; else :class:`Unconvertible`."""
    module = getattr(conv, "aggr_module", None)
    aggr = _AGGREGATIONS.get(type(module).__name__, "")
    if aggr not in computed:
        raise Unconvertible(
            f"{name}: its aggregation {conv.aggr!r} ({type(module).__name__}) is not one the "
            f"converted {type(conv).__name__} computes ({', '.join(computed)})")
    return aggr


def _order(edge_index: Tensor, flow: str, n: int) -> EdgeOrder:
    src, dst = (edge_index[0], edge_index[1]) if flow == "source_to_target" \
        else (edge_index[1], edge_index[0])
    return EdgeOrder(src, dst, n)


def _node_messages(layer: IntLayer, x: Value, order: EdgeOrder, ctx: Context,
                   aggr: str) -> Value:
    """Messages that are the sender's own values (``x_j``), rounded to the message point
    and aggregated (``sum`` / ``mean``; ``max`` and ``min`` in float32)."""
    messages = Messages(as_float(x), order)
    if aggr in ("sum", "add", "mean"):
        return layer._aggregate(messages, order, ctx, mean=aggr == "mean")
    assert aggr in ("max", "min"), aggr
    m = as_float(layer._round("message", messages.floats(), ctx, row_nodes=order.dst,
                              num_nodes=order.n))
    out = torch.zeros((order.n, *m.shape[1:]), device=m.device)
    index = order.dst.view((-1,) + (1,) * (m.dim() - 1)).expand_as(m)
    out = out.scatter_reduce(0, index, m, reduce="amax" if aggr == "max" else "amin",
                             include_self=False)
    return layer._round("aggregate", out, ctx)


class IntGINConv(IntLayer):
    """``GINConv`` whose ``nn`` is PyG's ``MLP``, a ``Sequential`` of linears and ReLUs, or
    one linear."""

    kind = "GINConv"
    sites = ("message", "aggregate")

    def __init__(self, name: str, conv: GINConv, points: dict[str, IntQuantizer],
                 input_integer: bool) -> None:
        _aggregation(name, conv, ("sum",))
        steps = _mlp_steps(conv.nn)
        if steps is None:
            raise Unconvertible(f"{name}: GINConv's nn {type(conv.nn).__name__} is not an MLP of "
                             "linears and ReLUs (PyG's MLP, a Sequential, or one Linear)")
        eps = float(conv.eps.detach())  # (a parameter where train_eps=True)
        super().__init__(name, points, {"cls": "GINConv", "eps": eps,
                                        "flow": conv.flow, "nn": _mlp_layout(conv.nn)})
        self.eps = eps
        self.flow = conv.flow
        self.steps = steps
        linears = [s for s in steps if s[0] == "linear"]
        self.lin_names = [s[1] for s in linears]
        self.weights = nn.ModuleList()
        self.has_weight: list[bool] = []
        for i, (_, child) in enumerate(linears):
            module = conv.nn.get_submodule(child)
            self.register_buffer(f"w{i}", module.weight.detach().clone())
            self.register_buffer(f"b{i}", None if module.bias is None
                                 else module.bias.detach().clone())
            wc = self._weight(module.weight, f"weight.{nn_path(child)}.weight")
            self.has_weight.append(wc is not None)
            if wc is not None:
                self.weights.append(wc)
        message = self.point("message")
        self.place("messages", RESCALE if input_integer and message is not None else FLOAT,
                   "each neighbour's codes rounded to the message point's codes"
                   if message is not None else "float32 messages",
                   "" if message is not None else "round the messages (site='message')")
        self.place("sum aggregation", INTEGER if message is not None else FLOAT,
                   SUM_HOW if message is not None else "float32 sum",
                   "" if message is not None else "the messages are float32")
        agg_integer = self.point("aggregate") is not None
        if agg_integer:
            self.place("aggregate", INTEGER, "rounded to the aggregate point's codes")
        # the MLP: its first product takes (1 + eps) x + aggregate, two grids, as two
        # integer products; later products take what the MLP's points round
        current = agg_integer and input_integer
        rounded, zero = False, True  # (whether the last linear's output is codes holding 0)
        for i, (kind, child) in enumerate(steps):
            if kind == "relu":  # (of codes without a zero code: their float32 values)
                current = current and zero
                continue
            if kind != "linear":
                continue
            weight = self.weight_of(self.lin_names.index(child))
            self._place_product(f"MLP {child or 'linear'} product", current, weight,
                          f"round {nn_path(child)}'s weight (site='weight')")
            if not current and i:
                self.placements[-1] = Placement(
                    f"{name}: MLP {child} product", FLOAT,
                    "float32 product of the MLP's hidden values and the weight's codes"
                    if weight is not None else "float32 product",
                    "a ReLU of the MLP's hidden codes, whose grid has no zero code (mid-rise), "
                    "gives float32 values; round the layer's linear outputs on a grid with a "
                    "zero to run it on integers" if rounded else
                    "the MLP's hidden values have no quantization point; round the layer's "
                    "linear outputs (site='linear') to run it on integers")
            point = self.point(f"linear.{nn_path(child)}")
            rounded, zero = point is not None, point is not None and point.zero_is_code
            current = rounded
        self.place("MLP biases and activations", RESCALE, "float32 biases; ReLU")

    def settles_output(self) -> bool:
        return not any(self.point(f"linear.{nn_path(c)}") is not None for kind, c in self.steps
                       if kind == "linear")

    def applies(self, key: str) -> bool:
        return super().applies(key) or any(
            key in (f"weight.{nn_path(child)}.weight", f"linear.{nn_path(child)}")
            for child in self.lin_names)

    def weight_of(self, j: int) -> WeightCodes | None:
        if not self.has_weight[j]:
            return None
        return self.weights[sum(self.has_weight[:j])]  # type: ignore[return-value]

    def forward(self, x: Value, edge_index: Tensor, size: Any = None, *,
                ctx: Context) -> Tensor:
        _no_size(self.name, size)
        n = x.shape[0]
        order = ctx.graph(("order", self.flow), edge_index, None, n,
                          lambda: _order(edge_index, self.flow, n), self.name)
        a = _node_messages(self, x, order, ctx, "sum")
        h: Value | None = None
        j = 0
        for kind, child in self.steps:
            if kind == "relu":
                h = relu_codes(h)  # type: ignore[arg-type]
                continue
            if kind == "identity":
                continue
            w = self.weight_of(j)
            w_float: Tensor = getattr(self, f"w{j}")
            b: Tensor | None = getattr(self, f"b{j}")
            label = f"MLP {child or 'linear'}"
            if j == 0:
                if isinstance(a, QTensor) and isinstance(x, QTensor) and w is not None:
                    # (two products of two grids, where the float32 model runs one)
                    y = self._mm(a, w, w_float, ctx, label) + (1.0 + self.eps) * \
                        self._mm(x, w, w_float, ctx, label, in_float32=False)
                    if b is not None:
                        y = y + b
                else:
                    y = self._mm(as_float(a) + (1.0 + self.eps) * as_float(x), w, w_float,
                                 ctx, label, bias=b)
            else:
                assert h is not None
                y = self._mm(h, w, w_float, ctx, label, bias=b)
            point = self.point(f"linear.{nn_path(child)}")
            if point is not None:  # (its step and ties as the simulation has them)
                y = self._settle(point, y, self._simulate_linear(j, a, x, h), ctx.ids)
            h = self._round(f"linear.{nn_path(child)}", y, ctx)
            j += 1
        assert h is not None
        if not self.settles_output():
            return as_float(h)

        def simulate(rows: Tensor) -> Tensor:  # (rows as the transformed layer computes them)
            out = _rows_float(a, rows) + (1.0 + self.eps) * _rows_float(x, rows)
            j = 0
            for kind, _ in self.steps:
                if kind == "relu":
                    out = out.relu()
                elif kind == "linear":
                    out = F.linear(out, _dequantized(self.weight_of(j), getattr(self, f"w{j}")),
                                   getattr(self, f"b{j}"))
                    j += 1
            return out

        return self._settle(self.then, as_float(h), simulate, ctx.ids)

    def _simulate_linear(self, j: int, a: Value, x: Value, h: Value | None
                         ) -> Callable[[Tensor], Tensor]:
        """Rows of the MLP's ``j``-th linear output as the simulation computes them, from
        its input: ``a + (1 + eps) x`` for the first, else ``h``, the codes before it."""
        w = _dequantized(self.weight_of(j), getattr(self, f"w{j}"))
        b = getattr(self, f"b{j}")

        def simulate(rows: Tensor) -> Tensor:
            if j == 0:
                inp = _rows_float(a, rows) + (1.0 + self.eps) * _rows_float(x, rows)
            else:
                assert h is not None
                inp = _rows_float(h, rows)
            return F.linear(inp, w, b)

        return simulate


def nn_path(child: str) -> str:
    """The path of a GIN layer's MLP child ``child`` in its point keys (``""``: the MLP is
    one linear, ``nn`` itself)."""
    return f"nn.{child}" if child else "nn"


def _mlp_steps(module: nn.Module) -> list[tuple[str, str]] | None:
    """The MLP as ``("linear", child name)``, ``("relu", "")`` steps (evaluation: dropout
    and identity norms are no-ops); None where it is something else."""
    linears = (nn.Linear, PygLinear)
    if isinstance(module, linears):  # (one linear: the module itself)
        return [("linear", "")]
    if isinstance(module, MLP):
        if module.act is not None and not isinstance(module.act, nn.ReLU):
            return None
        if any(not isinstance(n, nn.Identity) for n in module.norms):
            return None
        steps: list[tuple[str, str]] = []
        count = len(module.lins)
        for i in range(count):
            steps.append(("linear", f"lins.{i}"))
            if (i < count - 1 or not module.plain_last) and module.act is not None:
                steps.append(("relu", ""))
        return steps
    if isinstance(module, nn.Sequential):
        steps = []
        for name, child in module.named_children():
            if isinstance(child, linears):
                steps.append(("linear", name))
            elif isinstance(child, nn.ReLU):
                steps.append(("relu", ""))
            elif isinstance(child, (nn.Dropout, nn.Identity)):
                steps.append(("identity", ""))
            else:
                return None
        return steps
    return None


def _mlp_layout(module: nn.Module) -> dict[str, Any]:
    """What :func:`conv_from` rebuilds a GIN layer's MLP from."""
    if isinstance(module, MLP):
        return {"kind": "mlp", "channels": list(module.channel_list),
                "bias": module.lins[0].bias is not None, "plain_last": module.plain_last,
                "act": module.act is not None}

    def linear(child: nn.Module) -> list[Any]:
        if isinstance(child, PygLinear):
            return ["linear", child.in_channels, child.out_channels, child.bias is not None]
        assert isinstance(child, nn.Linear)
        return ["linear", child.in_features, child.out_features, child.bias is not None]

    if isinstance(module, (nn.Linear, PygLinear)):
        return {"kind": "linear", "layer": linear(module)}
    layers: list[Any] = []
    for _, child in module.named_children():
        if isinstance(child, (nn.Linear, PygLinear)):
            layers.append(linear(child))
        elif isinstance(child, nn.ReLU):
            layers.append(["relu"])
        else:
            layers.append(["identity"])
    return {"kind": "sequential", "layers": layers}


def conv_from(rebuild: dict[str, Any]) -> nn.Module:
    """An untrained PyG layer of the shape a converted layer was built from."""
    args = {k: (tuple(v) if isinstance(v, list) else v) for k, v in rebuild.items()
            if k not in ("cls", "nn", "eps", "input_integer", "accumulate", "ties")}
    kind = rebuild["cls"]
    if kind == "Linear":
        return nn.Linear(rebuild["in_channels"], rebuild["out_channels"], bias=rebuild["bias"])
    if kind == "GCNConv":
        return GCNConv(**args)
    if kind == "SAGEConv":
        return SAGEConv(**args)
    if kind == "GATConv":
        return GATConv(**args)
    if kind == "GINConv":
        layout = rebuild["nn"]
        if layout["kind"] == "linear":
            _, fan_in, fan_out, bias = layout["layer"]
            mlp: nn.Module = nn.Linear(fan_in, fan_out, bias=bias)
        elif layout["kind"] == "mlp":
            mlp = MLP(layout["channels"], act="relu" if layout["act"] else None,
                      norm=None, bias=layout["bias"], plain_last=layout["plain_last"])
        else:
            parts: list[nn.Module] = []
            for entry in layout["layers"]:
                if entry[0] == "linear":
                    parts.append(nn.Linear(entry[1], entry[2], bias=entry[3]))
                else:
                    parts.append(nn.ReLU() if entry[0] == "relu" else nn.Identity())
            mlp = nn.Sequential(*parts)
        return GINConv(mlp, eps=rebuild["eps"], **args)
    raise FxquantValueError(f"unknown converted layer kind {kind!r}")


def relu_codes(v: Value) -> Value:
    """ReLU of codes where zero is a code (a clamp), else of the values."""
    if isinstance(v, QTensor):
        shift = v.shift
        if not per_row(shift) and number(shift) == round(number(shift)):
            floor = -round(number(shift))
            if -128 <= floor <= 127:
                return v.with_codes(v.codes.clamp(min=floor))
        return v.dequantize().relu()
    return v.relu()


class IntGATConv(IntLayer):
    """``GATConv`` with its product, messages and aggregation on codes; the attention
    coefficients (a leaky ReLU and a softmax per target) are float32."""

    kind = "GATConv"
    sites = ("weight.lin.weight", "weight.att_src", "weight.att_dst", "linear.lin",
             "message", "aggregate")
    lin_weight: Tensor
    att_src: Tensor
    att_dst: Tensor
    bias: Tensor | None

    def __init__(self, name: str, conv: GATConv, points: dict[str, IntQuantizer],
                 input_integer: bool) -> None:
        if conv.lin is None or conv.edge_dim is not None or conv.res is not None:
            raise Unconvertible(f"{name}: GATConv with separate source and target linears, edge "
                             "features or a residual is not converted")
        _aggregation(name, conv, ("sum",))
        super().__init__(name, points, {
            "cls": "GATConv", "in_channels": conv.in_channels,
            "out_channels": conv.out_channels, "heads": conv.heads, "concat": conv.concat,
            "negative_slope": conv.negative_slope, "add_self_loops": conv.add_self_loops,
            "fill_value": conv.fill_value, "bias": conv.bias is not None, "flow": conv.flow})
        self.heads, self.channels, self.concat = conv.heads, conv.out_channels, conv.concat
        self.negative_slope = conv.negative_slope
        self.add_loops, self.fill_value, self.flow = conv.add_self_loops, conv.fill_value, \
            conv.flow
        self.register_buffer("lin_weight", conv.lin.weight.detach().clone())
        self.register_buffer("att_src", conv.att_src.detach().clone())
        self.register_buffer("att_dst", conv.att_dst.detach().clone())
        self.register_buffer("bias", None if conv.bias is None else conv.bias.detach().clone())
        self.weight = self._weight(conv.lin.weight, "weight.lin.weight")
        self.att_src_codes = self._weight(conv.att_src, "weight.att_src")
        self.att_dst_codes = self._weight(conv.att_dst, "weight.att_dst")
        self._place_product("product x W", input_integer, self.weight,
                      "round it (site='weight') to run the product on integers")
        self.place("attention", FLOAT, "float32 attention logits, leaky ReLU and softmax per "
                   "target node",
                   "a softmax has no integer form: GAT's attention coefficients stay float32")
        self._messages(True, True)
        if self.point("aggregate") is not None:
            self.place("aggregate", INTEGER, "rounded to the aggregate point's codes")
        self.place("heads and bias", RESCALE, "float32 concatenation or mean of the heads, bias")

    def forward(self, x: Value, edge_index: Tensor, edge_attr: Tensor | None = None,
                size: Any = None, *, ctx: Context) -> Tensor:
        _no_size(self.name, size)
        del edge_attr  # (a GATConv without edge_dim, which is all converted, ignores it)
        H, C = self.heads, self.channels
        if self._simulated_product:
            # the attention reads the product's values: the simulation's float32 product,
            # so that the coefficients and the messages are the simulation's to the bit
            h = self._mm(x, self.weight, self.lin_weight, ctx, simulated=True)
        else:
            h, _, _ = self._projected(x, self.weight, self.lin_weight, ctx)
        h = h.view(-1, H, C)
        att_src = self.att_src_codes.values() if self.att_src_codes is not None \
            else self.att_src
        att_dst = self.att_dst_codes.values() if self.att_dst_codes is not None \
            else self.att_dst
        a_src = (h * att_src).sum(-1)
        a_dst = (h * att_dst).sum(-1)
        n = h.shape[0]
        order = ctx.graph(("gat", self.add_loops, self.flow), edge_index, None, n,
                          lambda: self._prepare(edge_index, n), self.name)
        src, dst = order.src, order.dst
        alpha = a_src.index_select(0, src) + a_dst.index_select(0, dst)
        alpha = F.leaky_relu(alpha, self.negative_slope)
        alpha = softmax(alpha, dst, None, n)
        out = as_float(self._aggregate(Messages(h, order, alpha), order, ctx))
        out = out.reshape(-1, H * C) if self.concat else out.mean(dim=1)
        if self.bias is not None:
            out = out + self.bias
        return out

    @property
    def _simulated_product(self) -> bool:
        """Whether the product runs as the simulation's (``ties="simulation"`` without a
        point rounding it)."""
        return self._exact_ties and self.point("linear.lin") is None

    _simulated_why = ("GAT's attention coefficients (a float32 softmax) and its messages "
                      "read the product's values, which the integer product gives an ulp "
                      "apart: round its output (site='linear'), or convert with "
                      "ties='nearest' to run it on integers")

    def _prepare(self, edge_index: Tensor, n: int) -> EdgeOrder:
        """Self-loops as the layer adds them, and the edge order, once per graph."""
        if self.add_loops:
            edge_index, _ = remove_self_loops(edge_index)
            edge_index, _ = add_self_loops(edge_index, num_nodes=n)
        return _order(edge_index, self.flow, n)


def _no_size(layer: str, size: Any) -> None:
    if size is not None:
        raise FxquantValueError(f"the converted layer {layer!r} takes a square graph (size=None), "
                                f"got size={size!r}")


def layer_classes() -> dict[type[nn.Module], type[IntLayer]]:
    """The PyG layers converted, and their integer form."""
    return {GCNConv: IntGCNConv, SAGEConv: IntSAGEConv, GINConv: IntGINConv,
            GATConv: IntGATConv, nn.Linear: IntLinear, PygLinear: IntLinear}
