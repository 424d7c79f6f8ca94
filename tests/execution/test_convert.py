"""fxquant.convert: what it converts, what it refuses (naming the point), the report of
what runs where, node ids, stored features, saving and loading."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import GCNConv

import fxquant
from fxquant.execution import ConversionError, compare, load, save
from tests.support.execution import (
    LogitsAndHidden,
    WithHead,
    mapping,
    random_graph,
    transformed,
)


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = GCNConv(4, 8), GCNConv(8, 3)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def _graph():
    return random_graph(12, 40, 4, seed=1)


def _int8(model=None):
    gm = fxquant.transform(model or TwoLayers(), mapping("int8"), lint="off")
    return gm.eval()


def test_int8_converts_with_every_part_on_integers():
    """All five sites at int8: products, messages and sums on integers, nothing float32,
    and the same predictions."""
    data = _graph()
    gm = _int8()
    model = fxquant.convert(gm)
    assert model.report.float32 == []
    runs = {p.where: p.runs for p in model.report.placements}
    assert runs["conv1: product x W"] == "integer"
    assert runs["conv1: aggregation"] == "integer"
    result = compare(gm, model, data.x, data.edge_index)
    assert result.ok(codes=0.99), str(result)
    assert "conv1_message_quant" in {p.point for p in result.points}


@pytest.mark.parametrize("config, reason", [
    (fxquant.QuantConfig("e4m3", scale="tensor"), "float format"),
    (fxquant.QuantConfig(10), "top-N truncation"),
    (fxquant.QuantConfig("int8", "stochastic", scale="tensor"), "stochastically"),
])
def test_strict_refuses_a_point_naming_it(config, reason):
    """A point with no integer form: strict=True names the point and why; strict=False
    keeps its simulated rounding in float32 and lists it."""
    m = mapping("int8").set_name("conv1", config, site="output")
    gm = fxquant.transform(TwoLayers(), m, lint="off").eval()
    with pytest.raises(ConversionError, match=rf"'conv1_quant'.*{reason}.*strict=False"):
        fxquant.convert(gm)
    model = fxquant.convert(gm, strict=False)
    float32 = model.report.float32
    assert [p.where for p in float32] == ["output of 'conv1'"]
    assert reason in float32[0].why
    data = _graph()
    torch.testing.assert_close(model(data.x, data.edge_index), gm(data.x, data.edge_index),
                               rtol=0, atol=1e-5)


def test_strict_refuses_a_float_product_between_integer_parts():
    """Weights without a point: the product is float32 between integer parts, so strict
    refuses it and says how to round it; strict=False runs it and reports it."""
    m = fxquant.QuantMapping()
    for site in ("input", "message", "aggregate", "output"):
        m.set_global(fxquant.QuantConfig("int8", scale="tensor"), site=site)
    gm = fxquant.transform(TwoLayers(), m, lint="off").eval()
    with pytest.raises(ConversionError, match=r"product x W.*site='weight'"):
        fxquant.convert(gm)
    model = fxquant.convert(gm, strict=False)
    assert {p.where for p in model.report.float32} == {"conv1: product x W",
                                                       "conv2: product x W"}


def test_gat_softmax_is_float32_and_listed():
    """GAT's attention softmax has no integer form: refused strictly, listed otherwise."""
    data = _graph()
    gm, _ = transformed("gat", "int8", data, 3)
    gm.eval()
    with pytest.raises(ConversionError, match="softmax"):
        fxquant.convert(gm)
    model = fxquant.convert(gm, strict=False)
    assert any("attention" in p.where for p in model.report.float32)
    assert compare(gm, model, data.x, data.edge_index).agreement == 1.0
    # the attention reads the product's values: the simulation's float32 product by
    # default, integers with ties="nearest"
    product = {p.where: p for p in model.report.placements}["convs.0: product x W"]
    assert product.runs == "float32" and "ties='nearest'" in product.why
    nearest = fxquant.convert(gm, strict=False, ties="nearest")
    assert {p.where: p.runs for p in nearest.report.placements}[
        "convs.0: product x W"] == "integer"


