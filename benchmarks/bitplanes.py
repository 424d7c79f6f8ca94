# ruff: noqa: RUF005  (written the way the user's code writes it)
# mypy: disable-error-code="no-untyped-def"
"""The bit-plane baseline of ``bench_truncate``: a user's float -> bit-planes -> float
rounding, as written in the report that fxquant's truncation replaces (do not copy).

``float2bit`` expands each value into ``1 + 8 + 23`` float "bits" through two helpers
(``integer2bit``, ``remainder2bit``: powers of two from ``torch.arange``, ``% 1`` and
``floor``), ``bit2float`` folds them back with ``out *=`` twice into a view of a saved pow
result: a ``[..., 135]`` float per value, and a backward that fails.
"""

from __future__ import annotations

import torch

__all__ = ["bit2float", "bitplane_roundtrip", "float2bit"]


def integer2bit(integer, num_bits=8):
    """Integer-valued float tensor -> its lowest ``num_bits`` bits, most significant first."""
    exponent_bits = -torch.arange(-(num_bits - 1), 1).type(integer.type())
    exponent_bits = exponent_bits.repeat(integer.shape + (1,))
    out = integer.unsqueeze(-1) / 2**exponent_bits
    return (out - (out % 1)) % 2


def remainder2bit(remainder, num_bits=127):
    """Fractions in [0, 1) -> their first ``num_bits`` binary digits."""
    dtype = remainder.type()
    exponent_bits = torch.arange(num_bits).type(dtype)
    exponent_bits = exponent_bits.repeat(remainder.shape + (1,))
    out = (remainder.unsqueeze(-1) * 2**exponent_bits) % 1
    return torch.floor(2 * out)


def float2bit(f, num_e_bits=8, num_m_bits=23, bias=127.0, dtype=torch.float32):
    """float -> [..., 1 + num_e_bits + num_m_bits] bit-planes (the user's code)."""
    s = torch.sign(f)
    f = f * s
    s = (s * (-1) + 1.0) * 0.5
    s = s.unsqueeze(-1)
    e_scientific = torch.floor(torch.log2(f))
    e_decimal = e_scientific + bias
    e = integer2bit(e_decimal, num_bits=num_e_bits)
    m1 = integer2bit(f - f % 1, num_bits=num_e_bits)
    m2 = remainder2bit(f % 1, num_bits=bias)
    m = torch.cat([m1, m2], dim=-1)
    dtype = f.type()
    idx = torch.arange(num_m_bits).unsqueeze(0).type(dtype) + (8.0 - e_scientific).unsqueeze(-1)
    idx = idx.long()
    m = torch.gather(m, dim=-1, index=idx)
    return torch.cat([s, e, m], dim=-1).type(dtype)


def bit2float(b, num_e_bits=8, num_m_bits=23, bias=127.0):
    """bit-planes -> float (the user's code: `out *=` twice into a view of pow's output)."""
    dtype = torch.float32
    s = torch.index_select(b, -1, torch.arange(0, 1))
    e = torch.index_select(b, -1, torch.arange(1, 1 + num_e_bits))
    m = torch.index_select(b, -1, torch.arange(1 + num_e_bits, 1 + num_e_bits + num_m_bits))
    out = ((-1) ** s).squeeze(-1).type(dtype)
    exponents = -torch.arange(-(num_e_bits - 1.0), 1.0)
    exponents = exponents.repeat(b.shape[:-1] + (1,))
    e_decimal = torch.sum(e * 2**exponents, dim=-1) - bias
    out *= 2**e_decimal
    matissa = (torch.Tensor([2.0]) ** (-torch.arange(1.0, num_m_bits + 1.0))).repeat(m.shape[:-1] + (1,))
    out *= 1.0 + torch.sum(m * matissa, dim=-1)
    return out


def bitplane_roundtrip(x):
    """What the model does between layers: float -> bit-planes -> float."""
    return bit2float(float2bit(x))
