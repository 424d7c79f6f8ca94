"""What a watched forward records: where values came from, what autograd saved, the
writes it did not see, and the calls that wrote in place.

:class:`~fxquant.linter.recorder.Recorder` fills these while the torch modes of
:mod:`fxquant.linter.torch_modes` and the saved-tensor hooks watch a forward; the lint
and the check read them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

import torch
from torch import Tensor

from fxquant.fx.locations import Location
from fxquant.linter.torch_internals import is_fake, storage_id, version

__all__ = [
    "NO_PROVENANCE",
    "OVERWRITING_OPS",
    "ZERO_DERIVATIVE_OPS",
    "AutocastCast",
    "Checkpoint",
    "DifferentiatedArgument",
    "FunctionOutput",
    "HiddenWrite",
    "InplaceCall",
    "Origin",
    "Provenance",
    "SavedTensor",
    "same_storage",
    "same_values",
]

#: ATen ops (packet names) with a float output whose derivative is zero almost everywhere.
ZERO_DERIVATIVE_OPS: Final = frozenset(
    {"floor", "ceil", "round", "trunc", "fix", "sign", "sgn", "floor_divide", "heaviside"}
)
#: In-place ATen ops (packet names) that overwrite values rather than update them.
OVERWRITING_OPS: Final = frozenset({
    "fill_", "zero_", "copy_", "index_put_", "_index_put_impl_", "masked_fill_",
    "masked_scatter_", "index_fill_", "index_copy_", "scatter_", "set_", "uniform_",
    "normal_", "bernoulli_", "random_", "exponential_", "geometric_", "cauchy_",
    "log_normal_", "fill_diagonal_",
})

@dataclass(frozen=True)
class Provenance:
    """Where a tensor's value came from, as far as the checks care (the keys are
    :class:`Origin` s a recorder numbers)."""

    input_dep: bool = False  # derived from example inputs, parameters or buffers
    param_dep: bool = False  # a parameter reaches it through ops that keep gradient
    factories: frozenset[int] = frozenset()  # device-less factory calls it derives from
    zero_grad: frozenset[int] = frozenset()  # zero-derivative ops between params and it
    cut: frozenset[int] = frozenset()  # float -> int/bool steps (comparisons, bit views)


NO_PROVENANCE = Provenance()


@dataclass
class SavedTensor:
    """A tensor autograd saved, with the version it had then."""

    tensor: Tensor
    pack_version: int
    seen_version: int
    op: str
    where: Location | None
    #: ``(code, location, node, aten op)`` of each in-place write that changed its version.
    culprits: list[tuple[str, Location | None, str, str]] = field(default_factory=list)
    #: The same, for writes into its storage that left its version alone (``.data``).
    silent: list[tuple[str, Location | None, str, str]] = field(default_factory=list)
    #: check: its value when saved (what backward is handed)
    copy: Tensor | None = field(default=None, repr=False)
    #: what the autograd node holds for it (dead once the node is freed)
    held: Callable[[], Any] | None = field(default=None, repr=False)
    #: ``"ctx.x"``: a custom Function keeps it as an attribute of its context instead of
    #: through save_for_backward (autograd checks no write into it)
    kept_as: str = ""
    #: the tensor autograd was handed (``tensor`` is a detached alias of it)
    origin: Callable[[], Tensor | None] | None = field(default=None, repr=False)
    #: an output of the op that saved it (autograd re-attaches a saved output to its own
    #: node, so ``detach_()`` of it is legal)
    output: bool = False

    @property
    def in_graph(self) -> bool:
        """Whether an autograd node still holds it (backward may read it)."""
        return self.held is None or self.held() is not None

    def changed_unseen(self) -> bool:
        """Whether its values differ from those saved while its version is the same: a
        write no instrument saw (NumPy, a C extension, a kernel writing into it)."""
        if self.copy is None or version(self.tensor) != self.pack_version:
            return False
        return not same_values(self.tensor, self.copy)


@dataclass
class Checkpoint:
    """A reentrant ``torch.utils.checkpoint`` segment the forward ran."""

    where: Location | None
    preserve_rng_state: bool
    input_requires_grad: bool
    #: its tensor inputs that require grad (backward re-runs it on leaf copies of them)
    inputs: list[Tensor] = field(default_factory=list, repr=False)


def same_values(a: Tensor, b: Tensor) -> bool:
    """Equal element for element, NaN equal to NaN (fake and meta tensors: always)."""
    if a.shape != b.shape or a.dtype != b.dtype or a.layout != torch.strided \
            or a.device.type == "meta" or is_fake(a):
        return a.shape == b.shape
    try:
        return bool(torch.equal(a, b) or (a.is_floating_point() and bool(
            ((a == b) | (a.isnan() & b.isnan())).all())))
    except RuntimeError:
        return True


def same_storage(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` view the same storage."""
    return storage_id(a) == storage_id(b) != 0


