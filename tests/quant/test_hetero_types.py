"""Precision by node type and edge type: the mapping addresses them directly (HeteroConv,
to_hetero, layers that take or return dicts, relations inside RGCNConv / FastRGCNConv /
HGTConv), in its documented precedence, and saves them."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_geometric.nn import FastRGCNConv, RGCNConv, SAGEConv

import fxquant
from fxquant import QuantConfig, QuantMapping
from fxquant.errors import FxquantError
from tests.fx.hetero_models import (
    EDGE_TYPES,
    HAN,
    HGT,
    HeteroConvNet,
    hetero_graph,
    inputs,
    to_hetero_sage,
)

INT8 = QuantConfig("int8", scale="tensor")
INT4 = QuantConfig("int4", scale="tensor")


def _names(data):
    """Each kind of model with its per-edge-type layer names ((layer, edge type) pairs)."""
    heteroconv = [(f"conv{i}.convs.<{'___'.join(et)}>", et) for i in (1, 2) for et in EDGE_TYPES]
    to_hetero = [(f"conv{i}.{'__'.join(et)}", et) for i in (1, 2) for et in EDGE_TYPES]
    return {"to_hetero": (to_hetero_sage(data), {}, to_hetero),
            "to_hetero-traced": (to_hetero_sage(data), {"example_inputs": inputs(data)},
                                 to_hetero),
            "heteroconv": (HeteroConvNet(), {"example_inputs": inputs(data)}, heteroconv)}


def _points(gm):
    return {(p.layer, p.site.value, p.part): p.config.format.spec()
            for _, p in fxquant.quantization_points(gm)}


@pytest.mark.parametrize("kind", ["to_hetero", "to_hetero-traced", "heteroconv"])
def test_node_type_selects_the_parts_of_its_nodes(kind):
    """set_node_type('author', site='input'): the source part where authors send, the
    target part where they receive; set_node_type('paper', site='output'): the layers
    whose edge type ends at papers."""
    data = hetero_graph()
    model, kwargs, layers = _names(data)[kind]
    mapping = (QuantMapping().set_node_type("author", INT4, site="input")
               .set_node_type("paper", INT8))
    gm = fxquant.transform(model, mapping, lint="off", **kwargs)
    expected = {}
    for layer, et in layers:
        if et[0] == "author":
            expected[(layer, "input", "source")] = "int4"
        if et[-1] == "author":
            expected[(layer, "input", "target")] = "int4"
        if et[-1] == "paper":
            expected[(layer, "output", None)] = "int8"
    assert _points(gm) == expected
    gm(*inputs(data))


@pytest.mark.parametrize("kind", ["to_hetero", "to_hetero-traced", "heteroconv"])
def test_edge_type_selects_its_layers_at_every_site(kind):
    data = hetero_graph()
    model, kwargs, layers = _names(data)[kind]
    cites = ("paper", "cites", "paper")
    mapping = (QuantMapping().set_edge_type(cites, INT4, site="message")
               .set_edge_type(cites, INT8, site="input"))
    gm = fxquant.transform(model, mapping, lint="off", **kwargs)
    mine = [layer for layer, et in layers if et == cites]
    assert _points(gm) == {**{(layer, "message", None): "int4" for layer in mine},
                           **{(layer, "input", None): "int8" for layer in mine}}
    gm(*inputs(data))


def test_precedence_global_type_node_edge_pattern_name():
    """global < module type < node type < edge type < pattern < name, whatever the order
    of the calls."""
    data = hetero_graph()
    cfg = {bits: QuantConfig(bits) for bits in (9, 10, 11, 12, 13, 14)}
    mapping = (QuantMapping()
               .set_name("conv2.author__writes__paper", cfg[14])
               .set_pattern("conv2.*", cfg[13])
               .set_edge_type(("author", "writes", "paper"), cfg[12])
               .set_node_type("paper", cfg[11])
               .set_type(SAGEConv, cfg[10])
               .set_global(cfg[9]))
    gm = fxquant.transform(to_hetero_sage(data), mapping, lint="off")
    assert {layer: spec for (layer, _, _), spec in _points(gm).items()} == {
        "conv1.author__writes__paper": "top12",     # edge type over node type
        "conv1.paper__cites__paper": "top11",       # node type over module type
        "conv1.paper__rev_writes__author": "top10",  # module type over global
        "conv2.author__writes__paper": "top14",     # name over pattern
        "conv2.paper__cites__paper": "top13",       # pattern over edge and node type
        "conv2.paper__rev_writes__author": "top13",
    }


def test_types_that_select_nothing_are_errors_naming_the_models_types():
    data = hetero_graph()
    model = to_hetero_sage(data)
    with pytest.raises(FxquantError, match=r"node type 'paprr'.*\['author', 'paper'\]"):
        fxquant.transform(model, QuantMapping().set_node_type("paprr", INT8), lint="off")
    with pytest.raises(FxquantError, match=r"edge type \('a', 'b', 'c'\).*'writes'"):
        fxquant.transform(model, QuantMapping().set_edge_type(("a", "b", "c"), INT8),
                          lint="off")
    for bad in (["a", "b", "c"], True, -1, ("a", "b")):
        with pytest.raises(TypeError, match="set_edge_type expects an edge type"):
            QuantMapping().set_edge_type(bad, INT8)
    with pytest.raises(TypeError, match="set_node_type expects a node type"):
        QuantMapping().set_node_type(("paper",), INT8)


def test_node_and_edge_type_entries_round_trip_through_json():
    mapping = (QuantMapping().set_node_type("paper", INT8, site="input")
               .set_edge_type(("author", "writes", "paper"), INT4, site="message")
               .set_edge_type(2, None, site="weight")
               .set_name("conv", INT8, site="input", part="source"))
    again = QuantMapping.from_dict(mapping.to_dict())
    assert repr(again) == repr(mapping)
    assert again.to_dict() == mapping.to_dict()
    assert "edge type ('author', 'writes', 'paper') message" in repr(mapping)


# -- layers that take or return dicts --------------------------------------------------------


def test_a_dict_layers_entries_get_a_point_each_and_save(tmp_path):
    """HGTConv's input (a dict of node types) and output (looked up by key): one point per
    node type, each its own config by node type; saved and loaded with them."""
    data = hetero_graph()
    torch.manual_seed(0)
    model = HGT(data.metadata()).eval()
    ex = inputs(data)
    mapping = (QuantMapping().set_global(INT8, site="input")
               .set_node_type("author", QuantConfig("int4", scale="tensor", range="lsq"),
                              site="input")
               .set_global(QuantConfig("int8", scale="tensor", decay=0.5)))
    gm = fxquant.transform(model, mapping, example_inputs=ex, lint="off")
    assert _points(gm) == {("lin.author", "input", None): "int4",  # (keyed by node type)
                           ("conv", "input", "author"): "int4",
                           ("conv", "input", "paper"): "int8",
                           ("conv", "output", "paper"): "int8"}
    gm.train()(*ex)
    gm.eval()
    fxquant.save(gm, tmp_path / "hgt.pt")
    torch.manual_seed(1)
    again = fxquant.load(tmp_path / "hgt.pt", HGT(data.metadata()))
    assert _points(again) == _points(gm)
    assert torch.equal(again(*ex), gm(*ex))


def test_han_outputs_are_rounded_per_node_type():
    """HANConv returns None for a node type that receives nothing: only the looked-up,
    present entries get points, and a 32-bit transform is the model."""
    data = hetero_graph()
    torch.manual_seed(0)
    model = HAN(data.metadata()).eval()
    ex = inputs(data)
    exact = fxquant.transform(model, bits=32, example_inputs=ex, lint="off")
    out, expected = exact(*ex), model(*ex)
    assert out.keys() == expected.keys()
    assert all(torch.equal(out[k], expected[k]) for k in out)
    assert {p.part for _, p in fxquant.quantization_points(exact)} == set(expected)


def test_dict_layers_in_a_row_round_what_passes_between_them():
    """HGTConv after HGTConv: the first one's entries, looked up by the trace, are the
    second one's dict input; the output and input sites each get a point per node type,
    and the model trains."""
    data = hetero_graph()
    torch.manual_seed(0)

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = HGT(data.metadata()).conv
            self.second = HGT(data.metadata()).conv

        def forward(self, x_dict, edge_index_dict):
            return self.second(self.first(x_dict, edge_index_dict), edge_index_dict)["paper"]

    x_dict = {"paper": torch.randn(6, 8), "author": torch.randn(5, 8)}
    ex = (x_dict, inputs(data)[1])
    mapping = QuantMapping().set_global(INT8).set_global(INT8, site="input")
    gm = fxquant.transform(Two(), mapping, example_inputs=ex, lint="off")
    assert set(_points(gm)) == {(layer, "input", key) for layer in ("first", "second")
                                for key in ("paper", "author")} | \
        {("first", "output", "paper"), ("first", "output", "author"),
         ("second", "output", "paper")}
    gm.train()(*ex).sum().backward()


# -- relations inside one layer --------------------------------------------------------------


class Relational(nn.Module):
    def __init__(self, cls, **kwargs):
        super().__init__()
        self.conv = cls(4, 8, num_relations=3, **kwargs)

    def forward(self, x, edge_index, edge_type):
        return self.conv(x, edge_index, edge_type)


def _relational_graph():
    g = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, 10, (2, 40), generator=g)
    edge_type = torch.tensor([0] * 20 + [1] * 15 + [2] * 5)[torch.randperm(40, generator=g)]
    return torch.randn(10, 4, generator=g), edge_index, edge_type


@pytest.mark.parametrize("options", [{}, {"num_bases": 2}, {"num_blocks": 2},
                                     {"aggr": "add"}, {"root_weight": False}],
                         ids=["plain", "bases", "blocks", "add", "no-root"])
@pytest.mark.parametrize("cls", [RGCNConv, FastRGCNConv])
def test_each_relations_messages_get_their_own_point(cls, options):
    """The message site of an RGCN layer has a point per relation, which rounds exactly
    that relation's messages x_j W_r (as many rows as the relation has edges); the same
    in both layers, and the float result unchanged at 32 bits."""
    torch.manual_seed(0)
    model = Relational(cls, **options)
    x, edge_index, edge_type = _relational_graph()
    exact = fxquant.transform(model, QuantMapping().set_global(QuantConfig(32), site="message"),
                              lint="off")
    torch.testing.assert_close(exact(x, edge_index, edge_type), model(x, edge_index, edge_type))
    mapping = (QuantMapping().set_global(INT8, site="message")
               .set_edge_type(2, INT4, site="message").set_edge_type(1, None, site="message"))
    gm = fxquant.transform(model, mapping, lint="off")
    points = dict(fxquant.quantization_points(gm))
    assert {n: p.config.format.spec() for n, p in points.items()} == \
        {"conv_message_r0_quant": "int8", "conv_message_r2_quant": "int4"}
    seen = {}
    for name, point in points.items():
        point.register_forward_hook(lambda m, a, out, name=name: seen.update({name: a[0]}))
    gm(x, edge_index, edge_type)
    weight = model.conv.weight if "num_bases" not in options else \
        (model.conv.comp @ model.conv.weight.view(2, -1)).view(3, 4, 8)
    for r, name in ((0, "conv_message_r0_quant"), (2, "conv_message_r2_quant")):
        sources = edge_index[0, edge_type == r]
        assert seen[name].shape == (int((edge_type == r).sum()), 8)
        if "num_blocks" not in options:
            torch.testing.assert_close(seen[name], x[sources] @ weight[r])


def test_per_relation_weights_have_a_scale_per_relation():
    """RGCNConv's 3-D weight at the weight site: each relation's slice rounded alone (its
    own scale), configurable per relation; root stays its own point."""
    torch.manual_seed(0)
    model = Relational(RGCNConv)
    with torch.no_grad():
        model.conv.weight[2] *= 100  # a relation of much larger weights
    mapping = QuantMapping().set_global(INT4, site="weight").set_edge_type(1, INT8, site="weight")
    gm = fxquant.transform(model, mapping, lint="off")
    assert {n: p.config.format.spec() for n, p in fxquant.quantization_points(gm)} == {
        "conv_weight_root_quant": "int4", "conv_weight_weight_r0_quant": "int4",
        "conv_weight_weight_r1_quant": "int8", "conv_weight_weight_r2_quant": "int4"}
    rounded = {}
    conv = gm.get_submodule("conv")
    original = type(conv).forward

    def capture(self, *args, **kwargs):
        rounded["weight"] = self.weight.detach().clone()
        return original(self, *args, **kwargs)

    type(conv).forward = capture
    try:
        gm(*_relational_graph())
    finally:
        type(conv).forward = original
    w = model.conv.weight.detach()
    for r, spec in ((0, "int4"), (1, "int8"), (2, "int4")):
        assert torch.equal(rounded["weight"][r], fxquant.quantize(w[r], spec, scale="tensor"))
    assert not torch.equal(rounded["weight"][0], fxquant.quantize(w, "int4", scale="tensor")[0])


def test_hgt_messages_and_weights_by_edge_type():
    """HGTConv: a message point and k_rel/v_rel weight points per edge type; each message
    point rounds that edge type's messages (as many as its edges); 32 bits is the model."""
    data = hetero_graph()
    torch.manual_seed(0)
    model = HGT(data.metadata()).eval()
    ex = inputs(data)
    exact = fxquant.transform(model, QuantMapping().set_global(QuantConfig(32), site="message")
                              .set_global(QuantConfig(32), site="weight"),
                              example_inputs=ex, lint="off")
    assert torch.equal(exact(*ex), model(*ex))
    cites = ("paper", "cites", "paper")
    mapping = (QuantMapping().set_global(INT8, site="message")
               .set_edge_type(cites, INT4, site="message")
               .set_edge_type(cites, INT4, site="weight"))
    gm = fxquant.transform(model, mapping, example_inputs=ex, lint="off")
    points = dict(fxquant.quantization_points(gm))
    assert {(p.site.value, p.part, p.tensor): p.config.format.spec()
            for p in points.values()} == {
        **{("message", et, ""): "int4" if et == cites else "int8" for et in EDGE_TYPES},
        ("weight", cites, "k_rel.weight"): "int4", ("weight", cites, "v_rel.weight"): "int4"}
    seen = {}

    def record(point, args, out):
        seen.setdefault((point.site.value, point.part, point.tensor), args[0].shape[0])

    for point in points.values():
        point.register_forward_hook(record)
    gm(*ex)
    edges = inputs(data)[1]
    assert {k[1]: v for k, v in seen.items() if k[0] == "message"} == \
        {et: edges[et].shape[1] for et in EDGE_TYPES}
    assert seen[("weight", cites, "k_rel.weight")] == model.conv.heads


