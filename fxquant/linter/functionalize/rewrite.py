"""Step 2 of :func:`~fxquant.linter.functionalize.functionalize_inplace`: the symbolic rewrite.

On the :func:`fxquant.trace` graph, which keeps the module structure, in-place methods and
functions become out of place (``x.add_(y)`` -> ``x.add(y)``), ``x[idx] = v`` writes into
a copy, ``inplace=True`` flags and modules become ``inplace=False``, ``out=`` is dropped.
``x += y``, which symbolic tracing records as an out-of-place add, is recognized from the
recorded run by its source line. Every later read of the written value, of the tensor it
is a view of, and of the other views of that tensor, reads the new value: a write through
a view is scattered back into its base at the positions the view covers, and the other
views are gathered again from the new base (:mod:`~fxquant.linter.functionalize.graph_ops`).
Writes into buffers are module state and stay as they are.
"""

from __future__ import annotations

import inspect
import operator
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import torch
from torch import Tensor, nn
from torch.fx import GraphModule, Node

from fxquant.fx.locations import Location, is_internal, stack_trace_frames, stack_trace_location
from fxquant.fx.tracer import LeafSpec, trace
from fxquant.linter.functionalize.graph_ops import (
    call_on_copy,
    gather_view,
    inplace_on_copy,
    keep_dtype,
    scatter_view,
    setitem_on_copy,
    view_index,
    without_grad,
)
from fxquant.linter.functionalize.outcome import (
    HOW_KEY,
    KEPT_KEY,
    REWRITES_KEY,
    FunctionalizeError,
    Rewrite,
)
from fxquant.linter.records import InplaceCall
from fxquant.linter.symbolic import ALIASING, inplace_name, node_op_name

__all__ = ["rewrite_symbolically"]

#: The in-place calls ``x op= y`` makes on tensors (as the function mode names them), and
#: the operator symbolic tracing records for it instead.
_AUGMENTED: Final = {
    "add_": operator.add, "sub_": operator.sub, "mul_": operator.mul,
    "div_": operator.truediv, "floor_divide_": operator.floordiv,
    "remainder_": operator.mod, "pow_": operator.pow, "bitwise_and_": operator.and_,
    "bitwise_or_": operator.or_, "bitwise_xor_": operator.xor,
    "bitwise_left_shift_": operator.lshift, "bitwise_right_shift_": operator.rshift,
    "__iadd__": operator.add, "__isub__": operator.sub, "__imul__": operator.mul,
    "__itruediv__": operator.truediv, "__ifloordiv__": operator.floordiv,
    "__imod__": operator.mod, "__ipow__": operator.pow, "__iand__": operator.and_,
    "__ior__": operator.or_, "__ixor__": operator.xor, "__ilshift__": operator.lshift,
    "__irshift__": operator.rshift,
}
_SYMBOLS: Final = {operator.add: "+", operator.sub: "-", operator.mul: "*",
                   operator.truediv: "/", operator.floordiv: "//", operator.mod: "%",
                   operator.pow: "**", operator.and_: "&", operator.or_: "|",
                   operator.xor: "^", operator.lshift: "<<", operator.rshift: ">>"}
#: In-place methods whose out-of-place namesake does something else (or does not exist).
_ON_COPY: Final = frozenset({
    "copy_", "fill_", "zero_", "uniform_", "normal_", "bernoulli_", "random_",
    "exponential_", "geometric_", "cauchy_", "log_normal_", "fill_diagonal_",
})
_REFUSED_METHODS: Final = frozenset({"set_", "resize_", "resize_as_", "share_memory_"})
_MULTI_VIEW: Final = frozenset({"split", "chunk", "unbind", "tensor_split", "split_with_sizes"})
_ATTR_VIEWS: Final = frozenset({"T", "mT", "H", "mH", "real", "imag"})


@dataclass
class _Write:
    node: Node
    target: Node  # the value written into (as it appears in the traced graph)
    kind: str  # method, function, setitem, augmented, inplace_kwarg, out, module
    hidden: bool = False  # written through `.data` / `.detach()` in the original


def _inplace_kwarg(node: Node) -> bool:
    if node.kwargs.get("inplace") is True:
        return True
    if node.op != "call_function" or "inplace" in node.kwargs:
        return False
    try:
        bound = inspect.signature(node.target).bind(*node.args, **node.kwargs)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return bound.arguments.get("inplace") is True


