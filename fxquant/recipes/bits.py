"""Per-node bit-width recipes: :class:`HubMessages` (fixed, from in-degree),
:class:`LearnedBits` (learned, pulled toward a budget by a penalty) and :class:`BudgetBits`
(learned, held within a budget by projection)."""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
from torch import Tensor
from torch.fx import GraphModule, Node

from fxquant.errors import FxquantValueError
from fxquant.formats import TopN
from fxquant.fx.degree import in_degree
from fxquant.fx.lazy import refuse_lazy
from fxquant.fx.selectors import layer_name
from fxquant.fx.tracer import trace
from fxquant.quant import (
    NodeBits,
    QuantConfig,
    QuantMapping,
    bit_report,
    quantize,
    share_bits,
    truncate,
)
from fxquant.recipes.checks import check_count, check_flag, check_positive, check_rounding
from fxquant.recipes.core import SELECTIONS, QuantTraining, Recipe
from fxquant.recipes.graph import (
    gnn_layers,
    input_after_relu,
    is_raw_input,
    num_nodes,
    output_feeds_relu,
    points_of,
    tie_steps,
)

__all__ = ["BudgetBits", "HubMessages", "LearnedBits"]

#: the activation sites (no weights) of the bit recipes
_ACTIVATION_SITES = ("input", "message", "aggregate", "output")


@dataclass(frozen=True)
class _BitsRecipe(Recipe):
    """Shared by the per-node bit recipes: every activation site of every GNN layer on an
    integer grid with a learned step, the raw input features on ``input_format`` (not
    counted in ``avg_bits``), the logits in float32 unless ``quantize_logits``."""

    target_bits: float = 2.0
    midrise: bool = True
    shared_step: bool = True
    input_format: str | None = "uint1:row"
    quantize_logits: bool = False
    select: str = "budget"
    refit_epochs: int = 0
    step_lr: float | None = None
    refit_widen: bool = False
    float_epochs: int = 0
    message_rounding: str = "nearest"
    distill: float = 0.0
    temperature: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self.target_bits, "target_bits")
        check_positive(self.distill, "distill", zero=True)
        check_positive(self.temperature, "temperature")
        check_count(self.refit_epochs, "refit_epochs")
        check_count(self.float_epochs, "float_epochs")
        check_flag(self.refit_widen, "refit_widen")
        check_rounding(self.message_rounding, "message_rounding")
        if self.step_lr is not None:
            check_positive(self.step_lr, "step_lr")
        if self.select not in SELECTIONS:
            raise FxquantValueError(f"select={self.select!r} is not one of {list(SELECTIONS)}")
        if self.input_format is not None:
            QuantConfig(self.input_format)  # a clear error here, not in prepare

    def _grid(self, unsigned: bool) -> tuple[str, int]:
        """The integer kind (``"uint"``, ``"int"``, ``"int...:midrise"``) and its lowest
        bit-width."""
        if unsigned:
            return "uint8", 1
        return ("int8:midrise", 1) if self.midrise else ("int8", 2)

    def site(self, data: Any, unsigned: bool, message: bool = False,
             bits: int | None = None) -> QuantConfig:
        raise NotImplementedError

    def rounding(self, message: bool) -> str:
        """How a site rounds: ``message_rounding`` at the messages, to nearest elsewhere."""
        return self.message_rounding if message else "nearest"

    def mapping(self, gm: GraphModule, data: Any = None) -> QuantMapping:
        layers = gnn_layers(gm)
        mapping = QuantMapping()
        for site in _ACTIVATION_SITES:  # a layer's input after a ReLU is non-negative
            mapping.set_global(self.site(data, site == "input", message=site == "message"),
                               site=site)
        self.extra_entries(mapping, layers, data)
        for layer in layers:
            name = layer_name(layer)
            if not input_after_relu(gm, layer):
                mapping.set_name(name, self.site(data, False), site="input")
            if layer is not layers[-1] and output_feeds_relu(gm, layer):
                # a ReLU zeroes what an unsigned grid clamps
                mapping.set_name(name, self.site(data, True), site="output")
        first, last = layer_name(layers[0]), layer_name(layers[-1])
        if is_raw_input(layers[0], gm):
            if self.input_format is None:
                mapping.set_name(first, None, site="input")
            else:
                config = QuantConfig(self.input_format)
                mapping.set_name(first, config, site="input")
                _warn_if_inexact(data, config, self.input_format)
        if not self.quantize_logits:
            mapping.set_name(last, None, site="output")
        return mapping

    def extra_entries(self, mapping: QuantMapping, layers: list[Node], data: Any) -> None:
        """Entries a subclass adds between the global ones and the per-layer grids."""

    def _training_common(self) -> dict[str, Any]:
        """The :class:`~fxquant.recipes.QuantTraining` settings every bit recipe passes."""
        return {"refit_epochs": self.refit_epochs, "refit_widen": self.refit_widen,
                "target_bits": self.target_bits, "select": self.select, "step_lr": self.step_lr,
                "float_epochs": self.float_epochs, "distill": self.distill,
                "temperature": self.temperature}

    def tie(self, gm: GraphModule) -> None:
        if self.shared_step:
            tie_steps(gm)


