"""NaN, infinite and out-of-range numbers given to the per-node and LSQ API fail
validation with an error naming the argument (they gave NaN outputs or penalties)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import fxquant
from fxquant.errors import FxquantError
from fxquant.quant.config import NodeBits, QuantConfig
from fxquant.quant.lsq import lsq_round
from fxquant.quant.observers import RangeObserver, percentile_bounds

NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
EDGES = torch.tensor([[0, 1, 2, 3], [1, 0, 0, 0]])


def _learned_model() -> torch.fx.GraphModule:
    config = QuantConfig("int8", scale="tensor", range="lsq",
                         node_bits=NodeBits.learned_init(4, 4.0))
    gm = fxquant.transform(nn.Sequential(nn.Linear(3, 3)),
                           fxquant.QuantMapping().set_name("0", config), lint="off")
    gm(torch.randn(4, 3))
    return gm


#: each entry: (argument named in the error, a call taking the value)
CALLS = {
    "init": lambda v: NodeBits.learned_init(6, v),
    "learned_bit_widths": lambda v: NodeBits(torch.tensor([4.0, v]), learned=True),
    "fixed_bit_widths": lambda v: NodeBits(torch.tensor([4.0, v])),
    "target_bits": lambda v: fxquant.bit_penalty(_learned_model(), v),
    "decay": lambda v: QuantConfig("int8", scale="tensor", decay=v),
    "protect": lambda v: QuantConfig("int8", scale="tensor", protect=(0.1, v)),
    "percentile": lambda v: QuantConfig("int8", scale="tensor", range=f"percentile:{v}"),
    "fraction": lambda v: fxquant.top_degree_nodes(EDGES, v),
    "quantiles": lambda v: NodeBits.by_degree(EDGES, [v], [2, 4], num_nodes=4),
    "gain": lambda v: lsq_round(torch.ones(2), torch.tensor(0.5), -1, 1, gain=v),
    "q": lambda v: percentile_bounds(torch.ones(3), v),
    "observer_decay": lambda v: RangeObserver(decay=v),
}
NAMES = {"learned_bit_widths": "bit-widths", "fixed_bit_widths": "bit-widths",
         "observer_decay": "decay", "percentile": "percentile"}


@settings(max_examples=60)
@given(call=st.sampled_from(sorted(CALLS)), value=NON_FINITE)
def test_non_finite_numbers_are_refused_naming_the_argument(call, value):
    """Every numeric argument of the per-node and LSQ API refuses NaN and +-inf with an
    fxquant error that names it."""
    with pytest.raises(FxquantError, match=NAMES.get(call, call)):
        CALLS[call](value)


@pytest.mark.parametrize("call", sorted(CALLS))
def test_valid_values_still_pass(call):
    """The validation refuses only what is wrong: a sensible value passes each call."""
    good = {"init": 4.0, "learned_bit_widths": 5.0, "fixed_bit_widths": 5.0, "target_bits": 3.0,
            "decay": 0.9, "protect": 0.5, "percentile": 99.0, "fraction": 0.5,
            "quantiles": 0.5, "gain": 0.25, "q": 99.0, "observer_decay": 0.5}
    CALLS[call](good[call])


def test_reported_nan_init_and_penalty():
    """The reported cases: NodeBits.learned_init(6, nan) gave NaN outputs, bit_penalty(gm,
    nan or inf) a NaN penalty."""
    with pytest.raises(ValueError, match="init must be a finite number"):
        NodeBits.learned_init(6, float("nan"))
    gm = _learned_model()
    for target in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="target_bits must be a finite positive"):
            fxquant.bit_penalty(gm, target)


@pytest.mark.parametrize("num_nodes", [-1, 2.5, True, "6"])
def test_node_counts_must_be_whole_numbers(num_nodes):
    """A node count that is not an int >= 0 is refused by name."""
    with pytest.raises(FxquantError, match="num_nodes must be an int >= 0"):
        NodeBits.learned_init(num_nodes, 4.0)
    with pytest.raises(FxquantError, match="num_nodes must be an int >= 0"):
        NodeBits.by_degree(EDGES, [0.5], [2, 4], num_nodes=num_nodes)
