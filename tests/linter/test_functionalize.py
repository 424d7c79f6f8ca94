"""fxquant.functionalize_inplace: no in-place op left, verified against the original, or a
FunctionalizeError naming the line.

Each pattern is checked here independently of the tool's own verification: outputs against
the original's forward (with autograd off, where any write is legal), and gradients against
the original's where its backward runs, else a dot-product test with forward-mode AD.
"""

from __future__ import annotations

import pickle
import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwad
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GCNConv, MessagePassing

import fxquant
from fxquant.linter import FunctionalizeError, Rewrite
from fxquant.linter.functionalize import HOW_KEY, REWRITES_KEY
from tests.support.lint_models import LegalInplace, SymbolicTraps
from tests.support.models import GCN, SeedGCN, tiny_graph


def inplace_nodes(gm):
    """Nodes that write in place, by schema (ATen) or by name/flag (symbolic)."""
    found = []
    for n in gm.graph.nodes:
        schema = getattr(n.target, "_schema", None)
        by_schema = schema is not None and any(
            a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        by_name = n.op == "call_method" and str(n.target).endswith("_")
        by_flag = n.kwargs.get("inplace") is True or "out" in n.kwargs
        by_module = n.op == "call_module" and getattr(gm.get_submodule(str(n.target)), "inplace", False)
        by_setitem = n.target is __import__("operator").setitem
        if by_schema or by_name or by_flag or by_module or by_setitem:
            found.append(n)
    return found


def weights_for(out):
    g = torch.Generator().manual_seed(3)
    outs = out if isinstance(out, tuple) else (out,)
    return [torch.randn(t.shape, generator=g) for t in outs]


def loss_of(out, weights):
    outs = out if isinstance(out, tuple) else (out,)
    return sum((t * w).sum() for t, w in zip(outs, weights, strict=True))


def assert_equivalent(make, inputs, *, crashes: bool):
    """functionalize_inplace(make()) computes the original's forward and gradients."""
    model = make()
    gm = fxquant.functionalize_inplace(model, *inputs)
    assert not inplace_nodes(gm) or gm.meta[HOW_KEY] == "captured"
    torch.manual_seed(0)
    with torch.no_grad():
        expected = make()(*inputs)
    torch.manual_seed(0)
    out = gm(*inputs)
    outs, exps = (out, expected) if isinstance(out, tuple) else ((out,), (expected,))
    for a, b in zip(outs, exps, strict=True):
        torch.testing.assert_close(a.detach(), b, rtol=1e-6, atol=1e-6)
    w = weights_for(out)
    loss_of(out, w).backward()
    grads = {n: p.grad for n, p in gm.named_parameters()}
    if not crashes:
        reference = make()
        torch.manual_seed(0)
        loss_of(reference(*inputs), w).backward()
        for n, p in reference.named_parameters():
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-5, atol=1e-6)
    else:  # <w, J v> by forward-mode AD of the original equals <J^T w, v>
        original = make()
        g = torch.Generator().manual_seed(5)
        v = {n: torch.randn(p.shape, generator=g) for n, p in original.named_parameters()}
        jvp = directional_derivative(original, inputs, v)
        lhs = sum(float((a * b).sum()) for a, b in zip(w, jvp, strict=True))
        rhs = sum(float((grads[n] * v[n]).sum()) for n in v if grads[n] is not None)
        assert lhs == pytest.approx(rhs, rel=1e-4, abs=1e-5)
        with warnings.catch_warnings(), pytest.raises(RuntimeError):
            warnings.simplefilter("ignore")
            loss_of(make()(*inputs), w).backward()  # the original really crashes
    return gm


def directional_derivative(original, inputs, v):
    """J v of the original: forward-mode AD, or central differences in float64 (out=)."""
    torch.manual_seed(0)
    try:
        with torch.no_grad(), fwad.dual_level():
            duals = {n: fwad.make_dual(p.detach(), v[n]) for n, p in original.named_parameters()}
            res = torch.func.functional_call(original, duals, inputs)
            res = res if isinstance(res, tuple) else (res,)
            return [fwad.unpack_dual(t).tangent for t in res]
    except NotImplementedError:
        wide = original.double()
        x = tuple(t.double() for t in inputs)
        params = {n: p.detach().clone() for n, p in wide.named_parameters()}
        eps = 1e-6

        def at(sign):
            with torch.no_grad():
                res = torch.func.functional_call(
                    wide, {n: p + sign * eps * v[n].double() for n, p in params.items()}, x)
            return res if isinstance(res, tuple) else (res,)

        return [(a - b).float() / (2 * eps) for a, b in zip(at(1), at(-1), strict=True)]


