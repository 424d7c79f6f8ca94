"""Paired statistics of the experiments: the mean difference of two runs seed by seed and
its 95% interval from Student's t (scipy's quantiles).

Seeds are paired: each seed's runs start from the same initial weights, so the difference
of two configurations is taken seed by seed, and its interval is the t interval of those
differences.

Example:
    >>> from experiments.stats import paired
    >>> d = paired([0.82, 0.80, 0.81], [0.81, 0.80, 0.79])   # (a - b), in points
    >>> round(d.mean, 2), str(d)
    (1.0, '+1.0 [-1.5, +3.5]')
    >>> paired([0.82], [0.81]) is None                         # one pair: no interval
    True
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as _scipy_stats

__all__ = ["Difference", "paired", "t95"]


def t95(dof: int) -> float:
    """The two-sided 95% quantile of Student's t with ``dof`` degrees of freedom (scipy's
    ``t.ppf(0.975, dof)``: 12.71 at 1, 2.26 at 9, 2.05 at 28, 2.04 at 30).

    Args:
        dof (int): degrees of freedom, 1 or more.
    """
    if dof < 1:
        raise ValueError(f"t95: degrees of freedom must be >= 1, got {dof}")
    return float(_scipy_stats.t.ppf(0.975, dof))


@dataclass(frozen=True)
class Difference:
    """A paired difference in points (percentage points of accuracy): its mean and the
    bounds of its 95% t interval, over ``n`` pairs. ``str()`` is the tables' form,
    ``+1.0 [-1.5, +3.5]``."""

    mean: float
    low: float
    high: float
    n: int

    def __str__(self) -> str:
        return f"{self.mean:+.1f} [{self.low:+.1f}, {self.high:+.1f}]"

    @property
    def half_width(self) -> float:
        """Half the interval's width (an error bar)."""
        return (self.high - self.low) / 2

    def as_dict(self) -> dict[str, float]:
        """``{"mean", "low", "high"}``, as the results' JSON files write it."""
        return {"mean": self.mean, "low": self.low, "high": self.high}


def paired(a: Sequence[float], b: Sequence[float]) -> Difference | None:
    """The mean of ``a - b`` seed by seed, in points (``100 *`` the accuracies' difference),
    and its 95% t interval; ``None`` with fewer than two pairs.

    The sign convention is the one of ``scipy.stats.ttest_rel(a, b)``: positive where ``a``
    is larger, so ``paired(quantized, fp32)`` is negative where rounding costs accuracy.
    Where one list is longer (a baseline run on more seeds), the pairs are its first
    ``min(len(a), len(b))`` entries, seed by seed.

    Args:
        a (Sequence[float]): one configuration's accuracies (fractions), seed by seed.
        b (Sequence[float]): the other's, on the same seeds in the same order.
    """
    n = min(len(a), len(b))
    if n < 2:
        return None
    diffs = [100 * (x - y) for x, y in zip(a[:n], b[:n], strict=True)]
    mean = statistics.mean(diffs)
    half = t95(n - 1) * statistics.stdev(diffs) / n**0.5
    return Difference(mean, mean - half, mean + half, n)
