"""A bit-width per node, as a config: :class:`NodeBits` (the table a quantization point
keeps is :class:`~fxquant.quant.node_widths.NodeWidths`)."""

from __future__ import annotations

import inspect
import math
import numbers
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fxquant.errors import FxquantTypeError, FxquantValueError, user_stacklevel
from fxquant.fx.degree import SIDES, check_edge_index, node_degree
from fxquant.quant.validation import check_count, require_keys

__all__ = ["NodeBits", "bitwidth_bits"]


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
        check_count(num_nodes, "NodeBits.learned_init: num_nodes")
        if isinstance(init, bool) or not isinstance(init, (int, float)) \
                or not math.isfinite(init):
            raise FxquantValueError(f"NodeBits.learned_init: init must be a finite number of bits "
                                    f"(e.g. 4.0), got {init!r}")
        return cls(torch.full((num_nodes,), float(init)), True, min_bits, max_bits)

    @classmethod
    def by_degree(cls, edge_index: Tensor, *args: Any, **kwargs: Any) -> NodeBits:
        """``by_degree(edge_index, quantiles, bits, num_nodes=None, min_bits=2, max_bits=8,
        *, side="target")``: fixed bit-widths from in-degree buckets. Nodes whose in-degree
        lies above the ``quantiles[i]`` quantile (of all nodes' in-degrees) get
        ``bits[i + 1]``, the rest ``bits[0]``; e.g. ``quantiles=[0.9], bits=[2, 4]``: the
        top 10% by in-degree get 4 bits. No table needs storing: the bits follow from the
        graph. On a bipartite graph ``side="source"`` buckets the source nodes by their
        out-degree (the messages each sends) instead.

        ``num_nodes`` comes after the graph's own arguments, as in PyG's ``utils``
        (``degree(index, num_nodes=None)``, ``to_undirected(edge_index, edge_attr=None,
        num_nodes=None)``) and :func:`~fxquant.quant.nodes.top_degree_nodes`. The order of
        earlier releases, ``by_degree(edge_index, num_nodes, quantiles, bits)``, still
        works, with a :class:`FutureWarning`.

        Args:
            edge_index (Tensor): ``[2, num_edges]`` node ids of any integer dtype (checked
                by :func:`~fxquant.fx.degree.check_edge_index`).
            quantiles (sequence of float): increasing, in ``(0, 1)``.
            bits (sequence of int): one more bit-width than quantiles.
            num_nodes (int, optional): the number of (target) nodes, ``>= 1``. (default:
                ``edge_index.max() + 1``, for a graph over one node set; on a bipartite
                graph pass the count of the side ranked, which the ids cannot tell)
            min_bits, max_bits (int, optional): the allowed range. (default: 2 and 8)
            side (str, optional): ``"target"`` (in-degree) or ``"source"`` (out-degree;
                ``num_nodes`` then counts the sources). (default: ``"target"``)

        Example:
            >>> edge_index = torch.tensor([[1, 2, 3, 0], [0, 0, 0, 1]])  # node 0: a hub
            >>> NodeBits.by_degree(edge_index, [0.75], [2, 4], num_nodes=4).bits
            tensor([4., 2., 2., 2.])
        """
        quantiles, bits, num_nodes, min_bits, max_bits, side = _by_degree_arguments(
            args, kwargs)
        where = "NodeBits.by_degree"
        if side not in SIDES:
            raise FxquantValueError(f"{where}: side={side!r} is not one of {list(SIDES)}")
        if num_nodes is not None:
            check_count(num_nodes, f"{where}: num_nodes")
        num_nodes = check_edge_index(edge_index, num_nodes, where=where, side=side)
        if not num_nodes:
            raise FxquantValueError(f"{where}: num_nodes must be >= 1 (the graph's nodes, each "
                                    "of which gets a bit-width), got 0")
        qs = list(quantiles) if isinstance(quantiles, Iterable) else None
        bs = list(bits) if isinstance(bits, Iterable) else None
        if qs is None or bs is None or len(bs) != len(qs) + 1 or qs != sorted(qs) \
                or not all(isinstance(q, (int, float)) and 0 < q < 1 for q in qs) \
                or not all(isinstance(b, int) and not isinstance(b, bool) for b in bs):
            raise FxquantValueError(f"{where}: give increasing quantiles in (0, 1) and one "
                                    f"more bit-width (an int) than quantiles; got {quantiles!r}, "
                                    f"{bits!r}")
        degree = node_degree(edge_index.cpu(), num_nodes, side=side)
        cuts = torch.quantile(degree, torch.tensor(qs, dtype=torch.float32))
        bucket = torch.bucketize(degree, cuts)  # above a quantile: strictly greater
        return cls(torch.tensor(bs, dtype=torch.float32)[bucket], False, min_bits,
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
        require_keys(data, ("num_nodes", "learned", "min_bits", "max_bits"), "NodeBits")
        return cls(torch.full((int(data["num_nodes"]),), float(data["min_bits"])),
                   bool(data["learned"]), int(data["min_bits"]), int(data["max_bits"]),
                   bool(data.get("stored", True)))


def _new_order(quantiles: Sequence[float], bits: Sequence[int], num_nodes: int | None = None,
               min_bits: int = 2, max_bits: int = 8, *, side: str = "target") -> None:
    """The arguments of :meth:`NodeBits.by_degree` after ``edge_index``."""


def _old_order(num_nodes: int, quantiles: Sequence[float], bits: Sequence[int],
               min_bits: int = 2, max_bits: int = 8, *, side: str = "target") -> None:
    """The order of earlier releases: ``num_nodes`` first."""


_NEW, _OLD = inspect.signature(_new_order), inspect.signature(_old_order)


def _by_degree_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """``(quantiles, bits, num_nodes, min_bits, max_bits, side)`` of a :meth:`NodeBits.by_degree`
    call in either order: the second positional argument is ``num_nodes`` in the old order
    (a count), ``quantiles`` in the new (a sequence); the old order warns."""
    first = args[0] if args else None
    old = isinstance(first, (numbers.Number, str, bytes)) or (
        isinstance(first, Tensor) and first.dim() == 0)
    try:
        bound = (_OLD if old else _NEW).bind(*args, **kwargs)
    except TypeError as e:
        raise FxquantTypeError(f"NodeBits.by_degree(edge_index, quantiles, bits, num_nodes=None, "
                               f"min_bits=2, max_bits=8, *, side='target'): {e}") from None
    if old:
        warnings.warn(
            "NodeBits.by_degree(edge_index, num_nodes, quantiles, bits) is the order of earlier "
            "releases and will be removed in the next one; please write "
            "NodeBits.by_degree(edge_index, quantiles, bits, num_nodes=...): num_nodes after "
            "the graph's own arguments, as in PyG's utils and fxquant.top_degree_nodes",
            FutureWarning, stacklevel=user_stacklevel())
    bound.apply_defaults()
    a = bound.arguments
    return (a["quantiles"], a["bits"], a["num_nodes"], a["min_bits"], a["max_bits"],
            a["side"])


# help(), IDEs and the documentation show the order by_degree reads (it also reads the old)
_FIRST = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=kind)
          for name, kind in (("cls", inspect.Parameter.empty), ("edge_index", "Tensor"))]
NodeBits.by_degree.__func__.__signature__ = _NEW.replace(  # type: ignore[attr-defined]
    parameters=[*_FIRST, *_NEW.parameters.values()], return_annotation="NodeBits")


def bitwidth_bits(node_bits: NodeBits) -> int:
    """Bits that store one per-node bit-width: a fixed-length code for the
    ``max_bits - min_bits + 1`` widths allowed (3 for 2..8 and for 1..8).

    Example:
        >>> bitwidth_bits(NodeBits(torch.tensor([2, 8])))
        3
    """
    return max(1, math.ceil(math.log2(node_bits.max_bits - node_bits.min_bits + 1)))