class Lin(nn.Module):
    """A Linear, then ``body(self, h)``: one pattern per test."""

    def __init__(self, body, width=6):
        super().__init__()
        self.lin = nn.Linear(4, width)
        self.body = body

    def forward(self, x):
        return self.body(self, self.lin(x))


def slice_write_read_through_base(self, h):
    y = h.sigmoid()
    v = y[:, 1:3]
    v.mul_(2)  # sigmoid saved y
    return y * 3


def view_then_add(self, h):
    y = h.exp()
    y.view(-1).add_(1)
    return y


def split_clamp_then_both(self, h):
    y = h.tanh()
    u, v = y.split(3, dim=1)
    v.clamp_(-0.5, 0.5)  # forward raises: one of the views split returns
    return torch.cat([u, v], dim=1) + y


def transpose_add(self, h):
    y = h.sigmoid()
    y.t().add_(1)
    return y


def masked_fill_saved(self, h):
    y = h.exp()
    y.masked_fill_(y > 1.5, 0.0)
    return y


def index_put_saved(self, h):
    y = h.sigmoid()
    y.index_put_((torch.tensor([0, 2]),), torch.tensor(5.0))
    return y


def copy_into_slice(self, h):
    y = h.exp()
    y[:, :2].copy_(h[:, 4:] * 2)
    return y


def out_aliasing_input(self, h):
    y = h.exp()
    torch.mul(y, 2, out=y)
    return y


def functional_relu_inplace(self, h):
    y = h.sigmoid()
    F.relu(y - 0.5, inplace=True)
    return F.relu(y, inplace=True) * 2


def chained_methods(self, h):
    y = h.exp()
    y.mul_(2).add_(1)
    return y


def second_name(self, h):
    y = h.exp()
    a = y
    a += 1
    return y


def setitem_advanced(self, h):
    y = h.sigmoid()
    y[y > 0.6] = 0.0
    return y


def slice_imul(self, h):
    y = h.sigmoid()
    y[:, 0:2] *= 3
    return y


def reshape_copy_is_no_view(self, h):
    y = h.exp()
    r = y.t().reshape(-1)  # a copy: writing into it leaves y alone
    r.add_(1)
    return y + r.sum()


def legal_relu_after_linear(self, h):
    h = F.relu(h, inplace=True)  # relu saves its output; nothing else saved h
    return h * 2


def legal_half_precision_add(self, h):
    y = h.half()
    y += torch.ones_like(h)  # float32 into float16, in place: stays float16
    return y.float() * 2


CRASHING = [slice_write_read_through_base, view_then_add, split_clamp_then_both,
            transpose_add, masked_fill_saved, index_put_saved, copy_into_slice,
            out_aliasing_input, functional_relu_inplace, chained_methods, second_name,
            setitem_advanced, slice_imul]
LEGAL = [reshape_copy_is_no_view, legal_relu_after_linear, legal_half_precision_add]


@pytest.mark.parametrize("body", CRASHING, ids=lambda f: f.__name__)
def test_crashing_patterns_are_fixed_and_verified(body):
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    gm = assert_equivalent(lambda: _seeded(Lin(body)), (x,), crashes=True)
    assert gm.meta[REWRITES_KEY], "a fixed bug must list its rewrites"
    line = body.__code__.co_firstlineno
    for rewrite in gm.meta[REWRITES_KEY]:
        assert isinstance(rewrite, Rewrite) and rewrite.location is not None
        assert rewrite.location.path == __file__ and rewrite.location.line > line


@pytest.mark.parametrize("body", LEGAL, ids=lambda f: f.__name__)
def test_legal_patterns_stay_equivalent(body):
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(2))
    assert_equivalent(lambda: _seeded(Lin(body)), (x,), crashes=False)


def _seeded(model):
    torch.manual_seed(0)
    for p in model.parameters():
        nn.init.normal_(p, std=0.5)
    return model


def test_rewrites_list_is_exact():
    """Each in-place write: its line, what it was, what it became."""
    x = torch.randn(5, 4)
    gm = fxquant.functionalize_inplace(_seeded(Lin(slice_write_read_through_base)), x)
    (rewrite,) = gm.meta[REWRITES_KEY]
    line = slice_write_read_through_base.__code__.co_firstlineno + 3
    assert rewrite.location.line == line
    assert (rewrite.before, rewrite.after.split(";")[0]) == (".mul_(...)", ".mul(...)")
    assert "written back" in rewrite.after
    assert str(rewrite).startswith(f"{rewrite.location}: `v.mul_(2)")


