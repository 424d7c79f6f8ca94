"""Each torch internal the linter relies on exists and behaves as the linter assumes, on the
installed torch: a release that moves one fails the test named after it."""

from __future__ import annotations

import logging
import sys
import threading
import warnings

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import fxquant
from fxquant.linter import torch_internals as ti


class _Seen(TorchFunctionMode):
    """A torch-function mode that lists the functions it sees."""

    def __init__(self):
        super().__init__()
        self.funcs = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.funcs.append(func)
        return func(*args, **(kwargs or {}))


class _Aten(ti.TorchDispatchMode):
    """A dispatch mode that lists the ATen ops it sees."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


class _KeepsX(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.x = x
        ctx.is_context = ti.is_function_context(ctx)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        ctx.was_in_backward = ti.in_backward()
        return grad * 2


@pytest.mark.parametrize("internal", ti.INTERNALS, ids=lambda i: i.name)
def test_every_internal_is_in_this_torch(internal):
    """Each entry of the table exists where the table says torch keeps it."""
    assert internal.present, f"torch {torch.__version__} moved {internal.torch_name}"
    assert internal.name in ti.__all__


def test_nothing_is_missing_and_every_instrument_can_be_installed():
    assert ti.missing() == []
    assert ti.instruments_available() == {"functions", "dispatch", "hooks"}


# -- mode stacks --------------------------------------------------------------------------------


def test_function_mode_stack_and_pop_function_mode():
    mode = _Seen()
    before = len(ti.function_mode_stack())
    mode.__enter__()
    try:
        assert ti.function_mode_stack()[-1] is mode
    finally:
        ti.pop_function_mode()
    assert len(ti.function_mode_stack()) == before


def test_dispatch_mode_stack_and_pop_dispatch_mode():
    mode = _Aten()
    before = len(ti.dispatch_mode_stack())
    mode.__enter__()
    try:
        assert ti.dispatch_mode_stack()[-1] is mode
        torch.ones(2).add_(1)
        assert torch.ops.aten.add_.Tensor in mode.ops
    finally:
        ti.pop_dispatch_mode()
    assert len(ti.dispatch_mode_stack()) == before


def test_torch_function_disabled_hides_calls_from_the_mode():
    with _Seen() as mode:
        with ti.torch_function_disabled():
            torch.add(torch.ones(1), 1)
        assert torch.add not in mode.funcs
        torch.add(torch.ones(1), 1)
        assert torch.add in mode.funcs


# -- saved-tensor hooks -------------------------------------------------------------------------


def test_saved_tensors_hooks_push_top_pop():
    def pack(t):
        return t

    def unpack(t):
        return t

    below = ti.top_saved_tensors_hooks()
    ti.push_saved_tensors_hooks(pack, unpack)
    try:
        top = ti.top_saved_tensors_hooks()
        assert top is not None and top[0] is pack and top[1] is unpack
    finally:
        ti.pop_saved_tensors_hooks()
    assert ti.top_saved_tensors_hooks() == below


def test_saved_tensors_hooks_pushes_wrapped_sees_the_context_manager():
    """``saved_tensors_hooks`` looks its push up on ``torch._C._autograd`` when it enters,
    so replacing it there wraps what the forward pushes (this thread only)."""
    wrapped = []

    def wrap(pack, unpack):
        wrapped.append(pack)
        return pack, unpack

    def pack(t):
        return t

    other = []
    original = torch._C._autograd._push_saved_tensors_default_hooks
    with ti.saved_tensors_hooks_pushes_wrapped(wrap):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            pass
        worker = threading.Thread(target=lambda: other.append(
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t).__enter__()))
        worker.start()
        worker.join()
    assert wrapped == [pack] and len(other) == 1
    assert torch._C._autograd._push_saved_tensors_default_hooks is original


# -- tensors ------------------------------------------------------------------------------------


def test_version_counts_in_place_writes_shared_by_views():
    x = torch.zeros(4)
    view = x[:2]
    start = ti.version(x)
    view.add_(1)
    assert ti.version(x) == ti.version(view) == start + 1


def test_bump_version_counts_one_write():
    x = torch.zeros(2)
    start = ti.version(x)
    ti.bump_version(x)
    assert ti.version(x) == start + 1


def test_storage_id_tells_storages_apart_also_on_meta_and_fake_tensors():
    x = torch.zeros(4)
    assert ti.storage_id(x) == ti.storage_id(x[1:]) != 0
    assert ti.storage_id(x) != ti.storage_id(x.clone())
    a, b = torch.empty(3, device="meta"), torch.empty(3, device="meta")
    assert ti.storage_id(a) != ti.storage_id(b) and ti.storage_id(a) == ti.storage_id(a[1:])
    with ti.new_fake_mode():
        f, g = torch.empty(3), torch.empty(3)
        assert ti.storage_id(f) != ti.storage_id(g) != 0


def test_has_internal_overlap_means_an_expanded_tensor():
    assert ti.has_internal_overlap(torch.zeros(1).expand(3))
    assert not ti.has_internal_overlap(torch.zeros(3))


def test_is_fake():
    mode = ti.new_fake_mode()
    assert isinstance(mode, ti.FakeTensorMode)
    assert ti.is_fake(ti.fake_from_tensor(mode, torch.zeros(2)))
    assert not ti.is_fake(torch.zeros(2))


def test_coo_parts_of_an_uncoalesced_tensor():
    t = torch.sparse_coo_tensor([[0, 0]], [1.0, 2.0], (2,), check_invariants=False)
    indices, values = ti.coo_parts(t)
    assert indices.tolist() == [[0, 0]] and values.tolist() == [1.0, 2.0]


# -- op schemas ---------------------------------------------------------------------------------


def test_lift_fresh_is_how_the_legacy_constructor_reaches_a_mode():
    with _Seen() as mode, _Aten():
        torch.Tensor([1.0, 2.0])
    assert ti.LIFT_FRESH in mode.funcs


def test_written_tensors_reads_the_schema():
    x, y, out = torch.zeros(2), torch.ones(2), torch.empty(2)
    assert ti.written_tensors(torch.ops.aten.add_.Tensor, (x, y), {}) == [x]
    assert ti.written_tensors(torch.ops.aten.add.Tensor, (x, y), {}) == []
    assert ti.written_tensors(torch.ops.aten.add.out, (x, y), {"out": out}) == [out]


def test_writes_first_argument():
    assert ti.writes_first_argument(torch.ops.aten.add_)
    assert ti.writes_first_argument(torch.ops.aten.copy_)
    assert not ti.writes_first_argument(torch.ops.aten.add)


def test_data_reads_and_writes_reach_a_mode_as_the_property():
    w = torch.zeros(2, requires_grad=True)
    with _Seen() as mode:
        _ = w.data
        w.data = torch.ones(2)
    reads = [i for i, f in enumerate(mode.funcs) if ti.is_data_read(f)]
    writes = [i for i, f in enumerate(mode.funcs) if ti.is_data_write(f)]
    assert len(reads) == len(writes) == 1 and reads[0] < writes[0]


# -- the autograd graph -------------------------------------------------------------------------


def test_autograd_nodes_counts_each_node_once_on_a_long_chain():
    """A chain of 2000 distinct nodes, whose Python objects torch makes on demand: none is
    lost to a reused id."""
    x = torch.ones(1, requires_grad=True)
    h = x
    for _ in range(2000):
        h = h * 1.5
    nodes = ti.autograd_nodes(h)
    names = [n.name() for n in nodes]
    assert names.count("MulBackward0") == 2000 and names.count("torch::autograd::AccumulateGrad") == 1


def test_custom_function_nodes_their_class_and_context():
    x = torch.randn(3, requires_grad=True)
    y = _KeepsX.apply(x)
    node = y.grad_fn
    assert ti.is_custom_function_node(node) and not ti.is_custom_function_node((x * 2).grad_fn)
    assert ti.forward_class(node) is _KeepsX and ti.forward_class((x * 2).grad_fn) is None
    assert [(k, v is x) for k, v in ti.context_tensors(node)] == [("x", True)]
    assert node.is_context


def test_in_backward_only_while_the_engine_runs_a_node():
    x = torch.randn(3, requires_grad=True)
    y = _KeepsX.apply(x)
    assert not ti.in_backward()
    y.sum().backward()
    assert y.grad_fn.was_in_backward


def test_autograd_node_op_names_the_op_as_pytorchs_errors_do():
    x = torch.randn(3, requires_grad=True)
    assert ti.autograd_node_op((x ** 2).grad_fn) == "pow"
    assert ti.autograd_node_op(torch.addmm(x, x[:, None], x[None]).grad_fn) == "addmm"


# -- entry points -------------------------------------------------------------------------------


def test_call_torch_apply_runs_a_function_as_torch_does():
    x = torch.randn(3, requires_grad=True)
    y = ti.call_torch_apply(_KeepsX, x)
    assert torch.equal(y, x * 2) and ti.forward_class(y.grad_fn) is _KeepsX


def test_custom_function_apply_watched_sees_each_apply_and_is_put_back():
    own = vars(torch.autograd.Function)["apply"]
    seen, other = [], []
    x = torch.randn(3, requires_grad=True)
    def watch(cls, args):
        assert args == (x,)
        return lambda out: seen.append((cls, out))

    with ti.custom_function_apply_watched(watch):
        y = _KeepsX.apply(x)
        worker = threading.Thread(target=lambda: other.append(_KeepsX.apply(x)))
        worker.start()
        worker.join()
    assert len(seen) == 1 and seen[0][0] is _KeepsX and seen[0][1] is y and len(other) == 1
    assert vars(torch.autograd.Function)["apply"] is own


def test_reentrant_checkpoint_replaced_runs_segments_as_given():
    """``checkpoint(use_reentrant=True)`` goes through ``CheckpointFunction.apply``."""
    owner = torch.utils.checkpoint.CheckpointFunction
    before = vars(owner).get("apply")
    layer = nn.Linear(2, 2)
    x = torch.randn(1, 2, requires_grad=True)
    ran, other = [], []

    def run(function, preserve_rng_state, *args):
        ran.append(preserve_rng_state)
        return function(*args)

    with ti.reentrant_checkpoint_replaced(run):
        out = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=True)
        worker = threading.Thread(target=lambda: other.append(
            torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=True)))
        worker.start()
        worker.join()
    assert ran == [True] and type(out.grad_fn).__name__ == "AddmmBackward0"
    assert type(other[0].grad_fn).__name__ == "CheckpointFunctionBackward"
    assert vars(owner).get("apply") is before


def test_anomaly_switches_watched_sees_set_detect_anomaly():
    calls = []
    state = torch.is_anomaly_enabled()
    try:
        with ti.anomaly_switches_watched(lambda: calls.append(1)):
            torch.autograd.set_detect_anomaly(True)
            torch.autograd.set_detect_anomaly(False)
            with torch.autograd.detect_anomaly():
                pass
    finally:
        torch.autograd.set_detect_anomaly(state)
    assert len(calls) == 2


# -- autograd's error texts ---------------------------------------------------------------------


def _message(action):
    with pytest.raises(RuntimeError) as info:
        action()
    return str(info.value)


def test_leaf_write_errors():
    w = nn.Parameter(torch.zeros(3))
    assert ti.LEAF_WRITE_ERRORS[0] in _message(lambda: w.add_(1))
    assert ti.LEAF_WRITE_ERRORS[1] in _message(lambda: w[:2].add_(1))


def test_refused_view_writes():
    x = torch.randn(4, requires_grad=True) * 1
    a, _ = x.split(2)
    assert ti.REFUSED_VIEW_WRITES[0] in _message(lambda: a.add_(1))
    w = torch.randn(2, requires_grad=True)
    assert ti.REFUSED_VIEW_WRITES[1] in _message(lambda: torch.add(w, 1, out=torch.empty(2)))
    assert ti.REFUSED_VIEW_WRITES[2] in _message(lambda: torch.zeros(1).expand(3).add_(1))


def test_overlap_error_is_torchs_text():
    assert _message(lambda: torch.zeros(1).expand(3).add_(1)).startswith(ti.OVERLAP_ERROR)


def test_after_refused_view_write():
    x = torch.randn(4, requires_grad=True) * 1
    a, b = x.split(2)
    a.detach().mul_(2)
    assert ti.AFTER_REFUSED_VIEW_WRITE in _message(lambda: (b * 2).sum().backward())


def test_a_full_backward_hooks_output_is_named_in_the_refusal():
    layer = nn.Linear(2, 2)
    layer.register_full_backward_hook(lambda *_: None)
    out = layer(torch.randn(1, 2, requires_grad=True))
    message = _message(lambda: out.relu_())
    assert ti.BACKWARD_HOOK_VIEW_MARK in message and ti.REFUSED_VIEW_WRITES[0] in message


def test_a_custom_functions_view_is_named_in_the_refusal():
    class View(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return grad

    y = View.apply(torch.randn(3, requires_grad=True) * 1)
    message = _message(lambda: y.add_(1))
    assert ti.CUSTOM_FUNCTION_VIEW_MARK in message and ti.REFUSED_VIEW_WRITES[0] in message


# -- fake tensors -------------------------------------------------------------------------------


def test_needs_values_is_what_fake_tensors_raise_for_values():
    with ti.new_fake_mode(), pytest.raises(ti.NEEDS_VALUES):
        bool(torch.zeros(3).sum() > 0)


def test_new_fake_mode_gives_symbolic_sizes_for_data_dependent_ops():
    with ti.new_fake_mode():
        out = torch.zeros(4).nonzero()
    assert ti.is_fake(out) and isinstance(out.shape[0], torch.SymInt)


def test_the_fake_tensor_logger_is_torchs():
    assert ti.FAKE_TENSOR_LOGGER.name in logging.Logger.manager.loggerDict
    assert ti.FAKE_TENSOR_LOGGER.name == torch._subclasses.fake_tensor.log.name


# -- modules ------------------------------------------------------------------------------------


class _Caller(nn.Module):
    def forward(self, x):
        self.caller_file = sys._getframe(1).f_code.co_filename
        return x


def test_module_call_file_is_the_frame_between_caller_and_forward():
    module = _Caller()
    module(torch.zeros(1))
    assert module.caller_file == ti.MODULE_CALL_FILE


def test_module_hook_tables_hold_the_hooks_a_call_runs():
    layer = nn.Linear(2, 2)
    before = [len(getattr(layer, table)) for table in ti.MODULE_HOOK_TABLES]
    layer.register_forward_pre_hook(lambda *_: None)
    layer.register_forward_hook(lambda *_: None)
    layer.register_full_backward_pre_hook(lambda *_: None)
    layer.register_full_backward_hook(lambda *_: None)
    after = [len(getattr(layer, table)) for table in ti.MODULE_HOOK_TABLES]
    assert after == [n + 1 for n in before]


def test_module_parameters_buffers_and_non_persistent_buffers_are_the_modules_own():
    module = nn.Module()
    module.w = nn.Parameter(torch.zeros(1))
    module.register_buffer("kept", torch.zeros(1))
    module.register_buffer("dropped", torch.zeros(1), persistent=False)
    assert list(ti.module_parameters(module)) == ["w"]
    assert list(ti.module_buffers(module)) == ["kept", "dropped"]
    assert ti.non_persistent_buffers(module) == {"dropped"}
    ti.module_buffers(module)["kept"] = torch.ones(1)
    assert torch.equal(module.kept, torch.ones(1))


def test_global_module_hooks_hold_torch_nns_global_hooks():
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *_: None)
    try:
        assert any(handle.id in table for table in ti.global_module_hooks().values())
    finally:
        handle.remove()


# -- torch.fx and pytree ------------------------------------------------------------------------


def test_output_tree_spec_rebuilds_nested_outputs():
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda xs: {"a": xs[0] + 1, "b": (xs[0] * 2,)})([torch.zeros(2)])
    spec = ti.output_tree_spec(gm)
    assert spec is not None
    rebuilt = ti.tree_unflatten([1, 2], spec)
    assert rebuilt == {"a": 1, "b": (2,)}


def test_pytree_functions():
    tree = {"a": torch.zeros(1), "b": [torch.ones(1), 3]}
    assert len(ti.tree_leaves(tree)) == 3
    flat, spec = ti.tree_flatten(tree)
    assert ti.tree_unflatten(flat, spec).keys() == tree.keys()
    assert ti.tree_map(lambda v: 0, tree) == {"a": 0, "b": [0, 0]}
    assert ti.tree_map_only(torch.Tensor, lambda t: 1, tree)["b"][1] == 3


# -- a torch that lacks one ---------------------------------------------------------------------


def test_a_missing_internal_is_said_once_and_its_checks_are_skipped(monkeypatch):
    """Without the saved-tensor-hooks internals the hooks instrument is not installed: one
    warning naming what is missing, a clean model stays clean, a buggy one gets no false
    error, and nothing of the recording is left behind."""
    hooks = next(i for i in ti.INTERNALS if i.name == "top_saved_tensors_hooks")
    monkeypatch.setattr(ti, "_absent", lambda: (hooks,))
    monkeypatch.setattr(ti, "_warned", threading.Event())
    assert ti.instruments_available() == {"functions", "dispatch"}

    class Clean(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(x).sigmoid() * 2

    x = torch.randn(2, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = fxquant.lint(Clean(), x)
        fxquant.lint(Clean(), x)
    said = [w for w in caught if hooks.torch_name in str(w.message)]
    assert len(said) == 1 and said[0].filename == __file__
    assert "which op saved which tensor" in str(said[0].message)
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        ti.warn_missing()
    assert not again
    assert not report.findings
    assert ti.top_saved_tensors_hooks() is None and not ti.function_mode_stack()
