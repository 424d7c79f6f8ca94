"""What to insert after one layer: a frozen, validated description.

The graph pass turns user arguments (``bits=16``, ``bits={"conv1": 8}``,
``node_bits={"conv1": (rows, 2)}``) into one :class:`TruncationSpec` per selected node and
validates all of them before it touches the graph, so a bad argument leaves the model as
it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from fxquant.numerics import GRADS, ROUNDINGS

__all__ = ["RowOverride", "TruncationSpec"]


def _check_bits(bits: object, max_bits: int, what: str) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise TypeError(f"{what} must be an int (the number of kept bits), got {bits!r}")
    if not 1 <= bits <= max_bits:
        raise ValueError(
            f"{what}={bits} is out of range: it counts the kept bits of the model's "
            f"{max_bits}-bit float pattern, so 1 <= {what} <= {max_bits}."
        )
    return bits


@dataclass(frozen=True, eq=False)
class RowOverride:
    """Rows (nodes of a GNN activation) that keep a different number of bits.

    Args:
        rows (Tensor): 1-D indices into dim 0 of the layer's output, or a 1-D bool mask
            over it.
        bits (int): the bits those rows keep.
    """

    rows: Tensor
    bits: int

    @classmethod
    def parse(cls, value: object, layer: str, max_bits: int) -> RowOverride:
        """Build from the ``(rows, bits)`` pair a user writes in ``node_bits``."""
        if isinstance(value, RowOverride):
            return value
        if not (isinstance(value, tuple) and len(value) == 2):
            raise TypeError(
                f"node_bits[{layer!r}] must be a pair (rows, bits), e.g. (index_tensor, 2), "
                f"got {value!r}"
            )
        rows, bits = value
        if isinstance(rows, Sequence) and not isinstance(rows, str):
            rows = torch.as_tensor(list(rows), dtype=torch.long)
        if not isinstance(rows, Tensor):
            raise TypeError(
                f"node_bits[{layer!r}]: rows must be an index tensor or a bool mask, "
                f"got {type(rows).__name__}"
            )
        return cls(rows, _check_bits(bits, max_bits, f"node_bits[{layer!r}] bits"))

    def __post_init__(self) -> None:
        rows = self.rows
        if rows.dim() != 1:
            raise ValueError(
                f"row override: rows must be 1-D (indices or a mask over dim 0), "
                f"got shape {tuple(rows.shape)}"
            )
        if rows.dtype != torch.bool and (rows.is_floating_point() or rows.is_complex()):
            raise TypeError(
                f"row override: rows must be integer indices or a bool mask, got {rows.dtype}"
            )
        is_index = rows.dtype != torch.bool and rows.device.type != "meta"
        if is_index and rows.numel() and int(rows.min()) < 0:
            raise ValueError(
                f"row override: row indices must be >= 0, got {int(rows.min())}; "
                "please pass indices in [0, num_nodes)."
            )

    def describe(self) -> str:
        if self.rows.dtype == torch.bool:
            count = f"{int(self.rows.sum())}/{self.rows.numel()} rows (mask)"
        else:
            count = f"{self.rows.numel()} rows"
        return f"{count} -> {self.bits} bits"


@dataclass(frozen=True)
class TruncationSpec:
    """One truncation node: how many bits, how to round, which gradient, row override.

    Args:
        bits (int): kept bits of the float pattern.
        rounding (str): ``"toward_zero"``, ``"nearest"`` or ``"stochastic"``.
        grad (str): ``"ste"`` or ``"zero"``.
        override (RowOverride, optional): rows that keep other bits.
        max_bits (int): the pattern width bits are checked against. (default: 32)

    Example:
        >>> TruncationSpec(16)
        TruncationSpec(bits=16, rounding='toward_zero', grad='ste', override=None)
        >>> TruncationSpec(40)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: bits=40 is out of range: ... so 1 <= bits <= 32.
    """

    bits: int
    rounding: str = "toward_zero"
    grad: str = "ste"
    override: RowOverride | None = None
    max_bits: int = field(default=32, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_bits(self.bits, self.max_bits, "bits")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"rounding={self.rounding!r} is not one of {list(ROUNDINGS)}")
        if self.grad not in GRADS:
            raise ValueError(f"grad={self.grad!r} is not one of {list(GRADS)}")
