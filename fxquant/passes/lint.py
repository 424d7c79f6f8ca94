"""Lint a model for autograd traps before training: :func:`lint`.

With example inputs the forward runs for real under fxquant's recording modes
(:mod:`fxquant.sanitizer`), which see everything. Without them the symbolic FX graph is
linted, which misses what symbolic tracing cannot record (the report says what).

Node metadata written: none. Lint reports; it does not edit the graph.

Symbolic rules and how they decide:

- an in-place node (``x.add_(y)``, ``torch.relu_``, ``inplace=True``, ``out=``, a module
  with ``inplace=True``) is an error (FXQ001) when the value it writes, or an alias of it,
  is saved for backward by the op that produced it or by an earlier user. Which op saves
  which argument is derived by running the op once on tiny tensors under
  :func:`torch.autograd.graph.saved_tensors_hooks`; when that cannot be done the finding
  is FXQ011 (may be saved). Writing into a parameter is FXQ003.
- ``x.data`` (a ``getattr`` node) is FXQ004; tensor constants captured on the CPU while
  tracing (what a ``torch.arange`` call in forward becomes) are FXQ005; anomaly mode switched
  on while tracing is FXQ006; ``floor``/``round``/``sign``/... between parameters and the
  output is FXQ007.
"""

from __future__ import annotations

import builtins
import contextlib
import operator
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.fx import GraphModule, Node
from torch.utils._pytree import tree_leaves
from torch_geometric.nn import MessagePassing

from fxquant.report import Finding, LintReport
from fxquant.sanitizer import (
    ZERO_DERIVATIVE_OPS,
    _stack_trace_location,
    lint_dynamic,
    user_location,
)
from fxquant.tracer import trace

__all__ = ["lint", "lint_graph"]

_NOT_VISIBLE = (
    "Linted the symbolic FX graph only: symbolic tracing records `x *= y` as an out-of-place "
    "mul, cannot trace `x[idx] = v`, turns factory calls such as `torch.arange` into "
    "constants and `.data` into a plain attribute, and does not know which values require "
    "grad or which leaf modules write in place internally."
)
# Ops whose output may share memory with their first argument.
_ALIASING = frozenset({
    "view", "view_as", "reshape", "reshape_as", "squeeze", "unsqueeze", "t", "transpose",
    "permute", "expand", "expand_as", "narrow", "select", "flatten", "unflatten", "detach",
    "type", "to", "float", "double", "half", "contiguous", "as_strided", "diagonal", "movedim",
    "swapaxes", "unfold", "real", "imag", "getitem", "__getitem__", "T", "mT", "data",
})


