"""fxquant.fast_dropout: nn.Dropout with one torch.rand draw for its mask, eager and
compiled (torch.ops.fxquant.dropout)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch_geometric.nn.models import GCN

import fxquant
from fxquant.errors import FxquantTypeError
from fxquant.fx.standardize import FastDropout


def _edges() -> torch.Tensor:
    return torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 0]])


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_op_keeps_each_value_with_probability_one_minus_p_and_scales_it(p):
    torch.manual_seed(0)
    x = torch.randn(200, 500)
    y, keep = torch.ops.fxquant.dropout(x, p)
    assert keep.dtype == torch.bool and keep.shape == x.shape
    torch.testing.assert_close(y, torch.where(keep, x / (1 - p), torch.zeros(())))
    n = x.numel()
    sd = (n * p * (1 - p)) ** 0.5
    assert abs(int(keep.sum()) - n * (1 - p)) < 5 * sd


def test_op_keeps_bfloat16_values_at_the_same_rate():
    torch.manual_seed(0)
    x = torch.ones(400, 500, dtype=torch.bfloat16)
    y, keep = torch.ops.fxquant.dropout(x, 0.3)
    assert y.dtype == torch.bfloat16
    assert abs(float(keep.float().mean()) - 0.7) < 0.005
    assert bool((y[keep] == torch.tensor(1 / 0.7, dtype=torch.bfloat16)).all())


def test_op_ends_are_exact():
    x = torch.randn(64, 8)
    y0, keep0 = torch.ops.fxquant.dropout(x, 0.0)
    assert torch.equal(y0, x) and bool(keep0.all())
    y1, keep1 = torch.ops.fxquant.dropout(x, 1.0)
    assert not bool(keep1.any()) and not bool(y1.isnan().any()) and bool((y1 == 0).all())


def test_op_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(1)
    x = torch.randn(50, 7, requires_grad=True)
    y, keep = torch.ops.fxquant.dropout(x, 0.25)
    assert not keep.requires_grad
    g = torch.randn_like(y)
    y.backward(g)
    torch.testing.assert_close(x.grad, g * keep / 0.75)


def test_op_follows_manual_seed_and_runs_on_meta():
    torch.manual_seed(3)
    a = torch.ops.fxquant.dropout(torch.ones(10, 10), 0.5)[0]
    torch.manual_seed(3)
    b = torch.ops.fxquant.dropout(torch.ones(10, 10), 0.5)[0]
    assert torch.equal(a, b)
    y, keep = torch.ops.fxquant.dropout(torch.empty(3, 4, device="meta"), 0.5)
    assert y.device.type == "meta" and keep.dtype == torch.bool and keep.shape == (3, 4)


def test_fast_dropout_swaps_traced_functional_dropout_and_keeps_eval_exact():
    torch.manual_seed(0)
    model = GCN(6, 8, num_layers=2, out_channels=3, dropout=0.5)
    gm = fxquant.trace(model)
    reference = copy.deepcopy(gm)
    state = {k: v.clone() for k, v in gm.state_dict().items()}
    assert fxquant.fast_dropout(gm) is gm
    swapped = [m for m in gm.modules() if isinstance(m, nn.Dropout)]
    assert swapped and all(type(m) is FastDropout and m.p == 0.5 for m in swapped)
    assert gm.state_dict().keys() == state.keys()
    x, ei = torch.randn(5, 6), _edges()
    gm.eval()
    reference.eval()
    assert torch.equal(gm(x, ei), reference(x, ei))


def test_fast_dropout_trains_with_its_own_masks():
    """In training the masks are fxquant.dropout's: the same under the same seed, and the
    dropped share of a layer's input is about p."""
    torch.manual_seed(0)
    drop = fxquant.fast_dropout(nn.Sequential(nn.Dropout(0.3), nn.Linear(4, 4)))
    assert type(drop[0]) is FastDropout and drop.training and drop[0].training
    x = torch.randn(4000, 4)
    torch.manual_seed(5)
    y = drop[0](x)
    torch.manual_seed(5)
    assert torch.equal(y, torch.ops.fxquant.dropout(x, 0.3)[0])
    assert abs(float((y == 0).float().mean()) - 0.3) < 0.02


