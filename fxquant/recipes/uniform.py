"""Uniform recipes: one config at every site of every GNN layer (:class:`LsqProtect`,
:class:`MX`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch.fx import GraphModule

from fxquant.errors import FxquantValueError
from fxquant.quant import QuantConfig, QuantMapping
from fxquant.recipes.core import Recipe, check_count
from fxquant.recipes.graph import gnn_layers

__all__ = ["MX", "LsqProtect"]

#: every site of a GNN layer
_ALL_SITES = ("input", "weight", "message", "aggregate", "output")


@dataclass(frozen=True)
class _EverySite(Recipe):
    """One config at every site of every GNN layer (inputs, weights, messages,
    aggregation, outputs); a ``protect`` setting applies to the node sites."""

    def config(self, protect: tuple[float, float] | None) -> QuantConfig:
        raise NotImplementedError

    def mapping(self, gm: GraphModule, data: Any = None) -> QuantMapping:
        gnn_layers(gm)
        mapping = QuantMapping()
        protect = getattr(self, "protect", None)
        for site in _ALL_SITES:
            mapping.set_global(self.config(protect if site != "weight" else None), site=site)
        return mapping


@dataclass(frozen=True)
class LsqProtect(_EverySite):
    """Uniform integers with a learned step (LSQ, Esser et al., ICLR 2020) at every site,
    with Degree-Quant's protection (Tailor et al., ICLR 2021): in training, each node stays
    at full precision with a probability growing with its in-degree.

    Args:
        bits (int, optional): the integer width. (default: 4)
        protect (tuple, optional): ``(p_min, p_max)``, or None for no protection.
            (default: ``(0.0, 0.2)``)
        refit_epochs (int, optional): fit the steps again on each of the first epochs while
            activations grow. (default: 0)
    """

    name: ClassVar[str] = "lsq-protect"
    command: ClassVar[str] = "python examples/dq_table.py --only int4-lsq-p"

    bits: int = 4
    protect: tuple[float, float] | None = (0.0, 0.2)
    refit_epochs: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or not 2 <= self.bits <= 16:
            raise FxquantValueError(f"bits must be a whole number in 2..16, got {self.bits!r}")
        check_count(self.refit_epochs, "refit_epochs")
        self.config(self.protect)  # validates protect

    def config(self, protect: tuple[float, float] | None) -> QuantConfig:
        return QuantConfig(f"int{self.bits}", scale="tensor", range="lsq", protect=protect)

    def training(self) -> dict[str, Any]:
        return {"refit_epochs": self.refit_epochs}


@dataclass(frozen=True)
class MX(_EverySite):
    """An OCP Microscaling format at every site: ``format`` values in blocks of 32 along
    the last dim, each block with a power-of-two (E8M0) scale: MXFP4 (``"e2m1"``), MXFP6
    (``"e2m3"``, ``"e3m2"``), MXFP8 (``"e4m3"``, ``"e5m2"``), MXINT8 (``"int8"``).

    Args:
        format (str, optional): the element format. (default: ``"e2m1"``)
    """

    name: ClassVar[str] = "mx"
    command: ClassVar[str] = "python examples/dq_table.py --only mxfp4"

    format: str = "e2m1"

    def __post_init__(self) -> None:
        self.config(None)

    def config(self, protect: tuple[float, float] | None) -> QuantConfig:
        return QuantConfig(self.format, scale="block32")
