"""Rewrite a model so its forward has no in-place ops, and prove it: :func:`functionalize_inplace`.

Four steps:

1. **Diagnose** with the autograd check's protected run (:func:`fxquant.check`'s second
   run): it records every in-place call with its source line and gives the gradients the
   forward's own values imply, also where the real backward crashes. Writes that no rewrite
   can make equivalent are refused here, naming the line: writes into a leaf that requires
   grad (FXQ003) and writes autograd does not see (``.data``, a ``.detach()``ed alias,
   no_grad; FXQ012), whose intended gradient only the author knows.
2. **Rewrite symbolically** on the :func:`fxquant.trace` graph, which keeps the module
   structure: in-place methods and functions become out of place (``x.add_(y)`` ->
   ``x.add(y)``), ``x[idx] = v`` writes into a copy, ``inplace=True`` flags and modules
   become ``inplace=False``, ``out=`` is dropped. ``x += y``, which symbolic tracing records
   as an out-of-place add, is recognized from the recorded run by its source line. Every
   later read of the written value, of the tensor it is a view of, and of the other views
   of that tensor, reads the new value: a write through a view (slicing, ``chunk``,
   ``split``, ``view``, ``reshape`` ...) is scattered back into its base with ``index_put``
   at the positions the view covers, found at run time from the view's strides, and the
   other views are gathered again from the new base. Writes into buffers (running
   statistics, queues) are module state and stay as they are.
3. **Capture** when symbolic tracing fails or its rewrite does not verify: the real forward,
   recorded on the example inputs by :func:`torch.func.functionalize` under ``make_fx``
   (ATen ops, no mutations; specialized to the example's shapes, the branches taken on
   them and its non-tensor arguments: called with others, it raises).
4. **Verify** the candidate on the example inputs, from the same RNG state: the outputs
   (values, dtypes, ``requires_grad``), the buffers after forward, and every parameter's
   and input's gradient must match the reference (the protected run's gradients; where the
   original forward itself raises, a dot-product test against forward-mode AD of the
   original). A candidate that differs is never returned: :class:`FunctionalizeError`.

``gm.meta["fxquant_rewrites"]`` lists the :class:`Rewrite` s made (line, before, after);
``gm.meta["fxquant_functionalized"]`` says how (``"symbolic"`` or ``"captured"``).
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import operator
import os
import warnings
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import torch
from torch import Tensor, nn
from torch.fx import Graph, GraphModule, Node
from torch.fx.experimental.proxy_tensor import make_fx

from fxquant.errors import FxquantError, FxquantRuntimeError, FxquantTypeError, FxquantValueError
from fxquant.fx.locations import (
    Location,
    is_internal,
    stack_trace_frames,
    stack_trace_location,
    traceback_location,
)
from fxquant.fx.serial import PROCESS_LOCK
from fxquant.fx.tracer import LeafSpec, refuse_compiled, trace
from fxquant.linter.checking import both_runs
from fxquant.linter.records import HiddenWrite, InplaceCall
from fxquant.linter.report import LintReport
from fxquant.linter.rules import (
    FORWARD_FAILED,
    INPLACE_MODIFIES_SAVED_TENSOR,
    INPLACE_ON_LEAF,
    INPLACE_REFUSED_IN_FORWARD,
    SILENTLY_WRONG_GRADIENT,
)
from fxquant.linter.shapes import shape_only
from fxquant.linter.state import (
    clone_inputs,
    components,
    copy_model,
    held_tensors,
    named_buffers,
    restored_state,
    snapshot,
)
from fxquant.linter.symbolic import ALIASING, inplace_name, node_op_name
from fxquant.linter.torch_internals import (
    MODULE_HOOK_TABLES,
    module_buffers,
    module_parameters,
    non_persistent_buffers,
    output_tree_spec,
    storage_id,
    tree_flatten,
    tree_leaves,
    tree_map_only,
    tree_unflatten,
)

__all__ = ["FunctionalizeError", "Rewrite", "functionalize_inplace"]

REWRITES_KEY: Final = "fxquant_rewrites"
HOW_KEY: Final = "fxquant_functionalized"


class FunctionalizeError(FxquantError, RuntimeError):
    """functionalize_inplace cannot return an equivalent model; the message says where and why."""


@dataclass(frozen=True)
class Rewrite:
    """One in-place write made out of place: where, what it was, what it became."""

    location: Location | None
    before: str
    after: str

    def __str__(self) -> str:
        code = f" `{self.location.code}`" if self.location and self.location.code else ""
        return f"{self.location or '?'}:{code} {self.before} -> {self.after}"


# -- what the rewritten graphs call -----------------------------------------------------------


def _records_itself(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Called with proxies (a GraphModule is traced again when it is unpickled), record a
    call of ``fn`` instead of running it."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        proxy = next((a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.fx.Proxy)),
                     None)
        if proxy is not None:
            return proxy.tracer.create_proxy("call_function", wrapper, args, kwargs)
        return fn(*args, **kwargs)

    return wrapper


@_records_itself
def setitem_on_copy(x: Tensor, index: Any, value: Any) -> Tensor:
    """``x[index] = value`` on a copy of ``x``; the copy."""
    out = x.clone()
    out[index] = value
    return out


@_records_itself
def inplace_on_copy(x: Tensor, method: str, *args: Any, **kwargs: Any) -> Tensor:
    """``x.<method>(*args)`` (an in-place method) on a copy of ``x``; the copy."""
    out = x.clone()
    getattr(out, method)(*args, **kwargs)
    return out


@_records_itself
def call_on_copy(function: Callable[..., Any], x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """``function(x, *args)`` (which writes into ``x``) on a copy of ``x``; the copy."""
    out = x.clone()
    function(out, *args, **kwargs)
    return out


@_records_itself
def keep_dtype(new: Any, old: Any) -> Any:
    """``new`` in ``old``'s dtype, as the in-place op it replaces would have kept it."""
    if isinstance(new, Tensor) and isinstance(old, Tensor) and new.dtype != old.dtype:
        return new.to(old.dtype)
    return new


