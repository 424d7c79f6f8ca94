"""fxquant.transform: trace -> check before -> run the pass -> check after -> compare numerics."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GCNConv, MessagePassing
from torch_geometric.nn.models import GAT, GraphSAGE
from torch_geometric.nn.models import GCN as PygGCN

import fxquant
from fxquant.formats import TopN
from fxquant.quant import QuantPoint
from tests.support.models import GCN, MLPGCN, DataGCN, tiny_graph


def np_mask(t: torch.Tensor, bits: int) -> torch.Tensor:
    """The NumPy bit-mask reference: keep the top ``bits`` of each float32 pattern."""
    a = t.detach().numpy().astype(np.float32).view(np.uint32)
    keep = np.uint32((0xFFFFFFFF << (32 - bits)) & 0xFFFFFFFF)
    return torch.from_numpy((a & keep).view(np.float32).copy())


def point_nodes(gm):
    """The graph nodes that call a quantization point."""
    return [n for n in gm.graph.nodes
            if n.op == "call_module" and isinstance(gm.get_submodule(str(n.target)), QuantPoint)]


def point_layers(gm):
    """``[(layer, number)]`` of every point, in graph order."""
    return [(p.layer, p.config.format) for _, p in fxquant.quantization_points(gm)]


def test_gcn_forward_matches_numpy_bit_mask_reference(graph):
    """After conv1 and conv2 the values are exactly the NumPy masks of the eager ones."""
    model = GCN()
    gm = fxquant.trace(model)
    assert not point_nodes(gm)
    gm = fxquant.transform(model, bits=16)
    assert [n.name for n in point_nodes(gm)] == ["conv1_quant", "conv2_quant"]
    x, ei = graph.x, graph.edge_index
    with torch.no_grad():
        h = np_mask(model.conv1(x, ei), 16)
        h = np_mask(model.conv2(torch.sigmoid(h), ei), 16)
        expected = F.log_softmax(h, dim=1)
        assert torch.equal(gm(x, ei), expected)


def test_inserted_nodes_are_out_of_place_and_rewired(graph):
    """Every user of a selected node reads the rounded value; print(gm) shows the config."""
    gm = fxquant.transform(GCN(), bits=12, rounding="nearest")
    conv1 = next(n for n in gm.graph.nodes if n.name == "conv1")
    assert [u.name for u in conv1.users] == ["conv1_quant"]
    point = next(iter(conv1.users))
    assert [u.name for u in point.users] == ["sigmoid"]
    assert "conv1_quant = self.conv1_quant(conv1)" in gm.code
    assert "(conv1_quant): QuantPoint(output of 'conv1': top12, nearest, ste)" in str(gm)
    assert point.meta["fxquant"]["layer"] == "conv1"
    gm.graph.lint()


def test_original_model_is_not_modified(graph):
    """Default: a deep copy; the source model keeps its parameters, graph and outputs."""
    model = GCN()
    state = copy.deepcopy(model.state_dict())
    before = model(graph.x, graph.edge_index)
    gm = fxquant.transform(model, bits=8)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert torch.equal(model(graph.x, graph.edge_index), before)
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(gm.parameters(), model.parameters(), strict=True))
    with torch.no_grad():
        next(gm.parameters()).add_(1.0)
    assert torch.equal(model(graph.x, graph.edge_index), before)


def test_inplace_shares_parameters():
    """inplace=True returns a GraphModule over the same parameter tensors."""
    model = GCN()
    with pytest.raises(TypeError, match="inplace must be True or False"):
        fxquant.transform(model, bits=8, inplace=1)
    gm = fxquant.transform(model, bits=8, inplace=True)
    assert {p.data_ptr() for p in gm.parameters()} == {p.data_ptr() for p in model.parameters()}


@pytest.mark.parametrize("site", ["output", "message", "aggregate", "weight", "linear", "edge"])
def test_inplace_leaves_the_model_computing_as_before(site, graph):
    """inplace=True shares the model's tensors but never sets the objects that round inside
    a layer on the model's own layer (the model itself rounded after it); the result equals
    the default transform's, and training it trains the model's parameters."""
    torch.manual_seed(0)
    model = PygGCN(graph.x.shape[1], 8, num_layers=2, out_channels=3).eval()
    x, ei = graph.x, graph.edge_index
    before = model(x, ei)
    mapping = fxquant.QuantMapping().set_global(fxquant.QuantConfig("int2", scale="tensor"),
                                                site=site)
    gm = fxquant.transform(model, mapping, inplace=True, lint="off")
    copied = fxquant.transform(model, mapping, lint="off")
    assert torch.equal(model(x, ei), before)
    assert not any(k in vars(m) for m in model.modules()
                   for k in ("forward", "aggregate", "propagate", "message_and_aggregate"))
    assert torch.equal(gm(x, ei), copied(x, ei))
    assert not torch.equal(gm(x, ei), before)
    assert {p.data_ptr() for p in gm.parameters()} >= {p.data_ptr() for p in model.parameters()}
    with torch.no_grad():
        next(gm.parameters()).add_(1.0)
    assert not torch.equal(model(x, ei), before)  # the same tensors


def test_inplace_shares_hooks_and_computed_weights(graph):
    """With inplace=True a layer rounded inside is a copy, which shares the model's hook
    tables (a hook added or removed later acts on both, and a bound-method hook reports to
    the user's object) and its computed tensors (a pruned weight, which deepcopy refuses)."""
    from torch.nn.utils import prune

    torch.manual_seed(0)
    model = PygGCN(graph.x.shape[1], 8, num_layers=2, out_channels=3).eval()
    prune.l1_unstructured(model.convs[0].lin, "weight", amount=0.5)
    seen = []
    handle = model.convs[0].register_forward_hook(lambda *_: seen.append("before"))
    mapping = fxquant.QuantMapping().set_global(fxquant.QuantConfig("int4", scale="tensor"),
                                                site="message")
    gm = fxquant.transform(model, mapping, inplace=True, lint="off").eval()
    assert gm.get_submodule("convs.0") is not model.convs[0]
    model.convs[0].register_forward_hook(lambda *_: seen.append("after"))
    gm(graph.x, graph.edge_index)
    assert seen == ["before", "after"]
    handle.remove()
    seen.clear()
    gm(graph.x, graph.edge_index)
    assert seen == ["after"]
    before = gm(graph.x, graph.edge_index)
    with torch.no_grad():  # the pruned weight is recomputed from the shared tensors
        model.convs[0].lin.weight_orig.mul_(2.0)
    assert not torch.equal(gm(graph.x, graph.edge_index), before)


def test_inplace_converts_the_models_buffers_with_the_result(graph):
    """.double() (or .to(), .half()) of an in-place result converts the buffers of the
    layers rounded inside in the user's model too (BatchNorm statistics inside GINConv):
    they were left behind, the model half-converted and failing, its statistics no longer
    following training."""
    from torch_geometric.nn.models import GIN

    torch.manual_seed(0)
    model = GIN(graph.x.shape[1], 8, num_layers=2, out_channels=3, norm="batch_norm")
    mapping = fxquant.QuantMapping().set_global(fxquant.QuantConfig("int8", scale="tensor"),
                                                site="message")
    gm = fxquant.transform(model, mapping, inplace=True, lint="off").double()
    ours = model.convs[0].nn.norms[0].module
    theirs = gm.get_submodule("convs.0").nn.norms[0].module
    assert ours.running_mean is theirs.running_mean
    assert ours.running_mean.dtype == torch.float64
    gm.train()(graph.x.double(), graph.edge_index)
    assert model.eval()(graph.x.double(), graph.edge_index).dtype == torch.float64


@pytest.mark.parametrize("inplace", [False, True])
def test_a_linear_shared_by_two_layers_is_refused_for_both(inplace, graph):
    """One Linear child in two layers can round its weight for one of them only: refused in
    both modes, naming both, before any change (inplace=True un-tied the two before)."""
    torch.manual_seed(0)
    model = PygGCN(graph.x.shape[1], 4, num_layers=2, out_channels=4)
    model.convs[1].lin = model.convs[0].lin = torch.nn.Linear(4, 4, bias=False)
    for site in ("weight", "linear"):
        mapping = fxquant.QuantMapping().set_global(fxquant.QuantConfig(8), site=site)
        with pytest.raises(ValueError, match=r"the linear 'lin' of layer 'convs\.1' is the same "
                                             r"module as 'convs\.0\.lin'"):
            fxquant.transform(model, mapping, inplace=inplace, lint="off")
        assert model.convs[0].lin is model.convs[1].lin and not vars(model.convs[0].lin).get(
            "forward")


def test_a_layer_returning_several_values_is_refused_at_its_output(graph):
    """GATConv(return_attention_weights=True) returns (out, (edge_index, alpha)): its output
    point failed at the first forward with "'tuple' object has no attribute 'dim'". The
    error names the point and the way out, which works. (transform cannot tell: a model
    indexes a tensor output, ``out[0]``, as it indexes a tuple.)"""
    from torch_geometric.nn import GATConv

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.conv2 = GATConv(4, 4, heads=2), GATConv(8, 3)

        def forward(self, x, edge_index):
            out, (_, alpha) = self.conv(x, edge_index, return_attention_weights=True)
            return self.conv2(out, edge_index), alpha

    every = fxquant.transform(Attention(), bits=8, lint="off")
    with pytest.raises(TypeError, match=r"output of 'conv'\W* received a tuple, not a tensor.*"
                                        r"set_name\('conv', None\)"):
        every(graph.x, graph.edge_index)
    mapping = fxquant.QuantMapping().set_global(fxquant.QuantConfig(8)).set_name("conv", None) \
        .set_name("conv", fxquant.QuantConfig(8), site="message")
    gm = fxquant.transform(Attention(), mapping, lint="off")
    assert [n for n, _ in fxquant.quantization_points(gm)] == ["conv_message_quant", "conv2_quant"]
    out, _ = gm(graph.x, graph.edge_index)
    assert out.shape == (graph.x.shape[0], 3)

    class Indexed(nn.Module):  # a tensor output indexed by the model is rounded as before
        def __init__(self):
            super().__init__()
            self.conv = GATConv(4, 4)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)[0]

    model = Indexed()
    indexed = fxquant.transform(model, bits=8, lint="off")
    rounded = indexed.get_submodule("conv_quant")(model.conv(graph.x, graph.edge_index))
    assert torch.equal(indexed(graph.x, graph.edge_index), rounded[0])


