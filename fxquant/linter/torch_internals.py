"""The torch internals the linter relies on, each behind one name (torch 2.12 to 2.14).

The linter watches a real forward from the inside: the torch-function and dispatch mode
stacks, the saved-tensor-hooks stack, version counters and storages, op schemas, the
autograd graph, the entry points of custom Functions and reentrant checkpoints, fake
tensors, and the texts of autograd's errors. None of this is public API, and a torch
release may move any of it. This module is the only place in the linter that touches
them; ``tests/linter/test_torch_internals.py`` checks each one on the installed torch,
so a release that moves one fails a test that names it.

What differs between the supported versions is handled here:

- torch 2.14 implements ``torch.autograd.Function.apply`` in C (a ``classmethod_descriptor``
  of ``torch._C._FunctionBase``) where 2.12 and 2.13 have a Python ``classmethod``: both
  are called through the descriptor protocol (:func:`call_torch_apply`).
- The Python objects of autograd nodes are made on demand and may be freed while the graph
  is walked, so an ``id()`` can come back for another node (seen on torch 2.12):
  :func:`autograd_nodes` keeps every node it visits alive.

Where a torch lacks one of these (:data:`INTERNALS` lists them, :func:`missing` those
absent), :func:`warn_missing` says so once per process, and the checks that depend on it
are skipped: the instruments that need it are not installed (:func:`instruments_available`)
and the patches that need it are not made. Nothing is then reported that could not be
seen.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import re
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import torch
import torch._subclasses.fake_tensor as _fake
import torch.fx.experimental.symbolic_shapes as _shapes
import torch.nn.modules.module as _module_globals
import torch.utils._pytree as _pytree
from torch import Tensor, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from fxquant.linter.rules import (
    ANOMALY_MODE_IN_FORWARD,
    BACKWARD_WRITES_GRADIENT,
    DATA_ATTRIBUTE,
    FACTORY_WITHOUT_DEVICE,
    HIDDEN_WRITE_THEN_READ,
    INPLACE_ON_DIFFERENTIATED_ARGUMENT,
    INPLACE_REFUSED_IN_FORWARD,
    INPLACE_WITHOUT_MARK_DIRTY,
    STALE_AUTOCAST_CAST,
)

__all__ = [
    "AFTER_REFUSED_VIEW_WRITE",
    "BACKWARD_HOOK_VIEW_MARK",
    "CUSTOM_FUNCTION_VIEW_MARK",
    "FAKE_TENSOR_LOGGER",
    "INTERNALS",
    "LEAF_WRITE_ERRORS",
    "LIFT_FRESH",
    "MODULE_CALL_FILE",
    "MODULE_HOOK_TABLES",
    "NEEDS_VALUES",
    "OVERLAP_ERROR",
    "REFUSED_VIEW_WRITES",
    "FakeTensorMode",
    "Internal",
    "TorchDispatchMode",
    "anomaly_switches_watched",
    "autocast_caching",
    "autograd_node_op",
    "autograd_nodes",
    "bump_version",
    "call_torch_apply",
    "context_tensors",
    "coo_parts",
    "custom_function_apply_watched",
    "dispatch_mode_stack",
    "fake_from_tensor",
    "forward_class",
    "function_mode_stack",
    "functional_arguments_watched",
    "global_module_hooks",
    "grad_fn",
    "gradient_edge",
    "has_internal_overlap",
    "in_backward",
    "instruments_available",
    "is_custom_function_node",
    "is_data_read",
    "is_data_write",
    "is_fake",
    "is_function_context",
    "missing",
    "module_buffers",
    "module_parameters",
    "new_fake_mode",
    "non_persistent_buffers",
    "output_tree_spec",
    "pop_dispatch_mode",
    "pop_function_mode",
    "pop_saved_tensors_hooks",
    "push_saved_tensors_hooks",
    "reentrant_checkpoint_replaced",
    "saved_tensors_hooks_pushes_wrapped",
    "storage_id",
    "top_saved_tensors_hooks",
    "torch_function_disabled",
    "tree_flatten",
    "tree_leaves",
    "tree_map",
    "tree_map_only",
    "tree_unflatten",
    "version",
    "view_base",
    "warn_missing",
    "writes_first_argument",
    "written_tensors",
]


def _find(path: str) -> Any:
    """The object at the dotted ``path`` (a module, then attributes), or None."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute, None)
            if found is None:
                return None
        return found
    return None