@dataclass(frozen=True)
class Origin:
    """An op a recorder numbered: a device-less factory or a zero-derivative op."""

    op: str
    where: Location | None
    node: str


class InplaceCall(NamedTuple):
    """A Python-level call that wrote in place: where, its name (``add_`` also for
    ``x += y``), and whether torch's own code made it (BatchNorm's running statistics)."""

    where: Location | None
    name: str
    by_library: bool
    #: torch made the call because the user asked for it (``F.relu(x, inplace=True)``,
    #: ``nn.ReLU(inplace=True)``), not for its own bookkeeping
    requested: bool = False


@dataclass(eq=False)
class HiddenWrite:
    """A change autograd does not see, made to a tensor that requires grad.

    Whether it makes gradients wrong shows in backward: it does when the gradient reaching
    the changed tensor is non-zero where the values changed (backward then treats the new
    values as if they had been computed by the ops before the write). It does not when
    that gradient is zero there (``attn.data.masked_fill_(mask, -inf)`` before a softmax,
    whose gradient is zero at the filled places):
    :meth:`fxquant.linter.recorder.Recorder.confirm_hidden`.
    """

    code: str
    where: Location | None
    node: str
    how: str  # "through `.data`", "under torch.no_grad()", "through a `.detach()`ed alias"
    target: str  # "parameter 'lin.weight'" or "a tensor that requires grad"
    owners: list[Tensor] = field(default_factory=list, repr=False)
    #: per owner, a mask of the elements the write changed (None: unknown)
    changed: list[Tensor | None] = field(default_factory=list, repr=False)
    reader: str = ""
    read_at: Location | None = None
    #: it makes gradients wrong only where a differentiable op reads the owner after it
    #: (a parameter: ops before the write computed with its old values, which autograd
    #: saved or cast, and its gradient reaches it from them rightly)
    needs_reader: bool = False
    #: how to fix it, where the rule's general hint does not fit
    hint: str = ""


@dataclass(frozen=True)
class FunctionOutput:
    """An output of a custom ``autograd.Function`` that requires grad: autograd forbids
    changing it (or the tensor it views) once returned, and says so only where it is read
    next."""

    tensor: Callable[[], Tensor | None]  # (a weak reference)
    storage: int
    function: str
    where: Location | None


@dataclass(eq=False)
class AutocastCast:
    """The low-precision cast autocast made of a leaf that requires grad (a parameter),
    which it keeps for the rest of the region (``cache_enabled=True``), and the writes
    into that leaf since, which the cast does not see."""

    source: Callable[[], Tensor | None]  # (a weak reference)
    storage: int
    where: Location | None  # the line that made the cast
    #: ``(code, location, node, how)`` of each write into the source since the cast
    writes: list[tuple[str, Location | None, str, str]] = field(default_factory=list)
    reported: bool = False


@dataclass(eq=False)
class DifferentiatedArgument:
    """A tensor a ``torch.autograd.functional`` function (``api``: ``vjp``, ``jacobian``,
    ...) hands the function it was given and differentiates with respect to, called at
    ``where``; the writes the function makes into it (each changes what is differentiated)."""

    argument: Callable[[], Tensor | None]  # (a weak reference)
    storage: int
    version: int
    api: str
    where: Location | None
    #: where the gradient of the tensor given entered the graph (the derivative meant):
    #: its own, or its base's where it is a view; None for a leaf
    edge: Any = None
    #: for a view: its size, strides and offset within its base
    within: tuple[tuple[int, ...], tuple[int, ...], int] | None = None
    #: ``(code, location, node)`` of each write into it
    writes: list[tuple[str, Location | None, str]] = field(default_factory=list)