_INDEX_CACHE: OrderedDict[tuple[Any, ...], Tensor] = OrderedDict()
_INDEX_CACHE_SIZE: Final = 64


def _positions(t: Tensor) -> Tensor:
    """The storage offset of each element of ``t`` (int64, ``t``'s shape)."""
    pos = torch.full((), int(t.storage_offset()), dtype=torch.long, device=t.device)
    for dim, (size, stride) in enumerate(zip(t.shape, t.stride(), strict=True)):
        shape = [1] * t.dim()
        shape[dim] = size
        pos = pos + (torch.arange(size, device=t.device) * stride).view(shape)
    return pos.expand(t.shape)


def _local_index(parent: Tensor, child: Tensor) -> Tensor:
    """For each element of ``child`` (a view of ``parent``), its flat index in ``parent``."""
    key = (tuple(parent.shape), parent.stride(), parent.storage_offset(), tuple(child.shape),
           child.stride(), child.storage_offset(), parent.device)
    found = _INDEX_CACHE.get(key)
    if found is not None and not (found.is_inference() and not torch.is_inference_mode_enabled()):
        _INDEX_CACHE.move_to_end(key)
        return found
    rel = _positions(child) - int(parent.storage_offset())
    dims = sorted((d for d in range(parent.dim()) if parent.shape[d] != 1),  # size 1: coord 0
                  key=lambda d: -parent.stride()[d])
    flat = torch.zeros_like(rel)
    contiguous = [math.prod(parent.shape[d + 1:]) for d in range(parent.dim())]
    rest = rel
    for d in dims:
        stride = parent.stride(d)
        coord = rest // stride if stride else torch.zeros_like(rest)
        rest = rest - coord * stride if stride else rest
        if bool((coord >= parent.shape[d]).any()) or bool((coord < 0).any()):
            raise FunctionalizeError("a view reaches outside the tensor it was written back into")
        flat = flat + coord * contiguous[d]
    if bool(rest.ne(0).any()):
        raise FunctionalizeError("a view does not line up with the tensor it views")
    if torch.is_inference_mode_enabled():
        return flat  # an inference tensor cannot serve a later training step
    _INDEX_CACHE[key] = flat
    if len(_INDEX_CACHE) > _INDEX_CACHE_SIZE:
        _INDEX_CACHE.popitem(last=False)
    return flat


class _NotAView:
    """The index of a value that is not a view of the written base (its op copied)."""

    def __repr__(self) -> str:
        return "NOT_A_VIEW"


NOT_A_VIEW: Final = _NotAView()


def _shares_memory(a: Tensor, b: Tensor) -> bool:
    return storage_id(a) == storage_id(b) != 0


@_records_itself
def view_index(parent: Any, child: Any, parent_index: Any) -> Any:
    """Flat indices into the written-back base of each element of ``child``, a value
    computed from ``parent`` by an op that may return a view (:data:`NOT_A_VIEW` where it
    did not: ``reshape`` that copied, advanced indexing). ``parent_index`` is the same for
    ``parent`` (None: ``parent`` is the base itself)."""

    def one(c: Tensor) -> Tensor | _NotAView:
        if parent_index is NOT_A_VIEW or not isinstance(parent, Tensor) \
                or not _shares_memory(parent, c):
            return NOT_A_VIEW
        local = _local_index(parent, c)
        return local if parent_index is None else parent_index.reshape(-1)[local]

    return tree_map_only(Tensor, one, child)


@_records_itself
def scatter_view(base: Tensor, index: Tensor | _NotAView, value: Tensor) -> Tensor:
    """``base`` with the elements a view covered (``index``) replaced by ``value``."""
    if index is None:  # the view is the base itself
        return value.to(base.dtype).expand(base.shape)
    if not isinstance(index, Tensor):
        return base
    flat = base.reshape(-1).index_put((index.reshape(-1),),
                                      value.to(base.dtype).expand(index.shape).reshape(-1))
    return flat.view(base.shape)


@_records_itself
def gather_view(base: Tensor, index: Any, old: Any) -> Any:
    """The values a view of ``base`` shows after ``base`` changed (``old`` where the op
    that made it copied instead)."""
    if index is None:
        return base
    if isinstance(old, Tensor):
        return base.reshape(-1)[index] if isinstance(index, Tensor) else old
    flat_old, spec = tree_flatten(old)
    flat_index = tree_leaves(index)
    if len(flat_index) != len(flat_old):
        return old
    return spec.unflatten([gather_view(base, i, o) if isinstance(o, Tensor) else o
                           for i, o in zip(flat_index, flat_old, strict=True)])


# -- the symbolic rewrite --------------------------------------------------------------------

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
_TRACING_FILES = (os.path.dirname(torch.fx.__file__), os.path.dirname(os.path.dirname(__file__)))


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


@_records_itself
def without_grad(value: Any) -> Any:
    """``value`` as code under ``torch.no_grad()`` computes it: its tensors detached."""
    return tree_map_only(Tensor, lambda t: t.detach() if t.requires_grad else t, value)


