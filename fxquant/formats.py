"""The formats fxquant can simulate: minifloats (FP8, the OCP MX element types, custom),
integers (fixed point with a scale: ``int8``, ``int4``, ``uint8``, ``int8:asym``) and
top-N truncation of the input's own pattern.

How a format is written (one grammar, read by :func:`parse_scaled`; the documentation's
"Formats, scales and ranges" page has the table)::

    spec    = format [":" scale]
    format  = preset | "eXmY" {":" key=value} | ("int" | "uint") N [":asym" | ":midrise"]
            | "topN" | a registered format's spec | a torch dtype
    scale   = "none" | "tensor" | "row" | "tensor-pow2" | "row-pow2" | "block32"
            | a registered scale's name

A ``":"`` field is a variant of the format (``asym``, ``midrise``, ``bias=3``), except the
last one when it names a scale: ``"int8:asym"`` is a format, ``"int8:asym:row"`` the same
format with a scale per row. A few names carry their scale: the OCP Microscaling types
``"mxfp8"`` (``"e4m3:block32"``), ``"mxfp8_e5m2"``, ``"mxfp6_e3m2"``, ``"mxfp6_e2m3"`` and
``"mxfp4"`` (``"e2m1:block32"``). Where a scale is taken (``QuantConfig``, ``quantize``,
``transform(format=)``, a recipe's ``input_format``) the spec's scale is used as if given
as ``scale=``; :func:`parse` reads a format alone and refuses a spec that names a scale.

A :class:`Format` is frozen and validated. Formats travel inside graphs as short strings
(``"e4m3"``, ``"top16"``, ``"e3m2:bias=3:special=none:subnormals=1:overflow=saturate"``):
:meth:`Format.spec` writes them and :func:`parse` reads them back, so a saved and reloaded
GraphModule knows its formats without ``node.meta``.

Semantics, for every format:

- ``special``: ``"ieee"`` (the top exponent encodes inf and NaN), ``"nan_only"`` (only the
  all-ones code is NaN, as in ``float8_e4m3fn``, whose largest value is 448), or ``"none"``
  (every code is a number, as in the OCP MX FP6/FP4 types).
- ``overflow``: ``"saturate"`` (clamp to the largest finite value) or ``"inf"`` (needs
  ``special="ieee"``; rounding toward zero still saturates, as IEEE 754 specifies).
  Infinite inputs become inf where the format has inf, else +-max.
- ``subnormals``: when off, results below the smallest normal flush to zero (sign kept).
- NaN input always gives NaN, and the sign is never changed.

A format of one's own derives from :class:`CustomFormat` and is registered with
:func:`register_format`; from then on its specs parse like the built-in ones, in configs,
saved files and the registered op (the documentation's "Extending fxquant" page shows one).
"""

from __future__ import annotations

import functools
import math
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, TypeVar

from fxquant.errors import (
    FxquantTypeError,
    FxquantValueError,
    UnregisteredError,
    same_kind,
    warn_renamed,
)
from fxquant.modes import AnyScale, Scale, registered_scales

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "PRESETS",
    "SCALED_PRESETS",
    "AnyFormat",
    "CustomFormat",
    "Format",
    "IntFormat",
    "TopN",
    "as_format",
    "as_scaled_format",
    "parse",
    "parse_scaled",
    "register_format",
    "registered_formats",
    "split_scale",
    "unregister_format",
]

Special = Literal["ieee", "nan_only", "none"]
Overflow = Literal["saturate", "inf"]