@pytest.mark.parametrize("inplace", [False, True])
def test_transforming_again_refuses_a_layer_already_rounded_inside(inplace, graph):
    """A second transform adding an inner site to a layer the first already rounds inside
    replaced the first's objects, dropping its points silently. It is refused, naming the
    layer, and nothing changes; other layers and outer sites may still be added."""
    torch.manual_seed(0)
    first = fxquant.transform(PygGCN(graph.x.shape[1], 8, num_layers=2, out_channels=3),
                              fxquant.QuantMapping().set_name(
                                  "convs.0", fxquant.QuantConfig("int2", scale="tensor"),
                                  site="message"), lint="off").eval()
    x, ei = graph.x, graph.edge_index
    before, code = first(x, ei), first.code
    for site in ("aggregate", "message"):
        again = fxquant.QuantMapping().set_name("convs.0", fxquant.QuantConfig(16), site=site)
        with pytest.raises(ValueError, match=r"layer 'convs\.0' already rounds inside"):
            fxquant.transform(first, again, inplace=inplace, lint="off")
        assert first.code == code and torch.equal(first(x, ei), before)
    more = fxquant.QuantMapping().set_name("convs.1", fxquant.QuantConfig(16), site="message") \
        .set_name("convs.0", fxquant.QuantConfig(16)) \
        .set_name("convs.0", fxquant.QuantConfig(16), site="weight")  # (its linear's forward)
    twice = fxquant.transform(first, more, inplace=inplace, lint="off").eval()
    assert (twice is first) == inplace
    ran = []
    for name, point in fxquant.quantization_points(twice):
        point.register_forward_hook(lambda *_, name=name: ran.append(name))
    twice(x, ei)
    assert len(set(ran)) == len(fxquant.quantization_points(twice)) == 4  # every one runs