def _on_modules(attribute: str) -> Callable[[], bool]:
    """Whether a module instance has ``attribute`` (set by ``nn.Module.__init__``)."""
    return lambda: hasattr(nn.Module(), attribute)


@dataclass(frozen=True)
class Internal:
    """One torch internal the linter uses: what this module calls it, where torch keeps
    it, and what the linter cannot check without it."""

    name: str
    torch_name: str
    needed_for: str
    #: the instrument that cannot be installed without it ("functions", "dispatch",
    #: "hooks"), or "" where only the check named by ``needed_for`` is skipped
    instrument: str = ""
    #: how to tell whether torch has it (default: whether ``torch_name`` resolves)
    probe: Callable[[], bool] | None = None

    @property
    def present(self) -> bool:
        """Whether the installed torch has it."""
        if self.probe is not None:
            return self.probe()
        return _find(self.torch_name) is not None


_FUNCTIONS = f"the Python calls: `.data` ({DATA_ATTRIBUTE.id}) and the lines of in-place calls"
_DISPATCH = "the ATen ops: writes autograd does not see, overwrites, factories, zero-derivative ops"
_HOOKS = "which op saved which tensor, so in-place writes into saved values"
_GRADIENT_WRITES = ("custom backwards that write into their gradient "
                    f"({BACKWARD_WRITES_GRADIENT.id})")

