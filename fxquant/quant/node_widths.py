"""The per-node bit-width table of a quantization point (``QuantConfig(node_bits=...)``):
the part that knows each node's width and, for learned widths, the largest range each node
has shown in training.

Widths are stored per **global node id** (``node_ids=`` of the transformed model in
mini-batches; row ``i`` is node ``i`` otherwise). Learned widths are continuous
parameters, rounded in the forward with a straight-through gradient and kept in
``[min_bits, max_bits]`` by a clamp whose gradient lets them come back
(:func:`~fxquant.quant.grads.clamp_inward`). Nodes outside the table, and in evaluation
learned nodes never seen in training, take the width of the seen node whose range
(``max |value|`` of its rows) is nearest: A2Q's nearest-neighbour rule for unseen nodes.

State: ``bits`` (a parameter when learned, a buffer when fixed) and, when learned,
``seen_range`` (``-inf``: never seen). :func:`fxquant.share_bits` makes two points read one
``bits`` tensor; each keeps its own ``seen_range``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from fxquant.formats import IntFormat
from fxquant.quant._last import LastInput
from fxquant.quant.config import QuantConfig
from fxquant.quant.distributed import all_reduce_, distributed
from fxquant.quant.grads import clamp_inward
from fxquant.quant.node_bits import NodeBits
from fxquant.quant.nodes import lookup

__all__ = ["NodeWidths", "code_range", "grid_top", "input_row_magnitudes", "row_magnitudes"]


def code_range(bits: Any, format: IntFormat) -> tuple[Any, Any]:
    """``(qmin, qmax)`` of a ``bits``-bit grid of ``format``'s kind (a float, or a tensor
    of per-row bits): symmetric ``{-1, 0, 1}`` at 2 bits, mid-rise codes ``-2..1`` (levels
    ``-1.5..1.5``), unsigned ``0..3``.

    Example:
        >>> from fxquant.formats import parse
        >>> code_range(2, parse("int8")), code_range(2, parse("int8:midrise"))
        ((-1, 1), (-2, 1))
        >>> code_range(torch.tensor([2.0, 4.0]), parse("uint8"))
        (tensor([0., 0.]), tensor([ 3., 15.]))
    """
    qmax = 2 ** (bits - 1) - 1 if format.signed else 2 ** bits - 1
    qmin = (-qmax - 1 if format.midrise else -qmax) if format.signed else qmax * 0
    return qmin, qmax


def grid_top(format: IntFormat, max_bits: int | None = None) -> float:
    """The largest level of ``format``'s grid, or of its ``max_bits``-bit grid (per-node
    widths; in units of the step)."""
    if max_bits is None:
        return float(format.max_finite)
    return float(code_range(float(max_bits), format)[1]) + format.offset


#: :func:`row_magnitudes` of the last input that needs no gradient (a dataset's features
#: are the same tensor every step); the key is ``finite_only``
_ROWS: LastInput[Tensor] = LastInput()


def input_row_magnitudes(x: Tensor, finite_only: bool, keep: bool = True) -> Tensor:
    """:func:`row_magnitudes` of ``x``, kept for the next calls while ``x`` is unchanged
    (eager, no gradient, ``keep``: an input site's, a dataset's features every step); the
    result is shared between calls and never written to."""
    if torch.compiler.is_compiling() or x.requires_grad or not keep:
        return row_magnitudes(x.detach(), finite_only)
    return _ROWS.get(x, finite_only, lambda: row_magnitudes(x, finite_only))


def row_magnitudes(x: Tensor, finite_only: bool) -> Tensor:
    """``max |value|`` of each row of ``x`` (each value of a 1-d ``x``); with
    ``finite_only``, of its finite values (``-inf`` for a row with none).

    Example:
        >>> row_magnitudes(torch.tensor([[1.0, -3.0], [float("inf"), 2.0]]), finite_only=True)
        tensor([3., 2.])
    """
    if x.dim() > 1 and x.numel() and x.shape[1:].numel():
        flat = x.flatten(1)  # |x| first for short rows, no |x| temporary for long ones
        rows = flat.abs().amax(1) if flat.shape[1] <= 32 else \
            torch.maximum(flat.amax(1), flat.amin(1).neg_())  # (each ~2x the other there)
        if not finite_only or (not torch.compiler.is_compiling()
                               and bool(torch.isfinite(rows).all())):
            return rows
    magnitude = x.abs()  # (with a NaN or an infinity: the finite values only)
    if finite_only:
        magnitude = magnitude.nan_to_num_(nan=-math.inf, posinf=-math.inf)
    return magnitude.flatten(1).amax(1) if x.dim() > 1 else magnitude


class NodeWidths(nn.Module):
    """Each node's bit-width, fixed or learned (see the module docs).

    Args:
        node_bits (NodeBits): the table's initial widths, range and kind.

    Example:
        >>> widths = NodeWidths(NodeBits(torch.tensor([2, 4, 8])))
        >>> widths.for_rows(torch.ones(3, 5), 3, None, None)
        tensor([2., 4., 8.])
        >>> widths.learned, widths.table().tolist()
        (False, [2.0, 4.0, 8.0])
    """

    bits: Tensor
    seen_range: Tensor | None

    def __init__(self, node_bits: NodeBits) -> None:
        super().__init__()
        self.node_bits = node_bits
        if node_bits.learned:
            self.bits = nn.Parameter(node_bits.bits.clone())
            # max |value| of each node's rows in training (-inf: never seen)
            self.register_buffer("seen_range", torch.full((node_bits.num_nodes,), -math.inf))
        else:
            self.register_buffer("bits", node_bits.bits.clone())
            self.register_buffer("seen_range", None)

    @classmethod
    def from_config(cls, config: QuantConfig) -> NodeWidths | None:
        """The part a point with ``config`` needs: one with ``node_bits``, else None."""
        return cls(config.node_bits) if config.node_bits is not None else None

    @property
    def learned(self) -> bool:
        return self.node_bits.learned

    def table(self) -> Tensor:
        """The widths as a point rounds with them in evaluation, one per global node id:
        rounded, within ``[min_bits, max_bits]`` (a detached copy)."""
        rb = self.node_bits
        return self.bits.detach().clamp(rb.min_bits, rb.max_bits).round()

    def mean_bits(self) -> Tensor | float:
        """The table's mean width within the allowed range: where a learned step starts (a
        tensor while compiling, which a float would guard on)."""
        rb = self.node_bits
        mean = self.bits.detach().mean().clamp(rb.min_bits, rb.max_bits)
        return mean if torch.compiler.is_compiling() else float(mean)

    def for_rows(self, x: Tensor, num_nodes: int, row_nodes: Tensor | None,
                 ids: Tensor | None, keep_input: bool = False,
                 training: bool | None = None) -> Tensor:
        """Each row's bit-width (a float tensor, straight-through rounded when learned):
        the width of its node (``row_nodes``: each row's node, a message's target; else
        row ``i`` is node ``i``), looked up by global id (``ids``). In training, learned
        widths record each node's range first (the largest over all ranks under DDP).
        ``keep_input``: ``x`` is a dataset's input, whose row ranges are cached;
        ``training``: as in training or evaluation (default: the module's mode)."""
        rb = self.node_bits
        training = self.training if training is None else training
        fits = self.seen_range is not None and training
        rows_range = input_row_magnitudes(x, finite_only=fits, keep=keep_input)
        if row_nodes is not None:  # per node: the max over its rows (its messages)
            empty = -math.inf if fits else 0.0  # a node without (finite) messages: unseen
            node_range = torch.full((num_nodes,), empty, dtype=rows_range.dtype,
                                    device=x.device)
            node_range = node_range.scatter_reduce(0, row_nodes, rows_range, "amax")
        else:
            node_range = rows_range
        table = self.bits
        # every node of the table in order (a full batch, eager): no lookups by id
        full = ids is None and num_nodes == table.shape[0] and not torch.compiler.is_compiling()
        nodes = ids if ids is not None else torch.arange(num_nodes, device=x.device)
        known = None if full else (nodes >= 0) & (nodes < table.shape[0])
        if self.seen_range is not None:
            if training:
                with torch.no_grad():  # the largest range each node has shown (-inf: unseen)
                    seen = self.seen_range
                    if known is None:
                        torch.maximum(seen, node_range.to(seen.dtype), out=seen)
                    else:
                        seen.scatter_reduce_(0, torch.where(known, nodes, 0), torch.where(
                            known, node_range.to(seen.dtype), -math.inf), "amax")
                    if distributed():  # every rank knows every node
                        all_reduce_(seen, "max")
            elif known is None:
                known = torch.isfinite(self.seen_range)
            else:
                known = known & torch.isfinite(lookup(self.seen_range, nodes))
        bits = table if full else lookup(table, nodes)
        if known is not None and (torch.compiler.is_compiling() or not bool(known.all())):
            bits = torch.where(known, bits, self.nearest_seen(node_range, table))
        if self.learned:
            bits = clamp_inward(bits, rb.min_bits, rb.max_bits)
            bits = bits + (bits.round() - bits).detach()  # straight-through rounding
        else:
            bits = bits.clamp(rb.min_bits, rb.max_bits)
        return bits if row_nodes is None else bits[row_nodes]

    def nearest_seen(self, node_range: Tensor, table: Tensor) -> Tensor:
        """The bits of the seen node whose range is nearest each row's (A2Q's rule for
        unseen nodes); the table's mean where nothing was seen or recorded."""
        seen = self.seen_range
        if seen is None:
            if not table.numel():
                return torch.full_like(node_range, float(self.node_bits.max_bits))
            # a tensor, not float(): no host sync, and no graph break under torch.compile
            return table.detach().mean().to(node_range.dtype).expand_as(node_range)
        order = torch.sort(seen)  # unseen nodes (-inf) first, then the seen ones
        count = torch.isfinite(seen).sum()
        first = seen.shape[0] - count
        pos = torch.searchsorted(order.values, node_range.to(seen.dtype).contiguous())
        hi = torch.minimum(torch.maximum(pos, first), torch.full_like(pos, seen.shape[0] - 1))
        lo = torch.minimum(torch.maximum(hi - 1, first), hi)  # in range when nothing was seen
        closer_lo = (node_range - order.values[lo]).abs() < (order.values[hi] - node_range).abs()
        pick = torch.where(closer_lo, lo, hi)
        fallback = table.detach().mean()
        return torch.where(count > 0, table[order.indices[pick]], fallback)

    def extra_repr(self) -> str:
        return repr(self.node_bits)
