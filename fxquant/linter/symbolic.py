"""The symbolic lint: rules on a traced FX graph, for models linted without inputs.

Node metadata written: none. Lint reports; it does not edit the graph.

Rules and how they decide:

- an in-place node (``x.add_(y)``, ``torch.relu_``, ``inplace=True``, ``out=``, a module
  with ``inplace=True``) is an error (FXQ001) when the value it writes, or an alias of it,
  is saved for backward by the op that produced it or by an earlier user. Which op saves
  which argument is observed by running the op once on tiny tensors under saved-tensor
  hooks (:func:`saves`): on a copy of the module, from a private generator, with the
  model's state restored, cached by the op's configuration. When that cannot be done the
  finding is FXQ011 (may be saved). Writing into a parameter is FXQ003.
- ``x.data`` (a ``getattr`` node) is FXQ004; tensor constants captured on the CPU while
  tracing (what a ``torch.arange`` call in forward becomes) are FXQ005;
  ``floor``/``round``/``sign``/... (and fxquant's own points with ``grad="zero"``) between
  parameters and the output are FXQ007.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import operator
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, Final

import torch
from torch import Tensor, nn
from torch.fx import GraphModule, Node
from torch_geometric.nn import MessagePassing

from fxquant._ops.calls import OpCall, op_call
from fxquant.fx.graph_utils import attr_of
from fxquant.fx.locations import Location, stack_trace_location
from fxquant.linter.records import ZERO_DERIVATIVE_OPS
from fxquant.linter.report import Finding, LintReport
from fxquant.linter.rules import (
    DATA_ATTRIBUTE,
    FACTORY_WITHOUT_DEVICE,
    INPLACE_MAYBE_SAVED,
    INPLACE_MODIFIES_SAVED_TENSOR,
    INPLACE_ON_LEAF,
    NOT_VISIBLE,
    ZERO_GRADIENT_OP,
    hint_for_inplace,
)
from fxquant.linter.sites import built_at
from fxquant.linter.state import copy_model, restored_state
from fxquant.linter.torch_internals import tree_leaves, writes_first_argument

__all__ = [
    "ALIASING",
    "ORIGINAL_KEY",
    "SYMBOLIC_NOTE",
    "aliases",
    "inplace_name",
    "lint_graph",
    "node_op_name",
    "saves",
    "written_value",
]

#: ``gm.meta`` key of the model a graph was traced from (its classes' source names the
#: lines that built the modules a container runs).
ORIGINAL_KEY: Final = "fxquant_traced_from"
#: The note (NOT_VISIBLE) of a symbolic report.
SYMBOLIC_NOTE: Final = (
    "Linted the symbolic FX graph only: symbolic tracing records `x *= y` as an out-of-place "
    "mul, cannot trace `x[idx] = v`, turns factory calls such as `torch.arange` into "
    "constants and `.data` into a plain attribute, and does not know which values require "
    "grad or which leaf modules write in place internally."
)
#: Ops whose output may share memory with their first argument.
ALIASING: Final = frozenset({
    "view", "view_as", "reshape", "reshape_as", "squeeze", "unsqueeze", "t", "transpose",
    "permute", "expand", "expand_as", "narrow", "select", "flatten", "unflatten", "detach",
    "type", "to", "float", "double", "half", "contiguous", "as_strided", "diagonal", "movedim",
    "swapaxes", "unfold", "real", "imag", "getitem", "__getitem__", "T", "mT", "data",
    "split", "chunk", "unbind", "tensor_split",
})


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
            _add(report, DATA_ATTRIBUTE.id, node,
                 f"`{_code(node)}` reads `.data`; if the tensor requires grad, in-place writes "
                 "through it bypass autograd and give silently wrong gradients.",
                 DATA_ATTRIBUTE.hint)
        elif node.op == "get_attr" and str(node.target).startswith("_tensor_constant"):
            value = attr_of(gm, str(node.target))
            if isinstance(value, Tensor) and value.dim() > 0:
                _add(report, FACTORY_WITHOUT_DEVICE.id, node,
                     f"a {tuple(value.shape)} tensor created in forward was frozen into the "
                     f"graph as a constant on {value.device}; it will not follow .to(device).",
                     "create it with device=x.device, dtype=x.dtype from a tensor it meets, or "
                     "register it as a buffer")
        written = written_value(gm, node)
        if written is not None:
            _check_inplace(gm, report, node, written, order)
    _check_zero_derivative(gm, report, nodes)
    if note:
        report.add(Finding(NOT_VISIBLE.id, "graph", None, SYMBOLIC_NOTE,
                           "pass example inputs, or only their shapes: fxquant.lint(model, "
                           "fxquant.ShapeSpec((N, F))); in the CLI, --input x=N,F"))
    return report


# -- helpers ----------------------------------------------------------------------------------


def _add(report: LintReport, rule: str, node: Node, message: str, hint: str,
         related: str = "", related_location: Location | None = None) -> None:
    where = stack_trace_location(node.meta.get("stack_trace"))
    owner = node.graph.owning_module
    if where is None and node.op == "call_module" and owner is not None:
        # run by a container: the line that built it (in the traced model's classes)
        where = built_at(owner.meta.get(ORIGINAL_KEY, owner), str(node.target))
    report.add(Finding(rule, node.name, where, message, hint, related, related_location))


def _code(node: Node) -> str:
    where = stack_trace_location(node.meta.get("stack_trace"))
    return where.code if where and where.code else str(node.format_node())


def node_op_name(node: Node) -> str:
    """The method or function name of a call node ('' for other nodes)."""
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    return ""


def _is_data_access(node: Node) -> bool:
    return (node.op == "call_function" and node.target is builtins.getattr
            and len(node.args) > 1 and node.args[1] == "data")


#: Methods whose ATen schema writes ``self`` but which change no values autograd tracks.
_NOT_VALUE_WRITES: Final = frozenset({"requires_grad_", "retain_grad", "detach_"})


@functools.lru_cache(maxsize=1024)
def inplace_name(name: str) -> bool:
    """Whether ``name`` is an in-place tensor method or function (``add_``, ``copy_``,
    ``zero_``): its ATen op writes into its first argument.

    Example:
        >>> [inplace_name(n) for n in ("add_", "copy_", "add", "requires_grad_", "__iadd__")]
        [True, True, False, False, False]
    """
    if not name.endswith("_") or name.startswith("_") or name in _NOT_VALUE_WRITES:
        return False
    op = getattr(torch.ops.aten, name, None)
    return op is not None and writes_first_argument(op)


def written_value(gm: GraphModule, node: Node) -> Node | None:
    """The value an in-place node writes into, or None when it writes nothing."""
    if node.op in ("call_method", "call_function"):
        out = node.kwargs.get("out")
        if isinstance(out, Node):
            return out
        first = node.args[0] if node.args else None
        if not isinstance(first, Node):
            return None
        if node.kwargs.get("inplace") is True or inplace_name(node_op_name(node)):
            return first
        if node.op == "call_function" and node.target in (operator.setitem,):
            return first
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        if getattr(module, "inplace", False) is True and node.args and isinstance(node.args[0], Node):
            return node.args[0]
    return None


def aliases(value: Node) -> set[Node]:
    """``value``, the values it is a view of, and the views of those."""
    base = value
    while base.op in ("call_method", "call_function") and node_op_name(base) in ALIASING and base.args \
            and isinstance(base.args[0], Node):
        base = base.args[0]
    found, todo = {base}, [base]
    while todo:
        current = todo.pop()
        for user in current.users:
            if user.op in ("call_method", "call_function") and node_op_name(user) in ALIASING \
                    and user.args and user.args[0] is current and user not in found:
                found.add(user)
                todo.append(user)
    return found


def _check_inplace(gm: GraphModule, report: LintReport, node: Node, written: Node,
                   order: dict[Node, int]) -> None:
    if written.op == "get_attr" and isinstance(attr_of(gm, str(written.target)), nn.Parameter):
        _add(report, INPLACE_ON_LEAF.id, node,
             f"`{_code(node)}` writes in place into the parameter {written.target!r}, a leaf "
             "that requires grad; autograd raises.",
             "modify parameters under `with torch.no_grad():`, or compute out of place")
        return
    views = aliases(written)
    unknown: list[Node] = []
    for alias in sorted(views, key=order.__getitem__):
        # The op that produced the value may have saved its output ...
        candidates = [(alias, "output")] if alias.op in ("call_module", "call_function",
                                                         "call_method") else []
        # ... and earlier users may have saved it as an input.
        candidates += [(u, "input") for u in alias.users
                       if order[u] < order[node] and u not in views and u is not node]
        for op, role in candidates:
            if op.op == "call_method" and node_op_name(op) in ALIASING:
                continue
            saved = saves(gm, op, alias if role == "input" else None)
            if saved:
                _add(report, INPLACE_MODIFIES_SAVED_TENSOR.id, node,
                     f"`{_code(node)}` writes in place into a value that `{op.name}` saved "
                     f"for backward (its {role}); backward fails with 'modified by an inplace "
                     "operation'.",
                     hint_for_inplace(_code(node), node_op_name(node) or _module_op(gm, node)),
                     related=op.name,
                     related_location=stack_trace_location(op.meta.get("stack_trace")))
                return
            if saved is None:
                unknown.append(op)
    if unknown:
        names = ", ".join(sorted({u.name for u in unknown}))
        _add(report, INPLACE_MAYBE_SAVED.id, node,
             f"`{_code(node)}` writes in place into a value that {names} may have saved for "
             "backward; the symbolic graph cannot tell.", INPLACE_MAYBE_SAVED.hint)


def _module_op(gm: GraphModule, node: Node) -> str:
    """``"relu_"`` for a call of a module built with inplace=True, else ''."""
    if node.op == "call_module" and getattr(gm.get_submodule(str(node.target)), "inplace", False):
        return f"{type(gm.get_submodule(str(node.target))).__name__.lower()}_"
    return ""


# -- which op saves what: observed on tiny tensors --------------------------------------------

_PROBE_CACHE: OrderedDict[tuple[Any, ...], bool | None] = OrderedDict()
_PROBE_CACHE_SIZE: Final = 512


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


def _hashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def _probe_key(gm: GraphModule, op: Node, value: Node | None) -> tuple[Any, ...]:
    """The op and its configuration: a module's type, repr (its settings and children's)
    and mode; a function's constant arguments. Two ops with one key save the same things."""
    if op.op == "call_module":
        module = gm.get_submodule(str(op.target))
        target: Any = (type(module), repr(module), module.training,
                       tuple(sorted((k, v) for k, v in vars(module).items()
                                    if not k.startswith("_") and _hashable(v)
                                    and isinstance(v, (bool, int, float, str, type(None))))))
    else:
        target = op.target
    positions = tuple(i for i, a in enumerate(op.args) if a is value) if value is not None else ()
    return (op.op, target, positions, value is None,
            tuple(a for a in op.args if not isinstance(a, Node) and _hashable(a)),
            tuple(sorted((k, v) for k, v in op.kwargs.items() if not isinstance(v, Node)
                         and _hashable(v))))