def test_symbolic_rewrite_keeps_the_module_structure():
    """add_ -> add and inplace=True -> False in the FX graph; modules stay modules."""
    model = SymbolicTraps()
    x = torch.randn(4, 3)
    gm = fxquant.functionalize_inplace(model, x)
    assert gm.meta[HOW_KEY] == "symbolic"
    assert [(r.before, r.after) for r in gm.meta[REWRITES_KEY]] == [
        (".add_(...)", ".add(...)"), ("relu(..., inplace=True)", "inplace=False")]
    assert not inplace_nodes(gm)
    assert any(n.op == "call_module" for n in gm.graph.nodes)
    assert torch.equal(gm(x), model(x))
    gm(x).sum().backward()
    assert model.lin.weight.grad is None  # the result owns a copy


def test_module_flags_and_later_uses():
    """nn.ReLU(inplace=True) and torch.relu_ are rewritten; later uses read the new value."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            h = self.lin(x)
            self.act(h)
            y = torch.sigmoid(self.lin(x))
            torch.relu_(y)
            return h + y

    model = Net()
    x = torch.randn(5, 3)
    gm = fxquant.functionalize_inplace(model, x)
    assert not inplace_nodes(gm)
    assert torch.equal(gm(x), model(x))
    assert model.act.inplace  # the input model is untouched


def test_untraceable_forward_is_captured():
    """Python loops over a size: captured (ATen graph) and verified; seed code too."""
    data = tiny_graph()
    model = SeedGCN()
    gm = fxquant.functionalize_inplace(model, data)
    assert gm.meta[HOW_KEY] == "captured"
    assert not torch.is_anomaly_enabled()
    assert not inplace_nodes(gm)
    expected = model(data)
    torch.autograd.set_detect_anomaly(False)  # the seed's forward switches it on
    assert torch.equal(gm(data), expected)
    assert any("mul_" in r.before for r in gm.meta[REWRITES_KEY])


def test_gnn_with_inplace_activation_between_layers(graph):
    """A PyG model (MessagePassing leaves) with relu_ on a saved output and +=: fixed."""

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = GCNConv(4, 8), GCNConv(8, 8)

        def forward(self, x, edge_index):
            h = self.conv1(x, edge_index).sigmoid()
            h.relu_()
            h += self.conv2(h, edge_index)
            return h

    gm = assert_equivalent(lambda: _seeded(Residual()), (graph.x, graph.edge_index),
                           crashes=True)
    assert gm.meta[HOW_KEY] == "symbolic"
    assert {n.target for n in gm.graph.nodes if n.op == "call_module"} == {"conv1", "conv2"}


def test_buffers_keep_their_updates():
    """BatchNorm's running statistics and a queue written in forward still update."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.bn = nn.Linear(4, 4), nn.BatchNorm1d(4)
            self.register_buffer("last", torch.zeros(4))

        def forward(self, x):
            h = self.bn(self.lin(x))
            self.last.copy_(h.detach().mean(0))
            return F.relu(h, inplace=True)

    model = Net()
    x = torch.randn(6, 4)
    gm = fxquant.functionalize_inplace(model, x)
    gm(x)
    model(x)
    torch.testing.assert_close(gm.bn.running_mean, model.bn.running_mean)
    torch.testing.assert_close(gm.last, model.last)
    assert [r.after for r in gm.meta["fxquant_kept"]] == ["kept (writes module state)"]


def test_leaf_write_is_refused_naming_the_line():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            self.w.mul_(2)
            return x * self.w

    line = Net.forward.__code__.co_firstlineno + 1
    model = Net()
    with pytest.raises(FunctionalizeError, match=rf"test_functionalize.py:{line}.*leaf"):
        fxquant.functionalize_inplace(model, torch.randn(3))
    assert torch.equal(model.w, torch.ones(3))


def test_hidden_write_is_refused_naming_the_line():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            y = self.lin(x).tanh()
            y.data.add_(1)
            return y * 2

    line = Net.forward.__code__.co_firstlineno + 2
    with pytest.raises(FunctionalizeError, match=rf"test_functionalize.py:{line}.*`.data`"):
        fxquant.functionalize_inplace(Net(), torch.randn(2, 3))


