"""Mid-rise integer grids (``intN:midrise``: levels k + 1/2, 1 bit = the sign) and steps
shared between quantization points (``fxquant.share_step``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import fxquant
from fxquant import NodeBits, QuantConfig, QuantMapping
from fxquant.formats import IntFormat, parse
from fxquant.quant.lsq import lsq_round
from fxquant.quant.points import QuantPoint


def _levels(bits: int) -> np.ndarray:
    return np.arange(-(2 ** (bits - 1)), 2 ** (bits - 1)) + 0.5


def _nearest_level(u: np.ndarray, bits: int) -> np.ndarray:
    """NumPy reference: the nearest level of the grid, ties to the even code."""
    return np.clip(np.round(u - 0.5), -(2 ** (bits - 1)), 2 ** (bits - 1) - 1) + 0.5


def test_format_spec_levels_and_errors():
    fmt = parse("int2:midrise")
    assert fmt == IntFormat(2, midrise=True) and fmt.spec() == "int2:midrise"
    assert parse(fmt.spec()) == fmt and fmt.max_finite == 1.5
    assert [parse("int1:midrise").level(k) for k in (-1, 0)] == [-0.5, 0.5]
    with pytest.raises(ValueError, match="signed and symmetric"):
        parse("uint2:midrise")
    with pytest.raises(ValueError, match="options of 'intN'"):
        parse("int2:mid")
    with pytest.raises(ValueError, match=r"2\.\.16"):
        parse("int1")  # a 1-bit grid with a zero is {-1, 0}: still refused
    with pytest.raises(ValueError, match="no zero to round toward"):
        QuantConfig("int4:midrise", scale="tensor", rounding="toward_zero")
    with pytest.raises(ValueError, match="no zero to round toward"):
        fxquant.quantize(torch.ones(3), "int4:midrise", rounding="toward_zero", scale="none")


@pytest.mark.parametrize("bits", [1, 2, 3, 5])
@pytest.mark.parametrize("scale", ["none", "tensor", "row"])
def test_quantize_matches_a_numpy_reference(bits, scale):
    x = torch.randn(64, 9, generator=torch.Generator().manual_seed(bits)) * 3
    x[0, :3] = torch.tensor([0.0, -0.0, 1.0])  # exact zeros go to +-1/2 of a step
    y = fxquant.quantize(x, f"int{bits}:midrise", scale=scale)
    top = 2 ** (bits - 1) - 0.5
    if scale == "none":
        step = np.ones((1, 1))
    elif scale == "tensor":
        step = np.full((1, 1), float(x.abs().max()) / top)
    else:
        step = x.abs().amax(1, keepdim=True).double().numpy() / top
    expected = _nearest_level(x.double().numpy() / step, bits) * step
    np.testing.assert_allclose(y.double().numpy(), expected, rtol=1e-6, atol=1e-6)
    assert set(np.unique(y.double().numpy() / step).round(5)) <= set(_levels(bits))
    compiled = torch.compile(lambda t: fxquant.quantize(t, f"int{bits}:midrise", scale=scale))
    torch.testing.assert_close(compiled(x), y)


def test_stochastic_rounding_is_unbiased_inside_the_range():
    x = torch.full((200_000,), 0.3)
    y = fxquant.quantize(x, "int2:midrise", rounding="stochastic", scale="none",
                         generator=torch.Generator().manual_seed(0))
    assert set(y.unique().tolist()) == {-0.5, 0.5}
    assert float(y.mean()) == pytest.approx(0.3, abs=0.01)


@pytest.mark.parametrize("offset", [0.0, 0.5])
def test_lsq_gradients_match_the_chain_of_torch_ops(offset):
    """The fused function against autograd through divide, clamp, straight-through round,
    shift and multiply, with per-row ranges (as learned bit-widths give)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 6, dtype=torch.float64, generator=g, requires_grad=True)
    s = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
    lo = torch.full((40, 1), -2.0, dtype=torch.float64, requires_grad=True)
    hi = torch.full((40, 1), 1.0, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(40, 6, dtype=torch.float64, generator=g)

    def chain(x, s, lo, hi, gain, offset):
        sg = s * gain + (s - s * gain).detach()  # LSQ's gradient scale on s only
        u = torch.maximum(torch.minimum(x / sg - offset, hi), lo)
        return (u + (u.round() - u).detach() + offset) * sg

    results = []
    for fn in (lsq_round, chain):
        for t in (x, s, lo, hi):
            t.grad = None
        y = fn(x, s, lo, hi, 0.3, offset)
        (y * weight).sum().backward()
        results.append([y.detach(), x.grad, s.grad, lo.grad, hi.grad])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want)