def saves(gm: GraphModule, op: Node, value: Node | None) -> bool | None:
    """Whether ``op`` saves ``value`` (one of its inputs) or, for None, its own output.

    Runs the op once on tiny tensors under saved-tensor hooks (a module on a copy of it,
    random values from a private generator, the model's state restored); None if it can't.
    """
    key = _probe_key(gm, op, value)
    if key in _PROBE_CACHE:
        _PROBE_CACHE.move_to_end(key)
        return _PROBE_CACHE[key]
    with restored_state(gm):
        found = _probe(gm, op, value)
    _PROBE_CACHE[key] = found
    if len(_PROBE_CACHE) > _PROBE_CACHE_SIZE:
        _PROBE_CACHE.popitem(last=False)
    return found


def _probe(gm: GraphModule, op: Node, value: Node | None) -> bool | None:
    original = gm.get_submodule(str(op.target)) if op.op == "call_module" else None
    try:
        module = copy_model(original) if original is not None else None
    except Exception:
        return None  # a module that cannot be copied is not run on made-up data
    width = getattr(module, "in_channels", None) or getattr(module, "in_features", None)
    sized = isinstance(width, int) and width > 0
    if module is not None and any(True for _ in module.parameters()) and not sized:
        return None  # cannot size its input
    generator = torch.Generator().manual_seed(0)
    first = op.args[0] if op.args else None
    for shape in ((3, 3), (3,), (2, 3, 3)):
        tensors: dict[Node, Tensor] = {}
        if sized and isinstance(first, Node):
            tensors[first] = torch.rand(3, width, generator=generator).requires_grad_()  # type: ignore[arg-type]
        if isinstance(module, MessagePassing) and len(op.args) > 1 and isinstance(op.args[1], Node):
            tensors[op.args[1]] = torch.tensor([[0, 1, 2], [1, 2, 0]])

        def make(a: Any, shape: tuple[int, ...] = shape,
                 tensors: dict[Node, Tensor] = tensors) -> Any:
            if isinstance(a, Node):
                if a not in tensors:
                    tensors[a] = (torch.rand(shape, generator=generator) + 0.5).requires_grad_()
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
        if (n.op == "get_attr" and isinstance(attr_of(gm, str(n.target)), nn.Parameter))
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
        if n not in downstream or n not in upstream:
            continue
        point = _fxquant_call(gm, n)
        if point is not None:
            if point.zero_gradient:
                name = point.arguments.get("name") or n.name
                _add(report, ZERO_GRADIENT_OP.id, n,
                     f"the fxquant {point.op} at {name} uses grad='zero' (the true derivative "
                     "of rounding): parameters upstream receive zero gradient through it.",
                     "use grad='ste' (straight-through) to train through rounding")
        elif _zero_derivative(n):
            _add(report, ZERO_GRADIENT_OP.id, n,
                 f"`{_code(n)}` ({node_op_name(n) or n.target}) has zero derivative almost everywhere "
                 "and lies between parameters and the output: parameters upstream receive zero "
                 "gradient through it.", ZERO_GRADIENT_OP.hint)


def _fxquant_call(gm: GraphModule, node: Node) -> OpCall | None:
    """The fxquant op a node calls: directly, or through a module that says which
    (``module.op_call()``, what a quantization point offers)."""
    if node.op == "call_function":
        return op_call(node.target, tuple(node.args), dict(node.kwargs))
    if node.op == "call_module":
        describe = getattr(gm.get_submodule(str(node.target)), "op_call", None)
        call = describe() if callable(describe) else None
        return call if isinstance(call, OpCall) else None
    return None


def _zero_derivative(node: Node) -> bool:
    if node.op == "call_function" and node.target is operator.floordiv:
        return True
    name = node_op_name(node)
    if name in ZERO_DERIVATIVE_OPS:
        return True
    # A reinterpreting view into an integer dtype: x.view(torch.int32).
    return name == "view" and any(isinstance(a, torch.dtype) and not a.is_floating_point
                                  for a in node.args[1:])
