"""What a transformed model's quantized values cost in bits: :func:`bit_report` and, for
learned per-node bit-widths, the differentiable :func:`bit_penalty`.

How bits are counted (so a budget cannot be met by accounting):

- every value a quantization point rounds counts with its bits: the format's bits, or its
  row's bits (:class:`~fxquant.quant.node_bits.NodeBits`, a node override's format);
- storage of what decoding needs is added: a float32 scale per tensor (32 bits, also for a
  learned LSQ step), per row (``scale="row"``: 32 bits per row) or per block of 32
  (``"block32"``: an 8-bit E8M0 scale); a per-node bit-width costs, per node that has
  rows there, the bits of a fixed-length code for the allowed widths (3 for the default 2
  to 8 bits: seven widths), unless it follows from the graph (``NodeBits.by_degree``); a
  table shared by several points (:func:`fxquant.share_bits`) is counted once;
- ``avg_bits`` averages over every quantized value **except the model's raw input
  features** (an ``input`` point on a forward argument): normalized bag-of-words rows are
  exact at 1 bit with a per-row scale, which would make any budget trivial. They are
  reported on their own (``input_bits``), and ``avg_bits_with_input`` counts them too;
- unquantized float32 values are not counted (a model is as cheap as its quantized sites).

The counts are of one forward (rows differ per batch): :func:`bit_report` runs one in
eval on the inputs given, and counts every call of a point that runs several times in it
(a layer called twice, or one that propagates several steps, as ``APPNP`` does; each call
with its own scale storage; a weight is one tensor, counted once). Without inputs it, and
:func:`bit_penalty` always, count the last forward's **last call** of each point: give
:func:`bit_report` the inputs for a model that calls a point more than once.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from tabulate import tabulate
from torch import Tensor, nn

from fxquant.errors import FxquantRuntimeError, FxquantValueError
from fxquant.quant._probe import probe
from fxquant.quant.node_bits import bitwidth_bits
from fxquant.quant.points import QuantPoint

__all__ = ["BitReport", "SiteBits", "bit_penalty", "bit_report"]


@dataclass
class SiteBits:
    """One quantization point's count, from the last forward."""

    name: str
    layer: str
    site: str
    values: int  # values rounded
    value_bits: float  # sum over values of their bits
    storage_bits: float  # scales and per-node bit-widths
    raw_input: bool
    histogram: dict[int, int] = field(default_factory=dict)  # bits -> rows

    @property
    def avg_bits(self) -> float:
        return (self.value_bits + self.storage_bits) / max(self.values, 1)


@dataclass
class BitReport:
    """Bits per site and overall; ``str()`` is a table.

    Example:
        >>> import torch, fxquant
        >>> from torch_geometric.nn.models import GCN
        >>> gm = fxquant.transform(GCN(4, 8, num_layers=2, out_channels=2), format="int4",
        ...                        scale="tensor")
        >>> report = fxquant.bit_report(gm, torch.randn(10, 4), torch.tensor([[0, 1], [1, 2]]))
        >>> [(s.name, s.values) for s in report.sites]      # 4 bits a value, a 32-bit scale
        [('convs_0_quant', 80), ('convs_1_quant', 20)]
        >>> round(report.avg_bits, 2)
        4.64
    """

    sites: list[SiteBits]

    def _avg(self, sites: list[SiteBits]) -> float:
        values = sum(s.values for s in sites)
        return sum(s.value_bits + s.storage_bits for s in sites) / values if values else math.nan

    @property
    def avg_bits(self) -> float:
        """Average bits per quantized value, raw input features excluded, storage included."""
        return self._avg([s for s in self.sites if not s.raw_input])

    @property
    def input_bits(self) -> float:
        """Average bits of the raw input features (NaN when they are not quantized)."""
        return self._avg([s for s in self.sites if s.raw_input])

    @property
    def avg_bits_with_input(self) -> float:
        return self._avg(self.sites)

    @property
    def histogram(self) -> dict[int, int]:
        """Rows per bit-width, over every site with per-row bit-widths."""
        total: Counter[int] = Counter()
        for s in self.sites:
            total.update(s.histogram)
        return dict(sorted(total.items()))

    @property
    def memory_bytes(self) -> float:
        """The quantized values and their storage, in bytes."""
        return sum(s.value_bits + s.storage_bits for s in self.sites) / 8

    @property
    def float32_bytes(self) -> int:
        return 4 * sum(s.values for s in self.sites)

    def to_dict(self) -> dict[str, Any]:
        return {"avg_bits": self.avg_bits, "input_bits": self.input_bits,
                "avg_bits_with_input": self.avg_bits_with_input, "histogram": self.histogram,
                "memory_bytes": self.memory_bytes, "float32_bytes": self.float32_bytes,
                "sites": [{"name": s.name, "layer": s.layer, "site": s.site, "values": s.values,
                           "avg_bits": s.avg_bits, "raw_input": s.raw_input,
                           "histogram": s.histogram} for s in self.sites]}

    def __str__(self) -> str:
        rows = [[s.layer, s.site + (" (raw input)" if s.raw_input else ""), s.values,
                 f"{s.avg_bits:.2f}",
                 " ".join(f"{b}:{n}" for b, n in sorted(s.histogram.items())) or "-"]
                for s in self.sites]
        table = tabulate(rows, headers=["layer", "site", "values", "bits/value",
                                        "rows per bit-width"], tablefmt="simple")
        return (f"{table}\n\navg_bits {self.avg_bits:.3f} (raw input excluded), input_bits "
                f"{self.input_bits:.3f}, with input {self.avg_bits_with_input:.3f}; "
                f"{self.memory_bytes / 2**10:,.1f} KiB vs {self.float32_bytes / 2**10:,.1f} "
                "KiB in float32")


