"""What to quantize where: one frozen :class:`QuantConfig` per quantization point, chosen
by a :class:`QuantMapping` with a documented precedence.

Vocabulary (following PyG): a **node** is a vertex of the user's graph (node ids,
:func:`~fxquant.quant.nodes.top_degree_nodes`, in-degree); a **row** is a row of a tensor
(``scale="row"``); a **layer** is a call in the traced model (a submodule, a function or a
method); a **site** is where on a layer a value is rounded (:class:`Site`); what the
pass inserts are **quantization points**.

A **format** is what values are rounded to: :class:`~fxquant.formats.TopN` (keep the top
bits of the pattern; an ``int`` means this), a :class:`~fxquant.formats.Format` or an
:class:`~fxquant.formats.IntFormat`. A **bit-width per node** is a :class:`NodeBits`;
a few nodes rounded to another format are a :class:`NodeOverride`.

Example:
    >>> from torch_geometric.nn import GCNConv
    >>> mapping = (QuantMapping()
    ...            .set_global(QuantConfig(16))
    ...            .set_type(GCNConv, QuantConfig("e4m3", scale="tensor"))
    ...            .set_name("conv2", QuantConfig(8, rounding="nearest")))
    >>> print(mapping)
    QuantMapping(
      global output: top16, toward_zero, ste
      type GCNConv output: e4m3, nearest, scale tensor, ste
      name 'conv2' output: top8, nearest, ste
    )
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch
import torch_geometric.nn as pyg_nn
from torch import Tensor, nn
from torch.fx import GraphModule, Node
from torch_geometric.nn import MessagePassing

from fxquant.errors import FxquantTypeError, FxquantValueError, same_kind, warn_renamed
from fxquant.formats import Format, IntFormat, Number, TopN, parse
from fxquant.fx.degree import in_degree
from fxquant.fx.selectors import layer_name, layer_names, matches, unknown_layer
from fxquant.modes import Grad, Rounding, Scale

__all__ = [
    "NodeBits",
    "NodeOverride",
    "Number",
    "Protection",
    "QuantConfig",
    "QuantMapping",
    "Resolved",
    "Site",
    "as_number",
    "describe",
    "describe_nodes",
]

#: names a QuantConfig field had before (pickles and JSON of older files use them)
_OLD_FIELDS = {"number": "format", "grad_number": "grad_format", "row_bits": "node_bits"}


def _renamed(owner: str, name: str, value: Any, old: str, old_value: Any) -> Any:
    """``value``, or ``old_value`` given under a deprecated keyword (with a warning)."""
    if old_value is None:
        return value
    if value is not None:
        raise FxquantTypeError(f"{owner}: {old}= is the old name of {name}=; please give only "
                               f"{name}=")
    warn_renamed(f"{owner}({old}=)", f"{owner}({name}=)", stacklevel=4)
    return old_value


def as_number(value: object, arg: str = "number", max_bits: int = 64) -> Number:
    """A :class:`TopN` (an ``int`` of kept bits, ``"topN"``), a :class:`Format` (a preset
    name, ``"eXmY"``, ``(exp_bits, man_bits)``) or an :class:`IntFormat` (``"int8"``,
    ``("int", 4)``), validated; errors name ``arg``.

    Example:
        >>> as_number(16), as_number("e4m3").spec()
        (TopN(bits=16), 'e4m3')
        >>> as_number(40, "bits", max_bits=32)
        Traceback (most recent call last):
        ...
        fxquant.errors.FxquantValueError: bits=40 is out of range: it counts the kept bits of the model's \
32-bit float pattern, so 1 <= bits <= 32.
    """
    if isinstance(value, bool) or value is None or isinstance(value, float):
        raise FxquantTypeError(
            f"{arg} must be an int (kept bits) or a format ('e4m3', (3, 2), a Format), "
            f"got {value!r}"
        )
    if isinstance(value, int):
        bits = value
    else:
        try:
            parsed = parse(value)
        except (ValueError, TypeError) as e:
            raise same_kind(e, f"{arg}: {e}") from e
        if not isinstance(parsed, TopN):
            return parsed
        bits = parsed.bits
    if not 1 <= bits <= max_bits:
        raise FxquantValueError(
            f"{arg}={bits} is out of range: it counts the kept bits of the model's "
            f"{max_bits}-bit float pattern, so 1 <= {arg} <= {max_bits}."
        )
    return TopN(bits)


def describe(number: Number) -> str:
    """The number as it is written (``"top16"``, ``"e4m3"``, ``"int8"``)."""
    return number.spec()


class Site(str, Enum):
    """Where on a layer values are rounded (adding a site adds a value here and its
    insertion: the documentation's "Extending fxquant" page says where).

    ``OUTPUT``: what the layer returns; ``INPUT``: its first argument (node features; both
    parts of a ``(source, target)`` pair; non-float arguments pass through; where a dropout
    feeds only the layer, what the dropout receives, so that training and evaluation round
    the same range); ``WEIGHT``:
    each of its floating parameters with at least two dims; ``MESSAGE``: the output of
    ``message()``, one row per edge (PyG ``MessagePassing`` layers); ``AGGREGATE``: the
    aggregation, one row per node, before ``update()``; ``LINEAR``: the output of each
    linear transform the layer applies (its ``torch.nn.Linear`` / PyG ``Linear``
    children: ``X W`` in GCN and GAT, the MLP's layers in GIN), one row per node;
    ``EDGE``: the floating per-edge arguments the layer hands ``message()`` (those
    without an ``_i``/``_j`` suffix, one row per edge: GCN's normalisation coefficients
    ``edge_weight``, GAT's attention coefficients ``alpha``, an ``edge_attr``).

    Example:
        >>> import fxquant
        >>> fxquant.Site.parse("message"), fxquant.Site("aggregate").value
        (<Site.MESSAGE: 'message'>, 'aggregate')
        >>> from torch_geometric.nn.models import GCN
        >>> mapping = fxquant.QuantMapping().set_global(
        ...     fxquant.QuantConfig("int8", scale="tensor"), site=fxquant.Site.MESSAGE)
        >>> gm = fxquant.transform(GCN(4, 8, num_layers=1, out_channels=2), mapping)
        >>> [p.site.value for _, p in fxquant.quantization_points(gm)]
        ['message']
    """

    OUTPUT = "output"
    INPUT = "input"
    WEIGHT = "weight"
    MESSAGE = "message"
    AGGREGATE = "aggregate"
    LINEAR = "linear"
    EDGE = "edge"

    @property
    def inner(self) -> bool:
        """Rounded inside the layer's own call (not in the traced graph around it)."""
        return self not in (Site.OUTPUT, Site.INPUT)

    @property
    def per_edge(self) -> bool:
        """Its rows are edges (messages, per-edge arguments), not nodes."""
        return self in (Site.MESSAGE, Site.EDGE)

    @classmethod
    def parse(cls, value: object) -> Site:
        if isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            raise FxquantValueError(f"site={value!r} is not one of {[s.value for s in cls]}") from None

    def __str__(self) -> str:
        return str(self.value)


_RANGES = ("minmax", "percentile", "lsq")


def _parse_range(value: object) -> str:
    """``"minmax"``, ``"lsq"`` or ``"percentile:Q"`` with ``50 < Q <= 100``, normalized."""
    if not isinstance(value, str):
        raise FxquantTypeError(f"range must be 'minmax', 'percentile:Q' or 'lsq', got {value!r}")
    kind, _, q = value.partition(":")
    if kind == "percentile":
        try:
            number = float(q)
        except ValueError:
            number = math.nan
        if not 50 < number <= 100:
            raise FxquantValueError(f"range={value!r}: please give the percentile as 'percentile:Q' "
                             "with 50 < Q <= 100, e.g. 'percentile:99.9'")
        return f"percentile:{number:g}"
    if kind not in _RANGES or q:
        raise FxquantValueError(f"range={value!r} is not one of ['minmax', 'percentile:Q', 'lsq']")
    return kind



_OBSERVE = ("batch", "ema", "widen")


def _parse_observe(value: object, momentum: float | None, mode: Scale, source: str) -> str:
    """``observe=`` checked against the momentum, scale and range it goes with."""
    if value is None:
        return "ema" if momentum is not None else "batch"
    if value not in _OBSERVE:
        raise FxquantValueError(f"observe={value!r} is not one of {list(_OBSERVE)}")
    if value == "ema" and momentum is None:
        raise FxquantValueError("observe='ema' keeps a running average: please give its "
                                "momentum= too (e.g. 0.99)")
    if value != "ema" and momentum is not None:
        raise FxquantValueError(f"momentum={momentum} keeps a running average (observe='ema'), "
                                f"not observe={value!r}; please drop one of them")
    if value == "widen" and (not mode.per_tensor or source == "lsq"):
        raise FxquantValueError("observe='widen' keeps one widest range per tensor; please use "
                                f"scale='tensor' with a minmax or percentile range (got "
                                f"scale={mode.value!r}, range={source!r})")
    return str(value)


def _require(data: object, keys: tuple[str, ...], what: str) -> None:
    """``data`` is a dict with ``keys``, or an error naming the first missing one."""
    if not isinstance(data, dict):
        raise FxquantTypeError(f"{what}.from_dict expects a dict, got {type(data).__name__}")
    for key in keys:
        if key not in data:
            raise FxquantValueError(f"{what}.from_dict: no {key!r} entry in {data!r}")


def _check_count(value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FxquantValueError(f"{what} must be an int >= 0, got {value!r}")


_SHARE = ("point", "layer")
_MESSAGES = ("target", "source")
_RANGE_ROWS = ("all", "unprotected")


@dataclass(frozen=True)
class Protection:
    """Degree-Quant's protective mask (Tailor et al., ICLR 2021), and how a layer's
    quantization points use it.

    In training, each node stays at full precision with probability ``p_min + (p_max -
    p_min) * F(in-degree)``, ``F`` the fraction of nodes with at most its in-degree (the
    in-degree of the forward's own graph: a mini-batch's subgraph); in evaluation every
    node is rounded.

    Args:
        p_min (float): the probability of the lowest in-degree.
        p_max (float): the probability of the highest in-degree.
        share (str, optional): ``"point"``: each point draws its own mask;
            ``"layer"``: one mask per layer and forward, shared by all of the layer's
            points (Degree-Quant's; a layer called twice in one forward keeps its first
            draw). (default: ``"point"``)
        messages (str, optional): which node's draw a message (and a per-edge argument)
            follows: its ``"target"`` (the node it is aggregated into) or its
            ``"source"`` (the node that sent it, Degree-Quant's). (default: ``"target"``)
        ranges (str, optional): the rows a range (``minmax``, ``percentile``) is taken
            over: ``"all"`` of them, or only the ``"unprotected"`` ones, which are the only
            ones rounded (Degree-Quant's). (default: ``"all"``)

    A ``(p_min, p_max)`` tuple means ``Protection(p_min, p_max)``, and a Protection
    unpacks like that tuple.

    Example:
        >>> Protection(0.0, 0.2) == (0.0, 0.2)
        True
        >>> p_min, p_max = Protection(0.0, 0.2, share="layer", messages="source")
        >>> Protection(0.0, 0.2, share="layer", messages="source").describe()
        'protect 0..0.2 (layer mask, messages by source)'
    """

    p_min: float
    p_max: float
    share: str = "point"
    messages: str = "target"
    ranges: str = "all"

    def __post_init__(self) -> None:
        ok = all(isinstance(p, (int, float)) and not isinstance(p, bool)
                 for p in (self.p_min, self.p_max))
        if not ok or not 0 <= self.p_min <= self.p_max <= 1:
            raise FxquantValueError(f"protect must be (p_min, p_max) with 0 <= p_min <= p_max "
                                    f"<= 1, got {(self.p_min, self.p_max)!r}")
        object.__setattr__(self, "p_min", float(self.p_min))
        object.__setattr__(self, "p_max", float(self.p_max))
        for name, allowed in (("share", _SHARE), ("messages", _MESSAGES),
                              ("ranges", _RANGE_ROWS)):
            if getattr(self, name) not in allowed:
                raise FxquantValueError(f"Protection: {name}={getattr(self, name)!r} is not one "
                                        f"of {list(allowed)}")

    @classmethod
    def parse(cls, value: object) -> Protection:
        """A Protection from itself or a ``(p_min, p_max)`` pair."""
        if isinstance(value, Protection):
            return value
        if isinstance(value, (tuple, list)) and len(value) == 2:
            return cls(*value)
        raise FxquantValueError(f"protect must be (p_min, p_max) with 0 <= p_min <= p_max <= 1, "
                                f"or a fxquant.Protection; got {value!r}")

    def __iter__(self) -> Any:
        return iter((self.p_min, self.p_max))

    def __getitem__(self, index: int) -> float:
        return (self.p_min, self.p_max)[index]

    def __len__(self) -> int:
        return 2

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (tuple, list)):
            try:
                other = Protection.parse(other)
            except FxquantValueError:
                return False
        if not isinstance(other, Protection):
            return NotImplemented
        return (self.p_min, self.p_max, self.share, self.messages, self.ranges) == (
            other.p_min, other.p_max, other.share, other.messages, other.ranges)

    def __hash__(self) -> int:
        return hash((self.p_min, self.p_max, self.share, self.messages, self.ranges))

    @property
    def plain(self) -> bool:
        """Only the probabilities differ from the defaults (what a tuple says)."""
        return (self.share, self.messages, self.ranges) == ("point", "target", "all")

    def describe(self) -> str:
        notes = []
        if self.share == "layer":
            notes.append("layer mask")
        if self.messages == "source":
            notes.append("messages by source")
        if self.ranges == "unprotected":
            notes.append("ranges over unprotected rows")
        text = f"protect {self.p_min:g}..{self.p_max:g}"
        return text + (f" ({', '.join(notes)})" if notes else "")

    def to_dict(self) -> list[float] | dict[str, Any]:
        """``[p_min, p_max]`` when only the probabilities are set, else every field."""
        if self.plain:
            return [self.p_min, self.p_max]
        return {"p_min": self.p_min, "p_max": self.p_max, "share": self.share,
                "messages": self.messages, "ranges": self.ranges}

    @classmethod
    def from_dict(cls, data: object) -> Protection:
        """The Protection :meth:`to_dict` wrote."""
        if isinstance(data, dict):
            _require(data, ("p_min", "p_max"), "Protection")
            return cls(**data)
        return cls.parse(data)


@dataclass(frozen=True, eq=False)
class NodeBits:
    """A bit-width per node for an integer site, fixed or learned.

    Row ``r`` of the rounded tensor belongs to a node (its own row at node-level sites; a
    message's target at the message site) and is rounded to that node's ``b`` bits: codes in
    ``[-(2**(b-1) - 1), 2**(b-1) - 1]`` (signed formats), ``[0, 2**b - 1]`` (unsigned), or
    the ``2**b`` levels ``k + 1/2``, ``k`` in ``[-2**(b-1), 2**(b-1) - 1]`` (mid-rise,
    ``"int8:midrise"``: at 1 bit, the sign).

    - With a range (``range="minmax"``, ``"percentile:Q"``, a running range, or
      ``scale="row"``) the step of row ``r`` is ``range / qmax_r``: bits set each row's
      resolution over the same range.
    - With ``range="lsq"`` one learned step ``s`` is shared and row ``r`` covers
      ``s * qmax_r``: bits set each row's range. Learned bit-widths (:meth:`learned_init`) need
      this form: the gradient reaches a row's bits where its values are clipped (A2Q, Zhu et
      al., ICLR 2023, "Aggregation-Aware Quantization for Graph Neural Networks", learns a
      bit-width and a step per node the same way; here the step is shared, so the storage
      cost is one bit-width per node). The bits are continuous parameters, rounded in the
      forward with a straight-through gradient and kept in ``[min_bits, max_bits]``;
      :func:`fxquant.bit_penalty` pulls their average toward a budget.

    Bits are stored per **global node id** (``node_ids=`` of the transformed model in
    mini-batches). Nodes outside the table, and in eval learned nodes never seen in
    training, take the bits of the seen node whose range (``max |value|`` of its row) is
    nearest: A2Q's nearest-neighbour strategy for unseen nodes.

    Args:
        bits (Tensor): one entry per node: the bit-widths (fixed), or their initial values
            (learned).
        learned (bool, optional): learn them. (default: :obj:`False`)
        min_bits, max_bits (int, optional): the allowed range. (default: 2 and 8; 1 is
            allowed for unsigned and mid-rise formats)

    Example:
        >>> rb = NodeBits(torch.tensor([2, 4, 8]))
        >>> rb
        NodeBits(3 nodes, fixed, 2..8 bits, mean 4.67)
        >>> NodeBits.learned_init(5, 3.0)
        NodeBits(5 nodes, learned, 2..8 bits, mean 3.00)
    """

    bits: Tensor
    learned: bool = False
    min_bits: int = 2
    max_bits: int = 8
    #: whether decoding needs the table stored (False: the bits follow from the graph)
    stored: bool = True

    def __post_init__(self) -> None:
        bits = self.bits
        if not isinstance(bits, Tensor) or bits.dim() != 1 or bits.is_complex() \
                or bits.dtype == torch.bool:
            raise FxquantTypeError(f"NodeBits: bits must be a 1-D tensor with one bit-width per node, "
                            f"got {bits!r}")
        if not (isinstance(self.min_bits, int) and isinstance(self.max_bits, int)
                and 1 <= self.min_bits <= self.max_bits <= 16):
            raise FxquantValueError(f"NodeBits: need 1 <= min_bits <= max_bits <= 16, got "
                             f"{self.min_bits}..{self.max_bits}")
        if not bits.numel():
            raise FxquantValueError("NodeBits: the table holds no node; please give one "
                                    "bit-width per node of the graph (num_nodes >= 1)")
        bits = bits.detach().to(torch.float32).cpu().clone()
        if bits.numel() and not bool(torch.isfinite(bits).all()):
            node = int((~torch.isfinite(bits)).nonzero()[0, 0])
            raise FxquantValueError(f"NodeBits: bit-widths must be finite numbers, got "
                                    f"{float(bits[node])} for node {node}")
        if bits.numel() and (bool(bits.min() < self.min_bits) or bool(bits.max() > self.max_bits)):
            raise FxquantValueError(f"NodeBits: bit-widths must lie in {self.min_bits}..{self.max_bits}, "
                             f"got {float(bits.min()):g}..{float(bits.max()):g}")
        if not self.learned and bool((bits != bits.round()).any()):
            raise FxquantValueError("NodeBits: fixed bit-widths must be whole numbers")
        object.__setattr__(self, "bits", bits)

    @classmethod
    def learned_init(cls, num_nodes: int, init: float = 4.0, min_bits: int = 2,
                     max_bits: int = 8) -> NodeBits:
        """Learned bit-widths for ``num_nodes`` nodes, all starting at ``init``."""
        _check_count(num_nodes, "NodeBits.learned_init: num_nodes")
        if isinstance(init, bool) or not isinstance(init, (int, float)) \
                or not math.isfinite(init):
            raise FxquantValueError(f"NodeBits.learned_init: init must be a finite number of bits "
                                    f"(e.g. 4.0), got {init!r}")
        return cls(torch.full((num_nodes,), float(init)), True, min_bits, max_bits)

    @classmethod
    def by_degree(cls, edge_index: Tensor, num_nodes: int, quantiles: Sequence[float],
                  bits: Sequence[int], min_bits: int = 2, max_bits: int = 8) -> NodeBits:
        """Fixed bit-widths from in-degree buckets: nodes whose in-degree lies above the
        ``quantiles[i]`` quantile (of all nodes' in-degrees) get ``bits[i + 1]``, the rest
        ``bits[0]``; e.g. ``quantiles=[0.9], bits=[2, 4]``: the top 10% by in-degree get 4
        bits. No table needs storing: the bits follow from the graph."""
        _check_count(num_nodes, "NodeBits.by_degree: num_nodes")
        if not num_nodes:
            raise FxquantValueError("NodeBits.by_degree: num_nodes must be >= 1 (the graph's "
                                    "nodes, each of which gets a bit-width), got 0")
        if not (isinstance(edge_index, Tensor) and edge_index.dim() == 2
                and edge_index.shape[0] == 2):
            raise FxquantValueError("NodeBits.by_degree: edge_index must be a [2, num_edges] "
                                    f"tensor, got {getattr(edge_index, 'shape', edge_index)!r}")
        if len(bits) != len(quantiles) + 1 or list(quantiles) != sorted(quantiles) \
                or not all(isinstance(q, (int, float)) and 0 < q < 1 for q in quantiles) \
                or not all(isinstance(b, int) and not isinstance(b, bool) for b in bits):
            raise FxquantValueError("NodeBits.by_degree: give increasing quantiles in (0, 1) and one "
                             f"more bit-width (an int) than quantiles; got {quantiles!r}, {bits!r}")
        degree = in_degree(edge_index.cpu(), num_nodes)
        cuts = torch.quantile(degree, torch.tensor(list(quantiles), dtype=torch.float32))
        bucket = torch.bucketize(degree, cuts)  # above a quantile: strictly greater
        return cls(torch.tensor(list(bits), dtype=torch.float32)[bucket], False, min_bits,
                   max_bits, stored=False)

    @property
    def num_nodes(self) -> int:
        return int(self.bits.numel())

    def __repr__(self) -> str:
        mean = float(self.bits.mean()) if self.bits.numel() else 0.0
        return (f"NodeBits({self.num_nodes} nodes, {'learned' if self.learned else 'fixed'}, "
                f"{self.min_bits}..{self.max_bits} bits, mean {mean:.2f})")

    def to_dict(self) -> dict[str, Any]:
        """The shape of the table (the values live in the point's state_dict)."""
        return {"num_nodes": self.num_nodes, "learned": self.learned,
                "min_bits": self.min_bits, "max_bits": self.max_bits, "stored": self.stored}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeBits:
        """The table shape :meth:`to_dict` wrote (every width at ``min_bits``)."""
        _require(data, ("num_nodes", "learned", "min_bits", "max_bits"), "NodeBits")
        return cls(torch.full((int(data["num_nodes"]),), float(data["min_bits"])),
                   bool(data["learned"]), int(data["min_bits"]), int(data["max_bits"]),
                   bool(data.get("stored", True)))

@dataclass(frozen=True, init=False)
class QuantConfig:
    """How one quantization point rounds: number, rounding, scale and range, gradient rule.

    Args:
        format (int, str, tuple, Format, IntFormat or TopN): an ``int`` keeps the top bits of
            each value's pattern (:func:`fxquant.truncate`); a float format (``"e4m3"``,
            ``(3, 2)``, a :class:`~fxquant.formats.Format`) or an integer format (``"int8"``,
            ``"uint4"``, ``"int8:asym"``) rounds to its values (:func:`fxquant.quantize`).
        rounding (str, optional): ``"toward_zero"``, ``"nearest"`` or ``"stochastic"``.
            (default: :obj:`None`: toward_zero for kept bits, nearest for formats)
        scale (str, optional): for formats: :obj:`None` (a plain cast), ``"tensor"``,
            ``"row"``, a ``"-pow2"`` variant, or ``"block32"`` (OCP MX). (default:
            :obj:`None`)
        range (str, optional): where a scale's range comes from: ``"minmax"`` of the
            values (default), ``"percentile:Q"`` (the ``100-Q``..``Q`` percentiles,
            Degree-Quant's choice), or ``"lsq"`` (integers: a learned step size, LSQ).
        momentum (float, optional): with a per-tensor scale, keep a running range
            ``momentum * running + (1 - momentum) * batch`` (the weight of the *old*
            value, as in :class:`torch.nn.BatchNorm1d`'s complement: Degree-Quant's
            momentum 0.01 is 0.99 here) and use it in eval. (default: :obj:`None`)
        observe (str, optional): how a per-tensor range is kept: ``"batch"`` (each
            batch's own range, in training and eval), ``"ema"`` (the running range of
            ``momentum``), or ``"widen"`` (the widest range seen in training, as
            :class:`torch.ao.quantization.MinMaxObserver` keeps it, used in training and
            eval). (default: :obj:`None`: ``"ema"`` with a momentum, else ``"batch"``)
        grad (str, optional): ``"ste"`` (straight-through), ``"zero"``, or
            ``"clipped"`` (integer grids with a scale: straight-through, zero where a value
            rounds to the grid's first or last code or beyond). (default: ``"ste"``)
        grad_format (optional): also round the gradient flowing back, to kept bits or a
            format. (default: :obj:`None`)
        protect (tuple or Protection, optional): ``(p_min, p_max)`` or a
            :class:`Protection`: Degree-Quant's protective mask (Tailor et al., ICLR
            2021). In training, each node stays at full precision with probability
            ``p_min + (p_max - p_min) * F(in-degree)``, ``F`` the fraction of nodes with at
            most its in-degree; in eval everything is rounded. A tuple draws a mask per
            point, messages follow their target node and ranges cover every row; a
            :class:`Protection` chooses. (default: :obj:`None`)
        node_bits (NodeBits, optional): a bit-width per node, fixed or learned, for a
            symmetric integer format (see :class:`NodeBits`), rounded to nearest or
            stochastically. (default: :obj:`None`)

    Example:
        >>> QuantConfig(16)
        QuantConfig(format=TopN(bits=16), rounding=<Rounding.TOWARD_ZERO: 'toward_zero'>, \
scale=<Scale.NONE: 'none'>, range='minmax', momentum=None, grad=<Grad.STE: 'ste'>, \
grad_format=None, protect=None, node_bits=None, observe='batch')
        >>> QuantConfig("int4", scale="tensor", range="lsq").describe()
        'int4, nearest, scale tensor (lsq), ste'
        >>> QuantConfig(16, momentum=0.9)
        Traceback (most recent call last):
        ...
        fxquant.errors.FxquantValueError: momentum=0.9 keeps a running range for a scaled format, so it \
needs a format with scale='tensor' (or 'tensor-pow2'); got top16 with scale='none'.
    """

    format: Number
    rounding: Rounding
    scale: Scale
    range: str
    momentum: float | None
    grad: Grad
    grad_format: Number | None
    protect: Protection | None
    node_bits: NodeBits | None
    observe: str

    def __init__(
        self,
        format: Number | int | str | tuple[int, int] | None = None,
        rounding: Rounding | str | None = None,
        *,
        scale: Scale | str | None = None,
        range: str = "minmax",
        momentum: float | None = None,
        grad: Grad | str = "ste",
        grad_format: Number | int | str | tuple[int, int] | None = None,
        protect: Protection | tuple[float, float] | None = None,
        node_bits: NodeBits | None = None,
        observe: str | None = None,
        number: Number | int | str | tuple[int, int] | None = None,
        grad_number: Number | int | str | tuple[int, int] | None = None,
        row_bits: NodeBits | None = None,
    ) -> None:
        format = _renamed("QuantConfig", "format", format, "number", number)
        grad_format = _renamed("QuantConfig", "grad_format", grad_format, "grad_number", grad_number)
        node_bits = _renamed("QuantConfig", "node_bits", node_bits, "row_bits", row_bits)
        if format is None:
            raise FxquantTypeError("QuantConfig needs a format: kept bits (16), a float format "
                                   "('e4m3', (3, 2)) or an integer format ('int8')")
        parsed = as_number(format, "format")
        if node_bits is not None:
            if not isinstance(node_bits, NodeBits):
                raise FxquantTypeError(f"node_bits must be a fxquant.NodeBits, got "
                                       f"{type(node_bits).__name__}")
            if not isinstance(parsed, IntFormat) or parsed.asymmetric:
                raise FxquantValueError("node_bits= gives integer rows their own bit-widths: please use a "
                                 f"symmetric integer format such as 'int8' (got {describe(parsed)})")
            if parsed.signed and not parsed.midrise and node_bits.min_bits < 2:
                raise FxquantValueError("node_bits: a signed grid needs at least 2 bits (codes -1, 0, 1); "
                                 "use min_bits=2, an unsigned format ('uint4') or a mid-rise "
                                 "one ('int4:midrise': at 1 bit, the sign) for 1 bit")
            if rounding is not None and Rounding.parse(rounding) is Rounding.TOWARD_ZERO:
                raise FxquantValueError("node_bits rounds to nearest or stochastically; please "
                                        "pass rounding='nearest' or 'stochastic'")
            if node_bits.learned and range != "lsq":
                raise FxquantValueError("node_bits learned: the gradient reaches a row's bits through its "
                                 "clipping range, which needs range='lsq' (a learned step)")
        if protect is not None:
            protect = Protection.parse(protect)
        default = Rounding.TOWARD_ZERO if isinstance(parsed, TopN) else Rounding.NEAREST
        if isinstance(parsed, IntFormat) and parsed.midrise and rounding is not None \
                and Rounding.parse(rounding) is Rounding.TOWARD_ZERO:
            raise FxquantValueError(f"rounding='toward_zero': a mid-rise grid ({parsed.spec()}) has no "
                             "zero to round toward; please use 'nearest' or 'stochastic'")
        mode = Scale.parse(scale)
        source = _parse_range(range)
        if mode is not Scale.NONE and isinstance(parsed, TopN):
            raise FxquantValueError(
                f"scale={mode.value!r} applies to formats (e.g. 'e4m3', 'int8'), not to top-N "
                f"truncation ({describe(parsed)}); please drop scale= or round to a format."
            )
        if source != "minmax" and not (mode.per_tensor or mode.per_row):
            raise FxquantValueError(f"range={source!r} sets a per-tensor or per-row scale; please pass "
                             f"scale='tensor' or 'row' (got scale={mode.value!r})")
        if source == "lsq" and not isinstance(parsed, IntFormat):
            raise FxquantValueError(f"range='lsq' learns the step of an integer grid; please use an "
                             f"integer format such as 'int4' (got {describe(parsed)})")
        if source == "lsq" and mode.per_row:
            raise FxquantValueError("range='lsq' learns one step per tensor; please use scale='tensor' "
                             "(a step per row would be a parameter per node)")
        if source.startswith("percentile") and mode.per_row:
            raise FxquantValueError("range='percentile:Q' is taken per tensor; please use "
                             "scale='tensor'")
        if momentum is not None:
            m = momentum
            if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 <= m < 1:
                raise FxquantValueError(f"momentum must be a number in [0, 1), got {m!r}")
            if not mode.per_tensor or source == "lsq":
                raise FxquantValueError(
                    f"momentum={m} keeps a running range for a scaled format, so it needs a "
                    "format with scale='tensor' (or 'tensor-pow2'); got "
                    f"{describe(parsed)} with scale={mode.value!r}"
                    + (" and range='lsq' (a learned step has no running range)."
                       if source == "lsq" else ".")
                )
            momentum = float(m)
        grad_rule = Grad.parse(grad)
        if grad_rule is Grad.CLIPPED and (not isinstance(parsed, IntFormat) or source == "lsq"
                                          or mode not in (Scale.TENSOR, Scale.ROW)
                                          or node_bits is not None):
            raise FxquantValueError(
                "grad='clipped' zeroes the gradient where a value leaves an integer grid's "
                "range, so it needs an integer format with scale='tensor' or 'row' and a "
                f"minmax or percentile range (got {describe(parsed)}, scale={mode.value!r}, "
                f"range={source!r}{', node_bits' if node_bits is not None else ''}; with "
                "range='lsq' the gradient is already zero outside the range)")
        observe = _parse_observe(observe, momentum, mode, source)
        if protect is not None and protect.ranges == "unprotected" and (
                not mode.per_tensor or source == "lsq"):
            raise FxquantValueError(
                "Protection(ranges='unprotected') takes a per-tensor range over the "
                "unprotected rows; please use scale='tensor' with a minmax or percentile "
                f"range (got scale={mode.value!r}, range={source!r})")
        set_ = object.__setattr__
        set_(self, "format", parsed)
        set_(self, "rounding", default if rounding is None else Rounding.parse(rounding))
        set_(self, "scale", mode)
        set_(self, "range", source)
        set_(self, "momentum", momentum)
        set_(self, "grad", grad_rule)
        set_(self, "grad_format",
             None if grad_format is None else as_number(grad_format, "grad_format"))
        set_(self, "protect", protect)
        set_(self, "node_bits", node_bits)
        set_(self, "observe", observe)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # configs pickled before the format / grad_format / node_bits names
        for old, new in _OLD_FIELDS.items():
            if old in state:
                state[new] = state.pop(old)
        state.setdefault("observe", "ema" if state.get("momentum") is not None else "batch")
        if isinstance(state.get("protect"), tuple):
            state["protect"] = Protection(*state["protect"])
        self.__dict__.update(state)

    @property
    def number(self) -> Number:
        """Deprecated name of :attr:`format`."""
        warn_renamed("QuantConfig.number", "QuantConfig.format")
        return self.format

    @property
    def grad_number(self) -> Number | None:
        """Deprecated name of :attr:`grad_format`."""
        warn_renamed("QuantConfig.grad_number", "QuantConfig.grad_format")
        return self.grad_format

    @property
    def row_bits(self) -> NodeBits | None:
        """Deprecated name of :attr:`node_bits`."""
        warn_renamed("QuantConfig.row_bits", "QuantConfig.node_bits")
        return self.node_bits

    @property
    def percentile(self) -> float | None:
        """``Q`` of a ``"percentile:Q"`` range, else None."""
        return float(self.range.split(":")[1]) if self.range.startswith("percentile") else None

    @property
    def op(self) -> str:
        """The registered op that implements it: ``"truncate"`` where kept bits say it all."""
        pure = isinstance(self.format, TopN) and not isinstance(self.grad_format, Format)
        return "truncate" if pure else "quantize"

    def describe(self) -> str:
        """One line: ``"e4m3, nearest, scale tensor (running, momentum 0.9), ste"``."""
        parts = [self.format.spec(), self.rounding.value]
        if self.scale is not Scale.NONE:
            parts.append(f"scale {self.scale_description()}")
        parts.append(self.grad.value)
        if self.grad_format is not None:
            parts.append(f"grad {self.grad_format.spec()}")
        if self.protect is not None:
            parts.append(self.protect.describe())
        if self.node_bits is not None:
            rb = self.node_bits
            parts.append(f"bits per node ({'learned' if rb.learned else 'fixed'}, "
                         f"{rb.min_bits}..{rb.max_bits})")
        return ", ".join(parts)

    def scale_description(self) -> str:
        """``"tensor (percentile:99.9, running, momentum 0.9)"``, or ``"-"`` unscaled."""
        if self.scale is Scale.NONE:
            return "-"
        notes = [self.range] if self.range != "minmax" else []
        if self.momentum is not None:
            notes.append(f"running, momentum {self.momentum}")
        if self.observe == "widen":
            notes.append("widening")
        return self.scale.value + (f" ({', '.join(notes)})" if notes else "")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values; :meth:`from_dict` reads them back."""
        return {
            "format": self.format.spec(),
            "rounding": self.rounding.value,
            "scale": self.scale.value,
            "range": self.range,
            "momentum": self.momentum,
            "grad": self.grad.value,
            "grad_format": None if self.grad_format is None else self.grad_format.spec(),
            "protect": None if self.protect is None else self.protect.to_dict(),
            "node_bits": None if self.node_bits is None else self.node_bits.to_dict(),
            **({"observe": self.observe} if self.observe == "widen" else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuantConfig:
        """The config :meth:`to_dict` wrote."""
        _require(data, (), "QuantConfig")
        data = dict(data)
        if data.get("protect") is not None:
            data["protect"] = Protection.from_dict(data["protect"])
        for old, new in _OLD_FIELDS.items():  # files written before the renames
            if old in data:
                data[new] = data.pop(old)
        _require(data, ("format",), "QuantConfig")
        if data.get("node_bits") is not None:
            data["node_bits"] = NodeBits.from_dict(data["node_bits"])
        return cls(data.pop("format"), data.pop("rounding", None), **data)


@dataclass(frozen=True, eq=False)
class NodeOverride:
    """Nodes of the user's graph whose rows are rounded to another number.

    Args:
        nodes (Tensor or sequence of int): node ids (an integer index tensor, any integer
            dtype) or a bool mask over the nodes. Rows of a node-level tensor are nodes, so
            at the ``output`` site row ``i`` is node ``i``.
        format (int, str, Format, TopN): what those rows are rounded to instead.

    Example:
        >>> import fxquant
        >>> hubs = fxquant.NodeOverride(torch.tensor([0, 3]), "int8")  # (set_nodes makes one)
        >>> hubs.format, hubs.nodes.tolist()
        (IntFormat(bits=8, signed=True, asymmetric=False, midrise=False), [0, 3])
        >>> mapping = fxquant.QuantMapping().set_name(
        ...     "0", fxquant.QuantConfig("int4", scale="tensor")).set_nodes("0", [0, 3], "int8")
        >>> gm = fxquant.transform(torch.nn.Sequential(torch.nn.Linear(4, 4)), mapping)
        >>> gm.get_submodule("_0_quant").override_description()
        '2 nodes -> int8'
    """

    nodes: Tensor
    format: Number
    max_index: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        nodes = self.nodes
        if isinstance(nodes, Sequence) and not isinstance(nodes, str):
            nodes = torch.as_tensor(list(nodes), dtype=torch.long)
        if not isinstance(nodes, Tensor):
            raise FxquantTypeError(f"node ids must be an index tensor or a bool mask, got "
                            f"{type(nodes).__name__}")
        if nodes.is_sparse or nodes.is_nested or nodes.layout != torch.strided:
            raise FxquantTypeError(f"node ids must be a dense (strided) tensor, got layout {nodes.layout}")
        if nodes.dim() != 1:
            raise FxquantValueError(f"node ids must be 1-D (indices, or a mask over the nodes), got "
                             f"shape {tuple(nodes.shape)}")
        if nodes.dtype != torch.bool and (nodes.is_floating_point() or nodes.is_complex()):
            raise FxquantTypeError(f"node ids must be integer indices or a bool mask, got {nodes.dtype}")
        if nodes.device.type == "meta":
            raise FxquantValueError("node ids on the meta device have no values to check; please pass "
                             "them on the CPU (they follow the model to its device)")
        max_index = None
        if nodes.dtype != torch.bool:
            nodes = nodes.to(torch.long)
            if nodes.numel():
                lo, hi = int(nodes.min()), int(nodes.max())
                if lo < 0:
                    raise FxquantValueError(f"node ids must be >= 0, got {lo}; please pass indices in "
                                     "[0, num_nodes).")
                max_index = hi
        object.__setattr__(self, "nodes", nodes.detach().clone())
        object.__setattr__(self, "max_index", max_index)
        object.__setattr__(self, "format", as_number(self.format, "node override format"))

    @classmethod
    def parse(cls, value: object, layer: str) -> NodeOverride:
        """From the ``(nodes, format)`` pair a user writes in ``node_formats``."""
        if isinstance(value, NodeOverride):
            return value
        if not (isinstance(value, tuple) and len(value) == 2):
            raise FxquantTypeError(
                f"node_formats[{layer!r}] must be a pair (nodes, bits), e.g. (index_tensor, 2) or "
                f"(index_tensor, 'e2m1'), got {value!r}"
            )
        try:
            return cls(*value)
        except (TypeError, ValueError) as e:
            raise same_kind(e, f"node_formats[{layer!r}]: {e}") from e

    def describe(self) -> str:
        return describe_nodes(self.nodes, self.format)


def describe_nodes(nodes: Tensor, number: Number) -> str:
    """``"20 nodes -> 9 bits"`` / ``"3/6 nodes (mask) -> e2m1"``."""
    if nodes.dtype == torch.bool and nodes.device.type == "meta":
        count = f"a mask over {nodes.numel()} nodes"
    elif nodes.dtype == torch.bool:
        count = f"{int(nodes.sum())}/{nodes.numel()} nodes (mask)"
    else:
        count = f"{nodes.numel()} nodes"
    target = f"{number.bits} bits" if isinstance(number, TopN) else number.spec()
    return f"{count} -> {target}"


_GLOBAL, _TYPE, _PATTERN, _NAME = range(4)
_KIND = {_GLOBAL: "global", _TYPE: "type", _PATTERN: "pattern", _NAME: "name"}


@dataclass(frozen=True)
class _Entry:
    level: int
    selector: Any  # None (global), a module class, a pattern or predicate, or a name
    site: Site
    config: QuantConfig | None
    source: str = "the mapping"  # how errors name where the entry came from

    def describe(self) -> str:
        what = {_GLOBAL: "global", _TYPE: f"type {getattr(self.selector, '__name__', '?')}",
                _PATTERN: f"pattern {self.selector!r}" if isinstance(self.selector, str)
                else f"predicate {getattr(self.selector, '__name__', 'lambda')}",
                _NAME: f"name {self.selector!r}"}[self.level]
        return f"{what} {self.site.value}: " + (
            self.config.describe() if self.config is not None else "not quantized")


@dataclass(frozen=True)
class Resolved:
    """What one quantization point of a traced graph gets."""

    node: Node
    site: Site
    config: QuantConfig
    override: NodeOverride | None


class QuantMapping:
    """Which layers and sites get which :class:`QuantConfig`.

    Precedence, from weakest to strongest (as torch.ao's ``QConfigMapping``): the global
    entry < a module type < a name pattern or predicate < an exact name. Within one level
    a later call wins. A config of :obj:`None` excludes what it matches. The global entry
    covers every PyG ``MessagePassing`` layer (the layers fxquant quantizes when nothing
    else is named); other layers are picked by type, pattern or name. Each ``set_*`` takes
    a ``site`` (default ``"output"``) and returns the mapping, so calls chain.

    Example:
        >>> import fxquant
        >>> from torch_geometric.nn.models import GCN
        >>> int8 = fxquant.QuantConfig("int8", scale="tensor")
        >>> mapping = (fxquant.QuantMapping()
        ...            .set_global(int8)                                    # every conv's output
        ...            .set_global(fxquant.QuantConfig("e4m3", scale="tensor"), site="message")
        ...            .set_name("convs.1", None))                          # but not the last conv
        >>> gm = fxquant.transform(GCN(4, 8, num_layers=2, out_channels=2), mapping)
        >>> [name for name, _ in fxquant.quantization_points(gm)]
        ['convs_0_message_quant', 'convs_0_quant', 'convs_1_message_quant']
    """

    def __init__(self) -> None:
        self._entries: list[_Entry] = []
        self._overrides: list[tuple[str, Site, NodeOverride]] = []

    # -- building ------------------------------------------------------------------------

    def _add(self, level: int, selector: Any, config: QuantConfig | None, site: object,
             source: str) -> QuantMapping:
        if config is not None and not isinstance(config, QuantConfig):
            raise FxquantTypeError(f"config must be a QuantConfig or None, got {config!r}; e.g. "
                            "QuantConfig(16) or QuantConfig('e4m3', scale='tensor')")
        self._entries.append(_Entry(level, selector, Site.parse(site), config, source))
        return self

    def set_global(self, config: QuantConfig | None, *, site: str = "output",
                   source: str = "the mapping") -> QuantMapping:
        """Every ``MessagePassing`` layer, unless a stronger entry says otherwise.

        Every ``set_*`` takes ``source``: how error messages name where the entry came from
        (``transform``'s keyword arguments pass their own names).
        """
        return self._add(_GLOBAL, None, config, site, source)

    def set_type(self, cls: type[nn.Module], config: QuantConfig | None, *,
                 site: str = "output", source: str = "the mapping") -> QuantMapping:
        """Every submodule that is an instance of ``cls``."""
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise FxquantTypeError(f"set_type expects a torch.nn.Module subclass, got {cls!r}")
        return self._add(_TYPE, cls, config, site, source)

    def set_pattern(self, pattern: str | Callable[[Node], bool], config: QuantConfig | None, *,
                    site: str = "output", source: str = "the mapping") -> QuantMapping:
        """Layers whose name matches an fnmatch ``pattern`` (``"conv*"``), or a predicate on
        the ``torch.fx.Node``."""
        if not (isinstance(pattern, str) or (callable(pattern) and not isinstance(pattern, type))):
            raise FxquantTypeError(f"set_pattern expects an fnmatch pattern or a predicate on "
                            f"torch.fx.Node, got {pattern!r}")
        return self._add(_PATTERN, pattern, config, site, source)

    def set_name(self, name: str, config: QuantConfig | None, *,
                 site: str = "output", source: str = "the mapping") -> QuantMapping:
        """One layer, by submodule name (``"conv1"``, ``"convs.0"``) or node name
        (``"sigmoid"``)."""
        if not isinstance(name, str):
            raise FxquantTypeError(f"set_name expects a layer name, got {name!r}")
        return self._add(_NAME, name, config, site, source)

    def set_nodes(self, layer: str, nodes: Tensor | Sequence[int], format: Any, *,
                  site: str = "output") -> QuantMapping:
        """Rows of ``layer``'s ``site`` that belong to ``nodes`` are rounded to ``format``
        (kept bits or a format) instead; the layer must get a config of its own."""
        override = NodeOverride.parse((nodes, format), layer)
        self._overrides.append((layer, Site.parse(site), override))
        return self

    # -- reading -------------------------------------------------------------------------

    def __repr__(self) -> str:
        lines = [e.describe() for e in self._entries]
        lines += [f"nodes of {layer!r} {site.value}: {o.describe()}"
                  for layer, site, o in self._overrides]
        return "QuantMapping(\n" + "".join(f"  {line}\n" for line in lines) + ")"

    def __bool__(self) -> bool:
        return bool(self._entries)

    def _matches(self, entry: _Entry, gm: GraphModule, node: Node) -> bool:
        if entry.level == _GLOBAL:
            return node.op == "call_module" and isinstance(
                gm.get_submodule(str(node.target)), MessagePassing)
        if entry.level == _NAME:
            return entry.selector in layer_names(node)
        return matches(gm, node, entry.selector)

    def resolve(self, gm: GraphModule, nodes: Iterable[Node]) -> list[Resolved]:
        """The quantization points of ``gm`` among ``nodes``, in graph order; validates every
        entry first (unknown names, types that match nothing) and touches nothing."""
        nodes = list(nodes)
        for entry in self._entries:
            if entry.level == _GLOBAL:
                continue
            if not any(self._matches(entry, gm, n) for n in nodes):
                raise _no_match(gm, entry, nodes, entry.source)
        chosen: dict[tuple[Node, Site], tuple[tuple[int, int], QuantConfig | None]] = {}
        for order, entry in enumerate(self._entries):
            for n in nodes:
                if self._matches(entry, gm, n):
                    key, rank = (n, entry.site), (entry.level, order)
                    if key not in chosen or chosen[key][0] <= rank:
                        chosen[key] = (rank, entry.config)
        overrides: dict[tuple[Node, Site], NodeOverride] = {}
        for layer, site, override in self._overrides:
            matched = [n for n in nodes if matches(gm, n, layer)]
            if not matched:
                raise _no_match(gm, _Entry(_NAME, layer, site, None), nodes, "node_formats")
            for n in matched:
                if chosen.get((n, site), (None, None))[1] is None:
                    here = sorted(k[1].value for k, v in chosen.items()
                                  if k[0] is n and v[1] is not None)
                    if here:  # the layer rounds, at other sites than the override's
                        raise FxquantValueError(
                            f"node_formats[{layer!r}] sets nodes of the {site.value} site of "
                            f"{layer_name(n)!r}, which rounds only its {', '.join(here)} "
                            f"site(s); please pass site={here[0]!r} to set_nodes (or give "
                            f"the {site.value} site a config first)")
                    quantized = sorted({layer_name(k[0]) for k, v in chosen.items()
                                        if v[1] is not None})
                    raise FxquantValueError(
                        f"node_formats[{layer!r}] names {layer_name(n)!r}, which gets no "
                        f"quantization; quantized layers: {quantized}. Please give it a config "
                        "(bits=/layers=, or the mapping) first."
                    )
                overrides[(n, site)] = override
        order_of = {n: i for i, n in enumerate(nodes)}
        points = [Resolved(n, site, config, overrides.get((n, site)))
                  for (n, site), (_, config) in chosen.items() if config is not None]
        return sorted(points, key=lambda p: (order_of[p.node], list(Site).index(p.site)))

    # -- JSON ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-able; module types by qualified class name, predicates refused."""
        entries = []
        for e in self._entries:
            if e.level == _TYPE:
                selector: Any = f"{e.selector.__module__}.{e.selector.__qualname__}"
            elif e.level == _PATTERN and not isinstance(e.selector, str):
                raise FxquantValueError("a QuantMapping with a predicate (set_pattern(callable)) cannot "
                                 "be written as JSON; please use a name or fnmatch pattern")
            else:
                selector = e.selector
            entries.append({"kind": _KIND[e.level], "selector": selector, "site": e.site.value,
                            "config": None if e.config is None else e.config.to_dict()})
        overrides = [{"layer": layer, "site": site.value, "format": o.format.spec(),
                      "nodes": o.nodes.tolist(), "mask": o.nodes.dtype == torch.bool}
                     for layer, site, o in self._overrides]
        return {"entries": entries, "node_overrides": overrides}

    @classmethod
    def from_dict(cls, data: dict[str, Any],
                  types: Iterable[type[nn.Module]] = ()) -> QuantMapping:
        """Read :meth:`to_dict`'s output; module types are looked up among ``types`` and
        the classes of PyG's and torch's ``nn`` (nothing is imported by name)."""
        known = _known_types(types)
        mapping = cls()
        levels = {v: k for k, v in _KIND.items()}
        for e in data.get("entries", []):
            config = None if e["config"] is None else QuantConfig.from_dict(e["config"])
            selector = e["selector"]
            if e["kind"] == "type":
                if selector not in known:
                    raise FxquantValueError(f"module type {selector!r} is not among the classes given "
                                     "in types= (nor a PyG or torch.nn class)")
                selector = known[selector]
            mapping._add(levels[e["kind"]], selector, config, e["site"], "the mapping")
        for o in data.get("node_overrides", []):
            nodes = torch.tensor(o["nodes"], dtype=torch.bool if o["mask"] else torch.long)
            mapping.set_nodes(o["layer"], nodes, o.get("format", o.get("number")), site=o["site"])
        return mapping

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


def _known_types(extra: Iterable[type[nn.Module]]) -> dict[str, type[nn.Module]]:
    found: dict[str, type[nn.Module]] = {}
    for namespace in (torch.nn, pyg_nn):
        for value in vars(namespace).values():
            if isinstance(value, type) and issubclass(value, nn.Module):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    for value in extra:
        found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def _no_match(gm: GraphModule, entry: _Entry, nodes: list[Node], arg: str) -> Exception:
    if entry.level == _TYPE:
        classes = sorted({type(gm.get_submodule(str(n.target))).__name__
                          for n in nodes if n.op == "call_module"})
        return FxquantValueError(f"no layer of class {entry.selector.__name__} in {arg}; module classes "
                          f"called in this model: {classes}")
    if entry.level == _PATTERN and not isinstance(entry.selector, str):
        return FxquantValueError(f"the predicate {getattr(entry.selector, '__name__', entry.selector)} "
                          f"in {arg} selects no layer")
    return unknown_layer(str(entry.selector), arg, [layer_name(n) for n in nodes])


def __getattr__(name: str) -> Any:
    if name == "RowBits":  # the name NodeBits had before; files pickled then still load
        warn_renamed("fxquant.RowBits", "fxquant.NodeBits")
        return NodeBits
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
