"""Sub-byte storage of codes: eight 1-bit, four 2-bit or two 4-bit codes per byte, and
rows of different widths (per-node bit-widths) packed by width.

Codes are stored as their distance from the grid's lowest code (``code - qmin``, in
``0 .. 2**bits - 1``), in the smallest container of 1, 2, 4 or 8 bits that holds them (a
3-bit code takes a 4-bit slot). Rows with per-node widths are grouped by container
width, each group packed on its own, in row order; which row is in which group follows
from the widths, which the model holds once (or derives from the graph), so nothing per
row is stored with the values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fxquant.errors import FxquantValueError
from fxquant.execution.kernels import QTensor

__all__ = ["PackedCodes", "container_bits", "pack", "pack_bits", "unpack", "unpack_bits"]


def container_bits(bits: int) -> int:
    """The slot a ``bits``-bit code is stored in: 1, 2, 4 or 8 bits."""
    for slot in (1, 2, 4, 8):
        if bits <= slot:
            return slot
    raise FxquantValueError(f"codes of {bits} bits do not fit a byte; the packed storage holds "
                            "codes of at most 8 bits")


def pack_bits(u: Tensor, bits: int) -> Tensor:
    """``uint8`` bytes holding the values ``u`` (flattened; each in ``0 .. 2**bits - 1``),
    ``8 // bits`` per byte, the first in the lowest bits."""
    slot = container_bits(bits)
    flat = u.reshape(-1).to(torch.uint8)
    if slot == 8:
        return flat.clone()
    per = 8 // slot
    pad = (-flat.numel()) % per
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    groups = flat.view(-1, per)
    out = groups[:, 0].clone()
    for i in range(1, per):
        out |= groups[:, i] << (slot * i)
    return out


def unpack_bits(data: Tensor, bits: int, numel: int) -> Tensor:
    """The ``numel`` values :func:`pack_bits` stored in ``data`` (``uint8``)."""
    slot = container_bits(bits)
    if slot == 8:
        return data[:numel]
    shifts = torch.arange(0, 8, slot, dtype=torch.uint8, device=data.device)
    values = (data.view(-1, 1) >> shifts) & ((1 << slot) - 1)
    return values.view(-1)[:numel]


@dataclass
class PackedCodes:
    """A :class:`~fxquant.execution.kernels.QTensor`'s codes in packed storage.

    ``groups`` maps each container width to its bytes; rows are split among them by
    ``row_slots`` (one width per row, None when every row has the same width). Scales,
    shifts and code ranges stay with the ``like`` tensor they came from.
    """

    groups: dict[int, Tensor]
    shape: torch.Size
    row_slots: Tensor | None

    @property
    def nbytes(self) -> int:
        """Bytes of the packed codes."""
        return sum(int(t.numel()) for t in self.groups.values())


def pack(q: QTensor) -> PackedCodes:
    """``q``'s codes packed (:class:`PackedCodes`)."""
    u = q.grid_codes()
    if isinstance(q.qmin, Tensor) and q.qmin.dim():
        u = u - q.qmin.view((-1,) + (1,) * (u.dim() - 1)).to(u.dtype)
    else:
        u = u - int(q.qmin)
    if not isinstance(q.bits, Tensor) or not q.bits.dim():
        return PackedCodes({container_bits(int(q.bits)): pack_bits(u, int(q.bits))},
                           q.codes.shape, None)
    slots = _slots(q.bits)
    groups = {}
    for slot in torch.unique(slots).tolist():
        rows = (slots == slot).nonzero().view(-1)
        groups[int(slot)] = pack_bits(u.index_select(0, rows), int(slot))
    return PackedCodes(groups, q.codes.shape, slots)


def unpack(packed: PackedCodes, like: QTensor) -> Tensor:
    """The ``int8`` codes of ``like`` back from ``packed`` (``like`` gives the ranges and
    widths; its own codes are not read)."""
    shape = packed.shape
    per_row = shape[1:].numel() if len(shape) else 1
    if packed.row_slots is None:
        ((slot, data),) = packed.groups.items()
        u = unpack_bits(data, slot, shape.numel()).view(shape)
    else:
        u = torch.empty(shape, dtype=torch.uint8, device=packed.row_slots.device)
        for slot, data in packed.groups.items():
            rows = (packed.row_slots == slot).nonzero().view(-1)
            values = unpack_bits(data, slot, rows.numel() * per_row)
            u.index_copy_(0, rows, values.view((rows.numel(), *shape[1:])))
    codes = u.to(torch.int16)
    if isinstance(like.qmin, Tensor) and like.qmin.dim():
        codes = codes + like.qmin.view((-1,) + (1,) * (codes.dim() - 1)).to(torch.int16)
    else:
        codes = codes + int(like.qmin)
    return (codes - like.bias).to(torch.int8)


def _slots(bits: Tensor) -> Tensor:
    """Each row's container width for per-row ``bits``."""
    b = bits.to(torch.int64)
    return torch.where(b <= 1, 1, torch.where(b <= 2, 2, torch.where(b <= 4, 4, 8)))
