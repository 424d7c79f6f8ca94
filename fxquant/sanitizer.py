"""Run-time autograd checks: run the real forward and watch what it does.

Symbolic tracing cannot see ``x *= y`` (it records an out-of-place ``mul``), ``x[idx] = v``
(it raises), factory calls (they become constants) or ``.data`` (it looks like
``.detach()``). Here the forward runs for real, under

- a :class:`~torch.overrides.TorchFunctionMode`, which sees each call as written (keyword
  arguments, ``.data`` access, the legacy ``torch.Tensor([...])`` constructor) and takes the
  user's source line from the Python stack, including frames of helper functions;
- a :class:`~torch.utils._python_dispatch.TorchDispatchMode`, which sees every ATen op and
  recognizes writes from the op schema (``alias_info.is_write``), and follows where each
  tensor came from (inputs, parameters, device-less factories, zero-derivative ops);
- :func:`torch.autograd.graph.saved_tensors_hooks`, which record every tensor autograd saves,
  with its version counter and the op and line that saved it. Which op saves what is
  therefore observed, never guessed.

An in-place op is the culprit when a saved tensor's version changes during it; the op
that saved the tensor is the victim (the one ``set_detect_anomaly`` would name).

:func:`check` also runs backward. While saved-tensor hooks are installed autograd does not
raise on a modified saved tensor (it silently uses the new values), so each pack keeps a
copy and each unpack compares versions, hands back the copy, and lets backward finish.

Nothing is left behind: modes, hooks, anomaly and grad mode, the RNG state, and the
model's parameters, buffers and ``.grad`` are restored, also when the model raises.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import re
import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch
import torch_geometric
from torch import Tensor, nn
from torch.fx import GraphModule, Interpreter, Node
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from fxquant.report import Finding, LintReport

__all__ = ["check", "lint_dynamic"]

# Frames in these packages are library code: a finding points at the user's line that
# called into them.
_LIBRARY_DIRS = (
    *(os.path.dirname(m.__file__) + os.sep for m in (torch, torch_geometric) if m.__file__),
    os.path.dirname(__file__) + os.sep,
)
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
_PURELIB = sysconfig.get_paths()["purelib"] + os.sep

#: ATen ops (packet names) with a float output whose derivative is zero almost everywhere.
ZERO_DERIVATIVE_OPS = frozenset(
    {"floor", "ceil", "round", "trunc", "fix", "sign", "sgn", "floor_divide", "heaviside"}
)
#: In-place ATen ops (packet names) that overwrite values rather than update them.
OVERWRITING_OPS = frozenset({
    "fill_", "zero_", "copy_", "index_put_", "_index_put_impl_", "masked_fill_",
    "masked_scatter_", "index_fill_", "index_copy_", "scatter_", "set_", "uniform_",
    "normal_", "bernoulli_", "random_", "exponential_", "geometric_", "cauchy_",
    "log_normal_", "fill_diagonal_",
})
_FACTORIES = frozenset({
    torch.arange, torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.full,
    torch.empty, torch.rand, torch.randn, torch.randint, torch.randperm, torch.linspace,
    torch.logspace, torch.eye,
})
_LEAF_ERRORS = (
    "a leaf Variable that requires grad is being used in an in-place operation",
    "a view of a leaf Variable that requires grad is being used in an in-place operation",
    "functions with out=... arguments don't support automatic differentiation",
)


# -- where in the user's code ------------------------------------------------------------


@dataclass(frozen=True)
class Location:
    """A line of the user's code."""

    path: str
    line: int

    @property
    def code(self) -> str:
        return linecache.getline(self.path, self.line).strip()

    def __str__(self) -> str:
        path = self.path
        with contextlib.suppress(ValueError):
            rel = os.path.relpath(path)
            if not rel.startswith(".."):
                path = rel
        return f"{path}:{self.line}"


def _is_internal(filename: str) -> bool:
    if filename.startswith("<"):
        return True
    if filename.startswith(_LIBRARY_DIRS):
        return True
    return filename.startswith(_STDLIB) and not filename.startswith(_PURELIB)


