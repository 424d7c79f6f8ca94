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
@pytest.mark.parametrize("shape", [(64, 12), (40, 3, 5), (300,)])
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("data", ["activations", "features"])
def test_values_and_gradients_equal_the_chain(per_row, dtype, shape, chunk, data, monkeypatch):
    """Scalar or per-row ranges (learned bit-widths) and steps, in one chunk of rows or
    many (made small here); activations that need a gradient, or mostly-zero features
    that do not (rounded over their non-zero entries when large enough)."""
    from fxquant.quant import lsq

    if chunk is not None:
        monkeypatch.setattr(lsq, "CHUNK", chunk)
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=dtype) * 3
    features = data == "features"
    if features:
        x = x * (torch.rand(*shape) < 0.1)
        x.view(-1)[:3] = torch.tensor([-0.0, 0.0, 7.0])
    rows = (shape[0],) + (1,) * (len(shape) - 1)
    bits = torch.randint(2, 6, rows).to(dtype) if per_row else torch.tensor(3.0, dtype=dtype)
    step = 0.2 + torch.rand(rows, dtype=dtype) if per_row else torch.tensor(0.4, dtype=dtype)
    grad = torch.randn(*shape, dtype=dtype)
    results = []
    for fn in (lsq_round, chain):
        xi = x.clone().requires_grad_(not features)
        s = step.clone().requires_grad_()
        b = bits.clone().requires_grad_()
        qmax = 2 ** (b - 1) - 1
        y = fn(xi, s, -qmax, qmax, 0.25)
        y.backward(grad)
        results.append((y.detach(), xi.grad, s.grad, b.grad))
    for got, want in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(got, want)
    if not features:
        assert (results[0][1] == 0).any() and (results[0][1] != 0).any()  # both sides
    assert results[0][3].abs().sum() > 0


def test_features_are_rounded_over_their_non_zero_entries(monkeypatch):
    """A large mostly-zero input without a gradient takes the non-zero entries' path, its
    entries are found once while it is the same tensor, and found again after an
    in-place change."""
    from fxquant.quant import lsq

    calls = []
    real = lsq._sparse_backward
    monkeypatch.setattr(lsq, "_sparse_backward", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(600, 200) * (torch.rand(600, 200) < 0.02)
    s = torch.tensor(0.1, requires_grad=True)
    for _ in range(2):
        lsq_round(x, s, -7, 7).sum().backward()
    assert len(calls) == 2
    flat = lsq._ENTRIES.value[0]
    x[0, 0] = 1.0  # in place: its entries are found again
    lsq_round(x, s, -7, 7)
    assert lsq._ENTRIES.value[0].numel() == flat.numel() + (flat[0] != 0)
    monkeypatch.setattr(lsq, "SPARSE_DENSITY", -1.0)
    lsq._ENTRIES.clear()
    x[1, :3] = torch.tensor([-0.0, float("nan"), float("inf")])
    want = lsq_round(x, s, -7, 7)
    monkeypatch.setattr(lsq, "SPARSE_DENSITY", 0.125)
    got = lsq_round(x, s, -7, 7)  # the same bits, signed zeros and NaN included
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    dense = torch.randn(600, 200)  # too dense: the chunked path
    lsq_round(dense, s, -7, 7).sum().backward()
    assert len(calls) == 2


@pytest.mark.parametrize("negative_zeros", [False, True])
def test_non_zero_entries_path_keeps_every_bit(negative_zeros, monkeypatch):
    """Features with or without -0.0 among their zeros (bag-of-words rows have none): the
    non-zero entries' path gives the dense path's bits, zeros' signs included, and the
    same gradient of the step."""
    from fxquant.quant import lsq

    g = torch.Generator().manual_seed(1)
    mask = torch.rand(600, 200, generator=g) < 0.02
    values = torch.randn(600, 200, generator=g)
    x = values * mask if negative_zeros else torch.where(mask, values, 0.0)
    assert bool((x == 0).logical_and(x.signbit()).any()) == negative_zeros
    results = []
    for density in (0.125, -1.0):  # the entries' path, then the dense one
        monkeypatch.setattr(lsq, "SPARSE_DENSITY", density)
        lsq._ENTRIES.clear()
        s = torch.tensor(0.1, requires_grad=True)
        y = lsq_round(x, s, -7, 7)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        results.append((y.detach().view(torch.int32), s.grad))
    assert lsq._ENTRIES.value is None  # (the dense path ran last)
    assert torch.equal(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])


def test_only_x_needs_grad_and_meta():
    x = torch.randn(5, 3, requires_grad=True)
    y = lsq_round(x, torch.tensor(0.5), -8, 7)
    y.sum().backward()
    assert x.grad is not None
    m = lsq_round(torch.randn(5, 3, device="meta"), torch.tensor(0.5, device="meta"), -8, 7)
    assert m.device.type == "meta" and m.shape == (5, 3)


@pytest.mark.parametrize("offset", [0.0, 0.5])
@pytest.mark.parametrize("per_row", [False, True])
def test_float_masks_give_the_where_path_gradients(offset, per_row):
    """The eager backward's masks of 1.0 and 0.0 give exactly the gradients of the
    ``torch.where`` path (compiled code, non-finite gradients), NaN and infinite values
    of ``x`` included; the `where` path is taken where the gradient is not finite."""
    from fxquant.quant import lsq

    g = torch.Generator().manual_seed(3)
    x = torch.randn(300, 8, generator=g) * 4
    x.view(-1)[:6] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 2.5])
    s = torch.tensor(0.7)
    rows = (300, 1) if per_row else ()
    hi = torch.randint(0, 8, rows, generator=g).float()
    lo = -hi - 1 if offset else -hi
    grad = torch.randn(300, 8, generator=g)
    results = []
    for floats in (True, False):
        grad_x = torch.empty_like(x)
        u = x / s - offset
        sums = lsq._grads(u, lo, hi, grad, offset, grad_x, True, True, lsq._row_sums, floats)
        results.append((grad_x, *sums))
    for got, want in zip(*results, strict=True):
        assert torch.equal(got, want)
    assert bool(torch.isfinite(results[0][1]).all())  # NaN x adds nothing to d
    assert lsq._masks_as_floats(grad)
    grad[0, 0] = float("inf")
    assert not lsq._masks_as_floats(grad)


def test_non_finite_gradients_keep_the_where_semantics():
    """An infinite output gradient outside the range gives x a gradient of 0 there (the
    float masks would give NaN) and stays out of the range's gradient."""
    x = torch.tensor([[0.1, 9.0], [-9.0, 0.2]], requires_grad=True)
    qmax = torch.tensor(3.0, requires_grad=True)
    y = lsq_round(x, torch.tensor(0.5), -qmax, qmax)
    y.backward(torch.tensor([[1.0, 2.0], [float("inf"), 1.0]]))
    assert torch.equal(x.grad, torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    assert float(qmax.grad) == float("-inf")  # above: 2 * 0.5; below: -inf * 0.5 * -1
