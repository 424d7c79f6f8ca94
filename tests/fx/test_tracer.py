"""fxquant.trace: GNN layers stay leaves; PyG models trace; untraceable code is named."""

from __future__ import annotations

import pytest
import torch
import torch.fx
from torch import nn
from torch_geometric.nn import GCNConv
from torch_geometric.nn.models import GAT, GraphSAGE
from torch_geometric.nn.models import GCN as PygGCN

import fxquant
from fxquant.fx.tracer import GNNTracer
from tests.support.models import GCN, Block, DataGCN, WithBlock


def _modules(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_module"]


def test_plain_symbolic_trace_fails_but_ours_keeps_convs_as_leaves(graph):
    """torch.fx alone walks into GCNConv.propagate; fxquant.trace keeps it one node."""
    model = GCN()
    with pytest.raises(Exception):  # noqa: B017 - any failure inside PyG's propagate
        torch.fx.symbolic_trace(model)
    gm = fxquant.trace(model)
    assert _modules(gm) == ["conv1", "conv2"]
    assert torch.equal(gm(graph.x, graph.edge_index), model(graph.x, graph.edge_index))


def test_stack_traces_are_recorded():
    """Each node knows the user's source line it came from."""
    gm = fxquant.trace(GCN())
    conv1 = next(n for n in gm.graph.nodes if n.target == "conv1")
    assert "models.py" in conv1.meta["stack_trace"]
    assert "self.conv1(x, edge_index)" in conv1.meta["stack_trace"]


def test_forward_data_style(graph):
    """A model reading data.x and data.edge_index traces and matches eager."""
    model = DataGCN()
    gm = fxquant.trace(model)
    assert _modules(gm) == ["conv1", "conv2"]
    assert torch.equal(gm(graph), model(graph))


@pytest.mark.parametrize("cls", [PygGCN, GraphSAGE, GAT])
def test_pyg_models_trace_without_concrete_args(cls, graph):
    """PyG's BasicGNN models need their optional arguments fixed; trace does that itself."""
    model = cls(4, 8, num_layers=2, out_channels=2).eval()
    gm = fxquant.trace(model)
    convs = [m for m in _modules(gm) if m.startswith("convs.")]
    assert convs == ["convs.0", "convs.1"]
    assert torch.allclose(gm(graph.x, graph.edge_index), model(graph.x, graph.edge_index))


def test_basic_gnn_takes_its_optional_arguments_by_name_and_position(graph):
    """The traced GCN accepts edge_weight as the original does, with the same result; an
    argument the graph cannot honour raises instead of being ignored."""
    model = PygGCN(4, 8, num_layers=2, out_channels=2).eval()
    gm = fxquant.trace(model)
    w = torch.rand(graph.edge_index.shape[1])
    expected = model(graph.x, graph.edge_index, edge_weight=w)
    assert not torch.allclose(expected, model(graph.x, graph.edge_index))  # w matters
    assert torch.allclose(gm(graph.x, graph.edge_index, edge_weight=w), expected)
    assert torch.allclose(gm(graph.x, graph.edge_index, w), expected)
    params = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    assert params == ["x", "edge_index", "edge_weight", "edge_attr", "batch", "batch_size",
                      "num_sampled_nodes_per_hop", "num_sampled_edges_per_hop"]
    with pytest.raises(TypeError, match=r"num_sampled_nodes_per_hop=None fixed.*\[1, 1\]"):
        gm(graph.x, graph.edge_index, num_sampled_nodes_per_hop=[1, 1])
    assert "_assert_is_none" not in gm.code


def test_save_load_then_trace_again_in_one_process(tmp_path, graph):
    """A reloaded traced zoo model keeps its guard, and later traces still work (the
    `_assert_is_none` guards torch.fx would insert break every trace after a reload)."""
    model = PygGCN(4, 8, num_layers=2, out_channels=2).eval()
    torch.save(fxquant.transform(model, bits=12), tmp_path / "gm.pt")
    loaded = torch.load(tmp_path / "gm.pt", weights_only=False)
    assert torch.equal(loaded(graph.x, graph.edge_index),
                       fxquant.transform(model, bits=12)(graph.x, graph.edge_index))
    with pytest.raises(TypeError, match="fixed"):
        loaded(graph.x, graph.edge_index, num_sampled_nodes_per_hop=[1, 1])
    fxquant.trace(GraphSAGE(4, 8, num_layers=2, out_channels=2))  # no KeyError
    fxquant.transform(PygGCN(4, 8, num_layers=2, out_channels=2), bits=10)


def test_explicit_concrete_args_and_leaf_modules(graph):
    """concrete_args is passed through; leaf_modules by class or name keep a module opaque
    that could not be traced otherwise."""
    model = PygGCN(4, 8, num_layers=2, out_channels=2).eval()
    gm = fxquant.trace(model, concrete_args={"edge_weight": None, "edge_attr": None,
                                             "batch": None, "batch_size": None,
                                             "num_sampled_nodes_per_hop": None,
                                             "num_sampled_edges_per_hop": None})
    assert torch.allclose(gm(graph.x, graph.edge_index), model(graph.x, graph.edge_index))
    blocky = WithBlock()
    with pytest.raises(fxquant.TraceError):
        fxquant.trace(blocky)
    for leaves in ([Block], ["block"]):
        gm = fxquant.trace(blocky, leaf_modules=leaves)
        assert _modules(gm) == ["block", "conv"]
        assert torch.equal(gm(graph.x, graph.edge_index), blocky(graph.x, graph.edge_index))


class _Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = GCNConv(4, 2)

    def forward(self, x, edge_index):
        # Control flow on a tensor value:
        if x.sum() > 0:
            x = -x
        return self.conv(x, edge_index)


def test_untraceable_model_names_the_source_line():
    """A branch in the top-level forward: the error names the line and says what helps
    there (torch.where, or a submodule kept as a leaf), not concrete_args."""
    where = r"test_tracer\.py:\d+ \('if x\.sum\(\) > 0:'\)"
    with pytest.raises(fxquant.TraceError, match=where) as e:
        fxquant.trace(_Branchy())
    assert "torch.where" in str(e.value) and "leaf_modules" in str(e.value)
    assert "concrete_args" not in str(e.value)


def test_untraceable_submodule_gets_a_leaf_hint_with_its_name():
    """A branch inside a submodule: the hint names that submodule for leaf_modules."""
    with pytest.raises(fxquant.TraceError, match=r"leaf_modules=\['block'\]"):
        fxquant.trace(WithBlock())


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"leaf_modules": [5]}, TypeError, "leaf_modules entries must be module classes"),
        ({"leaf_modules": nn.Linear}, TypeError, "leaf_modules must be a list"),
        ({"concrete_args": 5}, TypeError, "concrete_args must be a dict"),
        ({"concrete_args": {"nope": None}}, ValueError, r"concrete_args names \['nope'\]"),
    ],
)
def test_bad_arguments(kwargs, exc, match):
    """Non-modules and bad leaf specs / concrete_args are rejected with the argument named
    (not wrapped in a TraceError)."""
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        fxquant.trace(lambda x: x)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="leaf_modules"):
        GNNTracer(leaf_modules=[3])  # type: ignore[list-item]
    with pytest.raises(exc, match=match):
        fxquant.trace(GCN(), **kwargs)