def user_location(boundary: FrameType | None = None) -> Location | None:
    """The innermost frame of the caller's stack that is user code, stopping at ``boundary``."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame is not boundary:
        if not _is_internal(frame.f_code.co_filename):
            return Location(frame.f_code.co_filename, frame.f_lineno)
        frame = frame.f_back
    return None


def _stack_trace_location(stack_trace: str | None) -> Location | None:
    """The innermost user frame of an FX ``node.meta["stack_trace"]``."""
    if not stack_trace:
        return None
    found = None
    for line in stack_trace.splitlines():
        line = line.strip()
        if line.startswith('File "'):
            path, _, rest = line[6:].partition('", line ')
            number = rest.split(",")[0]
            if number.isdigit() and not _is_internal(path):
                found = Location(path, int(number))
    return found


# -- per-tensor provenance ----------------------------------------------------------------


@dataclass(frozen=True)
class _Prov:
    """Where a tensor's value came from, as far as the checks care."""

    input_dep: bool = False  # derived from example inputs, parameters or buffers
    param_dep: bool = False  # a parameter reaches it through ops that keep gradient
    factories: frozenset[int] = frozenset()  # device-less factory calls it derives from
    zero_grad: frozenset[int] = frozenset()  # zero-derivative ops between params and it
    cut: frozenset[int] = frozenset()  # float -> int/bool steps (comparisons, bit views)


_EMPTY = _Prov()


@dataclass
class _Saved:
    """A tensor autograd saved, with the version it had then."""

    tensor: Tensor
    pack_version: int
    seen_version: int
    op: str
    where: Location | None
    culprits: list[tuple[str, Location | None, str]] = field(default_factory=list)

    def victim(self) -> str:
        return f"{self.op} at {self.where}" if self.where else self.op


@dataclass(frozen=True)
class _Origin:
    op: str
    where: Location | None
    node: str