def _find_write(gm: GraphModule, node: Node, augmented: set[Node]) -> _Write | None:
    if node.op not in ("call_method", "call_function", "call_module"):
        return None
    first = node.args[0] if node.args else None
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        if getattr(module, "inplace", False) is True and isinstance(first, Node):
            return _Write(node, first, "module")
        return None
    out = node.kwargs.get("out")
    if isinstance(out, Node):
        return _Write(node, out, "out")
    if not isinstance(first, Node):
        return None
    if node in augmented:
        return _Write(node, first, "augmented")
    name = node_op_name(node)
    if node.op == "call_function" and node.target is operator.setitem:
        kind = "setitem"
    elif node.op == "call_method" and inplace_name(name):
        kind = "method"
    elif node.op == "call_function" and inplace_name(name):
        kind = "function"
    elif _inplace_kwarg(node):
        kind = "inplace_kwarg"
    else:
        return None
    hidden = _hidden_alias_of(first)
    if hidden is not None:
        # a write through `.data` or `.detach()` that the check found changes no gradient
        # (confirmed ones are refused before): made into a write autograd sees
        node.args = (hidden, *node.args[1:])
        return _Write(node, hidden, kind, hidden=True)
    return _Write(node, first, kind)


def _hidden_alias_of(node: Node) -> Node | None:
    """``x`` for a node computing ``x.data`` or ``x.detach()``, else None."""
    if node.op == "call_function" and node.target is getattr and len(node.args) > 1 \
            and node.args[1] == "data" and isinstance(node.args[0], Node):
        return node.args[0]
    if node.op == "call_method" and node.target == "detach" and node.args \
            and isinstance(node.args[0], Node):
        return node.args[0]
    return None


def _parent(node: Node, writes: dict[Node, _Write]) -> Node | None:
    """The value ``node`` may be a view of (in-place ops return their target)."""
    if node in writes:
        return writes[node].target
    if node.op not in ("call_method", "call_function") or not node.args:
        return None
    first = node.args[0]
    if not isinstance(first, Node):
        return None
    name = node_op_name(node)
    if node.op == "call_function" and node.target is getattr:
        return first if len(node.args) > 1 and node.args[1] in _ATTR_VIEWS else None
    if name in ALIASING or name in _MULTI_VIEW:
        return first
    return None


def _augmented_nodes(gm: GraphModule, calls: list[InplaceCall]) -> set[Node]:
    """``x += y`` nodes: symbolic tracing recorded an out-of-place op where the real run
    wrote in place. Matched by source line and operator, and counted: in-place calls the
    graph records itself (``h.mul_(2)`` on the line of a ``*``) are not augmented ones."""
    wanted: Counter[tuple[Location, Any]] = Counter(
        (c.where, _AUGMENTED[c.name]) for c in calls
        if c.where and c.name in _AUGMENTED and not c.by_library)
    candidates: dict[tuple[Location, Any], list[Node]] = {}
    for node in gm.graph.nodes:
        where = stack_trace_location(node.meta.get("stack_trace"))
        if where is None:
            continue
        name = node_op_name(node)
        if node.op in ("call_method", "call_function") and name in _AUGMENTED \
                and not name.startswith("__"):
            wanted[(where, _AUGMENTED[name])] -= 1  # the graph has this write itself
        elif node.op == "call_function" and node.target in _SYMBOLS:
            candidates.setdefault((where, node.target), []).append(node)
    found: set[Node] = set()
    for key, nodes in candidates.items():
        # ``h += f(h) + 1`` evaluates its right side first: an operator whose result
        # reaches (through ops of the same line) the right operand of another is part of
        # a right side, not the augmented write
        inner = _right_side_nodes(nodes, key[0])
        found.update([n for n in nodes if n not in inner][:max(0, wanted.get(key, 0))])
    return found


def _right_side_nodes(nodes: list[Node], where: Location) -> set[Node]:
    """Those of ``nodes`` that feed, through nodes traced at line ``where``, an operand
    other than the first of one of ``nodes`` (not through that one's first operand: in a
    loop, the value the line wrote the time before)."""
    reached: set[Node] = set()
    for start in nodes:
        target = start.args[0] if start.args else None
        todo = [a for a in (*start.args[1:], *start.kwargs.values()) if isinstance(a, Node)]
        seen: set[Node] = set()
        while todo:
            node = todo.pop()
            if node in seen or node is target \
                    or stack_trace_location(node.meta.get("stack_trace")) != where:
                continue
            seen.add(node)
            todo += node.all_input_nodes
        reached |= seen
    return reached & set(nodes)


