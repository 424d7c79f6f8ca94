"""Files an earlier release saved keep loading, with the outputs they gave then.

The files in ``tests/quant/data`` were written by fxquant 0.9.8 (``make_saved.py`` there
says how): a trained GCN with learned steps, learned and fixed per-node bit-widths, a node
override, a running range and Degree-Quant protection, through ``fxquant.save`` and
pickled whole by ``torch.save``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch_geometric.nn.models import GCN

import fxquant

DATA = Path(__file__).parent / "data"


def _model() -> GCN:
    return GCN(8, 16, num_layers=2, out_channels=3)


def _expected(kind: str) -> dict:
    expected = torch.load(DATA / f"gcn-0.9.8-{kind}-expected.pt", weights_only=True)
    # the fixed widths by in-degree the file was made with (NodeBits.by_degree, 0.7 -> 6 bits)
    state = torch.load(DATA / f"gcn-0.9.8-{kind}.pt", weights_only=True)["state_dict"]
    expected["aggregate_widths"] = state["convs_1_aggregate_quant.row_bits_table"].tolist()
    return expected


def _check(gm: torch.nn.Module, expected: dict) -> None:
    x, edge_index = expected["x"], expected["edge_index"]
    points = dict(fxquant.quantization_points(gm))
    assert points["convs_0_quant"].node_widths.learned  # (the state moved into the parts)
    assert points["convs_1_input_quant"].learned_step.step_fitted
    assert points["convs_1_input_quant"].override.format.spec() == "int8"
    assert points["convs_1_aggregate_quant"].node_widths.table().tolist() == \
        expected["aggregate_widths"]
    with torch.no_grad():
        assert torch.equal(gm.eval()(x, edge_index), expected["eval"])
        torch.manual_seed(expected["seed"])  # protection draws its masks in training
        assert torch.equal(gm.train()(x, edge_index), expected["train"])


@pytest.mark.parametrize("kind", ["plain", "shared"])
def test_a_file_saved_by_0_9_8_loads_with_its_outputs(kind):
    """fxquant.load of a 0.9.8 file into a fresh model: the same outputs in evaluation and
    in a training forward (protection's draws included)."""
    expected = _expected(kind)
    gm = fxquant.load(DATA / f"gcn-0.9.8-{kind}.pt", _model())
    if kind == "shared":
        points = dict(fxquant.quantization_points(gm))
        assert points["convs_1_quant"].node_widths.bits is points["convs_0_quant"].node_widths.bits
    _check(gm, expected)


def test_a_graph_module_pickled_by_0_9_8_loads_with_its_outputs(tmp_path):
    """torch.load of a GraphModule that 0.9.8 pickled gives the same outputs, and saved
    again by fxquant.save it loads into a fresh model alike."""
    expected = _expected("shared")
    gm = torch.load(DATA / "gcn-0.9.8-shared-pickled.pt", weights_only=False)
    points = dict(fxquant.quantization_points(gm))
    assert points["convs_1_quant"].node_widths.bits is points["convs_0_quant"].node_widths.bits
    fxquant.save(gm, tmp_path / "again.pt")  # (before the training forward moves its state)
    _check(gm, expected)
    _check(fxquant.load(tmp_path / "again.pt", _model()), expected)