class _Recorder:
    """State shared by the function mode, the dispatch mode and the saved-tensor hooks."""

    def __init__(self, report: LintReport, *, scan_saved: bool, copy_saved: bool) -> None:
        self.report = report
        self.scan_saved = scan_saved  # lint: report FXQ001 when the write happens
        self.copy_saved = copy_saved  # check: keep copies so backward can finish
        self.prov: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.saved: list[_Saved] = []
        self.origins: dict[int, _Origin] = {}
        self.reported_factories: set[int] = set()
        self.writes: list[tuple[str, Tensor, bool]] = []  # (aten op, tensor, was requires_grad)
        self.last_op = "?"
        self.node: Node | None = None  # the FX node being run, for GraphModules
        self.boundary: FrameType | None = None  # frames outside this are not the model's

    # where ------------------------------------------------------------------------------

    def where(self) -> Location | None:
        found = user_location(self.boundary)
        if found is not None:
            return found
        if self.node is not None:
            return _stack_trace_location(self.node.meta.get("stack_trace"))
        return None

    def node_name(self, fallback: str) -> str:
        return self.node.name if self.node is not None else fallback

    def add(self, rule: str, severity: str, where: Location | None, node: str, message: str,
            hint: str, related: str = "") -> None:
        self.report.add(Finding(rule, severity, node, str(where) if where else "",  # type: ignore[arg-type]
                                message, hint, related))

    # provenance -------------------------------------------------------------------------

    def get(self, t: Tensor) -> _Prov:
        return self.prov.get(t, _EMPTY)

    def mark_inputs(self, tensors: list[Tensor], params: set[int]) -> None:
        for t in tensors:
            is_param = id(t) in params and t.requires_grad
            self.prov[t] = _Prov(input_dep=True, param_dep=is_param)

    def origin(self, op: str, where: Location | None, node: str) -> int:
        key = len(self.origins)
        self.origins[key] = _Origin(op, where, node)
        return key

    def on_aten(self, func: Any, args: tuple, kwargs: dict, out: Any,
                written: list[tuple[Tensor, bool]]) -> None:
        name = func.overloadpacket.__name__
        self.last_op = name
        for t, grad_before in written:
            self.writes.append((name, t, grad_before))
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)]
        outputs = [t for t in tree_leaves(out) if isinstance(t, Tensor)]
        if not outputs:
            return
        provs = [self.get(t) for t in inputs]
        input_dep = any(p.input_dep for p in provs)
        param_dep = torch.is_grad_enabled() and name != "detach" and any(p.param_dep for p in provs)
        factories = frozenset().union(*(p.factories for p in provs))
        if factories and input_dep:
            self._report_factories(factories)
            factories = frozenset()
        if name in ("_to_copy", "to") and kwargs.get("device") is not None:
            factories = frozenset()
        float_in = [(t, p) for t, p in zip(inputs, provs, strict=True) if t.is_floating_point()]
        float_param_dep = any(p.param_dep for _, p in float_in)
        zero_grad = frozenset().union(*(p.zero_grad for _, p in float_in))
        cut = frozenset().union(*(p.cut for p in provs))
        for t in outputs:
            if t.is_floating_point():
                zg = zero_grad
                if not float_in:  # int/bool -> float conversion: cuts become values
                    zg = zg | cut
                if float_param_dep and torch.is_grad_enabled() and _zero_derivative(func, args, kwargs):
                    zg = zg | {self.origin(name, self.where(), self.node_name(name))}
                new = _Prov(input_dep, param_dep, factories, zg, cut)
            else:
                c = cut | zero_grad
                if float_param_dep and torch.is_grad_enabled():
                    c = c | {self.origin(name, self.where(), self.node_name(name))}
                new = _Prov(input_dep, False, factories, frozenset(), c)
            old = self.prov.get(t)
            if old is not None and any(t is w for w, _ in written):
                new = _Prov(old.input_dep or new.input_dep, old.param_dep or new.param_dep,
                            old.factories | new.factories, old.zero_grad | new.zero_grad,
                            old.cut | new.cut)
            self.prov[t] = new

    def _report_factories(self, factories: frozenset[int]) -> None:
        meet = self.where()
        for key in factories - self.reported_factories:
            self.reported_factories.add(key)
            o = self.origins[key]
            code = o.where.code if o.where else o.op
            self.add("FXQ005", "warning", o.where, o.node,
                     f"`{code}` creates a tensor without device= ({o.op}); it meets data "
                     f"derived from the inputs{f' at {meet}' if meet else ''} and stays on "
                     "the CPU when the model moves to a GPU.",
                     "pass device=x.device, dtype=x.dtype (x: the tensor it meets)")

    # saved tensors ----------------------------------------------------------------------

    def pack(self, t: Tensor) -> Any:
        entry = _Saved(t, t._version, t._version, self.last_op, self.where())
        self.saved.append(entry)
        if self.copy_saved:
            return entry, t.detach().clone()
        return t

    def name_victims(self, first: int, out: Any) -> None:
        """Name the op behind tensors saved during one call after its autograd node.

        Inputs are saved before the ATen op runs, so the dispatch mode cannot name it then;
        the output's ``grad_fn`` (``PowBackward1`` -> ``pow``) is what PyTorch's own error
        message names.
        """
        grad_fn = next((t.grad_fn for t in tree_leaves(out)
                        if isinstance(t, Tensor) and t.grad_fn is not None), None)
        if grad_fn is None:
            return
        name = re.sub(r"Backward\d*$", "", grad_fn.name())
        name = name[:1].lower() + name[1:]
        for entry in self.saved[first:]:
            entry.op = name

    def unpack(self, packed: Any) -> Tensor:
        if not self.copy_saved:
            return packed
        entry, copy = packed
        if entry.tensor._version != entry.pack_version:
            culprits = entry.culprits or [("an in-place op", None, "?")]
            for code, where, node in culprits:
                self._report_saved(entry, code, where, node)
        return copy

    def after_call(self, func_name: str, where: Location | None) -> None:
        """Attribute the writes of one Python-level call: saved tensors, overwrites."""
        writes, self.writes = self.writes, []
        code = where.code if where else func_name
        node = self.node_name(func_name)
        for entry in self.saved:
            version = entry.tensor._version
            if version != entry.seen_version:
                entry.seen_version = version
                entry.culprits.append((code, where, node))
                if self.scan_saved:
                    self._report_saved(entry, code, where, node)
        if any(op in OVERWRITING_OPS and grad for op, _, grad in writes):
            self.add("FXQ002", "warning", where, node,
                     f"`{code}` overwrites elements of a tensor that requires grad; legal, but "
                     "those elements pass no gradient to what computed them.",
                     "if they should train, build the result with torch.where(mask, value, x)")

    def _report_saved(self, entry: _Saved, code: str, where: Location | None, node: str) -> None:
        self.add("FXQ001", "error", where, node,
                 f"`{code}` writes in place into a tensor that `{entry.op}` saved for "
                 "backward: backward fails with 'modified by an inplace operation' (anomaly "
                 "mode names the saving line instead of this one).",
                 "write it out of place (`out = out * y`, not `out *= y`), or .clone() before "
                 "writing into it",
                 related=entry.victim())