def lint(
    model: nn.Module,
    *example_inputs: Any,
    concrete_args: dict[str, Any] | None = None,
    leaf_modules: Iterable[str | type[nn.Module]] = (),
) -> LintReport:
    """Find what will break or starve backward, naming the culprit's source line.

    With example inputs, one forward runs on copies of them (the model, global modes and
    the RNG are left as they were, also when it raises) and every in-place op, factory
    call, ``.data`` access and anomaly switch is seen as it really happens. Without
    example inputs the symbolic graph is linted and the report says what it could not see.

    Args:
        model (torch.nn.Module or torch.fx.GraphModule): the model, unmodified.
        *example_inputs: forward arguments; strongly recommended.
        concrete_args (dict, optional): for the symbolic trace (no example inputs).
        leaf_modules (iterable, optional): for the symbolic trace (no example inputs).

    Returns:
        LintReport: findings with ``rule``, ``severity``, ``node``, ``location``,
        ``message`` and ``hint``; ``str(report)`` is a table.

    Example:
        >>> class Model(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.lin = torch.nn.Linear(3, 3)
        ...     def forward(self, x):
        ...         y = torch.exp(self.lin(x))
        ...         y.add_(1)  # exp saved y for its backward
        ...         return y
        >>> report = lint(Model(), torch.randn(2, 3))
        >>> [(f.rule, f.node, f.related.split(" at ")[0]) for f in report.errors]
        [('FXQ001', 'add_', 'exp')]
        >>> [f.rule for f in lint(Model()).findings]  # symbolic: sees the add_ node too
        ['FXQ001', 'FXQ010']
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"fxquant.lint expects a torch.nn.Module, got {type(model).__name__}")
    if example_inputs:
        return lint_dynamic(model, example_inputs)
    report = LintReport(mode="symbolic")
    if isinstance(model, GraphModule):
        gm = model
    else:
        with _watch_anomaly(report):
            gm = trace(model, concrete_args, leaf_modules)
    for finding in lint_graph(gm).findings:
        report.add(finding)
    return report


def lint_graph(gm: GraphModule, *, note: bool = True) -> LintReport:
    """Lint the symbolic graph of ``gm`` (what :func:`fxquant.transform` runs on its output).

    Args:
        gm (torch.fx.GraphModule): the graph to lint; not modified.
        note (bool, optional): add the FXQ010 note on what a symbolic graph hides.
    """
    report = LintReport(mode="symbolic")
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    for node in nodes:
        if _is_data_access(node):
            _add(report, "FXQ004", "warning", node,
                 f"`{_code(node)}` reads `.data`; if the tensor requires grad, in-place writes "
                 "through it bypass autograd and give silently wrong gradients.",
                 "use .detach() (autograd still checks writes) or `with torch.no_grad():`")
        elif node.op == "get_attr" and str(node.target).startswith("_tensor_constant"):
            value = _attr(gm, str(node.target))
            if isinstance(value, Tensor) and value.dim() > 0:
                _add(report, "FXQ005", "warning", node,
                     f"a {tuple(value.shape)} tensor created in forward was frozen into the "
                     f"graph as a constant on {value.device}; it will not follow .to(device).",
                     "create it with device=x.device, dtype=x.dtype from a tensor it meets, or "
                     "register it as a buffer")
        written = _written_value(gm, node)
        if written is not None:
            _check_inplace(gm, report, node, written, order)
    _check_zero_derivative(gm, report, nodes)
    if note:
        report.add(Finding("FXQ010", "info", "graph", "", _NOT_VISIBLE,
                           "pass example inputs: fxquant.lint(model, *inputs)"))
    return report


# -- helpers ----------------------------------------------------------------------------------


def _add(report: LintReport, rule: str, severity: str, node: Node, message: str, hint: str,
         related: str = "") -> None:
    where = _stack_trace_location(node.meta.get("stack_trace"))
    report.add(Finding(rule, severity, node.name, str(where) if where else "",  # type: ignore[arg-type]
                       message, hint, related))


def _code(node: Node) -> str:
    where = _stack_trace_location(node.meta.get("stack_trace"))
    return where.code if where and where.code else str(node.format_node())


def _attr(gm: GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


def _name(node: Node) -> str:
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    return ""


def _is_data_access(node: Node) -> bool:
    return (node.op == "call_function" and node.target is builtins.getattr
            and len(node.args) > 1 and node.args[1] == "data")


def _is_inplace_name(name: str) -> bool:
    if not name.endswith("_") or name.startswith("_") or name.endswith("__"):
        return False
    base = getattr(torch.Tensor, name[:-1], None)
    return callable(base)


def _written_value(gm: GraphModule, node: Node) -> Node | None:
    """The value an in-place node writes into, or None when it writes nothing."""
    if node.op in ("call_method", "call_function"):
        out = node.kwargs.get("out")
        if isinstance(out, Node):
            return out
        first = node.args[0] if node.args else None
        if not isinstance(first, Node):
            return None
        if node.kwargs.get("inplace") is True or _is_inplace_name(_name(node)):
            return first
        if node.op == "call_function" and node.target in (operator.setitem,):
            return first
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        if getattr(module, "inplace", False) is True and node.args and isinstance(node.args[0], Node):
            return node.args[0]
    return None


def _aliases(value: Node) -> set[Node]:
    """``value``, the values it is a view of, and the views of those."""
    base = value
    while base.op in ("call_method", "call_function") and _name(base) in _ALIASING and base.args \
            and isinstance(base.args[0], Node):
        base = base.args[0]
    found, todo = {base}, [base]
    while todo:
        current = todo.pop()
        for user in current.users:
            if user.op in ("call_method", "call_function") and _name(user) in _ALIASING \
                    and user.args and user.args[0] is current and user not in found:
                found.add(user)
                todo.append(user)
    return found


def _check_inplace(gm: GraphModule, report: LintReport, node: Node, written: Node,
                   order: dict[Node, int]) -> None:
    if written.op == "get_attr" and isinstance(_attr(gm, str(written.target)), nn.Parameter):
        _add(report, "FXQ003", "error", node,
             f"`{_code(node)}` writes in place into the parameter {written.target!r}, a leaf "
             "that requires grad; autograd raises.",
             "modify parameters under `with torch.no_grad():`, or compute out of place")
        return
    aliases = _aliases(written)
    unknown: list[Node] = []
    for alias in sorted(aliases, key=order.__getitem__):
        # The op that produced the value may have saved its output ...
        candidates = [(alias, "output")] if alias.op in ("call_module", "call_function",
                                                         "call_method") else []
        # ... and earlier users may have saved it as an input.
        candidates += [(u, "input") for u in alias.users
                       if order[u] < order[node] and u not in aliases and u is not node]
        for op, role in candidates:
            if op.op == "call_method" and _name(op) in _ALIASING:
                continue
            saved = _saves(gm, op, alias if role == "input" else None)
            if saved:
                _add(report, "FXQ001", "error", node,
                     f"`{_code(node)}` writes in place into a value that `{op.name}` saved "
                     f"for backward (its {role}); backward fails with 'modified by an inplace "
                     "operation'.",
                     "write it out of place (e.g. inplace=False, `x = x.add(y)`), or .clone() "
                     "before writing",
                     related=f"{op.name} at {_stack_trace_location(op.meta.get('stack_trace')) or '?'}")
                return
            if saved is None:
                unknown.append(op)
    if unknown:
        names = ", ".join(sorted({u.name for u in unknown}))
        _add(report, "FXQ011", "warning", node,
             f"`{_code(node)}` writes in place into a value that {names} may have saved for "
             "backward; the symbolic graph cannot tell.",
             "lint with example inputs (fxquant.lint(model, *inputs)), or write out of place")


# -- which op saves what: observed on tiny tensors --------------------------------------------

_PROBE_CACHE: dict[tuple[Any, ...], bool | None] = {}


@contextlib.contextmanager
def _packed() -> Iterator[list[Tensor]]:
    seen: list[Tensor] = []

    def pack(t: Tensor) -> Tensor:
        seen.append(t)
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield seen


def _same_memory(a: Tensor, b: Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _saves(gm: GraphModule, op: Node, value: Node | None) -> bool | None:
    """Whether ``op`` saves ``value`` (one of its inputs) or, for None, its own output.

    Runs the op once on tiny random tensors under saved-tensor hooks; None if it can't.
    """
    target = op.target if op.op != "call_module" else type(gm.get_submodule(str(op.target)))
    positions = tuple(i for i, a in enumerate(op.args) if a is value) if value is not None else ()
    key = (op.op, target, positions, value is None,
           tuple(a for a in op.args if not isinstance(a, Node) and _hashable(a)),
           tuple(sorted((k, v) for k, v in op.kwargs.items() if not isinstance(v, Node)
                        and _hashable(v))))
    if key not in _PROBE_CACHE:
        _PROBE_CACHE[key] = _probe(gm, op, value)
    return _PROBE_CACHE[key]


def _hashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def _probe(gm: GraphModule, op: Node, value: Node | None) -> bool | None:
    module = gm.get_submodule(str(op.target)) if op.op == "call_module" else None
    width = getattr(module, "in_channels", None) or getattr(module, "in_features", None)
    sized = isinstance(width, int) and width > 0
    if module is not None and any(True for _ in module.parameters()) and not sized:
        return None  # cannot size its input
    first = op.args[0] if op.args else None
    for shape in ((3, 3), (3,), (2, 3, 3)):
        tensors: dict[Node, Tensor] = {}
        if sized and isinstance(first, Node):
            tensors[first] = torch.rand(3, width).requires_grad_()  # type: ignore[arg-type]
        if isinstance(module, MessagePassing) and len(op.args) > 1 and isinstance(op.args[1], Node):
            tensors[op.args[1]] = torch.tensor([[0, 1, 2], [1, 2, 0]])

        def make(a: Any, shape: tuple[int, ...] = shape,
                 tensors: dict[Node, Tensor] = tensors) -> Any:
            if isinstance(a, Node):
                if a not in tensors:
                    tensors[a] = (torch.rand(shape) + 0.5).requires_grad_()
                return tensors[a]
            return a

        try:
            args = torch.fx.node.map_aggregate(op.args, make)
            kwargs = torch.fx.node.map_aggregate(op.kwargs, make)
            with _packed() as seen:
                if op.op == "call_function":
                    out = op.target(*args, **kwargs)  # type: ignore[operator]
                elif op.op == "call_method":
                    out = getattr(args[0], str(op.target))(*args[1:], **kwargs)
                else:
                    out = module(*args, **kwargs)  # type: ignore[misc]
        except Exception:
            continue
        if value is None:
            outs = [t for t in tree_leaves(out) if isinstance(t, Tensor)]
            return any(_same_memory(s, o) for s in seen for o in outs)
        mine = tensors.get(value)
        return mine is not None and any(_same_memory(s, mine) for s in seen)
    return None


# -- zero-derivative ops between parameters and the output ------------------------------------


def _check_zero_derivative(gm: GraphModule, report: LintReport, nodes: list[Node]) -> None:
    sources = {
        n for n in nodes
        if (n.op == "get_attr" and isinstance(_attr(gm, str(n.target)), nn.Parameter))
        or (n.op == "call_module" and any(True for _ in gm.get_submodule(str(n.target)).parameters()))
    }
    downstream: set[Node] = set()
    for n in nodes:
        if n in sources or any(a in downstream for a in n.all_input_nodes):
            downstream.add(n)
    upstream: set[Node] = set()
    for n in reversed(nodes):
        if n.op == "output" or any(u in upstream for u in n.users):
            upstream.add(n)
    for n in nodes:
        if n in downstream and n in upstream and _fxquant_op(n) and _zero_derivative(n):
            after = n.kwargs.get("name") or n.args[0]
            _add(report, "FXQ007", "warning", n,
                 f"the {_fxquant_op(n)} node after {after!r} uses grad='zero' (the true "
                 "derivative of rounding): parameters upstream receive zero gradient through it.",
                 "use grad='ste' (straight-through) to train through truncations")
        elif n in downstream and n in upstream and _zero_derivative(n):
            _add(report, "FXQ007", "warning", n,
                 f"`{_code(n)}` ({_name(n) or n.target}) has zero derivative almost everywhere "
                 "and lies between parameters and the output: parameters upstream receive zero "
                 "gradient through it.",
                 "simulate precision with fxquant.truncate (straight-through gradient), or "
                 "use a straight-through estimator: x + (f(x) - x).detach()")


_OPS_WITH_GRAD_ARG = {"truncate": 3, "quantize": 4}  # op name -> position of `grad`


def _fxquant_op(node: Node) -> str | None:
    target = node.target
    for name in _OPS_WITH_GRAD_ARG:
        if node.op == "call_function" and target is getattr(torch.ops.fxquant, name).default:
            return name
    return None


def _zero_derivative(node: Node) -> bool:
    op = _fxquant_op(node)
    if op is not None:
        position = _OPS_WITH_GRAD_ARG[op]
        grad = node.kwargs.get("grad", node.args[position] if len(node.args) > position else "ste")
        return bool(grad == "zero")
    if node.op == "call_function" and node.target is operator.floordiv:
        return True
    name = _name(node)
    if name in ZERO_DERIVATIVE_OPS:
        return True
    # A reinterpreting view into an integer dtype: x.view(torch.int32).
    return name == "view" and any(isinstance(a, torch.dtype) and not a.is_floating_point
                                  for a in node.args[1:])


@contextlib.contextmanager
def _watch_anomaly(report: LintReport) -> Iterator[None]:
    """Tracing runs forward's Python: catch (and undo) anomaly mode switched on there."""
    original = torch.set_anomaly_enabled
    state = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())

    def watch(enabled: bool, check_nan: bool = True) -> None:
        if enabled:
            frame = user_location()
            report.add(Finding(
                "FXQ006", "warning", "set_detect_anomaly", str(frame) if frame else "",
                f"`{frame.code if frame else 'set_detect_anomaly'}` switches anomaly detection "
                "on from forward: every step runs slower and the mode stays on for the process.",
                "remove it from forward; to debug, wrap one step in "
                "`with torch.autograd.detect_anomaly():`"))
        original(enabled, check_nan)

    torch.set_anomaly_enabled = watch
    try:
        yield
    finally:
        torch.set_anomaly_enabled = original
        original(*state)
