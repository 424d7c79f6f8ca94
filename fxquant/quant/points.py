"""The module the pass inserts: one :class:`QuantPoint` per quantization point.

A point holds its :class:`~fxquant.quant.config.QuantConfig`, the observer that gives a
range (if any), a learned step (``range="lsq"``) and the node ids of a per-node
override, and calls one registered op (``torch.ops.fxquant.truncate`` or ``quantize``) in
``forward``. Being a module, it is visible in ``print(gm)``, follows ``.to()``, keeps its
state in ``state_dict``, survives pickling with its config, and torch.compile inlines it
(the op's decomposition fuses with its neighbours).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn

from fxquant._ops.calls import OpCall, op_call
from fxquant._ops.quantize import int_scale
from fxquant._ops.version import NUMERICS
from fxquant.errors import FxquantIndexError, FxquantTypeError, FxquantValueError
from fxquant.formats import IntFormat, TopN
from fxquant.fx.degree import in_degree
from fxquant.modes import Grad, Rounding
from fxquant.quant._last import LastInput
from fxquant.quant._probe import PROBING
from fxquant.quant.config import NodeOverride, Number, QuantConfig, Site, describe_nodes
from fxquant.quant.lsq import lsq_round, lsq_round_features, lsq_round_stochastic
from fxquant.quant.nodes import LayerMasks, NodeIds, lookup
from fxquant.quant.observers import RangeObserver

__all__ = ["QuantPoint", "refit_steps", "share_bits", "share_step"]

#: values (a strided sample) and candidate steps the learned step starts from
INIT_SAMPLE = 1 << 16
INIT_CANDIDATES = 64


class _ClampInward(torch.autograd.Function):
    """``x.clamp(lo, hi)`` whose gradient also reaches values outside the range, but only
    where a descent step moves them back in. A learned bit-width that an optimizer's
    momentum carried below ``min_bits`` would get no gradient from a plain clamp and stay
    at ``min_bits`` for good, whatever the penalty or the loss say; a straight-through
    clamp would let it drift further out on gradients that cannot change the forward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, lo: float, hi: float) -> Tensor:
        ctx.save_for_backward(x)
        ctx.lo, ctx.hi = lo, hi
        return x.clamp(lo, hi)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (x,) = ctx.saved_tensors
        back = x.clamp(ctx.lo, ctx.hi) - x  # 0 inside the range (NaN for NaN x)
        inward = (back == 0) | (back * grad < 0)  # (a descent step moves x by -grad)
        return torch.where(inward, grad, 0.0), None, None


