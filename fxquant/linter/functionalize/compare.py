"""How a candidate is compared with the original: values within tolerance (dense, sparse,
or held by an object such as a ``SparseTensor``), and the random-weighted loss whose
gradients are compared."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fxquant.linter.functionalize.outcome import FunctionalizeError
from fxquant.linter.state import components, held_tensors
from fxquant.linter.torch_internals import tree_leaves

__all__ = ["close", "output_weights", "weighted_loss"]

def output_weights(out: Any) -> list[Tensor | None]:
    g = torch.Generator().manual_seed(20261130)
    return [torch.randn(t.shape, generator=g, dtype=t.dtype).to(t.device)
            if isinstance(t, Tensor) and t.is_floating_point() else None
            for t in tree_leaves(out)]


def weighted_loss(out: Any) -> Tensor:
    """A random-weighted sum of the outputs, so no gradient cancels by symmetry."""
    terms = [(t * w).sum() for t, w in zip(tree_leaves(out), output_weights(out), strict=True)
             if w is not None and isinstance(t, Tensor) and t.requires_grad]
    if not terms:
        raise FunctionalizeError("the model returned no floating-point output that requires "
                                 "grad, so there is no gradient to keep intact")
    return torch.stack(terms).sum()


def close(a: Any, b: Any, rtol: float, atol: float) -> bool:
    """Equal within tolerance: dense tensors by value, sparse ones by their index and
    value tensors, objects holding tensors (a ``SparseTensor``) by the tensors they hold."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        if isinstance(a, Tensor) or (type(a) is not type(b) and not isinstance(b, list)):
            return False
        mine, theirs = held_tensors(a), b if isinstance(b, list) else held_tensors(b)
        return len(mine) == len(theirs) and all(
            close(x, y, rtol, atol) for x, y in zip(mine, theirs, strict=True))
    if a.layout != b.layout or a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.layout != torch.strided:
        if a.layout == torch.sparse_coo:
            a, b = a.detach().coalesce(), b.detach().coalesce()
        return all(close(x, y, rtol, atol)
                   for x, y in zip(components(a), components(b), strict=True))
    return torch.allclose(a.detach().double(), b.detach().double(), rtol=rtol, atol=atol,
                          equal_nan=True)