def test_relation_index_that_no_layer_has_is_an_error():
    with pytest.raises(FxquantError, match=r"edge type 5 .*relation indices of RGCNConv "
                                           r"layers: \['0', '1', '2'\]"):
        fxquant.transform(Relational(RGCNConv),
                          QuantMapping().set_edge_type(5, INT8, site="message"), lint="off")


def test_relation_and_edge_type_parts_save_and_load(tmp_path):
    """Configs per relation index (RGCNConv) and per edge type (HeteroConv) survive
    fxquant.save / fxquant.load, each part with its own state."""
    torch.manual_seed(0)
    mapping = (QuantMapping().set_global(QuantConfig("int8", scale="tensor", decay=0.5),
                                         site="message")
               .set_edge_type(1, QuantConfig("int4", scale="tensor", range="lsq"),
                              site="message"))
    gm = fxquant.transform(Relational(RGCNConv), mapping, lint="off")
    x, edge_index, edge_type = _relational_graph()
    gm.train()(x, edge_index, edge_type)
    gm.eval()
    fxquant.save(gm, tmp_path / "rgcn.pt")
    again = fxquant.load(tmp_path / "rgcn.pt", Relational(RGCNConv))
    assert {n: (p.part, p.config.format.spec()) for n, p in fxquant.quantization_points(again)} \
        == {"conv_message_r0_quant": (0, "int8"), "conv_message_r1_quant": (1, "int4"),
            "conv_message_r2_quant": (2, "int8")}
    assert torch.equal(again(x, edge_index, edge_type), gm(x, edge_index, edge_type))

    data = hetero_graph()
    model = HeteroConvNet()
    model(*inputs(data))
    cites = ("paper", "cites", "paper")
    mapping = QuantMapping().set_global(INT8).set_edge_type(cites, QuantConfig(12))
    gm = fxquant.transform(model, mapping, example_inputs=inputs(data), lint="off")
    fxquant.save(gm, tmp_path / "hetero.pt")
    fresh = HeteroConvNet()
    fresh(*inputs(data))
    again = fxquant.load(tmp_path / "hetero.pt", fresh)
    assert _points(again) == _points(gm)
    assert torch.equal(again.eval()(*inputs(data)), gm.eval()(*inputs(data)))


