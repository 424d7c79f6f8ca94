"""``decay=``: the weight of the old range in a running range (the complement of
BatchNorm's ``momentum``). ``momentum=`` meant the same number, which reads as BatchNorm's
and so barely smoothed where users wrote BatchNorm's 0.1: it keeps its meaning and warns
(a FutureWarning at the caller's line); files and JSON configs that say ``momentum`` load
as before, silently."""

from __future__ import annotations

import pickle
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.nn.models import GCN

import fxquant
from fxquant import QuantConfig
from fxquant.errors import FxquantValueError
from fxquant.quant import transform as plain_transform
from fxquant.quant.observers import RangeObserver


def _batches(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(5, 4, generator=g) * (i + 1) for i in range(4)]


def test_decay_is_the_old_ranges_weight():
    obs = RangeObserver(decay=0.9).train()
    obs(torch.tensor([-1.0, 1.0]))
    obs(torch.tensor([-11.0, 11.0]))
    torch.testing.assert_close(obs.running, torch.tensor([-2.0, 2.0]))  # 0.9 * 1 + 0.1 * 11
    assert QuantConfig("int8", scale="tensor", decay=0.9).describe() == \
        "int8, nearest, scale tensor (running, decay 0.9), ste"


def test_momentum_warns_at_the_callers_line_and_keeps_its_meaning():
    with pytest.warns(FutureWarning, match=r"momentum= is deprecated.*decay=0.1") as caught:
        config = QuantConfig("int8", scale="tensor", momentum=0.1)
    assert caught[0].filename == __file__
    assert config == QuantConfig("int8", scale="tensor", decay=0.1)
    with pytest.warns(FutureWarning, match="QuantConfig.momentum is deprecated") as caught:
        assert config.momentum == 0.1
    assert caught[0].filename == __file__
    with pytest.raises(FxquantValueError, match="were both given"):
        QuantConfig("int8", scale="tensor", decay=0.9, momentum=0.9)


def test_old_files_and_json_configs_read_momentum_silently():
    data = QuantConfig("int8", scale="tensor", decay=0.99).to_dict()
    assert data["decay"] == 0.99 and "momentum" not in data
    old = {**{k: v for k, v in data.items() if k != "decay"}, "momentum": 0.99}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert QuantConfig.from_dict(old) == QuantConfig.from_dict(data)
        config = QuantConfig("int8", scale="tensor", decay=0.99)
        state = dict(config.__dict__)
        state["momentum"] = state.pop("decay")  # as pickled before the rename
        old_config = QuantConfig.__new__(QuantConfig)
        old_config.__setstate__(state)
        assert old_config == config
        observer = RangeObserver(decay=0.5)
        observer.__dict__["momentum"] = observer.__dict__.pop("decay")
        assert pickle.loads(pickle.dumps(observer)).decay == 0.5


def _run(entry: str, keyword: str, value: float, seed: int) -> torch.Tensor:
    """The running ranges an entry keeps with ``keyword=value`` after four batches."""
    torch.manual_seed(seed)
    batches = _batches(seed)
    if entry == "observer":
        obs = RangeObserver(**{keyword: value}).train()
        for b in batches:
            obs(b)
        return obs.running
    if entry == "config":
        gm = fxquant.transform(GCN(4, 4, num_layers=1), QuantConfig(
            "int8", scale="tensor", **{keyword: value}), lint="off")
    else:
        call = fxquant.transform if entry == "transform" else plain_transform
        gm = call(GCN(4, 4, num_layers=1), format="int8", scale="tensor",
                  **{keyword: value})
    edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    for b in batches:
        gm.train()(b, edge_index)
    return torch.cat([p.observer.running for _, p in fxquant.quantization_points(gm)])


@settings(max_examples=60)
@given(entry=st.sampled_from(["observer", "config", "transform", "quant.transform"]),
       value=st.floats(0.0, 0.99), seed=st.integers(0, 5))
def test_momentum_is_decay_with_a_warning_in_every_entry(entry, value, seed):
    """Every entry that keeps a running range (RangeObserver, QuantConfig, transform and
    fxquant.quant.transform), every value in [0, 1): momentum=v keeps exactly the ranges
    decay=v keeps, and warns once, at the caller's line; decay= is silent."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        new = _run(entry, "decay", value, seed)
    assert not [w for w in caught if issubclass(w.category, FutureWarning)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = _run(entry, "momentum", value, seed)
    future = [w for w in caught if issubclass(w.category, FutureWarning)]
    assert len(future) == 1 and "momentum= is deprecated" in str(future[0].message)
    assert future[0].filename == __file__
    assert torch.equal(new, old)