def test_fast_dropout_leaves_other_dropouts_and_keeps_modes():
    model = nn.Sequential(nn.Dropout(0.2), nn.Dropout2d(0.2), nn.AlphaDropout(0.2),
                          nn.Sequential(nn.Dropout(0.4, inplace=True)))
    model[3].eval()
    fxquant.fast_dropout(model)
    assert [type(m) for m in model[:3]] == [FastDropout, nn.Dropout2d, nn.AlphaDropout]
    inner = model[3][0]
    assert type(inner) is FastDropout and inner.p == 0.4 and not inner.training
    root = fxquant.fast_dropout(nn.Dropout(0.1))
    assert type(root) is FastDropout and root.p == 0.1


def test_fast_dropout_is_out_of_place_also_where_inplace():
    torch.manual_seed(0)
    drop = fxquant.fast_dropout(nn.Dropout(0.5, inplace=True))
    x = torch.randn(100, 10)
    before = x.clone()
    y = drop(x)
    assert torch.equal(x, before) and y.data_ptr() != x.data_ptr()


def test_fast_dropout_warns_where_nothing_is_replaced():
    """PyG's gcn.py model calls F.dropout: untraced, there is no module to swap."""

    class Functional(nn.Module):
        def forward(self, x):
            return nn.functional.dropout(x, 0.5, self.training)

    with pytest.warns(UserWarning, match="no torch.nn.Dropout"):
        model = fxquant.fast_dropout(Functional())
    assert isinstance(model, Functional)
    gm = fxquant.fast_dropout(fxquant.trace(Functional()))  # traced: a module, no warning
    assert any(type(m) is FastDropout for m in gm.modules())


def test_fast_dropout_rejects_what_is_not_a_module():
    with pytest.raises(FxquantTypeError, match=r"torch\.nn\.Module"):
        fxquant.fast_dropout(lambda x: x)  # type: ignore[arg-type]