def _table_nodes(points: list[tuple[str, QuantPoint]]) -> dict[str, int]:
    """Which points store a per-node bit-width table, and for how many nodes: a table
    several points share (:func:`fxquant.share_bits`) is stored once, at its source, or
    at the first sharing point that ran when the source did not, for the most nodes any
    of them had rows for."""
    owners: dict[int, tuple[str, int]] = {}
    for name, point in points:
        rb = point.config.node_bits
        if rb is None or not rb.stored:
            continue
        assert point.node_widths is not None
        table = point.node_widths.bits
        nodes = point.__dict__["last_rows"][2]
        owner, most = owners.get(id(table), (name, 0))
        if point.__dict__.get("bits_source") is None:
            owner = name
        owners[id(table)] = (owner, max(most, nodes))
    return dict(owners.values())


def _count(name: str, point: QuantPoint, table_nodes: int = 0, differentiable: bool = False,
           call: tuple[Any, Any] | None = None) -> tuple[SiteBits, Tensor | None]:
    """The point's bits in its last forward (or in ``call``, one of the calls
    :func:`bit_report` logged: what ``last_rows`` and ``last_widths`` held then), with the
    storage of a per-node bit-width table for ``table_nodes`` nodes; with
    ``differentiable``, also the sum of the learned rows' bits as a tensor (for the
    penalty)."""
    last, node_bits = call if call is not None else (point.__dict__.get("last_rows"),
                                                     point.__dict__["last_widths"])
    assert isinstance(last, tuple)
    rows, width, _, override_rows = last
    config = point.config
    values = rows * width
    histogram: dict[int, int] = {}
    learned_sum = None
    if config.node_bits is not None:
        bits, _ = node_bits
        value_bits = float(bits.detach().sum()) * width
        if differentiable and point.node_widths is not None and point.node_widths.learned:
            learned_sum = bits.sum() * width
        histogram = dict(Counter(int(b) for b in bits.detach().round().tolist()))
        storage = bitwidth_bits(config.node_bits) * table_nodes
    else:
        base = config.format.bits
        value_bits = float(base * values)
        if override_rows is not None and point.override is not None:
            extra = int(override_rows.sum())
            value_bits += (point.override.format.bits - base) * extra * width
        storage = 0
    # the scales (a registered scale kind counts its own); a learned step is one float32
    storage += 32 if config.range == "lsq" else config.scale.storage_bits(rows, width)
    site = SiteBits(name, point.layer, point.site.value, values, value_bits, float(storage),
                    bool(point.__dict__.get("raw_input")), histogram)
    return site, learned_sum


def _points(gm: nn.Module) -> list[tuple[str, QuantPoint]]:
    """The points that rounded something in the last forward (an input point passes
    integer inputs through; a point outside the forward's path does not run)."""
    points = [(n, m) for n, m in gm.named_modules() if isinstance(m, QuantPoint)]
    ran = [(n, m) for n, m in points if isinstance(m.__dict__.get("last_rows"), tuple)]
    if points and not ran:
        raise FxquantRuntimeError("fxquant: no quantization point has run yet; run a forward first "
                           "(fxquant.bit_report(gm, *inputs) does)")
    return ran


