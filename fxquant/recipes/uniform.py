"""Uniform recipes: one config at every site of every GNN layer (:class:`DegreeQuant`,
:class:`LsqProtect`, :class:`MX`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch.fx import GraphModule

from fxquant.errors import FxquantValueError
from fxquant.fx.selectors import layer_name
from fxquant.quant import QuantConfig, QuantMapping
from fxquant.quant.protection import Protection
from fxquant.quant.site import Site
from fxquant.quant.sites import edge_arguments, linears_of, weights_of
from fxquant.recipes.checks import check_count, check_flag, check_rounding
from fxquant.recipes.core import Recipe
from fxquant.recipes.graph import gnn_layers

__all__ = ["MX", "DegreeQuant", "LsqProtect"]

#: every site of a GNN layer
_ALL_SITES = ("input", "weight", "message", "aggregate", "output")


def _check_bits(bits: int) -> None:
    if not 2 <= bits <= 16:  # (an int: Recipe.__post_init__ checked the type)
        raise FxquantValueError(f"bits must be a whole number in 2..16, got {bits!r}")


@dataclass(frozen=True)
class _EverySite(Recipe):
    """One config at every site of every GNN layer (inputs, weights, messages,
    aggregation, outputs); a ``protect`` setting applies to the node sites."""

    def config(self, protect: tuple[float, float] | None, site: str = "output") -> QuantConfig:
        raise NotImplementedError

    def mapping(self, gm: GraphModule, data: Any = None) -> QuantMapping:
        layers = gnn_layers(gm)
        mapping = QuantMapping()
        protect = getattr(self, "protect", None)
        for site in _ALL_SITES:
            mapping.set_global(self.config(protect if site != "weight" else None, site),
                               site=site)
        for layer in layers:  # (APPNP, SGConv's propagation: no weight to round)
            if not weights_of(gm.get_submodule(str(layer.target))):
                mapping.set_name(layer_name(layer), None, site="weight")
        return mapping


@dataclass(frozen=True)
class DegreeQuant(Recipe):
    """Degree-Quant (Tailor et al., ICLR 2021) as its reference code runs it (GC-PER, the
    setting of its published INT8/INT4 results), on any PyG ``MessagePassing`` model.

    - **Tensors**: every GNN layer's input, weights, linear transforms' outputs (``X W``),
      per-edge coefficients of ``message()`` (GCN's normalisation, GAT's attention
      coefficients), messages, aggregation and output (the ``input``, ``weight``,
      ``linear``, ``edge``, ``message``, ``aggregate`` and ``output`` sites: for GCN the
      seven tensors the reference rounds).
    - **Grid**: per-tensor asymmetric integers (``intN:asym``).
    - **Range**: the ``100 - percentile`` to ``percentile`` percentile of the rows that
      are rounded (protected rows left out), kept as the widest range seen in training
      and used in evaluation too (``observe="widen"``).
    - **Gradient**: straight-through, zero where a value rounds to the grid's first or
      last code or beyond (``grad="clipped"``, the reference's "GC").
    - **Protection**: in training each node stays in full precision with a probability
      from ``protect[0]`` to ``protect[1]`` growing with its in-degree; one mask per layer
      and forward shared by the layer's sites; a message and a per-edge coefficient
      follow their source node. Weights are never protected.

    Where it differs from the reference: percentiles come from a strided sample of at
    most 65,536 values (the reference sorts every value); the layer's input is rounded
    before a dropout that feeds only the layer (the reference rounds after it, on values
    scaled by ``1 / (1 - p)`` in training); GAT's attention is rounded after its softmax
    (PyG keeps the logits inside ``edge_update``; the reference rounds the logits).

    Args:
        bits (int, optional): the integer width. (default: 8)
        protect (tuple, optional): ``(p_min, p_max)``. (default: ``(0.0, 0.2)``)
        percentile (float, optional): the range's upper percentile; None: min to max.
            The reference's scripts use 99.9 at INT8 and 99 at INT4; on features as sparse
            as Cora's (1.3% non-zero) 99 gives the first input the range ``[0, 0]``.
            (default: 99.9)
        grad (str, optional): ``"clipped"`` (GC) or ``"ste"``. (default: ``"clipped"``)

    Example:
        >>> import fxquant
        >>> from torch_geometric.nn.models import GCN
        >>> run = fxquant.recipes.get("degree-quant", bits=4).prepare(GCN(8, 16, 2, 3))
        >>> sorted({p.site.value for _, p in fxquant.quantization_points(run.model)})
        ['aggregate', 'edge', 'input', 'linear', 'message', 'output', 'weight']
    """

    name: ClassVar[str] = "degree-quant"

    bits: int = 8
    protect: tuple[float, float] | None = (0.0, 0.2)
    percentile: float | None = 99.9
    grad: str = "clipped"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_bits(self.bits)
        if self.grad not in ("clipped", "ste"):
            raise FxquantValueError(f"grad must be 'clipped' or 'ste', got {self.grad!r}")
        self.config(self.protection())  # validates protect and percentile

    def protection(self) -> Protection | None:
        if self.protect is None:
            return None
        p_min, p_max = Protection.parse(self.protect)
        return Protection(p_min, p_max, share="layer", messages="source", ranges="unprotected")

    def config(self, protect: Protection | None) -> QuantConfig:
        pct = "minmax" if self.percentile is None else f"percentile:{self.percentile}"
        return QuantConfig(f"int{self.bits}:asym", scale="tensor", range=pct, observe="widen",
                           grad=self.grad, protect=protect)

    def mapping(self, gm: GraphModule, data: Any = None) -> QuantMapping:
        mapping = QuantMapping()
        protect = self.protection()
        for layer in gnn_layers(gm):
            module = gm.get_submodule(str(layer.target))
            name = layer_name(layer)
            for site in Site:
                if site is Site.LINEAR and not linears_of(module):
                    continue
                if site is Site.EDGE and not edge_arguments(module):
                    continue
                if site is Site.WEIGHT and not weights_of(module):
                    continue
                mapping.set_name(name, self.config(protect if site is not Site.WEIGHT
                                                   else None), site=site.value)
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
        refit_widen (bool, optional): refits never narrow a grid
            (:class:`~fxquant.recipes.QuantTraining`). (default: False)
        float_epochs (int, optional): train the first epochs in float32, then fit the steps
            to the trained activations (:class:`~fxquant.recipes.QuantTraining`).
            (default: 0)
        message_rounding (str, optional): ``"nearest"``, or ``"stochastic"``: each message
            rounds up with probability its fraction of a step, so that a node's sum of
            many rounded messages carries no rounding bias (GAT's messages, scaled by
            attention coefficients, are often small against the tensor's step); in
            evaluation too (seed torch's generator to repeat an evaluation exactly).
            (default: ``"nearest"``)

    Example:
        >>> import fxquant
        >>> from torch_geometric.nn.models import GCN
        >>> run = fxquant.recipes.LsqProtect(bits=4).prepare(GCN(8, 16, num_layers=2,
        ...                                                      out_channels=3))
        >>> run.model.get_submodule("convs_0_message_quant")
        QuantPoint(message of 'convs.0': int4, nearest, scale tensor (lsq), ste, protect 0..0.2)
    """

    name: ClassVar[str] = "lsq-protect"

    bits: int = 4
    protect: tuple[float, float] | None = (0.0, 0.2)
    refit_epochs: int = 0
    refit_widen: bool = False
    float_epochs: int = 0
    message_rounding: str = "nearest"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_bits(self.bits)
        check_count(self.refit_epochs, "refit_epochs")
        check_count(self.float_epochs, "float_epochs")
        check_flag(self.refit_widen, "refit_widen")
        check_rounding(self.message_rounding, "message_rounding")
        self.config(self.protect)  # validates protect

    def config(self, protect: tuple[float, float] | None, site: str = "output") -> QuantConfig:
        rounding = self.message_rounding if site == "message" else "nearest"
        return QuantConfig(f"int{self.bits}", rounding, scale="tensor", range="lsq",
                           protect=protect)

    def training(self) -> dict[str, Any]:
        return {"refit_epochs": self.refit_epochs, "refit_widen": self.refit_widen,
                "float_epochs": self.float_epochs}


@dataclass(frozen=True)
class MX(_EverySite):
    """An OCP Microscaling format at every site: ``format`` values in blocks of 32 along
    the last dim, each block with a power-of-two (E8M0) scale: MXFP4 (``"e2m1"``), MXFP6
    (``"e2m3"``, ``"e3m2"``), MXFP8 (``"e4m3"``, ``"e5m2"``), MXINT8 (``"int8"``).

    Args:
        format (str, optional): the element format. (default: ``"e2m1"``)

    Example:
        >>> import fxquant
        >>> from torch_geometric.nn.models import GCN
        >>> run = fxquant.recipes.MX(format="e4m3").prepare(GCN(8, 16, num_layers=2,
        ...                                                    out_channels=3))
        >>> sorted({str(p.config.format) for _, p in fxquant.quantization_points(run.model)})
        ['e4m3']
    """

    name: ClassVar[str] = "mx"

    format: str = "e2m1"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.config(None)

    def config(self, protect: tuple[float, float] | None, site: str = "output") -> QuantConfig:
        return QuantConfig(self.format, scale="block32")
