"""Step 3 of :func:`~fxquant.linter.functionalize.functionalize_inplace`: capture the real
forward, when symbolic tracing fails or its rewrite does not verify.

The forward is recorded on the example inputs by :func:`torch.func.functionalize` under
``make_fx`` (ATen ops, no mutations) and re-rooted on the model. It is specialized to the
example's shapes, the branches taken on them and its non-tensor arguments:
:class:`CapturedMode` makes it raise when called with others.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch
from torch import Tensor, nn
from torch.fx import Graph, GraphModule, Node
from torch.fx.experimental.proxy_tensor import make_fx

from fxquant.errors import FxquantRuntimeError
from fxquant.linter.functionalize.graph_ops import copy_functional
from fxquant.linter.functionalize.outcome import HOW_KEY, KEPT_KEY, REWRITES_KEY, Rewrite
from fxquant.linter.records import InplaceCall
from fxquant.linter.state import named_buffers, restored_state
from fxquant.linter.torch_internals import output_tree_spec, tree_unflatten

__all__ = ["CapturedMode", "capture"]

def _tensor_fields(obj: Any) -> list[str] | None:
    """Names of the tensor attributes of a PyG Data-like input, or None for other inputs."""
    stores = getattr(obj, "stores", None)
    if stores is None or len(stores) != 1:
        return None
    return [k for k, v in obj.items() if isinstance(v, Tensor)]


def capture(model: nn.Module, example_inputs: tuple,
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
            node.target = copy_functional
    captured.recompile()
    gm = _as_module(model, captured, names, layout, example_inputs)
    gm.meta[REWRITES_KEY] = [
        Rewrite(c.where, f"`{c.name}` (in place)", "functional ATen ops (torch.func.functionalize)")
        for c in calls if not c.by_library or c.requested]  # (not torch's or PyG's own writes)
    gm.meta[KEPT_KEY] = []
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