def test_learned_step_and_one_bit_rows_land_on_their_grids():
    """Uniform int2:midrise with a learned step: levels {-1.5, -0.5, 0.5, 1.5} * s. Learned
    row bits down to 1: a 1-bit row is the sign times s / 2."""
    x = torch.randn(6, 40, generator=torch.Generator().manual_seed(2))
    point = QuantPoint(QuantConfig("int2:midrise", scale="tensor", range="lsq"), "lin")
    y = point(x).detach() / point.step.detach()
    assert set(y.unique().round(decimals=4).tolist()) == {-1.5, -0.5, 0.5, 1.5}

    bits = NodeBits.learned_init(6, 3.0, min_bits=1)
    bits.bits[:3] = 1.0
    config = QuantConfig("int8:midrise", scale="tensor", range="lsq", node_bits=bits)
    point = QuantPoint(config, "lin")
    y = point(x)
    s = point.step.detach()
    torch.testing.assert_close(y[:3].detach(), torch.sign(x[:3]) * s / 2)
    codes = (y[3:].detach() / s).unique().round(decimals=4)
    assert set(codes.tolist()) <= {-3.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5}
    y.pow(2).sum().backward()
    assert point.node_widths.bits.grad is not None and torch.isfinite(point.node_widths.bits.grad).all()
    with pytest.raises(ValueError, match="mid-rise"):
        QuantConfig("int8", scale="tensor", range="lsq", node_bits=NodeBits.learned_init(
            6, 3.0, min_bits=1))


class _TwoLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.b(self.a(x).relu())


def _shared(bits: str = "uint1") -> torch.fx.GraphModule:
    torch.manual_seed(0)
    config = QuantConfig(bits, scale="tensor", range="lsq")
    gm = fxquant.transform(_TwoLinear(), QuantMapping().set_name("a", config)
                           .set_name("b", config, site="input"))
    fxquant.share_step(gm, "b_input_quant", "a_quant")
    return gm


def test_shared_step_is_one_parameter_and_the_second_rounding_keeps_the_first():
    gm = _shared("uint2")
    first, second = gm.get_submodule("a_quant"), gm.get_submodule("b_input_quant")
    assert second.log_step is first.log_step
    assert sum(p is first.log_step for p in gm.parameters()) == 1
    seen = {}
    first.register_forward_hook(lambda m, i, o: seen.__setitem__("a", o.relu()))
    second.register_forward_hook(lambda m, i, o: seen.__setitem__("b", o))
    x = torch.randn(32, 4)
    gm(x * 0.01)  # the first batch fits the step on the first point's input
    step = float(first.step.detach())
    fxquant.refit_steps(gm)
    gm(x)  # fitted again, by the source only; the second point rounds nothing away
    assert float(first.step.detach()) != step
    torch.testing.assert_close(seen["b"], seen["a"])
    compiled = torch.compile(gm, fullgraph=True)
    torch.testing.assert_close(compiled(x), gm(x))


def test_shared_step_survives_save_and_load(tmp_path):
    gm = _shared("uint2")
    optimizer = torch.optim.Adam(gm.parameters(), lr=0.05)
    x = torch.randn(16, 4)
    for _ in range(3):
        optimizer.zero_grad()
        gm(x).pow(2).sum().backward()
        optimizer.step()
    path = tmp_path / "gm.pt"
    fxquant.save(gm, path)
    loaded = fxquant.load(path, _TwoLinear())
    assert loaded.get_submodule("b_input_quant").log_step is \
        loaded.get_submodule("a_quant").log_step
    torch.testing.assert_close(loaded.eval()(x), gm.eval()(x))


def test_share_step_errors_name_the_point_and_change_nothing():
    gm = _shared()
    with pytest.raises(ValueError, match=r"is not a submodule.*b_input_quant"):
        fxquant.share_step(gm, "nope", "a_quant")
    with pytest.raises(ValueError, match="source='b_input_quant' already shares 'a_quant'"):
        fxquant.share_step(gm, "a_quant", "b_input_quant")
    torch.manual_seed(0)
    plain = fxquant.transform(_TwoLinear(), QuantMapping().set_name("a", QuantConfig(
        "int8", scale="tensor")).set_name("b", QuantConfig("int8", scale="tensor", range="lsq"),
                                            site="input"))
    before = plain.get_submodule("b_input_quant").log_step
    with pytest.raises(ValueError, match="source='a_quant' is not a quantization point with a "
                                         "learned step"):
        fxquant.share_step(plain, "b_input_quant", "a_quant")
    assert plain.get_submodule("b_input_quant").log_step is before