#: Every torch internal the linter uses, by the name of this module's function or constant.
INTERNALS: Final = (
    Internal("function_mode_stack", "torch.overrides._get_current_function_mode_stack",
             _FUNCTIONS, "functions"),
    Internal("pop_function_mode", "torch._C._pop_torch_function_stack", _FUNCTIONS,
             "functions"),
    Internal("torch_function_disabled", "torch._C.DisableTorchFunction",
             "writes inside TorchScript code", "dispatch"),
    Internal("TorchDispatchMode", "torch.utils._python_dispatch.TorchDispatchMode", _DISPATCH,
             "dispatch"),
    Internal("dispatch_mode_stack",
             "torch.utils._python_dispatch._get_current_dispatch_mode_stack", _DISPATCH,
             "dispatch"),
    Internal("pop_dispatch_mode", "torch._C._pop_torch_dispatch_stack", _DISPATCH, "dispatch"),
    Internal("written_tensors", "torch.ops.aten.add_.Tensor._schema", _DISPATCH, "dispatch"),
    Internal("in_backward", "torch._C._current_autograd_node",
             "the ops autograd's backward runs", "dispatch"),
    Internal("has_internal_overlap", "torch._debug_has_internal_overlap",
             f"writes into an expanded tensor ({INPLACE_REFUSED_IN_FORWARD.id})"),
    Internal("top_saved_tensors_hooks", "torch._C._autograd._top_saved_tensors_default_hooks",
             _HOOKS, "hooks"),
    Internal("push_saved_tensors_hooks",
             "torch._C._autograd._push_saved_tensors_default_hooks", _HOOKS, "hooks"),
    Internal("pop_saved_tensors_hooks", "torch._C._autograd._pop_saved_tensors_default_hooks",
             _HOOKS, "hooks"),
    Internal("version", "torch.Tensor._version", _HOOKS, "hooks"),
    Internal("bump_version", "torch.autograd.graph.increment_version",
             "writes of foreach ops into saved values"),
    Internal("storage_id", "torch.UntypedStorage._cdata",
             "writes into the memory of fake and meta tensors"),
    Internal("custom_function_apply_watched", "torch.autograd.Function.apply",
             f"tensors a custom Function keeps on its ctx ({HIDDEN_WRITE_THEN_READ.id}), "
             f"inputs it writes without mark_dirty ({INPLACE_WITHOUT_MARK_DIRTY.id}), and "
             f"writes into the views it returns ({INPLACE_REFUSED_IN_FORWARD.id})"),
    Internal("reentrant_checkpoint_replaced", "torch.utils.checkpoint.CheckpointFunction",
             "what reentrant checkpoint segments save (they run as torch runs them)"),
    Internal("is_custom_function_node", "torch.autograd.function.BackwardCFunction",
             _GRADIENT_WRITES),
    Internal("forward_class", "torch.autograd.function.FunctionMeta", _GRADIENT_WRITES),
    Internal("is_function_context", "torch.autograd.function.FunctionCtx",
             "which writes a custom Function's forward makes (they are not reported)"),
    Internal("is_fake", "torch._subclasses.FakeTensor", "lint from shapes (ShapeSpec)"),
    Internal("new_fake_mode", "torch._subclasses.fake_tensor.FakeTensorMode",
             "lint from shapes (ShapeSpec)"),
    Internal("LIFT_FRESH", "torch.ops.aten.lift_fresh.default",
             f"the legacy constructor torch.Tensor([...]) ({FACTORY_WITHOUT_DEVICE.id})"),
    Internal("module_parameters", "torch.nn.Module._parameters",
             "restoring the model after a forward", probe=_on_modules("_parameters")),
    Internal("module_buffers", "torch.nn.Module._buffers", "restoring the model after a forward",
             probe=_on_modules("_buffers")),
    Internal("non_persistent_buffers", "torch.nn.Module._non_persistent_buffers_set",
             "functionalize_inplace keeping buffers out of the state_dict",
             probe=_on_modules("_non_persistent_buffers_set")),
    Internal("global_module_hooks", "torch.nn.modules.module._global_forward_hooks",
             "restoring torch.nn's global module hooks after a forward"),
    Internal("coo_parts", "torch.Tensor._indices", "restoring sparse COO tensors"),
    Internal("anomaly_switches_watched", "torch.set_anomaly_enabled",
             f"set_detect_anomaly called from forward ({ANOMALY_MODE_IN_FORWARD.id})"),
    Internal("output_tree_spec", "torch.fx.Graph._codegen",
             "functionalize_inplace capturing a forward with nested outputs",
             probe=lambda: hasattr(torch.fx.Graph(), "_codegen")),
    Internal("tree_leaves", "torch.utils._pytree.tree_leaves", "the tensors inside outputs"),
    Internal("functional_arguments_watched", "torch.autograd.functional._grad_preprocess",
             "writes into the arguments of functions given to torch.autograd.functional "
             f"({INPLACE_ON_DIFFERENTIATED_ARGUMENT.id})"),
    Internal("view_base", "torch.Tensor._base",
             "the right derivative where a function given to torch.autograd.functional "
             f"writes into its argument, a view ({INPLACE_ON_DIFFERENTIATED_ARGUMENT.id})"),
    Internal("gradient_edge", "torch.autograd.graph.get_gradient_edge",
             "the right derivative where a function given to torch.autograd.functional "
             f"writes into its argument ({INPLACE_ON_DIFFERENTIATED_ARGUMENT.id})"),
    Internal("autocast_caching", "torch._C._is_any_autocast_enabled",
             f"writes into parameters autocast already cast ({STALE_AUTOCAST_CAST.id})"),
)

_warned = threading.Event()


@functools.lru_cache(maxsize=1)
def _absent() -> tuple[Internal, ...]:
    return tuple(i for i in INTERNALS if not i.present)


def missing() -> list[Internal]:
    """The internals the installed torch lacks (none on torch 2.12, 2.13 and 2.14)."""
    return list(_absent())


def warn_missing() -> None:
    """Warn once per process, at the caller's line, about the internals this torch lacks
    and what the linter therefore does not check."""
    if _warned.is_set():
        return
    _warned.set()
    gone = missing()
    if not gone:
        return
    lost = "; ".join(sorted({i.needed_for for i in gone}))
    names = ", ".join(i.torch_name for i in gone)
    warnings.warn(
        f"fxquant's linter: torch {torch.__version__} lacks {names}, which the linter reads "
        f"to watch a forward; it does not check {lost}. What it reports is still right. "
        "Please use a torch fxquant supports (2.12 to 2.14) for the full check.",
        UserWarning, stacklevel=_user_stacklevel())