def _final_bits(run: QuantTraining, data: Any) -> float:
    """The average bits a prepared model's final widths count on ``data``
    (:func:`fxquant.bit_report` of a copy: the model itself is not run)."""
    gm = copy.deepcopy(run.model).to(data.x.device)
    return float(bit_report(gm, data.x, data.edge_index).avg_bits)


def _share_tables(gm: GraphModule, shared_bits: str) -> None:
    """One learned bit-width table per layer (``"layer"``) or for the model (``"all"``)."""
    if shared_bits == "none":
        return
    groups: dict[str, list[str]] = {}
    for name, point in points_of(gm):
        if point.node_widths is not None and point.node_widths.learned:
            groups.setdefault(point.layer if shared_bits == "layer" else "", []).append(name)
    for members in groups.values():
        for name in members[1:]:
            share_bits(gm, name, members[0])


def _warn_if_inexact(data: Any, config: QuantConfig, spec: str) -> None:
    x = getattr(data, "x", None)
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() != 2 or x.is_meta:
        return
    fmt = config.format
    rounded = truncate(x, fmt.bits) if isinstance(fmt, TopN) else quantize(
        x, fmt.spec(), scale=config.scale.value)
    if not torch.equal(rounded, x):
        err = float((rounded - x).abs().max())
        warnings.warn(f"the raw input features are not exact on input_format={spec!r} (largest "
                      f"error {err:.3g}); that grid suits row-normalized bag-of-words features. "
                      "Please pass input_format=None (float32) or a wider format, e.g. "
                      "'int8:row'.", stacklevel=4)