def _zero_derivative(func: Any, args: tuple, kwargs: dict) -> bool:
    name = func.overloadpacket.__name__
    if name in ZERO_DERIVATIVE_OPS:
        return True
    for op, position in (("truncate", 3), ("quantize", 4)):
        if func is getattr(torch.ops.fxquant, op).default:
            grad = kwargs.get("grad", args[position] if len(args) > position else "ste")
            return bool(grad == "zero")
    return False


# -- the modes ------------------------------------------------------------------------------


def _call_name(func: Any) -> str:
    name = getattr(func, "__name__", None) or str(func)
    return str(name)


def _is_data_getter(func: Any) -> bool:
    owner = getattr(func, "__self__", None)
    return _call_name(func) == "__get__" and getattr(owner, "__name__", "") == "data"


class _FunctionMode(TorchFunctionMode):
    def __init__(self, rec: _Recorder) -> None:
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        rec = self.rec
        if _is_data_getter(func):
            t = args[0]
            out = func(*args, **kwargs)
            if isinstance(t, Tensor) and t.requires_grad:
                where = rec.where()
                code = where.code if where else ".data"
                rec.add("FXQ004", "warning", where, rec.node_name("data"),
                        f"`{code}` uses `.data` of a tensor that requires grad: in-place writes "
                        "through it bypass autograd's version check and give silently wrong "
                        "gradients.",
                        "use .detach() (autograd still checks writes) or `with torch.no_grad():`")
                rec.prov[out] = _Prov(rec.get(t).input_dep)
            return out
        rec.writes = []
        first_saved = len(rec.saved)
        try:
            out = func(*args, **kwargs)
        except RuntimeError as e:
            if not any(m in str(e) for m in _LEAF_ERRORS):
                raise
            where = rec.where()
            code = where.code if where else _call_name(func)
            rec.add("FXQ003", "error", where, rec.node_name(_call_name(func)),
                    f"`{code}` writes in place (or through out=) into a leaf tensor that "
                    f"requires grad; autograd raises: {str(e).splitlines()[0]}",
                    "initialize or modify parameters under `with torch.no_grad():` (or with "
                    "torch.nn.init), or compute a new tensor out of place")
            rec.writes = []
            with torch.no_grad():  # let the forward go on, to find what comes after
                out = func(*args, **kwargs)
        if len(rec.saved) > first_saved:
            rec.name_victims(first_saved, out)
        if rec.writes:
            rec.after_call(_call_name(func), rec.where())
        if self._is_device_less_factory(func, args, kwargs) and isinstance(out, Tensor) and out.dim() > 0:
            where = rec.where()
            op = "torch.Tensor(...)" if func is _LIFT_FRESH else f"torch.{_call_name(func)}"
            key = rec.origin(op, where, rec.node_name(op.split("(")[0]))
            rec.prov[out] = _Prov(factories=frozenset({key}))
        return out

    @staticmethod
    def _is_device_less_factory(func: Any, args: tuple, kwargs: dict) -> bool:
        if func is _LIFT_FRESH:  # the legacy constructor: torch.Tensor([...])
            return True
        if func not in _FACTORIES or kwargs.get("device") is not None:
            return False
        return not (func in (torch.tensor, torch.as_tensor) and args and isinstance(args[0], Tensor))


_LIFT_FRESH = torch.ops.aten.lift_fresh.default


class _DispatchMode(TorchDispatchMode):
    def __init__(self, rec: _Recorder) -> None:
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        written = []
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
                for t in tree_leaves(value):
                    if isinstance(t, Tensor):
                        written.append((t, t.requires_grad))
        out = func(*args, **kwargs)
        self.rec.on_aten(func, args, kwargs, out, written)
        return out


class _Run(Interpreter):
    """Runs a GraphModule node by node so findings can name the FX node."""

    def __init__(self, gm: GraphModule, rec: _Recorder) -> None:
        super().__init__(gm)
        self.rec = rec

    def run_node(self, n: Node) -> Any:
        self.rec.node = n
        try:
            return super().run_node(n)
        finally:
            self.rec.node = None