@pytest.mark.slow
def test_compiled_fast_dropout_draws_the_eager_masks():
    """torch.compile calls the op as it is: under one seed the compiled model's output and
    gradients equal the eager model's (Inductor's own dropout draws other numbers)."""
    torch.manual_seed(0)
    gm = fxquant.fast_dropout(fxquant.trace(GCN(6, 8, num_layers=2, out_channels=3,
                                                 dropout=0.5)))
    x, ei = torch.randn(5, 6, requires_grad=True), _edges()
    compiled = torch.compile(gm)
    outs = []
    for m in (gm, compiled):
        torch.manual_seed(7)
        x.grad = None
        y = m(x, ei)
        y.square().sum().backward()
        outs.append((y.detach(), x.grad.clone()))
    torch.testing.assert_close(outs[0][0], outs[1][0])
    torch.testing.assert_close(outs[0][1], outs[1][1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("p", [0.0, 0.3, 0.5, 1.0])
def test_module_dropout_is_the_ops_bit_for_bit(dtype, p):
    """FastDropout builds the dropout around one opaque draw (``fxquant.uniform_``) from
    plain operations: under one seed its values are the one-op dropout's and those of the
    dropout's definition over one ``torch.rand`` draw, bit for bit, infinities, NaN and
    negative zeros included."""
    from fxquant._ops.dropout import apply

    x = torch.randn(300, 7).to(dtype)
    x[0, 0], x[1, 1], x[2, 2], x[3, 3] = float("inf"), float("nan"), -0.0, float("-inf")
    torch.manual_seed(3)
    keep = torch.rand(x.shape) >= p
    want = x.mul(keep).mul_(0.0 if p == 1.0 else 1.0 / (1.0 - p))
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    for dropout in (apply, lambda x, p: torch.ops.fxquant.dropout(x, p)[0]):
        torch.manual_seed(3)
        got = dropout(x, p)
        assert got.dtype == dtype and torch.equal(got.view(bits), want.view(bits))


def test_module_dropout_leaves_its_arithmetic_to_the_compiler():
    """Traced in training, FastDropout is one ``fxquant.uniform_`` draw and plain aten
    operations (which Inductor fuses with what reads them), not one opaque dropout op; the
    draw is marked random, so no graph pass recomputes one."""
    from torch.fx.experimental.proxy_tensor import make_fx

    drop = FastDropout(0.5).train()
    graph = make_fx(drop)(torch.randn(4, 3)).graph
    targets = [n.target for n in graph.nodes if n.op == "call_function"]
    assert torch.ops.fxquant.uniform_.default in targets
    assert torch.ops.fxquant.dropout.default not in targets
    assert torch.Tag.nondeterministic_seeded in torch.ops.fxquant.uniform_.default.tags


@pytest.mark.slow
def test_compiled_fast_dropouts_of_one_tensor_draw_two_masks():
    """Two dropouts of the same tensor in one compiled graph draw two masks (the draws are
    not merged, also where the tensor requires grad), the same two the eager model draws,
    with the eager gradients."""
    drop = FastDropout(0.5).train()

    def two(x):
        return drop(x) + 2 * drop(x)

    compiled = torch.compile(two)
    for grad in (False, True):
        x = torch.ones(50, 40, requires_grad=grad)
        outs = []
        for f in (two, compiled):
            torch.manual_seed(1)
            y = f(x)
            if grad:
                x.grad = None
                y.sum().backward()
            outs.append((y.detach(), x.grad.clone() if grad else None, torch.rand(3)))
        (eager, eager_grad, eager_next), (got, got_grad, got_next) = outs
        assert torch.equal(eager, got) and torch.equal(eager_next, got_next)  # same draws
        assert {0.0, 2.0, 4.0, 6.0} == set(got.unique().tolist())  # independent masks
        if grad:
            assert torch.equal(eager_grad, got_grad)


def test_fast_dropout_keeps_a_shared_dropout_shared():
    """The reported case: two attributes naming one nn.Dropout name one FastDropout after."""
    shared = nn.Dropout(0.3)

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = shared, shared
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.b(self.lin(self.a(x)))

    model = fxquant.fast_dropout(Two())
    assert type(model.a) is FastDropout and model.a is model.b and model.a.p == 0.3


@st.composite
def _trees(draw):
    """A module tree whose dropouts and containers may appear under several names: in two
    attributes of one module, in two containers, or inside a container that is itself
    shared."""
    dropouts = [nn.Dropout(p) for p in draw(st.lists(st.sampled_from([0.1, 0.2, 0.5]),
                                                      min_size=1, max_size=3))]
    for d in dropouts:
        d.train(draw(st.booleans()))
    built: list[nn.Module] = []

    def container(depth: int) -> nn.Module:
        kind = draw(st.sampled_from(["sequential", "list", "dict", "module"]))
        children = []
        for _ in range(draw(st.integers(1, 4))):
            choice = draw(st.sampled_from(["dropout", "relu", "container", "shared"]))
            if choice == "dropout":
                children.append(draw(st.sampled_from(dropouts)))
            elif choice == "relu":
                children.append(nn.ReLU())
            elif choice == "container" and depth < 2:
                children.append(container(depth + 1))
            elif choice == "shared" and built:
                children.append(draw(st.sampled_from(built)))
            else:
                children.append(draw(st.sampled_from(dropouts)))
        if kind == "sequential":
            module: nn.Module = nn.Sequential(*children)
        elif kind == "list":
            module = nn.ModuleList(children)
        elif kind == "dict":
            module = nn.ModuleDict({f"m{i}": c for i, c in enumerate(children)})
        else:
            module = nn.Module()
            for i, c in enumerate(children):
                setattr(module, f"attr{i}", c)
        built.append(module)
        return module

    return container(0)


@settings(max_examples=150)
@given(model=_trees())
def test_fast_dropout_replaces_by_identity_under_every_name(model):
    """Every name of every nn.Dropout (attributes, containers, containers shared by several
    parents) names a FastDropout of the same p and mode after, and two names share a
    module after exactly where they shared one before; nothing else changes."""
    before = dict(model.named_modules(remove_duplicate=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a tree without a dropout says so)
        fxquant.fast_dropout(model)
    after = dict(model.named_modules(remove_duplicate=False))
    assert after.keys() == before.keys()
    for name, old in before.items():
        new = after[name]
        if type(old) is nn.Dropout:
            assert type(new) is FastDropout and new.p == old.p and new.training == old.training
        else:
            assert new is old
    names = sorted(before)
    for a in names:
        for b in names:
            assert (before[a] is before[b]) == (after[a] is after[b]), (a, b)