def _user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning of the caller point at the innermost frame
    outside fxquant (and outside ``contextlib``, which runs its context managers)."""
    skipped = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
               contextlib.__file__)
    frame: Any = sys._getframe(1)  # (the caller: stacklevel 1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(skipped):
        frame, level = frame.f_back, level + 1
    return level


def instruments_available() -> set[str]:
    """The recording instruments (``"functions"``, ``"dispatch"``, ``"hooks"``) whose
    internals the installed torch has."""
    wanted = {"functions", "dispatch", "hooks"}
    return wanted - {i.instrument for i in missing() if i.instrument}


# -- pytree -------------------------------------------------------------------------------------

#: torch's pytree (no public module in torch 2.12 to 2.14)
tree_leaves: Final = _pytree.tree_leaves
tree_map: Final = _pytree.tree_map
tree_map_only: Final = _pytree.tree_map_only
tree_flatten: Final = _pytree.tree_flatten
tree_unflatten: Final = _pytree.tree_unflatten


# -- the mode stacks ----------------------------------------------------------------------------


def function_mode_stack() -> list[Any]:
    """The torch-function modes of this thread, innermost last."""
    stack = _find("torch.overrides._get_current_function_mode_stack")
    return list(stack()) if stack is not None else []


def dispatch_mode_stack() -> list[Any]:
    """The dispatch modes of this thread, innermost last."""
    stack = _find("torch.utils._python_dispatch._get_current_dispatch_mode_stack")
    return list(stack()) if stack is not None else []


def pop_function_mode() -> None:
    """Pop the innermost torch-function mode (without calling its ``__exit__``)."""
    torch._C._pop_torch_function_stack()


def pop_dispatch_mode() -> None:
    """Pop the innermost dispatch mode (without calling its ``__exit__``)."""
    torch._C._pop_torch_dispatch_stack(None)


def torch_function_disabled() -> contextlib.AbstractContextManager[Any]:
    """A block in which no torch-function mode sees the calls (fxquant's own bookkeeping
    while TorchScript code runs)."""
    disable = getattr(torch._C, "DisableTorchFunction", None)
    return disable() if disable is not None else contextlib.nullcontext()


# -- the saved-tensor-hooks stack ---------------------------------------------------------------


def top_saved_tensors_hooks() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """The ``(pack, unpack)`` pair on top of this thread's saved-tensor-hooks stack."""
    top = torch._C._autograd._top_saved_tensors_default_hooks(True)
    return None if top is None else (top[0], top[1])


def push_saved_tensors_hooks(pack: Callable[[Tensor], Any],
                             unpack: Callable[[Any], Tensor]) -> None:
    """Push a pair as ``torch.autograd.graph.saved_tensors_hooks`` does."""
    torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)


def pop_saved_tensors_hooks() -> None:
    """Pop the pair on top of this thread's saved-tensor-hooks stack."""
    torch._C._autograd._pop_saved_tensors_default_hooks()


_Hooks = tuple[Callable[[Tensor], Any], Callable[[Any], Tensor]]


@contextlib.contextmanager
def saved_tensors_hooks_pushes_wrapped(wrap: Callable[[Callable[[Tensor], Any],
                                                        Callable[[Any], Tensor]], _Hooks]
                                       ) -> Iterator[None]:
    """While the block runs, every pair this thread pushes (``with
    torch.autograd.graph.saved_tensors_hooks(pack, unpack):``, which looks the push up on
    ``torch._C._autograd`` when it enters) is pushed as ``wrap(pack, unpack)`` returns it;
    other threads push theirs as they are. Restored by identity."""
    owner = torch._C._autograd
    before = owner._push_saved_tensors_default_hooks
    thread = threading.get_ident()

    def push(pack: Callable[[Tensor], Any], unpack: Callable[[Any], Tensor]) -> None:
        if threading.get_ident() == thread:
            pack, unpack = wrap(pack, unpack)
        before(pack, unpack)

    owner._push_saved_tensors_default_hooks = push  # type: ignore[assignment]
    try:
        yield
    finally:
        if owner._push_saved_tensors_default_hooks is push:
            owner._push_saved_tensors_default_hooks = before


