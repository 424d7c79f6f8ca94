"""Degree-Quant's protection as a config: :class:`Protection` (the part that draws the
masks is :class:`~fxquant.quant.protective_mask.ProtectiveMask`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fxquant.errors import FxquantValueError
from fxquant.quant.validation import require_keys

__all__ = ["Protection"]

_SHARE = ("point", "layer")
_MESSAGES = ("target", "source")
_RANGE_ROWS = ("all", "unprotected")


@dataclass(frozen=True)
class Protection:
    """Degree-Quant's protective mask (Tailor et al., ICLR 2021), and how a layer's
    quantization points use it.

    In training, each node stays at full precision with probability ``p_min + (p_max -
    p_min) * F(in-degree)``, ``F`` the fraction of nodes with at most its in-degree (the
    in-degree of the forward's own graph: a mini-batch's subgraph); in evaluation every
    node is rounded.

    Args:
        p_min (float): the probability of the lowest in-degree.
        p_max (float): the probability of the highest in-degree.
        share (str, optional): ``"point"``: each point draws its own mask;
            ``"layer"``: one mask per layer and forward, shared by all of the layer's
            points (Degree-Quant's; a layer called twice in one forward keeps its first
            draw). (default: ``"point"``)
        messages (str, optional): which node's draw a message (and a per-edge argument)
            follows: its ``"target"`` (the node it is aggregated into) or its
            ``"source"`` (the node that sent it, Degree-Quant's). (default: ``"target"``)
        ranges (str, optional): the rows a range (``minmax``, ``percentile``) is taken
            over: ``"all"`` of them, or only the ``"unprotected"`` ones, which are the only
            ones rounded (Degree-Quant's). (default: ``"all"``)

    A ``(p_min, p_max)`` tuple means ``Protection(p_min, p_max)``, and a Protection
    unpacks like that tuple.

    Example:
        >>> Protection(0.0, 0.2) == (0.0, 0.2)
        True
        >>> p_min, p_max = Protection(0.0, 0.2, share="layer", messages="source")
        >>> Protection(0.0, 0.2, share="layer", messages="source").describe()
        'protect 0..0.2 (layer mask, messages by source)'
    """

    p_min: float
    p_max: float
    share: str = "point"
    messages: str = "target"
    ranges: str = "all"

    def __post_init__(self) -> None:
        ok = all(isinstance(p, (int, float)) and not isinstance(p, bool)
                 for p in (self.p_min, self.p_max))
        if not ok or not 0 <= self.p_min <= self.p_max <= 1:
            raise FxquantValueError(f"protect must be (p_min, p_max) with 0 <= p_min <= p_max "
                                    f"<= 1, got {(self.p_min, self.p_max)!r}")
        object.__setattr__(self, "p_min", float(self.p_min))
        object.__setattr__(self, "p_max", float(self.p_max))
        for name, allowed in (("share", _SHARE), ("messages", _MESSAGES),
                              ("ranges", _RANGE_ROWS)):
            if getattr(self, name) not in allowed:
                raise FxquantValueError(f"Protection: {name}={getattr(self, name)!r} is not one "
                                        f"of {list(allowed)}")

    @classmethod
    def parse(cls, value: object) -> Protection:
        """A Protection from itself or a ``(p_min, p_max)`` pair."""
        if isinstance(value, Protection):
            return value
        if isinstance(value, (tuple, list)) and len(value) == 2:
            return cls(*value)
        raise FxquantValueError(f"protect must be (p_min, p_max) with 0 <= p_min <= p_max <= 1, "
                                f"or a fxquant.Protection; got {value!r}")

    def __iter__(self) -> Any:
        return iter((self.p_min, self.p_max))

    def __getitem__(self, index: int) -> float:
        return (self.p_min, self.p_max)[index]

    def __len__(self) -> int:
        return 2

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (tuple, list)):
            try:
                other = Protection.parse(other)
            except FxquantValueError:
                return False
        if not isinstance(other, Protection):
            return NotImplemented
        return (self.p_min, self.p_max, self.share, self.messages, self.ranges) == (
            other.p_min, other.p_max, other.share, other.messages, other.ranges)

    def __hash__(self) -> int:
        return hash((self.p_min, self.p_max, self.share, self.messages, self.ranges))

    @property
    def plain(self) -> bool:
        """Only the probabilities differ from the defaults (what a tuple says)."""
        return (self.share, self.messages, self.ranges) == ("point", "target", "all")

    def describe(self) -> str:
        notes = []
        if self.share == "layer":
            notes.append("layer mask")
        if self.messages == "source":
            notes.append("messages by source")
        if self.ranges == "unprotected":
            notes.append("ranges over unprotected rows")
        text = f"protect {self.p_min:g}..{self.p_max:g}"
        return text + (f" ({', '.join(notes)})" if notes else "")

    def to_dict(self) -> list[float] | dict[str, Any]:
        """``[p_min, p_max]`` when only the probabilities are set, else every field."""
        if self.plain:
            return [self.p_min, self.p_max]
        return {"p_min": self.p_min, "p_max": self.p_max, "share": self.share,
                "messages": self.messages, "ranges": self.ranges}

    @classmethod
    def from_dict(cls, data: object) -> Protection:
        """The Protection :meth:`to_dict` wrote."""
        if isinstance(data, dict):
            require_keys(data, ("p_min", "p_max"), "Protection")
            return cls(**data)
        return cls.parse(data)
