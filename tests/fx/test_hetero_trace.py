"""Dict inputs: heterogeneous models (HeteroConv, HGTConv, HANConv, to_hetero) trace with
their keys from example inputs or torch.fx's PH, and stay the model they were."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from torch.fx import PH
from torch_geometric.nn import HeteroConv

import fxquant
from fxquant.errors import FxquantTypeError, FxquantValueError
from fxquant.fx.structure import ExampleStructure, Structure
from fxquant.fx.tracer import STRUCTURE_KEY
from tests.fx.hetero_models import HAN, HGT, HeteroConvNet, hetero_graph, inputs, to_hetero_sage


def _models(data):
    torch.manual_seed(0)
    return {"heteroconv": HeteroConvNet(), "hgt": HGT(data.metadata()),
            "han": HAN(data.metadata()), "to_hetero": to_hetero_sage(data)}


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return torch.equal(a, b)


def test_without_keys_the_error_names_the_argument_and_the_fix():
    """Iterating a dict argument cannot be traced without its keys: the error names the
    argument (not a leaf-module hint) and says example_inputs= helps."""
    with pytest.raises(fxquant.TraceError, match=r"iterates over the argument 'x_dict'") as e:
        fxquant.trace(HeteroConvNet())
    assert "example_inputs=(data.x_dict, data.edge_index_dict)" in str(e.value)
    assert "leaf_modules" not in str(e.value)


@pytest.mark.parametrize("name", ["heteroconv", "hgt", "han", "to_hetero"])
def test_dict_models_trace_with_example_inputs(name):
    """Each model traces, keeps forward's own arguments (one per dict), and computes what
    the model computes, in training (same dropout draws) and evaluation."""
    data = hetero_graph()
    model = _models(data)[name]
    gm = fxquant.trace(model, example_inputs=inputs(data))
    names = [str(n.target) for n in gm.graph.nodes if n.op == "placeholder"]
    assert names == (["x", "edge_index"] if name == "to_hetero"
                     else ["x_dict", "edge_index_dict"])
    assert "tree_flatten_spec" not in gm.code
    for training in (False, True):
        model.train(training)
        gm.train(training)
        torch.manual_seed(1)
        expected = model(*inputs(data))
        torch.manual_seed(1)
        assert _equal(gm(*inputs(data)), expected)


def test_heteroconv_unrolls_one_call_per_edge_type():
    """HeteroConv is traced through: each edge type's SAGEConv is a layer of its own,
    addressable by name (the per-edge-type sites of a mapping)."""
    data = hetero_graph()
    gm = fxquant.trace(HeteroConvNet(), example_inputs=inputs(data))
    convs = [str(n.target) for n in gm.graph.nodes
             if n.op == "call_module" and ".convs." in str(n.target)]
    assert convs == [f"conv{i}.convs.<{'___'.join(et)}>" for i in (1, 2)
                     for et in data.edge_types]


def test_heteroconv_as_a_leaf_returns_a_dict_the_trace_opens():
    """leaf_modules=[HeteroConv]: its dict output's keys come from the example run."""
    data = hetero_graph()
    model = HeteroConvNet().eval()
    gm = fxquant.trace(model, leaf_modules=[HeteroConv], example_inputs=inputs(data))
    assert [str(n.target) for n in gm.graph.nodes if n.op == "call_module"][1:3] == \
        ["conv1", "dropout"]
    assert torch.equal(gm(*inputs(data)), model(*inputs(data)))


def test_concrete_args_with_ph_give_the_same_graph():
    """torch.fx's spelling of the keys traces without its pytree code generator (which
    broke once transform added node_ids), and transform then runs."""
    data = hetero_graph()
    model = HeteroConvNet().eval()
    marks = {"x_dict": {k: PH for k in data.node_types},
             "edge_index_dict": {k: PH for k in data.edge_types}}
    gm = fxquant.trace(model, concrete_args=marks)
    assert "tree_flatten_spec" not in gm.code
    assert gm.code == fxquant.trace(model, example_inputs=inputs(data)).code
    out = fxquant.transform(model, bits=32, concrete_args=marks, lint="off")
    assert torch.equal(out(*inputs(data)), model(*inputs(data)))
    assert "node_ids" in out.code