class _FiniteGrad(torch.autograd.Function):
    """The identity, whose gradient is 0 where it is not finite: a learned step's
    gradient summed over values of which one was NaN is NaN, and would make the step NaN
    for good."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return torch.where(torch.isfinite(grad), grad, torch.zeros_like(grad))


def _table(nodes: Tensor | None, max_index: int | None) -> Tensor | None:
    """A bool table over global node ids: True where the override (of ``nodes``: a mask,
    or ids up to ``max_index``) applies."""
    if nodes is None:
        return None
    if nodes.dtype == torch.bool:
        return nodes.clone()
    size = (max_index + 1) if max_index is not None else 0
    return torch.zeros(size, dtype=torch.bool, device=nodes.device).index_fill(0, nodes, True)


def _log_step_range(dtype: torch.dtype, top: float) -> tuple[float, float]:
    """The ``log`` of the smallest and largest step a grid whose largest level is ``top``
    may have on values of ``dtype``: steps stay positive (a step of 0 makes ``0 / s``
    NaN) and ``s * top`` finite (an infinite step makes ``inf * 0`` NaN), whatever an
    optimizer does to ``log_step``."""
    info = torch.finfo(dtype if dtype.is_floating_point else torch.float32)
    return math.log(info.tiny), math.log(info.max) - math.log(top + 1.0)


def _code_range(bits: Any, number: IntFormat) -> tuple[Any, Any]:
    """``(qmin, qmax)`` of a ``bits``-bit grid of ``number``'s kind (a float, or a tensor of
    per-row bits): symmetric ``{-1, 0, 1}`` at 2 bits, mid-rise codes ``-2..1`` (levels
    ``-1.5..1.5``), unsigned ``0..3``."""
    qmax = 2 ** (bits - 1) - 1 if number.signed else 2 ** bits - 1
    qmin = (-qmax - 1 if number.midrise else -qmax) if number.signed else qmax * 0
    return qmin, qmax


#: :func:`_row_magnitudes` of the last input that needs no gradient (a dataset's features
#: are the same tensor every step); the key is ``finite_only``
_ROWS: LastInput[Tensor] = LastInput()


def _input_row_magnitudes(x: Tensor, finite_only: bool, keep: bool = True) -> Tensor:
    """:func:`_row_magnitudes` of ``x``, kept for the next calls while ``x`` is unchanged
    (eager, no gradient, ``keep``: an input site's, a dataset's features every step); the
    result is shared between calls and never written to."""
    if torch.compiler.is_compiling() or x.requires_grad or not keep:
        return _row_magnitudes(x.detach(), finite_only)
    return _ROWS.get(x, finite_only, lambda: _row_magnitudes(x, finite_only))


def _row_magnitudes(x: Tensor, finite_only: bool) -> Tensor:
    """``max |value|`` of each row of ``x`` (each value of a 1-d ``x``); with
    ``finite_only``, of its finite values (``-inf`` for a row with none)."""
    if x.dim() > 1 and x.numel() and x.shape[1:].numel():
        flat = x.flatten(1)  # |x| first for short rows, no |x| temporary for long ones
        rows = flat.abs().amax(1) if flat.shape[1] <= 32 else \
            torch.maximum(flat.amax(1), flat.amin(1).neg_())  # (each ~2x the other there)
        if not finite_only or (not torch.compiler.is_compiling()
                               and bool(torch.isfinite(rows).all())):
            return rows
    magnitude = x.abs()  # (with a NaN or an infinity: the finite values only)
    if finite_only:
        magnitude = magnitude.nan_to_num_(nan=-math.inf, posinf=-math.inf)
    return magnitude.flatten(1).amax(1) if x.dim() > 1 else magnitude


def _spec(number: Number | None) -> str:
    return "" if number is None else number.spec()


class QuantPoint(nn.Module):
    """Rounds what flows through it as its config says; the gradient follows ``config.grad``.

    Args:
        config (QuantConfig): number, rounding, scale and range, gradient rule.
        layer (str): the layer it serves (for messages and the summary).
        site (Site or str, optional): where on the layer. (default: ``"output"``)
        override (NodeOverride, optional): nodes whose rows get another number.
        tensor (str, optional): which tensor of the layer (a weight's name).

    With ``range="lsq"`` the step ``s`` is learned (LSQ, Esser et al., ICLR 2020): set on
    the first training batch to the step that rounds it with the least error (see
    ``_init_step``; again on the next training batch after :func:`refit_steps`), then
    learned with the LSQ gradient (scaled by ``1 / sqrt(numel * qmax)``); values are
    ``s * round(clamp(x / s, qmin, qmax))`` (:func:`~fxquant.quant.lsq.lsq_round`), whose
    gradient is straight-through inside the range and zero outside. The step is fitted
    from the batch's finite values; a batch with none leaves it to the next training batch
    (under ``torch.compile``, which cannot branch on it, the next ``model.train()``,
    :func:`refit_steps` or :meth:`~fxquant.recipes.QuantTraining.start_epoch` arranges
    that, and ``model.eval()`` warns that the step is still unfitted).
    The parameter is ``log_step`` (``s = exp(log_step)``, always positive): an adaptive
    optimizer moves a parameter by about its learning rate per step whatever its size, so
    on ``s`` itself Adam's ``lr=0.01`` moved steps of ~0.01 by their own size each
    iteration and flipped their sign (a GCN on Cora with 2-bit messages: 66% test
    accuracy, against 78% with a 10x smaller step learning rate); in the log domain the
    same ``lr`` is a ~1% change.

    Example:
        >>> point = QuantPoint(QuantConfig(9), "conv1")
        >>> point
        QuantPoint(output of 'conv1': top9, toward_zero, ste)
        >>> point(torch.tensor([3.0, -0.7]))
        tensor([ 2.0000, -0.5000])
    """

    override_nodes: Tensor | None
    override_table: Tensor | None
    row_bits_table: Tensor | None
    seen_range: Tensor | None
    step_found: Tensor | None
    step_is_fitted: Tensor | None
    #: a point unpickled from before this flag existed is taken as fitted, as it was then
    step_fitted: bool = True

    def __init__(self, config: QuantConfig, layer: str, site: Site | str = Site.OUTPUT,
                 override: NodeOverride | None = None, tensor: str = "") -> None:
        super().__init__()
        self.config = config
        self.layer = layer
        self.site = Site.parse(site)
        self.tensor = tensor
        self.observer = None
        protect = config.protect
        if config.momentum is not None or config.percentile is not None \
                or config.observe == "widen" or config.grad is Grad.CLIPPED \
                or (protect is not None and protect.ranges == "unprotected"):
            self.observer = RangeObserver(config.scale.per_row, config.momentum,
                                          config.percentile, widen=config.observe == "widen")
        self.log_step: nn.Parameter | None = None
        self.step_ready = False
        self.refit_widens = False  # the next fit keeps at least the current step
        #: a step has been fitted (or loaded): ``refit_widens`` compares against it; before
        #: that ``log_step`` holds a placeholder, not a fitted step
        self.step_fitted = False
        #: training forwards pass values through unrounded (a float warm-up,
        #: ``QuantTraining(float_epochs=...)``); evaluation rounds as ever
        self.float_training = False
        self.__dict__["step_source"] = None  # the point whose step this one uses
        self.__dict__["bits_source"] = None  # the point whose bit-width table this one uses
        if config.range == "lsq":
            self.log_step = nn.Parameter(torch.zeros(()))
        #: whether the last fit found a finite value (written by compiled fits, which
        #: cannot branch on it; :meth:`_settle_fit` reads it in eager code)
        self.register_buffer("step_found", torch.ones(()) if config.range == "lsq" else None,
                             persistent=False)
        #: whether the learned step is fitted, as saved in the state dict (written when it
        #: is saved; ``step_fitted`` is the flag): a step saved before its first training
        #: batch is a placeholder, which the first training batch after loading fits
        self.register_buffer("step_is_fitted",
                             torch.zeros(()) if config.range == "lsq" else None)
        self.override_number: Number | None = override.format if override is not None else None
        self.override_max_index = override.max_index if override is not None else None
        self.register_buffer("override_nodes",
                             override.nodes.clone() if override is not None else None)
        # The override as a bool table over global node ids (derived: not saved).
        self.register_buffer("override_table", _table(
            override.nodes if override is not None else None, self.override_max_index),
            persistent=False)
        self.__dict__["_node_ids"] = None  # the GraphModule's NodeIds, shared by all points
        self.__dict__["_masks"] = None  # the GraphModule's LayerMasks (share="layer")
        rb = config.node_bits
        self.row_bits: nn.Parameter | None = None
        self.register_buffer("row_bits_table", None)
        self.register_buffer("seen_range", None)
        if rb is not None:
            if rb.learned:
                self.row_bits = nn.Parameter(rb.bits.clone())
                # max |value| of each node's rows in training (+inf: never seen)
                self.register_buffer("seen_range", torch.full((rb.num_nodes,), -math.inf))
            else:
                self.register_buffer("row_bits_table", rb.bits.clone())
        #: bits of each row in the last forward (with the values per row), for the bit
        #: report and :func:`fxquant.bit_penalty`; not state
        self.__dict__["last_row_bits"] = None
        self.__dict__["last_rows"] = None
        self.__dict__["raw_input"] = False  # rounds the model's own input (set by the pass)
        self._op, self._args = self._op_arguments()

    #: what the last forward did (for the bit report and the penalty), not state: a copy
    #: starts without it (the bit-widths hold the autograd graph of that forward, which
    #: ``copy.deepcopy`` refuses to copy and pickling would carry along)
    _TRANSIENT = ("last_row_bits", "last_rows")

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        for key in self._TRANSIENT:
            state[key] = None
        return state

    def attach(self, context: NodeIds) -> None:
        """Read the global node ids of each forward's rows from ``context`` (see
        :mod:`fxquant.quant.nodes`); a reference, not a submodule."""
        self.__dict__["_node_ids"] = context

    def attach_masks(self, context: LayerMasks) -> None:
        """Share the layer's protective mask through ``context`` (``Protection(share=
        "layer")``); a reference, not a submodule."""
        self.__dict__["_masks"] = context

    @property
    def needs_nodes(self) -> bool:
        """Whether rounding depends on which node a row belongs to (protection, overrides,
        per-node bits)."""
        return self.config.protect is not None or self.uses_node_ids

    @property
    def uses_node_ids(self) -> bool:
        """Whether per-node settings are keyed by global node id (``node_ids=``)."""
        return self.override_table is not None or self.config.node_bits is not None

    @property
    def name(self) -> str:
        """``"output of 'conv1'"``, ``"weight 'lin.weight' of 'conv1'"``: how messages
        refer to this point."""
        what = f"{self.site.value} {self.tensor!r}" if self.tensor else self.site.value
        return f"{what} of {self.layer!r}"

    def _op_arguments(self) -> tuple[str, dict[str, Any]]:
        """Which op, and its constant keyword arguments (computed once)."""
        c, extra = self.config, self.override_number
        args: dict[str, Any] = {"rounding": c.rounding.value}
        if c.op == "truncate" and (extra is None or isinstance(extra, TopN)):
            assert isinstance(c.format, TopN)
            args.update(bits=c.format.bits, grad=c.grad.value, name=self.name)
            if extra is not None:
                args["override_bits"] = extra.bits
            if c.grad_format is not None:
                args["grad_bits"] = c.grad_format.bits
            return "truncate", args
        scale = "none" if c.range == "lsq" else c.scale.value
        grad = Grad.STE.value if c.grad is Grad.CLIPPED else c.grad.value  # see _round
        args.update(format=c.format.spec(), scale=scale, grad=grad,
                    override_format=_spec(extra), grad_format=_spec(c.grad_format), name=self.name)
        return "quantize", args

    def op_call(self) -> OpCall:
        """The op this point calls and its arguments (what the linters read)."""
        overload = getattr(torch.ops.fxquant, self._op).default
        call = op_call(overload, (None,), self._args)
        assert call is not None
        return call

    def forward(self, x: Tensor, edge_index: Tensor | None = None, *,
                node_degree: Tensor | None = None, row_nodes: Tensor | None = None,
                row_sources: Tensor | None = None) -> Tensor:
        """Round ``x``. Rows are nodes, unless ``row_nodes`` gives each row's node (the target
        of a message; ``row_sources`` its source, for ``Protection(messages="source")``);
        degrees (for protection) come from ``node_degree`` or from the layer's
        ``edge_index`` (in-degree, ``edge_index[1]``)."""
        if not isinstance(x, Tensor):
            why = ("the layer returns several values (as GATConv(return_attention_weights="
                   "True) returns (out, (edge_index, alpha)))" if self.site is Site.OUTPUT else
                   "the layer's argument is a sequence the trace does not see into"
                   if self.site is Site.INPUT else "the layer hands it several values")
            raise FxquantTypeError(
                f"fxquant: the {self.name} received a {type(x).__name__}, not a tensor: {why}, "
                "and a quantization point rounds one tensor. Please leave this site out "
                f"(QuantMapping().set_name({self.layer!r}, None"
                f"{'' if self.site is Site.OUTPUT else ', site=' + repr(self.site.value)}), "
                "or layers= without it) and round another site of the layer")
        if self.float_training and self.training:
            return x
        if self.site is Site.INPUT and not x.is_floating_point():
            self.__dict__["last_rows"] = "passthrough"  # nothing rounded, nothing counted
            return x  # an input site passes integer inputs (indices, masks) through
        if self.log_step is not None and not self.training and not self.float_training \
                and not torch.compiler.is_compiling():
            self._warn_unfitted()
        num_nodes = x.shape[0] if x.dim() else 1
        if node_degree is None and edge_index is not None and self.config.protect is not None:
            node_degree = in_degree(edge_index, num_nodes)
        if node_degree is not None:
            num_nodes = node_degree.shape[0]
        context = self.__dict__["_node_ids"]
        ids = context.ids if context is not None and self.uses_node_ids else None
        if ids is not None and ids.shape[0] != num_nodes:
            raise FxquantValueError(
                f"fxquant: node_ids has {ids.shape[0]} entries, but the {self.name} has "
                f"{num_nodes} nodes; pass one global id per node of the batch (batch.n_id)")
        rows = None if self.override_table is None else self._rows(x, num_nodes, row_nodes, ids)
        # what the last forward rounded, for fxquant.bit_report / bit_penalty (not state)
        self.__dict__["last_rows"] = (x.shape[0] if x.dim() else 1,
                                      math.prod(x.shape[1:]) if x.dim() else 1, num_nodes, rows)
        keep = None
        protect = self.config.protect
        if protect is not None and self.training:
            keep = self._node_mask(node_degree)
            if keep is not None:
                by = row_sources if protect.messages == "source" and row_sources is not None \
                    else row_nodes
                if by is not None:
                    keep = keep[by]
                if keep.shape[0] != (x.shape[0] if x.dim() else 1):
                    raise FxquantValueError(
                        f"fxquant: the protective mask of layer {self.layer!r} has "
                        f"{keep.shape[0]} rows, but its {self.name} has "
                        f"{x.shape[0] if x.dim() else 1}; Protection(share='layer') needs "
                        "every point of the layer to have a row per node of its graph (or "
                        "per edge)")
        if self.config.node_bits is not None:
            y = self._round_row_bits(x, num_nodes, row_nodes, ids)
        else:
            unprotected = protect is not None and protect.ranges == "unprotected"
            y = self._round(x, rows, keep if unprotected else None)
        calls = self.__dict__.get("calls")
        if calls is not None:  # every call of fxquant.bit_report's forward is counted
            calls.append((self.__dict__["last_rows"], self.__dict__["last_row_bits"]))
        if keep is not None:
            if torch.compiler.is_compiling() or x.dim() == 0:  # fused by inductor
                y = torch.where(keep.view((-1,) + (1,) * (x.dim() - 1)), x, y)
            else:  # eager: copy the kept rows (a `where` with a per-row mask is slow here)
                kept = keep.nonzero().squeeze(1)
                y = y.index_copy_(0, kept, x.index_select(0, kept))  # y is our fresh output
        return y

    def _round(self, x: Tensor, rows: Tensor | None, exclude: Tensor | None = None) -> Tensor:
        if self._op == "truncate":
            return torch.ops.fxquant.truncate.default(x, override_rows=rows, numerics=NUMERICS, **self._args)
        if self.log_step is not None:
            return self._lsq(x, rows)
        bounds = self.observer(x, exclude) if self.observer is not None else None
        y = torch.ops.fxquant.quantize.default(x, bounds=bounds, override_rows=rows, numerics=NUMERICS,
                                               **self._args)
        if self.config.grad is Grad.CLIPPED and bounds is not None and x.requires_grad:
            y = torch.where(self._clipped(x.detach(), bounds), y.detach(), y)
        return y

    def _clipped(self, x: Tensor, bounds: Tensor) -> Tensor:
        """Where ``x`` rounds to the grid's first or last code or beyond (``grad="clipped"``)."""
        number = self.config.format
        assert isinstance(number, IntFormat)
        scale, zero_point = int_scale(bounds.to(torch.float32), number, self.config.scale)
        per_row = self.config.scale.per_row and x.dim() > 0
        shape = (-1,) + (1,) * (x.dim() - 1)
        codes = torch.round(x / (scale.view(shape) if per_row else scale) - number.offset)
        if zero_point is not None:
            codes = codes + (zero_point.view(shape) if per_row else zero_point)
        return (codes <= number.qmin) | (codes >= number.qmax)

    @property
    def has_mask(self) -> bool:
        """Whether this forward's shared layer mask is drawn already (``share="layer"``)."""
        masks = self.__dict__["_masks"]
        return masks is not None and self.layer in masks.masks

    def _node_mask(self, degree: Tensor | None) -> Tensor | None:
        """The protective mask over the layer's nodes for this forward: the layer's shared
        draw (``share="layer"``: drawn by its first point) or a draw of its own; None
        where this point knows no degrees and no draw was shared."""
        protect = self.config.protect
        assert protect is not None
        masks = self.__dict__["_masks"]
        if protect.share == "layer" and masks is not None:
            mask = masks.masks.get(self.layer)
            if mask is None and degree is not None:
                mask = self._protected(degree)
                masks.masks[self.layer] = mask
            return mask
        return None if degree is None else self._protected(degree)

    def _protected(self, degree: Tensor) -> Tensor:
        """Degree-Quant's protective mask: node ``i`` stays at full precision with probability
        ``p_min + (p_max - p_min) * F(deg_i)``, ``F`` the fraction of nodes whose in-degree
        is at most ``deg_i`` (so the probability grows with in-degree)."""
        assert self.config.protect is not None
        p_min, p_max = self.config.protect
        ordered = torch.sort(degree).values
        rank = torch.searchsorted(ordered, degree, right=True).to(torch.float32)
        p = p_min + (p_max - p_min) * rank / max(degree.numel(), 1)
        return torch.bernoulli(p).to(torch.bool)

    @property
    def _fits_step(self) -> bool:
        """Whether this forward fits the learned step: the first training batch (or the
        next after :func:`refit_steps`) of a point that owns its step."""
        return self.training and not self.step_ready \
            and self.__dict__.get("step_source") is None

    def _lsq(self, x: Tensor, rows: Tensor | None) -> Tensor:
        """``s * round(clamp(x / s, qmin, qmax))`` with LSQ's gradients."""
        number = self.config.format
        assert isinstance(number, IntFormat) and self.log_step is not None
        if self._fits_step:
            self._init_step(x, number.qmin, number.qmax, number.offset)
        gain = 1.0 / math.sqrt(max(x.numel(), 1) * number.max_finite)
        c = self.config
        if rows is None and c.rounding is Rounding.NEAREST and c.grad is Grad.STE \
                and c.grad_format is None:  # the common case: one fused function
            return self._lsq_round(x, self._step(x.dtype, self._top()), number.qmin,
                                   number.qmax, gain, number.offset)
        s = self._scaled_step(gain, x.dtype, self._top())
        y = torch.clamp(x / s, number.level(number.qmin), number.max_finite)
        codes = torch.ops.fxquant.quantize.default(y, override_rows=rows, numerics=NUMERICS, **self._args)
        return codes * s

    def _lsq_round(self, x: Tensor, s: Tensor, qmin: Tensor | float, qmax: Tensor | float,
                   gain: float, offset: float) -> Tensor:
        """:func:`~fxquant.quant.lsq.lsq_round`; at an input site on a grid with zero, its
        form for features (a dataset's mostly-zero features then give the step its
        gradient without a dense product in the layer's linear transform)."""
        if self.site is Site.INPUT and not offset:
            return lsq_round_features(x, s, qmin, qmax, gain)
        return lsq_round(x, s, qmin, qmax, gain, offset)

    def _node_bits(self, x: Tensor, num_nodes: int, row_nodes: Tensor | None,
                   ids: Tensor | None) -> Tensor:
        """Each row's bit-width (a float tensor, straight-through rounded when learned)."""
        rb = self.config.node_bits
        assert rb is not None
        fits = self.seen_range is not None and self.training
        rows_range = _input_row_magnitudes(x, finite_only=fits, keep=self.site is Site.INPUT)
        if row_nodes is not None:  # per node: the max over its rows (its messages)
            empty = -math.inf if fits else 0.0  # a node without (finite) messages: unseen
            node_range = torch.full((num_nodes,), empty, dtype=rows_range.dtype,
                                    device=x.device)
            node_range = node_range.scatter_reduce(0, row_nodes, rows_range, "amax")
        else:
            node_range = rows_range
        if self.row_bits is None:
            assert self.row_bits_table is not None
            table = self.row_bits_table
        else:
            table = self.row_bits
        # every node of the table in order (a full batch, eager): no lookups by id
        full = ids is None and num_nodes == table.shape[0] and not torch.compiler.is_compiling()
        nodes = ids if ids is not None else torch.arange(num_nodes, device=x.device)
        known = None if full else (nodes >= 0) & (nodes < table.shape[0])
        if self.seen_range is not None:
            if self.training:
                with torch.no_grad():  # the largest range each node has shown (-inf: unseen)
                    seen = self.seen_range
                    if known is None:
                        torch.maximum(seen, node_range.to(seen.dtype), out=seen)
                    else:
                        seen.scatter_reduce_(0, torch.where(known, nodes, 0), torch.where(
                            known, node_range.to(seen.dtype), -math.inf), "amax")
                    if dist.is_available() and dist.is_initialized() \
                            and dist.get_world_size() > 1:  # every rank knows every node
                        dist.all_reduce(seen, op=dist.ReduceOp.MAX)
            elif known is None:
                known = torch.isfinite(self.seen_range)
            else:
                known = known & torch.isfinite(lookup(self.seen_range, nodes))
        bits = table if full else lookup(table, nodes)
        if known is not None and (torch.compiler.is_compiling() or not bool(known.all())):
            bits = torch.where(known, bits, self._nearest_seen(node_range, table))
        if self.row_bits is not None:
            bits = _ClampInward.apply(bits, rb.min_bits, rb.max_bits)
            bits = bits + (bits.round() - bits).detach()  # straight-through rounding
        else:
            bits = bits.clamp(rb.min_bits, rb.max_bits)
        return bits if row_nodes is None else bits[row_nodes]

    @staticmethod
    def _lsq_gain(x: Tensor, qmax: Tensor, offset: float) -> float:
        """LSQ's step-gradient scale ``1 / sqrt(numel * levels)`` for per-row levels (their
        mean). While compiling it stays a 0-dim tensor (``float()`` of a tensor would break
        the graph), which the rounding functions take there as they take a symbolic size."""
        if not qmax.numel():
            return 1.0 / math.sqrt(max(x.numel(), 1))
        levels = (qmax.detach() + offset).mean()
        if torch.compiler.is_compiling():
            return cast(float, torch.rsqrt(levels.to(torch.float32) * max(x.numel(), 1)))
        return 1.0 / math.sqrt(max(x.numel(), 1) * float(levels))

    def _nearest_seen(self, node_range: Tensor, table: Tensor) -> Tensor:
        """The bits of the seen node whose range is nearest each row's (A2Q's rule for
        unseen nodes); the table's mean where nothing was seen or recorded."""
        seen = self.seen_range
        if seen is None:
            rb = self.config.node_bits
            assert rb is not None
            if not table.numel():
                return torch.full_like(node_range, float(rb.max_bits))
            # a tensor, not float(): no host sync, and no graph break under torch.compile
            return table.detach().mean().to(node_range.dtype).expand_as(node_range)
        order = torch.sort(seen)  # unseen nodes (-inf) first, then the seen ones
        count = torch.isfinite(seen).sum()
        first = seen.shape[0] - count
        pos = torch.searchsorted(order.values, node_range.to(seen.dtype).contiguous())
        hi = torch.minimum(torch.maximum(pos, first), torch.full_like(pos, seen.shape[0] - 1))
        lo = torch.minimum(torch.maximum(hi - 1, first), hi)  # in range when nothing was seen
        closer_lo = (node_range - order.values[lo]).abs() < (order.values[hi] - node_range).abs()
        pick = torch.where(closer_lo, lo, hi)
        fallback = table.detach().mean()
        return torch.where(count > 0, table[order.indices[pick]], fallback)

    def _round_row_bits(self, x: Tensor, num_nodes: int, row_nodes: Tensor | None,
                        ids: Tensor | None) -> Tensor:
        """Each row on its own integer grid (see :class:`~fxquant.quant.config.NodeBits`)."""
        number = self.config.format
        assert isinstance(number, IntFormat)
        bits = self._node_bits(x, num_nodes, row_nodes, ids).to(x.dtype)
        qmin, qmax = _code_range(bits, number)
        shape = (-1,) + (1,) * (x.dim() - 1)
        qmax, qmin = qmax.view(shape), qmin.view(shape)
        self.__dict__["last_row_bits"] = (bits, math.prod(x.shape[1:]) if x.dim() else 1)
        if self.log_step is not None:  # one learned step; bits set each row's range
            if self._fits_step:  # the start, at the mean bits
                rb = self.config.node_bits
                assert rb is not None  # (the same on every rank: parameters are broadcast)
                table = self.row_bits if self.row_bits is not None else self.row_bits_table
                assert table is not None
                mean = table.detach().mean().clamp(rb.min_bits, rb.max_bits)
                # compiled code keeps it a tensor (a float would need a data-dependent guard)
                mean_bits = mean if torch.compiler.is_compiling() else float(mean)
                lo, hi = _code_range(mean_bits, number)
                self._init_step(x, lo, hi, number.offset)
            gain = self._lsq_gain(x, qmax, number.offset)
            if self.config.rounding is Rounding.STOCHASTIC:
                return lsq_round_stochastic(x, self._step(x.dtype, self._top()), qmin, qmax,
                                            gain, number.offset)
            return self._lsq_round(x, self._step(x.dtype, self._top()), qmin, qmax, gain,
                                   number.offset).to(x.dtype)
        # the finite values' magnitudes: an infinity or a NaN must not make the step
        # infinite or NaN, which would turn every finite value of its row (or tensor) NaN
        if not x.numel():
            bounds = x.new_zeros(())
        elif self.config.scale.per_row:
            bounds = _row_magnitudes(x.detach(), finite_only=True).clamp(min=0).view(shape)
        else:
            bounds = self.observer(x) if self.observer is not None else \
                _row_magnitudes(x.detach().reshape(1, -1), finite_only=True).clamp(min=0)[0]
            if bounds.dim() and bounds.numel() == 2:
                bounds = bounds.abs().amax()
        step = (bounds.to(x.dtype) / (qmax + number.offset)).clamp(min=torch.finfo(x.dtype).tiny)
        if self.config.rounding is Rounding.STOCHASTIC:
            return lsq_round_stochastic(x, step, qmin, qmax, offset=number.offset)
        return lsq_round(x, step, qmin, qmax, offset=number.offset).to(x.dtype)

    @property
    def step(self) -> Tensor | None:
        """The learned step ``exp(log_step)`` (``range="lsq"``), kept finite and positive
        (see :meth:`_step`), else None."""
        if self.log_step is None:
            return None
        return self._step(torch.float32, self._top())

    def _top(self) -> float:
        """The largest level of this point's grid (at ``max_bits`` with per-node bits)."""
        number = self.config.format
        assert isinstance(number, IntFormat)
        rb = self.config.node_bits
        if rb is None:
            return float(number.max_finite)
        return float(_code_range(float(rb.max_bits), number)[1]) + number.offset

    def _step(self, dtype: torch.dtype, top: float) -> Tensor:
        """``exp(log_step)``, clamped to the steps a grid whose largest level is ``top``
        may have on ``dtype`` values (positive, ``s * top`` finite). The gradient reaches
        ``log_step`` outside that range where a descent step moves it back in (a huge
        learning rate must not leave it stuck)."""
        assert self.log_step is not None
        lo, hi = _log_step_range(dtype, top)
        return _ClampInward.apply(self.log_step, lo, hi).exp()

    def _scaled_step(self, gain: float, dtype: torch.dtype, top: float) -> Tensor:
        """The step, whose gradient is LSQ's scaled by ``gain`` (its value is unchanged)
        and counts no non-finite value (a NaN among the values would make it NaN)."""
        s = _FiniteGrad.apply(self._step(dtype, top))
        return (s - s * gain).detach() + s * gain

    def _init_step(self, x: Tensor, qmin: float | Tensor, qmax: float | Tensor,
                   offset: float = 0.0) -> None:
        """The starting step: the one of :data:`INIT_CANDIDATES` geometric candidates (from
        ``max|x| / 1000`` to ``max|x|``) whose grid rounds this batch with the least squared
        error, on a strided sample of at most :data:`INIT_SAMPLE` values. LSQ's own start,
        ``2 mean|x| / sqrt(qmax)``, is ``2 mean|x|`` on a 2-bit grid: it rounds most values
        to zero, and a layer's output rounded to zero before a ReLU passes no gradient (a
        GCN on Cora with 2-bit aggregation and output stayed at chance). Under DDP the
        errors are summed over ranks first, so every rank starts from the same step.
        ``offset`` is the grid's (:attr:`~fxquant.formats.IntFormat.offset`)."""
        assert self.log_step is not None
        with torch.no_grad():
            v = x.detach().flatten().to(torch.float32)
            # a strided sample (stride 1: all of them); no branch on the size, which
            # compiled code may only know from the data (messages after PyG's self-loops)
            v = v[:: torch.sym_max(1, -(-v.numel() // INIT_SAMPLE))]
            finite = torch.isfinite(v)  # fitted from the finite values only
            v = torch.where(finite, v, 0.0)
            amax = torch.cat([v.new_zeros(1), v.abs()]).amax()  # 0 for an empty batch
            # (an all-zero batch says nothing of the scale either: the next batch fits it)
            found = (finite & (v != 0)).any().to(torch.float32)
            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                both = torch.stack([amax, found])
                dist.all_reduce(both, op=dist.ReduceOp.MAX)
                amax, found = both[0], both[1]
            amax = torch.where(amax > 0, amax, torch.ones_like(amax))
            steps = amax * torch.logspace(-3, 0, INIT_CANDIDATES, device=v.device)
            codes = torch.clamp(torch.round(v[None, :] / steps[:, None] - offset),
                                cast(Any, qmin), cast(Any, qmax))
            error = (((codes + offset) * steps[:, None] - v[None, :]).square()
                     * finite[None, :]).sum(1)
            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                dist.all_reduce(error, op=dist.ReduceOp.SUM)
            # index_select, not steps[argmin]: traceable without a data-dependent index
            best = steps.index_select(0, torch.argmin(error).reshape(1)).reshape(())
            # (a grid given by tensors, from a mean of per-node bits while compiling: the
            # widest grid's range, which the step is clamped to anyway (:meth:`_step`))
            top = self._top() if isinstance(qmin, Tensor) or isinstance(qmax, Tensor) \
                else float(max(abs(qmin), abs(qmax))) + abs(offset)
            lo, hi = _log_step_range(x.dtype, top)
            fitted = best.clamp(min=1e-8).log().clamp(lo, hi).to(self.log_step.dtype)
            if self.refit_widens and self.step_fitted:  # never a narrower grid than the
                fitted = torch.maximum(fitted, self.log_step)  # last fitted or learned one
            # a batch without a finite nonzero value leaves the step as it was
            fitted = torch.where(found > 0, fitted, self.log_step)
            if torch.compiler.is_compiling():
                self.log_step.copy_(fitted)
            else:  # an earlier call of this forward rounded values the step does not
                # change (an empty or all-zero part of a bipartite input, through one
                # point): written without a version bump, its backward stays valid
                self.log_step.data.copy_(fitted)
        # ... and is fitted on the next batch. Compiled code cannot branch on that: it
        # records what it found, and eager code settles the flags (:meth:`_settle_fit`;
        # they are neither read nor set here, which would add guards and recompiles)
        if torch.compiler.is_compiling():
            assert self.step_found is not None
            self.step_found.copy_(found)
            self._unsettled = True
            self.step_ready = True
        elif bool(found > 0):
            self._fitted()
        else:
            self.step_ready = False

    def _fitted(self) -> None:
        self.step_ready = True
        self.refit_widens = False
        self.step_fitted = True

    def _settle_fit(self, evaluating: bool = False) -> None:
        """After a compiled fit, in eager code: a fit that found values is done; one whose
        batch held no finite nonzero value left the step as it was, which the next training
        batch fits (as in eager code). Runs when the mode is set (``model.train()``,
        ``model.eval()``: with a warning, as evaluation would use the unfitted step), at
        :func:`refit_steps` and at :meth:`~fxquant.recipes.QuantTraining.start_epoch`."""
        if torch.compiler.is_compiling() or not self.__dict__.pop("_unsettled", False):
            return
        assert self.step_found is not None  # (only a learned step's fit is unsettled)
        if bool(self.step_found > 0):
            self._fitted()
            return
        self.step_ready = False
        if evaluating and not self.__dict__.get("_warned_unfitted"):
            self.__dict__["_warned_unfitted"] = True
            warnings.warn(f"{self!r}: the training batch that fitted its learned step held no "
                          "finite nonzero value, so the step is still its placeholder (1); "
                          "evaluation rounds with it. Please run a training batch with finite, "
                          "nonzero values first (it fits the step).", stacklevel=3)

    def _warn_unfitted(self) -> None:
        """Evaluation with a learned step that no training batch has fitted rounds with its
        placeholder (1): say so, once per point (a point sharing another's step leaves it
        to that one; :func:`fxquant.bit_report` and :func:`fxquant.summary` count what it
        rounds, and do not)."""
        if self.__dict__.get("step_source") is not None \
                or self.__dict__.get("_warned_unfitted") or PROBING.get():
            return
        self._settle_fit()
        if self._has_step():
            return
        self.__dict__["_warned_unfitted"] = True
        warnings.warn(f"{self!r}: evaluating with a learned step (range='lsq') that no training "
                      "batch has fitted: it rounds with the placeholder step 1. Please run a "
                      "training forward (model.train(), a batch with finite, nonzero values) "
                      "first; it fits the step.", stacklevel=4)

    def train(self, mode: bool = True) -> QuantPoint:
        self._settle_fit(evaluating=not mode)
        return super().train(mode)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if "step_found" not in self._buffers:  # pickled before the buffer existed
            found = torch.ones((), device=self.log_step.device) \
                if self.log_step is not None else None
            self.register_buffer("step_found", found, persistent=False)
        if "step_is_fitted" not in self._buffers:  # (likewise)
            flag = torch.ones((), device=self.log_step.device) \
                if self.log_step is not None else None
            self.register_buffer("step_is_fitted", flag)

    def _has_step(self) -> bool:
        """Whether ``log_step`` holds a step rather than its placeholder: fitted here, or
        given otherwise (a shared step trained by its source, an averaged copy's
        ``AveragedModel.update_parameters``, a value set by hand: anything but the
        placeholder 0)."""
        if self.step_fitted:
            return True
        assert self.log_step is not None
        step = self.log_step.detach()
        return not step.is_meta and bool(step != 0)

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str,
                            keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.log_step is not None and self.step_is_fitted is not None:
            self._settle_fit()  # (the flag says it; the buffer only carries it)
            destination[prefix + "step_is_fitted"] = torch.full(
                (), float(self._has_step()), device=self.step_is_fitted.device)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str,
                              local_metadata: dict[str, Any], strict: bool,
                              missing_keys: list[str], *args: Any) -> None:
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict,
                                      missing_keys, *args)
        if self.override_nodes is not None and prefix + "override_nodes" in state_dict:
            # derived, not saved: built again from what was loaded (a model made on the
            # meta device and loaded, or one whose memory to_empty() left unset)
            self.override_table = _table(self.override_nodes, self.override_max_index)
        key = prefix + "step_is_fitted"
        if key not in state_dict and key in missing_keys:
            missing_keys.remove(key)  # saved by an older version, whose steps were fitted
        if self.log_step is not None and prefix + "log_step" in state_dict:
            self.__dict__.pop("_unsettled", None)
            flag = state_dict.get(key)
            if not isinstance(flag, Tensor) or flag.is_meta or bool(flag > 0):
                self._fitted()  # a loaded step is not initialized again
            else:  # saved before its first training batch: the next one fits it
                self.step_ready = self.step_fitted = self.refit_widens = False

    def _rows(self, x: Tensor, num_nodes: int, row_nodes: Tensor | None,
              ids: Tensor | None) -> Tensor:
        """The override as a bool mask over ``x``'s rows: looked up by global node id, or
        (no ids) row ``i`` is node ``i``. Shape checks only, never a value check."""
        table = self.override_table
        assert table is not None
        if ids is not None:
            mask = lookup(table, ids)
        else:
            if self.override_nodes is not None and self.override_nodes.dtype == torch.bool \
                    and table.shape[0] != num_nodes:
                raise FxquantValueError(
                    f"fxquant: quantization point {self.name}: the override's row mask has "
                    f"shape ({table.shape[0]},), but the graph there has {num_nodes} nodes; "
                    "pass a mask over all nodes, or the batch's global ids as node_ids=.")
            if self.override_max_index is not None and self.override_max_index >= num_nodes:
                raise FxquantIndexError(
                    f"fxquant: the node override of quantization point {self.name} names node "
                    f"{self.override_max_index}, but the graph there has {num_nodes} nodes; "
                    f"please pass node ids in [0, {num_nodes}), or the batch's global ids "
                    "as node_ids=.")
            if table.shape[0] >= num_nodes:
                mask = table[:num_nodes]
            else:
                mask = torch.cat([table, table.new_zeros(num_nodes - table.shape[0])])
        return mask if row_nodes is None else mask[row_nodes]

    def extra_repr(self) -> str:
        text = f"{self.name}: {self.config.describe()}"
        if self.override_nodes is not None and self.override_number is not None:
            text += "; " + self.override_description()
        return text

    def override_description(self) -> str:
        """``"20 nodes -> 9 bits"``, or ``"-"`` without an override."""
        if self.override_nodes is None or self.override_number is None:
            return "-"
        return describe_nodes(self.override_nodes, self.override_number)


def refit_steps(model: nn.Module, *, widen: bool = False) -> int:
    """Fit every learned step (``range="lsq"``) of ``model`` again on its next training
    forward, as on the first one (the step that rounds that batch with the least error);
    returns how many points will. With ``widen=True`` a refit never narrows a grid: the
    step becomes the larger of the fitted one and the current one (a step not fitted yet,
    e.g. while ``QuantTraining(float_epochs=...)`` passes training forwards through, is
    simply fitted: its placeholder is not a grid to keep).

    A learned step is fitted once, on the first training batch, then learned. Trained
    from scratch, that batch comes from an untrained model whose activations are much
    smaller than the trained model's, and Adam moves ``log_step`` by about its learning
    rate per iteration: a step that starts 100x too small needs ~460 iterations at
    ``lr=0.01`` to catch up, and the grid clips meanwhile (a GCN on CiteSeer with int4
    everywhere stayed at chance: its logits' step started at 0.001). Calling this before
    each of the first training steps (a warm-up, as torch.ao QAT keeps its observers on
    for the first epochs) lets the steps follow the growing activations; the LSQ gradient
    takes over after the last call. It only clears a flag: under ``torch.compile`` the
    flags select among a few compiled graphs, each compiled once. Loading a state dict
    marks the steps fitted again.

    ``widen=True`` is for the warm-up: the least-error step of a grid with two to four
    levels clips the largest values of a heavy-tailed batch (messages of a sparse graph),
    and a clipped value passes no gradient; refits that narrow the grids as the weights
    shrink can starve the first layer of gradient for good (a GCN on CiteSeer with 1-2 bit
    messages stayed near chance on one seed of ten, its first layer's weights decaying).

    Example:
        >>> import fxquant
        >>> config = fxquant.QuantConfig("int4", scale="tensor", range="lsq")
        >>> gm = fxquant.transform(torch.nn.Sequential(torch.nn.Linear(4, 4)),
        ...                        fxquant.QuantMapping().set_name("0", config))
        >>> _ = gm(torch.randn(8, 4))               # the first training batch fits the step
        >>> point = gm.get_submodule("_0_quant")
        >>> before = float(point.step.detach())
        >>> fxquant.refit_steps(gm)
        1
        >>> _ = gm(100 * torch.randn(8, 4))         # fitted again: 100x larger values
        >>> float(point.step.detach()) > 10 * before
        True
        >>> fxquant.refit_steps(gm, widen=True)
        1
        >>> _ = gm(torch.randn(8, 4))               # smaller values: the step stays
        >>> float(point.step.detach()) > 10 * before
        True
    """
    if not isinstance(widen, bool):
        raise FxquantTypeError(f"refit_steps: widen must be True or False, got {widen!r}")
    points = [m for m in model.modules() if isinstance(m, QuantPoint) and m.log_step is not None]
    for point in points:
        point._settle_fit()
        point.step_ready = False
        point.refit_widens = widen
    return len(points)


def share_step(model: nn.Module, point: str, source: str) -> None:
    """Make the quantization point named ``point`` round with the learned step of
    ``source`` (both ``range="lsq"``): the same :class:`~torch.nn.Parameter`, so the
    optimizer, ``state_dict``, ``torch.compile`` and :func:`refit_steps` see one step, fitted
    on ``source``'s first training batch.

    For a tensor rounded twice on its way, with only grid-keeping ops between (a layer's
    rounded output, a ReLU, the next layer's rounded input): on one step the second
    rounding keeps the first's values (ReLU maps an unsigned grid onto itself), where two
    steps learned apart re-round them, and two 1-bit grids whose steps drift more than 2x
    apart round everything to zero. PT2E's ``SharedQuantizationSpec`` shares quantization
    parameters the same way. Nothing changes on error.

    Example:
        >>> import fxquant
        >>> class Net(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)
        ...     def forward(self, x):
        ...         return self.b(self.a(x).relu())
        >>> config = fxquant.QuantConfig("uint1", scale="tensor", range="lsq")
        >>> gm = fxquant.transform(Net(), fxquant.QuantMapping()
        ...                        .set_name("a", config).set_name("b", config, site="input"))
        >>> fxquant.share_step(gm, "b_input_quant", "a_quant")
        >>> len(list(gm.parameters()))  # one step for both points
        5
    """
    points = _two_points(model, point, source, "share_step", "step_source",
                         lambda m: m.log_step is not None, "a learned step; both need range='lsq'")
    order = _first_calls(model)
    if point in order and source in order and order[point] < order[source] \
            and not points["source"].step_fitted:  # (a fitted or loaded step: no fit to come)
        raise FxquantValueError(
            f"fxquant.share_step: point={point!r} runs before source={source!r} in the forward, "
            "but the shared step, not fitted yet, is fitted on the source's first training "
            "batch: the point "
            "would round that batch with the unfitted step. Please pass them the other way "
            f"around, fxquant.share_step(model, {source!r}, {point!r}) (one step either way)")
    target = points["point"]
    target.log_step = points["source"].log_step
    target.__dict__["step_source"] = source


def _first_calls(model: nn.Module) -> dict[str, int]:
    """Where the graph of a GraphModule first calls each of its submodules (the order a
    forward runs them in); empty for other models. Points inside a layer are not in it."""
    graph = getattr(model, "graph", None)
    order: dict[str, int] = {}
    if isinstance(graph, torch.fx.Graph):
        for i, node in enumerate(graph.nodes):
            if node.op == "call_module":
                order.setdefault(str(node.target), i)
    return order


def _two_points(model: nn.Module, point: str, source: str, api: str, link: str,
                has: Callable[[QuantPoint], bool], what: str) -> dict[str, QuantPoint]:
    """The quantization points named ``point`` and ``source``, checked to have ``what``
    and to form no chain of shares (``link``: the attribute naming a point's source)."""
    points = {}
    for role, name in (("point", point), ("source", source)):
        try:
            module = model.get_submodule(name)
        except AttributeError:
            names = [n for n, m in model.named_modules() if isinstance(m, QuantPoint)]
            raise FxquantValueError(f"fxquant.{api}: {role}={name!r} is not a submodule of the "
                             f"model; its quantization points: {names}") from None
        if not isinstance(module, QuantPoint) or not has(module):
            raise FxquantValueError(f"fxquant.{api}: {role}={name!r} is not a quantization point "
                             f"with {what}")
        points[role] = module
    if point == source:
        raise FxquantValueError(f"fxquant.{api}: point and source are both {point!r}")
    if points["source"].__dict__.get(link) is not None:
        raise FxquantValueError(f"fxquant.{api}: source={source!r} already shares "
                         f"{points['source'].__dict__[link]!r}'s; please pass that point as "
                         "the source")
    users = [n for n, m in model.named_modules()
             if isinstance(m, QuantPoint) and m.__dict__.get(link) == point]
    if users:
        raise FxquantValueError(f"fxquant.{api}: point={point!r} is the source of {users}; please "
                         f"share those from {source!r} first")
    return points


def share_bits(model: nn.Module, point: str, source: str) -> None:
    """Make the quantization point named ``point`` read its per-node bit-widths from
    ``source``'s table (both with :class:`~fxquant.quant.config.NodeBits` of the same nodes
    and range): the same :class:`~torch.nn.Parameter` when learned (the same buffer when
    fixed), so each node has **one** bit-width for both sites, trained by the gradients of
    both, and stored once: :func:`fxquant.bit_report` counts the table's storage at
    ``source`` only.

    A2Q (Zhu et al., ICLR 2023) learns one bit-width per node and layer; sharing the table
    across a layer's sites (its messages, aggregation and output, keyed by their node) does
    the same, at a fraction of the storage of a table per site. Each point keeps its own
    record of the ranges it has seen, so a node unseen in training takes the bits of the
    seen node nearest in that point's range. Nothing changes on error.

    Example:
        >>> import fxquant
        >>> from fxquant.quant.config import NodeBits
        >>> class Net(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)
        ...     def forward(self, x):
        ...         return self.b(self.a(x))
        >>> def config():
        ...     return fxquant.QuantConfig("int8", scale="tensor", range="lsq",
        ...                                node_bits=NodeBits.learned_init(6, 4.0))
        >>> gm = fxquant.transform(Net(), fxquant.QuantMapping()
        ...                        .set_name("a", config()).set_name("b", config()))
        >>> fxquant.share_bits(gm, "b_quant", "a_quant")
        >>> gm.get_submodule("b_quant").row_bits is gm.get_submodule("a_quant").row_bits
        True
    """
    points = _two_points(model, point, source, "share_bits", "bits_source",
                         lambda m: m.config.node_bits is not None,
                         "per-node bit-widths (QuantConfig(node_bits=NodeBits(...)))")
    a, b = (points[r].config.node_bits for r in ("point", "source"))
    assert a is not None and b is not None
    if (a.learned, a.num_nodes, a.min_bits, a.max_bits) != \
            (b.learned, b.num_nodes, b.min_bits, b.max_bits):
        raise FxquantValueError(f"fxquant.share_bits: point={point!r} has {a!r} and source={source!r} "
                         f"has {b!r}; a shared table needs the same nodes, the same range and "
                         "both learned or both fixed")
    target, origin = points["point"], points["source"]
    if origin.row_bits is not None:
        target.row_bits = origin.row_bits
    else:
        target.row_bits_table = origin.row_bits_table
    target.__dict__["bits_source"] = source
