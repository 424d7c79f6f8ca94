"""How one quantization point rounds: the frozen :class:`QuantConfig`.

Vocabulary (following PyG): a **node** is a vertex of the user's graph (node ids,
:func:`~fxquant.quant.nodes.top_degree_nodes`, in-degree); a **row** is a row of a tensor
(``scale="row"``); a **layer** is a call in the traced model (a submodule, a function or a
method); a **site** is where on a layer a value is rounded (:class:`~fxquant.Site`); what
the pass inserts are **quantization points**.

A **format** is what values are rounded to (:mod:`fxquant.formats`):
:class:`~fxquant.formats.TopN` (keep the top bits of the pattern; an ``int`` means this), a
:class:`~fxquant.formats.Format`, an :class:`~fxquant.formats.IntFormat` or a registered
:class:`~fxquant.formats.CustomFormat`. A **bit-width per node** is a
:class:`~fxquant.quant.node_bits.NodeBits`; a few nodes rounded to another format are a
:class:`~fxquant.quant.override.NodeOverride`; Degree-Quant's protection is a
:class:`~fxquant.quant.protection.Protection`. Which point gets which config is a
:class:`~fxquant.quant.mapping.QuantMapping`'s choice.

Example:
    >>> QuantConfig("int4", scale="tensor", range="lsq", protect=(0.0, 0.2)).describe()
    'int4, nearest, scale tensor (lsq), ste, protect 0..0.2'
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

from fxquant.errors import FxquantTypeError, FxquantValueError, user_stacklevel, warn_renamed
from fxquant.formats import AnyFormat, IntFormat, TopN, as_format, as_scaled_format
from fxquant.modes import AnyScale, Grad, Rounding, Scale, ScaleKind
from fxquant.quant.node_bits import NodeBits
from fxquant.quant.override import NodeOverride, describe_nodes
from fxquant.quant.protection import Protection
from fxquant.quant.site import Site
from fxquant.quant.validation import require_keys

__all__ = [
    "NodeBits",
    "NodeOverride",
    "Protection",
    "QuantConfig",
    "Site",
    "check_decay",
    "describe",
    "describe_nodes",
    "merge_scale",
]

#: names a QuantConfig field had before (pickles and JSON of older files use them)
_OLD_FIELDS = {"number": "format", "grad_number": "grad_format", "row_bits": "node_bits",
               "momentum": "decay"}


def describe(format: AnyFormat) -> str:
    """The format as it is written (``"top16"``, ``"e4m3"``, ``"int8"``)."""
    return format.spec()


_RANGES = ("minmax", "percentile", "lsq")


def check_decay(decay: object, momentum: object, where: str = "") -> float | None:
    """``decay=``, or the value of the deprecated ``momentum=`` (the same number: the old
    range's weight) with a :class:`FutureWarning` at the user's line; both is an error.
    ``where`` prefixes the messages (``"fxquant.transform: "``)."""
    if momentum is None:
        return decay  # type: ignore[return-value]
    if decay is not None:
        raise FxquantValueError(f"{where}decay={decay!r} and momentum={momentum!r} were both "
                                "given; momentum= is the old name of decay=: please give "
                                "decay= alone")
    warnings.warn(
        f"{where}momentum= is deprecated and will be removed in the next release; please "
        f"write decay={momentum!r}: the same number, the weight of the old range in "
        "running = decay * running + (1 - decay) * batch (the complement of "
        "torch.nn.BatchNorm's momentum, so BatchNorm's momentum=0.1 is decay=0.9)",
        FutureWarning, stacklevel=user_stacklevel())
    return momentum  # type: ignore[return-value]


def merge_scale(given: object, named: AnyScale | None, spec: object) -> tuple[AnyScale, bool]:
    """The scale of a point: ``scale=`` (``given``; None when left out) and the one the
    format's spec names (``named``, as in ``"int8:row"``, ``"mxfp4"``), which must agree;
    and whether one was given at all (False: left out, the format is cast unscaled)."""
    if given is None:
        return (Scale.NONE, False) if named is None else (named, True)
    mode = Scale.parse(given)
    if named is not None and named is not mode:
        raise FxquantValueError(
            f"format={spec!r} names the scale {named.value!r}, but scale={mode.value!r} was "
            "given too; please give the scale once (in the format's spec or as scale=)")
    return mode, True


def _parse_range(value: object) -> str:
    """``"minmax"``, ``"lsq"`` or ``"percentile:Q"`` with ``50 < Q <= 100``, normalized."""
    if not isinstance(value, str):
        raise FxquantTypeError(f"range must be 'minmax', 'percentile:Q' or 'lsq', got {value!r}")
    kind, _, q = value.partition(":")
    if kind == "percentile":
        try:
            number = float(q)
        except ValueError:
            number = math.nan
        if not 50 < number <= 100:
            raise FxquantValueError(f"range={value!r}: please give the percentile as 'percentile:Q' "
                             "with 50 < Q <= 100, e.g. 'percentile:99.9'")
        return f"percentile:{number:g}"
    if kind not in _RANGES or q:
        raise FxquantValueError(f"range={value!r} is not one of ['minmax', 'percentile:Q', 'lsq']")
    return kind



_OBSERVE = ("batch", "ema", "widen")


def _parse_observe(value: object, decay: float | None, mode: AnyScale, source: str) -> str:
    """``observe=`` checked against the decay, scale and range it goes with."""
    if value is None:
        return "ema" if decay is not None else "batch"
    if value not in _OBSERVE:
        raise FxquantValueError(f"observe={value!r} is not one of {list(_OBSERVE)}")
    if value == "ema" and decay is None:
        raise FxquantValueError("observe='ema' keeps a running average: please give its "
                                "decay= too (the old range's weight, e.g. 0.99)")
    if value != "ema" and decay is not None:
        raise FxquantValueError(f"decay={decay} keeps a running average (observe='ema'), "
                                f"not observe={value!r}; please drop one of them")
    if value == "widen" and (not mode.per_tensor or source == "lsq"):
        raise FxquantValueError("observe='widen' keeps one widest range per tensor; please use "
                                f"scale='tensor' with a minmax or percentile range (got "
                                f"scale={mode.value!r}, range={source!r})")
    return str(value)


@dataclass(frozen=True, init=False)
class QuantConfig:
    """How one quantization point rounds: number, rounding, scale and range, gradient rule.

    Args:
        format (int, str, tuple, Format, IntFormat or TopN): an ``int`` keeps the top bits of
            each value's pattern (:func:`fxquant.truncate`); a float format (``"e4m3"``,
            ``(3, 2)``, a :class:`~fxquant.formats.Format`) or an integer format (``"int8"``,
            ``"uint4"``, ``"int8:asym"``) rounds to its values (:func:`fxquant.quantize`).
        rounding (str, optional): ``"toward_zero"``, ``"nearest"`` or ``"stochastic"``.
            (default: :obj:`None`: toward_zero for kept bits, nearest for formats)
        scale (str, optional): for formats: ``"none"`` (a plain cast), ``"tensor"``,
            ``"row"``, a ``"-pow2"`` variant, or ``"block32"`` (OCP MX); it may also end the
            format's spec (``"int8:row"``; ``"mxfp4"`` is ``"e2m1:block32"``, see
            :mod:`fxquant.formats`). Left out, a format is cast unscaled, and an integer
            format then warns at :func:`fxquant.transform` (its grid has a step of 1).
            (default: :obj:`None`: left out)
        range (str, optional): where a scale's range comes from: ``"minmax"`` of the
            values (default), ``"percentile:Q"`` (the ``100-Q``..``Q`` percentiles,
            Degree-Quant's choice), or ``"lsq"`` (integers: a learned step size, LSQ).
        decay (float, optional): with a per-tensor scale, keep a running range
            ``decay * running + (1 - decay) * batch`` and use it in eval: ``decay`` is the
            weight of the *old* range (``0.99`` keeps 99% of it), the complement of
            :class:`torch.nn.BatchNorm1d`'s ``momentum`` (BatchNorm's ``momentum=0.1`` is
            ``decay=0.9``; Degree-Quant's momentum 0.01 is ``decay=0.99``). (default:
            :obj:`None`)
        momentum (float, optional): the old name of ``decay`` (the same number, not
            BatchNorm's momentum); deprecated, with a :class:`FutureWarning`.
        observe (str, optional): how a per-tensor range is kept: ``"batch"`` (each
            batch's own range, in training and eval), ``"ema"`` (the running range of
            ``decay``), or ``"widen"`` (the widest range seen in training, as
            :class:`torch.ao.quantization.MinMaxObserver` keeps it, used in training and
            eval). (default: :obj:`None`: ``"ema"`` with a decay, else ``"batch"``)
        grad (str, optional): ``"ste"`` (straight-through), ``"zero"``, or
            ``"clipped"`` (integer grids with a scale: straight-through, zero where a value
            rounds to the grid's first or last code or beyond). (default: ``"ste"``)
        grad_format (optional): also round the gradient flowing back, to kept bits or a
            format. (default: :obj:`None`)
        protect (tuple or Protection, optional): ``(p_min, p_max)`` or a
            :class:`Protection`: Degree-Quant's protective mask (Tailor et al., ICLR
            2021). In training, each node stays at full precision with probability
            ``p_min + (p_max - p_min) * F(in-degree)``, ``F`` the fraction of nodes with at
            most its in-degree; in eval everything is rounded. A tuple draws a mask per
            point, messages follow their target node and ranges cover every row; a
            :class:`Protection` chooses. (default: :obj:`None`)
        node_bits (NodeBits, optional): a bit-width per node, fixed or learned, for a
            symmetric integer format (see :class:`NodeBits`), rounded to nearest or
            stochastically. (default: :obj:`None`)

    Example:
        >>> QuantConfig(16)
        QuantConfig(format=TopN(bits=16), rounding=<Rounding.TOWARD_ZERO: 'toward_zero'>, \
scale=<Scale.NONE: 'none'>, range='minmax', decay=None, grad=<Grad.STE: 'ste'>, \
grad_format=None, protect=None, node_bits=None, observe='batch')
        >>> QuantConfig("int4", scale="tensor", range="lsq").describe()
        'int4, nearest, scale tensor (lsq), ste'
        >>> QuantConfig("mxfp4").describe()  # a name that carries its scale: e2m1:block32
        'e2m1, nearest, scale block32, ste'
        >>> QuantConfig("int8:asym:row").describe()  # a format's variant, then its scale
        'int8:asym, nearest, scale row, ste'
        >>> QuantConfig(16, decay=0.9)
        Traceback (most recent call last):
        ...
        fxquant.errors.FxquantValueError: decay=0.9 keeps a running range for a scaled format, so it \
needs a format with scale='tensor' (or 'tensor-pow2'); got top16 with scale='none'.
    """

    format: AnyFormat
    rounding: Rounding
    scale: Scale
    range: str
    decay: float | None
    grad: Grad
    grad_format: AnyFormat | None
    protect: Protection | None
    node_bits: NodeBits | None
    observe: str
    #: whether a scale was given (``scale=``, or in the format's spec); not part of the
    #: config's identity (``"int8"`` left unscaled equals ``"int8:none"``)
    scale_given: bool = field(default=True, init=False, compare=False, repr=False)

    def __init__(
        self,
        format: AnyFormat | int | str | tuple[int, int] | None = None,
        rounding: Rounding | str | None = None,
        *,
        scale: Scale | str | None = None,
        range: str = "minmax",
        decay: float | None = None,
        grad: Grad | str = "ste",
        grad_format: AnyFormat | int | str | tuple[int, int] | None = None,
        protect: Protection | tuple[float, float] | None = None,
        node_bits: NodeBits | None = None,
        observe: str | None = None,
        momentum: float | None = None,
    ) -> None:
        if format is None:
            raise FxquantTypeError("QuantConfig needs a format: kept bits (16), a float format "
                                   "('e4m3', (3, 2)) or an integer format ('int8')")
        decay = check_decay(decay, momentum)
        parsed, named_scale = as_scaled_format(format, "format")
        if node_bits is not None:
            if not isinstance(node_bits, NodeBits):
                raise FxquantTypeError(f"node_bits must be a fxquant.NodeBits, got "
                                       f"{type(node_bits).__name__}")
            if not isinstance(parsed, IntFormat) or parsed.asymmetric:
                raise FxquantValueError("node_bits= gives integer rows their own bit-widths: please use a "
                                 f"symmetric integer format such as 'int8' (got {describe(parsed)})")
            if parsed.signed and not parsed.midrise and node_bits.min_bits < 2:
                raise FxquantValueError("node_bits: a signed grid needs at least 2 bits (codes -1, 0, 1); "
                                 "use min_bits=2, an unsigned format ('uint4') or a mid-rise "
                                 "one ('int4:midrise': at 1 bit, the sign) for 1 bit")
            if rounding is not None and Rounding.parse(rounding) is Rounding.TOWARD_ZERO:
                raise FxquantValueError("node_bits rounds to nearest or stochastically; please "
                                        "pass rounding='nearest' or 'stochastic'")
            if isinstance(merge_scale(scale, named_scale, format)[0], ScaleKind):
                raise FxquantValueError("node_bits= sets each row's grid over a per-tensor or "
                                        "per-row range; please use scale='tensor' or 'row' "
                                        f"(got the registered scale {scale!r})")
            if node_bits.learned and range != "lsq":
                raise FxquantValueError("node_bits learned: the gradient reaches a row's bits through its "
                                 "clipping range, which needs range='lsq' (a learned step)")
        if protect is not None:
            protect = Protection.parse(protect)
        default = Rounding.TOWARD_ZERO if isinstance(parsed, TopN) else Rounding.NEAREST
        if isinstance(parsed, IntFormat) and parsed.midrise and rounding is not None \
                and Rounding.parse(rounding) is Rounding.TOWARD_ZERO:
            raise FxquantValueError(f"rounding='toward_zero': a mid-rise grid ({parsed.spec()}) has no "
                             "zero to round toward; please use 'nearest' or 'stochastic'")
        mode, scale_given = merge_scale(scale, named_scale, format)
        source = _parse_range(range)
        if mode is not Scale.NONE and isinstance(parsed, TopN):
            raise FxquantValueError(
                f"scale={mode.value!r} applies to formats (e.g. 'e4m3', 'int8'), not to top-N "
                f"truncation ({describe(parsed)}); please drop scale= or round to a format."
            )
        if source != "minmax" and not (mode.per_tensor or mode.per_row):
            raise FxquantValueError(f"range={source!r} sets a per-tensor or per-row scale; please pass "
                             f"scale='tensor' or 'row' (got scale={mode.value!r})")
        if source == "lsq" and not isinstance(parsed, IntFormat):
            raise FxquantValueError(f"range='lsq' learns the step of an integer grid; please use an "
                             f"integer format such as 'int4' (got {describe(parsed)})")
        if source == "lsq" and mode.per_row:
            raise FxquantValueError("range='lsq' learns one step per tensor; please use scale='tensor' "
                             "(a step per row would be a parameter per node)")
        if source.startswith("percentile") and mode.per_row:
            raise FxquantValueError("range='percentile:Q' is taken per tensor; please use "
                             "scale='tensor'")
        if decay is not None:
            m = decay
            if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 <= m < 1:
                raise FxquantValueError(f"decay must be a number in [0, 1) (the old range's "
                                        f"weight), got {m!r}")
            if not mode.per_tensor or source == "lsq":
                raise FxquantValueError(
                    f"decay={m} keeps a running range for a scaled format, so it needs a "
                    "format with scale='tensor' (or 'tensor-pow2'); got "
                    f"{describe(parsed)} with scale={mode.value!r}"
                    + (" and range='lsq' (a learned step has no running range)."
                       if source == "lsq" else ".")
                )
            decay = float(m)
        grad_rule = Grad.parse(grad)
        if grad_rule is Grad.CLIPPED and (not isinstance(parsed, IntFormat) or source == "lsq"
                                          or mode not in (Scale.TENSOR, Scale.ROW)
                                          or node_bits is not None):
            raise FxquantValueError(
                "grad='clipped' zeroes the gradient where a value leaves an integer grid's "
                "range, so it needs an integer format with scale='tensor' or 'row' and a "
                f"minmax or percentile range (got {describe(parsed)}, scale={mode.value!r}, "
                f"range={source!r}{', node_bits' if node_bits is not None else ''}; with "
                "range='lsq' the gradient is already zero outside the range)")
        observe = _parse_observe(observe, decay, mode, source)
        if protect is not None and protect.ranges == "unprotected" and (
                not mode.per_tensor or source == "lsq"):
            raise FxquantValueError(
                "Protection(ranges='unprotected') takes a per-tensor range over the "
                "unprotected rows; please use scale='tensor' with a minmax or percentile "
                f"range (got scale={mode.value!r}, range={source!r})")
        set_ = object.__setattr__
        set_(self, "format", parsed)
        set_(self, "rounding", default if rounding is None else Rounding.parse(rounding))
        set_(self, "scale", mode)
        set_(self, "range", source)
        set_(self, "decay", decay)
        set_(self, "grad", grad_rule)
        set_(self, "grad_format",
             None if grad_format is None else as_format(grad_format, "grad_format"))
        set_(self, "protect", protect)
        set_(self, "node_bits", node_bits)
        set_(self, "observe", observe)
        set_(self, "scale_given", scale_given)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # configs pickled before the format / grad_format / node_bits names
        for old, new in _OLD_FIELDS.items():
            if old in state:
                state[new] = state.pop(old)
        state.setdefault("observe", "ema" if state.get("decay") is not None else "batch")
        state.setdefault("scale_given", True)  # (an older file: as it was written)
        if isinstance(state.get("protect"), tuple):
            state["protect"] = Protection(*state["protect"])
        self.__dict__.update(state)

    @property
    def momentum(self) -> float | None:
        """The old name of :attr:`decay` (the same number); deprecated."""
        warn_renamed("QuantConfig.momentum", "QuantConfig.decay (the same number)")
        return self.decay

    @property
    def percentile(self) -> float | None:
        """``Q`` of a ``"percentile:Q"`` range, else None."""
        return float(self.range.split(":")[1]) if self.range.startswith("percentile") else None

    @property
    def op(self) -> str:
        """The registered op that implements it: ``"truncate"`` where kept bits say it all."""
        pure = isinstance(self.format, TopN) and isinstance(self.grad_format, TopN | None)
        return "truncate" if pure else "quantize"

    def describe(self) -> str:
        """One line: ``"e4m3, nearest, scale tensor (running, decay 0.9), ste"``."""
        parts = [self.format.spec(), self.rounding.value]
        if self.scale is not Scale.NONE:
            parts.append(f"scale {self.scale_description()}")
        parts.append(self.grad.value)
        if self.grad_format is not None:
            parts.append(f"grad {self.grad_format.spec()}")
        if self.protect is not None:
            parts.append(self.protect.describe())
        if self.node_bits is not None:
            rb = self.node_bits
            parts.append(f"bits per node ({'learned' if rb.learned else 'fixed'}, "
                         f"{rb.min_bits}..{rb.max_bits})")
        return ", ".join(parts)

    def scale_description(self) -> str:
        """``"tensor (percentile:99.9, running, decay 0.9)"``, or ``"-"`` unscaled."""
        if self.scale is Scale.NONE:
            return "-"
        notes = [self.range] if self.range != "minmax" else []
        if self.decay is not None:
            notes.append(f"running, decay {self.decay}")
        if self.observe == "widen":
            notes.append("widening")
        return self.scale.value + (f" ({', '.join(notes)})" if notes else "")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values; :meth:`from_dict` reads them back."""
        return {
            "format": self.format.spec(),
            "rounding": self.rounding.value,
            "scale": self.scale.value,
            "range": self.range,
            "decay": self.decay,
            "grad": self.grad.value,
            "grad_format": None if self.grad_format is None else self.grad_format.spec(),
            "protect": None if self.protect is None else self.protect.to_dict(),
            "node_bits": None if self.node_bits is None else self.node_bits.to_dict(),
            **({"observe": self.observe} if self.observe == "widen" else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuantConfig:
        """The config :meth:`to_dict` wrote."""
        require_keys(data, (), "QuantConfig")
        data = dict(data)
        if data.get("protect") is not None:
            data["protect"] = Protection.from_dict(data["protect"])
        for old, new in _OLD_FIELDS.items():  # files written before the renames
            if old in data:
                data[new] = data.pop(old)
        require_keys(data, ("format",), "QuantConfig")
        if data.get("node_bits") is not None:
            data["node_bits"] = NodeBits.from_dict(data["node_bits"])
        return cls(data.pop("format"), data.pop("rounding", None), **data)


def __getattr__(name: str) -> Any:
    # names of the past: files pickled with them still load, and old imports warn
    if name == "RowBits":  # the name NodeBits had before
        warn_renamed("fxquant.quant.config.RowBits", "fxquant.NodeBits")
        return NodeBits
    if name == "Number":
        warn_renamed("fxquant.quant.config.Number", "fxquant.formats.AnyFormat")
        return AnyFormat
    if name == "as_number":
        warn_renamed("fxquant.quant.config.as_number", "fxquant.formats.as_format")
        return as_format
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
