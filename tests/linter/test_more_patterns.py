"""Patterns found by a held-out stress test of the linter (each from a public thread): what
each tool must say, and that nothing of the model is left changed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import DeepGCNLayer, GCNConv, MessagePassing

import fxquant
import fxquant.testing
from fxquant import ShapeSpec

#: torch's own Function.apply (a classmethod, or on newer torch a C descriptor)
_APPLY = vars(torch.autograd.Function)["apply"]


def rules(report, severity="error"):
    return [f.rule for f in report.findings if f.severity == severity]


class MaskedAttention(nn.Module):
    """jadore801120/attention-is-all-you-need-pytorch#16: ``attn.data.masked_fill_(mask,
    -inf)`` before a softmax. Autograd does not see the fill, but the softmax's gradient is
    zero where it filled, so the gradients are those of ``attn.masked_fill(...)``: legal."""

    def __init__(self, use_data=True):
        super().__init__()
        self.q, self.use_data = nn.Linear(4, 4), use_data

    def forward(self, x, mask):
        attn = torch.bmm(self.q(x), x.transpose(1, 2))
        if self.use_data:
            attn.data.masked_fill_(mask, -float("inf"))
        else:
            attn = attn.masked_fill(mask, -float("inf"))
        return torch.bmm(attn.softmax(-1), x)


class HiddenZero(MaskedAttention):
    """The same hidden fill before a sum instead: the gradient reaches the filled places."""

    def forward(self, x, mask):
        attn = torch.bmm(self.q(x), x.transpose(1, 2))
        attn.data.masked_fill_(mask, 0.0)
        return (attn * 2).sum(-1)


def attention_inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, generator=g)
    mask = torch.tensor([[False, True, False]]).expand(3, 3).unsqueeze(0).repeat(2, 1, 1)
    return x, mask


def test_hidden_fill_before_softmax_is_a_warning_not_an_error():
    x, mask = attention_inputs()
    assert "FXQ014" in rules(fxquant.lint(MaskedAttention(), x, mask), "warning")
    report = fxquant.check(MaskedAttention(), x, mask)
    assert "FXQ012" not in rules(report)


def test_hidden_fill_whose_gradient_matters_is_an_error_in_check():
    x, mask = attention_inputs()
    report = fxquant.check(HiddenZero(), x, mask)
    (error,) = report.by_rule("FXQ012")
    line = HiddenZero.forward.__code__.co_firstlineno + 2
    assert error.line == line and "(attn * 2).sum(-1)" in error.related


class TimesThree(torch.autograd.Function):
    """pytorch/pytorch#184113: an in-place op in a custom Function, declared with mark_dirty."""

    @staticmethod
    def forward(ctx, x):
        x.mul_(3)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad * 3


class WithCustomFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.eye(2) + 0.1)

    def forward(self, x):
        y = x @ self.w
        TimesThree.apply(y)
        return y.sum()


def test_custom_function_writes_are_its_authors_business():
    x = torch.randn(2, 2)
    assert not fxquant.lint(WithCustomFunction(), x).findings
    assert not fxquant.check(WithCustomFunction(), x).errors


class ExpandThenNormalize(nn.Module):
    """juliendenize/torchaug#10: ``expand`` then ``sub_`` writes several elements that share
    memory; forward raises (also on fake tensors, where torch itself does not check)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 3, 1)

    def forward(self, imgs):
        gray = self.stem(imgs).mean(1, keepdim=True).expand(-1, 3, -1, -1)
        return gray.sub_(0.5).flatten(1)


def test_write_into_expanded_tensor_is_found_with_data_and_from_shapes():
    line = ExpandThenNormalize.forward.__code__.co_firstlineno + 2
    real = fxquant.lint(ExpandThenNormalize(), torch.randn(2, 3, 4, 4))
    shapes = fxquant.lint(ExpandThenNormalize(), ShapeSpec((2, 3, 4, 4)))
    for report in (real, shapes):
        assert [(f.rule, f.line) for f in report.errors] == [("FXQ013", line)]
        assert "share memory" in report.errors[0].message or "memory location" in \
            report.errors[0].message
    assert shapes.mode == "shapes"


class Coverage(nn.Module):
    """pytorch/pytorch#8106: a plain tensor attribute updated with ``+=`` in forward."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.history = torch.zeros(2, 3)

    def forward(self, x):
        h = self.lin(x) + self.history
        self.history += h.detach()
        self.lin.weight.note = "seen"  # a Python attribute on a parameter
        return h


