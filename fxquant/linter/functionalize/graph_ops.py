"""What the rewritten graphs call: writes made on copies, views written back into their
base and read again from it, and values detached as ``torch.no_grad()`` code computes
them.

Each function records itself when called with proxies: a GraphModule is traced again when
it is unpickled, and these calls stay calls.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

import torch
from torch import Tensor

from fxquant.linter.functionalize.outcome import FunctionalizeError
from fxquant.linter.torch_internals import storage_id, tree_flatten, tree_leaves, tree_map_only

__all__ = ["NOT_A_VIEW", "call_on_copy", "copy_functional", "gather_view", "inplace_on_copy",
           "keep_dtype", "scatter_view", "setitem_on_copy", "view_index", "without_grad"]

def _records_itself(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Called with proxies (a GraphModule is traced again when it is unpickled), record a
    call of ``fn`` instead of running it."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        proxy = next((a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.fx.Proxy)),
                     None)
        if proxy is not None:
            return proxy.tracer.create_proxy("call_function", wrapper, args, kwargs)
        return fn(*args, **kwargs)

    return wrapper


@_records_itself
def setitem_on_copy(x: Tensor, index: Any, value: Any) -> Tensor:
    """``x[index] = value`` on a copy of ``x``; the copy."""
    out = x.clone()
    out[index] = value
    return out


@_records_itself
def inplace_on_copy(x: Tensor, method: str, *args: Any, **kwargs: Any) -> Tensor:
    """``x.<method>(*args)`` (an in-place method) on a copy of ``x``; the copy."""
    out = x.clone()
    getattr(out, method)(*args, **kwargs)
    return out


@_records_itself
def call_on_copy(function: Callable[..., Any], x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """``function(x, *args)`` (which writes into ``x``) on a copy of ``x``; the copy."""
    out = x.clone()
    function(out, *args, **kwargs)
    return out


@_records_itself
def keep_dtype(new: Any, old: Any) -> Any:
    """``new`` in ``old``'s dtype, as the in-place op it replaces would have kept it."""
    if isinstance(new, Tensor) and isinstance(old, Tensor) and new.dtype != old.dtype:
        return new.to(old.dtype)
    return new


_INDEX_CACHE: OrderedDict[tuple[Any, ...], Tensor] = OrderedDict()
_INDEX_CACHE_SIZE: Final = 64


def _positions(t: Tensor) -> Tensor:
    """The storage offset of each element of ``t`` (int64, ``t``'s shape)."""
    pos = torch.full((), int(t.storage_offset()), dtype=torch.long, device=t.device)
    for dim, (size, stride) in enumerate(zip(t.shape, t.stride(), strict=True)):
        shape = [1] * t.dim()
        shape[dim] = size
        pos = pos + (torch.arange(size, device=t.device) * stride).view(shape)
    return pos.expand(t.shape)


def _local_index(parent: Tensor, child: Tensor) -> Tensor:
    """For each element of ``child`` (a view of ``parent``), its flat index in ``parent``."""
    key = (tuple(parent.shape), parent.stride(), parent.storage_offset(), tuple(child.shape),
           child.stride(), child.storage_offset(), parent.device)
    found = _INDEX_CACHE.get(key)
    if found is not None and not (found.is_inference() and not torch.is_inference_mode_enabled()):
        _INDEX_CACHE.move_to_end(key)
        return found
    rel = _positions(child) - int(parent.storage_offset())
    dims = sorted((d for d in range(parent.dim()) if parent.shape[d] != 1),  # size 1: coord 0
                  key=lambda d: -parent.stride()[d])
    flat = torch.zeros_like(rel)
    contiguous = [math.prod(parent.shape[d + 1:]) for d in range(parent.dim())]
    rest = rel
    for d in dims:
        stride = parent.stride(d)
        coord = rest // stride if stride else torch.zeros_like(rest)
        rest = rest - coord * stride if stride else rest
        if bool((coord >= parent.shape[d]).any()) or bool((coord < 0).any()):
            raise FunctionalizeError("a view reaches outside the tensor it was written back into")
        flat = flat + coord * contiguous[d]
    if bool(rest.ne(0).any()):
        raise FunctionalizeError("a view does not line up with the tensor it views")
    if torch.is_inference_mode_enabled():
        return flat  # an inference tensor cannot serve a later training step
    _INDEX_CACHE[key] = flat
    if len(_INDEX_CACHE) > _INDEX_CACHE_SIZE:
        _INDEX_CACHE.popitem(last=False)
    return flat


class _NotAView:
    """The index of a value that is not a view of the written base (its op copied)."""

    def __repr__(self) -> str:
        return "NOT_A_VIEW"


NOT_A_VIEW: Final = _NotAView()


def _shares_memory(a: Tensor, b: Tensor) -> bool:
    return storage_id(a) == storage_id(b) != 0


@_records_itself
def view_index(parent: Any, child: Any, parent_index: Any) -> Any:
    """Flat indices into the written-back base of each element of ``child``, a value
    computed from ``parent`` by an op that may return a view (:data:`NOT_A_VIEW` where it
    did not: ``reshape`` that copied, advanced indexing). ``parent_index`` is the same for
    ``parent`` (None: ``parent`` is the base itself)."""

    def one(c: Tensor) -> Tensor | _NotAView:
        if parent_index is NOT_A_VIEW or not isinstance(parent, Tensor) \
                or not _shares_memory(parent, c):
            return NOT_A_VIEW
        local = _local_index(parent, c)
        return local if parent_index is None else parent_index.reshape(-1)[local]

    return tree_map_only(Tensor, one, child)


@_records_itself
def scatter_view(base: Tensor, index: Tensor | _NotAView, value: Tensor) -> Tensor:
    """``base`` with the elements a view covered (``index``) replaced by ``value``."""
    if index is None:  # the view is the base itself
        return value.to(base.dtype).expand(base.shape)
    if not isinstance(index, Tensor):
        return base
    flat = base.reshape(-1).index_put((index.reshape(-1),),
                                      value.to(base.dtype).expand(index.shape).reshape(-1))
    return flat.view(base.shape)


@_records_itself
def gather_view(base: Tensor, index: Any, old: Any) -> Any:
    """The values a view of ``base`` shows after ``base`` changed (``old`` where the op
    that made it copied instead)."""
    if index is None:
        return base
    if isinstance(old, Tensor):
        return base.reshape(-1)[index] if isinstance(index, Tensor) else old
    flat_old, spec = tree_flatten(old)
    flat_index = tree_leaves(index)
    if len(flat_index) != len(flat_old):
        return old
    return spec.unflatten([gather_view(base, i, o) if isinstance(o, Tensor) else o
                           for i, o in zip(flat_index, flat_old, strict=True)])


@_records_itself
def without_grad(value: Any) -> Any:
    """``value`` as code under ``torch.no_grad()`` computes it: its tensors detached."""
    return tree_map_only(Tensor, lambda t: t.detach() if t.requires_grad else t, value)


@_records_itself
def copy_functional(self: Tensor, src: Tensor) -> Tensor:
    """What ``aten.copy`` (functional ``copy_``) computes, with a derivative for ``src``."""
    return src.to(dtype=self.dtype, device=self.device).expand(self.shape).clone()