def test_a_rewrite_that_differs_is_never_returned(monkeypatch):
    """Break the rewriter (drop every write-back): verification catches it, the captured
    forward is used instead; break that too: FunctionalizeError, not a wrong model."""
    import fxquant.linter.functionalize.capture as capturing
    import fxquant.linter.functionalize.rewrite as rewriting

    x = torch.randn(5, 4)
    make = lambda: _seeded(Lin(slice_write_read_through_base))  # noqa: E731
    monkeypatch.setattr(rewriting, "scatter_view", lambda base, index, value: base)
    gm = fxquant.functionalize_inplace(make(), x)
    assert gm.meta[HOW_KEY] == "captured"
    monkeypatch.setattr(capturing, "copy_functional", lambda self, src: self)
    monkeypatch.setattr(torch.func, "functionalize", lambda f, remove: f)
    with pytest.raises(FunctionalizeError, match="does not match the original"):
        fxquant.functionalize_inplace(make(), x)


def test_outputs_that_lose_requires_grad_are_caught(monkeypatch):
    import fxquant.linter.functionalize.inplace as steps
    import fxquant.linter.functionalize.rewrite as rewriting

    x = torch.randn(5, 4)
    real = rewriting.keep_dtype
    monkeypatch.setattr(rewriting, "keep_dtype", lambda new, old: real(new, old).detach())
    monkeypatch.setattr(steps, "capture", lambda *a: (_ for _ in ()).throw(RuntimeError("off")))
    with pytest.raises(FunctionalizeError, match="requires_grad"):
        fxquant.functionalize_inplace(_seeded(Lin(masked_fill_saved)), x)


def test_legal_model_that_cannot_be_rewritten_comes_back_untouched():
    """Data-dependent Python: neither traced nor captured; nothing in it breaks backward, so
    a copy of the model comes back as it is (its counter buffer included), with a note."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.register_buffer("n", torch.zeros(()))

        def forward(self, x):
            self.n += 1
            h = self.lin(x)
            if h.sum() > 0:
                h = h.relu()
            return h

    model = Net()
    with pytest.warns(UserWarning, match="nothing needed rewriting"):
        same = fxquant.functionalize_inplace(model, torch.randn(2, 3))
    assert type(same) is Net and same is not model
    assert same.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(same.state_dict().values(),
                                                 model.state_dict().values(), strict=True))
    Net().load_state_dict(same.state_dict())


def test_clean_model_passes_through(graph):
    """A GCN without in-place ops: nothing to rewrite, same outputs."""
    model = GCN()
    gm = fxquant.functionalize_inplace(model, graph.x, graph.edge_index)
    assert gm.meta[REWRITES_KEY] == []
    assert torch.equal(gm(graph.x, graph.edge_index), model(graph.x, graph.edge_index))


def test_inputs_are_required():
    with pytest.raises(TypeError, match="example inputs"):
        fxquant.functionalize_inplace(GCN())


def test_legal_setitem_model(graph):
    model = LegalInplace()
    gm = fxquant.functionalize_inplace(model, graph.x, graph.edge_index)
    assert not inplace_nodes(gm)
    assert torch.equal(gm(graph.x, graph.edge_index), model(graph.x, graph.edge_index))


def test_rewrite_survives_pickling_and_saving(tmp_path):
    """A rewrite that writes back through a view: torch.save/load re-traces the graph,
    and the write-back must still be in it."""
    x = torch.randn(5, 4)
    model = _seeded(Lin(slice_write_read_through_base))
    gm = fxquant.functionalize_inplace(model, x)
    torch.save(gm, tmp_path / "gm.pt")
    loaded = torch.load(tmp_path / "gm.pt", weights_only=False)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x) if False else gm(x))
        expected = _seeded(Lin(slice_write_read_through_base))
        torch.testing.assert_close(loaded(x), expected(x))


def test_random_draws_are_not_frozen_and_state_is_not_dropped():
    class Noisy(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            y = self.lin(x).exp()
            y += torch.randn(4)  # a new draw each call
            return y

    x = torch.randn(3, 4)
    gm = fxquant.functionalize_inplace(Noisy(), x)
    torch.manual_seed(1)
    a = gm(x)
    torch.manual_seed(2)
    assert not torch.equal(a, gm(x))

    class Memory(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            y = self.lin(x).sigmoid()
            y.mul_(2)
            return y

    with pytest.raises(FunctionalizeError, match="changes `calls`"):
        fxquant.functionalize_inplace(Memory(), x)


def test_captured_forward_refuses_the_other_mode():
    data = tiny_graph()
    gm = fxquant.functionalize_inplace(SeedGCN().train(), data)
    assert gm.meta[HOW_KEY] == "captured"
    torch.autograd.set_detect_anomaly(False)
    with pytest.raises(RuntimeError, match="captured in train mode"):
        gm.eval()(data)
    torch.autograd.set_detect_anomaly(False)


class _Branchy(nn.Module):
    """Not traceable symbolically (a branch on a size): captured from one example."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x, scale):
        y = self.lin(x).sigmoid()
        if x.shape[0] > 5:
            y = y * 3
        y.mul_(scale)
        return y