def test_plain_tensor_attributes_and_tensor_attributes_are_restored():
    model = Coverage()
    x = torch.randn(2, 3)
    for tool in (fxquant.lint, fxquant.check):
        tool(model, x)
        assert torch.equal(model.history, torch.zeros(2, 3))
        assert not hasattr(model.lin.weight, "note")


def test_trace_names_a_module_attribute_the_forward_rebinds_and_restores_it():
    model = Coverage()
    history = model.history
    try:
        fxquant.trace(model)
    except fxquant.TraceError as e:
        assert "forward assigns self.history" in str(e)
    else:
        raise AssertionError("tracing a forward that rebinds self.history must fail")
    assert model.history is history


def test_functionalize_fixes_a_plain_attribute_update():
    """The captured path keeps the attribute as state; gradients verified."""

    class Saved(Coverage):
        def forward(self, x):
            h = self.lin(x) * self.history.exp()  # saves history
            self.history += 1  # then changes it: backward fails
            return h

    gm = fxquant.functionalize_inplace(Saved(), torch.randn(2, 3))
    assert gm.meta["fxquant_functionalized"] == "captured"
    out = gm(torch.randn(2, 3))
    out.sum().backward()
    assert torch.equal(gm.history, torch.ones(2, 3))  # the state update is kept


def test_relu_dropout_inplace_hint_names_the_module():
    """A crash in nn.Dropout(inplace=True) after ReLU(inplace=True): the hint says
    inplace=False for the module, not an unrelated op."""

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid(), nn.Dropout(0.5, inplace=True))

        def forward(self, x):
            return self.net(x)

    report = fxquant.lint(MLP().train(), torch.randn(3, 4))
    (error,) = report.errors
    assert "inplace=False" in error.hint
    F.dropout  # noqa: B018 - the functional form is covered in the corpus


class InputOnly(nn.Module):
    """A hidden write that spares every parameter's gradient: ``exp`` saved ``y`` and only
    the input's gradient reads it."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))

    def forward(self, x):
        y = x.exp()
        y.data.add_(1)
        return y * self.w


def test_check_compares_the_gradients_of_inputs_that_require_grad():
    """check compared parameter gradients only: a write that made only the input's
    gradient wrong went unreported (FXQ004 alone). It is FXQ012 at the write, naming the
    input; an input without requires_grad is not compared."""
    x = torch.randn(4, 3, requires_grad=True)
    (error,) = fxquant.check(InputOnly(), x).errors
    assert (error.rule, error.related) == ("FXQ012", "exp")
    assert "'input 0'" in error.message and "y.data.add_(1)" in error.location.code
    assert not fxquant.check(InputOnly(), x.detach()).errors


class LoggedNorm(nn.Module):
    """A statistic logged with grad on (``h.norm().item()``): norm saves ``h``, but its
    autograd node is freed with the dropped result, so the in-place ReLU after it is legal.
    ``keep=True`` keeps the node (the statistic as a tensor): backward through it fails."""

    def __init__(self, keep=False):
        super().__init__()
        self.l1, self.l2, self.keep = nn.Linear(4, 4), nn.Linear(4, 4), keep

    def forward(self, x):
        h = self.l1(x)
        self.stat = h.norm() if self.keep else h.norm().item()
        h = F.relu(h, inplace=True)
        return self.l2(h)


def test_a_write_after_a_dropped_saving_op_is_not_an_error():
    """lint reported FXQ001 for the ReLU although backward runs (a CI gate failed on
    correct code): a saved value whose autograd node is gone is not reported; one whose
    node lives is."""
    x = torch.randn(5, 4)
    model = LoggedNorm()
    model(x).sum().backward()
    assert not fxquant.lint(model, x).errors and not fxquant.check(model, x).errors
    (error,) = fxquant.lint(LoggedNorm(keep=True), x).errors
    assert (error.rule, error.related) == ("FXQ001", "linalgVectorNorm")


class _ExpConv(MessagePassing):
    def __init__(self):
        super().__init__(aggr="add")
        self.lin = nn.Linear(4, 4)

    def forward(self, x, edge_index):
        h = torch.exp(self.lin(x))
        h += 1  # exp saved h
        return self.propagate(edge_index, x=h)


class _Checkpointed(nn.Module):
    """PyG's DeepGCNLayer(ckpt_grad=True) runs its layer in a reentrant checkpoint."""

    def __init__(self):
        super().__init__()
        self.layer = DeepGCNLayer(_ExpConv(), nn.LayerNorm(4), nn.ReLU(), block="res+",
                                  ckpt_grad=True)

    def forward(self, x, edge_index):
        return self.layer(x, edge_index)