@pytest.mark.parametrize(
    ("layers", "expected"),
    [
        (None, ["conv1", "conv2"]),
        ("conv1", ["conv1"]),
        ("sigmoid", ["sigmoid"]),
        ("conv*", ["conv1", "conv2"]),
        (GCNConv, ["conv1", "conv2"]),
        (["conv2", "sigmoid"], ["sigmoid", "conv2"]),
        (lambda n: n.op == "call_function", ["sigmoid", "log_softmax"]),
    ],
)
def test_layer_selection(layers, expected):
    """Names, node names, patterns, classes, predicates and lists select the right nodes."""
    gm = fxquant.transform(GCN(), bits=10, layers=layers)
    assert [layer for layer, _ in point_layers(gm)] == expected


def test_bits_dict_truncates_exactly_the_listed_layers():
    """A dict gives each layer its own bits; unlisted layers are left alone."""
    gm = fxquant.transform(GCN(), bits={"conv1": 16, "sigmoid": 9})
    assert point_layers(gm) == [("conv1", TopN(16)), ("sigmoid", TopN(9))]


def test_pyg_modulelist_names():
    """ModuleList children are selected by qualified name or pattern."""
    gm = fxquant.transform(PygGCN(4, 8, num_layers=3, out_channels=2), bits=10, layers="convs.1")
    assert [layer for layer, _ in point_layers(gm)] == ["convs.1"]


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"bits": 8, "layers": "conv9"}, ValueError,
         r"unknown layer 'conv9'.*\['conv1', 'conv2', 'log_softmax', 'sigmoid'\]"),
        ({"bits": {"nope": 8}}, ValueError, "unknown layer 'nope' in bits"),
        ({"bits": 8, "layers": nn.Linear}, ValueError, "no layer of class Linear"),
        ({"bits": 0}, ValueError, r"1 <= bits <= 32"),
        ({"bits": 33}, ValueError, r"1 <= bits <= 32"),
        ({"bits": True}, TypeError, "must be an int"),
        ({"bits": 8.5}, TypeError, "must be an int"),
        ({"bits": None}, ValueError, "please give bits="),
        ({"bits": 8, "layers": 123}, TypeError, "layers entries must be a name or pattern"),
        ({"bits": 8, "decay": 0.9}, ValueError, "decay=0.9 keeps a running range"),
        ({"format": "e4m3", "scale": "tensor", "decay": "0.9"}, ValueError,
         "decay must be a number"),
        ({"bits": 8, "node_formats": [([0], 2)]}, TypeError, r"node_formats must be a dict"),
        ({"bits": 8, "node_formats": {"conv1": (torch.tensor([[0]]), 2)}}, ValueError, "1-D"),
        ({"bits": 8, "node_formats": {"conv1": (torch.zeros(2, device="meta", dtype=torch.long), 2)}},
         ValueError, "meta device"),
        ({"bits": {"conv1": 8}, "layers": "conv1"}, ValueError, "already names the layers"),
        ({"bits": 8, "rounding": "up"}, ValueError, "rounding='up'"),
        ({"bits": 8, "grad": "none"}, ValueError, "grad='none'"),
        ({"bits": 8, "layers": "conv1", "node_formats": {"conv2": ([0], 2)}}, ValueError,
         r"node_formats\['conv2'\] names 'conv2', which gets no quantization"),
        ({"bits": 8, "node_formats": {"conv1": ([0], 40)}}, ValueError,
         r"1 <= node_formats\['conv1'\] bits <= 32"),
        ({"bits": 8, "node_formats": {"conv1": ([-1], 2)}}, ValueError, "must be >= 0"),
        ({"bits": 8, "node_formats": {"conv1": [0, 1]}}, TypeError, r"must be a pair \(nodes, bits\)"),
        ({"bits": 8, "node_formats": {"conv1": (torch.rand(3), 2)}}, TypeError,
         "integer indices or a bool mask"),
    ],
)
def test_bad_arguments_raise_and_modify_nothing(kwargs, exc, match):
    """Each bad argument is named; the model is untouched, also with inplace=True."""
    model = GCN()
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(exc, match=match):
        fxquant.transform(model, inplace=True, **kwargs)
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_non_float_output_fails_at_first_forward_naming_the_point(graph):
    """transform has no inputs, so the op itself names the point whose input is not float."""

    class Argmax(nn.Module):
        def forward(self, x):
            return x.argmax(dim=-1)

    gm = fxquant.transform(Argmax(), bits=8, layers="argmax")
    with pytest.raises(TypeError, match=r"quantization point \"output of 'argmax'\" has dtype "
                                        r"torch\.int64"):
        gm(graph.x)