# -- tensors ------------------------------------------------------------------------------------


def version(t: Tensor) -> int:
    """``t``'s version counter: how many in-place writes autograd has seen (shared by
    every view of the same base)."""
    return int(getattr(t, "_version", 0))


def bump_version(t: Tensor) -> None:
    """Count one in-place write into ``t`` that moved no version counter (foreach ops
    under a dispatch mode)."""
    torch.autograd.graph.increment_version(t)


def storage_id(t: Tensor) -> int:
    """Which storage ``t`` views (its StorageImpl; also for meta and fake tensors, whose
    data pointers are all 0), or 0 where it has none (functional tensors)."""
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return 0
    cdata = getattr(storage, "_cdata", None)
    if cdata is not None:
        return int(cdata)
    try:  # (a torch without it: the data pointer tells real tensors apart)
        return int(storage.data_ptr())
    except (RuntimeError, NotImplementedError):
        return 0


def view_base(t: Tensor) -> Tensor | None:
    """The tensor ``t`` is a view of (the root of a chain of views), None for a tensor
    that is not a view."""
    return t._base


def has_internal_overlap(t: Tensor) -> bool:
    """Whether several elements of ``t`` share one memory location (an ``expand``ed
    tensor): autograd refuses to write into it, fake tensors do not check."""
    check = getattr(torch, "_debug_has_internal_overlap", None)
    return check is not None and check(t) == 1


def is_fake(t: Any) -> bool:
    """Whether ``t`` is a fake tensor (of ``FakeTensorMode``)."""
    return isinstance(t, _fake.FakeTensor)


def coo_parts(t: Tensor) -> tuple[Tensor, Tensor]:
    """The indices and values of a sparse COO tensor as it is (also uncoalesced, where
    ``indices()`` refuses)."""
    return t._indices(), t._values()


def autocast_caching() -> bool:
    """Whether autocast is on for some device with its cast cache on (the default): the
    low-precision cast of a leaf that requires grad is then made once and reused until
    the outermost autocast region exits. (Under a dispatch mode autocast reads as off: ask
    before the call reaches it.)"""
    enabled = getattr(torch._C, "_is_any_autocast_enabled", None)
    return enabled is not None and bool(enabled()) and torch.is_autocast_cache_enabled()


# -- op schemas ---------------------------------------------------------------------------------

#: What the legacy constructor ``torch.Tensor([...])`` reaches a torch-function mode as.
LIFT_FRESH: Final = torch.ops.aten.lift_fresh.default


def written_tensors(func: Any, args: tuple, kwargs: dict) -> list[Tensor]:
    """The tensors the ATen op ``func`` writes into, read from its schema
    (``alias_info.is_write``: ``Tensor(a!)`` arguments)."""
    written = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
            written += [t for t in tree_leaves(value) if isinstance(t, Tensor)]
    return written


def writes_first_argument(packet: Any) -> bool:
    """Whether some overload of the ATen op packet ``packet`` (``torch.ops.aten.add_``)
    writes into its first argument."""
    for overload in packet.overloads():
        arguments = getattr(packet, overload)._schema.arguments
        if arguments and arguments[0].alias_info is not None and arguments[0].alias_info.is_write:
            return True
    return False


def is_data_read(func: Any) -> bool:
    """Whether a torch-function mode's ``func`` is reading ``tensor.data`` (the property
    reaches the mode as its ``__get__``)."""
    owner = getattr(func, "__self__", None)
    return getattr(func, "__name__", None) == "__get__" and getattr(owner, "__name__", "") == "data"


