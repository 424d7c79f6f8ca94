"""What to insert after one layer: a frozen, validated description.

The graph pass turns user arguments (``bits=16``, ``format="e4m3"``, ``bits={"conv1": 8,
"conv2": "e3m2"}``, ``node_bits={"conv1": (rows, 2)}``) into one :class:`QuantSpec` per
selected node and validates all of them before it touches the graph, so a bad argument
leaves the model as it was. A *number* is an ``int`` (keep the top bits of the pattern,
:func:`fxquant.truncate`) or a :class:`~fxquant.formats.Format` (:func:`fxquant.quantize`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from fxquant.formats import Format, TopN, parse
from fxquant.numerics import GRADS, ROUNDINGS
from fxquant.quantize import SCALES

__all__ = ["Number", "QuantSpec", "RowOverride", "as_number", "describe"]

Number = int | Format


def _check_bits(bits: object, max_bits: int, what: str) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise TypeError(f"{what} must be an int (the number of kept bits), got {bits!r}")
    if not 1 <= bits <= max_bits:
        raise ValueError(
            f"{what}={bits} is out of range: it counts the kept bits of the model's "
            f"{max_bits}-bit float pattern, so 1 <= {what} <= {max_bits}."
        )
    return bits


def as_number(value: object, max_bits: int, what: str) -> Number:
    """An int of kept bits, or a Format from anything :func:`fxquant.formats.parse` reads."""
    if isinstance(value, (str, Format, tuple, TopN)):
        try:
            parsed = parse(value)
        except (ValueError, TypeError) as e:
            raise type(e)(f"{what}: {e}") from e
        if isinstance(parsed, TopN):
            return _check_bits(parsed.bits, max_bits, what)
        return parsed
    return _check_bits(value, max_bits, what)


def describe(number: Number) -> str:
    """``"top-16"`` for kept bits, the format's name otherwise."""
    return f"top-{number}" if isinstance(number, int) else number.spec()


@dataclass(frozen=True, eq=False)
class RowOverride:
    """Rows (nodes of a GNN activation) that keep a different number of bits or format.

    Args:
        rows (Tensor): 1-D indices into dim 0 of the layer's output, or a 1-D bool mask.
        number (int or Format): the bits those rows keep, or their format.
    """

    rows: Tensor
    number: Number

    @classmethod
    def parse(cls, value: object, layer: str, max_bits: int) -> RowOverride:
        """Build from the ``(rows, bits_or_format)`` pair a user writes in ``node_bits``."""
        if isinstance(value, RowOverride):
            return value
        if not (isinstance(value, tuple) and len(value) == 2):
            raise TypeError(
                f"node_bits[{layer!r}] must be a pair (rows, bits), e.g. (index_tensor, 2) or "
                f"(index_tensor, 'e2m1'), got {value!r}"
            )
        rows, number = value
        if isinstance(rows, Sequence) and not isinstance(rows, str):
            rows = torch.as_tensor(list(rows), dtype=torch.long)
        if not isinstance(rows, Tensor):
            raise TypeError(
                f"node_bits[{layer!r}]: rows must be an index tensor or a bool mask, "
                f"got {type(rows).__name__}"
            )
        return cls(rows, as_number(number, max_bits, f"node_bits[{layer!r}] bits"))

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
        target = f"{self.number} bits" if isinstance(self.number, int) else self.number.spec()
        return f"{count} -> {target}"


@dataclass(frozen=True)
class QuantSpec:
    """One inserted node: the number (kept bits or format), rounding, gradient, scaling.

    Args:
        number (int or Format): kept bits of the pattern, or a format.
        rounding (str, optional): ``"toward_zero"``, ``"nearest"`` or ``"stochastic"``;
            :obj:`None` is the op's default (toward_zero for bits, nearest for formats).
        grad (str): ``"ste"`` or ``"zero"``.
        scale (str): ``"none"``, ``"tensor"``, ``"row"``, or a ``"-pow2"`` variant (formats).
        momentum (float, optional): keep a running per-tensor amax for eval (scale="tensor").
        grad_number (int or Format, optional): quantize the gradient flowing back too.
        override (RowOverride, optional): rows that keep another number.
        max_bits (int): the pattern width bits are checked against. (default: 32)

    Example:
        >>> spec = QuantSpec(16)
        >>> spec.rounding, spec.op
        ('toward_zero', 'truncate')
        >>> QuantSpec(40)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: bits=40 is out of range: ... so 1 <= bits <= 32.
    """

    number: Number
    rounding: str | None = None
    grad: str = "ste"
    scale: str = "none"
    momentum: float | None = None
    grad_number: Number | None = None
    override: RowOverride | None = None
    max_bits: int = field(default=32, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.number, Format):
            _check_bits(self.number, self.max_bits, "bits")
        if self.rounding is None:
            default = "toward_zero" if isinstance(self.number, int) else "nearest"
            object.__setattr__(self, "rounding", default)
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"rounding={self.rounding!r} is not one of {list(ROUNDINGS)}")
        if self.grad not in GRADS:
            raise ValueError(f"grad={self.grad!r} is not one of {list(GRADS)}")
        if self.scale not in SCALES:
            raise ValueError(f"scale={self.scale!r} is not one of {[None, *SCALES[1:]]}")
        if self.scale != "none" and not isinstance(self.number, Format):
            raise ValueError(
                f"scale={self.scale!r} applies to formats (format='e4m3', ...), not to top-N "
                "truncation of the pattern; please drop scale= or use format=."
            )
        if self.momentum is not None:
            if not self.scale.startswith("tensor"):
                raise ValueError(
                    f"momentum= keeps a running per-tensor amax, so it needs scale='tensor' "
                    f"(or 'tensor-pow2'), not scale={self.scale!r}"
                )
            if isinstance(self.momentum, bool) or not 0 <= self.momentum < 1:
                raise ValueError(f"momentum must be a number in [0, 1), got {self.momentum!r}")

    @property
    def op(self) -> str:
        """Which registered op implements it: ``"truncate"`` where top-N bits say it all."""
        pure = isinstance(self.number, int) and not isinstance(self.grad_number, Format) and (
            self.override is None or isinstance(self.override.number, int))
        return "truncate" if pure else "quantize"
