"""Leaving no trace: what :func:`fxquant.lint`, :func:`fxquant.check` and the symbolic
lint's probes put back after running a user's forward, also when it raises.

Restored by :func:`restored_state`:

- process-wide switches: grad mode, anomaly mode (and its NaN check), the default dtype,
  deterministic-algorithm settings, the CPU RNG state and (when CUDA is initialized) every
  CUDA RNG state, and ``torch.nn``'s global module hooks;
- thread-local stacks: entries a forward pushed onto the saved-tensor-hooks, torch-function
  mode or dispatch mode stacks and left there are popped (fxquant's own entries are
  popped by identity, never "the top");
- the model: every submodule's attributes (a forward that caches, rebinds, registers or
  deletes parameters, buffers, submodules or hooks, or flips ``training``), the storage,
  values, ``requires_grad`` and Python attributes (``w.org = ...``) of every parameter,
  buffer and plain tensor attribute (``self.history += w`` writes into one), and every
  ``.grad`` (the same tensor object, with its values). Sparse tensors (COO, CSR, CSC, BSR,
  BSC) are compared and restored through their index and value tensors; objects kept in
  ``_buffers`` or as attributes that hold tensors (PyG's ``torch_sparse.SparseTensor``
  ``adj_t``) get their attributes and those tensors restored the same way; an optimizer
  kept as an attribute (stepped in forward) gets its per-parameter state back.

Not restored (documented in the README): state outside the model and torch (globals of
the user's modules, files, other processes), inference mode entered and never left, and
what other threads do while a lint runs (they must not run forwards then: tracing and the
anomaly watcher patch process-wide functions under :data:`fxquant.fx.serial.PROCESS_LOCK`).
"""

from __future__ import annotations

import collections
import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from fxquant.errors import FxquantValueError
from fxquant.linter.torch_internals import (
    coo_parts,
    dispatch_mode_stack,
    function_mode_stack,
    global_module_hooks,
    module_buffers,
    module_parameters,
    pop_dispatch_mode,
    pop_function_mode,
    pop_saved_tensors_hooks,
    top_saved_tensors_hooks,
)

__all__ = ["clone_inputs", "components", "copy_model", "held_tensors", "mode_stacks_restored",
           "named_buffers", "refuse_lazy", "restored_state", "snapshot"]

_MUTABLE = (dict, list, set, collections.deque)


def _snapshot_attributes(obj: Any) -> dict[str, Any]:
    """Attributes, with shallow copies of mutable containers (hooks, _parameters, ...)."""
    saved = {}
    for key, value in vars(obj).items():
        saved[key] = (value, copy.copy(value) if isinstance(value, _MUTABLE) else None)
    return saved


def _restore_attributes(obj: Any, saved: dict[str, Any]) -> None:
    current = vars(obj)
    for key in [k for k in current if k not in saved]:
        del current[key]
    for key, (value, contents) in saved.items():
        if contents is not None and not _same_contents(value, contents):
            value.clear()
            if isinstance(value, (list, collections.deque)):
                value.extend(contents)
            else:
                value.update(contents)
        current[key] = value


def _same_contents(a: Any, b: Any) -> bool:
    """Same entries by identity (``==`` on tensors would compare values)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(a[k] is b[k] for k in a)
    if isinstance(a, (list, collections.deque)):
        return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
    return {id(x) for x in a} == {id(x) for x in b}


@contextlib.contextmanager
def mode_stacks_restored() -> Iterator[None]:
    """Pop what a forward pushed onto the thread's mode and saved-tensor-hook stacks and
    left there; fxquant's own entries are handled by whoever pushed them."""
    function_modes = function_mode_stack()
    dispatch_modes = dispatch_mode_stack()
    hooks_top = top_saved_tensors_hooks()
    try:
        yield
    finally:
        pop_saved_tensors_hooks_until(hooks_top)
        while len(function_mode_stack()) > len(function_modes):
            pop_function_mode()
        while len(dispatch_mode_stack()) > len(dispatch_modes):
            pop_dispatch_mode()