def test_patterns_skip_lookups_of_a_data_argument():
    """forward(data): data.x and data.edge_index are lookups of the argument, never
    selected by a pattern; the layers and functions that compute are."""
    from torch_geometric.data import Data
    from torch_geometric.nn import GCNConv

    class OnData(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GCNConv(4, 4)

        def forward(self, data):
            return self.conv(data.x, data.edge_index).relu()

    gm = fxquant.transform(OnData(), QuantMapping().set_pattern("*", INT8), lint="off")
    assert [p.layer for _, p in fxquant.quantization_points(gm)] == ["conv", "relu"]
    data = Data(x=torch.randn(5, 4), edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]))
    assert gm(data).shape == (5, 4)
    with pytest.raises(FxquantError, match="lookups of the forward's arguments"):
        fxquant.transform(OnData(), QuantMapping().set_pattern("getattr*", INT8), lint="off")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["to_hetero-parts", "hgt-dicts", "rgcn-relations"])
def test_parts_compile_and_agree_with_eager(kind):
    """torch.compile of models with parts agrees with eager: the two input parts of every
    edge type (fullgraph), a dict layer's per-node-type inputs and outputs (fullgraph),
    and an RGCN layer's messages per relation (whose rows are split by relation: graph
    breaks allowed). (HGTConv itself, untransformed, fails in inductor's lowering on
    torch 2.13: its graph is checked with the aot_eager backend.)"""
    data = hetero_graph()
    int8 = QuantConfig("int8", scale="tensor", decay=0.5)
    if kind == "rgcn-relations":
        torch.manual_seed(0)
        model, ex, kwargs = Relational(FastRGCNConv), _relational_graph(), {}
        mapping = QuantMapping().set_global(int8, site="message").set_global(int8, site="weight")
    elif kind == "hgt-dicts":
        torch.manual_seed(0)
        model, ex = HGT(data.metadata()), inputs(data)
        kwargs = {"example_inputs": ex}
        mapping = QuantMapping().set_global(int8).set_global(int8, site="input")
    else:
        model, ex, kwargs = to_hetero_sage(data), inputs(data), {}
        mapping = QuantMapping().set_global(int8, site="input")
    gm = fxquant.transform(model, mapping, lint="off", **kwargs).eval()
    gm.train()(*ex)  # (a stored range first)
    gm.eval()
    compiled = torch.compile(gm, fullgraph=kind != "rgcn-relations",
                             backend="aot_eager" if kind == "hgt-dicts" else "inductor")
    got, want = compiled(*ex), gm(*ex)
    if isinstance(want, dict):
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    else:
        torch.testing.assert_close(got, want)
