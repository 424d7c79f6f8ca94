"""Rewrite a model so its forward has no in-place ops: :func:`functionalize_inplace`.

Two ways, as the code allows:

- **symbolic**: the model traces with :func:`fxquant.trace`; in-place method calls
  (``x.add_(y)`` -> ``x.add(y)``), in-place functions (``torch.relu_`` -> ``torch.relu``),
  ``inplace=True`` arguments and modules, and ``out=`` become out of place, and later uses
  of the written value read the new node. The module structure and train/eval switches
  stay as they are.
- **captured**: code symbolic tracing cannot follow (``x[idx] = v``, data-dependent
  Python) is captured as it really runs on the example inputs with
  :func:`torch.func.functionalize` under ``make_fx``: an ATen-level graph without mutations
  that reads the model's own parameters, so backward reaches them. It is specialized to
  what the example run did (branches, shapes of Python-level loops, dropout's mode).

``gm.meta["fxquant_rewrites"]`` lists what was rewritten (documented key).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.fx import Graph, GraphModule, Node
from torch.fx.experimental.proxy_tensor import make_fx

from fxquant.fx.tracer import TraceError, trace
from fxquant.linter.state import clone_inputs, restored_state
from fxquant.linter.symbolic import aliases, inplace_name, node_op_name

__all__ = ["functionalize_inplace"]

REWRITES_KEY = "fxquant_rewrites"


def functionalize_inplace(
    model: nn.Module,
    *example_inputs: Any,
    concrete_args: dict[str, Any] | None = None,
    leaf_modules: Iterable[str | type[nn.Module]] = (),
) -> GraphModule:
    """A GraphModule computing the same forward as ``model`` without in-place ops.

    Tries the symbolic rewrite first; when the model cannot be traced symbolically (or the
    rewritten graph does not reproduce the model's output bit for bit on the example
    inputs), captures the real forward with :func:`torch.func.functionalize`.

    Args:
        model (torch.nn.Module): the model; not modified (the result owns a copy).
        *example_inputs: forward arguments, needed for the captured path and used to
            check the symbolic rewrite.
        concrete_args, leaf_modules: passed to :func:`fxquant.trace`.

    Returns:
        torch.fx.GraphModule: with ``gm.meta["fxquant_rewrites"]``, a list of what changed.

    Example:
        >>> class Model(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.lin = torch.nn.Linear(3, 3)
        ...     def forward(self, x):
        ...         y = torch.exp(self.lin(x))
        ...         y.add_(1)
        ...         return y * 2
        >>> gm = functionalize_inplace(Model())
        >>> gm.meta["fxquant_rewrites"]
        ['add_ -> add (node add_)']
    """
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"fxquant.functionalize_inplace expects a torch.nn.Module, got {type(model).__name__}"
        )
    owned = copy.deepcopy(model)
    try:
        gm = trace(owned, concrete_args, leaf_modules)
    except TraceError as e:
        if not example_inputs:
            raise TraceError(
                f"{e}\nfunctionalize_inplace can capture the real forward instead: please "
                "pass example inputs, functionalize_inplace(model, *inputs)."
            ) from e
        return _capture(owned, example_inputs)
    rewrites = _rewrite(gm)
    if example_inputs and not _same_output(model, gm, example_inputs):
        return _capture(owned, example_inputs)
    gm.meta[REWRITES_KEY] = rewrites
    return gm


def _later_users(value: Node, node: Node, order: dict[Node, int]) -> list[Node]:
    return [u for u in value.users if u is not node and order[u] > order[node]]


def _rewrite(gm: GraphModule) -> list[str]:
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    done: list[str] = []
    for node in list(graph.nodes):
        rewrite = _out_of_place(gm, node)
        if rewrite is None:
            continue
        written, apply, description = rewrite
        if any(a is not written and _later_users(a, node, order) for a in aliases(written)):
            done.append(f"kept {node.name}: views of its target are read later")
            continue
        apply()
        for user in _later_users(written, node, order):
            user.replace_input_with(written, node)
        done.append(f"{description} (node {node.name})")
    graph.lint()
    gm.recompile()
    return done


Rewrite = tuple[Node, Callable[[], None], str]


def _out_of_place(gm: GraphModule, node: Node) -> Rewrite | None:
    """What ``node`` writes in place, how to make it out of place, and a description."""
    name = node_op_name(node)
    out = node.kwargs.get("out")
    if node.op in ("call_method", "call_function") and isinstance(out, Node):
        def drop_out() -> None:
            node.kwargs = {k: v for k, v in node.kwargs.items() if k != "out"}

        return out, drop_out, f"{name}(out=...) -> {name}(...)"
    first = node.args[0] if node.args else None
    if not isinstance(first, Node):
        return None
    if node.op in ("call_method", "call_function") and node.kwargs.get("inplace") is True:
        def no_inplace() -> None:
            node.kwargs = {**node.kwargs, "inplace": False}

        return first, no_inplace, f"{name}(inplace=True) -> inplace=False"
    if node.op == "call_method" and inplace_name(name):
        def method() -> None:
            node.target = name[:-1]

        return first, method, f"{name} -> {name[:-1]}"
    if node.op == "call_function" and inplace_name(name) and \
            node.target is getattr(torch, name, None) and hasattr(torch, name[:-1]):
        def function() -> None:
            node.target = getattr(torch, name[:-1])

        return first, function, f"torch.{name} -> torch.{name[:-1]}"
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        if getattr(module, "inplace", False) is True:
            def module_flag() -> None:
                setattr(module, "inplace", False)  # noqa: B010 - any module with the flag

            return first, module_flag, f"{node.target}.inplace=True -> False"
    return None


def _same_output(model: nn.Module, gm: GraphModule, inputs: tuple) -> bool:
    with restored_state(model), restored_state(gm):
        torch.manual_seed(0)
        expected = model(*clone_inputs(inputs))
        torch.manual_seed(0)
        got = gm(*clone_inputs(inputs))
    flat_e = torch.utils._pytree.tree_leaves(expected)
    flat_g = torch.utils._pytree.tree_leaves(got)
    return len(flat_e) == len(flat_g) and all(
        isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape
        and torch.equal(a.detach().nan_to_num(), b.detach().nan_to_num())
        if isinstance(a, Tensor) else a == b
        for a, b in zip(flat_e, flat_g, strict=True)
    )


# -- capturing the real forward ---------------------------------------------------------------


def _tensor_fields(obj: Any) -> list[str] | None:
    """Names of the tensor attributes of a PyG Data-like input, or None for other inputs."""
    stores = getattr(obj, "stores", None)
    if stores is None or len(stores) != 1:
        return None
    return [k for k, v in obj.items() if isinstance(v, Tensor)]


def _capture(model: nn.Module, example_inputs: tuple) -> GraphModule:
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    names = list(state)
    layout: list[tuple[str, Any]] = []  # per input: ("tensor", None) / ("data", fields) / ("const", v)
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
        plain = make_fx(run, tracing_mode="real")(*args)
        captured = make_fx(torch.func.functionalize(run, remove="mutations"),
                           tracing_mode="real")(*args)
    return _as_module(model, captured, names, layout, _inplace_ops(plain))


def _inplace_ops(gm: GraphModule) -> list[str]:
    counts: dict[str, int] = {}
    for n in gm.graph.nodes:
        schema = getattr(n.target, "_schema", None)
        if n.op == "call_function" and schema is not None and any(
            a.alias_info is not None and a.alias_info.is_write for a in schema.arguments
        ):
            counts[str(n.target)] = counts.get(str(n.target), 0) + 1
    return [f"{op} x{c}" for op, c in sorted(counts.items())]


def _as_module(model: nn.Module, captured: GraphModule, names: list[str],
               layout: list[tuple[str, Any]], replaced: list[str]) -> GraphModule:
    """Re-root the captured graph on ``model``: parameters become get_attr nodes again."""
    graph = Graph()
    placeholders = [n for n in captured.graph.nodes if n.op == "placeholder"]
    env: dict[Node, Node] = {}
    state_nodes = [graph.get_attr(name) for name in names]
    inputs: list[Node] = []
    for i, (kind, info) in enumerate(layout):
        if kind == "tensor":
            inputs.append(graph.placeholder(f"input_{i}"))
        elif kind == "data":
            data = graph.placeholder(f"data_{i}" if i else "data")
            inputs += [graph.call_function(getattr, (data, f)) for f in info[2]]
        else:
            graph.placeholder(f"arg_{i}", default_value=info)
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
            info = getattr(captured.graph._codegen, "pytree_info", None)
            if info is not None and info.out_spec is not None:
                flat_out = torch.utils._pytree.tree_unflatten(list(flat_out), info.out_spec)
            graph.output(flat_out)
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    gm = GraphModule(root, graph, f"Functional{type(model).__name__}")
    gm.meta[REWRITES_KEY] = [
        "captured the real forward with torch.func.functionalize (ATen level); replaced "
        + (", ".join(replaced) if replaced else "no in-place ops")
    ]
    return gm
