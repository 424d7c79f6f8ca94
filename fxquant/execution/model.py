"""The converted model: a short program of steps over integer layers and points, and the
report of what runs where.

A :class:`ConvertedModel` runs its :class:`Step` list in order, each reading values by name
and writing one: a point rounds float32 values to codes, a layer takes codes (or floats)
and returns float32, ReLU clamps codes, the output is float32. The program is plain data
(saved as JSON next to the state dict, :func:`fxquant.execution.save`), so a converted model
loads without the Python class of the model it came from.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from tabulate import tabulate
from torch import Tensor, nn

from fxquant.errors import FxquantTypeError, FxquantValueError
from fxquant.execution.aggregate import GraphCache
from fxquant.execution.kernels import QTensor
from fxquant.execution.layers import (
    FLOAT,
    INTEGER,
    RESCALE,
    Context,
    IntLayer,
    Placement,
    as_float,
    relu_codes,
)
from fxquant.execution.quantizer import IntQuantizer

__all__ = ["ConversionReport", "ConvertedModel", "Step"]


@dataclass
class Step:
    """One step of a converted model's program.

    ``op`` is ``"point"`` (round ``args[0]`` with the point ``target``), ``"layer"`` (call
    the converted layer ``target``), ``"relu"``, ``"identity"``, ``"guard"`` (the traced
    model's fixed-argument check), ``"float"`` (a module or function kept in float32:
    ``target`` names the kept module) or ``"output"``. ``args`` and ``kwargs`` name earlier
    values (strings) or hold constants (``{"const": value}``); lists hold either, and
    ``{"tuple": [...]}`` a tuple of them.
    """

    op: str
    target: str
    args: list[Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    out: str = ""


@dataclass
class ConversionReport:
    """What runs where in a converted model: one :class:`Placement` per part, in the
    order the forward runs them.

    ``str(report)`` is a table; :attr:`float32` lists the parts that do not run on
    integers (each with why and how to change it).
    """

    placements: list[Placement]

    @property
    def float32(self) -> list[Placement]:
        return [p for p in self.placements if p.runs == FLOAT]

    @property
    def between_integers(self) -> list[Placement]:
        """The float32 parts with integer parts before and after them."""
        kinds = [p.runs for p in self.placements]
        out = []
        for i, p in enumerate(self.placements):
            if p.runs == FLOAT and INTEGER in kinds[:i] and INTEGER in kinds[i + 1:]:
                out.append(p)
        return out

    def counts(self) -> dict[str, int]:
        return {kind: sum(p.runs == kind for p in self.placements)
                for kind in (INTEGER, RESCALE, FLOAT)}

    def table(self, tablefmt: str = "simple") -> str:
        rows = [[p.where, p.runs, p.how, p.why] for p in self.placements]
        return tabulate(rows, headers=["part", "runs", "how", "why / to change it"],
                        tablefmt=tablefmt)

    def __str__(self) -> str:
        c = self.counts()
        return (f"{c[INTEGER]} integer, {c[RESCALE]} rescale, {c[FLOAT]} float32 parts\n"
                + self.table())

    def to_dict(self) -> list[dict[str, str]]:
        return [asdict(p) for p in self.placements]


class ConvertedModel(nn.Module):
    """A trained transformed model on integer kernels (:func:`fxquant.convert` builds it).

    Called like the transformed model: ``model(x, edge_index, ..., node_ids=None)``, where
    ``x`` may also be codes already rounded by the first point
    (:meth:`quantize_input`), which is how features are stored for deployment. Returns
    float32 values (the last point's codes read with their scale).

    Attributes:
        report (ConversionReport): what runs where.
        points (ModuleDict): the converted top-level points (``IntQuantizer``).
        layers (ModuleDict): the converted layers.
    """

    def __init__(self, inputs: list[tuple[str, Any]], steps: list[Step],
                 points: dict[str, nn.Module], layers: dict[str, nn.Module],
                 kept: dict[str, nn.Module], placements: list[Placement]) -> None:
        super().__init__()
        self.signature = list(inputs)  # (name, default or inspect.Parameter.empty)
        self.steps = list(steps)
        self.points = nn.ModuleDict(points)
        self.layers = nn.ModuleDict(layers)
        self.kept = nn.ModuleDict(kept)
        self.report = ConversionReport(list(placements))
        made_by = {s.out: s for s in self.steps if s.op == "layer"}
        for step in self.steps:  # each layer's output point, which rounds what it returns
            source = made_by.get(step.args[0]) if step.op == "point" and step.args else None
            if source is not None:
                self.layers[source.target].__dict__["then"] = self.points[step.target]
        self.eval()
        self.requires_grad_(False)
        #: every point's codes of the last forward, when recording (see :meth:`record`)
        self.__dict__["_recorded"] = None
        #: what the forward computes, when counted (:func:`fxquant.execution.bit_operations`)
        self.__dict__["_meter"] = None
        #: what each graph's layers prepare once (normalization, edge order), not state
        self.__dict__["_graphs"] = GraphCache()

    # -- calling --------------------------------------------------------------------------

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        names = [n for n, _ in self.signature]
        if len(args) > len(names):
            raise FxquantTypeError(f"the converted model takes at most {len(names)} positional "
                                   f"arguments ({', '.join(names)}), got {len(args)}")
        env: dict[str, Any] = dict(zip(names, args, strict=False))
        for key, value in kwargs.items():
            if key not in names:
                raise FxquantTypeError(f"the converted model got an unexpected argument {key!r}; "
                                       f"its arguments: {names}")
            if key in env:
                raise FxquantTypeError(f"the converted model got two values for {key!r}")
            env[key] = value
        for name, default in self.signature:
            if name not in env:
                if default is inspect.Parameter.empty:
                    raise FxquantTypeError(f"the converted model is missing its argument "
                                           f"{name!r}")
                env[name] = default
        return env

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Inference: no autograd graph is recorded (the model is not trained further).
        Under ``torch.compile`` the model runs eager, with a warning: its steps are read
        from each forward's values as Python numbers."""
        if torch.compiler.is_compiling():
            warnings.warn("fxquant: a converted model runs eager under torch.compile (each "
                          "step's range is read from the values as a Python number); call it "
                          "without compiling", UserWarning, stacklevel=2)
        return self._eager(args, kwargs)

    @torch.compiler.disable(reason="fxquant's converted models run eager")
    def _eager(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with torch.no_grad():
            return self._run(args, kwargs)

    def _run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        env = self._bind(args, kwargs)
        ids = env.get("node_ids")
        if ids is not None and (not isinstance(ids, Tensor) or ids.dim() != 1
                                or ids.is_floating_point() or ids.dtype == torch.bool):
            raise FxquantTypeError("node_ids must be a 1-D integer tensor of global node ids "
                                   "(PyG's batch.n_id)")
        ctx = Context(None if ids is None else ids.to(torch.int64),
                      self.__dict__.get("_meter"), self.__dict__["_graphs"])
        recorded = self.__dict__["_recorded"]
        for step in self.steps:
            args_v = [self._read(env, a) for a in step.args]
            kwargs_v = {k: self._read(env, v) for k, v in step.kwargs.items()}
            if step.op == "point":
                value = args_v[0]
                if isinstance(value, QTensor) and value.point == step.target:
                    out: Any = value  # the features, stored as this point's codes
                else:
                    point = self.points[step.target]
                    out = point(as_float(value), ids=ctx.ids)
                if recorded is not None:
                    recorded[step.target] = out
            elif step.op == "layer":
                out = self.layers[step.target](*args_v, ctx=ctx, **kwargs_v)
            elif step.op == "relu":
                out = relu_codes(args_v[0])
            elif step.op == "identity":
                out = args_v[0]
            elif step.op == "guard":
                self.kept[step.target](*_floats(args_v))
                out = None
            elif step.op == "float":  # (codes in lists too: torch.cat's tensors)
                out = self.kept[step.target](*_floats(args_v), **_floats(kwargs_v))
            elif step.op == "output":
                return _floats(args_v[0])  # (a tuple or dict of outputs too)
            else:  # pragma: no cover (steps are built by convert)
                raise FxquantValueError(f"unknown step {step.op!r}")
            env[step.out] = out
        return None

    @staticmethod
    def _read(env: dict[str, Any], ref: Any) -> Any:
        if isinstance(ref, dict) and "const" in ref:
            return ref["const"]
        if isinstance(ref, dict) and "tuple" in ref:
            return tuple(ConvertedModel._read(env, r) for r in ref["tuple"])
        if isinstance(ref, str):
            return env[ref]
        if isinstance(ref, list):
            return [ConvertedModel._read(env, r) for r in ref]
        return ref

    def point(self, name: str) -> IntQuantizer:
        """The converted top-level point ``name``."""
        found = self.points[name]
        assert isinstance(found, IntQuantizer)
        return found

    @property
    def input_point(self) -> str | None:
        """The point that rounds the model's first input (the features), if any."""
        first = self.signature[0][0] if self.signature else None
        for step in self.steps:
            if step.op == "point" and step.args and step.args[0] == first:
                return step.target
        return None

    def quantize_input(self, x: Tensor, node_ids: Tensor | None = None) -> QTensor:
        """``x`` rounded by the point on the model's first input: the codes features are
        stored as, which the model takes in place of ``x`` (a batch's features: pass its
        ``node_ids`` where the point has per-node widths). The codes are valid for the
        graph they were rounded on: a range taken from the values is this ``x``'s."""
        name = self.input_point
        if name is None:
            raise FxquantValueError("this converted model has no point on its first input, so its "
                                    "features are taken as float32; pass them as they are")
        q = self.points[name](x.to(torch.float32), ids=None if node_ids is None
                              else node_ids.to(torch.int64))
        q.point = name
        return q

    # -- what the last forward rounded ------------------------------------------------------

    def record(self, *args: Any, **kwargs: Any) -> dict[str, QTensor]:
        """Run a forward and return the codes of every point it rounds, by the point's
        module name in the transformed model (``"conv1_quant"``,
        ``"conv1_message_quant"``)."""
        recorded: dict[str, QTensor] = {}
        self.__dict__["_recorded"] = recorded
        for layer in self.layers.values():
            layer.__dict__["recording"] = recorded
        try:
            with torch.no_grad():
                self(*args, **kwargs)
        finally:
            self.__dict__["_recorded"] = None
            for layer in self.layers.values():
                layer.__dict__.pop("recording", None)
        for layer in layer_modules(self).values():
            for name, weight in layer.weight_codes.items():
                recorded[name] = weight.qtensor()
        return recorded

    def extra_repr(self) -> str:
        c = self.report.counts()
        return f"{c[INTEGER]} integer, {c[RESCALE]} rescale, {c[FLOAT]} float32 parts"

    def code(self) -> str:
        """The program, one step per line."""
        lines = []
        for s in self.steps:
            args = ", ".join(map(str, s.args + [f"{k}={v}" for k, v in s.kwargs.items()]))
            lines.append(f"{s.out or '-'} = {s.op}[{s.target}]({args})")
        return "\n".join(lines)


def layer_modules(model: ConvertedModel) -> dict[str, IntLayer]:
    return {k: v for k, v in model.layers.items() if isinstance(v, IntLayer)}


def _floats(value: Any) -> Any:
    """``value`` with every :class:`QTensor` in it (in lists, tuples and dicts too) as its
    float32 values: what a part kept in float32 takes."""
    if isinstance(value, QTensor):
        return as_float(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_floats(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_floats(v) for v in value)
    if isinstance(value, dict):
        return {k: _floats(v) for k, v in value.items()}
    return value
