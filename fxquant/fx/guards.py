"""A module that keeps the promise of a traced signature: fixed arguments stay fixed.

When a forward argument can only be traced at one value (PyG's BasicGNN models branch on
``num_sampled_nodes_per_hop is not None`` in Python), the traced graph is specialized to
that value. torch.fx puts ``_assert_is_none`` guards into such graphs, which a torch 2.13
bug turns into a ``KeyError`` in every later trace once such a graph has been pickled and
reloaded. Instead the graph keeps the argument in its signature (so positional calls
line up with the original forward) and passes it to a :class:`FixedArguments` module,
which raises a clear error when a caller gives another value. Being a module call, the
check survives pickling, ``deepcopy`` and ``torch.compile``.

Likewise a dict argument traced with its keys (a heterogeneous GNN's ``x_dict``) is
unrolled into one branch per key: a :class:`StructureGuard` refuses a call whose dicts
have other keys, which the traced model would otherwise ignore or fail on with a bare
``KeyError``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import Tensor, nn

from fxquant.errors import FxquantTypeError, FxquantValueError
from fxquant.fx.structure import Structure, key_text

__all__ = ["FixedArguments", "StructureGuard"]


class FixedArguments(nn.Module):
    """Checks that forward arguments fixed while tracing are called with those values.

    Args:
        fixed (dict): argument name -> the value the graph was traced with.
        model (str): the traced model's class name, for the message.
        unused (iterable, optional): the fixed arguments the traced graph does not read at
            all (for the message).

    Example:
        >>> guard = FixedArguments({"batch_size": None}, "GCN")
        >>> guard(None)
        >>> guard(8)
        Traceback (most recent call last):
        ...
        fxquant.errors.FxquantTypeError: GCN was traced with batch_size=None fixed (tracing cannot follow \
the code that uses it), so the traced model cannot take batch_size=8. Please call it with \
batch_size=None, or trace with concrete_args={'batch_size': 8}.
    """

    _is_impure = True  # torch.fx's dead-code elimination keeps the call

    def __init__(self, fixed: dict[str, Any], model: str = "the model",
                 unused: Iterable[str] = ()) -> None:
        super().__init__()
        self.fixed = dict(fixed)
        self.model = model
        self.unused = frozenset(unused)

    def forward(self, *values: Any) -> None:
        for (name, expected), value in zip(self.fixed.items(), values, strict=True):
            if value is expected:
                continue
            if expected is None or value is None or type(value) is not type(expected) \
                    or value != expected:
                raise FxquantTypeError(self._message(name, expected, value))

    def _message(self, name: str, expected: Any, value: Any) -> str:
        shown = (f"a tensor of shape {tuple(value.shape)}" if isinstance(value, Tensor)
                 else repr(value))
        why = ("the traced graph does not read it, so another value would be silently "
               "ignored" if name in self.unused else "tracing cannot follow the code that "
               "uses it")
        fix = f"Please call it with {name}={expected!r}"
        if not isinstance(value, Tensor):
            fix += f", or trace with concrete_args={{{name!r}: {value!r}}}"
        return (f"{self.model} was traced with {name}={expected!r} fixed ({why}), so the "
                f"traced model cannot take {name}={shown}. {fix}.")

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.fixed.items())


class StructureGuard(nn.Module):
    """Checks that the dict, tuple and list arguments a graph was traced with the structure
    of (see :mod:`fxquant.fx.structure`) come with the same keys and lengths.

    Args:
        structures (dict): argument name -> :class:`~fxquant.fx.structure.Structure`.
        model (str): the traced model's class name, for the message.
        source (str, optional): where the structures came from, for the message.
            (default: ``"example_inputs"``)

    Example:
        >>> guard = StructureGuard({"x_dict": Structure.of({"paper": 0, "author": 0})}, "HGT")
        >>> guard({"paper": torch.zeros(1), "author": torch.zeros(1)})
        >>> guard({"paper": torch.zeros(1)})
        Traceback (most recent call last):
        ...
        fxquant.errors.FxquantValueError: HGT was traced with x_dict having keys \
['paper', 'author'] (from example_inputs); in this call x_dict lacks ['author']. The traced \
graph has one branch per key; please trace again with example inputs that have the keys \
of this call.
    """

    _is_impure = True  # torch.fx's dead-code elimination keeps the call

    def __init__(self, structures: dict[str, Structure], model: str = "the model",
                 source: str = "example_inputs") -> None:
        super().__init__()
        self.structures = dict(structures)
        self.model = model
        self.source = source

    def forward(self, *values: Any) -> None:
        for (name, structure), value in zip(self.structures.items(), values, strict=True):
            problem = structure.mismatch(value, name)
            if problem is not None:
                raise FxquantValueError(
                    f"{self.model} was traced with {_traced(name, structure)} (from "
                    f"{self.source}); in this call {problem}. The traced graph has one branch "
                    "per key; please trace again with example inputs that have the keys of "
                    "this call.")

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={s!r}" for k, s in self.structures.items())


def _traced(name: str, structure: Structure) -> str:
    if structure.kind == "dict":
        return f"{name} having keys {[key_text(k) for k in structure.keys]}"
    return f"{name} a {structure.kind} of {len(structure.items)}"
