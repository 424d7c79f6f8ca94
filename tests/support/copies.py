"""Copies of a transformed model the ways a user makes them."""

from __future__ import annotations

import copy
import io
import pickle
from typing import Any

import torch


def python_copy(obj: Any, route: str) -> Any:
    """``obj`` copied by ``route``: ``"deepcopy"``, ``"pickle"`` or ``"torch.save"`` (a
    GraphModule is rebuilt from its code by the last two)."""
    if route == "deepcopy":
        return copy.deepcopy(obj)
    if route == "pickle":
        return pickle.loads(pickle.dumps(obj))
    if route == "torch.save":
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=False)
    raise ValueError(f"unknown route {route!r}")