def test_an_in_place_bug_inside_a_reentrant_checkpoint_is_found():
    """A reentrant segment runs its forward without autograd and again inside backward,
    where nothing watched it: lint reported nothing and check an FXQ009 without a place.
    Both name the culprit line now, and the checkpoint is left as it was."""
    torch.manual_seed(0)
    x, edge_index = torch.randn(6, 4, requires_grad=True), torch.randint(0, 6, (2, 12))
    model = _Checkpointed().train()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        model(x, edge_index).sum().backward()
    for run in (fxquant.lint, fxquant.check):
        (error,) = run(model, x, edge_index).errors
        assert (error.rule, error.related) == ("FXQ001", "exp")
        assert error.location.code.strip().startswith("h += 1")
    assert "apply" not in vars(torch.utils.checkpoint.CheckpointFunction)


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.x = x  # kept as an attribute, not through save_for_backward
        return x * x

    @staticmethod
    def backward(ctx, grad):
        return 2 * ctx.x * grad


class _KeptInContext(nn.Module):
    def __init__(self, write=True):
        super().__init__()
        self.lin, self.write = nn.Linear(3, 3), write

    def forward(self, x):
        h = self.lin(x)
        y = _Square.apply(h)
        h = h.mul_(3) if self.write else h * 3
        return y + h


def test_a_write_into_a_tensor_a_custom_function_keeps_on_ctx_is_found():
    """``ctx.x = x`` instead of save_for_backward: autograd does not check a later write
    into x, and backward silently computes with the written value. lint warns (FXQ014),
    check reports the wrong gradients at the write (FXQ012); the out-of-place model is
    clean, and Function.apply is left as it was."""
    x = torch.randn(4, 3)
    (warning,) = [f for f in fxquant.lint(_KeptInContext(), x).findings if f.rule == "FXQ014"]
    assert warning.related == "_Square" and "ctx.x" in warning.message
    (error,) = fxquant.check(_KeptInContext(), x).errors
    assert (error.rule, error.related) == ("FXQ012", "_Square")
    assert error.location.code.strip().startswith("h = h.mul_(3)")
    assert not fxquant.lint(_KeptInContext(write=False), x).findings
    assert not fxquant.check(_KeptInContext(write=False), x).findings
    assert vars(torch.autograd.Function)["apply"] is _APPLY


