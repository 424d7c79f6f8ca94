"""What a symbolic trace cannot see: the keys of the dicts a forward takes and returns.

Heterogeneous GNNs pass dicts keyed by node type and edge type
(``forward(self, x_dict, edge_index_dict)``, PyG's ``HeteroConv``, ``HGTConv``). A
symbolic trace gives each argument one proxy, and a proxy cannot be iterated, so
``x_dict.items()`` fails. Given the keys, the tracer hands the forward a real dict whose
values are traced ``x_dict[key]`` lookups, and every loop over it unrolls into one branch
per key, as PyG's ``to_hetero`` builds its graphs (a getter per node and edge type).

A :class:`Structure` is the shape of one value (a dict with its keys, a tuple, a list, a
traced value, or :obj:`None`); :class:`ExampleStructure` holds those of the forward's
arguments and of what leaf layers return (``HGTConv`` returns a dict, which the trace
records as one call). Both come from example inputs (:meth:`ExampleStructure.from_example`,
which runs the model once) or from torch.fx's own spelling,
``concrete_args={"x_dict": {"paper": PH, "author": PH}}``, and both are JSON-able, so a
saved model can be traced again without data.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fxquant.errors import FxquantTypeError, FxquantValueError
from fxquant.fx.module_state import ModuleState

__all__ = ["ExampleStructure", "Structure", "as_one_value", "has_placeholders", "key_text"]

#: A dict key as PyG spells node and edge types: ``"paper"``, ``("author", "writes", "paper")``.
Key = str | int | tuple[Any, ...]

def key_text(key: Any) -> str:
    """A key as users read it: ``author__writes__paper`` for an edge type (PyG's spelling)."""
    return "__".join(map(str, key)) if isinstance(key, tuple) else str(key)


@dataclass(frozen=True)
class Structure:
    """The shape of one value a forward takes or a leaf layer returns.

    ``kind`` is ``"dict"`` (``keys`` and ``items`` in order), ``"tuple"`` or ``"list"``
    (``items``), ``"value"`` (a tensor or anything else traced as one value) or ``"none"``
    (:obj:`None`, kept as a constant so that ``if v is not None`` takes the branch it takes
    on the example).

    Example:
        >>> s = Structure.of({"paper": torch.zeros(2), ("a", "to", "b"): torch.zeros(2, 1)})
        >>> s
        Structure(dict: 'paper', 'a__to__b')
        >>> Structure.from_json(s.to_json()) == s
        True
    """

    kind: str
    keys: tuple[Key, ...] = ()
    items: tuple[Structure, ...] = ()

    @classmethod
    def of(cls, value: Any) -> Structure:
        """The structure of an example value: dicts (any ``dict`` subclass), plain tuples
        and lists are opened; a named tuple and everything else is one value."""
        if value is None:
            return cls("none")
        if isinstance(value, dict):
            return cls("dict", tuple(value), tuple(cls.of(v) for v in value.values()))
        if type(value) in (tuple, list):
            return cls(type(value).__name__, (), tuple(cls.of(v) for v in value))
        return cls("value")

    @classmethod
    def of_placeholders(cls, value: Any) -> Structure:
        """The structure torch.fx's ``concrete_args`` spell with ``PH``: every ``PH`` a
        traced value; any other leaf is refused (a value fixed inside a dict of traced ones
        would not be checked when the model runs)."""
        if _is_ph(value):
            return cls("value")
        if isinstance(value, dict):
            return cls("dict", tuple(value), tuple(cls.of_placeholders(v) for v in value.values()))
        if type(value) in (tuple, list):
            return cls(type(value).__name__, (), tuple(cls.of_placeholders(v) for v in value))
        raise FxquantValueError(
            f"concrete_args: a structure of traced values holds {value!r}; torch.fx.PH marks "
            "each traced value, e.g. concrete_args={'x_dict': {'paper': PH, 'author': PH}}. "
            "Please mark every value with PH, or pass example_inputs=(...) instead.")

    @property
    def is_leaf(self) -> bool:
        return self.kind in ("value", "none")

    def build(self, value: Any, getitem: Callable[[Any, Any], Any]) -> Any:
        """The Python value the traced forward sees: containers rebuilt, each traced leaf
        ``getitem(parent, key)`` (a proxy), each ``none`` leaf :obj:`None`."""
        if self.kind == "none":
            return None
        if self.kind == "value":
            return value
        keys = self.keys if self.kind == "dict" else range(len(self.items))
        built = [s.build(None if s.kind == "none" else getitem(value, k), getitem)
                 for k, s in zip(keys, self.items, strict=True)]
        if self.kind == "dict":
            return _TracedDict(zip(self.keys, built, strict=True))
        return tuple(built) if self.kind == "tuple" else list(built)

    def mismatch(self, value: Any, where: str) -> str | None:
        """What differs between ``value`` and this structure (keys, lengths, container
        types), said of ``where`` (``"x_dict lacks ['author']"``), or :obj:`None`. Traced
        leaves are not checked: a traced value may be anything."""
        if self.kind == "none":
            return None if value is None else f"{where} is a {type(value).__name__}, not None"
        if self.kind == "value":
            return None
        if self.kind == "dict":
            if not isinstance(value, Mapping):
                return f"{where} is a {type(value).__name__}, not a dict"
            expected, got = set(self.keys), set(value.keys())
            if expected != got:
                missing = [key_text(k) for k in self.keys if k not in got]
                extra = [key_text(k) for k in value if k not in expected]
                return (f"{where} " + (f"lacks {missing}" if missing else "")
                        + (" and " if missing and extra else "")
                        + (f"has keys it was not traced with: {extra}" if extra else ""))
            pairs: Any = ((f"{where}[{k!r}]", s, value[k])
                          for k, s in zip(self.keys, self.items, strict=True))
        else:
            if type(value) not in (tuple, list) or len(value) != len(self.items):
                got_text = (f"a {type(value).__name__} of {len(value)}"
                            if isinstance(value, (tuple, list)) else f"a {type(value).__name__}")
                return f"{where} is {got_text}, not a {self.kind} of {len(self.items)}"
            pairs = ((f"{where}[{i}]", s, v)
                     for i, (s, v) in enumerate(zip(self.items, value, strict=True)))
        for inner, s, v in pairs:
            found = s.mismatch(v, inner)
            if found is not None:
                return found
        return None

    # -- JSON ------------------------------------------------------------------------------

    def to_json(self) -> Any:
        """``"value"``, ``"none"``, ``{"dict": [[key, child], ...]}``, ``{"tuple": [...]}``
        or ``{"list": [...]}``; tuple keys are written as lists."""
        if self.is_leaf:
            return self.kind
        if self.kind == "dict":
            return {"dict": [[_key_to_json(k), s.to_json()]
                             for k, s in zip(self.keys, self.items, strict=True)]}
        return {self.kind: [s.to_json() for s in self.items]}

    @classmethod
    def from_json(cls, data: Any) -> Structure:
        """The inverse of :meth:`to_json`; a malformed entry is a ValueError naming it."""
        if data in ("value", "none"):
            return cls(data)
        if isinstance(data, dict) and len(data) == 1:
            (kind, children), = data.items()
            if kind == "dict" and isinstance(children, list) and all(
                    isinstance(c, list) and len(c) == 2 for c in children):
                return cls("dict", tuple(_key_from_json(k) for k, _ in children),
                           tuple(cls.from_json(s) for _, s in children))
            if kind in ("tuple", "list") and isinstance(children, list):
                return cls(kind, (), tuple(cls.from_json(s) for s in children))
        raise FxquantValueError(f"not a structure written by fxquant: {data!r}")

    def __repr__(self) -> str:
        if self.is_leaf:
            return f"Structure({self.kind})"
        if self.kind == "dict":
            return f"Structure(dict: {', '.join(repr(key_text(k)) for k in self.keys)})"
        return f"Structure({self.kind} of {len(self.items)})"


class _TracedDict(dict[Any, Any]):
    """A plain dict to the forward's code. Being a subclass, torch.fx's pytree handling
    treats it as one value, so the argument stays one placeholder (the graph keeps the
    forward's signature instead of one flattened argument per leaf)."""


class _OneDict(dict[Any, Any]):
    """A dict fixed in ``concrete_args``, that torch.fx's pytree handling leaves whole."""


class _OneList(list[Any]):
    """A list fixed in ``concrete_args``, left whole (see :class:`_OneDict`)."""


class _OneTuple(tuple[Any, ...]):
    """A tuple fixed in ``concrete_args``, left whole (see :class:`_OneDict`)."""


def as_one_value(value: Any) -> Any:
    """``value``, where it is a dict, list or tuple, as an equal one that torch.fx does not
    flatten: a container fixed in ``concrete_args`` would otherwise make torch.fx generate a
    forward that flattens its arguments, which stops being valid code once a pass adds an
    argument (:func:`fxquant.transform` adds ``node_ids``)."""
    if isinstance(value, dict) and not isinstance(value, _OneDict):
        return _OneDict(value)
    if type(value) is list:
        return _OneList(value)
    if type(value) is tuple:
        return _OneTuple(value)
    return value


def _is_ph(value: Any) -> bool:
    """torch.fx's ``PH`` marker, or an instance of its class (which carries metadata)."""
    return isinstance(value, type(torch.fx.PH))


def has_placeholders(value: Any) -> bool:
    """Whether a ``concrete_args`` value holds torch.fx's ``PH`` markers (a structure of
    traced values) rather than a value to fix."""
    if _is_ph(value):
        return True
    if isinstance(value, dict):
        return any(has_placeholders(v) for v in value.values())
    if type(value) in (tuple, list):
        return any(has_placeholders(v) for v in value)
    return False


def _key_to_json(key: Any) -> Any:
    if isinstance(key, tuple):
        return [_key_to_json(k) for k in key]
    if isinstance(key, (str, int)) and not isinstance(key, bool):
        return key
    raise FxquantValueError(f"a dict key of type {type(key).__name__} ({key!r}) cannot be "
                            "saved; fxquant saves str, int and tuple keys (PyG's node and "
                            "edge types)")


def _key_from_json(data: Any) -> Any:
    if isinstance(data, list):
        return tuple(_key_from_json(k) for k in data)
    if isinstance(data, (str, int)) and not isinstance(data, bool):
        return data
    raise FxquantValueError(f"not a dict key written by fxquant: {data!r}")


@dataclass
class ExampleStructure:
    """The structures a trace needs: of the forward's arguments (by name), and of what
    each leaf module returns on each of its calls (by qualified name, in call order;
    :obj:`None` where a call returns one value).

    Args:
        inputs (dict, optional): argument name -> :class:`Structure`. (default: empty)
        outputs (dict, optional): qualified module name -> one entry per call.
            (default: empty)
        source (str, optional): where the structures came from, for messages.
            (default: ``"example_inputs"``)
    """

    inputs: dict[str, Structure] = field(default_factory=dict)
    outputs: dict[str, list[Structure | None]] = field(default_factory=dict)
    source: str = "example_inputs"

    def __bool__(self) -> bool:
        return bool(self.inputs) or bool(self.outputs)

    @classmethod
    def from_example(cls, model: nn.Module, example_inputs: Any,
                     is_leaf: Callable[[nn.Module, str], bool]) -> ExampleStructure:
        """Run ``model`` once on ``example_inputs`` (evaluation mode, no gradient, the
        random state and every tensor of the model put back after) and record the
        structures of its container arguments and of what its leaf modules return.

        Args:
            model (torch.nn.Module): the model.
            example_inputs (tuple): forward's positional arguments, as
                ``torch.ao.quantization.quantize_fx.prepare_fx`` takes them.
            is_leaf (callable): ``is_leaf(module, qualified_name)``, the tracer's.
        """
        if not isinstance(example_inputs, (tuple, list)):
            raise FxquantTypeError(
                "example_inputs must be a tuple of forward's positional arguments, e.g. "
                "example_inputs=(data.x_dict, data.edge_index_dict); got "
                f"{type(example_inputs).__name__}")
        try:
            bound = inspect.signature(model.forward).bind(*example_inputs)
        except TypeError as e:
            raise FxquantTypeError(
                f"example_inputs do not fit {type(model).__name__}.forward: {e}; please pass "
                "its positional arguments as a tuple") from e
        inputs = {name: Structure.of(value) for name, value in bound.arguments.items()
                  if not Structure.of(value).is_leaf}
        outputs: dict[str, list[Structure | None]] = {}
        names = {id(m): name for name, m in reversed(list(model.named_modules()))}
        hooks = []
        # (a module inside a leaf never reaches the trace; only the outermost leaves count)
        leaves = _outermost(model, is_leaf)

        def record(module: nn.Module, args: Any, output: Any) -> None:
            name = names[id(module)]
            s = Structure.of(output)
            outputs.setdefault(name, []).append(None if s.kind == "value" else s)

        for m in leaves:
            hooks.append(m.register_forward_hook(record))
        state = ModuleState(model, keep=("training",))
        modes = {name: m.training for name, m in model.named_modules()}
        try:
            model.eval()
            with torch.no_grad(), torch.random.fork_rng(devices=_devices(model)):
                model(*example_inputs)
        finally:
            for h in hooks:
                h.remove()
            for name, m in model.named_modules():
                m.training = modes.get(name, m.training)
            state.restore()
        outputs = {k: v for k, v in outputs.items() if any(s is not None for s in v)}
        return cls(inputs, outputs)

    @classmethod
    def from_concrete_args(cls, concrete_args: Mapping[str, Any]) -> ExampleStructure:
        """The structures torch.fx's ``PH`` spells in ``concrete_args``."""
        return cls({name: Structure.of_placeholders(v) for name, v in concrete_args.items()
                    if has_placeholders(v)}, {}, source="concrete_args")

    def output_of(self, qualname: str, call: int) -> Structure | None:
        """What call number ``call`` (from 0) of leaf ``qualname`` returned, if a container."""
        calls = self.outputs.get(qualname, [])
        return calls[call] if call < len(calls) else None

    def to_json(self) -> dict[str, Any]:
        return {"inputs": {k: s.to_json() for k, s in self.inputs.items()},
                "outputs": {k: [None if s is None else s.to_json() for s in v]
                            for k, v in self.outputs.items()},
                "source": self.source}

    @classmethod
    def from_json(cls, data: Any) -> ExampleStructure:
        if not isinstance(data, dict) or not isinstance(data.get("inputs"), dict) \
                or not isinstance(data.get("outputs"), dict):
            raise FxquantValueError(f"not structures written by fxquant: {data!r}")
        outputs = {}
        for k, calls in data["outputs"].items():
            if not isinstance(calls, list):
                raise FxquantValueError(f"not structures written by fxquant: {calls!r}")
            outputs[k] = [None if c is None else Structure.from_json(c) for c in calls]
        return cls({k: Structure.from_json(v) for k, v in data["inputs"].items()}, outputs,
                   str(data.get("source", "example_inputs")))


def _outermost(model: nn.Module, is_leaf: Callable[[nn.Module, str], bool]) -> list[nn.Module]:
    """The leaf modules a trace of ``model`` reaches (not those inside another leaf)."""
    found: list[nn.Module] = []

    def walk(module: nn.Module, prefix: str) -> None:
        for name, child in module.named_children():
            qualname = f"{prefix}.{name}" if prefix else name
            if is_leaf(child, qualname):
                found.append(child)
            else:
                walk(child, qualname)

    walk(model, "")
    return found


def _devices(model: nn.Module) -> list[int]:
    """CUDA devices the model's tensors live on (whose random state fork_rng keeps)."""
    return sorted({t.device.index or 0 for t in (*model.parameters(), *model.buffers())
                   if t.device.type == "cuda"})
