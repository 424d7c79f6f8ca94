"""What :func:`~fxquant.linter.functionalize.functionalize_inplace` tells: the rewrites it
made, the keys of ``gm.meta`` it writes, and the error when it returns nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from fxquant.errors import FxquantError
from fxquant.fx.locations import Location

__all__ = ["HOW_KEY", "KEPT_KEY", "REWRITES_KEY", "FunctionalizeError", "Rewrite"]

#: ``gm.meta`` key of the :class:`Rewrite` s made.
REWRITES_KEY: Final = "fxquant_rewrites"
#: ``gm.meta`` key of how the forward was made out of place ("symbolic" or "captured").
HOW_KEY: Final = "fxquant_functionalized"
#: ``gm.meta`` key of the writes kept as they are (into module state).
KEPT_KEY: Final = "fxquant_kept"


class FunctionalizeError(FxquantError, RuntimeError):
    """functionalize_inplace cannot return an equivalent model; the message says where and why."""


@dataclass(frozen=True)
class Rewrite:
    """One in-place write made out of place: where, what it was, what it became."""

    location: Location | None
    before: str
    after: str

    def __str__(self) -> str:
        code = f" `{self.location.code}`" if self.location and self.location.code else ""
        return f"{self.location or '?'}:{code} {self.before} -> {self.after}"