def test_ph_mixed_with_a_fixed_value_is_refused():
    with pytest.raises(FxquantValueError, match="mark every value with PH"):
        fxquant.trace(HeteroConvNet(), concrete_args={"x_dict": {"paper": PH, "author": 3}})


def test_guard_refuses_other_keys_and_accepts_another_order():
    """A call whose dicts lack a key, or have one more, names them; the same keys in
    another order are the same model."""
    data = hetero_graph()
    model = HeteroConvNet().eval()
    gm = fxquant.trace(model, example_inputs=inputs(data))
    x_dict, edge_index_dict = inputs(data)
    with pytest.raises(FxquantValueError, match=r"x_dict lacks \['author'\]"):
        gm({"paper": x_dict["paper"]}, edge_index_dict)
    more = {**edge_index_dict, ("author", "likes", "paper"): edge_index_dict[
        ("author", "writes", "paper")]}
    with pytest.raises(FxquantValueError,
                       match=r"edge_index_dict has keys it was not traced with: "
                             r"\['author__likes__paper'\].*trace again"):
        gm(x_dict, more)
    reordered = dict(reversed(list(x_dict.items())))
    assert torch.equal(gm(reordered, edge_index_dict), model(*inputs(data)))


def test_leaf_output_none_stays_none():
    """HANConv returns None for a node type without incoming edges: the trace keeps None
    where the example had it, so `if x is not None` branches as in the model."""
    data = hetero_graph()
    del data["paper", "rev_writes", "author"]
    model = HAN(data.metadata()).eval()
    assert model(*inputs(data)).keys() == {"paper"}
    gm = fxquant.trace(model, example_inputs=inputs(data))
    assert _equal(gm(*inputs(data)), model(*inputs(data)))


def test_example_run_leaves_model_and_random_state_alone():
    """The example forward runs in evaluation without gradient; modes, tensors and the
    random stream are as before."""
    data = hetero_graph()
    model = HeteroConvNet().train()
    model.conv1.training = False  # a mixed mode survives
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(7)
    fxquant.trace(model, example_inputs=inputs(data))
    drawn = torch.rand(3)
    torch.manual_seed(7)
    assert torch.equal(drawn, torch.rand(3))
    assert model.training and not model.conv1.training and model.conv2.training
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_example_inputs_errors():
    data = hetero_graph()
    with pytest.raises(FxquantTypeError, match="example_inputs must be a tuple"):
        fxquant.trace(HeteroConvNet(), example_inputs=data.x_dict)
    with pytest.raises(FxquantTypeError, match=r"do not fit HeteroConvNet\.forward"):
        fxquant.trace(HeteroConvNet(), example_inputs=(1, 2, 3))


def test_structures_round_trip_through_json():
    """What fxquant.save writes of the structures reads back equal (tuple keys too)."""
    data = hetero_graph()
    gm = fxquant.trace(HGT(data.metadata()), example_inputs=inputs(data))
    structure = gm.meta[STRUCTURE_KEY]
    assert structure.outputs == {"conv": [Structure.of(dict.fromkeys(data.node_types, 0))]}
    again = ExampleStructure.from_json(json.loads(json.dumps(structure.to_json())))
    assert again == structure
    with pytest.raises(FxquantValueError, match="not a structure"):
        Structure.from_json({"set": []})