# -- row overrides ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["int64", "int32", "int16", "mask"])
def test_node_bits_override_rows(kind, graph):
    """Listed nodes keep the override bits, the other rows the layer's bits; any integer
    dtype of node ids is accepted (stored as int64) and a bool mask too."""
    rows = torch.tensor([0, 3])
    spec = (torch.zeros(graph.num_nodes, dtype=torch.bool).index_fill(0, rows, True)
            if kind == "mask" else rows.to(getattr(torch, kind)))
    model = GCN()
    gm = fxquant.transform(model, bits={"conv1": 16, "sigmoid": 16, "conv2": 16},
                           node_formats={"sigmoid": (spec, 2)})
    buffer = dict(gm.named_buffers())["sigmoid_quant.override.nodes"]
    expected = spec if kind == "mask" else rows
    assert torch.equal(buffer, expected) and buffer.dtype == expected.dtype
    assert "sigmoid_quant.override.nodes" in gm.state_dict()
    with torch.no_grad():
        h = torch.sigmoid(np_mask(model.conv1(graph.x, graph.edge_index), 16))
    out = {}
    interp = torch.fx.Interpreter(gm)
    orig = interp.run_node

    def run_node(n):
        result = orig(n)
        out[n.name] = result
        return result

    interp.run_node = run_node
    with torch.no_grad():
        interp.run(graph.x, graph.edge_index)
    got = out["sigmoid_quant"]
    assert torch.equal(got[rows], np_mask(h[rows], 2))
    others = torch.ones(graph.num_nodes, dtype=torch.bool).index_fill(0, rows, False)
    assert torch.equal(got[others], np_mask(h[others], 16))


