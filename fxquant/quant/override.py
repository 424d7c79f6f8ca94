"""A few nodes rounded to another format, as a config: :class:`NodeOverride` (the rows a
point finds for it are :class:`~fxquant.quant.override_mask.OverrideMask`'s)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from fxquant.errors import FxquantTypeError, FxquantValueError, same_kind
from fxquant.formats import AnyFormat, TopN, as_format

__all__ = ["NodeOverride", "describe_nodes"]


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
    format: AnyFormat
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
        object.__setattr__(self, "format", as_format(self.format, "node override format"))

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


def describe_nodes(nodes: Tensor, format: AnyFormat) -> str:
    """``"20 nodes -> 9 bits"`` / ``"3/6 nodes (mask) -> e2m1"``."""
    if nodes.dtype == torch.bool and nodes.device.type == "meta":
        count = f"a mask over {nodes.numel()} nodes"
    elif nodes.dtype == torch.bool:
        count = f"{int(nodes.sum())}/{nodes.numel()} nodes (mask)"
    else:
        count = f"{nodes.numel()} nodes"
    target = f"{format.bits} bits" if isinstance(format, TopN) else format.spec()
    return f"{count} -> {target}"