# -- leaving no trace -----------------------------------------------------------------------


@contextlib.contextmanager
def _restored_state(model: nn.Module) -> Iterator[None]:
    """Put back grad/anomaly mode, the RNG, the model's tensors, .grad and attributes."""
    grad_mode = torch.is_grad_enabled()
    anomaly = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    values = {k: t.detach().clone() for k, t in tensors.items()}
    grads = {k: p.grad for k, p in model.named_parameters()}
    # Plain attributes too: a forward may cache (GCNConv(cached=True) keeps the normalized
    # graph of the example inputs) or rebind them.
    attributes = [(m, dict(vars(m))) for m in model.modules()]
    set_anomaly = torch.set_anomaly_enabled
    try:
        yield
    finally:
        torch.set_anomaly_enabled = set_anomaly
        torch.set_grad_enabled(grad_mode)
        set_anomaly(*anomaly)
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        with torch.no_grad():
            for k, t in tensors.items():
                if t.shape == values[k].shape and t.dtype == values[k].dtype:
                    if not torch.equal(t, values[k]):
                        t.copy_(values[k])
                else:
                    t.data = values[k]
        for module, saved in attributes:
            vars(module).clear()
            vars(module).update(saved)
        for k, p in model.named_parameters():
            p.grad = grads.get(k)


def _clone_inputs(obj: Any) -> Any:
    """Copies of the example inputs, so a forward that writes into them changes nothing."""
    if isinstance(obj, Tensor):
        copy = obj.detach().clone()
        return copy.requires_grad_(obj.requires_grad) if obj.is_floating_point() else copy
    if isinstance(obj, (list, tuple)):
        items = [_clone_inputs(o) for o in obj]
        return type(obj)(items) if not hasattr(obj, "_fields") else type(obj)(*items)
    if isinstance(obj, dict):
        return {k: _clone_inputs(v) for k, v in obj.items()}
    clone = getattr(obj, "clone", None)
    return clone() if callable(clone) else obj


@contextlib.contextmanager
def _recording(rec: _Recorder) -> Iterator[None]:
    def set_anomaly(enabled: bool, check_nan: bool = True) -> None:
        if enabled:
            where = rec.where()
            rec.add("FXQ006", "warning", where, rec.node_name("set_detect_anomaly"),
                    f"`{where.code if where else 'set_detect_anomaly'}` switches anomaly "
                    "detection on from forward: every step runs slower, the mode stays on for "
                    "the whole process, and it names the op that saved a tensor rather than the "
                    "in-place op that modified it.",
                    "remove it from forward; to debug, wrap one step in "
                    "`with torch.autograd.detect_anomaly():` or run fxquant.check(model, *inputs)")
        original(enabled, check_nan)

    original = torch.set_anomaly_enabled
    torch.set_anomaly_enabled = set_anomaly
    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack), \
                _FunctionMode(rec), _DispatchMode(rec):
            yield
    finally:
        torch.set_anomaly_enabled = original


def _forward(model: nn.Module, inputs: tuple, rec: _Recorder) -> Any:
    rec.boundary = sys._getframe()
    if isinstance(model, GraphModule):
        return _Run(model, rec).run(*inputs)
    return model(*inputs)