def is_data_write(func: Any) -> bool:
    """Whether a torch-function mode's ``func`` is ``tensor.data = value``."""
    owner = getattr(func, "__self__", None)
    return getattr(func, "__name__", None) == "__set__" and getattr(owner, "__name__", "") == "data"


# -- the autograd graph -------------------------------------------------------------------------


def autograd_nodes(outputs: Any) -> list[Any]:
    """Every node of the autograd graph behind the tensors in ``outputs``, each once.

    The nodes' Python objects are made on demand, and one freed while the graph is walked
    may give its ``id`` to another: every node visited is kept alive until the walk ends.
    A tensor whose node autograd refuses to give (a custom Function's view changed since)
    has none.
    """
    todo: list[Any] = [grad_fn(t) for t in tree_leaves(outputs) if isinstance(t, Tensor)]
    seen: dict[int, Any] = {}
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        todo.extend(next_node for next_node, _ in node.next_functions)
    return list(seen.values())


def grad_fn(t: Tensor) -> Any:
    """``t.grad_fn``, or None where autograd refuses to give it: a view a custom Function
    returned, changed since ('... is a view and its base ... has been modified
    inplace')."""
    try:
        return t.grad_fn
    except RuntimeError as e:
        if AFTER_REFUSED_VIEW_WRITE not in str(e):
            raise
        return None


def is_custom_function_node(node: Any) -> bool:
    """Whether an autograd node is a custom ``autograd.Function``'s backward."""
    return isinstance(node, torch.autograd.function.BackwardCFunction)


def forward_class(node: Any) -> type | None:
    """The ``autograd.Function`` subclass whose backward the node runs (None for other
    nodes)."""
    return getattr(node, "_forward_cls", None) if is_custom_function_node(node) else None


def context_tensors(node: Any) -> list[tuple[str, Tensor]]:
    """The tensors a custom Function's forward kept as attributes of its ``ctx`` (the node
    is the ctx): ``ctx.x = x`` gives ``("x", x)``; torch's own attributes are left out."""
    if not is_custom_function_node(node):
        return []
    return [(key, value) for key, value in list(vars(node).items())
            if isinstance(value, Tensor) and not key.startswith("_")]


def is_function_context(obj: Any) -> bool:
    """Whether ``obj`` is the ``ctx`` of a custom Function's forward."""
    return isinstance(obj, torch.autograd.function.FunctionCtx)


def autograd_node_op(node: Any) -> str:
    """The op an autograd node differentiates, as PyTorch's errors name it:
    ``PowBackward1`` -> ``pow``, ``AddmmBackward0`` -> ``addmm``."""
    name = re.sub(r"Backward\d*$", "", node.name())
    return name[:1].lower() + name[1:]


def in_backward() -> bool:
    """Whether autograd's engine is running a backward node on this thread."""
    return torch._C._current_autograd_node() is not None


# -- entry points the recording replaces while it runs ------------------------------------------


def call_torch_apply(cls: type, *args: Any, **kwargs: Any) -> Any:
    """``torch.autograd.Function.apply`` for the Function ``cls``, as torch defines it: a
    Python classmethod up to torch 2.13, a C classmethod descriptor from 2.14; both bind
    through the descriptor protocol."""
    return vars(torch.autograd.Function)["apply"].__get__(None, cls)(*args, **kwargs)


@contextlib.contextmanager
def custom_function_apply_watched(
        watch: Callable[[type, tuple[Any, ...]], Callable[[Any], None] | None]) -> Iterator[None]:
    """While the block runs, ``watch(cls, args)`` is called on this thread before each
    custom Function's ``apply`` (not while compiling), and what it returns (if not None)
    is called with the output after it. Restored by identity."""
    owner = torch.autograd.Function
    before = vars(owner).get("apply")
    if before is None:
        yield
        return
    thread = threading.get_ident()

    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        watched = threading.get_ident() == thread and not torch.compiler.is_compiling()
        after = watch(cls, args) if watched else None
        out = before.__get__(None, cls)(*args, **kwargs)
        if after is not None:
            after(out)
        return out

    patch: Any = classmethod(apply)
    owner.apply = patch  # type: ignore[method-assign]
    try:
        yield
    finally:
        if vars(owner).get("apply") is patch:
            owner.apply = before  # type: ignore[method-assign]