def pop_saved_tensors_hooks_until(top: Any, limit: int = 10_000) -> None:
    """Pop saved-tensor hooks until the pair on top is ``top`` (by identity of its hooks)."""
    for _ in range(limit):
        current = top_saved_tensors_hooks()
        if current is None or _same_hooks(current, top):
            return
        pop_saved_tensors_hooks()


def _same_hooks(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return all(x is y for x, y in zip(a, b, strict=True))


@contextlib.contextmanager
def restored_state(model: nn.Module) -> Iterator[None]:
    """Put back everything listed in this module's docstring when the block exits."""
    grad_mode = torch.is_grad_enabled()
    anomaly = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
    default_dtype = torch.get_default_dtype()
    deterministic = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    global_hooks = {k: dict(v) for k, v in global_module_hooks().items()}
    modules = list(model.modules())
    attributes = [(m, _snapshot_attributes(m)) for m in modules]
    tensors: dict[int, tuple[Tensor, Tensor, Tensor, bool, dict[str, Any]]] = {}
    grads: dict[int, tuple[Tensor, Tensor | None, Tensor | None]] = {}
    held: list[Any] = []  # tensors kept inside other objects (a SparseTensor's storage)
    for m in modules:
        members = [*module_parameters(m).values(), *module_buffers(m).values(),
                   *vars(m).values()]
        found = [v for v in members if isinstance(v, Tensor)]
        for obj in members:
            if not isinstance(obj, (Tensor, nn.Module)):
                found += _holders(obj, held)
        for t in found:
            if id(t) not in tensors:
                tensors[id(t)] = (t, t.data, t.detach().clone(), t.requires_grad,
                                  dict(vars(t)))
        for p in module_parameters(m).values():
            if p is not None and id(p) not in grads:
                grad = p.grad
                grads[id(p)] = (p, grad, grad.detach().clone() if grad is not None else None)
    attributes += [(obj, _snapshot_attributes(obj)) for obj in held]
    # an optimizer the model holds (stepped in its forward): its per-parameter state
    optimizers = list({id(o): o for m in modules for o in vars(m).values()
                       if isinstance(o, torch.optim.Optimizer)}.values())
    optimizer_states = [(o, {p: {k: v.clone() if isinstance(v, Tensor) else copy.copy(v)
                                 for k, v in s.items()} for p, s in o.state.items()})
                        for o in optimizers]
    try:
        with mode_stacks_restored():
            yield
    finally:
        for optimizer, state in optimizer_states:
            optimizer.state.clear()
            optimizer.state.update(state)
        torch.set_grad_enabled(grad_mode)
        torch.set_anomaly_enabled(*anomaly)
        torch.set_default_dtype(default_dtype)
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        for key, hooks in global_module_hooks().items():
            if key in global_hooks and hooks != global_hooks[key]:
                hooks.clear()
                hooks.update(global_hooks[key])
        for module, saved in attributes:
            _restore_attributes(module, saved)
        with torch.no_grad():
            for t, data, values, requires_grad, python_attrs in tensors.values():
                if not _same_contents(vars(t), python_attrs):
                    vars(t).clear()
                    vars(t).update(python_attrs)
                if _layout_key(t) != _layout_key(data):
                    t.data = data
                if data.shape != values.shape or data.dtype != values.dtype \
                        or data.layout != values.layout:
                    t.data = values
                elif not _same_bits(data, values):
                    _copy_values(t, data, values)
                if t.requires_grad != requires_grad and t.is_leaf:
                    t.requires_grad_(requires_grad)
            for param, grad, saved_grad in grads.values():
                if param.grad is not grad:
                    param.grad = grad
                if grad is not None and saved_grad is not None and not _same_bits(grad, saved_grad):
                    grad.copy_(saved_grad)


#: How deep :func:`_holders` looks into objects for the tensors they keep.
_HOLDER_DEPTH = 3


def _holders(obj: Any, found: list[Any], depth: int = _HOLDER_DEPTH) -> list[Tensor]:
    """The tensors ``obj`` keeps in its attributes (and in theirs, ``depth`` levels down);
    every object on the way that holds one is appended to ``found`` (its attributes are
    restored too). Containers and modules are not entered: the model's own walk covers
    modules, and a list in an attribute is restored as a list."""
    if depth <= 0 or isinstance(obj, (Tensor, nn.Module, type)) or not hasattr(obj, "__dict__"):
        return []
    try:
        items = list(vars(obj).values())
    except TypeError:
        return []
    tensors = [v for v in items if isinstance(v, Tensor)]
    for value in items:
        if not isinstance(value, (Tensor, nn.Module)):
            tensors += _holders(value, found, depth - 1)
    if tensors and all(obj is not f for f in found):
        found.append(obj)
    return tensors


def components(t: Tensor) -> tuple[Tensor, ...]:
    """The dense tensors a tensor's values live in: itself when strided; the indices and
    values of a sparse COO tensor; the compressed and plain indices and the values of a
    CSR, CSC, BSR or BSC tensor.

    Example:
        >>> coo = torch.sparse_coo_tensor([[0, 1], [1, 0]], [1.0, 2.0], (2, 2))
        >>> [c.tolist() for c in components(coo)]
        [[[0, 1], [1, 0]], [1.0, 2.0]]
    """
    layout = t.layout
    if layout == torch.sparse_coo:
        return coo_parts(t)
    if layout in (torch.sparse_csr, torch.sparse_bsr):
        return (t.crow_indices(), t.col_indices(), t.values())
    if layout in (torch.sparse_csc, torch.sparse_bsc):
        return (t.ccol_indices(), t.row_indices(), t.values())
    return (t,)


def _layout_key(t: Tensor) -> tuple[Any, ...]:
    """Which memory a tensor views (a meta tensor has none to compare; a sparse tensor's
    is that of its index and value tensors)."""
    if t.layout != torch.strided:
        parts = components(t) if t.device.type != "meta" else ()
        return (t.layout, tuple(t.shape), t.dtype, tuple(_layout_key(c) for c in parts))
    if t.device.type == "meta":
        return (tuple(t.shape), t.stride(), t.dtype)
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(),
            t.dtype)


