"""Lint from shapes alone: the dynamic lint on fake tensors, without data and compute.

Inputs given as :class:`ShapeSpec` or as ``meta`` tensors become fake tensors
(torch's ``FakeTensorMode`` with a
:class:`~torch.fx.experimental.symbolic_shapes.ShapeEnv`, so data-dependent output sizes
such as ``nonzero`` in PyG's self-loop handling become symbolic sizes); the model's
parameters and buffers are faked on a copy. The forward then runs under the same recording
modes as with real inputs: autograd's version counters, saved-tensor hooks and storage
sharing all exist on fake tensors, so in-place writes into saved values, leaf writes and
hidden writes are found as with data. Nothing runs on real values and nothing of the model
changes.

A forward that needs values (``if x.sum() > 0``, ``.item()`` feeding Python) cannot run on
fake tensors: it is linted on random data instead (floats from a normal distribution,
integers 0, booleans False), and the report says so (FXQ010).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from fxquant.errors import FxquantTypeError, FxquantValueError
from fxquant.linter.report import Finding
from fxquant.linter.rules import (
    NOT_VISIBLE,
)
from fxquant.linter.state import copy_model
from fxquant.linter.torch_internals import (
    FAKE_TENSOR_LOGGER,
    NEEDS_VALUES,
    FakeTensorMode,
    fake_from_tensor,
    is_fake,
    module_buffers,
    module_parameters,
    new_fake_mode,
    tree_leaves,
    tree_map,
)

__all__ = ["NEEDS_VALUES", "ShapeSpec", "fake_copy", "from_shapes", "new_mode", "quiet",
           "random_like", "shape_only"]



@dataclass(frozen=True)
class ShapeSpec:
    """An example input by shape and dtype only, for :func:`fxquant.lint`.

    Example:
        >>> spec = ShapeSpec((2708, 1433))
        >>> spec, ShapeSpec((2, 10556), torch.long).dtype
        (ShapeSpec(shape=(2708, 1433), dtype=torch.float32, requires_grad=False), torch.int64)
    """

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    requires_grad: bool = False

    def __post_init__(self) -> None:
        shape = tuple(self.shape)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise FxquantValueError(f"ShapeSpec: shape must be non-negative ints, got {self.shape!r}")
        if not isinstance(self.dtype, torch.dtype):
            raise FxquantTypeError(f"ShapeSpec: dtype must be a torch.dtype, got {self.dtype!r}")
        if self.requires_grad and not (self.dtype.is_floating_point or self.dtype.is_complex):
            raise FxquantValueError(f"ShapeSpec: only floating inputs can require grad, got {self.dtype}")
        object.__setattr__(self, "shape", shape)


def _is_shape(x: Any) -> bool:
    return isinstance(x, ShapeSpec) or (isinstance(x, Tensor) and x.device.type == "meta")


def _leaves(inputs: tuple[Any, ...]) -> list[Any]:
    found = tree_leaves(inputs, is_leaf=lambda x: isinstance(x, ShapeSpec))
    for obj in inputs:  # PyG Data / HeteroData fields
        for store in getattr(obj, "stores", ()):
            found += list(store.values())
    return found


def shape_only(inputs: tuple[Any, ...]) -> bool:
    """Whether any example input is given by shape only (a ShapeSpec or a meta tensor)."""
    return any(_is_shape(x) for x in _leaves(inputs))


def _convert(inputs: tuple[Any, ...], make: Any) -> tuple[Any, ...]:
    """``inputs`` with each shape (and each meta tensor) replaced by ``make(spec)``."""

    def one(x: Any) -> Any:
        if isinstance(x, ShapeSpec):
            return make(x)
        if isinstance(x, Tensor) and x.device.type == "meta":
            return make(ShapeSpec(tuple(x.shape), x.dtype, x.requires_grad))
        return x

    converted = []
    for obj in inputs:
        stores = getattr(obj, "stores", None)
        if stores is not None:
            obj = copy.copy(obj)
            for key, value in list(obj.items()):
                obj[key] = one(value)
            converted.append(obj)
        else:
            converted.append(tree_map(one, obj, is_leaf=lambda x: isinstance(x, ShapeSpec)))
    return tuple(converted)


def random_like(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """Real inputs of the given shapes: floats randn (private generator), integers 0."""
    g = torch.Generator().manual_seed(0)

    def make(spec: ShapeSpec) -> Tensor:
        if spec.dtype.is_floating_point or spec.dtype.is_complex:
            t = torch.randn(spec.shape, generator=g).to(spec.dtype)
            return t.requires_grad_(spec.requires_grad)
        return torch.zeros(spec.shape, dtype=spec.dtype)

    return _convert(inputs, make)


def fake_copy(model: nn.Module, mode: FakeTensorMode) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers are fake (same names, flags)."""
    fake = copy_model(model)
    swapped: dict[int, nn.Parameter] = {}
    for module in fake.modules():
        parameters, buffers = module_parameters(module), module_buffers(module)
        for name, p in list(parameters.items()):
            if p is not None:
                parameters[name] = swapped[id(p)] = nn.Parameter(
                    fake_from_tensor(mode, p.detach()), requires_grad=p.requires_grad)
        for name, b in list(buffers.items()):
            if isinstance(b, Tensor):
                buffers[name] = fake_from_tensor(mode, b)
            elif b is not None:  # an object holding tensors (a SparseTensor): its copy's
                _fake_attributes(b, mode, depth=3)
    for module in fake.modules():  # an optimizer the model holds (stepped in its forward)
        for value in vars(module).values():
            if isinstance(value, torch.optim.Optimizer):
                for group in value.param_groups:
                    group["params"] = [swapped.get(id(p), p) for p in group["params"]]
                value.state = defaultdict(dict, {swapped.get(id(p), p): v
                                                 for p, v in value.state.items()})
    return fake