@contextlib.contextmanager
def reentrant_checkpoint_replaced(run: Callable[..., Any]) -> Iterator[None]:
    """While the block runs, a reentrant ``torch.utils.checkpoint`` segment on this
    thread is ``run(function, preserve_rng_state, *args)`` instead (``checkpoint`` calls
    ``CheckpointFunction.apply(function, preserve_rng_state, *args)``); other threads
    checkpoint through ``CheckpointFunction``'s own ``apply`` where a torch defines one,
    else ``Function.apply``. Restored by identity."""
    owner = getattr(torch.utils.checkpoint, "CheckpointFunction", None)
    if owner is None:
        yield
        return
    before = vars(owner).get("apply")
    thread = threading.get_ident()

    def segment(function: Any, preserve_rng_state: bool, *args: Any) -> Any:
        if threading.get_ident() == thread:
            return run(function, preserve_rng_state, *args)
        if before is not None:
            return before.__get__(None, owner)(function, preserve_rng_state, *args)
        return call_torch_apply(owner, function, preserve_rng_state, *args)

    patch = staticmethod(segment)
    owner.apply = patch
    try:
        yield
    finally:
        if vars(owner).get("apply") is patch:
            if before is None:
                delattr(owner, "apply")
            else:
                owner.apply = before


@contextlib.contextmanager
def functional_arguments_watched(
        watch: Callable[[str, tuple[Any, ...], tuple[Any, ...]], None]) -> Iterator[None]:
    """While the block runs, each function of ``torch.autograd.functional`` (``vjp``,
    ``jvp``, ``jacobian``, ``hessian``, ``vhp``, ``hvp``) called on this thread calls
    ``watch(name, given, arguments)`` before it calls the function it was given: ``given``
    are the tensors it differentiates with respect to, ``arguments`` what that function
    receives for them and what the derivative is taken with respect to. (They all prepare
    those through ``_grad_preprocess``, looked up when they run.) Restored by identity."""
    module = torch.autograd.functional
    before = getattr(module, "_grad_preprocess", None)
    if before is None:
        yield
        return
    thread = threading.get_ident()

    def preprocess(inputs: Any, create_graph: bool, need_graph: bool) -> Any:
        out = before(inputs, create_graph, need_graph)
        if need_graph and threading.get_ident() == thread:
            watch(sys._getframe(1).f_code.co_name, tuple(inputs), tuple(out))
        return out

    module._grad_preprocess = preprocess
    try:
        yield
    finally:
        if getattr(module, "_grad_preprocess", None) is preprocess:
            module._grad_preprocess = before


def gradient_edge(t: Tensor) -> Any:
    """Where ``t``'s gradient enters the autograd graph now (its node and output): a
    derivative taken with respect to it later means ``t`` as it was, also after an in-place
    write gave ``t`` another node."""
    return torch.autograd.graph.get_gradient_edge(t)


@contextlib.contextmanager
def anomaly_switches_watched(on_enable: Callable[[], None]) -> Iterator[None]:
    """While the block runs, ``on_enable()`` is called whenever anomaly mode is switched
    on (``torch.autograd.set_detect_anomaly`` and ``detect_anomaly`` call
    ``torch.set_anomaly_enabled``, looked up on ``torch`` when they run; no mode sees
    them). Restored by identity; the anomaly state itself is the caller's to restore."""
    original = torch.set_anomaly_enabled

    def watch(enabled: bool, check_nan: bool = True) -> None:
        if enabled:
            on_enable()
        original(enabled, check_nan)

    torch.set_anomaly_enabled = watch
    try:
        yield
    finally:
        if torch.set_anomaly_enabled is watch:
            torch.set_anomaly_enabled = original


# -- autograd's error texts ---------------------------------------------------------------------