def _copy_values(t: Tensor, data: Tensor, values: Tensor) -> None:
    """Write ``values`` back into ``data`` (``t``'s memory); a sparse tensor whose index
    and value tensors no longer have the saved shapes gets the saved copy instead."""
    if data.layout == torch.strided:
        data.copy_(values)
        return
    mine, saved = components(data), components(values)
    if all(a.shape == b.shape and a.dtype == b.dtype for a, b in zip(mine, saved, strict=True)):
        for a, b in zip(mine, saved, strict=True):
            a.copy_(b)
    else:
        t.data = values


def _same_bits(a: Tensor, b: Tensor) -> bool:
    """Equal bit for bit (NaN payloads included), where ``torch.equal`` says NaN != NaN."""
    if a.shape != b.shape or a.dtype != b.dtype or a.layout != b.layout:
        return False
    if a.device.type == "meta" or b.device.type == "meta":
        return True  # meta tensors have no values to differ in
    if a.layout != torch.strided:
        parts = list(zip(components(a), components(b), strict=True))
        return all(_same_bits(x, y) for x, y in parts)
    if a.is_floating_point() or a.is_complex():
        return torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                           b.contiguous().reshape(-1).view(torch.uint8))
    return torch.equal(a, b)


def refuse_lazy(model: nn.Module, api: str) -> None:
    """A clear error, as :func:`fxquant.transform` gives, for parameters or buffers still
    uninitialized (``GCNConv(-1, 16)``, ``nn.LazyLinear``): they take their shape from the
    first forward, and copying or restoring them fails inside torch. (Buffers torch cannot
    list, such as a ``SparseTensor``, are looked at too.)"""
    lazy = next((name for name, t in (*model.named_parameters(), *named_buffers(model))
                 if isinstance(t, Tensor) and nn.parameter.is_lazy(t)), None)
    if lazy is not None:
        raise FxquantValueError(
            f"fxquant.{api}: the tensor {lazy!r} is not initialized yet (a lazy layer, "
            "e.g. GCNConv(-1, 16) or nn.LazyLinear, takes its shape from the first forward); "
            f"please run the model once on example inputs, then call fxquant.{api}")