def test_captured_forward_refuses_arguments_unlike_its_example():
    """A captured forward holds its example's shapes, branches and non-tensor arguments:
    other sizes took the example's branch, and another scale ran with the example's, both
    silently. It raises naming the argument; the example's kind of input runs."""
    torch.manual_seed(0)
    model, x = _Branchy(), torch.randn(4, 3)
    gm = fxquant.functionalize_inplace(model, x, 2.0)
    assert gm.meta[HOW_KEY] == "captured"
    other = torch.randn(4, 3)
    torch.testing.assert_close(gm(other, 2.0), model(other, 2.0))
    torch.testing.assert_close(gm(other, 2), model(other, 2.0))  # (an equal number)
    with pytest.raises(RuntimeError, match=r"argument 1 was 2\.0, got 5\.0"):
        gm(other, 5.0)
    assert torch.fx.symbolic_trace(gm).graph  # (tracing it sees proxies: nothing to check)
    with pytest.raises(RuntimeError, match=r"argument 0 had shape \[4, 3\] \(torch\.float32\), "
                                           r"got \[8, 3\]"):
        gm(torch.randn(8, 3), 2.0)
    data = tiny_graph()
    seed = fxquant.functionalize_inplace(SeedGCN().train(), data)
    smaller = data.subgraph(torch.arange(data.num_nodes - 1))
    with pytest.raises(RuntimeError, match="argument 0's x had shape"):
        seed(smaller)


class _Optional(_Branchy):
    def forward(self, x, scale=1.5, bias=None):
        y = super().forward(x, scale)
        return y if bias is None else y + bias


def test_captured_forward_names_arguments_its_example_did_not_pass():
    """An optional argument left out of the example: calling with it failed with Python's
    "takes 2 positional arguments but 3 were given"; now it raises naming the argument, and
    passing the default it ran with still runs."""
    torch.manual_seed(0)
    model, x = _Optional(), torch.randn(4, 3)
    gm = fxquant.functionalize_inplace(model, x)
    assert gm.meta[HOW_KEY] == "captured"
    torch.testing.assert_close(gm(x), model(x))
    torch.testing.assert_close(gm(x, 1.5, None), model(x))  # (the defaults it ran with)
    torch.testing.assert_close(gm(x, bias=None), model(x))
    for call in (lambda: gm(x, 2.0), lambda: gm(x, scale=2.0), lambda: gm(x, 1.5, x)):
        with pytest.raises(RuntimeError, match=r"example of 1 positional argument\(s\) \(x\)"
                                               r".* got (scale|bias) besides"):
            call()
    with pytest.raises(RuntimeError, match=r"got argument 3 besides"):
        gm(x, 1.5, None, 7)
    assert torch.fx.symbolic_trace(gm).graph  # (proxies for the extra arguments too)
    restored = pickle.loads(pickle.dumps(gm))
    torch.testing.assert_close(restored(x), model(x))
    with pytest.raises(RuntimeError, match="got scale besides"):
        restored(x, 2.0)


class _AugmentedSum(nn.Module):
    """``h += f(h) + 1``, an alias of the old ``h`` kept (``feats``), in a loop: the rewrite
    marked the line's first ``+`` (the right side's) as the write and did not verify. (The
    writes reach ``feats[0]``, the same tensor: its out-of-place twin returns ``h`` twice.)"""

    def __init__(self, out_of_place=False):
        super().__init__()
        self.l1, self.l2, self.out_of_place = nn.Linear(4, 4), nn.Linear(4, 4), out_of_place

    def forward(self, x):
        h = torch.tanh(self.l1(x))
        feats = [h]
        for _ in range(2):
            if self.out_of_place:
                h = h + (self.l2(h) + 1)
            else:
                h += self.l2(h) + 1
        return torch.cat([h, h] if self.out_of_place else [*feats, h], 1)