@dataclass(frozen=True)
class HubMessages(_BitsRecipe):
    """Fixed per-node bit-widths from in-degree: every activation site at
    ``floor(target_bits)`` bits, except the messages into hubs (nodes whose in-degree lies
    above the ``hub_quantile`` quantile), one bit fewer: a hub sums many messages, which
    averages their rounding errors out. The last layer's aggregation (the logits before
    the bias) gets ``last_aggregate_bits``. Nothing is stored for the widths: they follow
    from the graph. In training the widths start ``anneal_bits`` above their final values
    and drop by one every ``anneal_every`` epochs; the reported epoch is the best
    validation epoch within the budget (``select="budget"``).

    Args:
        target_bits (float, optional): the budget, average bits per value. (default: 2.0)
        hub_quantile (float, optional): in-degree quantile above which a node is a hub.
            (default: 0.9: the top 10%)
        last_aggregate_bits (int, optional): bits of the last layer's aggregation; None:
            as the rest. (default: 4)
        anneal_every (int, optional): epochs per annealing step; 0 is off. (default: 50)
        anneal_bits (int, optional): bits above the final widths at the start. (default: 2)
        anneal_refit_epochs (int, optional): fit the learned steps again on the first
            epochs after each drop (a step fitted for wider grids clips the narrower ones).
            (default: 0)
        midrise (bool, optional): signed sites on the mid-rise grid (levels ``k + 1/2``;
            1 bit is the sign), else the symmetric one (2 bits at least). (default: True)
        shared_step (bool, optional): a layer's input rounds with the previous layer's
            output step where only a ReLU lies between (:func:`fxquant.share_step`).
            (default: True)
        input_format (str, optional): the raw input features' format, its scale after the
            last ``":"`` (``"uint1:row"``: exact for row-normalized bag-of-words features,
            a warning says when not; ``"int8:asym:row"``; the grammar of
            :mod:`fxquant.formats`); None keeps them float32. Not counted in ``avg_bits``.
            (default: ``"uint1:row"``)
        quantize_logits (bool, optional): also round the last layer's output.
            (default: False)
        select (str, optional): ``"budget"`` or ``"best-val"``. (default: ``"budget"``)
        refit_epochs (int, optional): refit the learned steps on the first epochs.
            (default: 0)
        refit_widen (bool, optional): refits never narrow a grid (the larger of the
            fitted and the current step; :class:`~fxquant.recipes.QuantTraining`).
            (default: False)
        step_lr (float, optional): the learned steps' learning rate
            (:class:`~fxquant.recipes.QuantTraining`). (default: :obj:`None`: the
            optimizer's)
        float_epochs (int, optional): train the first epochs in float32, then fit the
            learned steps to the trained activations
            (:class:`~fxquant.recipes.QuantTraining`). (default: 0)
        message_rounding (str, optional): ``"nearest"``, or ``"stochastic"``: each message
            rounds up with probability its fraction of a step, so that a node's sum of
            many rounded messages carries no rounding bias; in evaluation too (seed torch's
            generator to repeat an evaluation exactly). (default: ``"nearest"``)
        distill (float, optional): weight of distillation from a float32 teacher's
            predictions (the run needs :meth:`~fxquant.recipes.QuantTraining.set_teacher`
            and the output in ``loss``; :class:`~fxquant.recipes.QuantTraining`). ``0`` is
            off. (default: ``0.0``)
        temperature (float, optional): the distillation's softmax temperature.
            (default: ``1.0``)
        fit_budget (bool, optional): where the final widths would count more than
            ``target_bits`` (:func:`fxquant.bit_report` on ``data``; a graph whose top
            in-degree decile receives few of the messages), lower the hub quantile by 0.05
            at a time until they fit, with a warning naming the quantile used; a warning
            also says when even every node a hub does not fit. Counting runs one forward
            of a copy on ``data.x, data.edge_index``. (default: True)

    Example:
        >>> import torch, fxquant
        >>> from torch_geometric.data import Data
        >>> from torch_geometric.nn.models import GCN
        >>> edge_index = torch.tensor([[1, 2, 3, 4, 5, 0], [0, 0, 0, 0, 0, 1]])  # node 0: a hub
        >>> graph = Data(x=torch.rand(6, 4), edge_index=edge_index)
        >>> run = fxquant.recipes.HubMessages(target_bits=3.0, anneal_every=0, fit_budget=False,
        ...                                   input_format=None).prepare(
        ...     GCN(4, 8, num_layers=2, out_channels=2), graph)
        >>> widths = run.model.get_submodule("convs_0_message_quant").config.node_bits.bits
        >>> float(widths[0]), float(widths.max())     # messages into the hub: one bit fewer
        (2.0, 3.0)
    """

    name: ClassVar[str] = "hub-messages"

    hub_quantile: float = 0.9
    last_aggregate_bits: int | None = 4
    anneal_every: int = 50
    anneal_bits: int = 2
    anneal_refit_epochs: int = 0
    fit_budget: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check_flag(self.fit_budget, "fit_budget")
        if not 0 < self.hub_quantile < 1:
            raise FxquantValueError(f"hub_quantile must lie in (0, 1), got {self.hub_quantile!r}")
        lowest = 1 if self.midrise else 2
        last = self.last_aggregate_bits
        if last is not None and not lowest <= last <= 8:
            raise FxquantValueError(f"last_aggregate_bits must be a whole number in {lowest}..8 "
                                    f"(or None), got {last!r}")
        check_count(self.anneal_every, "anneal_every")
        check_count(self.anneal_bits, "anneal_bits")
        check_count(self.anneal_refit_epochs, "anneal_refit_epochs")

    def site(self, data: Any, unsigned: bool, message: bool = False,
             bits: int | None = None) -> QuantConfig:
        n = num_nodes(data, self.name)
        number, lowest = self._grid(unsigned)
        base = max(lowest, math.floor(self.target_bits)) if bits is None else bits
        hub = max(lowest, base - 1) if message and bits is None else base
        widths = NodeBits.by_degree(data.edge_index, [self.hub_quantile], [base, hub],
                                    num_nodes=n, min_bits=lowest)
        return QuantConfig(number, self.rounding(message), scale="tensor", range="lsq",
                           node_bits=widths)

    def extra_entries(self, mapping: QuantMapping, layers: list[Node], data: Any) -> None:
        if self.last_aggregate_bits is not None:
            mapping.set_name(layer_name(layers[-1]),
                             self.site(data, False, bits=self.last_aggregate_bits),
                             site="aggregate")

    def training(self) -> dict[str, Any]:
        return {**self._training_common(), "anneal_every": self.anneal_every,
                "anneal_bits": self.anneal_bits, "anneal_refit_epochs": self.anneal_refit_epochs}

    def prepare(self, model: torch.nn.Module, data: Any = None, *, lint: str = "warn"
                ) -> QuantTraining:
        """As :meth:`Recipe.prepare`; with ``fit_budget``, the hub quantile is lowered
        until the final widths count within ``target_bits`` on ``data``."""
        refuse_lazy(model, f"recipes.{type(self).__name__}.prepare")
        gm = model if isinstance(model, GraphModule) else trace(model)  # once, for every try
        run = super().prepare(gm, data, lint=lint)
        x = getattr(data, "x", None)
        if not self.fit_budget or not isinstance(x, Tensor) or x.is_meta:
            return run
        try:
            count = _final_bits(run, data)
        except Exception as e:  # a forward that needs more than (x, edge_index)
            warnings.warn(f"hub-messages: fit_budget could not count the bits: the model's "
                          f"forward(data.x, data.edge_index) raised {type(e).__name__}: {e}. The "
                          f"hub quantile stays {self.hub_quantile}; check the count with "
                          "fxquant.bit_report, or pass fit_budget=False", stacklevel=2)
            return run
        quantile = self.hub_quantile
        while count > self.target_bits and quantile > 0.05 + 1e-9:
            quantile = round(quantile - 0.05, 2)
            run = replace(self, hub_quantile=quantile, fit_budget=False).prepare(
                gm, data, lint="off")
            count = _final_bits(run, data)
        if quantile != self.hub_quantile:
            fits = count <= self.target_bits
            warnings.warn(
                f"hub-messages: with hub_quantile={self.hub_quantile} the final widths count "
                f"more than target_bits={self.target_bits} on this graph; "
                + (f"hub_quantile={quantile} is used ({count:.3f} bits)" if fits else
                   f"even hub_quantile={quantile} counts {count:.3f} bits. Please raise "
                   "target_bits, lower last_aggregate_bits, or use 'budget-bits'")
                + " (fit_budget=False keeps the quantile given)", stacklevel=2)
            run.recipe = replace(self, hub_quantile=quantile)
        return run


