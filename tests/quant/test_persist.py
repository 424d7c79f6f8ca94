"""fxquant.save / fxquant.load: a transformed model round-trips without pickling code."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
from torch_geometric.nn.models import GCN as PygGCN

import fxquant
from tests.support.models import GCN, Block, WithBlock


def test_round_trip_with_every_kind_of_point(tmp_path, graph):
    """Formats, running amax, node overrides (index and mask): identical outputs in train
    and eval after save -> load into a fresh model, summary included."""
    mask = torch.zeros(graph.num_nodes, dtype=torch.bool).index_fill(0, torch.tensor([2]), True)
    kwargs = dict(bits={"conv1": "e4m3", "sigmoid": 10, "conv2": "e3m2"}, scale="tensor",
                  decay=0.5, node_formats={"conv1": ([1, 4], "e2m1"), "sigmoid": (mask, 4)})
    gm = fxquant.transform(GCN(), **kwargs)
    gm(graph.x, graph.edge_index)  # the running amax moves
    fxquant.save(gm, tmp_path / "gm.pt")
    again = fxquant.load(tmp_path / "gm.pt", GCN())
    assert fxquant.summary(again) == fxquant.summary(gm)
    for mode in (True, False):
        gm.train(mode), again.train(mode)
        with torch.no_grad():
            assert torch.equal(again(graph.x, graph.edge_index), gm(graph.x, graph.edge_index))


def test_zoo_model_with_weights_only(tmp_path, graph):
    """PyG's GCN (its optional arguments fixed while tracing) round-trips; the file holds
    only tensors and strings, so plain weights_only loading accepts it."""
    model = PygGCN(4, 8, num_layers=2, out_channels=2)
    gm = fxquant.transform(model, bits=11, rounding="stochastic").eval()
    fxquant.save(gm, tmp_path / "gm.pt")
    assert set(torch.load(tmp_path / "gm.pt", weights_only=True)) == {
        "format", "points", "trace", "state_dict"}
    again = fxquant.load(tmp_path / "gm.pt", PygGCN(4, 8, num_layers=2, out_channels=2)).eval()
    torch.manual_seed(1)
    a = gm(graph.x, graph.edge_index)
    torch.manual_seed(1)
    assert torch.equal(again(graph.x, graph.edge_index), a)


def test_leaf_modules_by_class_are_found_again(tmp_path, graph):
    model = WithBlock()
    gm = fxquant.transform(model, bits=10, layers=["block", "conv"], leaf_modules=[Block])
    fxquant.save(gm, tmp_path / "gm.pt")
    fresh = WithBlock()
    again = fxquant.load(tmp_path / "gm.pt", fresh)
    assert torch.equal(again(graph.x, graph.edge_index), gm(graph.x, graph.edge_index))


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned_by_fxquant_load",))


def test_a_crafted_pickle_is_refused_and_never_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pt"
    with path.open("wb") as f:
        pickle.dump({"format": "fxquant-state-1", "points": _Evil()}, f, protocol=2)
    with pytest.raises(ValueError, match="refused"):
        fxquant.load(path, GCN())
    assert not (tmp_path / "pwned_by_fxquant_load").exists()


def test_wrong_model_and_bad_files(tmp_path):
    gm = fxquant.transform(GCN(), bits=10)
    fxquant.save(gm, tmp_path / "gm.pt")
    with pytest.raises(ValueError, match="unknown layer 'conv1'"):
        fxquant.load(tmp_path / "gm.pt", PygGCN(4, 8, num_layers=2, out_channels=2))
    torch.save({"x": torch.ones(1)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"not a file fxquant\.save wrote"):
        fxquant.load(tmp_path / "other.pt", GCN())
    with pytest.raises(TypeError, match="expects the GraphModule"):
        fxquant.save(GCN(), tmp_path / "x.pt")
    with pytest.raises(FileNotFoundError, match=r"fxquant\.load: no file .*missing\.pt"):
        fxquant.load(tmp_path / "missing.pt", GCN())
    with pytest.raises(FileNotFoundError, match=r"no file .*\(a folder\)"):
        fxquant.load(tmp_path, GCN())
    with pytest.raises(FileNotFoundError, match="does not exist; please create it"):
        fxquant.save(gm, tmp_path / "nowhere" / "gm.pt")
    assert not (tmp_path / "nowhere").exists()


def test_torch_export_round_trip(tmp_path, graph):
    """The other code-free route: torch.export of a transformed model, identical outputs."""
    gm = fxquant.transform(GCN(add_self_loops=False, normalize=False), bits=10,
                           rounding="nearest").eval()
    args = (graph.x, graph.edge_index)
    exported = torch.export.export(gm, args)
    torch.export.save(exported, tmp_path / "gm.pt2")
    loaded = torch.export.load(tmp_path / "gm.pt2")
    assert torch.equal(loaded.module()(*args), gm(*args))


class _TwoHops(torch.nn.Module):
    """One GCN layer applied twice: two calls, ``conv`` and ``conv_1``."""

    def __init__(self):
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.conv = GCNConv(8, 8)

    def forward(self, x, edge_index):
        return self.conv(self.conv(x, edge_index).relu(), edge_index)


@pytest.mark.parametrize("kwargs", [
    {"bits": {"conv": 16, "conv_1": 4}},
    {"bits": 6, "layers": "conv_1"},
    {"bits": {"conv": 16, "conv_1": 4}, "node_formats": {"conv_1": ([1, 2], 12)}},
])
def test_a_layer_called_twice_keeps_each_calls_points(tmp_path, kwargs):
    """Each call's config was saved under the module's name: load gave both calls the last
    one's (silently), or found other points than the saved ones."""
    torch.manual_seed(0)
    x, edge_index = torch.randn(20, 8), torch.randint(0, 20, (2, 60))
    gm = fxquant.transform(_TwoHops(), lint="off", **kwargs)
    fxquant.save(gm, tmp_path / "gm.pt")
    again = fxquant.load(tmp_path / "gm.pt", _TwoHops())
    assert fxquant.summary(again) == fxquant.summary(gm)
    assert torch.equal(again(x, edge_index), gm(x, edge_index))