@dataclass(frozen=True)
class Format:
    """A floating-point format with ``exp_bits`` exponent and ``man_bits`` mantissa bits.

    Args:
        exp_bits (int): exponent bits, ``>= 0``.
        man_bits (int): mantissa (fraction) bits, ``>= 0``.
        bias (int, optional): exponent bias. (default: IEEE-style ``2**(exp_bits-1) - 1``)
        special (str, optional): ``"ieee"``, ``"nan_only"`` or ``"none"``. (default: ``"none"``)
        subnormals (bool, optional): keep subnormal values. (default: :obj:`True`)
        overflow (str, optional): ``"saturate"`` or ``"inf"``. (default: ``"saturate"``)
        name (str, optional): the preset name, if any (not part of the format's identity).

    Example:
        >>> fmt = Format(3, 2)
        >>> fmt.bits, fmt.max_finite, fmt.min_normal, fmt.min_subnormal
        (6, 28.0, 0.25, 0.0625)
        >>> parse("e4m3").max_finite, parse("e5m2").special
        (448.0, 'ieee')
    """

    exp_bits: int
    man_bits: int
    bias: int | None = None
    special: Special = "none"
    subnormals: bool = True
    overflow: Overflow = "saturate"
    name: str = ""

    def __post_init__(self) -> None:
        for arg in ("exp_bits", "man_bits"):
            value = getattr(self, arg)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise FxquantValueError(f"Format: {arg} must be an int >= 0, got {value!r}")
        if self.bits > 32:
            raise FxquantValueError(
                f"Format: 1 + exp_bits + man_bits = {self.bits} bits; fxquant simulates formats "
                "of at most 32 bits (float32 inputs carry no more)."
            )
        if self.bias is None:
            object.__setattr__(self, "bias", max(2 ** (self.exp_bits - 1) - 1, 0))
        elif isinstance(self.bias, bool) or not isinstance(self.bias, int):
            raise FxquantValueError(f"Format: bias must be an int, got {self.bias!r}")
        if self.special not in ("ieee", "nan_only", "none"):
            raise FxquantValueError(
                f"Format: special={self.special!r} is not one of ['ieee', 'nan_only', 'none']"
            )
        if self.overflow not in ("saturate", "inf"):
            raise FxquantValueError(f"Format: overflow={self.overflow!r} is not one of ['saturate', 'inf']")
        if self.overflow == "inf" and self.special != "ieee":
            raise FxquantValueError(
                f"Format: overflow='inf' needs inf codes, but special={self.special!r}; "
                "please use special='ieee' or overflow='saturate'."
            )
        if self.exp_bits == 0 and not self.subnormals:
            raise FxquantValueError(
                "Format: with 0 exponent bits every nonzero value is subnormal, so "
                "subnormals=False leaves only zero; please keep subnormals=True."
            )
        if self.special != "none" and self.exp_bits == 0:
            raise FxquantValueError(f"Format: special={self.special!r} needs at least one exponent bit")
        if self.special == "ieee" and self.exp_bits == 1:
            raise FxquantValueError("Format: special='ieee' with 1 exponent bit leaves no finite normals")
        name = f"e{self.exp_bits}m{self.man_bits} (bias {self.bias})"
        if not math.isfinite(self.max_finite) or not self.min_subnormal > 0:
            raise FxquantValueError(
                f"Format: {name} reaches beyond float64's range (largest value "
                f"{self.max_finite}, smallest {self.min_subnormal}); fxquant simulates formats "
                "whose values are float64 numbers. Please use fewer exponent bits or another bias."
            )
        if self.max_finite == 0:
            raise FxquantValueError(f"Format: {name} has no nonzero value; please give it at least one "
                             "exponent or mantissa bit.")

    # -- derived numbers ------------------------------------------------------------------

    @property
    def bits(self) -> int:
        """Bits per value: sign, exponent and mantissa."""
        return 1 + self.exp_bits + self.man_bits

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal value."""
        return 1 - int(self.bias)  # type: ignore[arg-type]

    @property
    def emax(self) -> int:
        """Exponent of the largest finite value."""
        top = 2**self.exp_bits - 1 - int(self.bias)  # type: ignore[arg-type]
        if self.special == "ieee" or (self.special == "nan_only" and self.man_bits == 0):
            return top - 1
        return top

    @property
    def max_finite(self) -> float:
        if self.exp_bits == 0:
            return _ldexp(2**self.man_bits - 1, self.emin - self.man_bits)
        fraction = 2 ** (self.man_bits + 1) - 1  # 1.111... in units of 2**-man_bits
        if self.special == "nan_only" and self.man_bits > 0:
            fraction -= 1  # the all-ones mantissa at the top exponent is NaN
        return _ldexp(fraction, self.emax - self.man_bits)

    @property
    def min_normal(self) -> float:
        return _ldexp(1, self.emin)

    @property
    def min_subnormal(self) -> float:
        return _ldexp(1, self.emin - self.man_bits) if self.subnormals else self.min_normal

    def spec(self) -> str:
        """The string that :func:`parse` turns back into this format."""
        preset = next((name for name, p in PRESETS.items() if p == self), None)
        if preset is not None:
            return preset
        short = f"e{self.exp_bits}m{self.man_bits}"
        if self == Format(self.exp_bits, self.man_bits) and short not in PRESETS:
            return short
        return (f"e{self.exp_bits}m{self.man_bits}:bias={self.bias}:special={self.special}"
                f":subnormals={int(self.subnormals)}:overflow={self.overflow}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Format):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[object, ...]:
        return (self.exp_bits, self.man_bits, self.bias, self.special, self.subnormals,
                self.overflow)

    def __str__(self) -> str:
        return self.spec()


@dataclass(frozen=True)
class TopN:
    """Top-N truncation of the input's own bit pattern (what :func:`fxquant.truncate` does).

    Example:
        >>> import torch, fxquant
        >>> fxquant.TopN(12).spec(), fxquant.QuantConfig(12).format == fxquant.TopN(12)
        ('top12', True)
        >>> fxquant.truncate(torch.tensor([3.14159]), fxquant.TopN(12).bits).tolist()
        [3.0]
    """

    bits: int

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or not 1 <= self.bits <= 64:
            raise FxquantValueError(f"TopN: bits must be an int in 1..64, got {self.bits!r}")

    def spec(self) -> str:
        return f"top{self.bits}"

    def __str__(self) -> str:
        return self.spec()


@dataclass(frozen=True)
class IntFormat:
    """Integers of ``bits`` bits, read as fixed point through a scale.

    Args:
        bits (int): ``2..16`` signed, ``1..16`` unsigned or mid-rise.
        signed (bool, optional): ``[-2**(bits-1), 2**(bits-1) - 1]`` (two's complement) or
            ``[0, 2**bits - 1]``. (default: :obj:`True`)
        asymmetric (bool, optional): an affine grid with a zero point, mapping the range
            ``[lo, hi]`` (which always includes 0) onto ``[0, 2**bits - 1]``.
            (default: :obj:`False`: the grid is symmetric around 0 and ``amax`` maps to
            the largest code)
        midrise (bool, optional): the signed codes ``k`` stand for ``k + 1/2``: ``2**bits``
            levels symmetric around 0 and no zero (``":midrise"``; the mid-rise uniform
            quantizer of signal processing). At 1 bit it is the sign times a scale
            (binarization, as in XNOR-Net), at 2 bits ``{-1.5, -0.5, 0.5, 1.5}``, where the
            two's complement grid rounds to ``{-2, -1, 0, 1}``, one level lopsided. Rounds
            to nearest or stochastically (toward zero has no meaning without a zero).
            (default: :obj:`False`)

    Example:
        >>> parse("int8"), parse("uint4").qmax, parse("int2").qmin
        (IntFormat(bits=8, signed=True, asymmetric=False, midrise=False), 15, -2)
        >>> parse("int8:asym").spec(), parse(("int", 3)).spec()
        ('int8:asym', 'int3')
        >>> fmt = parse("int2:midrise")
        >>> [fmt.level(k) for k in range(fmt.qmin, fmt.qmax + 1)]
        [-1.5, -0.5, 0.5, 1.5]
    """

    bits: int
    signed: bool = True
    asymmetric: bool = False
    midrise: bool = False

    def __post_init__(self) -> None:
        if self.midrise and (self.asymmetric or not self.signed):
            raise FxquantValueError("IntFormat: a mid-rise grid is signed and symmetric; drop "
                             "asymmetric / signed=False, or midrise")
        low = 2 if self.signed and not self.asymmetric and not self.midrise else 1
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or not low <= self.bits <= 16:
            raise FxquantValueError(f"IntFormat: bits must be an int in {low}..16, got {self.bits!r}")
        if self.asymmetric:
            object.__setattr__(self, "signed", False)

    @property
    def offset(self) -> float:
        """What a code stands for, minus the code: 0.5 on a mid-rise grid, else 0."""
        return 0.5 if self.midrise else 0.0

    def level(self, code: int) -> float:
        """The value of ``code`` in units of the scale."""
        return code + self.offset

    @property
    def qmin(self) -> int:
        """The smallest code."""
        return -(1 << (self.bits - 1)) if self.signed else 0

    @property
    def qmax(self) -> int:
        """The largest code."""
        return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1

    @property
    def max_finite(self) -> float:
        """The largest level, in units of the scale."""
        return self.qmax + self.offset

    def spec(self) -> str:
        if self.asymmetric:
            return f"int{self.bits}:asym"
        if self.midrise:
            return f"int{self.bits}:midrise"
        return f"{'' if self.signed else 'u'}int{self.bits}"

    def __str__(self) -> str:
        return self.spec()


class CustomFormat(ABC):
    """The base of a number format defined outside fxquant (see :func:`register_format`).

    A subclass is a frozen dataclass (hashable, compared by value) that says how it is
    written (:meth:`spec`, read back by :meth:`from_spec`), how many bits a value takes
    (:attr:`bits`, for :func:`fxquant.bit_report`), its largest finite value
    (:attr:`max_finite`: a scale maps the range's largest magnitude onto it, as for the
    minifloats) and how a tensor is rounded to it (:meth:`round`). It is rounded where a
    minifloat is: by ``fxquant.quantize``, in a :class:`~fxquant.QuantConfig`, with every
    scale; ``range="lsq"`` and per-node bit-widths stay the integer formats'.

    Example:
        >>> import torch
        >>> from dataclasses import dataclass
        >>> @register_format
        ... @dataclass(frozen=True)
        ... class PowersOfTwo(CustomFormat):  # zero and +-2**-k .. +-1
        ...     name = "pot"
        ...     k: int
        ...     @classmethod
        ...     def from_spec(cls, spec):
        ...         return cls(int(spec.removeprefix("pot")))
        ...     def spec(self):
        ...         return f"pot{self.k}"
        ...     bits = property(lambda self: 1 + (self.k + 1).bit_length())  # sign, magnitude
        ...     max_finite = 1.0
        ...     def round(self, y, rounding, noise=None):
        ...         a = y.abs().clamp(max=1.0)
        ...         e = torch.round(torch.log2(a)).clamp(min=-self.k)
        ...         return torch.where(a < 2.0 ** (-self.k - 1), 0.0, 2.0 ** e).copysign(y)
        >>> parse("pot3"), parse("pot3").bits
        (PowersOfTwo(k=3), 4)
        >>> import fxquant
        >>> fxquant.quantize(torch.tensor([0.3, -0.01, 0.9]), "pot3")
        tensor([0.2500, -0.0000, 1.0000])
        >>> unregister_format("pot")
    """

    #: the letters every spec of the format starts with (``"posit"`` for ``"posit8"``)
    name: ClassVar[str] = ""
    #: whether the format has an infinity (infinite inputs stay infinite; else they
    #: saturate at ``max_finite``, as the built-in formats without inf do)
    has_inf: ClassVar[bool] = False

    @property
    @abstractmethod
    def bits(self) -> int:
        """Bits per value (what :func:`fxquant.bit_report` counts)."""

    @property
    @abstractmethod
    def max_finite(self) -> float:
        """The largest finite value (positive)."""

    @abstractmethod
    def spec(self) -> str:
        """The string :meth:`from_spec` reads back; starts with :attr:`name`."""

    @classmethod
    @abstractmethod
    def from_spec(cls, spec: str) -> CustomFormat:
        """The format ``spec`` (lower case, starting with :attr:`name`) writes; raises
        :class:`ValueError` for a spec it does not know."""

    @abstractmethod
    def round(self, y: Tensor, rounding: str, noise: Tensor | None = None) -> Tensor:
        """``y`` (float32, or float64 for float64 inputs; already scaled) rounded to the
        format's values: ``rounding`` is ``"nearest"``, ``"toward_zero"`` or
        ``"stochastic"`` (then ``noise`` holds ``U[0, 1)`` numbers of ``y``'s shape). Pure
        tensor operations, so it runs in eager code and compiles; NaN stays NaN."""

    @property
    def emax(self) -> int:
        """The exponent of :attr:`max_finite` (``floor(log2)``): where an MX block scale
        puts a block's largest magnitude."""
        return math.frexp(self.max_finite)[1] - 1

    def __str__(self) -> str:
        return self.spec()


#: What values are rounded to: kept bits of the pattern, a float format, integers, or a
#: registered format of one's own.
AnyFormat = TopN | Format | IntFormat | CustomFormat

#: the registered formats, by :attr:`CustomFormat.name`
_REGISTERED: dict[str, type[CustomFormat]] = {}
#: the names the built-in specs start with, which a registered format cannot take
_BUILT_IN_NAMES: Final = frozenset({"e", "int", "uint", "top", "mxfp"})
_NAME = re.compile(r"[a-z][a-z_]*")
_F = TypeVar("_F", bound=type[CustomFormat])


def register_format(cls: _F) -> _F:
    """Make the :class:`CustomFormat` subclass ``cls`` known by its :attr:`~CustomFormat.name`:
    :func:`parse` (and with it every config, saved file and the registered op) reads its
    specs from then on. Use it as a class decorator; register in every process that uses
    or loads the format (a file that names an unregistered format is refused, naming it).

    Args:
        cls (type): a subclass of :class:`CustomFormat` with a ``name`` of lower-case
            letters and ``_`` that no built-in spec starts with.
    """
    if not (isinstance(cls, type) and issubclass(cls, CustomFormat)):
        raise FxquantTypeError(f"register_format expects a subclass of fxquant.CustomFormat, "
                               f"got {cls!r}")
    name = cls.name
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise FxquantValueError(f"register_format: {cls.__name__}.name must be lower-case "
                                f"letters (and _), the start of its specs; got {name!r}")
    taken = name in _BUILT_IN_NAMES or name in PRESETS or name in _ALIASES \
        or name in _AMBIGUOUS
    if taken:
        raise FxquantValueError(f"register_format: the name {name!r} of {cls.__name__} is a "
                                "built-in format's; please choose another")
    if name in _REGISTERED and _REGISTERED[name] is not cls:
        raise FxquantValueError(f"register_format: {name!r} is registered already, by "
                                f"{_REGISTERED[name].__qualname__}; please unregister_format"
                                f"({name!r}) first, or choose another name")
    _REGISTERED[name] = cls
    _parse_format.cache_clear()
    return cls


def unregister_format(name: str) -> None:
    """Forget the registered format ``name`` (tests, notebooks that redefine one)."""
    if _REGISTERED.pop(name, None) is None:
        raise FxquantValueError(f"unregister_format: no format {name!r} is registered; "
                                f"registered: {sorted(_REGISTERED)}")
    _parse_format.cache_clear()


def registered_formats() -> dict[str, type[CustomFormat]]:
    """The registered formats by name (a copy)."""
    return dict(_REGISTERED)


def _ldexp(mantissa: int, exponent: int) -> float:
    try:
        return math.ldexp(float(mantissa), exponent)
    except OverflowError:
        return math.inf


#: Named formats, as torch casts them where torch has them.
PRESETS: Final[dict[str, Format]] = {
    # torch.float8_e4m3fn: no inf, NaN only at S.1111.111, saturates (inf -> +-448).
    "e4m3": Format(4, 3, 7, "nan_only", True, "saturate", name="e4m3"),
    # torch.float8_e5m2: IEEE-style, overflows to inf.
    "e5m2": Format(5, 2, 15, "ieee", True, "inf", name="e5m2"),
    "fp16": Format(5, 10, 15, "ieee", True, "inf", name="fp16"),
    "bf16": Format(8, 7, 127, "ieee", True, "inf", name="bf16"),
    # OCP Microscaling element types: no inf/NaN codes, saturating.
    "e3m2": Format(3, 2, 3, "none", True, "saturate", name="e3m2"),
    "e2m3": Format(2, 3, 1, "none", True, "saturate", name="e2m3"),
    "e2m1": Format(2, 1, 1, "none", True, "saturate", name="e2m1"),
}
_ALIASES: Final = {"e4m3fn": "e4m3", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
                   "fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2", "fp6_e3m2": "e3m2",
                   "fp6_e2m3": "e2m3", "fp4_e2m1": "e2m1", "fp4": "e2m1"}
#: Names that carry their scale: the OCP Microscaling (MX) types, an element format with a
#: power-of-two (E8M0) scale per block of 32 values. MXFP8 is E4M3 by default, as
#: torchao's ``MXTensor`` takes it (``elem_dtype=torch.float8_e4m3fn``).
SCALED_PRESETS: Final[dict[str, tuple[str, str]]] = {
    "mxfp8": ("e4m3", "block32"), "mxfp8_e4m3": ("e4m3", "block32"),
    "mxfp8_e5m2": ("e5m2", "block32"), "mxfp6_e3m2": ("e3m2", "block32"),
    "mxfp6_e2m3": ("e2m3", "block32"), "mxfp4": ("e2m1", "block32"),
    "mxfp4_e2m1": ("e2m1", "block32"),
}
#: Names that stand for more than one format: refused, naming the choices.
_AMBIGUOUS: Final = {
    "fp8": "'e4m3' (torch.float8_e4m3fn: 3 mantissa bits, largest 448) or 'e5m2' "
           "(torch.float8_e5m2: 5 exponent bits, largest 57344)",
    "fp6": "'e3m2' or 'e2m3' (the OCP MX FP6 element types)",
    "mxfp6": "'mxfp6_e3m2' or 'mxfp6_e2m3'",
}
#: torch dtypes read as formats (by their name: formats.py does not import torch)
_DTYPES: Final = {"torch.float8_e4m3fn": "e4m3", "torch.float8_e5m2": "e5m2",
                  "torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.int8": "int8",
                  "torch.uint8": "uint8", "torch.int16": "int16"}
_CUSTOM = re.compile(r"e(\d+)m(\d+)")
_TOP = re.compile(r"top(\d+)")
_INT = re.compile(r"(u?)int(\d+)")


def _int_option(spec: str, key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise FxquantValueError(f"format option {key}={value!r} in {spec!r} must be an integer") from None


def _is_dtype(value: object) -> bool:
    return type(value).__name__ == "dtype" and type(value).__module__ == "torch"


#: the built-in scales' names
_SCALE_NAMES: Final = frozenset(m.value for m in Scale)


def _scale_word(word: str) -> bool:
    """``word`` names a scale (built-in or registered), not a variant of a format."""
    return word in _SCALE_NAMES or word in registered_scales()


def parse_scaled(spec: str | AnyFormat | tuple[object, object] | Any
                 ) -> tuple[AnyFormat, AnyScale | None]:
    """The format a spec names and the scale it names (None where it names none): the
    grammar of the module docstring. A :class:`Format`, tuple or torch dtype names no
    scale.

    Example:
        >>> parse_scaled("int8:asym")
        (IntFormat(bits=8, signed=False, asymmetric=True, midrise=False), None)
        >>> [(fmt.spec(), scale.value) for fmt, scale in map(parse_scaled, ["uint1:row", "mxfp4"])]
        [('uint1', 'row'), ('e2m1', 'block32')]
        >>> import torch
        >>> parse_scaled(torch.float8_e5m2)
        (Format(exp_bits=5, man_bits=2, bias=15, special='ieee', subnormals=True, \
overflow='inf', name='e5m2'), None)
        >>> parse_scaled("fp8")
        Traceback (most recent call last):
        ...
        fxquant.errors.FxquantValueError: format 'fp8' is ambiguous: FP8 is 'e4m3' \
(torch.float8_e4m3fn: 3 mantissa bits, largest 448) or 'e5m2' (torch.float8_e5m2: 5 \
exponent bits, largest 57344); please name one
    """
    if _is_dtype(spec):
        name = str(spec)
        if name not in _DTYPES:
            raise FxquantValueError(
                f"the dtype {name} is not a format fxquant simulates; dtypes it reads as "
                f"formats: {sorted(_DTYPES)} (or name a format: 'e4m3', 'int8', ...)")
        return _parse_format(_DTYPES[name]), None
    if not isinstance(spec, str):
        return _parse_format(spec), None
    body, scale_word = split_scale(spec)
    return _parse_format(body), None if scale_word is None else Scale.parse(scale_word)


def split_scale(spec: str) -> tuple[str, str | None]:
    """The text of a spec's format and the name of the scale it names (None where it names
    none), without reading the format: the grammar's one split (string operations only,
    so compiled code may call it).

    Example:
        >>> split_scale("int8:asym"), split_scale("int8:asym:row"), split_scale("mxfp4")
        (('int8:asym', None), ('int8:asym', 'row'), ('e2m1', 'block32'))
    """
    text = spec.strip().lower()
    head, _, last = text.rpartition(":")
    scale_word = last if head and _scale_word(last) else None
    body = head if scale_word is not None else text
    if body in _AMBIGUOUS:
        raise FxquantValueError(f"format {spec!r} is ambiguous: {body.upper()} is "
                                f"{_AMBIGUOUS[body]}; please name one")
    if body in SCALED_PRESETS:
        name = body
        body, implied = SCALED_PRESETS[name]
        if scale_word is not None and scale_word != implied:
            raise FxquantValueError(
                f"format {spec!r}: {name} carries the scale {implied!r}; please drop "
                f"':{scale_word}', or write the element format with the scale you want "
                f"('{body}:{scale_word}')")
        scale_word = implied
    if scale_word is not None and _scale_word(body.rpartition(":")[2]):
        raise FxquantValueError(f"format {spec!r} names two scales; please give one "
                                "(the last ':' field)")
    return body, scale_word


def parse(spec: str | AnyFormat | tuple[object, object] | Any) -> AnyFormat:
    """A number from a preset name, ``"eXmY"``, ``(exp_bits, man_bits)``, ``"topN"``,
    ``"intN"`` / ``"uintN"`` / ``"intN:asym"`` / ``"intN:midrise"`` / ``("int", N)``, a
    torch dtype (``torch.float8_e4m3fn``), or the long form :meth:`Format.spec` writes;
    or the spec of a registered :class:`CustomFormat`. A spec that names a scale too
    (``"int8:row"``, ``"mxfp4"``) is refused: read it with :func:`parse_scaled`.

    Example:
        >>> parse("e3m2") == PRESETS["e3m2"], parse((3, 2)).spec(), parse("top16")
        (True, 'e3m2', TopN(bits=16))
        >>> parse("e20m20")
        Traceback (most recent call last):
        ...
        fxquant.errors.FxquantValueError: Format: 1 + exp_bits + man_bits = 41 bits; ...
    """
    fmt, scale = parse_scaled(spec)
    if scale is not None:
        raise FxquantValueError(
            f"format {spec!r} names a scale ({scale.value!r}) as well as a format; a scale is "
            "given where values are rounded (QuantConfig, fxquant.quantize, "
            "transform(format=)). Here please write the format alone: "
            f"{fmt.spec()!r}")
    return fmt


@functools.lru_cache(maxsize=256)
def _parse_format(spec: str | AnyFormat | tuple[object, object]) -> AnyFormat:
    """The format a spec without a scale names (see :func:`parse`)."""
    if isinstance(spec, (Format, TopN, IntFormat, CustomFormat)):
        return spec
    if isinstance(spec, tuple) and len(spec) == 2 and spec[0] in ("int", "uint"):
        return IntFormat(spec[1], signed=spec[0] == "int")  # type: ignore[arg-type]
    if isinstance(spec, tuple) and len(spec) == 2:
        return Format(*spec)  # type: ignore[arg-type]
    if not isinstance(spec, str):
        raise FxquantTypeError(f"a format is a name ('e4m3', 'int8', 'top16'), 'eXmY', (exp_bits, "
                        f"man_bits), ('int', bits) or a Format; got {spec!r}")
    text = spec.strip().lower()
    text = _ALIASES.get(text, text)
    if text in PRESETS:
        return PRESETS[text]
    head, *options = text.split(":")
    top = _TOP.fullmatch(head)
    if top and not options:
        return TopN(int(top.group(1)))
    integer = _INT.fullmatch(head)
    if integer:
        if options not in ([], ["asym"], ["midrise"]):
            raise FxquantValueError(f"unknown integer format option in {spec!r}; the options of "
                             "'intN' are ':asym' (an affine grid with a zero point) and "
                             "':midrise' (2**N levels symmetric around 0, no zero)")
        return IntFormat(int(integer.group(2)), signed=not integer.group(1),
                         asymmetric=options == ["asym"], midrise=options == ["midrise"])
    custom = _CUSTOM.fullmatch(head)
    if custom is None:
        return _registered(spec, text)
    kwargs: dict[str, object] = {}
    for option in options:
        key, _, value = option.partition("=")
        if key == "bias":
            kwargs["bias"] = _int_option(spec, key, value)
        elif key == "special":
            kwargs["special"] = value
        elif key == "subnormals":
            kwargs["subnormals"] = value in ("1", "true", "yes")
        elif key == "overflow":
            kwargs["overflow"] = value
        else:
            raise FxquantValueError(f"unknown format option {key!r} in {spec!r}; options: bias, special, "
                             "subnormals, overflow")
    fmt = Format(int(custom.group(1)), int(custom.group(2)), **kwargs)  # type: ignore[arg-type]
    preset = next((name for name, p in PRESETS.items() if p == fmt), "")
    return PRESETS[preset] if preset else fmt


def _registered(spec: str, text: str) -> CustomFormat:
    """The registered format whose name starts ``text``, or an error that says what the
    built-in specs are and how to register a format of one's own."""
    letters = re.match(r"[a-z_]*", text)
    cls = _REGISTERED.get(letters.group(0) if letters else "")
    if cls is None:
        registered = f" Registered formats: {sorted(_REGISTERED)}." if _REGISTERED else ""
        raise UnregisteredError(
            f"unknown format {spec!r}; presets: {sorted(PRESETS)}, or 'eXmY' for X exponent "
            "and Y mantissa bits (e.g. 'e3m0'), 'intN' / 'uintN' / 'intN:asym' / "
            f"'intN:midrise' for integers, or 'topN' for top-N truncation.{registered} A "
            "format of one's own must be registered first, in this process: "
            "@fxquant.register_format on its fxquant.CustomFormat subclass.")
    try:
        fmt = cls.from_spec(text)
    except (TypeError, ValueError) as e:
        raise same_kind(e, f"format {spec!r} ({cls.__qualname__}): {e}") from e
    if not isinstance(fmt, cls):
        raise FxquantTypeError(f"{cls.__qualname__}.from_spec({text!r}) returned "
                               f"{type(fmt).__name__}, not a {cls.__qualname__}")
    return fmt


def as_scaled_format(value: object, arg: str = "format", max_bits: int = 64
                     ) -> tuple[AnyFormat, AnyScale | None]:
    """:func:`as_format`, and the scale the spec names (``"int8:row"``, ``"mxfp4"``; None
    where it names none): what a call that takes a scale reads its format with.

    Example:
        >>> fmt, scale = as_scaled_format("int8:asym:tensor")
        >>> fmt.spec(), scale.value
        ('int8:asym', 'tensor')
    """
    if isinstance(value, bool) or value is None or isinstance(value, float):
        raise FxquantTypeError(
            f"{arg} must be an int (kept bits) or a format ('e4m3', (3, 2), a Format), "
            f"got {value!r}"
        )
    scale: AnyScale | None = None
    if isinstance(value, int):
        bits = value
    else:
        try:
            parsed, scale = parse_scaled(value)
        except (ValueError, TypeError) as e:
            raise same_kind(e, f"{arg}: {e}") from e
        if not isinstance(parsed, TopN):
            return parsed, scale
        bits = parsed.bits
    if not 1 <= bits <= max_bits:
        raise FxquantValueError(
            f"{arg}={bits} is out of range: it counts the kept bits of the model's "
            f"{max_bits}-bit float pattern, so 1 <= {arg} <= {max_bits}."
        )
    return TopN(bits), scale


def as_format(value: object, arg: str = "format", max_bits: int = 64) -> AnyFormat:
    """A :class:`TopN` (an ``int`` of kept bits, ``"topN"``), a :class:`Format` (a preset
    name, ``"eXmY"``, ``(exp_bits, man_bits)``, a torch dtype), an :class:`IntFormat`
    (``"int8"``, ``("int", 4)``) or a registered :class:`CustomFormat`, validated; errors
    name ``arg``. A spec that names a scale too (``"int8:row"``) is refused: where a scale
    is taken, :func:`as_scaled_format` reads it.

    Example:
        >>> as_format(16), as_format("e4m3").spec()
        (TopN(bits=16), 'e4m3')
        >>> as_format(40, "bits", max_bits=32)
        Traceback (most recent call last):
        ...
        fxquant.errors.FxquantValueError: bits=40 is out of range: it counts the kept bits of the model's \
32-bit float pattern, so 1 <= bits <= 32.
    """
    fmt, scale = as_scaled_format(value, arg, max_bits)
    if scale is not None:
        raise FxquantValueError(
            f"{arg}={value!r} names a scale ({scale.value!r}) as well as a format, and {arg} "
            f"takes a format alone; please write {fmt.spec()!r}")
    return fmt


def __getattr__(name: str) -> Any:
    if name == "Number":  # the name AnyFormat had before
        warn_renamed("fxquant.formats.Number", "fxquant.formats.AnyFormat")
        return AnyFormat
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