@pytest.mark.parametrize("name", ["heteroconv", "to_hetero"])
def test_transform_runs_trains_and_saves(tmp_path, name):
    """Every message-passing layer rounded (INT8, tensor scale): the transformed dict
    model runs, is the float model at 32 bits, trains (every parameter gets a gradient),
    and fxquant.load rebuilds it from a fresh model without example inputs."""

    def loss_of(out):
        return sum(v.square().sum() for v in out.values()) if isinstance(out, dict) \
            else out.square().sum()

    data = hetero_graph()

    def make():
        return _models(data)[name]

    model = make().eval()
    exact = fxquant.transform(model, bits=32, example_inputs=inputs(data), lint="off").eval()
    assert _equal(exact(*inputs(data)), model(*inputs(data)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing for the linter to say
        gm = fxquant.transform(model, format="int8", scale="tensor", decay=0.9,
                               example_inputs=inputs(data))
    assert len(fxquant.quantization_points(gm)) == 6  # one per edge type and layer
    loss_of(gm(*inputs(data))).backward()
    loss_of(model(*inputs(data))).backward()
    learns = {k for k, p in model.named_parameters() if p.grad is not None}
    assert learns and learns == {k for k, p in gm.named_parameters() if p.grad is not None}
    gm.eval()
    path = tmp_path / "m.pt"
    fxquant.save(gm, path)
    again = fxquant.load(path, make().eval())
    assert _equal(again(*inputs(data)), gm(*inputs(data)))
    fxquant.save(again, tmp_path / "again.pt")  # the structures stay with the reloaded model
    assert _equal(fxquant.load(tmp_path / "again.pt", make().eval())(*inputs(data)),
                  gm(*inputs(data)))


def test_sites_per_edge_type_by_layer_name():
    """A QuantMapping addresses one edge type's conv inside HeteroConv by its name, at
    every site a SAGEConv has."""
    data = hetero_graph()
    mapping = fxquant.QuantMapping()
    layer = "conv1.convs.<author___writes___paper>"
    for site in ("input", "weight", "message", "aggregate", "output"):
        mapping.set_name(layer, fxquant.QuantConfig(format="int8", scale="tensor"), site=site)
    gm = fxquant.transform(HeteroConvNet(), mapping, example_inputs=inputs(data), lint="off")
    assert {p.site.value for _, p in fxquant.quantization_points(gm)} == \
        {"input", "weight", "message", "aggregate", "output"}
    assert {p.layer for _, p in fxquant.quantization_points(gm)} == {layer}
    gm(*inputs(data)).sum().backward()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["heteroconv", "to_hetero"])
def test_compiles_with_fullgraph(name):
    """torch.compile(fullgraph=True) of the transformed dict model agrees with eager."""
    data = hetero_graph()
    gm = fxquant.transform(_models(data)[name], format="int8", scale="tensor",
                           example_inputs=inputs(data), lint="off").eval()
    compiled = torch.compile(gm, fullgraph=True)
    assert _equal(compiled(*inputs(data)), gm(*inputs(data)))


def test_a_container_fixed_in_concrete_args_gives_valid_code():
    """A dict fixed in concrete_args (no PH) is one value: transform (which adds node_ids)
    generates valid code, the call takes it by name or position, another value raises."""

    class Options(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, opts=None):
            if opts is not None and opts["double"]:
                x = x * 2
            return self.lin(x)

    model = Options()
    gm = fxquant.transform(model, bits=32, layers="lin", concrete_args={"opts": {"double": True}},
                           lint="off")
    x = torch.randn(3, 4)
    assert torch.equal(gm(x, {"double": True}), model(x, {"double": True}))
    assert torch.equal(gm(x, opts={"double": True}), model(x, {"double": True}))
    with pytest.raises(TypeError, match=r"opts=\{'double': True\} fixed"):
        gm(x, {"double": False})


def test_iterating_a_dict_attribute_of_an_argument_says_to_pass_the_dicts():
    """forward(self, data) iterating data.x_dict: the error says to take the dicts as
    arguments."""

    class FromData(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = HeteroConvNet()

        def forward(self, data):
            return self.inner(data.x_dict, data.edge_index_dict)

    with pytest.raises(fxquant.TraceError, match=r"(?s)iterates over data\.x_dict.*"
                       r"forward\(self, x_dict, edge_index_dict\)"):
        fxquant.trace(FromData(), example_inputs=(hetero_graph(),))