class _Rewriter:
    """Renames every read of a written value to its newest version (one pass, in order)."""

    def __init__(self, gm: GraphModule, writes: dict[Node, _Write]) -> None:
        self.gm = gm
        self.graph = gm.graph
        self.writes = writes
        self.order = {n: i for i, n in enumerate(gm.graph.nodes)}
        self.current: dict[Node, Node] = {}
        self.index: dict[Node, Node | None] = {}  # member of a written tree -> its index node
        self.root: dict[Node, Node] = {}
        self.members: dict[Node, list[Node]] = {}  # root -> its views so far
        self.rewrites: list[Rewrite] = []
        self.kept: list[Rewrite] = []
        self.written_roots = {self._root_of(w.target) for w in writes.values()}
        #: module state (buffers) written in place, kept so
        self.state_roots: set[Node] = set()

    def _root_of(self, node: Node) -> Node:
        while (parent := _parent(node, self.writes)) is not None:
            node = parent
        return node

    def cur(self, node: Node) -> Node:
        return self.current.get(node, node)

    def run(self) -> None:
        for node in list(self.graph.nodes):
            if node.op == "output":
                node.args = torch.fx.node.map_arg(node.args, self.cur)
                continue
            node.args = torch.fx.node.map_arg(node.args, self.cur)
            node.kwargs = torch.fx.node.map_arg(node.kwargs, self.cur)
            if node in self.writes:
                self._write(self.writes[node])
            else:
                self._track(node)

    def _insert_after(self, anchor: Node, target: Any, args: tuple) -> Node:
        with self.graph.inserting_after(anchor):
            new = self.graph.call_function(target, args)
        new.meta["stack_trace"] = anchor.meta.get("stack_trace")
        return new

    def _track(self, node: Node) -> None:
        """Give views (possible views) of written values their index into the base."""
        if node in self.written_roots:
            self.root[node] = node
            self.index[node] = None
            self.members[node] = [node]
            return
        parent = _parent(node, self.writes)
        if parent is None or parent not in self.root:
            return
        root = self.root[parent]
        self.root[node] = root
        self.members[root].append(node)
        parent_index = self.index[parent]
        if node.target is operator.getitem and node_op_name(parent) in _MULTI_VIEW \
                and isinstance(node.args[1], int):
            # one piece of chunk/split: its index is the piece's entry of the parent's
            assert parent_index is not None
            self.index[node] = self._insert_after(node, operator.getitem,
                                                  (parent_index, node.args[1]))
            return
        self.index[node] = self._insert_after(node, view_index,
                                              (self.cur(parent), node, parent_index))

    def _write(self, w: _Write) -> None:
        node, target = w.node, w.target
        while target in self.writes:  # an in-place op returns its target: write into that
            target = self.writes[target].target
        root = self._root_of(target)
        if root.op == "get_attr" and not str(root.target).startswith("_tensor_constant"):
            # a buffer or attribute: module state, kept as it is (a `_tensor_constant` is a
            # tensor the forward created, frozen by tracing: rewritten like any value)
            self.kept.append(Rewrite(_where(node), _describe(self.gm, w)[0],
                                     "kept (writes module state)"))
            self.state_roots.add(root)
            return
        before, after = _describe(self.gm, w)
        if w.hidden:
            before = f"{before} through `.data` / `.detach()`"
            after += " (autograd now sees the write; fxquant.check found it changes no gradient)"
        new = self._out_of_place(w)
        if target is not root:
            after += f"; written back into `{root.name}` at the positions the view covers"
        if root.op == "placeholder":
            after += f" (the caller's `{root.target}` is no longer modified)"
        if not (_by_library(node) and _by_library(root)):  # (a library's write into a
            # tensor it made, as PyG's degree() fills its count: rewritten, nothing to say)
            self.rewrites.append(Rewrite(_where(node), before, after))
        if root not in self.root:  # written, but never tracked (a placeholder: track now)
            self.root[root], self.index[root], self.members[root] = root, None, [root]
        anchor = new
        if target is root:
            new_root = new
        else:
            target_index = self.index.get(target)
            new_root = self._insert_after(anchor, scatter_view,
                                          (self.cur(root), target_index, new))
            anchor = new_root
        self.current[root] = new_root
        self.current[node] = new if node is not new else node
        self.current[target] = new
        later = self.order[node]
        for member in self.members[root]:
            if member in (root, target) or not _read_after(member, later, self.order):
                continue
            gathered = self._insert_after(anchor, gather_view,
                                          (new_root, self.index[member], self.cur(member)))
            anchor = gathered
            self.current[member] = gathered
        self.root[node] = root
        self.index[node] = self.index.get(target)

    def _out_of_place(self, w: _Write) -> Node:
        """Turn ``w.node`` into (or replace it by) a node computing the new value."""
        node = w.node
        target_now = node.args[0] if w.kind != "out" else node.kwargs["out"]
        if w.kind in ("augmented", "module", "inplace_kwarg"):
            if w.kind == "module":
                setattr(self.gm.get_submodule(str(node.target)), "inplace", False)  # noqa: B010
            elif w.kind == "inplace_kwarg":
                if "inplace" in node.kwargs:
                    node.kwargs = {**node.kwargs, "inplace": False}
                else:
                    bound = inspect.signature(node.target).bind(  # type: ignore[arg-type]
                        *node.args, **node.kwargs)
                    bound.arguments["inplace"] = False
                    node.args, node.kwargs = bound.args, bound.kwargs
            return node
        if w.kind == "out":
            node.kwargs = {k: v for k, v in node.kwargs.items() if k != "out"}
            return self._keep_dtype(node, target_now)
        if w.kind == "setitem":
            node.target = setitem_on_copy
            return node
        name = node_op_name(node)
        if name in _REFUSED_METHODS:
            raise FunctionalizeError(f"`{name}` changes what a tensor is, not only its values")
        if w.kind == "method":
            plain = name[:-1]
            if name in _ON_COPY or not callable(getattr(Tensor, plain, None)):
                node.op, node.target = "call_function", inplace_on_copy
                node.args = (node.args[0], name, *node.args[1:])
                return node
            node.target = plain
            return self._keep_dtype(node, target_now)
        plain_fn = getattr(torch, name[:-1], None)
        if name in _ON_COPY or plain_fn is None or node.target is not getattr(torch, name, None):
            function: Any = node.target
            node.target = call_on_copy
            node.args = (function, *node.args)
            return node
        node.target = plain_fn
        return self._keep_dtype(node, target_now)

    def _keep_dtype(self, node: Node, old: Any) -> Node:
        with self.graph.inserting_after(node):
            kept = self.graph.call_function(keep_dtype, (node, old))
        kept.meta["stack_trace"] = node.meta.get("stack_trace")
        for user in list(node.users):
            if user is not kept:
                user.replace_input_with(node, kept)
        return kept


