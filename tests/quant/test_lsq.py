"""The fused LSQ rounding equals the chain of torch ops it replaces, values and gradients."""

from __future__ import annotations

import pytest
import torch

from fxquant.quant.lsq import lsq_round


def chain(x, s, qmin, qmax, gain):
    """The reference: divide, clamp to the range, round straight-through, multiply back."""
    s = (s - s * gain).detach() + s * gain
    y = torch.maximum(torch.minimum(x / s, qmax), qmin)
    return (y + (y.round() - y).detach()) * s


@pytest.mark.parametrize("chunk", [None, 50])
@pytest.mark.parametrize("shape", [(64, 12), (40, 3, 5)])
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values_and_gradients_equal_the_chain(per_row, dtype, shape, chunk, monkeypatch):
    """Scalar or per-row ranges (learned bit-widths) and steps, in one chunk of rows or
    many (made small here)."""
    from fxquant.quant import lsq

    if chunk is not None:
        monkeypatch.setattr(lsq, "CHUNK", chunk)
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=dtype) * 3
    rows = (shape[0],) + (1,) * (len(shape) - 1)
    bits = torch.randint(2, 6, rows).to(dtype) if per_row else torch.tensor(3.0, dtype=dtype)
    step = 0.2 + torch.rand(rows, dtype=dtype) if per_row else torch.tensor(0.4, dtype=dtype)
    grad = torch.randn(*shape, dtype=dtype)
    results = []
    for fn in (lsq_round, chain):
        xi = x.clone().requires_grad_()
        s = step.clone().requires_grad_()
        b = bits.clone().requires_grad_()
        qmax = 2 ** (b - 1) - 1
        y = fn(xi, s, -qmax, qmax, 0.25)
        y.backward(grad)
        results.append((y.detach(), xi.grad, s.grad, b.grad))
    for got, want in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(got, want)
    assert (results[0][1] == 0).any() and (results[0][1] != 0).any()  # both sides of the range
    assert results[0][3].abs().sum() > 0


def test_only_x_needs_grad_and_meta():
    x = torch.randn(5, 3, requires_grad=True)
    y = lsq_round(x, torch.tensor(0.5), -8, 7)
    y.sum().backward()
    assert x.grad is not None
    m = lsq_round(torch.randn(5, 3, device="meta"), torch.tensor(0.5, device="meta"), -8, 7)
    assert m.device.type == "meta" and m.shape == (5, 3)