def test_node_bits_rows_out_of_range_name_the_point(graph):
    """A node id past the tensor's rows fails before the op runs, naming the point and the
    valid range; a mask of the wrong length too."""
    gm = fxquant.transform(GCN(), bits=16, node_formats={"conv1": ([0, 99], 4)})
    with pytest.raises(IndexError, match=r"output of 'conv1' names node 99.*\[0, 6\)"):
        gm(graph.x, graph.edge_index)
    bad_mask = fxquant.transform(GCN(), bits=16, node_formats={"conv1": (torch.ones(3, dtype=torch.bool), 4)})
    with pytest.raises(ValueError, match=r"output of 'conv1'.*row mask has shape \(3,\)"):
        bad_mask(graph.x, graph.edge_index)


def test_top_degree_nodes():
    """Highest in-degree first by count, ties by index; at least one node."""
    ei = torch.tensor([[1, 2, 3, 0, 0, 4], [0, 0, 0, 1, 2, 2]])
    assert fxquant.top_degree_nodes(ei, 0.2).tolist() == [0]
    assert fxquant.top_degree_nodes(ei, 0.4).tolist() == [0, 2]
    assert fxquant.top_degree_nodes(ei, 0.01, num_nodes=10).tolist() == [0]
    with pytest.raises(ValueError, match="fraction"):
        fxquant.top_degree_nodes(ei, 1.5)
    with pytest.raises(ValueError, match=r"\[2, num_edges\]"):
        fxquant.top_degree_nodes(ei[0], 0.5)


# -- training -----------------------------------------------------------------------------