def test_augmented_assignment_with_an_operator_on_its_right_side():
    torch.manual_seed(0)
    model = _AugmentedSum()
    reference = _AugmentedSum(out_of_place=True)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(5, 4)
    gm = fxquant.functionalize_inplace(model, x)
    assert gm.meta[HOW_KEY] == "symbolic"
    assert [r.before for r in gm.meta["fxquant_rewrites"]] == ["`x += y` (in place)"] * 2
    gm(x).sum().backward()
    reference(x).sum().backward()
    for (name, p), q in zip(gm.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_works_under_no_grad_and_in_bfloat16():
    x = torch.randn(5, 4)
    with torch.no_grad():
        gm = fxquant.functionalize_inplace(_seeded(Lin(chained_methods)), x)
    assert gm.meta[HOW_KEY] == "symbolic"
    model = _seeded(Lin(split_clamp_then_both)).to(torch.bfloat16)
    gm = fxquant.functionalize_inplace(model, x.to(torch.bfloat16))
    assert gm.meta[HOW_KEY] == "symbolic"


def test_a_compiled_module_is_refused_with_the_way_out():
    """functionalize_inplace (and transform) on a torch.compile wrapper failed with "missing
    the required forward"; the error names _orig_mod."""
    compiled = torch.compile(Lin(chained_methods))
    for run in (fxquant.functionalize_inplace, fxquant.transform):
        with pytest.raises(TypeError, match=r"fxquant\.(functionalize_inplace|transform) takes "
                                            r"the module itself.*model\._orig_mod"):
            run(compiled, torch.randn(5, 4))


class _EdgeScale(MessagePassing):
    """An in-place write in ``message()`` (sigmoid saved ``edge_attr``): captured."""

    def __init__(self):
        super().__init__(aggr="add")
        self.lin, self.elin = nn.Linear(4, 4), nn.Linear(2, 4)

    def forward(self, x, edge_index, edge_attr):
        e = torch.sigmoid(self.elin(edge_attr))
        return self.propagate(edge_index, x=self.lin(x), edge_attr=e)

    def message(self, x_j, edge_attr):
        edge_attr.mul_(2)
        return x_j * edge_attr


class _EdgeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.gcn = _EdgeScale(), GCNConv(4, 4)

    def forward(self, x, edge_index, edge_attr):
        return self.gcn(self.conv(x, edge_index, edge_attr), edge_index)


def test_captured_rewrites_list_the_users_writes_not_pygs():
    """gcn_norm's and the aggregation's own in-place ops were listed as rewrites."""
    torch.manual_seed(0)
    x, ei, ea = torch.randn(6, 4), torch.randint(0, 6, (2, 12)), torch.randn(12, 2)
    gm = fxquant.functionalize_inplace(_EdgeNet(), x, ei, ea)
    assert gm.meta[HOW_KEY] == "captured"
    (rewrite,) = gm.meta[REWRITES_KEY]
    assert rewrite.before == "`mul_` (in place)"
    assert rewrite.location.code == "edge_attr.mul_(2)"


class _InplaceModules(nn.Module):
    """In-place writes asked of torch (``inplace=True``), in a forward that branches on a
    size: captured. torch makes those writes, on the user's request."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.act = nn.Hardtanh(inplace=True)

    def forward(self, x):
        y = self.lin(x).sigmoid()
        if x.shape[0] > 5:
            y = y * 3
        return F.relu(self.act(y), inplace=True)


def test_captured_rewrites_keep_the_in_place_writes_the_user_asked_for():
    gm = fxquant.functionalize_inplace(_InplaceModules(), torch.randn(4, 3))
    assert gm.meta[HOW_KEY] == "captured"
    written = [r.location.code for r in gm.meta[REWRITES_KEY]]
    assert "return F.relu(self.act(y), inplace=True)" in written
    assert all("inplace=True" in code for code in written), written


def test_models_saved_before_the_steps_had_modules_of_their_own_still_load():
    """A pickled GraphModule imports what its graph calls from the module that defined it
    when it was saved, ``fxquant.linter.functionalize``: every such name is still there."""
    names = ("setitem_on_copy", "inplace_on_copy", "call_on_copy", "keep_dtype", "view_index",
             "scatter_view", "gather_view", "without_grad", "_copy_functional", "CapturedMode")
    namespace: dict = {}
    exec("\n".join(f"from fxquant.linter.functionalize import {n} as {n}" for n in names),
         namespace)
    assert all(callable(namespace[n]) for n in names)