@pytest.mark.parametrize("route", ["to_empty", "assign"])
def test_a_model_made_on_the_meta_device_loads_its_node_overrides(route):
    """A model built on the meta device, then materialised by to_empty() and loaded, or
    loaded with assign=True: the table a node override is looked up in is derived from
    the loaded node ids (it held uninitialised memory, or stayed on meta)."""
    from torch_geometric.nn.models import GIN

    torch.manual_seed(0)
    x, ei = torch.randn(20, 8), torch.randint(0, 20, (2, 60))

    def transformed(model):
        mapping = (fxquant.QuantMapping()
                   .set_name("convs.0", fxquant.QuantConfig("int2", scale="tensor"))
                   .set_nodes("convs.0", torch.tensor([0, 3, 5]), 16))
        return fxquant.transform(model, mapping, lint="off")

    reference = transformed(GIN(8, 8, num_layers=2, out_channels=3)).eval()
    with torch.device("meta"):
        skeleton = GIN(8, 8, num_layers=2, out_channels=3)
    gm = transformed(skeleton)
    if route == "to_empty":
        gm = gm.to_empty(device="cpu")
        gm.get_submodule("convs_0_quant").override.table.fill_(True)  # (memory left as it was)
        gm.load_state_dict(reference.state_dict())
    else:
        gm.load_state_dict(reference.state_dict(), assign=True)
    assert torch.equal(gm.eval()(x, ei), reference(x, ei))


@pytest.mark.parametrize("learned", [False, True])
def test_node_bits_configs_keep_their_widths_apart_from_the_table_as_trained(tmp_path, learned):
    """A point's NodeBits config (the widths the mapping gave: a fixed table's final
    widths) round-trips apart from its table as training left it (annealing starts a fixed
    table wider); a file without them (older versions) takes the saved table's."""
    given = torch.tensor([2.0, 3.0, 4.0, 2.0, 3.0, 4.0])
    bits = fxquant.NodeBits(given, learned=learned)
    config = fxquant.QuantConfig("int8", scale="tensor", range="lsq", node_bits=bits)
    gm = fxquant.transform(GCN(), fxquant.QuantMapping().set_name("conv1", config), lint="off")
    (name, point), = fxquant.quantization_points(gm)
    with torch.no_grad():
        point.node_widths.bits.add_(1.0)  # as annealing leaves it
    fxquant.save(gm, tmp_path / "gm.pt")
    again = dict(fxquant.quantization_points(fxquant.load(tmp_path / "gm.pt", GCN())))[name]
    assert torch.equal(again.config.node_bits.bits, given)
    assert torch.equal(again.node_widths.bits.detach(), given + 1)
    assert again.config.node_bits.learned == learned
    blob = torch.load(tmp_path / "gm.pt", weights_only=True)
    del blob["node_bits"]
    torch.save(blob, tmp_path / "older.pt")
    older = dict(fxquant.quantization_points(fxquant.load(tmp_path / "older.pt", GCN())))[name]
    assert torch.equal(older.config.node_bits.bits, given + 1)