def _read_after(node: Node, position: int, order: dict[Node, int]) -> bool:
    # nodes fxquant inserted are not in ``order``: they read the newest versions already
    return any(order.get(u, -1) > position for u in node.users)


def _where(node: Node) -> Location | None:
    return stack_trace_location(node.meta.get("stack_trace"))


#: the tracing machinery's own frames, at the end of every recorded stack
_TRACING_FILES = (os.path.dirname(torch.fx.__file__),
                  os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _by_library(node: Node) -> bool:
    """Whether the innermost frame that made ``node`` is library code (torch's, PyG's),
    below the tracing machinery's frames (never for inputs and module state)."""
    if node.op in ("placeholder", "get_attr"):
        return False
    files = [f for f, _ in stack_trace_frames(node.meta.get("stack_trace"))
             if not f.startswith(_TRACING_FILES)]
    return bool(files) and is_internal(files[-1])


def _describe(gm: GraphModule, w: _Write) -> tuple[str, str]:
    node = w.node
    name = node_op_name(node)
    if w.kind == "augmented":
        symbol = _SYMBOLS[node.target]  # type: ignore[index]
        return f"`x {symbol}= y` (in place)", f"`x = x {symbol} y` (a new tensor)"
    if w.kind == "setitem":
        return "`x[index] = v` (in place)", "`x[index] = v` on a copy of x"
    if w.kind == "module":
        module = gm.get_submodule(str(node.target))
        return f"{type(module).__name__}(inplace=True)", "inplace=False"
    if w.kind == "inplace_kwarg":
        return f"{name}(..., inplace=True)", "inplace=False"
    if w.kind == "out":
        return f"{name}(..., out=...)", f"{name}(...) (a new tensor)"
    prefix = "." if w.kind == "method" else "torch."
    if name in _ON_COPY or (w.kind == "method" and not callable(getattr(Tensor, name[:-1], None))):
        return f"{prefix}{name}(...)", f"{prefix}{name}(...) on a copy"
    return f"{prefix}{name}(...)", f"{prefix}{name[:-1]}(...)"


def _detach_no_grad(gm: GraphModule, no_grad_lines: set[Location]) -> None:
    """Symbolic tracing does not record ``with torch.no_grad():``; what the original
    computed with autograd off (the lines where its torch calls ran so) is computed from
    detached values and detached, so that a write into a buffer there records no history
    (the buffer would carry the step's graph into the next one) and e.g. an EMA buffer
    read after its update passes no gradient on."""
    for node in list(gm.graph.nodes):
        if node.op not in ("call_function", "call_method", "call_module") \
                or node.target is without_grad or _where(node) not in no_grad_lines:
            continue
        for value in node.all_input_nodes:
            if value.op == "call_function" and value.target is without_grad:
                continue
            with gm.graph.inserting_before(node):
                detached = gm.graph.call_function(without_grad, (value,))
            detached.meta["stack_trace"] = node.meta.get("stack_trace")
            node.replace_input_with(value, detached)
        with gm.graph.inserting_after(node):
            detached = gm.graph.call_function(without_grad, (node,))
        detached.meta["stack_trace"] = node.meta.get("stack_trace")
        node.replace_all_uses_with(
            detached, delete_user_cb=lambda user, new=detached: user is not new)


def _read_state_through_copies(gm: GraphModule, roots: set[Node],
                               writes: dict[Node, _Write]) -> None:
    """Module state the forward writes in place is read through a copy taken where it is
    read: an op that saves the buffer it reads (or a view of it) keeps that copy, which the
    next write into the buffer (a second call of the module in the same forward) leaves
    intact. The writes themselves, and the views of the state (which may be written
    through), stay as they are: what reads a view reads a copy of it."""
    views: dict[Node, Node] = {}  # each value aliasing written state -> its root
    for node in gm.graph.nodes:
        if node in roots:
            views[node] = node
            continue
        parent = _parent(node, writes)
        if parent is not None and parent in views:
            views[node] = views[parent]
    for node in list(gm.graph.nodes):
        if node.op not in ("call_function", "call_method", "call_module") or node in writes \
                or node in views or node.target is without_grad \
                or (node.op == "call_method" and str(node.target).endswith("_")):
            continue  # (``detach_``, ``requires_grad_``: about the tensor itself, not a read)
        for value in node.all_input_nodes:
            if value not in views:
                continue
            with gm.graph.inserting_before(node):
                copied = gm.graph.call_method("clone", (value,))
            copied.meta["stack_trace"] = node.meta.get("stack_trace")
            node.replace_input_with(value, copied)


def rewrite_symbolically(model: nn.Module, calls: list[InplaceCall],
              concrete_args: dict[str, Any] | None, leaf_modules: Iterable[LeafSpec],
              no_grad_lines: set[Location] | None = None) -> GraphModule:
    gm = trace(model, concrete_args, leaf_modules)
    augmented = _augmented_nodes(gm, calls)
    writes = {}
    for node in gm.graph.nodes:
        write = _find_write(gm, node, augmented)
        if write is not None:
            writes[node] = write
    rewriter = _Rewriter(gm, writes)
    rewriter.run()
    if rewriter.state_roots:
        _read_state_through_copies(gm, rewriter.state_roots, writes)
    if no_grad_lines:
        _detach_no_grad(gm, no_grad_lines)
    gm.graph.lint()
    gm.recompile()
    gm.meta[REWRITES_KEY] = rewriter.rewrites
    gm.meta[KEPT_KEY] = rewriter.kept
    gm.meta[HOW_KEY] = "symbolic"
    return gm