class _KipfGCN(nn.Module):
    """PyG's examples/gcn.py: functional dropout reading self.training."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = GCNConv(4, 8), GCNConv(8, 2)

    def forward(self, x, edge_index, edge_weight=None):
        x = torch.nn.functional.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, edge_index, edge_weight).relu()
        x = torch.nn.functional.dropout(x, p=0.3, training=self.training)
        return self.conv2(x, edge_index, edge_weight)


@pytest.mark.parametrize("start_in_eval", [False, True])
def test_functional_dropout_follows_train_and_eval(start_in_eval, graph):
    """F.dropout(training=self.training) becomes nn.Dropout, so gm.eval() turns it off."""
    model = _KipfGCN()
    if start_in_eval:
        model.eval()
    modes = [m.training for m in model.modules()]
    gm = fxquant.trace(model)
    assert [m.training for m in model.modules()] == modes
    assert gm.training == (not start_in_eval) and gm.dropout.training == gm.training
    assert [(m.p, type(m)) for m in (gm.dropout, gm.dropout_1)] == [(0.5, nn.Dropout), (0.3, nn.Dropout)]
    gm.eval()
    model.eval()
    assert torch.equal(gm(graph.x, graph.edge_index), model(graph.x, graph.edge_index))
    gm.train()
    a, b = gm(graph.x, graph.edge_index), gm(graph.x, graph.edge_index)
    assert not torch.equal(a, b)


class _AlwaysDropout(nn.Module):
    def forward(self, x):
        return torch.nn.functional.dropout(x, p=0.5, training=True)


class _ModeBranch(nn.Module):
    def forward(self, x):
        if self.training:
            x = x * 2
        return x


def test_constant_training_flag_is_kept_and_mode_branches_warn():
    """training=True written by hand stays a function; `if self.training:` warns."""
    gm = fxquant.trace(_AlwaysDropout())
    assert [n.op for n in gm.graph.nodes] == ["placeholder", "call_function", "output"]
    with pytest.warns(UserWarning, match="different paths in train and eval mode"):
        fxquant.trace(_ModeBranch())