#: What autograd raises for an in-place write into a leaf that requires grad.
LEAF_WRITE_ERRORS: Final = (
    "a leaf Variable that requires grad is being used in an in-place operation",
    "a view of a leaf Variable that requires grad is being used in an in-place operation",
)
#: What autograd raises in forward for writes it refuses that are not about leaves
#: (a view of split/chunk/unbind or of a custom Function, out= with grad, an expanded
#: tensor).
REFUSED_VIEW_WRITES: Final = (
    "is a view and is being modified inplace",
    "functions with out=... arguments don't support automatic differentiation",
    "more than one element of the written-to tensor refers to a single memory location",
)
#: In the message about a refused view write: the view is a full backward hook's output.
BACKWARD_HOOK_VIEW_MARK: Final = "BackwardHookFunction"
#: In the message about a refused view write: the view is a custom Function's output.
CUSTOM_FUNCTION_VIEW_MARK: Final = "custom Function"
#: What reading a sibling of such a view raises once the write went on anyway.
AFTER_REFUSED_VIEW_WRITE: Final = "its base or another view of its base has been modified inplace"
#: What torch raises for a write into an expanded tensor (raised by fxquant where fake
#: tensors do not check it).
OVERLAP_ERROR: Final = (
    "unsupported operation: more than one element of the written-to tensor refers to a "
    "single memory location. Please clone() the tensor before performing the operation.")


# -- fake tensors -------------------------------------------------------------------------------

#: What a forward that needs values raises on fake tensors.
NEEDS_VALUES: Final[tuple[type[BaseException], ...]] = (
    _fake.DataDependentOutputException, _fake.DynamicOutputShapeException,
    _fake.UnsupportedOperatorException, _fake.UnsupportedFakeTensorException,
    _shapes.GuardOnDataDependentSymNode, NotImplementedError)
#: The logger of fake tensors, which logs every failed meta kernel with its traceback.
FAKE_TENSOR_LOGGER: Final = logging.getLogger("torch._subclasses.fake_tensor")


def new_fake_mode() -> FakeTensorMode:
    """A fake-tensor mode with a shape environment (data-dependent sizes, as ``nonzero``
    gives, become symbolic) that accepts real tensors among fake ones."""
    return FakeTensorMode(shape_env=_shapes.ShapeEnv(), allow_non_fake_inputs=True)


def fake_from_tensor(mode: FakeTensorMode, t: Tensor) -> Tensor:
    """A fake tensor of ``mode`` standing for ``t`` (static shapes)."""
    return mode.from_tensor(t, static_shapes=True)


# -- modules ------------------------------------------------------------------------------------

#: The file of ``nn.Module``'s call machinery (``_call_impl``), whose frames stand between a
#: module's caller and its ``forward``.
MODULE_CALL_FILE: Final = nn.Module.__call__.__code__.co_filename
#: A module's hook tables that run when it is called.
MODULE_HOOK_TABLES: Final = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks",
                             "_backward_hooks")


def module_parameters(module: nn.Module) -> dict[str, Any]:
    """The module's own parameters by name (the dict itself: writes change the module;
    None entries kept)."""
    return module._parameters


def module_buffers(module: nn.Module) -> dict[str, Any]:
    """The module's own buffers by name (the dict itself; also objects that are not
    tensors, such as PyG's ``SparseTensor``, which ``named_buffers`` cannot list)."""
    return module._buffers


def non_persistent_buffers(module: nn.Module) -> set[str]:
    """The names of the module's buffers left out of its ``state_dict`` (the set itself)."""
    return module._non_persistent_buffers_set


def global_module_hooks() -> dict[str, dict[Any, Any]]:
    """``torch.nn``'s global module hook tables (``register_module_forward_hook``, ...)
    by name: the dicts themselves."""
    return {key: value for key, value in vars(_module_globals).items()
            if key.startswith("_global_") and isinstance(value, dict)}


# -- torch.fx -----------------------------------------------------------------------------------


def output_tree_spec(gm: torch.fx.GraphModule) -> Any:
    """The pytree spec a graph's flat outputs are rebuilt with (``make_fx`` graphs), or
    None."""
    info = getattr(gm.graph._codegen, "pytree_info", None)
    return info.out_spec if info is not None else None
