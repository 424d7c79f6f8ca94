"""Small helpers over GraphModules shared by the passes and the lints."""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["attr_of", "free_name"]


def attr_of(root: nn.Module, target: str) -> Any:
    """The attribute a ``get_attr``/``call_module`` target names (dotted), or None."""
    obj: Any = root
    for part in target.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def free_name(root: nn.Module, base: str) -> str:
    """``base``, or ``base_1``, ``base_2``, ...: the first that is not an attribute of ``root``.

    Example:
        >>> free_name(nn.Sequential(nn.Linear(2, 2)), "0")
        '0_1'
    """
    name, i = base, 1
    while hasattr(root, name):
        name, i = f"{base}_{i}", i + 1
    return name
