"""Helpers for users' own test suites (and fxquant's).

- :func:`devices_touched`: the devices of every tensor an ATen op reads or makes while a
  function runs, e.g. to prove that no constant is pinned to the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["devices_touched"]


class _Devices(TorchDispatchMode):
    """Collects the device of every tensor any ATen op reads or makes."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves((args, kwargs, out)):
            if isinstance(t, torch.Tensor):
                self.seen.add(t.device.type)
        return out


def devices_touched(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> set[str]:
    """Device types of all tensors the ATen ops inside ``fn(*args, **kwargs)`` touch.

    Example:
        >>> import fxquant
        >>> devices_touched(fxquant.truncate, torch.empty(4, 4, device="meta"), 10, "nearest")
        {'meta'}
    """
    with _Devices() as mode:
        fn(*args, **kwargs)
    return mode.seen
