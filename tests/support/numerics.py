"""Independent NumPy references and helpers for the numerics tests."""

from __future__ import annotations

import numpy as np
import torch

from fxquant.formats import Format


def random_floats(n: int = 1_000_000, seed: int = 0) -> torch.Tensor:
    """Random bit patterns (every class: NaN, inf, subnormal, huge) and normal-ish values."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randint(-(2**31), 2**31, (n,), generator=g, dtype=torch.int64)
    values = [patterns.to(torch.int32).view(torch.float32)]
    for scale in (1e-6, 1e-2, 1.0, 100.0, 1e5):
        values.append(torch.randn(n // 4, generator=g) * scale)
    return torch.cat(values)


def same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: identical bits, or both NaN."""
    return (a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())


def format_values(fmt: Format) -> np.ndarray:
    """All non-negative finite values of ``fmt``, in code order (independent of fxquant)."""
    values = []
    for e_field in range(2**fmt.exp_bits):
        for m_field in range(2**fmt.man_bits):
            if fmt.special == "ieee" and e_field == 2**fmt.exp_bits - 1:
                continue
            if fmt.special == "nan_only" and e_field == 2**fmt.exp_bits - 1 and \
                    m_field == 2**fmt.man_bits - 1:
                continue
            if e_field == 0:
                value = m_field * 2.0 ** (1 - fmt.bias - fmt.man_bits)
            else:
                value = (1 + m_field / 2**fmt.man_bits) * 2.0 ** (e_field - fmt.bias)
            values.append(value)
    return np.array(values, dtype=np.float64)


def np_quantize(x: np.ndarray, fmt: Format, rounding: str) -> np.ndarray:
    """Nearest value by search in the list of values (ties to the even code)."""
    grid = format_values(fmt)
    with np.errstate(invalid="ignore"):
        return _np_quantize(x, grid, fmt, rounding)


def _np_quantize(x: np.ndarray, grid: np.ndarray, fmt: Format, rounding: str) -> np.ndarray:
    a = np.abs(x.astype(np.float64))
    hi = np.clip(np.searchsorted(grid, a, side="left"), 0, len(grid) - 1)
    lo = np.clip(hi - 1, 0, None)
    exact = grid[hi] == a
    if rounding == "toward_zero":
        idx = np.where(exact, hi, lo)
    else:
        d_lo, d_hi = a - grid[lo], grid[hi] - a
        idx = np.where(d_lo < d_hi, lo, hi)
        tie = d_lo == d_hi
        idx = np.where(tie & ~exact, np.where(lo % 2 == 0, lo, hi), idx)
    y = grid[idx]
    top = grid[-1]
    y = np.where(a > top, top, y)
    if rounding == "nearest" and fmt.overflow == "inf":
        half_ulp = (grid[-1] - grid[-2]) / 2
        y = np.where(a >= top + half_ulp, np.inf, y)
    if not fmt.subnormals:
        y = np.where(y < 2.0 ** (1 - fmt.bias), 0.0, y)
    y = np.where(np.isinf(a), np.inf if fmt.special == "ieee" else top, y)
    y = np.copysign(y, x)
    return np.where(np.isnan(x), np.nan, y).astype(np.float32)