def test_unknown_layer_is_refused_or_kept():
    """A layer of another kind: refused naming it, or run as its simulation."""
    from torch_geometric.nn import GraphConv

    class Other(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GraphConv(4, 3)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    gm = fxquant.transform(Other(), mapping("int8"), lint="off").eval()
    with pytest.raises(ConversionError, match=r"layer 'conv'.*GraphConv"):
        fxquant.convert(gm)
    model = fxquant.convert(gm, strict=False)
    data = _graph()
    torch.testing.assert_close(model(data.x, data.edge_index), gm(data.x, data.edge_index))


class _One(torch.nn.Module):
    def __init__(self, conv: torch.nn.Module) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x, edge_index):
        return self.conv(x, edge_index)


def _layer_with(kind: str, aggr):
    from torch_geometric.nn import GATConv, GINConv, SAGEConv
    if kind == "gcn":
        return GCNConv(4, 3, aggr=aggr)
    if kind == "gin":
        return GINConv(torch.nn.Linear(4, 3), aggr=aggr)
    if kind == "gat":
        return GATConv(4, 3, aggr=aggr)
    return SAGEConv(4, 3, aggr=aggr)


@pytest.mark.parametrize("kind, aggr", [("gcn", "mean"), ("gcn", "max"), ("gin", "mean"),
                                        ("gat", "max"), ("sage", "std"),
                                        ("sage", ["mean", "max"])])
def test_an_aggregation_the_layer_does_not_compute_is_refused_or_kept(kind, aggr):
    """A layer whose aggregation the converted layer does not compute (GCN with a mean):
    refused naming the layer and its aggregation, or run as its simulation with
    strict=False, never summed in its place."""
    torch.manual_seed(0)
    gm = fxquant.transform(_One(_layer_with(kind, aggr)), mapping("int8"), lint="off").eval()
    data = _graph()
    if kind != "gat":  # (GAT's softmax is float32: refused under strict=True anyway)
        with pytest.raises(ConversionError, match=r"layer 'conv'.*aggregation"):
            fxquant.convert(gm)
    model = fxquant.convert(gm, strict=False)
    assert any(p.where.startswith("layer 'conv'") for p in model.report.float32)
    assert torch.equal(model(data.x, data.edge_index), gm(data.x, data.edge_index))


@pytest.mark.filterwarnings("ignore:Sparse:UserWarning")
def test_an_aggregation_module_converts_as_its_name(tmp_path):
    """SAGEConv(aggr=MeanAggregation()) is a mean: it converts, computes the simulation's
    codes, saves and loads."""
    from torch_geometric.nn import SAGEConv
    from torch_geometric.nn.aggr import MeanAggregation

    torch.manual_seed(0)
    gm = fxquant.transform(_One(SAGEConv(4, 3, aggr=MeanAggregation())), mapping("int8"),
                           lint="off").eval()
    data = _graph()
    model = fxquant.convert(gm)
    assert model.report.float32 == []
    out = model(data.x, data.edge_index)
    assert torch.equal(out, gm(data.x, data.edge_index))
    save(model, tmp_path / "m.pt")
    assert torch.equal(load(tmp_path / "m.pt")(data.x, data.edge_index), out)


@pytest.mark.parametrize("kind, site", [("sage", "linear"), ("gat", "edge")])
def test_a_point_the_layer_does_not_apply_is_refused_or_kept(kind, site):
    """A point the converted layer would not apply (SAGEConv's linear outputs, GAT's
    attention coefficients): refused naming the point and the site, or the layer runs as
    its simulation with strict=False."""
    m = mapping("int8")
    m.set_global(fxquant.QuantConfig("int8", scale="tensor"), site=site)
    torch.manual_seed(0)
    gm = fxquant.transform(_One(_layer_with(kind, "add" if kind == "sage" else "sum")), m,
                           lint="off").eval()
    data = _graph()
    with pytest.raises(ConversionError, match=rf"conv_{site}\w*quant.*site='{site}'"):
        fxquant.convert(gm)
    model = fxquant.convert(gm, strict=False)
    assert any(p.where.startswith("layer 'conv'") for p in model.report.float32)
    assert torch.equal(model(data.x, data.edge_index), gm(data.x, data.edge_index))


