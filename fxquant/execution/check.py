""":func:`compare`: whether a converted model computes what was trained, point by point.

Both models run on the same inputs; at every point the converted model rounds, its codes
are compared with the simulation's: the codes the simulation's point gives its own input
(``round(x / step)`` with the step it used there), read through the point's
:meth:`~fxquant.quant.points.QuantPoint.grid`. Codes may differ where the float32 rescaling
of an integer accumulator lands a value on the other side of a rounding boundary than the
simulation's float32 arithmetic did: one level, on a few elements.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from tabulate import tabulate
from torch import Tensor, nn
from torch.fx import GraphModule

from fxquant.errors import FxquantValueError
from fxquant.execution.model import ConvertedModel
from fxquant.execution.quantizer import IntQuantizer
from fxquant.quant import QuantPoint

__all__ = ["Comparison", "PointComparison", "compare"]


@dataclass(frozen=True)
class PointComparison:
    """One point: how many of its codes the converted model shares with the simulation."""

    point: str
    label: str
    elements: int
    equal: int
    max_diff: int

    @property
    def fraction(self) -> float:
        return self.equal / self.elements if self.elements else 1.0


@dataclass
class Comparison:
    """:func:`compare`'s result: one :class:`PointComparison` per converted point, and how
    many predictions (``argmax`` over the last dim) agree on the nodes compared."""

    points: list[PointComparison]
    nodes: int
    agree: int
    missing: list[str] = field(default_factory=list)

    @property
    def agreement(self) -> float:
        return self.agree / self.nodes if self.nodes else 1.0

    @property
    def worst(self) -> PointComparison | None:
        return min(self.points, key=lambda p: p.fraction, default=None)

    def ok(self, codes: float = 0.999, predictions: float = 0.995, max_diff: int = 1) -> bool:
        """At least ``codes`` of each point's codes equal, none more than ``max_diff``
        levels apart, and at least ``predictions`` of the predictions agreeing."""
        return all(p.fraction >= codes and p.max_diff <= max_diff for p in self.points) \
            and self.agreement >= predictions and not self.missing

    def __str__(self) -> str:
        rows = [[p.point, p.label, p.elements, p.equal, f"{100 * p.fraction:.3f}%", p.max_diff]
                for p in self.points]
        table = tabulate(rows, headers=["point", "site", "codes", "equal", "equal (%)",
                                        "max diff"])
        return (f"{table}\npredictions: {self.agree} of {self.nodes} agree "
                f"({100 * self.agreement:.2f}%)")


def compare(gm: GraphModule, converted: ConvertedModel, *args: Any,
            mask: Tensor | None = None, **kwargs: Any) -> Comparison:
    """Run ``gm`` (evaluation mode) and ``converted`` on the same inputs and compare, at
    every point ``converted`` rounds, its codes with the simulation's, and their
    predictions on the nodes of ``mask`` (all nodes without one; of a model that returns
    several tensors, the first one's).

    Args:
        gm (GraphModule): the transformed model ``converted`` was converted from.
        converted (ConvertedModel): :func:`fxquant.convert`'s result.
        args, kwargs: the forward's inputs (``x, edge_index``, ``node_ids=``).
        mask (Tensor, optional): the nodes whose predictions are compared (a bool mask or
            ids). (default: :obj:`None`: all)

    Returns:
        Comparison: per point ``equal`` of ``elements`` codes and the largest difference in
        levels; ``agree`` of ``nodes`` predictions. ``str()`` is a table.
    """
    quantizers = _quantizers(converted)
    ids = kwargs.get("node_ids")
    seen: dict[str, tuple[QuantPoint, Tensor, Tensor | None, Tensor | None, int | None]] = {}
    hooks = []
    for name, module in gm.named_modules():
        if isinstance(module, QuantPoint) and name in quantizers:
            hooks.append(module.register_forward_hook(_keep_input(name, seen, ids),
                                                      with_kwargs=True))
    was_training = gm.training
    gm.eval()
    try:
        with torch.no_grad():
            sim = gm(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
        gm.train(was_training)
    codes = converted.record(*args, **kwargs)
    with torch.no_grad():
        out = converted(*args, **kwargs)
    rows, missing = [], []
    for name, quantizer in quantizers.items():
        if name not in seen or name not in codes:
            if name in seen or name in codes:
                missing.append(name)
            continue
        point, x, point_ids, row_nodes, num_nodes = seen[name]
        grid = point.grid(x, node_ids=point_ids, row_nodes=row_nodes, num_nodes=num_nodes)
        expected = grid.codes(x)
        got = codes[name].grid_codes()
        if expected.shape != got.shape:
            raise FxquantValueError(f"compare: the point {name!r} rounds a tensor of shape "
                                    f"{tuple(got.shape)} in the converted model and of "
                                    f"shape {tuple(expected.shape)} in the simulation")
        diff = (got.to(torch.int32) - expected).abs()
        rows.append(PointComparison(name, quantizer.spec.label, diff.numel(),
                                    int((diff == 0).sum()),
                                    int(diff.max()) if diff.numel() else 0))
    if isinstance(sim, (tuple, list)):  # (several outputs: the first one's predictions)
        sim, out = sim[0], out[0]
    pred_sim, pred = sim.argmax(-1), out.argmax(-1)
    if mask is not None:
        pred_sim, pred = pred_sim[mask], pred[mask]
    return Comparison(rows, int(pred.numel()), int((pred == pred_sim).sum()), missing)


def _quantizers(converted: ConvertedModel) -> dict[str, IntQuantizer]:
    found: dict[str, IntQuantizer] = {}
    for module in converted.modules():
        if isinstance(module, IntQuantizer):
            found[module.spec.module] = module
    return found


def _keep_input(name: str, seen: dict[str, Any], ids: Tensor | None) -> Any:
    """A forward hook (with keyword arguments) keeping what the point rounded: its input,
    the batch's node ids (where the point looks rows up by them), the rows' nodes
    (messages) and the number of nodes."""

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
             output: Any) -> None:
        del output
        assert isinstance(module, QuantPoint)
        degree = kwargs.get("node_degree")
        x = args[0]
        n = degree.shape[0] if isinstance(degree, Tensor) else x.shape[0] if x.dim() else 1
        seen[name] = (module, x.detach(), ids if module.uses_node_ids else None,
                      kwargs.get("row_nodes"), n)

    return hook