def bit_report(gm: nn.Module, *example_inputs: Any, **kwargs: Any) -> BitReport:
    """Run one forward of ``gm`` in eval on ``example_inputs`` and count the bits of every
    quantized value (see the module docstring). The forward leaves no trace: no gradient,
    and the modes, what the last forward recorded (which :func:`bit_penalty` reads), layer
    caches (``GCNConv(cached=True)``) and the random generators are put back.

    Args:
        gm (torch.nn.Module): a model :func:`fxquant.transform` returned.
        *example_inputs: its forward's positional arguments. Without any arguments, the
            counts of the last forward are reported.
        **kwargs: its forward's keyword arguments (``node_ids=`` for a batch).

    Example:
        >>> import fxquant
        >>> from torch_geometric.nn import GCNConv
        >>> class GCN(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.conv = GCNConv(4, 16)
        ...     def forward(self, x, edge_index):
        ...         return self.conv(x, edge_index)
        >>> gm = fxquant.transform(GCN(), bits=8)
        >>> report = fxquant.bit_report(gm, torch.randn(10, 4), torch.tensor([[0, 1], [1, 2]]))
        >>> report.avg_bits, report.float32_bytes
        (8.0, 640)
    """
    if not any(isinstance(m, QuantPoint) for m in gm.modules()):
        raise FxquantValueError("fxquant.bit_report: this model has no quantization points")
    if not (example_inputs or kwargs):
        return _report(gm, {})
    all_points = [(n, m) for n, m in gm.named_modules() if isinstance(m, QuantPoint)]
    with probe(gm):  # (the record of the last training forward is put back after)
        for _, point in all_points:
            point.__dict__["calls"] = []
        gm(*example_inputs, **kwargs)
        return _report(gm, {n: p.__dict__["calls"] for n, p in all_points})


def _report(gm: nn.Module, calls: dict[str, list[tuple[Any, Any]]]) -> BitReport:
    """The count of what the last forward recorded (``calls``: every call of a point)."""
    points = _points(gm)
    tables = _table_nodes(points)
    sites = []
    for name, point in points:
        logged: list[tuple[Any, Any] | None] = [*calls.get(name, [])] or [None]
        if point.site.value == "weight":  # one stored tensor, however often it is used
            logged = logged[-1:]
        counted = [_count(name, point, tables.get(name, 0) if i == 0 else 0, call=call)[0]
                   for i, call in enumerate(logged)]
        sites.append(_merge(counted))
    return BitReport(sites)


def _merge(calls: list[SiteBits]) -> SiteBits:
    """One point's count over the calls of one forward (a layer called twice, or one that
    propagates several steps, as ``APPNP`` does): every call's values and storage."""
    first = calls[0]
    if len(calls) == 1:
        return first
    histogram: Counter[int] = Counter()
    for c in calls:
        histogram.update(c.histogram)
    return SiteBits(first.name, first.layer, first.site, sum(c.values for c in calls),
                    sum(c.value_bits for c in calls), sum(c.storage_bits for c in calls),
                    first.raw_input, dict(sorted(histogram.items())))


def bit_penalty(gm: nn.Module, target_bits: float) -> Tensor:
    """``(avg_bits - target_bits) ** 2`` of the last forward, differentiable in the learned
    per-node bit-widths (:class:`~fxquant.quant.node_bits.NodeBits`): add it, weighted, to the
    loss to pull the average toward a budget. ``avg_bits`` is counted as
    :func:`bit_report` counts it (raw input excluded, storage included). After an empty
    batch (no value counted) the penalty is 0.

    Example:
        >>> import fxquant
        >>> from fxquant.quant.node_bits import NodeBits
        >>> config = fxquant.QuantConfig("int8", scale="tensor", range="lsq",
        ...                              node_bits=NodeBits.learned_init(6, 6.0))
        >>> gm = fxquant.transform(torch.nn.Sequential(torch.nn.Linear(4, 4)),
        ...                        fxquant.QuantMapping().set_name("0", config))
        >>> out = gm(torch.randn(6, 4))
        >>> penalty = fxquant.bit_penalty(gm, 2.0)
        >>> penalty.backward()
        >>> bool(gm.get_submodule("_0_quant").node_widths.bits.grad.gt(0).all())
        True
    """
    if isinstance(target_bits, bool) or not isinstance(target_bits, int | float) \
            or not math.isfinite(target_bits) or target_bits <= 0:
        raise FxquantValueError(f"fxquant.bit_penalty: target_bits must be a finite positive "
                                f"number of bits (e.g. 2.0), got {target_bits!r}")
    avg, total_values = average_bits(gm)
    if not total_values:  # an empty batch: no value to count, nothing to pull
        return avg * 0.0
    return (avg - target_bits) ** 2


def average_bits(gm: nn.Module) -> tuple[Tensor, int]:
    """The last forward's average bits per value as :func:`bit_penalty` counts it
    (differentiable in the learned widths), and how many values it counted."""
    total_values = 0
    fixed_bits = 0.0
    learned: list[Tensor] = []
    points = _points(gm)
    tables = _table_nodes(points)
    for name, point in points:
        site, learned_sum = _count(name, point, tables.get(name, 0), differentiable=True)
        if site.raw_input:
            continue
        total_values += site.values
        if learned_sum is not None:
            learned.append(learned_sum)
            fixed_bits += site.storage_bits
        else:
            fixed_bits += site.value_bits + site.storage_bits
    if not learned:
        raise FxquantValueError("fxquant.bit_penalty: no point has learned per-node bit-widths "
                         "(NodeBits.learned_init); nothing to pull toward the budget")
    avg = (torch.stack(learned).sum() + fixed_bits) / max(total_values, 1)
    return avg, total_values
