"""What the bits buy, counted: the bytes a converted model stores its values and weights in
(:func:`storage`), and the bit operations of its products and sums (:func:`bit_operations`),
each beside float32's.

Stored values are what the points hold in one forward: the codes packed (eight 1-bit, four
2-bit, two 4-bit codes a byte; rows of per-node widths packed by width), plus their scales
(4 bytes each: one per tensor, or one per row where a point has a per-row scale, counted
apart) and zero points. Messages are listed apart: the converted model streams them into
its sums and never keeps them whole.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from tabulate import tabulate
from torch import Tensor

from fxquant.errors import FxquantTypeError
from fxquant.execution.kernels import QTensor, per_row
from fxquant.execution.layers import IntLayer
from fxquant.execution.model import ConvertedModel
from fxquant.execution.packing import pack
from fxquant.execution.quantizer import IntQuantizer

__all__ = ["BitOps", "Storage", "StorageRow", "bit_operations", "storage"]


@dataclass(frozen=True)
class StorageRow:
    """One stored tensor: its elements, bits a value, packed bytes of the codes, bytes of
    its scales (per-tensor ones and per-row ones apart) and float32's bytes."""

    name: str
    kind: str  # "features", "hidden", "aggregate", "messages", "weight"
    elements: int
    bits: float
    code_bytes: int
    scale_bytes: int
    row_scale_bytes: int
    float32_bytes: int

    @property
    def bytes(self) -> int:
        return self.code_bytes + self.scale_bytes + self.row_scale_bytes


@dataclass
class Storage:
    """:func:`storage`'s result: one :class:`StorageRow` per point and weight."""

    rows: list[StorageRow]
    #: bytes of the per-node width tables a decoder needs (0 where they follow from the graph)
    width_table_bytes: int
    #: float32 bytes of what stays float32 (biases, weights without a point)
    float_parameter_bytes: int

    def total(self, kinds: tuple[str, ...], row_scales: bool = True) -> tuple[int, int]:
        """``(bytes, float32 bytes)`` of the rows of ``kinds``."""
        rows = [r for r in self.rows if r.kind in kinds]
        stored = sum(r.code_bytes + r.scale_bytes + (r.row_scale_bytes if row_scales else 0)
                     for r in rows)
        return stored, sum(r.float32_bytes for r in rows)

    def ratio(self, kinds: tuple[str, ...], row_scales: bool = True) -> float:
        """float32 bytes / stored bytes of the rows of ``kinds``."""
        stored, reference = self.total(kinds, row_scales)
        return reference / stored if stored else float("inf")

    def table(self, tablefmt: str = "simple") -> str:
        rows = [[r.name, r.kind, r.elements, f"{r.bits:.2f}", r.code_bytes, r.scale_bytes,
                 r.row_scale_bytes, r.float32_bytes,
                 f"{r.float32_bytes / r.bytes:.2f}x" if r.bytes else "-"] for r in self.rows]
        return tabulate(rows, headers=["tensor", "kind", "values", "bits", "code bytes",
                                       "scale bytes", "row-scale bytes", "float32 bytes",
                                       "smaller"], tablefmt=tablefmt)

    def __str__(self) -> str:
        return self.table()

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [asdict(r) for r in self.rows],
                "width_table_bytes": self.width_table_bytes,
                "float_parameter_bytes": self.float_parameter_bytes}


def _kind(spec_site: str, first: bool) -> str:
    if spec_site == "message":
        return "messages"
    if spec_site == "aggregate":
        return "aggregate"
    return "features" if first else "hidden"


def _bits(q: QTensor) -> float:
    return float(q.bits.float().mean()) if isinstance(q.bits, Tensor) and q.bits.numel() \
        else float(q.bits) if not isinstance(q.bits, Tensor) else 0.0