class _LearnedEdgeWeights(nn.Module):
    """GCNConv with edge weights from a learned map: PyG's gcn_norm overwrites infinities
    of a tensor that requires grad (masked_fill_), which is its business, not the user's."""

    def __init__(self):
        super().__init__()
        self.conv, self.edge = GCNConv(4, 4), nn.Linear(2, 1)

    def forward(self, x, edge_index, edge_attr):
        return self.conv(x, edge_index, self.edge(edge_attr).sigmoid().view(-1)).relu()


def test_overwrites_inside_pyg_are_not_blamed_on_the_user():
    """FXQ002 named the user's line for gcn_norm's masked_fill_, and strict
    assert_backward_safe failed on correct code; a user's own overwrite is still named."""
    g = torch.Generator().manual_seed(0)
    args = torch.randn(10, 4, generator=g), torch.randint(0, 10, (2, 30), generator=g), \
        torch.randn(30, 2, generator=g)
    assert not fxquant.lint(_LearnedEdgeWeights(), *args).findings
    fxquant.testing.assert_backward_safe(_LearnedEdgeWeights(), *args, strict=True)


class _Physics(nn.Module):
    """A physics-informed forward: it turns requires_grad on for its input to take du/dx,
    through a custom activation that keeps its input on ctx (differentiated twice)."""

    class Softplus(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.x = x
            return F.softplus(x)

        @staticmethod
        def backward(ctx, grad):
            return grad * torch.sigmoid(ctx.x)

    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(1, 8), nn.Linear(8, 1)

    def forward(self, x):
        x.requires_grad_(True)
        u = self.l2(self.Softplus.apply(self.l1(x)))
        (du,) = torch.autograd.grad(u.sum(), x, create_graph=True)
        return u + du


def test_second_derivatives_in_forward_are_clean():
    """Correct code: check compared an input gradient taken after the forward against
    none, and cut the second-order path through a kept ctx tensor (two false FXQ012)."""
    assert not fxquant.check(_Physics(), torch.randn(5, 1)).errors


class _NoGradSegment(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)

    def forward(self, x):
        h = torch.utils.checkpoint.checkpoint(self.b, x, use_reentrant=True)
        return self.a(x) + h


def test_a_reentrant_segment_without_grad_inputs_is_named():
    """A reentrant segment none of whose inputs requires grad passes no gradient to its
    parameters: check names the checkpoint line and the way out, not a backward hook."""
    report = fxquant.check(_NoGradSegment(), torch.randn(4, 3))
    (error,) = report.errors
    assert error.rule == "FXQ012" and "reentrant torch.utils.checkpoint" in error.message
    assert "checkpoint(self.b, x" in error.location.code and "use_reentrant=False" in error.hint


def test_other_threads_checkpoint_through_checkpoint_functions_own_apply(monkeypatch):
    """While a forward is recorded, another thread's reentrant checkpoint runs as before:
    through ``CheckpointFunction.apply`` where a torch version defines one (here one that
    counts its calls), which is put back by identity afterwards."""
    import threading

    owner = torch.utils.checkpoint.CheckpointFunction
    calls = []

    def counting(cls, *args):
        calls.append(threading.get_ident())
        return vars(torch.autograd.Function)["apply"].__get__(None, cls)(*args)

    own = classmethod(counting)
    monkeypatch.setattr(owner, "apply", own, raising=False)
    layer = nn.Linear(4, 4)
    outside = []

    class _Waits(nn.Module):
        def forward(self, x):
            worker = threading.Thread(target=lambda: outside.append(
                torch.utils.checkpoint.checkpoint(layer, torch.randn(2, 4, requires_grad=True),
                                                  use_reentrant=True)))
            worker.start()
            worker.join()
            return x * 2

    fxquant.lint(_Waits(), torch.randn(2, 4))
    assert len(calls) == 1 and calls[0] != threading.get_ident() and len(outside) == 1
    assert outside[0].grad_fn is not None and type(outside[0].grad_fn).__name__ == \
        "CheckpointFunctionBackward"
    assert vars(owner)["apply"] is own