def named_buffers(model: nn.Module) -> list[tuple[str, Any]]:
    """``model.named_buffers()``, also for buffers torch cannot list: an object kept in
    ``_buffers`` that is not a tensor (PyG's ``SparseTensor``, as its maintainer advises)
    makes ``named_buffers`` fail on hashing it. Each buffer once, by identity.

    Example:
        >>> m = torch.nn.BatchNorm1d(2)
        >>> [name for name, _ in named_buffers(m)]
        ['running_mean', 'running_var', 'num_batches_tracked']
    """
    seen: set[int] = set()
    found = []
    for prefix, module in model.named_modules():
        for name, value in module_buffers(module).items():
            if value is None or id(value) in seen:
                continue
            seen.add(id(value))
            found.append((f"{prefix}.{name}" if prefix else name, value))
    return found


def held_tensors(obj: Any) -> list[Tensor]:
    """The dense tensors behind a piece of module state: a tensor's :func:`components`, or
    those of every tensor an object such as ``torch_sparse.SparseTensor`` keeps."""
    if isinstance(obj, Tensor):
        return list(components(obj))
    return [c for t in _holders(obj, []) for c in components(t)]


def snapshot(obj: Any) -> Any:
    """A copy of a piece of module state (a tensor, or an object holding tensors) that
    later writes into the original do not change."""
    if isinstance(obj, Tensor):
        return obj.detach().clone()
    try:
        return copy.deepcopy(obj)
    except Exception:  # an object that cannot be copied is compared by its tensors
        return [t.detach().clone() for t in held_tensors(obj)]


_COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def copy_model(model: nn.Module) -> nn.Module:
    """``copy.deepcopy(model)``, also for models holding sparse CSR/CSC/BSR/BSC tensors
    (which ``Tensor.__deepcopy__`` cannot copy: it reads their storage). Each such tensor
    is cloned first and handed to ``deepcopy`` as already copied; aliases stay aliases.

    Example:
        >>> m = torch.nn.Module()
        >>> m.register_buffer("adj", torch.eye(3).to_sparse_csr())
        >>> copy_model(m).adj.layout
        torch.sparse_csr
    """
    memo: dict[int, Any] = {}
    held: list[Any] = []
    for m in model.modules():
        values = [*module_parameters(m).values(), *module_buffers(m).values(),
                  *vars(m).values()]
        found = [v for v in values if isinstance(v, Tensor)]
        for obj in values:
            if not isinstance(obj, (Tensor, nn.Module)):
                found += _holders(obj, held)
        for t in found:
            if t.layout in _COMPRESSED and id(t) not in memo:
                copy_ = t.detach().clone().requires_grad_(t.requires_grad)
                memo[id(t)] = nn.Parameter(copy_, t.requires_grad) \
                    if isinstance(t, nn.Parameter) else copy_
    return copy.deepcopy(model, memo)


def clone_inputs(obj: Any) -> Any:
    """Copies of the example inputs, so a forward that writes into them changes nothing."""
    if isinstance(obj, Tensor):
        copy = obj.detach().clone()
        return copy.requires_grad_(obj.requires_grad) if copy.is_floating_point() else copy
    if isinstance(obj, (list, tuple)):
        items = [clone_inputs(o) for o in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, dict):
        return type(obj)((k, clone_inputs(v)) for k, v in obj.items())
    clone = getattr(obj, "clone", None)
    return clone() if callable(clone) else obj
