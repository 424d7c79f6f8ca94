"""The recipe machinery: :class:`Recipe`, the :class:`QuantTraining` a recipe prepares, and
the :class:`Choice` of the epoch a run reports."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx import GraphModule
from torch_geometric.data import Data

from fxquant.errors import FxquantIndexError, FxquantTypeError, FxquantValueError, warn_renamed
from fxquant.fx.lazy import refuse_lazy
from fxquant.fx.tracer import trace
from fxquant.pipeline import transform
from fxquant.quant import BitReport, QuantMapping, QuantPoint, bit_penalty, bit_report, refit_steps
from fxquant.quant.bits import SiteBits, average_bits
from fxquant.quant.nodes import check_node_ids
from fxquant.recipes.checks import (
    check_count,
    check_fields,
    check_flag,
    check_positive,
    check_rounding,
    check_settings,
    real_number,
)

__all__ = ["SELECTIONS", "Choice", "QuantTraining", "Recipe", "check_count", "check_flag",
           "check_positive", "check_rounding", "unique"]

#: how a run chooses the epoch it reports
SELECTIONS = ("best-val", "budget")


@dataclass(frozen=True)
class Choice:
    """The epoch a training run reports (:attr:`QuantTraining.best`; its example shows
    one).

    Attributes:
        epoch (int): its index (counted by :meth:`QuantTraining.observe`).
        val (float): its validation score.
        metrics (dict): what was passed to :meth:`QuantTraining.observe` with it (e.g. the
            test accuracy).
        bits (BitReport, optional): the bits of its evaluation forward.
        within_budget (bool): whether its average bits met the recipe's target (always
            ``True`` without a budget).
    """

    epoch: int
    val: float
    metrics: dict[str, float]
    bits: BitReport | None
    within_budget: bool


class QuantTraining:
    """A transformed model and what its training loop does around it.

    :meth:`Recipe.prepare` returns one; ``model`` is the transformed model to train. The
    loop calls :meth:`param_groups` once, :meth:`start_epoch` before each training epoch,
    :meth:`loss` on each loss, and :meth:`observe` after each evaluation; :attr:`best`
    is the epoch to report. With ``project=True`` a loop that takes several optimizer steps
    per epoch may also call :meth:`after_step` after each (otherwise the widths move once
    per epoch, in :meth:`start_epoch`).

    Args:
        model (torch.fx.GraphModule): the transformed model.
        refit_epochs (int, optional): fit the learned steps again on each of the first
            ``refit_epochs`` epochs (:func:`fxquant.refit_steps`). (default: ``0``)
        refit_widen (bool, optional): refits (``refit_epochs``, ``anneal_refit_epochs``)
            never narrow a grid: each step becomes the larger of the fitted and the current
            one (``fxquant.refit_steps(widen=True)``). (default: ``False``)
        float_epochs (int, optional): train the first ``float_epochs`` epochs in float32:
            the quantization points pass training forwards through unrounded (evaluation
            still rounds, so every evaluated epoch is the quantized model's), and the
            learned steps are fitted afresh on the first rounded training forward, to the
            activations of a model that has learned something, not to an untrained one's,
            which are much smaller (see ``refit_epochs``); that fit is never widened, and
            ``refit_widen`` refits after it keep at least its step. Annealing counts these
            epochs.
            (default: ``0``)
        anneal_every (int, optional): fixed per-node bit-widths start ``anneal_bits`` above
            their final widths and drop by one every ``anneal_every`` epochs; ``0`` is off.
            (default: ``0``)
        anneal_bits (int, optional): how many bits above. (default: ``2``)
        anneal_refit_epochs (int, optional): fit the learned steps again on each of the
            first ``anneal_refit_epochs`` epochs after every annealing drop (of the fixed
            widths, or of the budget with ``project=True``): all the rows of a point share
            one step, fitted for the widths of its time, and a step fitted for wider grids
            clips the narrower ones until the learned step grows, about the optimizer's
            learning rate per step. (default: ``0``)
        penalty (float, optional): weight of :func:`fxquant.bit_penalty` in the loss (with
            learned bit-widths and a ``target_bits``). (default: ``0.0``)
        target_bits (float, optional): the bit budget: average bits per value as
            :func:`fxquant.bit_report` counts them. (default: :obj:`None`)
        bits_lr (float, optional): the learning rate of learned bit-widths. (default:
            :obj:`None`: the optimizer's)
        step_lr (float, optional): the learning rate of the learned steps (``log_step``:
            with Adam, about the fraction a step changes by per iteration). A model trained
            from scratch may need its steps to grow a hundredfold, which at the model's
            rate of ``0.01`` takes hundreds of epochs, while values beyond the grid pass no
            gradient. (default: :obj:`None`: the optimizer's)
        select (str, optional): ``"best-val"``: report the epoch with the best validation
            score; ``"budget"``: the best among the epochs within ``target_bits`` (the best
            overall, marked ``within_budget=False``, if none is). (default: ``"best-val"``)
        project (bool, optional): keep the learned bit-widths within the budget by
            projection instead of a penalty: the widths leave the model's optimizer and are
            moved by an Adam of their own at ``bits_lr`` bits per step (so their step size
            does not depend on the model's learning rate); after each move, every width is
            clamped to its allowed range and all widths are shifted by one common amount,
            up or down, to the largest count (as :func:`fxquant.bit_report` counts it)
            within the budget. The
            budget starts ``anneal_bits`` above ``target_bits`` and drops by one every
            ``anneal_every`` epochs (``anneal_every=0``: ``target_bits`` from the start).
            (default: ``False``)
        distill (float, optional): weight of a distillation term in :meth:`loss`: the
            Kullback-Leibler divergence from a float32 teacher's softened predictions
            (:meth:`set_teacher`: e.g. the same model trained without rounding, at its best
            validation epoch) to the model's, over every node the output holds (the
            unlabelled ones too), times ``temperature ** 2``, in every training epoch. The
            teacher's logits must be given before the first :meth:`loss`, and :meth:`loss`
            needs the model's ``output``; a loop that gives neither trains without
            distillation, with a ``FutureWarning`` (a future release will raise). ``0`` is
            off. (default: ``0.0``)
        temperature (float, optional): both predictions are ``softmax(logits /
            temperature)`` in the distillation term. (default: ``1.0``)

    Attributes:
        recipe (Recipe | None): the recipe that prepared it, with the settings it used
            (e.g. the hub quantile :class:`~fxquant.recipes.HubMessages` chose to fit its
            budget); None for one built directly.

    Example:
        >>> import torch, fxquant
        >>> from torch_geometric.data import Data
        >>> from torch_geometric.nn.models import GCN
        >>> g = torch.Generator().manual_seed(0)
        >>> graph = Data(x=torch.rand(300, 8, generator=g), y=torch.randint(0, 3, (300,)),
        ...              edge_index=torch.randint(0, 300, (2, 1500), generator=g))
        >>> recipe = fxquant.recipes.HubMessages(target_bits=3.0, anneal_every=0,
        ...                                      last_aggregate_bits=None, input_format=None,
        ...                                      fit_budget=False)
        >>> run = recipe.prepare(GCN(8, 16, num_layers=2, out_channels=3), graph)
        >>> optimizer = torch.optim.Adam(run.param_groups(), lr=0.01)
        >>> for epoch in range(3):
        ...     _ = run.model.train()
        ...     run.start_epoch(epoch)
        ...     optimizer.zero_grad()
        ...     out = run.model(graph.x, graph.edge_index)
        ...     run.loss(torch.nn.functional.cross_entropy(out, graph.y)).backward()
        ...     optimizer.step()
        ...     _ = run.model.eval()
        ...     with torch.no_grad():
        ...         acc = (run.model(graph.x, graph.edge_index).argmax(1) == graph.y).float()
        ...     _ = run.observe(float(acc.mean()))   # validation score (here: all nodes)
        >>> run.best.within_budget, run.best.bits.avg_bits <= 3.0
        (True, True)
    """

    def __init__(self, model: GraphModule, *, refit_epochs: int = 0, refit_widen: bool = False,
                 float_epochs: int = 0, anneal_every: int = 0,
                 anneal_bits: int = 2, anneal_refit_epochs: int = 0, penalty: float = 0.0,
                 target_bits: float | None = None, bits_lr: float | None = None,
                 step_lr: float | None = None, select: str = "best-val",
                 project: bool = False, distill: float = 0.0, temperature: float = 1.0) -> None:
        settings = _checked_settings({
            "refit_epochs": refit_epochs, "refit_widen": refit_widen,
            "float_epochs": float_epochs, "anneal_every": anneal_every,
            "anneal_bits": anneal_bits, "anneal_refit_epochs": anneal_refit_epochs,
            "penalty": penalty, "target_bits": target_bits, "bits_lr": bits_lr,
            "step_lr": step_lr, "select": select, "project": project, "distill": distill,
            "temperature": temperature})
        self.model = model
        self.recipe: Recipe | None = None
        self.refit_epochs: int = settings["refit_epochs"]
        self.refit_widen: bool = settings["refit_widen"]
        self.float_epochs: int = settings["float_epochs"]
        self.anneal_every: int = settings["anneal_every"]
        self.anneal_bits: int = settings["anneal_bits"]
        self.anneal_refit_epochs: int = settings["anneal_refit_epochs"]
        self.penalty = float(settings["penalty"])
        self.target_bits: float | None = settings["target_bits"]
        self.bits_lr: float | None = settings["bits_lr"]
        self.step_lr: float | None = settings["step_lr"]
        self.select: str = settings["select"]
        self.distill = float(settings["distill"])
        self.temperature = float(settings["temperature"])
        self._settings = settings
        self._teacher: Tensor | None = None
        self._warned_distill = False
        self._warned_score = False
        points = [m for m in model.modules() if isinstance(m, QuantPoint)]
        self._points = points
        self._widths = unique(m.node_widths.bits for m in points
                              if m.node_widths is not None and m.node_widths.learned)
        self._steps = unique(p for m in points for p in m.parameters()
                              if all(p is not w for w in self._widths))
        self._tables = _annealed_tables(points) if self.anneal_every else []
        self._quantized = bool(points)
        self.project: bool = settings["project"]
        self._budget = _BudgetProjection(self._widths, points) \
            if self.project and self._widths else None
        self._epoch = -1
        self._observed = -1
        self._best: dict[bool, Choice | None] = {False: None, True: None}

    def __repr__(self) -> str:
        names = ("refit_epochs", "anneal_every", "penalty", "target_bits", "bits_lr", "select")
        parts = [f"{f}={getattr(self, f)!r}" for f in names]
        if self.refit_widen:
            parts.append("refit_widen=True")
        if self.float_epochs:
            parts.append(f"float_epochs={self.float_epochs}")
        if self.anneal_refit_epochs:
            parts.append(f"anneal_refit_epochs={self.anneal_refit_epochs}")
        if self.step_lr is not None:
            parts.append(f"step_lr={self.step_lr!r}")
        if self.project:
            parts.append("project=True")
        if self.distill:
            parts.append(f"distill={self.distill!r}, temperature={self.temperature!r}")
        return f"QuantTraining({', '.join(parts)})"

    @property
    def learns_bits(self) -> bool:
        """Whether the model has learned per-node bit-widths."""
        return bool(self._widths)

    def param_groups(self, groups: Iterable[Any] | None = None) -> list[dict[str, Any]]:
        """The optimizer's parameter groups: ``groups`` (the model's own, as an optimizer
        takes them: parameters or dicts; default one group of every parameter) without the
        quantizers' parameters, which get groups of their own without weight decay (decay
        would pull a log-step toward a step of 1); learned bit-widths at ``bits_lr``.

        Example:
            >>> from torch_geometric.nn.models import GCN
            >>> from fxquant.recipes import HubMessages
            >>> run = HubMessages(target_bits=2.0, fit_budget=False).prepare(
            ...     GCN(4, 8, num_layers=2, out_channels=2), _tiny_graph())
            >>> [len(g["params"]) for g in run.param_groups()]
            [4, 5]
        """
        mine = {id(p) for p in (*self._steps, *self._widths)}
        if groups is None:
            groups = [{"params": list(self.model.parameters())}]
        result: list[dict[str, Any]] = []
        for group in groups:
            if isinstance(group, dict):
                params = group["params"]
                params = [params] if isinstance(params, Tensor) else list(params)
                result.append({**group, "params": [p for p in params if id(p) not in mine]})
            elif isinstance(group, Tensor):
                if id(group) not in mine:
                    result.append({"params": [group]})
            else:
                raise FxquantTypeError(f"param_groups: groups must hold parameters or dicts "
                                       f"with 'params', got {type(group).__name__}")
        if self._steps:
            steps: dict[str, Any] = {"params": list(self._steps), "weight_decay": 0.0}
            if self.step_lr is not None:
                steps["lr"] = self.step_lr
            result.append(steps)
        if self._widths and self._budget is None:  # projected widths move on their own
            group = {"params": list(self._widths), "weight_decay": 0.0}
            if self.bits_lr is not None:
                group["lr"] = self.bits_lr
            result.append(group)
        return [g for g in result if g["params"]]

    def start_epoch(self, epoch: int | None = None) -> None:
        """Before each training epoch (default: one more than the last call): anneal the
        fixed per-node bit-widths, and mark the learned steps for a refit on the first
        ``refit_epochs`` epochs (the first training batch fits them anyway) and on the first
        ``anneal_refit_epochs`` after each annealing drop. The schedule depends on the epoch
        alone, so a resumed run that names its epochs (or loads :meth:`state_dict`) goes on
        exactly where it stopped."""
        if epoch is not None:
            check_count(epoch, "QuantTraining.start_epoch: epoch")
        self._epoch = self._epoch + 1 if epoch is None else int(epoch)
        for point in self._points:  # a compiled fit that found no finite value fits again
            point.settle()
        fresh = bool(self.float_epochs) and self._epoch == self.float_epochs
        if self.float_epochs:
            in_float = self._epoch < self.float_epochs
            for point in self._points:
                point.float_training = in_float
            if fresh:  # the first rounded epoch: a fresh fit, never widened (a step from
                refit_steps(self.model)  # before the float epochs fits an untrained model)
        if self._tables:
            extra = self._extra_bits()
            with torch.no_grad():
                for point, final in self._tables:
                    rb = point.config.node_bits
                    assert rb is not None and point.node_widths is not None
                    table = point.node_widths.bits
                    table.copy_((final.to(table.device) + extra).clamp(max=rb.max_bits))
        if not fresh and (0 < self._epoch < self.refit_epochs or self._after_drop()):
            refit_steps(self.model, widen=self.refit_widen)
        if self._budget is not None:
            self._budget.step(self.bits_lr if self.bits_lr is not None else 0.01,
                              self.budget_now())

    def _after_drop(self) -> bool:
        """Whether this epoch is among the first ``anneal_refit_epochs`` after an
        annealing drop (epochs ``k * anneal_every``, ``k = 1 .. anneal_bits``)."""
        if not (self.anneal_refit_epochs and self.anneal_every and (self._tables or self._budget)):
            return False
        drops = self.anneal_bits - self._extra_bits()  # the last at epoch drops * anneal_every
        return drops >= 1 and self._epoch - drops * self.anneal_every < self.anneal_refit_epochs

    def _extra_bits(self) -> int:
        """The bits annealing still adds this epoch: ``anneal_bits`` at the start, one
        fewer every ``anneal_every`` epochs, down to 0 (always 0 without annealing)."""
        if not self.anneal_every:
            return 0
        return max(0, self.anneal_bits - max(self._epoch, 0) // self.anneal_every)

    def budget_now(self) -> float | None:
        """The budget the projection keeps in the current epoch: ``target_bits`` plus what
        annealing still adds (:obj:`None` without a target)."""
        if self.target_bits is None:
            return None
        return self.target_bits + self._extra_bits()

    def after_step(self) -> None:
        """After an optimizer step (optional; for loops with several steps per epoch): with
        ``project=True``, move the learned bit-widths on the gradient of the last backward
        and project them into the budget; otherwise nothing."""
        if self._budget is not None:
            self._budget.step(self.bits_lr if self.bits_lr is not None else 0.01,
                              self.budget_now())

    def set_teacher(self, logits: Tensor) -> None:
        """The float32 teacher's logits for ``distill``: one row per node of the graph
        (as the model's output on it), e.g. the same model trained without rounding, at its
        best validation epoch. A detached copy is kept.

        Example:
            >>> import fxquant
            >>> from torch_geometric.nn.models import GCN
            >>> gm = fxquant.transform(GCN(4, 8, num_layers=2, out_channels=3),
            ...                        fxquant.QuantConfig("int8", scale="tensor"))
            >>> run = QuantTraining(gm, distill=1.0)
            >>> x, edge_index = torch.rand(5, 4), torch.randint(0, 5, (2, 12))
            >>> run.set_teacher(torch.randn(5, 3))
            >>> out = run.model(x, edge_index)
            >>> loss = run.loss(out.logsumexp(-1).mean(), output=out)  # plus the KL term
        """
        if not isinstance(logits, Tensor) or logits.dim() != 2 or \
                not logits.is_floating_point():
            raise FxquantTypeError(f"set_teacher: expected the teacher's logits, a float "
                                   f"[num_nodes, num_classes] tensor, got "
                                   f"{getattr(logits, 'shape', type(logits).__name__)}")
        if not bool(torch.isfinite(logits).all()):
            raise FxquantValueError("set_teacher: the teacher's logits hold inf or NaN; "
                                    "please pass a trained model's finite logits")
        if not self.distill:
            warnings.warn("set_teacher: this run does not distill (distill=0), so the "
                          "teacher is not used; give the run distill= to use it", stacklevel=2)
        self._teacher = logits.detach().clone()

    def _distill_term(self, output: Tensor | None, node_ids: Tensor | None) -> Tensor | None:
        missing = "no teacher (run.set_teacher(logits), the logits of the same model " \
            "trained without rounding)" if self._teacher is None else \
            "no output (run.loss(loss, output=out))" if not isinstance(output, Tensor) else ""
        if missing:
            if not self._warned_distill:
                self._warned_distill = True
                warnings.warn(
                    f"QuantTraining(distill={self.distill}) distills from a float32 teacher, "
                    f"but this loop gives it {missing}, so the run trains without "
                    "distillation (the recommended recipe's published accuracy is with it). "
                    "A future release will raise here.", FutureWarning, stacklevel=3)
            return None
        assert self._teacher is not None and isinstance(output, Tensor)
        if self._teacher.device != output.device:  # moved once, kept there
            self._teacher = self._teacher.to(output.device)
        teacher = self._teacher
        if node_ids is not None:
            teacher = teacher[node_ids.to(output.device)]
        if teacher.shape != output.shape:
            fix = "in mini-batches pass node_ids= (the batch's global node ids, one per " \
                "output row)" if teacher.shape[1:] == output.shape[1:] else \
                "the teacher must predict the same classes as the model"
            raise FxquantValueError(
                f"distillation: the output {tuple(output.shape)} and the teacher's logits "
                f"{tuple(teacher.shape)} do not line up; {fix}")
        t = self.temperature
        return self.distill * t * t * F.kl_div(F.log_softmax(output / t, dim=-1),
                                              F.softmax(teacher.to(output.dtype) / t, dim=-1),
                                              reduction="batchmean")

    def _checked_node_ids(self, node_ids: object) -> Tensor | None:
        """``node_ids`` as int64 ids (as the model's ``node_ids=`` takes them: any integer
        dtype, 1-D), each a row of the teacher's logits when there is a teacher."""
        if node_ids is None:
            return None
        ids = check_node_ids(node_ids, "QuantTraining.loss: node_ids")
        rows = self._teacher.shape[0] if self._teacher is not None else None
        if rows is not None and ids.numel():
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high >= rows:
                bad = low if low < 0 else high
                raise FxquantIndexError(
                    f"QuantTraining.loss: node_ids holds node {bad}, but the teacher's logits "
                    f"have rows for nodes 0..{rows - 1}; node_ids are the global ids of the "
                    "output's rows (PyG's batch.n_id), each >= 0 and < the graph's num_nodes")
        return ids

    def loss(self, loss: Tensor, output: Tensor | None = None,
             node_ids: Tensor | None = None, *, nodes: Tensor | None = None) -> Tensor:
        """``loss`` plus the weighted bit penalty of the last forward (learned bit-widths
        with a target), else ``loss`` itself. With ``project=True`` it also records what one
        bit of each node's width costs in the last forward's count (for the projection).
        In the ``float_epochs`` nothing is rounded in training, so no bit penalty is added.
        With ``distill``, plus the distillation term of ``output`` (the model's output, one
        row per node), in the float epochs too.

        Args:
            loss (Tensor): the training loss.
            output (Tensor, optional): the model's output (for ``distill``).
            node_ids (Tensor, optional): in mini-batches, the global node id of each row of
                ``output`` (PyG's ``batch.n_id``, as the model's ``node_ids=``): a 1-D tensor
                of any integer dtype, each id ``>= 0`` and below the teacher's rows; a bool
                mask or a float tensor is refused. (default: :obj:`None`: row ``i`` is node
                ``i``)
            nodes (Tensor, optional): the old name of ``node_ids`` (a ``FutureWarning``).
        """
        if nodes is not None:
            if node_ids is not None:
                raise FxquantTypeError("QuantTraining.loss: nodes= is the old name of "
                                       "node_ids=; please pass node_ids= alone")
            warn_renamed("QuantTraining.loss(nodes=)", "QuantTraining.loss(node_ids=)")
            node_ids = nodes
        if not isinstance(loss, Tensor):
            raise FxquantTypeError(f"QuantTraining.loss: loss must be a tensor (the training "
                                   f"loss), got {loss!r} (a {type(loss).__name__})")
        if output is not None and not isinstance(output, Tensor):
            raise FxquantTypeError(f"QuantTraining.loss: output must be the model's output "
                                   f"tensor or None, got a {type(output).__name__}")
        ids = self._checked_node_ids(node_ids)
        if self.distill and self.model.training:
            term = self._distill_term(output, ids)
            if term is not None:
                loss = loss + term
        if self.model.training and 0 <= self._epoch < self.float_epochs:
            return loss
        if self._budget is not None and self.model.training:
            self._budget.measure(self.model)
        if self.learns_bits and self.target_bits is not None and self.penalty:
            return loss + self.penalty * bit_penalty(self.model, self.target_bits)
        return loss

    def observe(self, val: float, **metrics: float) -> bool:
        """Record one evaluation, right after its forward (its bits are counted from it);
        returns whether it is now :attr:`best`.

        Args:
            val (float): the validation score (higher is better): a number or a
                one-element tensor. An epoch whose score is not a finite number (NaN, as an
                empty validation mask gives, or an infinity) counts as an epoch but is never
                :attr:`best` and never displaces one; the first such epoch warns.
            **metrics (float): kept with the epoch (:attr:`Choice.metrics`).
        """
        score = real_number(val, "QuantTraining.observe: val")
        observed = self._observed + 1
        if not math.isfinite(score):
            if not self._warned_score:
                warnings.warn(f"QuantTraining.observe: the validation score of epoch {observed} "
                              f"is {score} (an empty validation mask gives NaN); an epoch "
                              "without a finite score is never reported as the best. This "
                              "warning is shown once per run.", stacklevel=2)
                self._warned_score = True
            self._observed = observed
            return False
        constrained = self.select == "budget" and self._quantized
        report = bit_report(self.model) if constrained else None
        best = dict(self._best)
        for within in (False, True):
            held = best[within]
            if score <= (held.val if held is not None else 0.0):
                continue
            if within and not (constrained and report is not None
                               and self.target_bits is not None
                               and report.avg_bits <= self.target_bits):
                continue
            if report is None and self._quantized:
                report = bit_report(self.model)
            best[within] = Choice(observed, score, dict(metrics), report,
                                  within or not constrained)
        # every check and count done: the run changes only now
        self._observed, self._best = observed, best
        chosen = self.best
        return chosen is not None and chosen.epoch == observed

    @property
    def best(self) -> Choice | None:
        """The epoch to report (see ``select``), or :obj:`None` before any finite score
        above 0 (the first epoch with the best score wins a tie)."""
        if self.select == "budget" and self._best[True] is not None:
            return self._best[True]
        return self._best[False]

    def state_dict(self) -> dict[str, Any]:
        """The run's progress, for resuming it (as an optimizer's ``state_dict``): the
        epoch, the epochs observed and the best of them, and with ``project=True`` the
        widths' own optimizer, the last forward's cost per bit and the widths' gradient
        not yet applied. The model is not in it (``fxquant.save`` or ``state_dict()`` of
        ``run.model``), nor the teacher's logits (give them again with :meth:`set_teacher`).
        It holds tensors, numbers and strings only: ``torch.load(weights_only=True)``
        reads it.

        Example:
            >>> from torch_geometric.nn.models import GCN
            >>> from fxquant.recipes import HubMessages
            >>> recipe = HubMessages(target_bits=2.0, anneal_every=2, fit_budget=False,
            ...                      input_format=None)
            >>> run = recipe.prepare(GCN(4, 8, num_layers=2, out_channels=2), _tiny_graph())
            >>> run.start_epoch(); run.start_epoch()            # epochs 0 and 1
            >>> again = QuantTraining(run.model, **recipe.training())
            >>> again.load_state_dict(run.state_dict())
            >>> again.start_epoch()                             # epoch 2: one bit above
            >>> again.state_dict()["epoch"], again.budget_now()
            (2, 3.0)
        """
        return {"settings": dict(self._settings), "epoch": self._epoch,
                "observed": self._observed,
                "best": [_choice_state(self._best[False]), _choice_state(self._best[True])],
                "warned": {"distill": self._warned_distill, "score": self._warned_score},
                "budget": None if self._budget is None else self._budget.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from :meth:`state_dict` of a run with the same settings, on a model that
        holds the state it had then (``fxquant.load`` of a file ``fxquant.save`` wrote at
        the same time, or ``run.model.load_state_dict``). Nothing changes on error."""
        if not isinstance(state, dict) or not {"settings", "epoch", "observed", "best",
                                               "warned", "budget"} <= set(state):
            raise FxquantValueError("QuantTraining.load_state_dict: expected the dict "
                                    "QuantTraining.state_dict() returns, got "
                                    f"{type(state).__name__}")
        saved = state["settings"]
        differ = {k: (saved.get(k), v) for k, v in self._settings.items()
                  if not isinstance(saved, dict) or saved.get(k) != v}
        if differ:
            listed = ", ".join(f"{k}={old!r} (this run: {new!r})"
                               for k, (old, new) in differ.items())
            raise FxquantValueError(f"QuantTraining.load_state_dict: the saved run had "
                                    f"{listed}; please build the run with the saved settings: "
                                    "QuantTraining(model, **state['settings'])")
        for key in ("epoch", "observed"):  # -1: before the first
            value = state[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < -1:
                raise FxquantValueError(f"QuantTraining.load_state_dict: {key} must be an int "
                                        f">= -1, got {value!r}")
        if not isinstance(state["best"], list | tuple) or len(state["best"]) != 2 \
                or not isinstance(state["warned"], dict):
            raise FxquantValueError("QuantTraining.load_state_dict: its 'best' or 'warned' "
                                    "entry is not what QuantTraining.state_dict() writes")
        best = [_choice_from_state(c) for c in state["best"]]
        budget = state["budget"]
        if (budget is None) != (self._budget is None):
            raise FxquantValueError("QuantTraining.load_state_dict: the saved run "
                                    + ("projects" if budget is not None else "does not project")
                                    + " learned bit-widths and this one "
                                    + ("does not" if budget is not None else "does")
                                    + "; is it the same model?")
        if self._budget is not None:
            self._budget.load_state_dict(budget)  # checks everything before it changes
        self._epoch, self._observed = int(state["epoch"]), int(state["observed"])
        self._best = {False: best[0], True: best[1]}
        warned = state["warned"]
        self._warned_distill = bool(warned.get("distill", False))
        self._warned_score = bool(warned.get("score", False))


def _checked_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """:class:`QuantTraining`'s settings checked (types first, then values), numpy numbers
    as plain ones; nothing is built before they pass."""
    settings = check_settings(QuantTraining.__init__, settings, prefix="QuantTraining: ")
    for name in ("refit_epochs", "float_epochs", "anneal_every", "anneal_bits",
                 "anneal_refit_epochs"):
        check_count(settings[name], name)
    for name in ("penalty", "distill"):
        check_positive(settings[name], name, zero=True)
    for name in ("temperature", "target_bits", "bits_lr", "step_lr"):
        if settings[name] is not None:
            check_positive(settings[name], name)
    select, target_bits = settings["select"], settings["target_bits"]
    if select not in SELECTIONS:
        raise FxquantValueError(f"select={select!r} is not one of {list(SELECTIONS)}")
    if select == "budget" and target_bits is None:
        raise FxquantValueError("select='budget' chooses the epoch under target_bits; "
                                "please give target_bits")
    if settings["project"] and target_bits is None:
        raise FxquantValueError("project=True keeps the learned bit-widths within "
                                "target_bits; please give target_bits")
    return settings


def _annealed_tables(points: list[QuantPoint]) -> list[tuple[QuantPoint, Tensor]]:
    """Each fixed per-node bit-width table once, with its final widths: those of its
    ``NodeBits`` config (not the table as it is now: a model saved or handed over in the
    middle of annealing holds wider widths). A table shared by several points
    (:func:`fxquant.share_bits`) is its source's."""
    tables = []
    for point in points:
        widths, rb = point.node_widths, point.config.node_bits
        if widths is None or rb is None or widths.learned \
                or point.__dict__.get("bits_source") is not None:
            continue
        tables.append((point, rb.bits.to(device=widths.bits.device, dtype=widths.bits.dtype)))
    return tables


def _choice_state(choice: Choice | None) -> dict[str, Any] | None:
    if choice is None:
        return None
    return {"epoch": choice.epoch, "val": choice.val, "metrics": dict(choice.metrics),
            "bits": None if choice.bits is None else [asdict(s) for s in choice.bits.sites],
            "within_budget": choice.within_budget}


def _choice_from_state(state: Any) -> Choice | None:
    if state is None:
        return None
    try:
        bits = None if state["bits"] is None else BitReport([SiteBits(**s)
                                                             for s in state["bits"]])
        return Choice(int(state["epoch"]), float(state["val"]), dict(state["metrics"]), bits,
                      bool(state["within_budget"]))
    except (KeyError, TypeError, ValueError) as e:
        raise FxquantValueError(f"QuantTraining.load_state_dict: a saved best epoch cannot be "
                                f"read ({type(e).__name__}: {e}); please pass the dict "
                                "QuantTraining.state_dict() returned") from e


class _BudgetProjection:
    """Learned bit-widths moved by an optimizer of their own and projected into a bit
    budget (:class:`QuantTraining` with ``project=True``).

    The count of :func:`fxquant.bit_report` is linear in the rounded widths: ``avg_bits =
    fixed + sum over tables and nodes of cost[n] * round(clamp(width[n]))``, where
    ``cost[n]`` is the share of the average that one bit of node ``n``'s width holds (its
    rows times their values, over all counted values) and ``fixed`` is everything else
    (fixed-width sites, scales, stored widths). :meth:`measure` reads both off the last
    training forward through :func:`fxquant.bit_penalty`'s gradient, so shared tables,
    message rows keyed by their target and the raw input's exclusion are counted exactly
    as the report counts them; :meth:`project` then shifts every width by one common
    amount to the largest count within the budget.
    """

    #: the projection aims this far under the budget (float32 sums of rounded widths)
    MARGIN = 1e-4

    def __init__(self, widths: list[Tensor], points: list[QuantPoint]) -> None:
        self.widths = widths
        ranges: dict[int, tuple[int, int]] = {}
        for point in points:
            rb = point.config.node_bits
            table = point.node_widths
            if table is None or not table.learned or rb is None:
                continue
            lo, hi = ranges.get(id(table.bits), (rb.min_bits, rb.max_bits))
            ranges[id(table.bits)] = (max(lo, rb.min_bits), min(hi, rb.max_bits))
        self.ranges = [ranges[id(w)] for w in widths]
        self.optimizer = torch.optim.Adam(widths, lr=0.01)
        self.costs: list[Tensor] | None = None
        self.fixed = 0.0
        self.infeasible = False

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state, the last forward's costs and the pending gradient."""
        return {"optimizer": self.optimizer.state_dict(),
                "costs": None if self.costs is None else [c.clone() for c in self.costs],
                "fixed": self.fixed, "infeasible": self.infeasible,
                "pending": [None if w.grad is None else w.grad.detach().clone()
                            for w in self.widths]}

    def load_state_dict(self, state: Any) -> None:
        """Go on from :meth:`state_dict`; checked whole before anything changes."""
        def fits(tensors: Any, optional: bool) -> bool:
            return isinstance(tensors, list | tuple) and len(tensors) == len(self.widths) \
                and all((optional and t is None) or (isinstance(t, Tensor)
                                                     and t.shape == w.shape)
                        for t, w in zip(tensors, self.widths, strict=False))
        if not isinstance(state, dict) or not isinstance(state.get("optimizer"), dict) \
                or not (state.get("costs") is None or fits(state["costs"], False)) \
                or not fits(state.get("pending"), True) \
                or not isinstance(state.get("fixed"), float | int):
            raise FxquantValueError(
                "QuantTraining.load_state_dict: its 'budget' entry does not fit this run's "
                f"{len(self.widths)} learned bit-width tables; is it the same model?")
        optimizer = torch.optim.Adam(self.widths, lr=0.01)
        try:
            optimizer.load_state_dict(state["optimizer"])
        except (KeyError, TypeError, ValueError) as e:
            raise FxquantValueError(f"QuantTraining.load_state_dict: its 'budget' entry does "
                                    f"not fit this run's learned bit-widths ({e})") from e
        self.optimizer = optimizer
        self.costs = None if state["costs"] is None else \
            [c.to(w.device) for c, w in zip(state["costs"], self.widths, strict=True)]
        self.fixed, self.infeasible = float(state["fixed"]), bool(state.get("infeasible"))
        for w, g in zip(self.widths, state["pending"], strict=True):
            w.grad = None if g is None else g.to(device=w.device, dtype=w.dtype).clone()

    def measure(self, model: nn.Module) -> None:
        """Each node's cost per bit and the fixed part of the last forward's count."""
        avg, values = average_bits(model)
        if not values:  # an empty batch costs nothing: the last batch's costs stay
            return
        grads = torch.autograd.grad(avg, self.widths, retain_graph=True, allow_unused=True)
        self.costs = [g.detach() if g is not None else torch.zeros_like(w)
                      for g, w in zip(grads, self.widths, strict=True)]
        learned = sum(float((c * self._rounded(w.detach(), r)).sum())
                      for c, w, r in zip(self.costs, self.widths, self.ranges, strict=True))
        self.fixed = float(avg.detach()) - learned

    @staticmethod
    def _rounded(width: Tensor, allowed: tuple[int, int]) -> Tensor:
        return width.clamp(*allowed).round()

    def count(self, shift: float = 0.0) -> float:
        """The counted average bits with every width lowered by ``shift``."""
        assert self.costs is not None
        return self.fixed + sum(float((c * self._rounded(w.detach() - shift, r)).sum())
                                for c, w, r in zip(self.costs, self.widths, self.ranges,
                                                   strict=True))

    def step(self, lr: float, budget: float | None) -> None:
        """Move the widths on their pending gradient (if any), then :meth:`project`."""
        if self.costs is None:  # nothing measured yet: no forward has run
            return
        if any(w.grad is not None for w in self.widths):
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        if budget is not None:
            self.project(budget)

    def project(self, budget: float) -> None:
        """Shift every width by one common amount (up or down) to the largest count within
        ``budget``, then clamp each to its range: bits a row's loss gradient gives up go to
        every other row, and the count never exceeds the budget. The count falls
        monotonically with the shift, so bisection finds it."""
        goal = budget - self.MARGIN
        # shifted by `low`, every width is at its ceiling; by `high`, at its floor (the
        # shift acts before the clamp, so widths pushed past a bound keep their order)
        low = min(float(w.min()) - hi for w, (_, hi) in zip(self.widths, self.ranges,
                                                             strict=True)) - 1.0
        high = max(float(w.max()) - lo for w, (lo, _) in zip(self.widths, self.ranges,
                                                             strict=True)) + 1.0
        if self.count(high) > goal:  # even every width at its floor is over the budget
            if not self.infeasible:
                warnings.warn(f"fxquant.recipes: the bit budget {budget:g} is below what the "
                              f"narrowest widths cost ({self.count(high):.3f} bits per value); "
                              "the widths stay at their floor", stacklevel=4)
            self.infeasible = True
        elif self.count(low) <= goal:  # every width at its ceiling fits
            high = low
        else:
            for _ in range(50):
                mid = (low + high) / 2
                low, high = (low, mid) if self.count(mid) <= goal else (mid, high)
        with torch.no_grad():
            for w, allowed in zip(self.widths, self.ranges, strict=True):
                w.sub_(high).clamp_(*allowed)


class _DeprecatedCommand:
    """``Recipe.command``, deprecated: a :class:`FutureWarning` at the caller's line, and
    an empty string (the library names no command line; the documentation's results list
    each recipe's command)."""

    def __get__(self, obj: object, owner: type | None = None) -> str:
        warnings.warn("Recipe.command is deprecated and will be removed in the next release; "
                      "it is an empty string now: the command that reproduces each recipe's "
                      "published numbers is listed with the results in the documentation",
                      FutureWarning, stacklevel=2)
        return ""


class Recipe:
    """Base class of the recipes: a frozen dataclass of the recipe's settings that builds
    a :class:`fxquant.QuantMapping` on a traced model and says what training does around
    it. Subclasses set :attr:`name` and implement :meth:`mapping`; :meth:`tie`
    and :meth:`training` are optional."""

    #: the name :func:`get` knows it by
    name: ClassVar[str] = ""
    #: deprecated, an empty string: the commands that reproduce the recipes' published
    #: numbers are listed with the results in the documentation
    command = _DeprecatedCommand()

    def __post_init__(self) -> None:
        """Every setting has the type its annotation names: a
        ``"False"`` given for a bool is an error, not ``True``. Subclasses check their
        ranges after calling this."""
        check_fields(self)

    def mapping(self, gm: GraphModule, data: Any = None) -> QuantMapping:
        """The mapping for the traced model ``gm`` (``data``: the graph, where the recipe
        needs it, e.g. for in-degrees)."""
        raise NotImplementedError

    def tie(self, gm: GraphModule) -> None:
        """Tie the transformed model's parameters (shared steps or bit-width tables)."""

    def training(self) -> dict[str, Any]:
        """Keyword arguments of :class:`QuantTraining`."""
        return {}

    def prepare(self, model: nn.Module, data: Any = None, *, lint: str = "warn"
                ) -> QuantTraining:
        """Trace ``model``, transform it with :meth:`mapping`, tie its parameters, and
        return the :class:`QuantTraining` to train it with. ``model`` is not changed.

        Args:
            model (torch.nn.Module): the unmodified model.
            data (optional): the graph (``edge_index``, ``num_nodes``, ``x``) for recipes
                that need it; in mini-batch training, the whole graph (global node ids).
            lint (str, optional): as :func:`fxquant.transform`. (default: ``"warn"``)
        """
        refuse_lazy(model, f"recipes.{type(self).__name__}.prepare")
        gm = model if isinstance(model, GraphModule) else trace(model)
        qgm = transform(gm, self.mapping(gm, data), lint=lint)
        self.tie(qgm)
        run = QuantTraining(qgm, **self.training())
        run.recipe = self
        return run



def unique(tensors: Iterable[Tensor]) -> list[Tensor]:
    seen: dict[int, Tensor] = {}
    for t in tensors:
        seen.setdefault(id(t), t)
    return list(seen.values())



def _tiny_graph() -> Data:
    """A 6-node graph for the docstring examples."""
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 2], [1, 2, 3, 4, 5, 0, 0, 0]])
    return Data(x=torch.full((6, 4), 0.25), edge_index=edge_index, num_nodes=6)