def _raised(report: LintReport, phase: str, e: BaseException) -> None:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not _is_internal(f.filename)]
    where = Location(frames[-1].filename, frames[-1].lineno or 0) if frames else None
    report.add(Finding("FXQ009", "error", phase, str(where) if where else "",
                       f"{phase} raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                       "fix the exception first; findings before it are listed"))


def _report_zero_grad(rec: _Recorder, out: Any) -> set[int]:
    origins: set[int] = set()
    for t in tree_leaves(out):
        if isinstance(t, Tensor):
            origins |= rec.get(t).zero_grad
    for key in sorted(origins):
        o = rec.origins[key]
        code = o.where.code if o.where else o.op
        rec.add("FXQ007", "warning", o.where, o.node,
                f"`{code}` ({o.op}) has zero derivative almost everywhere and lies between "
                "parameters and the output: parameters upstream receive zero gradient through it.",
                "simulate precision with fxquant.truncate (straight-through gradient), or use "
                "a straight-through estimator: x + (f(x) - x).detach()")
    return origins


def _params(model: nn.Module) -> set[int]:
    return {id(p) for p in model.parameters()}


def _model_tensors(model: nn.Module, inputs: Any) -> list[Tensor]:
    found = [t for t in tree_leaves(inputs) if isinstance(t, Tensor)]
    for obj in (inputs if isinstance(inputs, tuple) else (inputs,)):
        stores = getattr(obj, "stores", None)  # PyG Data / HeteroData
        if stores is not None:
            found += [v for s in stores for v in s.values() if isinstance(v, Tensor)]
    return found + list(model.parameters()) + list(model.buffers())


def lint_dynamic(model: nn.Module, example_inputs: tuple) -> LintReport:
    """Lint by running one forward of ``model`` on copies of ``example_inputs``."""
    report = LintReport(mode="dynamic")
    rec = _Recorder(report, scan_saved=True, copy_saved=False)
    with _restored_state(model):
        inputs = _clone_inputs(example_inputs)
        rec.mark_inputs(_model_tensors(model, inputs), _params(model))
        out = None
        try:
            with _recording(rec):
                out = _forward(model, inputs, rec)
        except Exception as e:
            _raised(report, "forward", e)
        _report_zero_grad(rec, out)
    return report


def check(
    model: nn.Module,
    *example_inputs: Any,
    loss_fn: Callable[[Any], Tensor] | None = None,
) -> LintReport:
    """Run one forward and one backward and report what breaks or starves backward.

    Reports, with the user's source lines: each in-place op that modified a tensor saved
    for backward (the culprit) together with the op that saved it (the victim); every
    parameter whose gradient is None or exactly zero, by name; and what :func:`fxquant.lint`
    reports about the forward (``.data``, device-less factories, anomaly mode, zero-derivative
    ops). The model is left exactly as it was: parameters, buffers, ``.grad``, train/eval
    mode, grad and anomaly mode and the RNG state are restored, also when it raises.

    Args:
        model (torch.nn.Module): the model, unmodified.
        *example_inputs: its forward arguments (copied; never written).
        loss_fn (callable, optional): maps the output to a scalar loss.
            (default: the sum of all floating-point outputs)

    Example:
        >>> class Doubler(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.lin = torch.nn.Linear(3, 3)
        ...     def forward(self, x):
        ...         y = self.lin(x).sigmoid()
        ...         y *= 2  # sigmoid saved y for backward
        ...         return y
        >>> report = check(Doubler(), torch.randn(4, 3))
        >>> [(f.rule, f.severity, f.related.split(" at ")[0]) for f in report.errors]
        [('FXQ001', 'error', 'sigmoid')]
    """
    report = LintReport(mode="check")
    rec = _Recorder(report, scan_saved=False, copy_saved=True)
    anomaly = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
    with _restored_state(model):
        for p in model.parameters():
            p.grad = None
        inputs = _clone_inputs(example_inputs)
        rec.mark_inputs(_model_tensors(model, inputs), _params(model))
        cut_at: set[int] = set()
        try:
            with _recording(rec):
                out = _forward(model, inputs, rec)
            # A forward that switched anomaly mode on (FXQ006) would make backward stop at
            # the first NaN check; backward runs in the mode the caller had.
            torch.set_anomaly_enabled(*anomaly)
            cut_at = _report_zero_grad(rec, out)
            loss = loss_fn(out) if loss_fn is not None else _sum_outputs(out)
            with torch.enable_grad():
                loss.backward()
        except Exception as e:
            _raised(report, "forward/backward", e)
        where = ", ".join(sorted({str(rec.origins[k].where) for k in cut_at if rec.origins[k].where}))
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            if p.grad is None or not bool(p.grad.ne(0).any()):
                state = "no gradient (None)" if p.grad is None else "an all-zero gradient"
                report.add(Finding(
                    "FXQ008", "warning", name, "",
                    f"parameter {name!r} got {state} after one backward"
                    + (f"; the gradient path is cut at {where}" if where else ""),
                    "make the ops between it and the loss differentiable (see the FXQ007 "
                    "findings), e.g. fxquant.truncate instead of bit-plane code"))
    return report


def _sum_outputs(out: Any) -> Tensor:
    floats = [t for t in tree_leaves(out) if isinstance(t, Tensor) and t.is_floating_point()]
    if not floats:
        raise TypeError("the model returned no floating-point tensor; please pass loss_fn=")
    return torch.stack([t.sum() for t in floats]).sum()