@dataclass(frozen=True)
class LearnedBits(_BitsRecipe):
    """Learned per-node bit-widths (A2Q-style, Zhu et al., ICLR 2023) with a learned step
    per site, pulled toward ``target_bits`` by :func:`fxquant.bit_penalty` in the loss;
    the widths learn at ``bits_lr``. The reported epoch is the best validation epoch within
    the budget (``select="budget"``).

    Args:
        target_bits (float, optional): the budget, average bits per value. (default: 2.0)
        penalty (float, optional): weight of the bit penalty. (default: 10.0)
        bits_lr (float, optional): the widths' learning rate. (default: 0.01)
        max_bits (int, optional): the widest allowed width. (default: 8)
        shared_bits (str, optional): ``"none"`` (a table per site), ``"layer"`` (one per
            layer) or ``"all"`` (one for the model; :func:`fxquant.share_bits`).
            (default: ``"none"``)
        midrise, shared_step, input_format, quantize_logits, select: as :class:`HubMessages`.
        refit_epochs, step_lr, refit_widen, float_epochs, message_rounding: as
            :class:`HubMessages`.
        distill, temperature: as :class:`HubMessages`.
    """

    name: ClassVar[str] = "learned-bits"

    penalty: float = 10.0
    bits_lr: float = 0.01
    max_bits: int = 8
    shared_bits: str = "none"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self.penalty, "penalty", zero=True)
        check_positive(self.bits_lr, "bits_lr")
        lowest = 1 if self.midrise else 2
        if not lowest <= self.max_bits <= 8:
            raise FxquantValueError(f"max_bits must be a whole number in {lowest}..8, got "
                                    f"{self.max_bits!r}")
        if self.shared_bits not in ("none", "layer", "all"):
            raise FxquantValueError(f"shared_bits={self.shared_bits!r} is not one of "
                                    "['none', 'layer', 'all']")

    def site(self, data: Any, unsigned: bool, message: bool = False,
             bits: int | None = None) -> QuantConfig:
        n = num_nodes(data, self.name)
        number, lowest = self._grid(unsigned)
        if self.shared_bits != "none":  # a shared table has one range: the signed grid's
            lowest = 1 if self.midrise else 2
        widths = NodeBits.learned_init(n, init=min(float(self.max_bits), self.target_bits + 1.0),
                                       min_bits=lowest, max_bits=self.max_bits)
        return QuantConfig(number, self.rounding(message), scale="tensor", range="lsq",
                           node_bits=widths)

    def tie(self, gm: GraphModule) -> None:
        super().tie(gm)
        _share_tables(gm, self.shared_bits)

    def training(self) -> dict[str, Any]:
        return {**self._training_common(), "penalty": self.penalty, "bits_lr": self.bits_lr}