def _train(gm, data, steps=30, call=None):
    call = call or (lambda: gm(data.x, data.edge_index))
    opt = torch.optim.Adam(gm.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.nll_loss(call(), data.y)
        loss.backward()
        if not losses:
            grads = {n: p.grad for n, p in gm.named_parameters()}
        opt.step()
        losses.append(loss.item())
    return losses, grads


@pytest.mark.parametrize("cls", [GCN, DataGCN, MLPGCN])
def test_three_model_styles_train_with_every_layer_learning(cls):
    """Loss goes down and every parameter gets a non-zero gradient through the truncations."""
    data = tiny_graph(num_nodes=12)
    model = cls()
    layers = None if cls is not MLPGCN else ["lin", "relu", "conv"]
    gm = fxquant.transform(model, bits=10, layers=layers)
    assert point_nodes(gm)
    call = (lambda: gm(data)) if cls is DataGCN else None
    losses, grads = _train(gm, data, call=call)
    assert losses[-1] < losses[0]
    for name, g in grads.items():
        assert g is not None and g.abs().sum() > 0, name


@pytest.mark.parametrize("cls", [PygGCN, GraphSAGE, GAT])
def test_pyg_models_transform_and_train(cls):
    """PyG's own model classes train through truncations after each conv."""
    data = tiny_graph(num_nodes=12)
    model = cls(4, 8, num_layers=2, out_channels=2)
    gm = fxquant.transform(model, bits=12, rounding="stochastic")
    assert len(point_nodes(gm)) == 2
    losses, grads = _train(gm, data, call=lambda: gm(data.x, data.edge_index).log_softmax(-1))
    assert losses[-1] < losses[0]
    convs = [n for n, g in grads.items() if n.startswith("convs.")]
    assert convs and all(grads[n] is not None and grads[n].abs().sum() > 0 for n in convs)


def test_zero_grad_stops_learning_upstream():
    """grad='zero' is the true derivative: the first conv gets exactly zero gradient."""
    data = tiny_graph(num_nodes=12)
    with pytest.warns(UserWarning, match="FXQ007"):
        gm = fxquant.transform(GCN(), bits=16, layers="conv1", grad="zero")
    _, grads = _train(gm, data, steps=1)
    assert all(g.abs().sum() == 0 for n, g in grads.items() if n.startswith("conv1"))
    assert all(g.abs().sum() > 0 for n, g in grads.items() if n.startswith("conv2"))


# -- round trips and devices ---------------------------------------------------------------


def test_save_load_in_a_fresh_process(tmp_path, graph):
    """torch.save -> torch.load(weights_only=False) elsewhere: same outputs, summary works."""
    gm = fxquant.transform(GCN(), bits={"conv1": 12, "conv2": 10}, rounding="nearest",
                           node_formats={"conv2": ([1, 2], 4)})
    path, inputs, expected = tmp_path / "gm.pt", tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save(gm, path)
    torch.save((graph.x, graph.edge_index), inputs)
    script = textwrap.dedent(f"""
        import torch, fxquant
        gm = torch.load({str(path)!r}, weights_only=False)
        x, ei = torch.load({str(inputs)!r})
        torch.save(gm(x, ei), {str(expected)!r})
        print(fxquant.summary(gm))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert torch.equal(torch.load(expected), gm(graph.x, graph.edge_index))
    assert "conv1_quant" in done.stdout and "nearest" in done.stdout
    assert "2 nodes -> 4 bits" in done.stdout


def test_state_dict_loads_into_fresh_transform_with_weights_only(tmp_path, graph):
    """Parameters and row buffers round-trip through a weights-only checkpoint."""
    kwargs = {"bits": 12, "node_formats": {"conv1": (torch.tensor([0, 5]), 3)}}
    gm = fxquant.transform(GCN(), **kwargs)
    torch.save(gm.state_dict(), tmp_path / "sd.pt")
    fresh = fxquant.transform(GCN(), **kwargs)
    fresh.load_state_dict(torch.load(tmp_path / "sd.pt", weights_only=True))
    assert torch.equal(fresh(graph.x, graph.edge_index), gm(graph.x, graph.edge_index))


def test_deepcopy_and_double(graph):
    """deepcopy gives an equal independent model; .double() truncates the 64-bit pattern:
    bits=16 of float64 keeps 4 mantissa bits (float32's top 16 keep 7)."""
    model = GCN()
    gm = fxquant.transform(model, bits=16, layers="conv1")
    clone = copy.deepcopy(gm)
    assert torch.equal(clone(graph.x, graph.edge_index), gm(graph.x, graph.edge_index))
    d = copy.deepcopy(gm).double()
    x = graph.x.double()
    with torch.no_grad():
        raw = model.double().conv1(x, graph.edge_index)
        mask = -(1 << 48)  # the top 16 of 64 bits
        h = (raw.view(torch.int64) & mask).view(torch.float64)
        expected = F.log_softmax(model.conv2(torch.sigmoid(h), graph.edge_index), dim=1)
        out = d(x, graph.edge_index)
    assert out.dtype == torch.float64 and torch.equal(out, expected)


def test_meta_device_forward():
    """gm.to('meta') runs: no constant of the pass is pinned to the CPU (row buffer included)."""
    model = GCN(add_self_loops=False, normalize=False)
    gm = fxquant.transform(model, bits=10, rounding="stochastic",
                           node_formats={"conv1": ([0, 1], 3)}).to("meta")
    assert gm.conv1_quant.override.nodes.device.type == "meta"
    x = torch.randn(6, 4, device="meta")
    ei = torch.randint(0, 6, (2, 10), device="meta")
    out = gm(x, ei)
    assert out.device.type == "meta" and out.shape == (6, 2)


def test_summary_table():
    """The summary lists point, layer, site, bits, rounding, grad and the override."""
    gm = fxquant.transform(GCN(), bits=16, node_formats={"conv2": (torch.tensor([1, 2, 3]), 2)})
    text = fxquant.summary(gm)
    assert text.splitlines()[0].split()[:3] == ["point", "layer", "site"]
    assert "conv1_quant" in text and "conv2_quant" in text
    assert "3 nodes -> 2 bits" in text and "toward_zero" in text
    assert fxquant.summary(fxquant.trace(GCN())) == "no fxquant quantization points in this model"
    with pytest.raises(TypeError, match=r"expects the GraphModule fxquant\.transform returns"):
        fxquant.summary(nn.Linear(2, 2))


def test_transform_of_a_graph_module_and_message_passing_default():
    """A GraphModule is transformed directly; the default selects MessagePassing layers."""
    gm = fxquant.trace(GCN())
    out = fxquant.transform(gm, bits=8)
    assert not point_nodes(gm) and len(point_nodes(out)) == 2
    assert all(isinstance(out.get_submodule(layer), MessagePassing) for layer, _ in point_layers(out))
    with pytest.raises(ValueError, match="selects no layer"):
        fxquant.transform(nn.Sequential(nn.Linear(2, 2)), bits=8)


@pytest.mark.slow
def test_torch_compile_fullgraph_of_transformed_gcn(graph):
    """torch.compile(gm, fullgraph=True) runs the transformed GCN and agrees with eager."""
    gm = fxquant.transform(GCN(), bits=12, rounding="nearest").eval()
    compiled = torch.compile(gm, fullgraph=True)
    with torch.no_grad():
        assert torch.allclose(compiled(graph.x, graph.edge_index), gm(graph.x, graph.edge_index),
                              atol=1e-6)


def test_transform_leaves_the_global_rng_alone():
    """transform (its lint probes included) consumes no global random numbers, also for a
    model whose in-place ReLU after BatchNorm makes the lint probe what BatchNorm saves."""

    class BNRelu(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.bn = nn.Linear(4, 4), nn.BatchNorm1d(4)

        def forward(self, x):
            return F.relu_(self.bn(self.lin(x)))

    model = BNRelu()
    state = torch.get_rng_state()
    with pytest.warns(UserWarning, match="FXQ011"):  # the probe cannot size BatchNorm's input
        fxquant.transform(model, bits=10, layers="lin")
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["index", "mask"])
def test_node_overrides_compile_with_fullgraph(kind, graph):
    """Index and mask node overrides compile without graph breaks and agree with eager."""
    nodes = torch.tensor([1, 5])
    if kind == "mask":
        nodes = torch.zeros(graph.num_nodes, dtype=torch.bool).index_fill(0, nodes, True)
    gm = fxquant.transform(GCN(), bits=12, rounding="nearest", node_formats={"conv1": (nodes, 9)})
    compiled = torch.compile(gm, fullgraph=True)
    with torch.no_grad():  # log_softmax fused by inductor differs in the last ulp
        assert torch.allclose(compiled(graph.x, graph.edge_index), gm(graph.x, graph.edge_index),
                              atol=1e-6)


def test_a_lazy_layer_is_named_with_the_way_out():
    """GCNConv(-1, 4) before its first forward: torch's "Attempted to use an uninitialized
    parameter" came from inside the copy; now an FxquantError names the parameter."""
    from torch_geometric.nn import GCNConv

    class Lazy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GCNConv(-1, 4)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    model = Lazy()
    x, edge_index = torch.randn(5, 3), torch.tensor([[0, 1, 2], [1, 2, 3]])
    with pytest.raises(fxquant.FxquantError, match=r"'conv\.lin\.weight' is not initialized.*"
                                                   r"run the model once"):
        fxquant.transform(model, bits=8)
    model(x, edge_index)
    assert fxquant.transform(model, bits=8)(x, edge_index).shape == (5, 4)


def test_input_site_of_a_layer_called_by_keyword():
    """``self.conv(x=x, edge_index=edge_index)``: the input site was refused ("the layer's
    first argument is not a tensor of the graph"); it rounds the keyword argument as it
    rounds a positional one."""
    from torch_geometric.nn import GCNConv

    class Positional(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GCNConv(8, 4)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    class ByKeyword(Positional):
        def forward(self, x, edge_index):
            return self.conv(x=x, edge_index=edge_index)

    torch.manual_seed(0)
    plain, named = Positional(), ByKeyword()
    named.load_state_dict(plain.state_dict())
    x, edge_index = torch.randn(10, 8), torch.randint(0, 10, (2, 30))
    mapping = fxquant.QuantMapping().set_global(fxquant.QuantConfig(4), site="input")
    expected = fxquant.transform(plain, mapping)(x, edge_index)
    got = fxquant.transform(named, mapping)(x, edge_index)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert not torch.allclose(got, named(x, edge_index))  # (it does round)


def test_node_settings_at_a_site_the_layer_does_not_round_name_the_site():
    """set_nodes without site= on a layer that rounds its messages: the error said the
    layer 'gets no quantization' and listed it among the quantized layers."""
    mapping = fxquant.QuantMapping().set_global(fxquant.QuantConfig("int4", scale="tensor"),
                                                site="message")
    mapping.set_nodes("conv1", torch.arange(3), "int8")
    with pytest.raises(ValueError, match=r"output site of 'conv1', which rounds only its "
                                         r"message site\(s\); please pass site='message'"):
        fxquant.transform(GCN(), mapping)


def test_an_unknown_layer_suggests_the_closest_of_the_models_own():
    """The error names the model's own layers closest to the name given (GCN's are
    'convs.0', 'convs.1'), not a fixed example."""
    model = PygGCN(4, 8, num_layers=2, out_channels=2)
    for call in (lambda: fxquant.transform(model, bits=8, layers="conv1", lint="off"),
                 lambda: fxquant.transform(model, fxquant.QuantMapping().set_name(
                     "conv1", fxquant.QuantConfig("int8", scale="tensor")), lint="off")):
        with pytest.raises(fxquant.FxquantError, match=r"Did you mean 'convs\.1' or 'convs\.0'\?"):
            call()


def test_summary_shows_per_node_widths_and_formats_as_written():
    """A point with per-node widths shows their range (the fixed table's, or the learned
    ones' allowed range), not its format's 8 bits; formats read as they are written."""
    model = PygGCN(4, 8, num_layers=2, out_channels=2)
    fixed = fxquant.QuantConfig("int8", scale="tensor",
                                node_bits=fxquant.NodeBits(torch.tensor([3.0, 3, 4, 5, 3])))
    assert "3..5/node" in fxquant.summary(fxquant.transform(model, fixed, lint="off"))
    learned = fxquant.QuantConfig("int8", scale="tensor", range="lsq",
                                  node_bits=fxquant.NodeBits.learned_init(5, 4.0))
    assert "2..8/node" in fxquant.summary(fxquant.transform(model, learned, lint="off"))
    assert "top12 " in fxquant.summary(fxquant.transform(model, bits=12, lint="off"))
