"""The module the pass inserts: one :class:`QuantPoint` per quantization point.

A point is built from its :class:`~fxquant.quant.config.QuantConfig` and the parts the
config asks for, each built from it (as torchao builds a fake quantizer from its config):

=====================  ===================================================  ==============
part                   what it does                                         when
=====================  ===================================================  ==============
``observer``           the range a scale comes from (running, widening,     decay,
                       percentile): :class:`~.observers.RangeObserver`      percentile, ...
``learned_step``       the learned step and its fit: :class:`~.learned_     ``range="lsq"``
                       step.LearnedStep`
``node_widths``        each node's bit-width: :class:`~.node_widths.        ``node_bits=``
                       NodeWidths`
``override``           the rows of a node override: :class:`~.override_     ``node_formats``
                       mask.OverrideMask`
``protection``         Degree-Quant's mask: :class:`~.protective_mask.      ``protect=``
                       ProtectiveMask` (no state)
=====================  ===================================================  ==============

The point calls one registered op (``torch.ops.fxquant.truncate`` or ``quantize``), or
for learned steps the LSQ rounding (:mod:`fxquant.quant.lsq`), in ``forward``. Being a
module, it is visible in ``print(gm)``, follows ``.to()``, keeps its parts' state in
``state_dict`` (``<point>.learned_step.log_step``, ``<point>.node_widths.bits``, ...; the
flat keys of files saved before 0.9.9 load too), survives pickling with its config, and
torch.compile inlines it (the op's decomposition fuses with its neighbours).

What an integer point rounds to, as codes and a step, is its :meth:`QuantPoint.grid`
(:class:`~fxquant.quant.grid.IntegerGrid`): the read interface for converting a trained
model to integer kernels.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor, nn

from fxquant._ops.calls import OpCall, op_call
from fxquant._ops.scales import int_grid_scale, int_scale
from fxquant._ops.version import NUMERICS
from fxquant.errors import FxquantTypeError, FxquantValueError, warn_renamed
from fxquant.formats import AnyFormat, IntFormat, TopN
from fxquant.fx.degree import SIDES
from fxquant.fx.degree import node_degree as node_degree_of
from fxquant.modes import Grad, Rounding, Scale
from fxquant.quant._probe import PROBING
from fxquant.quant.config import QuantConfig
from fxquant.quant.grid import IntegerGrid
from fxquant.quant.learned_step import LearnedStep
from fxquant.quant.legacy import upgrade_pickled_point, upgrade_point_keys
from fxquant.quant.lsq import lsq_round, lsq_round_features, lsq_round_stochastic
from fxquant.quant.node_widths import NodeWidths, code_range, grid_top, row_magnitudes
from fxquant.quant.nodes import LayerMasks, NodeIds
from fxquant.quant.observers import RangeObserver
from fxquant.quant.override import NodeOverride
from fxquant.quant.override_mask import OverrideMask
from fxquant.quant.protective_mask import ProtectiveMask
from fxquant.quant.site import AnySite, Part, Site, part_text

__all__ = ["QuantPoint", "upgrade_state_dict"]

def _spec(format: AnyFormat | None) -> str:
    return "" if format is None else format.spec()


class QuantPoint(nn.Module):
    """Rounds what flows through it as its config says; the gradient follows ``config.grad``.

    Args:
        config (QuantConfig): format, rounding, scale and range, gradient rule.
        layer (str): the layer it serves (for messages and the summary).
        site (Site, SiteKind or str, optional): where on the layer. (default: ``"output"``)
        override (NodeOverride, optional): nodes whose rows get another format.
        tensor (str, optional): which tensor of the layer (a weight's name).
        part (str, int or tuple, optional): which part of a site that rounds several
            tensors (:mod:`fxquant.quant.parts`): ``"source"``/``"target"`` of a
            ``(source, target)`` input, a node type of a dict, a relation.
            (default: :obj:`None`)
        side (str, optional): whose degrees protection draws from: ``"target"`` (the
            in-degree of the rows' nodes) or ``"source"`` (the out-degree: the source
            part of a ``(source, target)`` input). (default: ``"target"``)

    With ``range="lsq"`` the step is learned (:mod:`fxquant.quant.learned_step`): values
    are ``s * round(clamp(x / s, qmin, qmax))`` (:func:`~fxquant.quant.lsq.lsq_round`),
    whose gradient is straight-through inside the range and zero outside, and the step's
    LSQ's (scaled by ``1 / sqrt(numel * qmax)``). A step not fitted yet (no training
    batch with a finite value has run) rounds with its placeholder 1; evaluation warns
    (under ``torch.compile``, which cannot branch on it, the next ``model.train()``,
    :func:`refit_steps` or :meth:`~fxquant.recipes.QuantTraining.start_epoch` settles a
    compiled fit, and ``model.eval()`` warns where the step is still unfitted).

    Example:
        >>> point = QuantPoint(QuantConfig(9), "conv1")
        >>> point
        QuantPoint(output of 'conv1': top9, toward_zero, ste)
        >>> point(torch.tensor([3.0, -0.7]))
        tensor([ 2.0000, -0.5000])
    """

    #: 2: the learned step, node widths and override live in parts (submodules)
    _version = 2
    #: (points pickled before parts of sites round one whole tensor)
    part: Part = None
    side: str = "target"
    observer: RangeObserver | None
    learned_step: LearnedStep | None
    node_widths: NodeWidths | None
    override: OverrideMask | None

    def __init__(self, config: QuantConfig, layer: str, site: AnySite | str = Site.OUTPUT,
                 override: NodeOverride | None = None, tensor: str = "", *,
                 part: Part = None, side: str = "target") -> None:
        super().__init__()
        if side not in SIDES:
            raise FxquantValueError(f"QuantPoint: side={side!r} is not one of {list(SIDES)}")
        self.config = config
        self.layer = layer
        self.site = Site.parse(site)
        self.tensor = tensor
        self.part = part
        self.side = side
        self.observer = RangeObserver.from_config(config)
        self.learned_step = LearnedStep.from_config(config)
        self.override = OverrideMask(override) if override is not None else None
        self.node_widths = NodeWidths.from_config(config)
        self.protection = ProtectiveMask.from_config(config, layer)
        #: training forwards pass values through unrounded (a float warm-up,
        #: ``QuantTraining(float_epochs=...)``); evaluation rounds as ever
        self.float_training = False
        self.__dict__["step_source"] = None  # the point whose step this one uses
        self.__dict__["bits_source"] = None  # the point whose bit-width table this one uses
        self.__dict__["_node_ids"] = None  # the GraphModule's NodeIds, shared by all points
        #: bits of each row in the last forward (with the values per row), for the bit
        #: report and :func:`fxquant.bit_penalty`; not state
        self.__dict__["last_widths"] = None
        self.__dict__["last_rows"] = None
        self.__dict__["raw_input"] = False  # rounds the model's own input (set by the pass)
        self._op, self._args = self._op_arguments()

    #: what the last forward did (for the bit report and the penalty), not state: a copy
    #: starts without it (the bit-widths hold the autograd graph of that forward, which
    #: ``copy.deepcopy`` refuses to copy and pickling would carry along)
    _TRANSIENT = ("last_widths", "last_rows")

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        for key in self._TRANSIENT:
            state[key] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if "learned_step" not in self._modules and "learned_step" not in self.__dict__:
            upgrade_pickled_point(self)  # pickled before the parts (0.9.8 and earlier)
            self._op, self._args = self._op_arguments()  # (whose arguments were renamed)

    def __repr__(self) -> str:
        # one line: the parts are what the config says (print(point.observer) shows one)
        return f"{type(self).__name__}({self.extra_repr()})"

    # -- wiring ------------------------------------------------------------------------

    def attach(self, context: NodeIds) -> None:
        """Read the global node ids of each forward's rows from ``context`` (see
        :mod:`fxquant.quant.nodes`); a reference, not a submodule."""
        self.__dict__["_node_ids"] = context

    def attach_masks(self, context: LayerMasks) -> None:
        """Share the layer's protective mask through ``context`` (``Protection(share=
        "layer")``); a reference, not a submodule."""
        assert self.protection is not None
        self.protection.attach(context)

    @property
    def needs_nodes(self) -> bool:
        """Whether rounding depends on which node a row belongs to (protection, overrides,
        per-node bits)."""
        return self.config.protect is not None or self.uses_node_ids

    @property
    def uses_node_ids(self) -> bool:
        """Whether per-node settings are keyed by global node id (``node_ids=``)."""
        return self.override is not None or self.config.node_bits is not None

    @property
    def has_mask(self) -> bool:
        """Whether this forward's shared layer mask is drawn already (``share="layer"``)."""
        return self.protection is not None and self.protection.has_mask

    @property
    def name(self) -> str:
        """``"output of 'conv1'"``, ``"weight 'lin.weight' of 'conv1'"``: how messages
        refer to this point."""
        what = f"{self.site.value} {self.tensor!r}" if self.tensor else self.site.value
        if self.part is not None:
            what += f" [{part_text(self.part)}]"
        return f"{what} of {self.layer!r}"

    @property
    def log_step(self) -> nn.Parameter | None:
        """The learned step's parameter (``range="lsq"``: the step is its ``exp``), else
        None."""
        return self.learned_step.log_step if self.learned_step is not None else None

    @property
    def step(self) -> Tensor | None:
        """The learned step ``exp(log_step)`` (``range="lsq"``), kept finite and positive
        (see :meth:`~fxquant.quant.learned_step.LearnedStep.step`), else None."""
        if self.learned_step is None:
            return None
        return self.learned_step.step(torch.float32, self._top())

    @property
    def row_bits(self) -> Tensor | None:
        """Deprecated: the learned per-node widths are ``node_widths.bits``."""
        warn_renamed("QuantPoint.row_bits", "QuantPoint.node_widths.bits")
        widths = self.node_widths
        return widths.bits if widths is not None and widths.learned else None

    @property
    def row_bits_table(self) -> Tensor | None:
        """Deprecated: the fixed per-node widths are ``node_widths.bits``."""
        warn_renamed("QuantPoint.row_bits_table", "QuantPoint.node_widths.bits")
        widths = self.node_widths
        return widths.bits if widths is not None and not widths.learned else None

    @property
    def override_number(self) -> AnyFormat | None:
        """Deprecated: the node override's format is ``override.format``."""
        warn_renamed("QuantPoint.override_number", "QuantPoint.override.format")
        return self.override.format if self.override is not None else None

    def _op_arguments(self) -> tuple[str, dict[str, Any]]:
        """Which op, and its constant keyword arguments (computed once)."""
        c = self.config
        extra = self.override.format if self.override is not None else None
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
                    override_format=_spec(extra), grad_format=_spec(c.grad_format),
                    name=self.name)
        return "quantize", args

    def op_call(self) -> OpCall:
        """The op this point calls and its arguments (what the linters read)."""
        overload = getattr(torch.ops.fxquant, self._op).default
        call = op_call(overload, (None,), self._args)
        assert call is not None
        return call

    # -- the forward -------------------------------------------------------------------

    def forward(self, x: Tensor, edge_index: Tensor | None = None, *,
                node_degree: Tensor | None = None, row_nodes: Tensor | None = None,
                row_sources: Tensor | None = None,
                source_degree: Tensor | None = None) -> Tensor:
        """Round ``x``. Rows are nodes, unless ``row_nodes`` gives each row's node (the target
        of a message; ``row_sources`` its source, for ``Protection(messages="source")``);
        degrees (for protection) come from ``node_degree`` or from the layer's
        ``edge_index`` (the in-degree of ``x``'s rows as its targets; the out-degree of
        a ``(source, target)`` layer's sources at the ``"source"`` side).
        ``source_degree``: on a ``(source, target)`` layer, the out-degree of each source
        node, whose draw a message follows with ``Protection(messages="source")``."""
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
        if self.learned_step is not None and not self.training and not self.float_training \
                and not torch.compiler.is_compiling():
            self._warn_unfitted()
        num_nodes = x.shape[0] if x.dim() else 1
        if node_degree is None and edge_index is not None and self.protection is not None:
            node_degree = node_degree_of(edge_index, num_nodes, side=self.side)
        if node_degree is not None:
            num_nodes = node_degree.shape[0]
        ids = self._ids(num_nodes)
        rows = None if self.override is None else \
            self.override.rows(num_nodes, row_nodes, ids, self.name)
        # what the last forward rounded, for fxquant.bit_report / bit_penalty (not state)
        self.__dict__["last_rows"] = (x.shape[0] if x.dim() else 1,
                                      math.prod(x.shape[1:]) if x.dim() else 1, num_nodes, rows)
        keep = self._kept_rows(x, node_degree, row_nodes, row_sources, source_degree)
        if self.node_widths is not None:
            y = self._round_node_bits(x, num_nodes, row_nodes, ids)
        else:
            protect = self.config.protect
            unprotected = protect is not None and protect.ranges == "unprotected"
            y = self._round(x, rows, keep if unprotected else None)
        calls = self.__dict__.get("calls")
        if calls is not None:  # every call of fxquant.bit_report's forward is counted
            calls.append((self.__dict__["last_rows"], self.__dict__["last_widths"]))
        if keep is not None:
            if torch.compiler.is_compiling() or x.dim() == 0:  # fused by inductor
                y = torch.where(keep.view((-1,) + (1,) * (x.dim() - 1)), x, y)
            else:  # eager: copy the kept rows (a `where` with a per-row mask is slow here)
                kept = keep.nonzero().squeeze(1)
                y = y.index_copy_(0, kept, x.index_select(0, kept))  # y is our fresh output
        return y

    def _ids(self, num_nodes: int) -> Tensor | None:
        """The batch's global node ids, where per-node settings read them (checked to have
        one per node)."""
        context = self.__dict__["_node_ids"]
        ids = context.ids if context is not None and self.uses_node_ids else None
        if ids is not None and ids.shape[0] != num_nodes:
            raise FxquantValueError(
                f"fxquant: node_ids has {ids.shape[0]} entries, but the {self.name} has "
                f"{num_nodes} nodes; pass one global id per node of the batch (batch.n_id)")
        return ids

    def _kept_rows(self, x: Tensor, degree: Tensor | None, row_nodes: Tensor | None,
                   row_sources: Tensor | None, source_degree: Tensor | None = None
                   ) -> Tensor | None:
        """The rows protection keeps at full precision in this training forward (a bool
        per row), or None. A message that follows its source on a ``(source, target)``
        layer follows the sources' draw (by out-degree, ``source_degree``); on a layer of
        one node set, the nodes' draw."""
        if self.protection is None or not self.training:
            return None
        rows = x.shape[0] if x.dim() else 1
        by_source = self.protection.protect.messages == "source" and row_sources is not None
        if by_source and source_degree is not None:  # bipartite: the sources' own draw
            keep = self.protection.mask(source_degree, side="source")
        else:
            keep = self.protection.mask(degree, side=self.side)
        if keep is None:
            return None
        by = row_sources if by_source else row_nodes
        if by is not None:
            keep = keep[by]
        elif keep.shape[0] != rows and self.side == "target":
            # a linear transform of the source side (GATConv's lin_src) on a (source,
            # target) layer: its rows are the sources, whose draw the layer shared too
            other = self.protection.shared(side="source")
            if other is not None and other.shape[0] == rows:
                keep = other
        if keep.shape[0] != rows:
            raise FxquantValueError(
                f"fxquant: the protective mask of layer {self.layer!r} has {keep.shape[0]} "
                f"rows, but its {self.name} has {rows}; Protection(share='layer') needs every "
                "point of the layer to have a row per node of its graph (or per edge)")
        return keep

    def _round(self, x: Tensor, rows: Tensor | None, exclude: Tensor | None = None) -> Tensor:
        if self._op == "truncate":
            return torch.ops.fxquant.truncate.default(x, override_rows=rows, numerics=NUMERICS,
                                                      **self._args)
        if self.learned_step is not None:
            return self._lsq(x, rows)
        bounds = self.observer(x, exclude) if self.observer is not None else None
        y = torch.ops.fxquant.quantize.default(x, bounds=bounds, override_rows=rows,
                                               numerics=NUMERICS, **self._args)
        if self.config.grad is Grad.CLIPPED and bounds is not None and x.requires_grad:
            y = torch.where(self._clipped(x.detach(), bounds), y.detach(), y)
        return y

    def _clipped(self, x: Tensor, bounds: Tensor) -> Tensor:
        """Where ``x`` rounds to the grid's first or last code or beyond (``grad="clipped"``)."""
        fmt = self.config.format
        assert isinstance(fmt, IntFormat)
        scale, zero_point = int_scale(bounds.to(torch.float32), fmt, self.config.scale)
        per_row = self.config.scale.per_row and x.dim() > 0
        shape = (-1,) + (1,) * (x.dim() - 1)
        codes = torch.round(x / (scale.view(shape) if per_row else scale) - fmt.offset)
        if zero_point is not None:
            codes = codes + (zero_point.view(shape) if per_row else zero_point)
        return (codes <= fmt.qmin) | (codes >= fmt.qmax)

    @property
    def _fits_step(self) -> bool:
        """Whether this forward fits the learned step: the first training batch (or the
        next after :func:`refit_steps`) of a point that owns its step."""
        step = self.learned_step
        return step is not None and self.training and not step.step_ready \
            and self.__dict__.get("step_source") is None

    def _lsq(self, x: Tensor, rows: Tensor | None) -> Tensor:
        """``s * round(clamp(x / s, qmin, qmax))`` with LSQ's gradients."""
        fmt = self.config.format
        step = self.learned_step
        assert isinstance(fmt, IntFormat) and step is not None
        if self._fits_step:
            step.fit(x, fmt.qmin, fmt.qmax, fmt.offset)
        gain = 1.0 / math.sqrt(max(x.numel(), 1) * fmt.max_finite)
        c = self.config
        if rows is None and c.rounding is Rounding.NEAREST and c.grad is Grad.STE \
                and c.grad_format is None:  # the common case: one fused function
            return self._lsq_round(x, step.step(x.dtype, self._top()), fmt.qmin, fmt.qmax,
                                   gain, fmt.offset)
        s = step.scaled_step(gain, x.dtype, self._top())
        y = torch.clamp(x / s, fmt.level(fmt.qmin), fmt.max_finite)
        codes = torch.ops.fxquant.quantize.default(y, override_rows=rows, numerics=NUMERICS,
                                                   **self._args)
        return codes * s

    def _lsq_round(self, x: Tensor, s: Tensor, qmin: Tensor | float, qmax: Tensor | float,
                   gain: float, offset: float) -> Tensor:
        """:func:`~fxquant.quant.lsq.lsq_round`; at an input site on a grid with zero, its
        form for features (a dataset's mostly-zero features then give the step its
        gradient without a dense product in the layer's linear transform)."""
        if self.site is Site.INPUT and not offset:
            return lsq_round_features(x, s, qmin, qmax, gain)
        return lsq_round(x, s, qmin, qmax, gain, offset)

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

    def _round_node_bits(self, x: Tensor, num_nodes: int, row_nodes: Tensor | None,
                         ids: Tensor | None) -> Tensor:
        """Each row on its own integer grid (see :class:`~fxquant.quant.node_bits.NodeBits`)."""
        fmt = self.config.format
        widths = self.node_widths
        assert isinstance(fmt, IntFormat) and widths is not None
        bits = widths.for_rows(x, num_nodes, row_nodes, ids,
                               keep_input=self.site is Site.INPUT).to(x.dtype)
        qmin, qmax = code_range(bits, fmt)
        shape = (-1,) + (1,) * (x.dim() - 1)
        qmax, qmin = qmax.view(shape), qmin.view(shape)
        self.__dict__["last_widths"] = (bits, math.prod(x.shape[1:]) if x.dim() else 1)
        step = self.learned_step
        if step is not None:  # one learned step; bits set each row's range
            if self._fits_step:  # the start, at the mean bits (the same on every rank:
                lo, hi = code_range(widths.mean_bits(), fmt)  # parameters are broadcast)
                step.fit(x, lo, hi, fmt.offset, widest=self._top())
            gain = self._lsq_gain(x, qmax, fmt.offset)
            if self.config.rounding is Rounding.STOCHASTIC:
                return lsq_round_stochastic(x, step.step(x.dtype, self._top()), qmin, qmax,
                                            gain, fmt.offset)
            return self._lsq_round(x, step.step(x.dtype, self._top()), qmin, qmax, gain,
                                   fmt.offset).to(x.dtype)
        s = self._node_bits_step(x, qmax, self.observer)
        if self.config.rounding is Rounding.STOCHASTIC:
            return lsq_round_stochastic(x, s, qmin, qmax, offset=fmt.offset)
        return lsq_round(x, s, qmin, qmax, offset=fmt.offset).to(x.dtype)

    def _node_bits_step(self, x: Tensor, qmax: Tensor,
                        observe: Callable[[Tensor], Tensor] | None) -> Tensor:
        """The step of each row of per-node widths over a range (not learned): the range's
        largest magnitude (from ``observe``, else the tensor's own) over the row's largest
        level. The finite values' magnitudes: an infinity or a NaN must not make the step
        infinite or NaN, which would turn every finite value of its row (or tensor) NaN."""
        fmt = self.config.format
        assert isinstance(fmt, IntFormat)
        shape = (-1,) + (1,) * (x.dim() - 1)
        if not x.numel():
            bounds = x.new_zeros(())
        elif self.config.scale.per_row:
            bounds = row_magnitudes(x.detach(), finite_only=True).clamp(min=0).view(shape)
        else:
            bounds = observe(x) if observe is not None else \
                row_magnitudes(x.detach().reshape(1, -1), finite_only=True).clamp(min=0)[0]
            if bounds.dim() and bounds.numel() == 2:
                bounds = bounds.abs().amax()
        return (bounds.to(x.dtype) / (qmax + fmt.offset)).clamp(min=torch.finfo(x.dtype).tiny)

    def _top(self) -> float:
        """The largest level of this point's grid (at ``max_bits`` with per-node bits)."""
        fmt = self.config.format
        assert isinstance(fmt, IntFormat)
        rb = self.config.node_bits
        return grid_top(fmt, None if rb is None else rb.max_bits)

    # -- the learned step's fit --------------------------------------------------------

    def _settle_fit(self, evaluating: bool = False) -> None:
        """Settle a compiled fit (:meth:`~fxquant.quant.learned_step.LearnedStep.settle`):
        at ``model.train()``, ``model.eval()`` (with a warning, as evaluation would use the
        unfitted step), :func:`refit_steps` and
        :meth:`~fxquant.recipes.QuantTraining.start_epoch`."""
        if self.learned_step is None or not self.learned_step.settle():
            return
        if evaluating and not self.__dict__.get("_warned_unfitted"):
            self.__dict__["_warned_unfitted"] = True
            warnings.warn(f"{self!r}: the training batch that fitted its learned step held no "
                          "finite nonzero value, so the step is still its placeholder (1); "
                          "evaluation rounds with it. Please run a training batch with finite, "
                          "nonzero values first (it fits the step).", stacklevel=3)

    def settle(self) -> None:
        """Settle what a compiled forward recorded (a learned step's fit), in eager code;
        :meth:`~fxquant.recipes.QuantTraining.start_epoch` calls it every epoch."""
        self._settle_fit()

    def _warn_unfitted(self) -> None:
        """Evaluation with a learned step that no training batch has fitted rounds with its
        placeholder (1): say so, once per point (a point sharing another's step leaves it
        to that one; :func:`fxquant.bit_report` and :func:`fxquant.summary` count what it
        rounds, and do not)."""
        if self.__dict__.get("step_source") is not None \
                or self.__dict__.get("_warned_unfitted") or PROBING.get():
            return
        self._settle_fit()
        assert self.learned_step is not None
        if self.learned_step.has_step():
            return
        self.__dict__["_warned_unfitted"] = True
        warnings.warn(f"{self!r}: evaluating with a learned step (range='lsq') that no training "
                      "batch has fitted: it rounds with the placeholder step 1. Please run a "
                      "training forward (model.train(), a batch with finite, nonzero values) "
                      "first; it fits the step.", stacklevel=4)

    def train(self, mode: bool = True) -> QuantPoint:
        self._settle_fit(evaluating=not mode)
        return super().train(mode)

    # -- state -------------------------------------------------------------------------

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str,
                              *args: Any) -> None:
        upgrade_point_keys(state_dict, prefix)  # (what the parts load from next)
        super()._load_from_state_dict(state_dict, prefix, *args)

    # -- reading -----------------------------------------------------------------------

    def grid(self, x: Tensor | None = None, *, node_ids: Tensor | None = None,
             row_nodes: Tensor | None = None, num_nodes: int | None = None) -> IntegerGrid:
        """The integer grid this point rounds ``x`` to in evaluation: its format, the step
        and zero point actually used (broadcast against ``x``), each row's code range and
        width. See :class:`~fxquant.quant.grid.IntegerGrid`.

        Args:
            x (Tensor, optional): the values; needed where the step comes from them (a
                range taken over each batch), not for a learned step or a stored range.
            node_ids (Tensor, optional): the batch's global node ids (per-node widths and
                overrides are looked up by them; default: row ``i`` is node ``i``).
            row_nodes (Tensor, optional): each row's node, for rows that are not nodes
                (a message's target).
            num_nodes (int, optional): how many nodes ``row_nodes`` index. (default: one
                per id of ``node_ids``, else one more than the largest of ``row_nodes``)

        Example:
            >>> point = QuantPoint(QuantConfig("int4", scale="tensor"), "conv1")
            >>> x = torch.tensor([[0.5, -1.4], [0.7, 0.1]])
            >>> grid = point.grid(x)
            >>> grid.step, grid.qmin, grid.qmax
            (tensor(0.2000), -8, 7)
            >>> codes = grid.codes(x)
            >>> codes
            tensor([[ 2, -7],
                    [ 4,  0]], dtype=torch.int32)
            >>> torch.equal(grid.values(codes), point.eval()(x))
            True
        """
        fmt, c = self.config.format, self.config
        if not isinstance(fmt, IntFormat):
            raise FxquantValueError(f"QuantPoint.grid: the {self.name} rounds to "
                                    f"{fmt.spec()}, which has no integer grid; only integer "
                                    "formats ('int8', 'uint4', 'int4:asym', ...) have one")
        over = self.override.format if self.override is not None else None
        if over is not None and not (isinstance(over, IntFormat) and (
                over.signed, over.asymmetric, over.midrise) == (
                fmt.signed, fmt.asymmetric, fmt.midrise)):
            raise FxquantValueError(f"QuantPoint.grid: the node override of the {self.name} "
                                    f"rounds some rows to {over.spec()}, which is not a grid "
                                    f"of {fmt.spec()}'s kind; one integer grid cannot say it")
        stored = self.learned_step is not None or (c.scale is Scale.NONE) or (
            self.observer is not None and self.observer.stored)
        if x is None and (not stored or self.node_widths is not None or over is not None):
            raise FxquantValueError(f"QuantPoint.grid: the {self.name} takes its step or its "
                                    "rows' ranges from the values it rounds; please pass them "
                                    "as x")
        with torch.no_grad():
            return self._grid(fmt, x, node_ids, row_nodes, num_nodes)

    def _grid(self, fmt: IntFormat, x: Tensor | None, node_ids: Tensor | None,
              row_nodes: Tensor | None, num_nodes: int | None) -> IntegerGrid:
        c = self.config
        dtype = x.dtype if x is not None else torch.float32
        shape = (-1,) + (1,) * (x.dim() - 1) if x is not None and x.dim() else (-1,)
        if num_nodes is None:
            num_nodes = node_ids.shape[0] if node_ids is not None else \
                int(row_nodes.max()) + 1 if row_nodes is not None and row_nodes.numel() else \
                (x.shape[0] if x is not None and x.dim() else 1)
        ids = None if node_ids is None else node_ids.to(torch.int64)
        qmin: int | Tensor = fmt.qmin
        qmax: int | Tensor = fmt.qmax
        bits = zero_point = None
        source = "learned" if self.learned_step is not None else "none" \
            if c.scale is Scale.NONE else "stored" \
            if self.observer is not None and self.observer.stored else "data"
        if self.node_widths is not None:
            assert x is not None
            bits = self.node_widths.for_rows(x, num_nodes, row_nodes, ids, training=False)
            lo, hi = code_range(bits.to(dtype), fmt)
            lo, hi = lo.view(shape), hi.view(shape)
            if self.learned_step is not None:
                step = self.learned_step.step(dtype, self._top())
            else:
                observe = self.observer.eval_bounds if self.observer is not None else None
                step = self._node_bits_step(x, hi, observe)
            return IntegerGrid(fmt, c.rounding, c.scale, source, step, None, lo, hi, bits,
                               reciprocal=False)
        rows = over = None
        if self.override is not None:
            rows = self.override.rows(num_nodes, row_nodes, ids, self.name).view(shape)
            over = self.override.format
        if self.learned_step is not None:  # (an override clamps within the main range)
            step = self.learned_step.step(dtype, self._top())
            if rows is not None and isinstance(over, IntFormat):
                qmin = torch.where(rows, max(fmt.qmin, over.qmin), fmt.qmin)
                qmax = torch.where(rows, min(fmt.qmax, over.qmax), fmt.qmax)
            return IntegerGrid(fmt, c.rounding, c.scale, source, step, None, qmin, qmax,
                               None, reciprocal=False)
        sample = x if x is not None else torch.zeros((), dtype=dtype)
        observed = self.observer.eval_bounds(sample) if self.observer is not None else None
        step, zero_point = int_grid_scale(sample, fmt, c.scale, observed)
        if rows is not None and isinstance(over, IntFormat):
            over_step, over_zero = int_grid_scale(sample, over, c.scale, observed)
            step = torch.where(rows, over_step, step)
            if zero_point is not None and over_zero is not None:
                zero_point = torch.where(rows, over_zero, zero_point)
            qmin = torch.where(rows, over.qmin, fmt.qmin)
            qmax = torch.where(rows, over.qmax, fmt.qmax)
        return IntegerGrid(fmt, c.rounding, c.scale, source, step, zero_point, qmin, qmax,
                           None, reciprocal=True)

    def extra_repr(self) -> str:
        text = f"{self.name}: {self.config.describe()}"
        if self.override is not None:
            text += "; " + self.override.describe()
        return text

    def override_description(self) -> str:
        """``"20 nodes -> 9 bits"``, or ``"-"`` without an override."""
        return "-" if self.override is None else self.override.describe()


def upgrade_state_dict(model: nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (a state dict of ``model``'s, possibly saved by fxquant 0.9.8 or earlier)
    with every quantization point's keys as today's (a new dict; ``load_state_dict`` does
    this by itself).

    Example:
        >>> import fxquant
        >>> gm = fxquant.transform(torch.nn.Sequential(torch.nn.Linear(2, 2)),
        ...     fxquant.QuantConfig("int4", scale="tensor", range="lsq"), layers="0")
        >>> old = {"0.weight": torch.ones(2, 2), "0.bias": torch.zeros(2),
        ...        "_0_quant.log_step": torch.tensor(-1.0)}
        >>> sorted(upgrade_state_dict(gm, old))
        ['0.bias', '0.weight', '_0_quant.learned_step.log_step']
    """
    upgraded = dict(state)
    for name, module in model.named_modules():
        if isinstance(module, QuantPoint):
            upgrade_point_keys(upgraded, f"{name}." if name else "")
    return upgraded