def _fake_attributes(obj: Any, mode: FakeTensorMode, depth: int) -> None:
    """Replace the tensors ``obj`` (a copy) keeps in its attributes, ``depth`` levels down."""
    if depth <= 0 or not hasattr(obj, "__dict__") or isinstance(obj, (nn.Module, type)):
        return
    for key, value in list(vars(obj).items()):
        if isinstance(value, Tensor):
            setattr(obj, key, fake_from_tensor(mode, value))
        elif value is not None:
            _fake_attributes(value, mode, depth - 1)


def from_shapes(inputs: tuple[Any, ...], mode: FakeTensorMode) -> tuple[Any, ...]:
    """Fake tensors for every shape in ``inputs`` (other inputs faked as they are)."""

    def make(spec: ShapeSpec) -> Tensor:
        with mode:
            t = torch.empty(spec.shape, dtype=spec.dtype)
        return t.requires_grad_(spec.requires_grad) if spec.requires_grad else t

    converted = _convert(inputs, make)
    return tuple(tree_map(lambda x: fake_from_tensor(mode, x) if isinstance(x, Tensor)
                          and not is_fake(x) else x, c)
                 for c in converted)


def new_mode() -> FakeTensorMode:
    """A fake-tensor mode for one lint."""
    return new_fake_mode()


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence the fake-tensor logger, which logs every failed meta kernel with a traceback
    (the failure itself is reported as a finding)."""
    level = FAKE_TENSOR_LOGGER.level
    FAKE_TENSOR_LOGGER.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        FAKE_TENSOR_LOGGER.setLevel(level)


def needs_values_note(e: BaseException,
                      why: str = "the forward needs values, not only shapes") -> Finding:
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    return Finding(
        NOT_VISIBLE.id, "shapes", None,
        f"{why} ({type(e).__name__}: {first[:160]}); "
        "it was linted on random data instead (floats from a normal distribution, "
        "integers 0)",
        "pass real example inputs for a lint on the data the model sees")


def shapes_note() -> Finding:
    return Finding(
        NOT_VISIBLE.id, "shapes", None,
        "linted from shapes alone, on fake tensors: no data was read and nothing was "
        "computed; findings that depend on values (an all-zero gradient) need real inputs",
        "fxquant.check(model, *inputs) with real inputs runs backward too")
