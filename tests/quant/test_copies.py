"""Copies after training: ``deepcopy``, ``pickle``, ``torch.save``, ``state_dict`` and
``fxquant.save`` give a model that evaluates and keeps training like the original, for
every per-node and learned feature."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fxquant
from fxquant.quant.config import NodeBits, QuantConfig
from tests.quant import TwoGCN
from tests.support.copies import python_copy

N = 12
HUBS = torch.tensor([0, 5])
FEATURES = ("learned_bits", "shared_bits", "lsq", "shared_step", "override", "running",
            "percentile", "fixed_bits")
ROUTES = ("deepcopy", "pickle", "torch.save", "state_dict", "fxquant.save")


Net = TwoGCN


def _learned() -> QuantConfig:
    return QuantConfig("int8", scale="tensor", range="lsq",
                       node_bits=NodeBits.learned_init(N, 4.0))


def _lsq() -> QuantConfig:
    return QuantConfig("uint4", scale="tensor", range="lsq")


def build(feature: str) -> torch.fx.GraphModule:
    """A transformed Net with ``feature`` at its points (same weights every time)."""
    torch.manual_seed(0)
    m = fxquant.QuantMapping()
    if feature in ("learned_bits", "shared_bits"):
        m.set_name("conv1", _learned()).set_name("conv2", _learned(), site="message")
    elif feature in ("lsq", "shared_step"):
        m.set_name("conv1", _lsq()).set_name("conv2", _lsq(), site="input")
    elif feature == "override":
        m.set_name("conv1", QuantConfig("int4", scale="tensor")).set_nodes("conv1", HUBS, "int8")
    elif feature == "running":
        m.set_name("conv1", QuantConfig("int8", scale="tensor", decay=0.9))
    elif feature == "percentile":
        m.set_name("conv1", QuantConfig("int8", scale="tensor", range="percentile:99",
                                        decay=0.9))
    else:
        bits = (torch.arange(N) % 3 * 2 + 2).float()
        m.set_name("conv1", QuantConfig("int8", scale="tensor", node_bits=NodeBits(bits)))
    gm = fxquant.transform(Net(), m, lint="off")
    if feature == "shared_bits":
        fxquant.share_bits(gm, "conv2_message_quant", "conv1_quant")
    if feature == "shared_step":
        fxquant.share_step(gm, "conv2_input_quant", "conv1_quant")
    return gm


def _data(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, 4, generator=g), torch.randint(0, N, (2, 40), generator=g)


def _train(gm, steps: int, seed: int) -> None:
    optimizer = torch.optim.SGD(gm.parameters(), lr=0.05)
    for step in range(steps):
        x, edge_index = _data(seed + step)
        optimizer.zero_grad()
        ids = torch.randperm(N, generator=torch.Generator().manual_seed(seed + step))
        gm(x, edge_index, node_ids=ids).square().mean().backward()
        optimizer.step()


def copy_of(gm, route: str, feature: str, tmp_path):
    if route in ("deepcopy", "pickle", "torch.save"):
        return python_copy(gm, route)
    if route == "state_dict":
        again = build(feature)
        again.load_state_dict(copy.deepcopy(gm.state_dict()))
        return again
    path = tmp_path / "gm.pt"
    fxquant.save(gm, path)
    return fxquant.load(path, Net())


def _state(gm) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in gm.state_dict().items()}


@settings(max_examples=40)
@given(feature=st.sampled_from(FEATURES), route=st.sampled_from(ROUTES),
       steps=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_copies_after_training_evaluate_and_train_like_the_original(feature, route, steps,
                                                                    seed, tmp_path_factory):
    """After training, the copy evaluates like the original, takes the same next training
    step, and is independent of it."""
    gm = build(feature)
    _train(gm, steps, seed)
    again = copy_of(gm, route, feature, tmp_path_factory.mktemp("copy"))
    x, edge_index = _data(seed + 100)
    ids = torch.randperm(N, generator=torch.Generator().manual_seed(seed))
    gm.eval()
    again.eval()
    assert torch.equal(again(x, edge_index, node_ids=ids), gm(x, edge_index, node_ids=ids))
    gm.train()
    again.train()
    before = _state(gm)
    _train(again, 1, seed + 200)
    after_copy = _state(again)
    assert all(torch.equal(v, before[k]) for k, v in _state(gm).items())  # independent
    _train(gm, 1, seed + 200)
    after = _state(gm)
    assert after.keys() == after_copy.keys()
    for key in after:
        assert torch.equal(after[key], after_copy[key]), key


def test_reported_deepcopy_after_a_training_forward():
    """The everyday keep-the-best-model copy raised "Only Tensors created explicitly by
    the user ..." after a training forward with learned per-node bits."""
    gm = build("learned_bits")
    x, edge_index = _data(0)
    gm(x, edge_index).sum().backward()
    best = copy.deepcopy(gm)
    gm.eval()
    best.eval()
    assert torch.equal(best(x, edge_index), gm(x, edge_index))


@pytest.mark.parametrize("feature", ["learned_bits", "shared_bits"])
def test_bit_report_after_a_copy_runs_its_own_forward(feature):
    """A copy does not carry the last forward's bit-widths (the autograd graph); the bit
    report runs a forward and counts the same bits as the original."""
    gm = build(feature)
    x, edge_index = _data(1)
    gm(x, edge_index).sum().backward()
    again = copy.deepcopy(gm)
    assert again.get_submodule("conv1_quant").__dict__["last_widths"] is None
    assert fxquant.bit_report(again, x, edge_index).to_dict() == \
        fxquant.bit_report(gm, x, edge_index).to_dict()