def test_a_dropout_on_in_evaluation_is_refused_or_kept():
    """F.dropout without training=self.training drops values in evaluation too: refused
    naming it, or kept (not turned into an identity) with strict=False; with
    training=self.training it is off in evaluation and converts."""
    import torch.nn.functional as F

    class Dropping(torch.nn.Module):
        def __init__(self, always: bool) -> None:
            super().__init__()
            self.conv1, self.conv2, self.always = GCNConv(4, 8), GCNConv(8, 3), always

        def forward(self, x, edge_index):
            h = self.conv1(x, edge_index).relu()
            h = F.dropout(h, 0.5) if self.always else F.dropout(h, 0.5, self.training)
            return self.conv2(h, edge_index)

    data = _graph()
    gm = fxquant.transform(Dropping(True), mapping("int8"), lint="off").eval()
    with pytest.raises(ConversionError, match=r"dropout.*training=self.training"):
        fxquant.convert(gm)
    model = fxquant.convert(gm, strict=False)
    assert [p.where for p in model.report.float32] == ["function dropout (dropout)"]
    torch.manual_seed(0)
    dropped = model(data.x, data.edge_index)
    torch.manual_seed(0)
    assert torch.equal(dropped, gm(data.x, data.edge_index))
    gm = fxquant.transform(Dropping(False), mapping("int8"), lint="off").eval()
    assert fxquant.convert(gm).report.float32 == []


