"""ONNX export: the converted model as an ONNX graph that ONNX Runtime's CPU provider runs
on integers (MatMulInteger, ScatterND into int32), predicting as the converted model
does. Without the ``export`` extra the tests skip, except under CI=true, where they fail."""

from __future__ import annotations

import functools

import pytest
import torch
import torch_geometric.transforms as T

import fxquant
from fxquant.datasets import load_planetoid
from fxquant.execution import export_onnx, onnx_inputs
from fxquant.execution.export import ExportError
from tests.support.data import needs_data
from tests.support.execution import (
    LogitsAndHidden,
    WithHead,
    mapping,
    random_graph,
    train,
    transformed,
)
from tests.support.extras import require


def _runtime():
    _, onnxruntime = require("export", "onnx", "onnxruntime")
    return onnxruntime


def _run(path, data, node_ids: bool, x=None):
    ort = _runtime()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = onnx_inputs(data.x if x is None else x, data.edge_index,
                       torch.arange(data.num_nodes) if node_ids else None)
    return torch.from_numpy(session.run(None, feed)[0])


def _uses_nodes(model) -> bool:
    from fxquant.execution.quantizer import IntQuantizer

    return any(m.widths is not None for m in model.modules() if isinstance(m, IntQuantizer))


def _ops(path) -> set[str]:
    import onnx

    return {n.op_type for n in onnx.load(str(path)).graph.node}