@dataclass(frozen=True)
class BudgetBits(_BitsRecipe):
    """Learned per-node bit-widths (A2Q-style, as :class:`LearnedBits`) that keep their
    budget by themselves: after each move the widths are projected into ``target_bits``
    (:class:`QuantTraining` with ``project=True``), so every epoch's counted average, as
    :func:`fxquant.bit_report` counts it, is within the budget once annealing ends, whatever
    the loss asks for; no penalty is needed. The widths learn with an Adam of their own at
    ``bits_lr`` bits per step, apart from the model's optimizer and its learning rate. Only
    the loss moves them up (a row's width gets gradient where its values are clipped), and
    the projection takes the same amount off every width: the bits flow to the rows that
    clip.

    Args:
        target_bits (float, optional): the budget, average bits per value. (default: 2.0)
        bits_lr (float, optional): the widths' step size (Adam's learning rate), in bits
            per step. (default: 0.05)
        max_bits (int, optional): the widest allowed width; the narrowest is 1 (mid-rise
            and unsigned grids) or 2. Each node's stored width costs
            ``ceil(log2(max - min + 1))`` bits per table. (default: 4)
        shared_bits (str, optional): ``"none"`` (a table per site), ``"layer"`` (one per
            layer) or ``"all"`` (:func:`fxquant.share_bits`). (default: ``"none"``)
        anneal_every (int, optional): the budget starts ``anneal_bits`` above
            ``target_bits`` (the widths too) and drops by one every ``anneal_every`` epochs;
            0 is off. (default: 50)
        anneal_bits (int, optional): bits above the budget at the start. (default: 2)
        anneal_refit_epochs (int, optional): as :class:`HubMessages`. (default: 0)
        init (str, optional): the widths start within half a bit of the start value, in an
            order that decides which rows a budget between two whole widths rounds up:
            ``"random"`` (a fixed pseudo-random order) or ``"degree"`` (message rows by their
            target's in-degree, hubs lowest, as :class:`HubMessages`; other sites random).
            (default: ``"random"``)
        midrise, shared_step, input_format, quantize_logits, select: as :class:`HubMessages`.
        refit_epochs, step_lr, refit_widen, float_epochs, message_rounding: as
            :class:`HubMessages`.
        distill, temperature: as :class:`HubMessages`.

    Example:
        >>> from torch_geometric.data import Data
        >>> from torch_geometric.nn.models import GCN
        >>> graph = Data(x=torch.full((6, 4), 0.25), num_nodes=6,
        ...              edge_index=torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]]))
        >>> run = BudgetBits(target_bits=2.0, anneal_every=0).prepare(
        ...     GCN(4, 8, num_layers=2, out_channels=2), graph, lint="off")
        >>> run.project, run.budget_now()
        (True, 2.0)
    """

    name: ClassVar[str] = "budget-bits"

    bits_lr: float = 0.05
    max_bits: int = 4
    shared_bits: str = "none"
    anneal_every: int = 50
    anneal_bits: int = 2
    anneal_refit_epochs: int = 0
    init: str = "random"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self.bits_lr, "bits_lr")
        if self.init not in ("random", "degree"):
            raise FxquantValueError(f"init={self.init!r} is not one of ['random', 'degree']")
        lowest = 1 if self.midrise else 2
        if not lowest <= self.max_bits <= 8:
            raise FxquantValueError(f"max_bits must be a whole number in {lowest}..8, got "
                                    f"{self.max_bits!r}")
        if self.shared_bits not in ("none", "layer", "all"):
            raise FxquantValueError(f"shared_bits={self.shared_bits!r} is not one of "
                                    "['none', 'layer', 'all']")
        check_count(self.anneal_every, "anneal_every")
        check_count(self.anneal_bits, "anneal_bits")
        check_count(self.anneal_refit_epochs, "anneal_refit_epochs")

    def site(self, data: Any, unsigned: bool, message: bool = False,
             bits: int | None = None) -> QuantConfig:
        n = num_nodes(data, self.name)
        number, lowest = self._grid(unsigned)
        if self.shared_bits != "none":  # a shared table has one range: the signed grid's
            lowest = 1 if self.midrise else 2
        start = self.target_bits + (self.anneal_bits if self.anneal_every else 1)
        # a spread of half a bit orders the nodes, so that the projection can fill the
        # budget between two whole widths (equal widths would all round alike)
        if self.init == "degree" and message:  # messages into hubs lowest
            degree = in_degree(data.edge_index.cpu(), n)
            order = degree.argsort(stable=True).argsort().float() / max(n - 1, 1)
        else:
            order = torch.rand(n, generator=torch.Generator().manual_seed(n))
        start_bits = (start + 0.25 - 0.5 * order).clamp(lowest, self.max_bits)
        widths = NodeBits(start_bits, learned=True, min_bits=lowest, max_bits=self.max_bits)
        return QuantConfig(number, self.rounding(message), scale="tensor", range="lsq",
                           node_bits=widths)

    def tie(self, gm: GraphModule) -> None:
        super().tie(gm)
        _share_tables(gm, self.shared_bits)

    def training(self) -> dict[str, Any]:
        return {**self._training_common(), "bits_lr": self.bits_lr, "project": True,
                "anneal_every": self.anneal_every, "anneal_bits": self.anneal_bits,
                "anneal_refit_epochs": self.anneal_refit_epochs}
