"""QuantConfig and QuantMapping: one vocabulary, one precedence, JSON round trips."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch_geometric.nn import GCNConv

import fxquant
from fxquant import QuantConfig, QuantMapping
from fxquant.formats import TopN, parse
from fxquant.modes import Grad, Rounding, Scale
from tests.support.models import GCN, MLPGCN


def configs(gm):
    return {p.layer: p.config for _, p in fxquant.quantization_points(gm)}


def test_config_normalizes_and_validates_once():
    """Strings become the vocabulary's members; defaults depend on the number."""
    c = QuantConfig(16)
    assert (c.format, c.rounding, c.scale, c.grad) == (TopN(16), Rounding.TOWARD_ZERO, Scale.NONE,
                                                      Grad.STE)
    f = QuantConfig("e4m3", scale="tensor", decay=0.9, grad_format="e5m2")
    assert f.format is parse("e4m3") and f.rounding is Rounding.NEAREST and f.decay == 0.9
    assert QuantConfig.from_dict(json.loads(json.dumps(f.to_dict()))) == f
    with pytest.raises(ValueError, match="rounding='up'"):
        QuantConfig(8, "up")
    with pytest.raises(ValueError, match="scale='tensor' applies to formats"):
        QuantConfig(8, scale="tensor")
    with pytest.raises(TypeError, match="QuantConfig needs a format"):
        QuantConfig(None)  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        c.rounding = Rounding.NEAREST  # type: ignore[misc]


def test_precedence_global_type_pattern_name():
    """global < type < pattern < name, whatever the order of the calls."""
    mapping = (QuantMapping()
               .set_name("conv2", QuantConfig(9))
               .set_pattern("conv*", QuantConfig(11))
               .set_type(GCNConv, QuantConfig(12))
               .set_global(QuantConfig(16)))
    got = configs(fxquant.transform(GCN(), mapping))
    assert {k: v.format.bits for k, v in got.items()} == {"conv1": 11, "conv2": 9}


def test_global_covers_message_passing_and_none_excludes():
    """The global entry covers MessagePassing layers; a None config takes one out."""
    mapping = QuantMapping().set_global(QuantConfig(10)).set_name("conv1", None)
    assert list(configs(fxquant.transform(GCN(), mapping))) == ["conv2"]
    mixed = QuantMapping().set_global(QuantConfig(10)).set_type(nn.Linear, QuantConfig("e4m3"))
    assert {k: v.format.spec() for k, v in configs(fxquant.transform(MLPGCN(), mixed)).items()} \
        == {"lin": "e4m3", "conv": "top10"}


def test_sugar_builds_the_same_mapping():
    """bits=/layers=/node_bits= give what the equivalent mapping gives."""
    nodes = torch.tensor([0, 2])
    sugar = fxquant.transform(GCN(), bits=12, rounding="nearest", layers=["conv1", "sig*"],
                              node_formats={"conv1": (nodes, 4)})
    mapping = (QuantMapping().set_name("conv1", QuantConfig(12, "nearest"))
               .set_pattern("sig*", QuantConfig(12, "nearest")).set_nodes("conv1", nodes, 4))
    general = fxquant.transform(GCN(), mapping)
    assert configs(sugar) == configs(general)
    assert fxquant.summary(sugar) == fxquant.summary(general)


def test_mapping_json_round_trip():
    """Names, patterns, types and node overrides survive JSON; predicates are refused."""
    mapping = (QuantMapping().set_global(QuantConfig(16)).set_type(GCNConv, QuantConfig("e4m3"))
               .set_pattern("conv*", QuantConfig(10, "stochastic")).set_name("conv2", None)
               .set_nodes("conv1", [1, 3], "e2m1"))
    again = QuantMapping.from_dict(json.loads(mapping.to_json()))
    assert repr(again) == repr(mapping)
    a, b = fxquant.transform(GCN(), mapping), fxquant.transform(GCN(), again)
    assert fxquant.summary(a) == fxquant.summary(b)
    with pytest.raises(ValueError, match="predicate"):
        QuantMapping().set_pattern(lambda n: True, QuantConfig(8)).to_dict()


@pytest.mark.parametrize(
    ("build", "exc", "match"),
    [
        (lambda m: m.set_name("nope", QuantConfig(8)), ValueError,
         r"unknown layer 'nope' in the mapping"),
        (lambda m: m.set_type(nn.LSTM, QuantConfig(8)), ValueError, "no layer of class LSTM"),
        (lambda m: m.set_global(8), TypeError, "config must be a QuantConfig"),
        (lambda m: m.set_type(int, QuantConfig(8)), TypeError, "torch.nn.Module subclass"),
        (lambda m: m.set_global(QuantConfig(8), site="edges"), ValueError, "site='edges'"),
    ],
)
def test_mapping_errors_name_the_entry(build, exc, match):
    with pytest.raises(exc, match=match):
        fxquant.transform(GCN(), build(QuantMapping()))


def test_a_mapping_says_everything():
    """Keyword sugar next to a mapping is an error that says where it goes instead."""
    with pytest.raises(ValueError, match=r"rounding=.nearest. and a QuantMapping were both given"):
        fxquant.transform(GCN(), QuantMapping().set_global(QuantConfig(8)), rounding="nearest")


@pytest.mark.parametrize("grad_format", ["int8", "e4m3", 9])
def test_a_gradient_format_is_the_one_named(grad_format):
    """Top-N values with a gradient format: the gradient is rounded to that format (an
    integer format is not its top bits), with the values' rounding."""
    x = torch.tensor([0.3, -2.7, 40.0], requires_grad=True)
    gm = fxquant.transform(nn.Sequential(nn.Identity()), QuantConfig(16, grad_format=grad_format),
                           layers="0")
    gm(x).backward(torch.tensor([0.4, -1.6, 300.0]))
    expected = fxquant.truncate(torch.tensor([0.4, -1.6, 300.0]), grad_format) \
        if isinstance(grad_format, int) else \
        fxquant.quantize(torch.tensor([0.4, -1.6, 300.0]), grad_format, "toward_zero",
                         scale="none")
    assert torch.equal(x.grad, expected)
