"""A value computed from the last few tensors seen, kept while each tensor is unchanged."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from torch import Tensor

T = TypeVar("T")


class LastInput(Generic[T]):
    """Caches ``compute()`` for the last ``slots`` (tensor, key) pairs passed to :meth:`get`
    (a dataset's features are the same tensor every step; a training step and the
    evaluation after it pass other tensors and keys in between): each held by a weak
    reference and the tensor's version counter, so an in-place change recomputes it (as
    for autograd, a write the counter does not see, through ``x.data`` or a NumPy array
    sharing the memory, is not noticed).

    Example:
        >>> import torch
        >>> rows = LastInput[torch.Tensor]()
        >>> x = torch.ones(2, 3)
        >>> first = rows.get(x, None, lambda: x.sum(1))
        >>> _ = rows.get(torch.zeros(1), None, lambda: None)  # another tensor in between
        >>> rows.get(x, None, lambda: x.sum(1)) is first
        True
        >>> x.mul_(2)  # in place: computed again
        tensor([[2., 2., 2.],
                [2., 2., 2.]])
        >>> rows.get(x, None, lambda: x.sum(1))
        tensor([6., 6.])
    """

    def __init__(self, slots: int = 4) -> None:
        self.slots = slots
        self.clear()

    def clear(self) -> None:
        """Forget every tensor (the next :meth:`get` computes)."""
        self._entries: list[tuple[weakref.ref[Tensor], int, Any, T]] = []

    def get(self, x: Tensor, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()``, or its result for the same unchanged ``x`` and equal ``key``. A
        tensor made under :func:`torch.inference_mode` has no version counter to tell a
        change by: it is computed every time."""
        if x.is_inference():
            return compute()
        for i, (ref, version, k, value) in enumerate(self._entries):
            if ref() is x and version == x._version and k == key:
                if i:  # most recent first
                    self._entries.insert(0, self._entries.pop(i))
                return value
        value = compute()
        live = [e for e in self._entries if e[0]() is not None
                and not (e[0]() is x and (e[1] != x._version or e[2] == key))]  # not stale
        self._entries = [(weakref.ref(x), x._version, key, value), *live][:self.slots]
        return value

    @property
    def value(self) -> T | None:
        """The most recently used value (None when empty)."""
        return self._entries[0][3] if self._entries else None

    @property
    def key(self) -> Any:
        """The most recently used key (None when empty)."""
        return self._entries[0][2] if self._entries else None
