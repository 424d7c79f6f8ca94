"""QuantPoint.grid: the integer grid a point rounds to in evaluation, read as codes and a
step, gives back exactly what the point returns."""

from __future__ import annotations

import pytest
import torch

import fxquant
from fxquant import NodeBits, NodeOverride, QuantConfig, QuantPoint

ROWS = 6

CONFIGS = {
    "int8 tensor": dict(format="int8", scale="tensor"),
    "int4 row": dict(format="int4", scale="row"),
    "int4:asym tensor": dict(format="int4:asym", scale="tensor"),
    "int4:asym row": dict(format="int4:asym", scale="row"),
    "uint4 tensor": dict(format="uint4", scale="tensor"),
    "int3:midrise tensor": dict(format="int3:midrise", scale="tensor"),
    "int4 tensor-pow2": dict(format="int4", scale="tensor-pow2"),
    "int4 row-pow2": dict(format="int4", scale="row-pow2"),
    "int4 block32": dict(format="int4", scale="block32"),
    "int8 unscaled": dict(format="int8"),
    "int4 toward_zero": dict(format="int4", scale="tensor", rounding="toward_zero"),
    "int8 running": dict(format="int8", scale="tensor", decay=0.9),
    "int8 widening": dict(format="int8", scale="tensor", observe="widen"),
    "int8 percentile": dict(format="int8", scale="tensor", range="percentile:90"),
    "int4 lsq": dict(format="int4", scale="tensor", range="lsq"),
    "int4:midrise lsq": dict(format="int4:midrise", scale="tensor", range="lsq"),
    "uint4 lsq": dict(format="uint4", scale="tensor", range="lsq"),
    "node bits fixed": dict(format="int8", scale="tensor",
                            node_bits=NodeBits(torch.tensor([2, 3, 4, 5, 6, 8]))),
    "node bits fixed row": dict(format="int8", scale="row",
                                node_bits=NodeBits(torch.tensor([2, 3, 4, 5, 6, 8]))),
    "node bits learned": dict(format="int8", scale="tensor", range="lsq",
                              node_bits=NodeBits.learned_init(ROWS, 4.0)),
}
OVERRIDES = {"int4 tensor + int8 nodes": dict(format="int4", scale="tensor"),
             "int4 lsq + int2 nodes": dict(format="int4", scale="tensor", range="lsq")}


def _data(seed: int, cols: int = 40) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(ROWS, cols, generator=g) * torch.linspace(0.1, 3.0, ROWS)[:, None]


def _trained(config: dict, override: NodeOverride | None = None) -> QuantPoint:
    kwargs = dict(config)
    point = QuantPoint(QuantConfig(kwargs.pop("format"), **kwargs), "conv1", override=override)
    for seed in range(3):
        point.train()(_data(seed))
    return point.eval()


def _check(point: QuantPoint, x: torch.Tensor) -> fxquant.quant.IntegerGrid:
    with torch.no_grad():
        expected = point(x)
    grid = point.grid(x)
    codes = grid.codes(x)
    assert codes.dtype == torch.int32 and codes.shape == x.shape
    assert bool((codes >= grid.qmin).all()) and bool((codes <= grid.qmax).all())
    assert torch.equal(grid.values(codes).to(x.dtype), expected)
    return grid


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_codes_times_the_step_are_the_points_values(name):
    """For every way an integer point takes its step (learned, stored, from the data,
    none), the codes of a fresh tensor, read through the grid, give the point's output
    bit for bit; the grid names where its step comes from."""
    point = _trained(CONFIGS[name])
    grid = _check(point, _data(10))
    assert grid.format == point.config.format and grid.rounding is point.config.rounding
    want = "learned" if point.config.range == "lsq" else "none" if name == "int8 unscaled" \
        else "stored" if name in ("int8 running", "int8 widening") else "data"
    assert grid.source == want
    if point.config.node_bits is not None:
        assert grid.bits is not None and grid.bits.shape == (ROWS,)


@pytest.mark.parametrize("name", sorted(OVERRIDES))
def test_a_node_override_gives_its_rows_their_format_s_range(name):
    over = "int8" if "int8" in name else "int2"
    point = _trained(OVERRIDES[name], NodeOverride(torch.tensor([1, 4]), over))
    grid = _check(point, _data(11))
    assert isinstance(grid.qmax, torch.Tensor)
    assert grid.qmax.view(-1).tolist()[1] == (127 if over == "int8" else 1)


def test_a_stored_or_learned_step_needs_no_values():
    """A learned step or a running range is the point's state: the grid is known without
    a tensor; a range taken over each tensor is not, and says so."""
    for config in (CONFIGS["int4 lsq"], CONFIGS["int8 running"]):
        grid = _trained(config).grid()
        assert grid.step.numel() == 1
    with pytest.raises(ValueError, match="please pass them as x"):
        _trained(CONFIGS["int8 tensor"]).grid()


@pytest.mark.parametrize("format", [16, "e4m3", "e2m1"])
def test_formats_without_an_integer_grid_are_refused(format):
    config = QuantConfig(format, scale=None if format == 16 else "tensor")
    with pytest.raises(ValueError, match="no integer grid"):
        QuantPoint(config, "conv1").grid(torch.ones(2, 2))


def test_the_grid_of_a_transformed_model_s_point_follows_its_node_ids():
    """Per-node widths are looked up by global node id, as the forward does with node_ids=."""
    table = torch.tensor([2, 3, 4, 5, 6, 8, 8, 2, 3, 4])
    point = QuantPoint(QuantConfig("int8", scale="row", node_bits=NodeBits(table)), "c").eval()
    x, ids = _data(3), torch.tensor([9, 0, 5, 5, 1, 7])
    grid = point.grid(x, node_ids=ids)
    assert grid.bits.tolist() == table[ids].float().tolist()