def _detach_no_grad(gm: GraphModule, no_grad_lines: set[Location]) -> None:
    """Symbolic tracing does not record ``with torch.no_grad():``; the values the original
    computed with autograd off (the lines where its torch calls ran so) are detached, so
    that e.g. an EMA buffer read after its update passes no gradient on."""
    for node in list(gm.graph.nodes):
        if node.op not in ("call_function", "call_method", "call_module") \
                or node.target is without_grad or _where(node) not in no_grad_lines:
            continue
        with gm.graph.inserting_after(node):
            detached = gm.graph.call_function(without_grad, (node,))
        detached.meta["stack_trace"] = node.meta.get("stack_trace")
        node.replace_all_uses_with(
            detached, delete_user_cb=lambda user, new=detached: user is not new)


def _symbolic(model: nn.Module, calls: list[InplaceCall],
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
    if no_grad_lines:
        _detach_no_grad(gm, no_grad_lines)
    gm.graph.lint()
    gm.recompile()
    gm.meta[REWRITES_KEY] = rewriter.rewrites
    gm.meta["fxquant_kept"] = rewriter.kept
    gm.meta[HOW_KEY] = "symbolic"
    return gm


# -- capturing the real forward ---------------------------------------------------------------


@_records_itself
def _copy_functional(self: Tensor, src: Tensor) -> Tensor:
    """What ``aten.copy`` (functional ``copy_``) computes, with a derivative for ``src``."""
    return src.to(dtype=self.dtype, device=self.device).expand(self.shape).clone()


def _tensor_fields(obj: Any) -> list[str] | None:
    """Names of the tensor attributes of a PyG Data-like input, or None for other inputs."""
    stores = getattr(obj, "stores", None)
    if stores is None or len(stores) != 1:
        return None
    return [k for k, v in obj.items() if isinstance(v, Tensor)]


def _capture(model: nn.Module, example_inputs: tuple,
             calls: list[InplaceCall]) -> GraphModule:
    for module in model.modules():  # plain tensor attributes are state too (self.history)
        for key, value in list(vars(module).items()):
            if isinstance(value, Tensor) and not isinstance(value, nn.Parameter):
                delattr(module, key)
                module.register_buffer(key, value, persistent=False)
    state = {**dict(model.named_parameters()), **dict(named_buffers(model))}
    names = list(state)
    layout: list[tuple[str, Any]] = []  # per input: ("tensor", None) / ("data", ...) / ("const", v)
    flat: list[Tensor] = []
    for value in example_inputs:
        fields = _tensor_fields(value)
        if isinstance(value, Tensor):
            layout.append(("tensor", None))
            flat.append(value)
        elif fields is not None:
            layout.append(("data", (type(value), value, fields)))
            flat.extend(getattr(value, f) for f in fields)
        else:
            layout.append(("const", value))

    def rebuild(tensors: list[Tensor]) -> list[Any]:
        out, it = [], iter(tensors)
        for kind, info in layout:
            if kind == "tensor":
                out.append(next(it))
            elif kind == "data":
                _, original, fields = info
                copy_ = original.clone()
                for f in fields:
                    setattr(copy_, f, next(it))
                out.append(copy_)
            else:
                out.append(info)
        return out

    def run(params: list[Tensor], tensors: list[Tensor]) -> Any:
        return torch.func.functional_call(model, dict(zip(names, params, strict=True)),
                                          tuple(rebuild(tensors)))

    with restored_state(model):
        args = ([state[n].detach() for n in names], [t.detach() for t in flat])
        captured = make_fx(torch.func.functionalize(run, remove="mutations"),
                           tracing_mode="real")(*args)
    for node in captured.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.copy.default:
            node.target = _copy_functional
    captured.recompile()
    gm = _as_module(model, captured, names, layout, example_inputs)
    gm.meta[REWRITES_KEY] = [
        Rewrite(c.where, f"`{c.name}` (in place)", "functional ATen ops (torch.func.functionalize)")
        for c in calls if not c.by_library or c.requested]  # (not torch's or PyG's own writes)
    gm.meta["fxquant_kept"] = []
    gm.meta[HOW_KEY] = "captured"
    return gm


def _as_module(model: nn.Module, captured: GraphModule, names: list[str],
               layout: list[tuple[str, Any]], example_inputs: tuple) -> GraphModule:
    """Re-root the captured graph on ``model``: parameters become get_attr nodes again."""
    graph = Graph()
    placeholders = [n for n in captured.graph.nodes if n.op == "placeholder"]
    env: dict[Node, Node] = {}
    state_nodes = [graph.get_attr(name) for name in names]
    inputs: list[Node] = []
    arguments: list[Node] = []
    for i, (kind, info) in enumerate(layout):
        if kind == "tensor":
            tensor = graph.placeholder(f"input_{i}")
            inputs.append(tensor)
            arguments.append(tensor)
        elif kind == "data":
            data = graph.placeholder(f"data_{i}" if i else "data")
            arguments.append(data)
            inputs += [graph.call_function(getattr, (data, f)) for f in info[2]]
        else:  # a non-tensor argument: captured as it was
            arguments.append(graph.placeholder(f"arg_{i}"))
    # arguments the example did not pass reach the guard, which names them
    extra, named = graph.placeholder("*extra_arguments"), graph.placeholder("**named_arguments")
    env.update(zip(placeholders, state_nodes + inputs, strict=True))
    root = copy.copy(model)  # shares the (already copied) parameters
    for node in captured.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "get_attr":  # constants make_fx captured (e.g. tensors in attributes)
            fresh = f"_captured_{node.target}"
            setattr(root, fresh, getattr(captured, str(node.target)))
            env[node] = graph.get_attr(fresh)
            continue
        if node.op == "output":
            flat_out = torch.fx.node.map_arg(node.args[0], lambda n: env[n])
            spec = output_tree_spec(captured)
            if spec is not None:
                flat_out = tree_unflatten(list(flat_out), spec)
            graph.output(flat_out)
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    _read_state_through_copies(graph)
    root.add_module("fxquant_captured_mode", CapturedMode(model.training, [
        _signature(kind, info, example) for (kind, info), example in zip(
            layout, example_inputs, strict=True)], _parameter_names(model)))
    mine = [n for n in graph.nodes if n.op == "placeholder"]  # (Data fields in between)
    with graph.inserting_after(mine[-1]):
        graph.call_module("fxquant_captured_mode", tuple(arguments),
                          {"extra": extra, "named": named})
    return GraphModule(root, graph, f"Functional{type(model).__name__}")


def _parameter_names(model: nn.Module) -> list[tuple[str, Any]]:
    """``model.forward``'s positional parameters as ``(name, default)`` (default
    ``inspect.Parameter.empty`` where there is none; [] where Python cannot tell)."""
    try:
        parameters = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    return [(p.name, p.default) for p in parameters
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _signature(kind: str, info: Any, example: Any) -> tuple:
    """What a captured forward assumes of one argument: a tensor's shape and dtype (a
    Data's, field by field), a non-tensor argument's value."""
    if kind == "tensor":
        return ("tensor", tuple(example.shape), example.dtype)
    if kind == "data":
        return ("data", tuple((f, tuple(getattr(example, f).shape), getattr(example, f).dtype)
                              for f in info[2]))
    return ("value", example)


def _same_value(a: Any, b: Any) -> bool:
    if a is b:
        return True
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (a, b))
    try:
        return (type(a) is type(b) or numbers) and bool(a == b)
    except Exception:  # (values whose == is not a truth value)
        return False


def _mismatch(i: int, expected: tuple, got: Any) -> str | None:
    """How argument ``i`` differs from what the forward was captured with (None: it fits)."""
    kind = expected[0]
    if kind == "tensor":
        if not isinstance(got, Tensor):
            return f"argument {i} was a tensor, got {type(got).__name__}"
        if (tuple(got.shape), got.dtype) != expected[1:]:
            return (f"argument {i} had shape {list(expected[1])} ({expected[2]}), got "
                    f"{list(got.shape)} ({got.dtype})")
        return None
    if kind == "data":
        for field, shape, dtype in expected[1]:
            value = getattr(got, field, None)
            if not isinstance(value, Tensor) or (tuple(value.shape), value.dtype) != (shape, dtype):
                now = f"{list(value.shape)} ({value.dtype})" if isinstance(value, Tensor) \
                    else type(value).__name__
                return f"argument {i}'s {field} had shape {list(shape)} ({dtype}), got {now}"
        return None
    if not _same_value(expected[1], got):
        return f"argument {i} was {expected[1]!r}, got {got!r}"
    return None


class CapturedMode(nn.Module):
    """A captured forward holds the ops of the mode it was captured in (dropout masks,
    batch statistics) and of its example: shapes, branches taken on them, non-tensor
    arguments. It raises in the other mode, or for arguments that differ, instead of
    running ops that do not fit them."""

    def __init__(self, captured_training: bool, signature: list[tuple] | None = None,
                 parameters: list[tuple[str, Any]] | None = None) -> None:
        super().__init__()
        self.captured_training = captured_training
        self.signature = signature
        self.parameters_of_forward = parameters or []

    def forward(self, *arguments: Any, extra: tuple = (),
                named: dict[str, Any] | None = None) -> None:
        if self.training != self.captured_training:
            mode = "train" if self.captured_training else "eval"
            raise FxquantRuntimeError(
                f"fxquant: this forward was captured in {mode} mode and holds that mode's "
                f"ops; call functionalize_inplace on the model in the mode you run it in")
        signature = getattr(self, "signature", None)  # (None: captured by an older fxquant)
        if signature is None or any(isinstance(a, torch.fx.Proxy)
                                    for a in (*arguments, extra, named)):
            return  # (traced symbolically: no values to check)
        if extra or named:
            self._refuse_unseen(len(arguments), extra, named or {})
        for i, (expected, got) in enumerate(zip(signature, arguments, strict=False)):
            why = _mismatch(i, expected, got)
            if why is not None:
                raise FxquantRuntimeError(
                    f"fxquant: this forward was captured from one example and holds its shapes, "
                    f"the branches taken on them and its non-tensor arguments; {why}. Please "
                    "call functionalize_inplace with an example like the inputs you run, or "
                    "rewrite the in-place ops in the source (see gm.meta['fxquant_rewrites'])")

    def _refuse_unseen(self, count: int, extra: tuple, named: dict[str, Any]) -> None:
        """Arguments past the example's ``count``: those equal to forward's default run as
        captured (the example ran with the default); any other raises, naming them."""
        known = getattr(self, "parameters_of_forward", [])
        defaults = dict(known)
        names = [name for name, _ in known]
        given = [(names[count + k] if count + k < len(names) else f"argument {count + k}",
                  value, False) for k, value in enumerate(extra)]
        given += [(name, value, True) for name, value in named.items()]
        unseen = [f"{name} (by keyword)" if keyword and name not in names[count:] else name
                  for name, value, keyword in given
                  if name not in defaults or name in names[:count] or not _same_value(
                      defaults[name], value) or defaults[name] is inspect.Parameter.empty]
        if not unseen:
            return
        example = ", ".join(names[:count]) or f"{count} argument(s)"
        raise FxquantRuntimeError(
            f"fxquant: this forward was captured from an example of {count} positional "
            f"argument(s) ({example}) and runs only with those (and defaults); got "
            f"{', '.join(unseen)} besides. Please call functionalize_inplace with an example "
            "that passes them (positionally, in forward's order), or rewrite the in-place "
            "ops in the source (see gm.meta['fxquant_rewrites'])")


def _read_state_through_copies(graph: Graph) -> None:
    """functionalize writes each changed buffer back at the end (``copy_``); a value
    autograd saved that views the buffer would then change under it. The graph reads a
    copy of such a buffer instead."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.copy_.default:
            continue
        state = node.args[0]
        if not isinstance(state, Node) or state.op != "get_attr":
            continue
        with graph.inserting_after(state):
            copy_ = graph.call_function(torch.ops.aten.clone.default, (state,))
        for user in list(state.users):
            if user is not node and user is not copy_:
                user.replace_input_with(state, copy_)


# -- the reference and the verification -------------------------------------------------------


def _weights(out: Any) -> list[Tensor | None]:
    g = torch.Generator().manual_seed(20261130)
    return [torch.randn(t.shape, generator=g, dtype=t.dtype).to(t.device)
            if isinstance(t, Tensor) and t.is_floating_point() else None
            for t in tree_leaves(out)]


def _loss(out: Any) -> Tensor:
    """A random-weighted sum of the outputs, so no gradient cancels by symmetry."""
    terms = [(t * w).sum() for t, w in zip(tree_leaves(out), _weights(out), strict=True)
             if w is not None and isinstance(t, Tensor) and t.requires_grad]
    if not terms:
        raise FunctionalizeError("the model returned no floating-point output that requires "
                                 "grad, so there is no gradient to keep intact")
    return torch.stack(terms).sum()


@dataclass
class _Reference:
    outputs: Any
    requires_grad: list[bool] | None
    buffers: dict[str, Tensor]
    grads: dict[str, Tensor | None] | None
    input_grads: list[Tensor | None]
    forward_raised: bool
    report: LintReport
    calls: list[InplaceCall]
    hidden: list[HiddenWrite]
    state: dict[str, Any]  # module attributes the forward changes: their new values
    other_rng: Tensor  # a second RNG state, to catch random draws frozen into a graph
    other_outputs: Any
    no_grad_lines: set[Location] = field(default_factory=set)  # ran with autograd off


def _plain_attributes(model: nn.Module) -> dict[str, Any]:
    """Plain attributes of every module (not parameters, buffers or submodules): tensors
    (copied) and Python numbers, strings and bools, by qualified name."""
    found: dict[str, Any] = {}
    for name, module in model.named_modules():
        for key, value in vars(module).items():
            if key.startswith("_") or key == "training":
                continue
            if isinstance(value, Tensor) and not isinstance(value, nn.Parameter):
                found[f"{name}.{key}" if name else key] = snapshot(value)
            elif isinstance(value, bool | int | float | str):
                found[f"{name}.{key}" if name else key] = value
    return found


def _changed(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    changed = {}
    for key, value in after.items():
        old = before.get(key)
        same = (isinstance(old, Tensor) and isinstance(value, Tensor)
                and _close(old, value, 0.0, 0.0)) \
            or (not isinstance(value, Tensor) and old == value)
        if not same:
            changed[key] = value
    return changed


def _plain_run(model: nn.Module, inputs: tuple, rng: Tensor
               ) -> tuple[Any, dict[str, Tensor], dict[str, Any]]:
    """The forward's values with autograd off (where writes into any view are legal), the
    buffers after it, and the plain module attributes it changed."""
    with restored_state(model):
        torch.set_rng_state(rng)
        before = _plain_attributes(model)
        with torch.no_grad():
            out = model(*clone_inputs(inputs))
        buffers = {n: snapshot(b) for n, b in named_buffers(model)}
        state = _changed(before, _plain_attributes(model))
    return tree_map_only(Tensor, lambda t: t.detach().clone(), out), buffers, state


def _reference(model: nn.Module, inputs: tuple, rng: Tensor) -> _Reference:
    report = LintReport(mode="check")
    run = both_runs(model, inputs, _loss, rng, report)
    g = torch.Generator().manual_seed(int(rng.sum()) + 1)
    other_rng = torch.Generator().manual_seed(int(torch.randint(2**62, (), generator=g)))
    other = other_rng.get_state()
    try:
        outputs, buffers, state = _plain_run(model, inputs, rng)
        other_outputs, _, _ = _plain_run(model, inputs, other)
    except Exception as e:  # not even without autograd: there is no result to reproduce
        at = traceback_location(e)
        found = "".join(f"\n  {f.rule} at {f.where}: {f.message}" for f in report.errors)
        raise FunctionalizeError(
            f"the original forward raises even with autograd off"
            f"{f' at {at}' if at else ''} ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}), so there is no result an "
            f"out-of-place rewrite could reproduce; fix it first:{found}") from e
    flags = None
    if run.outputs is not None:
        flags = [t.requires_grad for t in tree_leaves(run.outputs) if isinstance(t, Tensor)]
    return _Reference(outputs, flags, buffers, run.grads, run.input_grads,
                      bool(report.by_rule(INPLACE_REFUSED_IN_FORWARD.id)), report, run.rec.inplace_calls,
                      run.confirmed, state, other, other_outputs, run.rec.no_grad_lines)


def _refuse_unfixable(report: LintReport, hidden: list[HiddenWrite]) -> None:
    reasons = []
    for write in hidden:
        reasons.append(
            f"{write.where or '?'}: `{write.code}` changes {write.target} {write.how}, which "
            "autograd does not see: an out-of-place rewrite would have to choose a gradient "
            "for it, and which one was meant only the author knows. Fix: compute the new "
            "value out of place (`y = f(y)`) to differentiate through it, or write a "
            "straight-through estimator explicitly, `y = y + (f(y) - y).detach()`")
    for f in report.errors:
        if f.rule == INPLACE_ON_LEAF.id and f.related != "checkpoint":  # (a segment's input: its
            # write is only refused when backward re-runs it; out of place, it is not)
            reasons.append(f"{f.where}: `{f.location.code if f.location else f.node}` writes in "
                           "place into a leaf tensor that requires grad (a parameter or an input): "
                           "no out-of-place rewrite computes the same thing, because the leaf "
                           f"itself changes. Fix: {f.hint}")
        elif f.rule == SILENTLY_WRONG_GRADIENT.id and (f.location is None or f.location not in {
                w.where for w in hidden}):
            reasons.append(f"{f.where}: {f.message} Which gradient was meant only the author "
                           f"knows. Fix: {f.hint}")
        elif f.rule == FORWARD_FAILED.id and not report.by_rule(INPLACE_MODIFIES_SAVED_TENSOR.id) and \
                not report.by_rule(INPLACE_REFUSED_IN_FORWARD.id):
            reasons.append(f"{f.where}: {f.message}")
    if reasons:
        raise FunctionalizeError(
            "functionalize_inplace cannot make this model equivalent out of place:\n  "
            + "\n  ".join(reasons))


def _close(a: Any, b: Any, rtol: float, atol: float) -> bool:
    """Equal within tolerance: dense tensors by value, sparse ones by their index and
    value tensors, objects holding tensors (a ``SparseTensor``) by the tensors they hold."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        if isinstance(a, Tensor) or (type(a) is not type(b) and not isinstance(b, list)):
            return False
        mine, theirs = held_tensors(a), b if isinstance(b, list) else held_tensors(b)
        return len(mine) == len(theirs) and all(
            _close(x, y, rtol, atol) for x, y in zip(mine, theirs, strict=True))
    if a.layout != b.layout or a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.layout != torch.strided:
        if a.layout == torch.sparse_coo:
            a, b = a.detach().coalesce(), b.detach().coalesce()
        return all(_close(x, y, rtol, atol)
                   for x, y in zip(components(a), components(b), strict=True))
    return torch.allclose(a.detach().double(), b.detach().double(), rtol=rtol, atol=atol,
                          equal_nan=True)


def _carry_state(original: nn.Module, gm: GraphModule) -> None:
    """Give ``gm`` every parameter and buffer of ``original`` its graph does not use (a
    counter the forward only updates, state read elsewhere), under the same name and
    persistence; constants the graph holds (a tensor the forward creates) are not saved:
    state dicts load both ways."""
    keys = set(original.state_dict())
    for name, _ in named_buffers(gm):
        if name not in keys:
            owner_name, _, attr = name.rpartition(".")
            non_persistent_buffers(gm.get_submodule(owner_name)).add(attr)
    for name, value in [*original.named_parameters(), *named_buffers(original)]:
        owner_name, _, attr = name.rpartition(".")
        try:
            there = gm.get_submodule(owner_name)
        except AttributeError:
            there = None
        if there is not None and attr in (module_parameters(there)
                                          if isinstance(value, nn.Parameter)
                                          else module_buffers(there)):
            continue
        owner: nn.Module = gm
        for part in owner_name.split(".") if owner_name else ():
            child = getattr(owner, part, None)
            if not isinstance(child, nn.Module):
                child = nn.Module()
                owner.add_module(part, child)
            owner = child
        source = original.get_submodule(owner_name)
        if isinstance(value, nn.Parameter):
            owner.register_parameter(attr, value)
        else:
            owner.register_buffer(attr, value,
                                  persistent=attr not in non_persistent_buffers(source))


def _dropped_hooks(candidate: nn.Module, original: nn.Module) -> str | None:
    """The first module of ``original`` with hooks (``register_forward_hook``,
    ``register_full_backward_hook``, ...) that ``candidate`` no longer calls with them: a
    graph that inlined it, or replaced the call, runs no hook, and no output or gradient
    comparison sees a hook's side effects."""
    graph = getattr(candidate, "graph", None)
    called = {str(n.target) for n in graph.nodes if n.op == "call_module"} \
        if isinstance(graph, torch.fx.Graph) else None
    for name, module in original.named_modules():
        counts = [len(getattr(module, table, {})) for table in MODULE_HOOK_TABLES]
        if not any(counts):
            continue
        try:
            twin = candidate.get_submodule(name)
        except AttributeError:
            twin = None
        kept = twin is not None and (not name or called is None or name in called) and \
            [len(getattr(twin, table, {})) for table in MODULE_HOOK_TABLES] == counts
        if not kept:
            where = f"module {name!r} ({type(module).__name__})" if name else "the model itself"
            return (f"it no longer runs the hooks registered on {where} (a forward or backward "
                    "hook), which its graph does not call as a module")
    return None


def _verify(candidate: nn.Module, original: nn.Module, ref: _Reference, inputs: tuple,
            rng: Tensor, rtol: float, atol: float) -> str | None:
    """None when ``candidate`` matches the reference; else what differs."""
    dropped = _dropped_hooks(candidate, original)
    if dropped is not None:
        return dropped
    with restored_state(candidate):
        torch.set_rng_state(rng)
        for p in candidate.parameters():
            p.grad = None
        copies = clone_inputs(inputs)
        leaves = [t for t in tree_leaves(copies) if isinstance(t, Tensor) and t.requires_grad]
        try:
            out = candidate(*copies)
        except Exception as e:
            return f"its forward raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        got, got_spec = tree_flatten(out)
        want, want_spec = tree_flatten(ref.outputs)
        if got_spec != want_spec:
            return f"its output has another structure ({got_spec} instead of {want_spec})"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            if isinstance(w, Tensor):
                if not isinstance(g, Tensor) or not _close(g, w, rtol, atol):
                    return f"output {i} differs"
            elif g != w:
                return f"output {i} differs ({g!r} instead of {w!r})"
        flags = [t.requires_grad for t in got if isinstance(t, Tensor)]
        if ref.requires_grad is not None and flags != ref.requires_grad:
            return f"its outputs' requires_grad is {flags}, the original's {ref.requires_grad}"
        buffers = dict(named_buffers(candidate))
        for name, value in ref.buffers.items():
            if name not in buffers:
                return f"it has no buffer {name!r}"
            if not _close(buffers[name], value, rtol, atol):
                return f"buffer {name!r} differs after forward"
        mine, theirs = set(candidate.state_dict()), set(original.state_dict())
        if mine != theirs:
            return (f"its state_dict has other entries (missing {sorted(theirs - mine)}, "
                    f"extra {sorted(mine - theirs)}): the original's would not load into it")
        for name, value in ref.state.items():
            module_name, _, attribute = name.rpartition(".")
            try:
                got_value = getattr(candidate.get_submodule(module_name), attribute)
            except AttributeError:
                got_value = None
            if isinstance(value, Tensor):
                ok = isinstance(got_value, Tensor) and _close(got_value, value, rtol, atol)
            else:
                ok = got_value == value
            if not ok:
                return (f"the original's forward changes `{name}`, module state the rewrite "
                        "does not reproduce")
        try:
            _loss(out).backward()
        except Exception as e:
            return f"its backward raised {type(e).__name__}: {str(e).splitlines()[0]}"
        grads = {n: None if p.grad is None else p.grad.detach().clone()
                 for n, p in candidate.named_parameters() if p.requires_grad}
        input_grads = [t.grad for t in leaves]
    with restored_state(candidate), torch.no_grad():  # random draws must not be frozen
        torch.set_rng_state(ref.other_rng)
        again = tree_leaves(candidate(*clone_inputs(inputs)))
        if not all(_close(a, b, rtol, atol) if isinstance(b, Tensor) else a == b
                   for a, b in zip(again, tree_leaves(ref.other_outputs), strict=True)):
            return ("from another RNG state its outputs differ from the original's: a random "
                    "draw of the forward (torch.randn, dropout) was frozen into the graph")
    if ref.grads is not None and not ref.forward_raised:
        for name, want_grad in ref.grads.items():
            if name not in grads:
                return f"it has no parameter {name!r}"
            got_grad = grads[name]
            if (got_grad is None) != (want_grad is None) or (
                    got_grad is not None and want_grad is not None
                    and not _close(got_grad, want_grad, rtol, atol)):
                return f"the gradient of {name!r} differs"
        for i, (g, w) in enumerate(zip(input_grads, ref.input_grads, strict=False)):
            if (g is None) != (w is None) or (g is not None and w is not None
                                              and not _close(g, w, rtol, atol)):
                return f"the gradient of input {i} differs"
        return None
    return _dot_product_test(original, inputs, rng, grads, ref, rtol)


def _directional_derivative(original: nn.Module, inputs: tuple, rng: Tensor,
                            tangents: dict[str, Tensor]) -> list[Tensor | None]:
    """d(outputs)/d(parameters) along ``tangents``, of the original program: forward-mode
    AD (no saved tensors, so it runs where backward cannot), or, for ops without a forward
    derivative (``out=``), central differences in float64."""
    import torch.autograd.forward_ad as fwad

    params = {n: p for n, p in original.named_parameters() if n in tangents}
    with restored_state(original):
        torch.set_rng_state(rng)
        try:
            with torch.no_grad(), fwad.dual_level():
                duals = {n: fwad.make_dual(p.detach(), tangents[n]) for n, p in params.items()}
                out = torch.func.functional_call(original, duals, clone_inputs(inputs))
                return [fwad.unpack_dual(t).tangent if isinstance(t, Tensor) else None
                        for t in tree_leaves(out)]
        except (NotImplementedError, RuntimeError):
            pass
    wide = copy_model(original).double()
    wide_inputs = tree_map_only(Tensor, lambda t: t.double() if t.is_floating_point() else t,
                                clone_inputs(inputs))
    eps = 1e-6

    def at(sign: float) -> list[Any]:
        shifted = {n: (p.detach().double() + sign * eps * tangents[n].double())
                   for n, p in params.items()}
        torch.set_rng_state(rng)
        with torch.no_grad():
            return tree_leaves(torch.func.functional_call(wide, shifted, wide_inputs))

    with restored_state(wide):
        plus, minus = at(1.0), at(-1.0)
    return [(a - b) / (2 * eps) if isinstance(a, Tensor) and a.is_floating_point() else None
            for a, b in zip(plus, minus, strict=True)]


def _dot_product_test(original: nn.Module, inputs: tuple, rng: Tensor,
                      grads: dict[str, Tensor | None], ref: _Reference, rtol: float) -> str | None:
    """Where the original's backward cannot run at all: <w, J v> from the original's
    directional derivative must equal <J^T w, v> from the candidate's backward."""
    g = torch.Generator().manual_seed(7)
    tangents = {n: torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device)
                for n, p in original.named_parameters() if p.requires_grad}
    try:
        jvp = _directional_derivative(original, inputs, rng, tangents)
    except Exception as e:
        return ("its gradients cannot be checked: the original's directional derivative "
                f"raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    weights = _weights(ref.outputs)
    lhs = sum((float((w.double() * t.double()).sum()) for w, t in zip(weights, jvp, strict=True)
               if w is not None and t is not None), 0.0)
    present = {n: g for n, g in grads.items() if g is not None}
    rhs = sum((float((present[n].double() * tangents[n].double()).sum())
               for n in tangents if n in present), 0.0)
    eps = max((torch.finfo(t.dtype).eps for t in tangents.values()), default=0.0)
    if abs(lhs - rhs) > max(rtol * 10, 1e-4, 8 * eps) * (abs(lhs) + abs(rhs)) + 1e-5:
        return f"its gradients fail the dot-product test (<w, Jv> = {lhs:.6g}, <J^T w, v> = {rhs:.6g})"
    return None


def functionalize_inplace(
    model: nn.Module,
    *example_inputs: Any,
    concrete_args: dict[str, Any] | None = None,
    leaf_modules: Iterable[LeafSpec] = (),
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> nn.Module:
    """The same forward as ``model`` without in-place ops, verified on ``example_inputs``.

    Fixes what breaks backward (``+=``, ``*=``, ``clamp_``, ``relu_`` ... on saved values;
    ``x[i] = v``, ``x[:, a:b] = v``, ``masked_fill_``, ``index_put_``, ``copy_`` into views,
    also through ``chunk``/``split``/``view``; ``out=``; ``nn.ReLU(inplace=True)``) and keeps
    what was legal. The result is checked on the example inputs before it is returned:
    outputs, their ``requires_grad``, buffers after forward (counters, EMAs), the
    state_dict's entries and every parameter's gradient must match what the original's
    forward implies (see the module docstring). A model in which :func:`fxquant.check`
    finds nothing that breaks backward, and which no rewrite reproduces exactly, is
    returned as it is (a copy), with a warning that nothing needed rewriting.

    Args:
        model (torch.nn.Module): the model; not modified (the result owns a copy).
        *example_inputs: forward arguments; the rewrite is verified on them.
        concrete_args, leaf_modules: passed to :func:`fxquant.trace`.
        rtol, atol (float, optional): tolerance of the verification.

    Returns:
        torch.fx.GraphModule: ``gm.meta["fxquant_rewrites"]`` lists each :class:`Rewrite`
        (line, before, after); ``gm.meta["fxquant_functionalized"]`` is ``"symbolic"`` or
        ``"captured"`` (an ATen graph specialized to the example's shapes, branches and
        non-tensor arguments, which raises when called with others, or with arguments the
        example did not pass, other than forward's defaults).
        For a model that needed nothing rewritten and that no rewrite reproduces, a copy
        of ``model`` itself (same class and state), with a :class:`UserWarning`.

    Raises:
        FunctionalizeError: the model writes into a leaf that requires grad, writes where
            autograd does not see it (``.data``) in a way that changes gradients, or breaks
            backward and no rewrite reproduced it; the message names the line and the fix.

    Example:
        >>> class Model(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.lin = torch.nn.Linear(3, 3)
        ...     def forward(self, x):
        ...         y = torch.exp(self.lin(x))
        ...         y += 1  # exp saved y: backward fails
        ...         return y * 2
        >>> gm = functionalize_inplace(Model(), torch.randn(2, 3))
        >>> [(r.before, r.after) for r in gm.meta["fxquant_rewrites"]]
        [('`x += y` (in place)', '`x = x + y` (a new tensor)')]
    """
    if not isinstance(model, nn.Module):
        raise FxquantTypeError("fxquant.functionalize_inplace expects a torch.nn.Module, got "
                        f"{type(model).__name__}")
    refuse_compiled(model, "functionalize_inplace")
    if not example_inputs:
        raise FxquantTypeError("functionalize_inplace verifies its rewrite on example inputs: please "
                        "pass them, functionalize_inplace(model, *inputs)")
    if shape_only(example_inputs):
        raise FxquantValueError("functionalize_inplace verifies its rewrite on values, but some example "
                         "inputs are shapes only (ShapeSpec or meta tensors): pass real tensors")
    with PROCESS_LOCK, restored_state(model), torch.enable_grad():
        rng = torch.get_rng_state()
        original = copy_model(model)
        ref = _reference(original, example_inputs, rng)
        _refuse_unfixable(ref.report, ref.hidden)
        failures: list[str] = []
        candidates: list[tuple[str, Callable[[], GraphModule]]] = [
            ("the symbolic rewrite", lambda: _symbolic(copy_model(model), ref.calls,
                                                       concrete_args, leaf_modules,
                                                       ref.no_grad_lines)),
            ("the captured forward", lambda: _capture(copy_model(model), example_inputs,
                                                      ref.calls)),
        ]
        for label, build in candidates:
            try:
                gm = build()
                _carry_state(original, gm)
                problem = _verify(gm, original, ref, example_inputs, rng, rtol, atol)
            except KeyboardInterrupt:
                raise
            except Exception as e:  # a rewrite fxquant cannot build or run is not returned
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                failures.append(f"{label} could not be built: {first}")
                continue
            if problem is None:
                return gm
            failures.append(f"{label} does not match the original: {problem}")
        if not ref.report.errors:
            warnings.warn(
                "functionalize_inplace: fxquant.check finds nothing in this model that breaks "
                "backward, so nothing needed rewriting, and no out-of-place rewrite matched it "
                "exactly (" + "; ".join(failures) + "): the model is returned as it is (a "
                "copy, state included)", UserWarning, stacklevel=2)
            return copy_model(model)
    legal = "".join(f"\nfxquant.check reports {f.rule} at {f.where}: {f.message}"
                    for f in ref.report.errors)
    raise FunctionalizeError(
        "functionalize_inplace found no rewrite that matches the original on the example "
        "inputs, so it returns none:\n  " + "\n  ".join(failures) + legal)