@pytest.mark.parametrize("kind", ["gcn", "sage", "gin"])
@pytest.mark.parametrize("config", ["int8", "int4-lsq-p", "recommended"])
def test_onnx_runs_the_integer_model(tmp_path, kind, config):
    """On a small random graph: integer operators in the file, and ONNX Runtime's logits
    those of the converted model."""
    _runtime()
    data = random_graph(40, 160, 6, seed=3)
    data.x = (data.x > 0.8).float()  # (exact on the recipe's uint1 input grid)
    gm, _ = transformed(kind, config, data, 3)
    gm.train()
    gm(data.x, data.edge_index)
    gm.eval()
    model = fxquant.convert(gm, strict=False)
    path = tmp_path / "model.onnx"
    export_onnx(model, path)
    ops = _ops(path)
    assert {"ScatterND"} <= ops
    if config != "recommended":
        assert "MatMulInteger" in ops
    out = _run(path, data, _uses_nodes(model))
    expected = model(data.x, data.edge_index)
    agree = (out.argmax(1) == expected.argmax(1)).float().mean()
    assert agree >= 0.95, float(agree)
    torch.testing.assert_close(out, expected, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("kind", ["gcn", "sage", "gin"])
@pytest.mark.parametrize("config", ["int8", "int4-lsq-p", "recommended"])
def test_onnx_computes_the_integer_models_values(tmp_path, kind, config):
    """Signed features (the messages' range set by its negative end) on a graph where the
    nodes of the largest values send nothing: ONNX Runtime's logits equal, to float32
    rounding, those of the model converted with ``ties="nearest"`` (the same exact integer
    computation, ties rounded as they are)."""
    _runtime()
    data = random_graph(40, 160, 6, seed=3)
    data.x = torch.randn(data.x.shape, generator=torch.Generator().manual_seed(0)) - 1.0
    # nodes 0-3 send nothing, and hold the largest magnitudes (outside the messages' range)
    data.edge_index = data.edge_index[:, data.edge_index[0] >= 4]
    data.x[:4] *= 3.0
    if config == "recommended":
        data.x = (data.x > 0.8).float()  # (exact on the recipe's uint1 input grid)
    gm, _ = transformed(kind, config, data, 3)
    gm.train()
    gm(data.x, data.edge_index)
    gm.eval()
    model = fxquant.convert(gm, strict=False, ties="nearest")
    path = tmp_path / "model.onnx"
    export_onnx(model, path)
    out = _run(path, data, _uses_nodes(model))
    torch.testing.assert_close(out, model(data.x, data.edge_index), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["gcn", "sage", "gin"])
@pytest.mark.parametrize("config", ["int8", "int4-lsq-p", "recommended"])
def test_onnx_takes_the_features_as_their_stored_codes(tmp_path, kind, config):
    """stored_input=True: the graph takes the int8 codes features are stored as (with
    their scale and shift: per row for the recipe's input) and computes what the graph of
    float32 features computes from them."""
    _runtime()
    data = random_graph(40, 160, 6, seed=5)
    data.x = (data.x > 0.8).float()
    gm, _ = transformed(kind, config, data, 3)
    gm.train()
    gm(data.x, data.edge_index)
    gm.eval()
    model = fxquant.convert(gm, strict=False)
    stored, rounded = tmp_path / "stored.onnx", tmp_path / "rounded.onnx"
    export_onnx(model, stored, stored_input=True)
    export_onnx(model, rounded)
    import onnx

    inputs = {i.name: i.type.tensor_type.elem_type for i in onnx.load(str(stored)).graph.input}
    assert inputs["x"] == onnx.TensorProto.UINT8 and {"x_scale", "x_shift"} <= inputs.keys()
    codes = model.quantize_input(data.x, torch.arange(data.num_nodes)
                                 if _uses_nodes(model) else None)
    out = _run(stored, data, _uses_nodes(model), x=codes)
    torch.testing.assert_close(out, _run(rounded, data, _uses_nodes(model)))
    agree = (out.argmax(1) == model(codes, data.edge_index).argmax(1)).float().mean()
    assert agree >= 0.95, float(agree)


def test_stored_input_needs_an_input_point_and_the_integer_graph(tmp_path):
    """stored_input=True is refused, saying why, with float32=True and for a model whose
    features no point rounds."""
    _runtime()
    model = fxquant.convert(fxquant.transform(_two_layers(), _int8_but_input(),
                                              lint="off").eval(), strict=False)
    with pytest.raises(ExportError, match="has none"):
        export_onnx(model, tmp_path / "m.onnx", stored_input=True)
    with pytest.raises(ExportError, match="float32=True"):
        export_onnx(model, tmp_path / "m.onnx", stored_input=True, float32=True)


def _int8_but_input() -> fxquant.QuantMapping:
    m = fxquant.QuantMapping()
    for site in ("weight", "message", "aggregate", "output"):
        m = m.set_global(fxquant.QuantConfig("int8", scale="tensor"), site=site)
    return m


def test_onnx_runs_a_linear_classifier_on_integers(tmp_path):
    """GCN layers and a ``torch.nn.Linear`` classifier, every part rounded: the head is a
    ``MatMulInteger`` too, and ONNX Runtime computes the ``ties="nearest"`` model's logits."""
    _runtime()
    data = random_graph(60, 240, 6, seed=4)
    qmap = mapping("int8")
    for site in ("weight", "output"):
        qmap = qmap.set_name("head", fxquant.QuantConfig("int8", scale="tensor"), site=site)
    torch.manual_seed(0)
    gm = fxquant.transform(WithHead(6), qmap, lint="off")
    gm.train()
    gm(data.x, data.edge_index)
    gm.eval()
    model = fxquant.convert(gm, ties="nearest")
    path = tmp_path / "head.onnx"
    export_onnx(model, path)
    import onnx

    products = [n for n in onnx.load(str(path)).graph.node if n.op_type == "MatMulInteger"]
    assert len(products) == 3
    torch.testing.assert_close(_run(path, data, False), model(data.x, data.edge_index),
                               rtol=1e-4, atol=1e-4)


def test_a_relu_of_mid_rise_codes_is_a_relu_of_their_values(tmp_path):
    """A mid-rise grid has no zero code: a ReLU of its codes gives their float32 values
    (the product after it is float32, which convert lists and strict=True refuses), and
    the graph computes the same (it kept the code -1, half a step below zero)."""
    _runtime()
    data = random_graph(30, 120, 6, seed=0)
    data.x = torch.randn(30, 6, generator=torch.Generator().manual_seed(0))
    midrise = fxquant.QuantConfig("int4:midrise", scale="tensor")
    qmap = fxquant.QuantMapping()
    for site in ("input", "weight", "message", "aggregate", "output"):
        qmap = qmap.set_global(midrise, site=site)
    for site in ("weight", "output"):
        qmap = qmap.set_name("head", midrise, site=site)
    torch.manual_seed(0)
    gm = fxquant.transform(WithHead(6), qmap, lint="off")
    gm.train()
    gm(data.x, data.edge_index)
    gm.eval()
    with pytest.raises(fxquant.execution.ConversionError, match="head: product"):
        fxquant.convert(gm)
    model = fxquant.convert(gm, strict=False, ties="nearest")
    assert [p.where for p in model.report.float32] == ["head: product x W"]
    path = tmp_path / "midrise.onnx"
    export_onnx(model, path)
    torch.testing.assert_close(_run(path, data, False), model(data.x, data.edge_index),
                               rtol=1e-4, atol=1e-4)


def test_gcn_coefficients_are_torchs_to_the_bit(tmp_path):
    """GCN's normalization in the graph is torch's ``deg.pow(-0.5)`` to the bit (ONNX's Pow
    differs in the last bit for degrees such as 6 and 7, which moved messages on a
    rounding boundary of a 4-bit step to another code)."""
    import onnx
    from torch_geometric.utils import add_remaining_self_loops

    ort = _runtime()
    g = torch.Generator().manual_seed(0)
    n = 3000
    x, edge_index = torch.randn(n, 8, generator=g), torch.randint(0, n, (2, 30 * n),
                                                                   generator=g)
    torch.manual_seed(0)
    gm = fxquant.transform(_two_layers_of(8), mapping("int8"), lint="off")
    gm.train()
    gm(x, edge_index)
    gm.eval()
    path = tmp_path / "gcn.onnx"
    export_onnx(fxquant.convert(gm, ties="nearest"), path)
    graph = onnx.load(str(path))
    inverse = [node.output[0] for node in graph.graph.node
               if node.op_type in ("Pow", "Reciprocal") and any(
                   o in node.input for m in graph.graph.node if m.op_type in ("Sqrt", "ScatterElements")
                   for o in m.output)]
    assert inverse
    for name in inverse:
        graph.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT,
                                                                     None))
    session = ort.InferenceSession(graph.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    loops, _ = add_remaining_self_loops(edge_index, num_nodes=n)
    degree = torch.zeros(n).scatter_add_(0, loops[1], torch.ones(loops.shape[1]))
    for got in session.run(None, onnx_inputs(x, edge_index))[1:]:
        assert torch.equal(torch.from_numpy(got), degree.pow(-0.5))


def test_nodes_outside_a_width_table_take_its_mean(tmp_path):
    """Fixed per-node widths for 30 nodes, run on 40: the converted model gives the nodes
    outside the table the table's mean width, and so does the graph (it failed on them)."""
    _runtime()
    bits = torch.randint(2, 9, (30,), generator=torch.Generator().manual_seed(1))
    qmap = fxquant.QuantMapping()
    for site in ("input", "weight", "message", "aggregate", "output"):
        qmap = qmap.set_global(fxquant.QuantConfig(
            "int4", scale="tensor",
            node_bits=None if site == "weight" else fxquant.NodeBits(bits)), site=site)
    data = random_graph(30, 120, 8, seed=0)
    torch.manual_seed(0)
    gm = fxquant.transform(_two_layers_of(8), qmap, lint="off")
    gm.train()
    gm(data.x, data.edge_index, node_ids=torch.arange(30))
    gm.eval()
    model = fxquant.convert(gm, ties="nearest")
    path = tmp_path / "widths.onnx"
    export_onnx(model, path)
    more = random_graph(40, 150, 8, seed=9)
    torch.testing.assert_close(_run(path, more, True),
                               model(more.x, more.edge_index, node_ids=torch.arange(40)),
                               rtol=1e-4, atol=1e-4)


def _two_layers_of(features: int) -> torch.nn.Module:
    from torch_geometric.nn import GCNConv

    class Two(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.conv2 = GCNConv(features, 16), GCNConv(16, 3)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    return Two()


def test_export_refuses_a_model_returning_several_tensors(tmp_path):
    """The graph has one output: a model returning ``(logits, hidden)`` is refused."""
    _runtime()
    gm = fxquant.transform(LogitsAndHidden(), mapping("int8"), lint="off").eval()
    with pytest.raises(ExportError, match="returns a tuple or list of tensors"):
        export_onnx(fxquant.convert(gm), tmp_path / "both.onnx")


def test_export_refuses_what_it_cannot_write(tmp_path):
    """A GAT layer, a point kept in float32: refused, naming the part."""
    _runtime()
    data = random_graph(10, 30, 4, seed=1)
    gm, _ = transformed("gat", "int8", data, 3)
    gm.eval()
    with pytest.raises(ExportError, match=r"layer 'convs.0' \(GATConv\)"):
        export_onnx(fxquant.convert(gm, strict=False), tmp_path / "gat.onnx")
    gm = fxquant.transform(_two_layers(), _with_top("conv1"), lint="off")
    model = fxquant.convert(gm.eval(), strict=False)
    with pytest.raises(ExportError, match=r"'conv1_quant'.*Python code"):
        export_onnx(model, tmp_path / "top.onnx")


@pytest.mark.parametrize("keyword", [False, True])
def test_export_refuses_a_model_input_the_graph_does_not_take(tmp_path, keyword):
    """Edge weights passed to the model (positionally or by keyword) are refused, naming
    the input: the graph takes x and edge_index, and would compute without them."""
    from torch_geometric.nn import GCNConv

    class Weighted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = GCNConv(4, 8), GCNConv(8, 3)

        def forward(self, x, edge_index, weight):
            if keyword:
                h = self.conv1(x, edge_index, edge_weight=weight).relu()
                return self.conv2(h, edge_index, edge_weight=weight)
            return self.conv2(self.conv1(x, edge_index, weight).relu(), edge_index, weight)

    _runtime()
    gm = fxquant.transform(Weighted(), mapping("int8"), lint="off").eval()
    model = fxquant.convert(gm)
    with pytest.raises(ExportError, match=r"input 'weight' is used by layer 'conv1'"):
        export_onnx(model, tmp_path / "w.onnx")


def _two_layers():
    from torch_geometric.nn import GCNConv

    class TwoLayers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = GCNConv(4, 8), GCNConv(8, 3)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    return TwoLayers()


def _with_top(layer: str) -> fxquant.QuantMapping:
    from tests.support.execution import mapping

    return mapping("int8").set_name(layer, fxquant.QuantConfig(10), site="output")


@functools.cache
def _cora():
    dataset = load_planetoid("Cora", None, transform=T.NormalizeFeatures(), download=False)
    return dataset[0], dataset.num_classes


@pytest.mark.slow
@needs_data
@pytest.mark.parametrize("kind", ["gcn", "sage", "gin"])
@pytest.mark.parametrize("config", ["int8", "int4-lsq-p", "recommended"])
def test_onnx_predictions_agree_on_cora(tmp_path, kind, config):
    """Trained a few epochs on Cora: ONNX Runtime's predictions agree with the converted
    model's on at least 99.5% of the test nodes (both counts printed)."""
    _runtime()
    data, classes = _cora()
    gm, run = transformed(kind, config, data, classes)
    train(gm, run, data, 5)
    model = fxquant.convert(gm, strict=False)
    path = tmp_path / "model.onnx"
    export_onnx(model, path, feature_dim=data.num_features)
    out = _run(path, data, _uses_nodes(model))
    expected = model(data.x, data.edge_index)
    mask = data.test_mask
    agree = int((out.argmax(1)[mask] == expected.argmax(1)[mask]).sum())
    total = int(mask.sum())
    print(f"\n{kind} {config}: ONNX Runtime and the converted model agree on {agree} of "
          f"{total} test nodes")
    assert agree >= 0.995 * total
