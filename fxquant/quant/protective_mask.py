"""Degree-Quant's protective mask (Tailor et al., ICLR 2021): the part of a quantization
point with ``QuantConfig(protect=...)`` that draws, in each training forward, which nodes
stay at full precision.

Node ``i`` is protected with probability ``p_min + (p_max - p_min) * F(deg_i)``, ``F`` the
fraction of the forward's nodes whose in-degree (:func:`~fxquant.fx.degree.in_degree`) is
at most ``deg_i``. On a layer called with a ``(source, target)`` pair of node sets, the
source nodes are drawn over the sources by their out-degree (the messages they send;
:func:`~fxquant.fx.degree.node_degree`), the targets over the targets by their in-degree.
With ``Protection(share="layer")`` the first point of a layer to run draws the mask (one
per side) and the layer's other points read it from the GraphModule's
:class:`~fxquant.quant.nodes.LayerMasks` (emptied at the start of every forward). In
evaluation nothing is protected. No state: the masks are random draws of one forward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fxquant.quant.config import QuantConfig
from fxquant.quant.nodes import LayerMasks
from fxquant.quant.protection import Protection

__all__ = ["ProtectiveMask", "protection_probability"]


def protection_probability(protect: Protection, degree: Tensor) -> Tensor:
    """Each node's probability to stay at full precision, from its in-degree.

    Example:
        >>> protection_probability(Protection(0.0, 0.2), torch.tensor([1.0, 3.0, 1.0, 2.0]))
        tensor([0.1000, 0.2000, 0.1000, 0.1500])
    """
    p_min, p_max = protect
    ordered = torch.sort(degree).values
    rank = torch.searchsorted(ordered, degree, right=True).to(torch.float32)
    return p_min + (p_max - p_min) * rank / max(degree.numel(), 1)


class ProtectiveMask:
    """Draws the protective mask of one point (or reads its layer's).

    Args:
        protect (Protection): the probabilities and how the layer shares them.
        layer (str): the layer the point serves (the key of its shared mask).

    Example:
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> part = ProtectiveMask(Protection(1.0, 1.0), "conv1")
        >>> part.mask(torch.tensor([1.0, 2.0]))
        tensor([True, True])
        >>> part.mask(None) is None  # no degrees: nothing protected
        True
    """

    def __init__(self, protect: Protection, layer: str) -> None:
        self.protect = protect
        self.layer = layer
        #: the GraphModule's masks of the current forward (``share="layer"``), not owned
        self.masks: LayerMasks | None = None

    @classmethod
    def from_config(cls, config: QuantConfig, layer: str) -> ProtectiveMask | None:
        """The part a point with ``config`` needs: one with ``protect``, else None."""
        return cls(config.protect, layer) if config.protect is not None else None

    def attach(self, context: LayerMasks) -> None:
        """Share the layer's mask through ``context`` (``Protection(share="layer")``)."""
        self.masks = context

    def _key(self, side: str) -> Any:
        return self.layer if side == "target" else (self.layer, side)

    @property
    def has_mask(self) -> bool:
        """Whether this forward's shared layer mask (of its target nodes) is drawn
        already."""
        return self.masks is not None and self.layer in self.masks.masks

    def shared(self, side: str = "target") -> Tensor | None:
        """The layer's shared draw of this forward over one side's nodes, if drawn."""
        if self.protect.share != "layer" or self.masks is None:
            return None
        return self.masks.masks.get(self._key(side))

    def mask(self, degree: Tensor | None, side: str = "target") -> Tensor | None:
        """The protective mask over the layer's nodes (on a ``(source, target)`` layer:
        over one ``side``'s nodes) for this forward: the layer's shared draw
        (``share="layer"``: drawn by its first point) or a draw of its own; None where
        this point knows no degrees and no draw was shared."""
        if self.protect.share == "layer" and self.masks is not None:
            key = self._key(side)
            mask = self.masks.masks.get(key)
            if mask is None and degree is not None:
                mask = self.draw(degree)
                self.masks.masks[key] = mask
            return mask
        return None if degree is None else self.draw(degree)

    def draw(self, degree: Tensor) -> Tensor:
        """A fresh draw: True where a node stays at full precision."""
        return torch.bernoulli(protection_probability(self.protect, degree)).to(torch.bool)

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __repr__(self) -> str:
        return f"ProtectiveMask({self.protect.describe()})"
