"""One per-node bit-width table for several quantization points (``fxquant.share_bits``)."""

from __future__ import annotations

import pytest
import torch

import fxquant
from fxquant import NodeBits, QuantConfig, QuantMapping
from tests.support.models import TwoLayers, penalty_steps


def _mapping(n: int = 5, learned: bool = True, max_bits: int = 8) -> QuantMapping:
    mapping = QuantMapping()
    for site in ("message", "output"):
        rb = NodeBits.learned_init(n, 3.6, max_bits=max_bits) if learned else \
            NodeBits(torch.tensor([2, 2, 4, 4, 8][:n]), max_bits=max_bits)
        mapping.set_name("conv1", QuantConfig("int8", scale="tensor", range="lsq", node_bits=rb),
                         site=site)
    return mapping


def _graph() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(5, 3), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])


def test_one_table_trained_by_both_sites_and_stored_once():
    x, edge_index = _graph()
    torch.manual_seed(0)
    apart = fxquant.transform(TwoLayers(), _mapping())
    torch.manual_seed(0)
    shared = fxquant.transform(TwoLayers(), _mapping())
    fxquant.share_bits(shared, "conv1_quant", "conv1_message_quant")
    msg, out = shared.get_submodule("conv1_message_quant"), shared.get_submodule("conv1_quant")
    assert out.node_widths.bits is msg.node_widths.bits
    assert sum(p is msg.node_widths.bits for p in shared.parameters()) == 1
    # same values as two tables that hold the same bits; the gradient is the sum of both
    for gm in (apart, shared):
        gm(x, edge_index).pow(2).sum().backward()
    torch.testing.assert_close(apart(x, edge_index), shared(x, edge_index))
    both = apart.get_submodule("conv1_message_quant").node_widths.bits.grad \
        + apart.get_submodule("conv1_quant").node_widths.bits.grad
    assert msg.node_widths.bits.grad is not None
    torch.testing.assert_close(msg.node_widths.bits.grad, both)
    # storage: 3 bits per node for one table, not two (4 values per row)
    a, s = fxquant.bit_report(apart, x, edge_index), fxquant.bit_report(shared, x, edge_index)
    by_site = {(r.layer, r.site): r for r in s.sites}
    values = by_site[("conv1", "output")].values
    assert values == 5 * 4
    assert by_site[("conv1", "output")].avg_bits == pytest.approx(
        (4 * 5 * 4 + 32) / values)  # 4 bits per value (3.6 rounded), the step, no table
    total = sum(r.values for r in s.sites)
    assert a.avg_bits - s.avg_bits == pytest.approx(3 * 5 / total)


def test_fixed_tables_share_too():
    x, edge_index = _graph()
    gm = fxquant.transform(TwoLayers(), _mapping(learned=False))
    fxquant.share_bits(gm, "conv1_quant", "conv1_message_quant")
    assert gm.get_submodule("conv1_quant").node_widths.bits is \
        gm.get_submodule("conv1_message_quant").node_widths.bits
    report = fxquant.bit_report(gm, x, edge_index)
    assert {(r.layer, r.site): r.histogram for r in report.sites}[("conv1", "output")] == \
        {2: 2, 4: 2, 8: 1}


@pytest.mark.slow
def test_shared_bits_survive_save_load_and_compile(tmp_path):
    x, edge_index = _graph()
    torch.manual_seed(0)
    gm = fxquant.transform(TwoLayers(), _mapping())
    fxquant.share_bits(gm, "conv1_quant", "conv1_message_quant")
    penalty_steps(gm, x, edge_index, steps=4, lr=0.2)
    gm.eval()
    expected = gm(x, edge_index)
    path = tmp_path / "gm.pt"
    fxquant.save(gm, path)
    loaded = fxquant.load(path, TwoLayers()).eval()
    assert loaded.get_submodule("conv1_quant").node_widths.bits is \
        loaded.get_submodule("conv1_message_quant").node_widths.bits
    torch.testing.assert_close(loaded(x, edge_index), expected)
    compiled = torch.compile(gm, fullgraph=True)
    torch.testing.assert_close(compiled(x, edge_index), expected)


def test_share_bits_errors_name_the_point_and_change_nothing():
    gm = fxquant.transform(TwoLayers(), _mapping().set_name(
        "conv2", QuantConfig("int8", scale="tensor", range="lsq",
                             node_bits=NodeBits.learned_init(5, 3.0, max_bits=4))))
    before = {n: p for n, p in gm.named_parameters()}
    with pytest.raises(ValueError, match=r"point='nope' is not a submodule.*conv1_quant"):
        fxquant.share_bits(gm, "nope", "conv1_quant")
    with pytest.raises(ValueError, match=r"point='conv1_quant' has NodeBits.*2\.\.8.*2\.\.4"):
        fxquant.share_bits(gm, "conv1_quant", "conv2_quant")
    with pytest.raises(ValueError, match="point and source are both"):
        fxquant.share_bits(gm, "conv1_quant", "conv1_quant")
    fxquant.share_bits(gm, "conv1_quant", "conv1_message_quant")
    after_first = {n: p for n, p in gm.named_parameters()}
    with pytest.raises(ValueError, match="source='conv1_quant' already shares "
                                         "'conv1_message_quant'"):
        fxquant.share_bits(gm, "conv1_message_quant", "conv1_quant")
    with pytest.raises(ValueError, match=r"point='conv1_message_quant' is the source of "
                                         r"\['conv1_quant'\]"):
        fxquant.share_bits(gm, "conv1_message_quant", "conv2_quant")
    assert {n: p for n, p in gm.named_parameters()} == after_first
    plain = fxquant.transform(TwoLayers(), QuantMapping().set_global(
        QuantConfig("int8", scale="tensor")))
    with pytest.raises(ValueError, match=r"point='conv2_quant' is not a quantization point "
                                         r"with per-node bit-widths"):
        fxquant.share_bits(plain, "conv2_quant", "conv1_quant")
    assert len(before) == len(after_first) + 1


def test_a_shared_table_is_stored_even_when_its_source_did_not_run():
    """The storage moves to the first sharing point that ran: a budget cannot be met by
    leaving the source out of the forward."""
    x, edge_index = _graph()
    gm = fxquant.transform(TwoLayers(), _mapping())
    fxquant.share_bits(gm, "conv1_quant", "conv1_message_quant")
    gm(x, edge_index)
    both = {s.name: s for s in fxquant.bit_report(gm).sites}
    assert both["conv1_message_quant"].storage_bits == 3 * 5 + 32
    assert both["conv1_quant"].storage_bits == 32
    gm.get_submodule("conv1_message_quant").__dict__["last_rows"] = None  # as if it never ran
    alone = {s.name: s for s in fxquant.bit_report(gm).sites}
    assert "conv1_message_quant" not in alone
    assert alone["conv1_quant"].storage_bits == 3 * 5 + 32


def test_files_with_shared_tables_carry_their_own_format_tag(tmp_path):
    """A version of fxquant that cannot restore the sharing refuses such a file instead of
    loading untied tables; files without sharing keep the first tag."""
    from fxquant.quant.persist import FORMAT, FORMAT_SHARED

    plain = fxquant.transform(TwoLayers(), _mapping())
    shared = fxquant.transform(TwoLayers(), _mapping())
    fxquant.share_bits(shared, "conv1_quant", "conv1_message_quant")
    for gm, tag in ((plain, FORMAT), (shared, FORMAT_SHARED)):
        path = tmp_path / f"{tag}.pt"
        fxquant.save(gm, path)
        assert torch.load(path, weights_only=True)["format"] == tag
        fxquant.load(path, TwoLayers())