def storage(model: ConvertedModel, *args: Any, **kwargs: Any) -> Storage:
    """The bytes ``model`` stores the values of one forward on ``args`` in, and its
    weights, beside float32's.

    Example:
        >>> import torch, fxquant
        >>> from fxquant.execution import storage
        >>> from torch_geometric.nn.models import GCN
        >>> mapping = fxquant.QuantMapping()
        >>> for site in ("input", "weight", "message", "aggregate", "output"):
        ...     mapping = mapping.set_global(fxquant.QuantConfig("int4", scale="tensor"),
        ...                                  site=site)
        >>> model = fxquant.convert(fxquant.transform(GCN(8, 16, num_layers=2,
        ...                                                 out_channels=2), mapping).eval())
        >>> x = torch.randn(100, 8)
        >>> node = torch.arange(100, device=x.device)
        >>> ring = torch.stack([node, (node + 1) % 100])
        >>> s = storage(model, x, ring)
        >>> round(s.ratio(("features", "hidden")), 2), round(s.ratio(("weight",)), 2)
        (7.94, 7.27)
    """
    if not isinstance(model, ConvertedModel):
        raise FxquantTypeError(f"storage expects a ConvertedModel, got {type(model).__name__}")
    codes = model.record(*args, **kwargs)
    quantizers = {m.spec.module: m for m in model.modules() if isinstance(m, IntQuantizer)}
    first = model.input_point
    rows: list[StorageRow] = []
    for name, q in codes.items():
        spec = quantizers[name].spec
        if spec.site == "weight":
            continue
        rows.append(_row(name, _kind(spec.site, name == first), q,
                         bool(spec.grid and spec.grid.asymmetric)))
    float_params = 0
    for layer in model.layers.values():
        assert isinstance(layer, IntLayer)
        for name, weight in layer.weight_codes.items():
            grid = quantizers[name].spec.grid
            rows.append(_row(name, "weight", weight.qtensor(), bool(grid and grid.asymmetric)))
        for buffer_name, buffer in layer.named_buffers():
            if buffer is None or buffer_name.startswith(("points.", "weight", "att_src_codes",
                                                         "att_dst_codes", "weights.")):
                continue
            if buffer_name.startswith(("b", "bias")) or not _has_codes(layer, buffer_name):
                float_params += buffer.numel() * 4
    widths = 0
    for quantizer in quantizers.values():
        table = quantizer.widths
        if table is not None and quantizer.spec.widths_stored and quantizer.spec.site != "weight":
            widths += -(-table.numel() // 2)  # one 4-bit width a node (1..8 bits: 3 bits)
    return Storage(rows, widths, float_params)


def _has_codes(layer: IntLayer, buffer: str) -> bool:
    """Whether the float32 master of ``buffer`` (a weight) is stored as codes instead."""
    names = {"lin_weight": "weight", "w": "weight", "wl": "weight_l", "wr": "weight_r",
             "att_src": "att_src_codes", "att_dst": "att_dst_codes"}
    if buffer in names:
        return getattr(layer, names[buffer], None) is not None
    if buffer.startswith("w") and buffer[1:].isdigit():
        return bool(getattr(layer, "has_weight")[int(buffer[1:])])  # noqa: B009
    return False


def _row(name: str, kind: str, q: QTensor, asymmetric: bool) -> StorageRow:
    """A stored tensor: packed codes; a scale (and an asymmetric grid's zero point) of 4
    bytes per tensor, or per row where each row has its own."""
    rows_scaled = q.scale_per_row and per_row(q.scale)
    numbers = 2 if asymmetric else 1
    rows = int(q.scale.numel()) if rows_scaled else 1  # type: ignore[union-attr]
    return StorageRow(name, kind, int(q.codes.numel()), _bits(q), pack(q).nbytes,
                      0 if rows_scaled else 4 * numbers, 4 * numbers * rows if rows_scaled else 0,
                      4 * int(q.codes.numel()))


@dataclass
class BitOps:
    """:func:`bit_operations`' result: per product and sum, its operations and bit
    operations, beside float32's (32 x 32 bits a multiply-accumulate, 32 bits an add)."""

    rows: list[dict[str, Any]]

    @property
    def bitops(self) -> float:
        return sum(r["bitops"] for r in self.rows)

    @property
    def float32_bitops(self) -> float:
        return sum(r["float32_bitops"] for r in self.rows)

    def __str__(self) -> str:
        return self.table()

    def table(self, tablefmt: str = "simple") -> str:
        rows = [[r["what"], r["kind"], r["operations"], r["bits"], f"{r['bitops']:.3g}",
                 f"{r['float32_bitops']:.3g}"] for r in self.rows]
        return tabulate(rows, headers=["part", "kind", "operations", "bits", "BitOPs",
                                       "float32 BitOPs"], tablefmt=tablefmt)


def bit_operations(model: ConvertedModel, *args: Any, **kwargs: Any) -> BitOps:
    """The bit operations of one forward of ``model`` on ``args``: for each product, its
    multiply-accumulates x the bits of one operand x the bits of the other (32 for a
    float32 operand); for each aggregation, its additions x the bits of the messages. The
    rescaling between points, biases, normalization coefficients and attention (float32
    elementwise work, a few operations per value) are not counted.

    Example:
        >>> import torch, fxquant
        >>> from fxquant.execution import bit_operations
        >>> from torch_geometric.nn.models import GCN
        >>> mapping = fxquant.QuantMapping()
        >>> for site in ("input", "weight", "message", "aggregate", "output"):
        ...     mapping = mapping.set_global(fxquant.QuantConfig("int8", scale="tensor"),
        ...                                  site=site)
        >>> model = fxquant.convert(fxquant.transform(GCN(8, 16, num_layers=2,
        ...                                                 out_channels=2), mapping).eval())
        >>> x = torch.randn(100, 8)
        >>> node = torch.arange(100, device=x.device)
        >>> ring = torch.stack([node, (node + 1) % 100])
        >>> ops = bit_operations(model, x, ring)
        >>> round(ops.float32_bitops / ops.bitops, 1)    # 8 x 8 bits against 32 x 32
        15.7
    """
    if not isinstance(model, ConvertedModel):
        raise FxquantTypeError(f"bit_operations expects a ConvertedModel, got "
                               f"{type(model).__name__}")
    meter: list[Any] = []
    model.__dict__["_meter"] = meter
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        model.__dict__["_meter"] = None
    rows = []
    for kind, what, count, bits_a, bits_b, *rest in meter:
        if kind == "product":  # (rest: whether the float32 model computes it too)
            rows.append({"what": what, "kind": kind, "operations": count,
                         "bits": f"{bits_a:.2f} x {bits_b:.2f}",
                         "bitops": count * bits_a * bits_b,
                         "float32_bitops": count * 32 * 32 if not rest or rest[0] else 0})
        else:
            rows.append({"what": what, "kind": kind, "operations": count,
                         "bits": f"{bits_a:.2f}", "bitops": count * bits_a,
                         "float32_bitops": count * 32})
    return BitOps(rows)