def test_gat_ignores_edge_features_as_pyg_does():
    """A GATConv built without edge_dim ignores edge_attr (PyG's does): so does its
    converted layer."""
    from torch_geometric.nn import GATConv

    class WithEdges(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = GATConv(4, 3)

        def forward(self, x, edge_index, edge_attr):
            return self.conv(x, edge_index, edge_attr)

    torch.manual_seed(0)
    gm = fxquant.transform(WithEdges(), mapping("int8"), lint="off").eval()
    data = _graph()
    edge_attr = torch.rand(data.edge_index.shape[1], 2)
    model = fxquant.convert(gm, strict=False)
    assert torch.equal(model(data.x, data.edge_index, edge_attr),
                       gm(data.x, data.edge_index, edge_attr))


def test_a_relu_of_mid_rise_codes_in_a_gin_mlp_is_float32():
    """GIN's MLP with its linear outputs on a mid-rise grid (no zero code): the ReLU between
    its linears gives float32 values, so the next product is float32 and listed (strict=True
    refuses it, naming the mid-rise grid), and the model computes the simulation's codes."""
    from torch_geometric.nn import GINConv

    midrise = fxquant.QuantConfig("int4:midrise", scale="tensor")
    qmap = fxquant.QuantMapping()
    for site in ("input", "weight", "message", "aggregate", "output", "linear"):
        qmap = qmap.set_global(midrise, site=site)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    torch.manual_seed(0)
    gm = fxquant.transform(_One(GINConv(mlp)), qmap, lint="off")
    data = _graph()
    gm.train()
    gm(data.x, data.edge_index)
    gm.eval()
    with pytest.raises(ConversionError, match=r"MLP 2 product.*mid-rise"):
        fxquant.convert(gm)
    model = fxquant.convert(gm, strict=False)
    assert [p.where for p in model.report.float32] == ["conv: MLP 2 product"]
    assert compare(gm, model, data.x, data.edge_index).ok(codes=1.0)


def test_kept_parts_take_codes_inside_lists():
    """Parts kept in float32 take the values of codes passed in a list: PyG's
    ``GraphSAGE(jk="cat")`` concatenates its layers' outputs with ``torch.cat``."""
    from torch_geometric.nn.models import GraphSAGE

    data = _graph()
    torch.manual_seed(0)
    gm = _int8(GraphSAGE(4, 8, 2, 3, jk="cat"))
    with pytest.raises(ConversionError, match="function cat"):
        fxquant.convert(gm)
    model = fxquant.convert(gm, strict=False)
    assert "function cat" in [p.where for p in model.report.float32]
    with torch.no_grad():
        torch.testing.assert_close(model(data.x, data.edge_index), gm(data.x, data.edge_index))


def test_heterogeneous_model_keeps_its_bipartite_layers_in_float32():
    """``to_hetero`` calls each edge type's layer on a pair (source, target features) and
    reads the dicts with tuple keys: those layers are refused naming the pair, or kept in
    float32; the layer within one node type runs on integers; the outputs are the
    simulation's."""
    from tests.fx.hetero_models import hetero_graph, inputs, to_hetero_sage

    class PaperLogits(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x_dict, edge_index_dict):
            return self.model(x_dict, edge_index_dict)["paper"]

    data = hetero_graph()
    whole = fxquant.transform(to_hetero_sage(data), mapping("int8"), lint="off").eval()
    with pytest.raises(fxquant.FxquantError, match=r"returns a dict.*one node type's output"):
        fxquant.convert(whole, strict=False)
    gm = fxquant.transform(PaperLogits(to_hetero_sage(data)), mapping("int8"), lint="off")
    gm.train()
    gm(*inputs(data))
    gm.eval()
    with pytest.raises(ConversionError, match=r"'model.conv1.author__writes__paper'.*bipartite"):
        fxquant.convert(gm)
    model = fxquant.convert(gm, strict=False)
    kept = [p.where for p in model.report.float32]
    assert "layer 'model.conv1.author__writes__paper' (SAGEConv)" in kept
    assert not any("paper__cites__paper" in where for where in kept)
    with torch.no_grad():
        torch.testing.assert_close(model(*inputs(data)), gm(*inputs(data)))
    assert compare(gm, model, *inputs(data)).ok(codes=1.0, predictions=1.0)


def test_gin_with_a_trained_eps_converts_quietly():
    """GINConv(train_eps=True): its eps is a parameter, read without a warning."""
    import warnings

    from torch_geometric.nn import GINConv

    class Gin(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GINConv(torch.nn.Sequential(torch.nn.Linear(4, 3)), train_eps=True)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    gm = _int8(Gin())
    with torch.no_grad():
        gm.conv.eps.fill_(0.25)
    data = _graph()
    with warnings.catch_warnings():  # (torch: a scalar read from a tensor that requires grad)
        warnings.filterwarnings("error", message=".*requires_grad")
        model = fxquant.convert(gm)
    with torch.no_grad():
        torch.testing.assert_close(model(data.x, data.edge_index), gm(data.x, data.edge_index))


@pytest.mark.filterwarnings("ignore:Sparse:UserWarning")
def test_a_sparse_or_transposed_edge_index_is_refused_naming_the_layer():
    """A sparse adjacency, or edges as rows, is refused with what to pass instead."""
    from torch_geometric.utils import to_torch_csr_tensor

    data = _graph()
    model = fxquant.convert(_int8())
    adj_t = to_torch_csr_tensor(data.edge_index.flip(0), size=(12, 12))
    with pytest.raises(TypeError, match=r"'conv1'.*sparse_csr.*coalesce\(\)\.indices\(\)"):
        model(data.x, adj_t)
    with pytest.raises(ValueError, match=r"'conv1'.*shape \(40, 2\).*edge_index\.t\(\)"):
        model(data.x, data.edge_index.t())
    with pytest.raises(ValueError, match=r"'conv1'.*torch.float32"):
        model(data.x, data.edge_index.float())


def test_no_points_and_wrong_arguments():
    with pytest.raises(fxquant.FxquantError, match="no quantization points"):
        fxquant.convert(fxquant.trace(TwoLayers()))
    with pytest.raises(TypeError, match="GraphModule"):
        fxquant.convert(TwoLayers())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="strict"):
        fxquant.convert(_int8(), strict="yes")  # type: ignore[arg-type]


def test_stored_features_are_the_first_points_codes():
    """quantize_input gives the codes features are stored as; the model takes them in
    place of the float32 features and computes the same."""
    data = _graph()
    model = fxquant.convert(_int8())
    codes = model.quantize_input(data.x)
    assert codes.codes.dtype == torch.int8 and codes.point == model.input_point
    torch.testing.assert_close(model(codes, data.edge_index), model(data.x, data.edge_index),
                               rtol=0, atol=0)


@pytest.mark.parametrize("site_linear", [False, True])
def test_gin_whose_nn_is_one_linear_converts(tmp_path, site_linear):
    """GINConv(nn.Linear(...)): the MLP is the linear itself; converted on integers (its
    weight and, with site='linear', its output point found), the simulation's codes, and
    saved and loaded."""
    from torch_geometric.nn import GINConv

    class Gin(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = GINConv(torch.nn.Linear(4, 8), eps=0.5)
            self.conv2 = GINConv(torch.nn.Linear(8, 3))

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    qmap = mapping("int8")
    if site_linear:
        qmap = qmap.set_global(fxquant.QuantConfig("int8", scale="tensor"), site="linear")
    gm = fxquant.transform(Gin(), qmap, lint="off").eval()
    data = _graph()
    model = fxquant.convert(gm)
    assert model.report.float32 == []
    runs = {p.where: p.runs for p in model.report.placements}
    assert runs["conv1: MLP linear product"] == "integer"
    result = compare(gm, model, data.x, data.edge_index)
    assert result.ok(codes=1.0), str(result)
    points = {p.point for p in result.points}
    assert ("conv1_linear_nn_quant" in points) == site_linear, points
    path = tmp_path / "gin.pt"
    save(model, path)
    torch.testing.assert_close(load(path)(data.x, data.edge_index),
                               model(data.x, data.edge_index), rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore:Sparse:UserWarning")
def test_a_model_returning_several_tensors_converts(tmp_path):
    """``return logits, hidden``: the converted model returns both (a tuple, the hidden
    codes read as float32), as the simulation does; compare reads the first one's
    predictions; save and load keep it."""
    data = _graph()
    gm = _int8(LogitsAndHidden())
    model = fxquant.convert(gm)
    out = model(data.x, data.edge_index)
    with torch.no_grad():
        expected = gm(data.x, data.edge_index)
    assert isinstance(out, tuple) and len(out) == 2
    for got, want in zip(out, expected, strict=True):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want)
    result = compare(gm, model, data.x, data.edge_index)
    assert result.ok(codes=1.0) and result.nodes == data.num_nodes, str(result)
    path = tmp_path / "both.pt"
    save(model, path)
    again = load(path)(data.x, data.edge_index)
    assert isinstance(again, tuple)
    for got, want in zip(again, out, strict=True):
        assert torch.equal(got, want)


@pytest.mark.filterwarnings("ignore:Sparse:UserWarning")
def test_a_linear_layer_called_on_its_own_converts(tmp_path):
    """A classifier ``torch.nn.Linear`` (or PyG's ``Linear``) after the graph layers, its
    input and weight rounded: its product on integers, every code the simulation's,
    saved and loaded; without a weight point, refused under strict naming the fix, and
    its product kept in float32 otherwise."""
    from torch_geometric.nn.dense.linear import Linear as PygLinear

    data = random_graph(150, 600, 4, seed=2)
    qmap = mapping("int8")
    for site in ("weight", "output"):
        qmap = qmap.set_name("head", fxquant.QuantConfig("int8", scale="tensor"), site=site)
    for head in (torch.nn.Linear(8, 3), PygLinear(-1, 3)):
        torch.manual_seed(0)
        model = WithHead(linear=head)
        model(data.x, data.edge_index)  # (PyG's lazy Linear takes its shape)
        gm = fxquant.transform(model, qmap, lint="off")
        gm.train()
        gm(data.x, data.edge_index)
        gm.eval()
        model = fxquant.convert(gm)
        runs = {p.where: p.runs for p in model.report.placements}
        assert runs["head: product x W"] == "integer", model.report
        result = compare(gm, model, data.x, data.edge_index)
        assert result.ok(codes=1.0), str(result)
        assert "head_quant" in {p.point for p in result.points}
        from fxquant.execution import storage

        stored = storage(model, data.x, data.edge_index)  # (the head's weight as codes)
        assert "head_weight_weight_quant" in [r.name for r in stored.rows if r.kind == "weight"]
        assert stored.float_parameter_bytes == 4 * (8 + 8 + 3)  # (the biases only)
        path = tmp_path / "head.pt"
        save(model, path)
        torch.testing.assert_close(load(path)(data.x, data.edge_index),
                                   model(data.x, data.edge_index), rtol=0, atol=0)
    gm = fxquant.transform(WithHead(), mapping("int8").set_name(
        "head", fxquant.QuantConfig("int8", scale="tensor"), site="output"), lint="off").eval()
    with pytest.raises(ConversionError, match=r"'head: product x W'.*site='weight'"):
        fxquant.convert(gm)
    model = fxquant.convert(gm, strict=False)
    assert "head: product x W" in [p.where for p in model.report.float32]
    with torch.no_grad():
        torch.testing.assert_close(model(data.x, data.edge_index), gm(data.x, data.edge_index))


def test_a_linear_layer_without_points_computes_as_the_simulation():
    """A linear encoder no point rounds, before rounded GCN layers: its float32 product
    adds the bias as the simulation's linear layer does (inside the product), so the
    logits are the simulation's to the bit and every later code agrees; on an input of
    more than two dimensions it runs as the simulation too."""

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = torch.nn.Linear(256, 40)
            self.conv1, self.conv2 = GCNConv(40, 16), GCNConv(16, 4)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(self.enc(x).relu(), edge_index).relu(), edge_index)

    unequal = []
    for seed in range(6):
        data = random_graph(300, 1200, 256, seed=seed)
        torch.manual_seed(seed)
        gm = fxquant.transform(Encoder(), mapping("int8"), lint="off")
        gm.train()
        gm(data.x, data.edge_index)
        gm.eval()
        model = fxquant.convert(gm, strict=False)
        result = compare(gm, model, data.x, data.edge_index)
        with torch.no_grad():
            same = torch.equal(model(data.x, data.edge_index), gm(data.x, data.edge_index))
        if not same or not result.ok(codes=1.0):
            unequal.append((seed, same, str(result)))
    assert not unequal, unequal

    class Heads(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.head = GCNConv(4, 8), torch.nn.Linear(2, 3)

        def forward(self, x, edge_index):
            return self.head(self.conv1(x, edge_index).view(-1, 4, 2)).sum(1)

    data = _graph()
    qmap = mapping("int8")
    for site in ("input", "weight"):
        qmap = qmap.set_name("head", fxquant.QuantConfig("int8", scale="tensor"), site=site)
    gm = fxquant.transform(Heads(), qmap, lint="off").eval()
    model = fxquant.convert(gm, strict=False)
    with torch.no_grad():
        assert torch.equal(model(data.x, data.edge_index), gm(data.x, data.edge_index))


@pytest.mark.filterwarnings("ignore:Sparse:UserWarning")
def test_loading_describes_the_model_as_it_runs(tmp_path):
    """A file whose report says otherwise than the loaded layers run (written by another
    version: GAT's product ran on integers) loads with the layers' own placements."""
    import json

    data = _graph()
    gm, _ = transformed("gat", "int8", data, 3)
    gm.eval()
    model = fxquant.convert(gm, strict=False)
    path = tmp_path / "gat.pt"
    save(model, path)
    payload = torch.load(path, weights_only=True)
    program = json.loads(payload["program"])
    for p in program["placements"]:
        if p["where"] == "convs.0: product x W":
            p.update(runs="integer", how="int8 x int8 -> int32", why="")
    payload["program"] = json.dumps(program)
    torch.save(payload, path)
    loaded = {p.where: p for p in load(path).report.placements}
    assert loaded["convs.0: product x W"].runs == "float32"
    assert loaded == {p.where: p for p in model.report.placements}


def test_save_and_load_round_trip(tmp_path):
    """Saved without pickled code (weights_only), loaded without the model's class: the
    same outputs, the same report, and weights stored packed."""
    data = _graph()
    gm, _ = transformed("gcn", "int4-lsq-p", data, 3)
    gm.train()
    gm(data.x, data.edge_index)
    gm.eval()
    model = fxquant.convert(gm)
    path = tmp_path / "model.pt"
    save(model, path)
    again = load(path)
    torch.testing.assert_close(again(data.x, data.edge_index), model(data.x, data.edge_index),
                               rtol=0, atol=0)
    nearest = fxquant.convert(gm, ties="nearest", accumulate="int32")
    save(nearest, path)
    assert load(path).layers["conv1"].rebuild["ties"] == "nearest"
    assert load(path).layers["conv1"].rebuild["accumulate"] == "int32"
    assert again.report.placements == model.report.placements
    raw = torch.load(path, weights_only=True)
    weight = raw["state_dict"]["layers.conv1.weight.data"]
    assert weight.dtype == torch.uint8 and weight.numel() == (16 * 4 + 1) // 2


def test_save_refuses_kept_python_code(tmp_path):
    m = mapping("int8").set_name("conv1", fxquant.QuantConfig(10), site="output")
    model = fxquant.convert(fxquant.transform(TwoLayers(), m, lint="off").eval(), strict=False)
    with pytest.raises(fxquant.FxquantError, match="cannot be saved without pickling"):
        save(model, tmp_path / "m.pt")


def test_node_ids_select_per_node_widths():
    """A mini-batch with its global node ids: the widths of those nodes, as the
    transformed model looks them up."""
    data = random_graph(30, 90, 6, seed=2)
    data.x = (data.x > 1).float()  # (exact on the recipe's uint1 input grid)
    gm, _ = transformed("sage", "recommended", data, 3)  # (GCNConv(cached=True) would reuse
    # the whole graph's normalization on a batch)
    gm.train()
    gm(data.x, data.edge_index)
    gm.eval()
    model = fxquant.convert(gm, strict=False)
    ids = torch.tensor([3, 7, 11, 12, 20, 29])
    sub = torch.tensor([[0, 1, 2, 3, 4, 5, 1], [1, 2, 3, 4, 5, 0, 3]])
    result = compare(gm, model, data.x[ids], sub, node_ids=ids)
    assert result.ok(codes=0.99), str(result)
    with pytest.raises(fxquant.FxquantError, match="node_ids has 2 entries"):
        model(data.x[ids], sub, node_ids=ids[:2])


def test_conversion_options():
    """accumulate='int32' sums into int32 and ties='nearest' rounds the integer values as
    they are: the same predictions, codes at most one level from the simulation's; both
    are saved with the model; unknown values are refused."""
    data = _graph()
    gm = _int8()
    for kwargs in ({"accumulate": "int32"}, {"ties": "nearest"}):
        model = fxquant.convert(gm, **kwargs)
        result = compare(gm, model, data.x, data.edge_index)
        assert all(p.max_diff <= 1 for p in result.points), str(result)
        assert result.agreement >= 0.9
    with pytest.raises(fxquant.FxquantError, match="accumulate='float64'"):
        fxquant.convert(gm, accumulate="float64")
    with pytest.raises(fxquant.FxquantError, match="ties='up'"):
        fxquant.convert(gm, ties="up")


def test_torch_compile_runs_a_converted_model_eager_with_a_warning():
    """torch.compile of a converted model gives its eager results (its steps are read from
    the values as Python numbers each forward), and says that it runs eager."""
    data = _graph()
    model = fxquant.convert(_int8())
    expected = model(data.x, data.edge_index)
    compiled = torch.compile(model)
    with pytest.warns(UserWarning, match="runs eager under torch.compile"):
        got = compiled(data.x, data.edge_index)
    assert torch.equal(got, expected)
