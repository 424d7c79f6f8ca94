"""A torch.fx tracer that sees a PyG model the way its author wrote it.

Plain :func:`torch.fx.symbolic_trace` walks into ``MessagePassing.propagate`` and fails
("``propagate`` only supports integer tensors of shape ``[2, num_messages]``"). The
:class:`GNNTracer` keeps every ``MessagePassing`` module (GCNConv, SAGEConv, GATConv, ...)
as one leaf ``call_module`` node, like PyG's own tests do, and records where each node
came from in ``node.meta["stack_trace"]``.
"""

from __future__ import annotations

import inspect
import os
import traceback
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.fx import GraphModule, Tracer
from torch_geometric.nn import MessagePassing

__all__ = ["GNNTracer", "TraceError", "trace"]

LeafSpec = str | type[nn.Module]


class TraceError(RuntimeError):
    """A model could not be traced symbolically; the message names the user's source line."""


class GNNTracer(Tracer):
    """:class:`torch.fx.Tracer` that keeps PyG ``MessagePassing`` modules as leaves.

    Args:
        leaf_modules (iterable, optional): more modules to keep opaque, as classes or
            qualified names (``"encoder.block0"``). (default: :obj:`()`)

    Example:
        >>> from torch_geometric.nn import GCNConv
        >>> class GCN(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.conv1, self.conv2 = GCNConv(4, 8), GCNConv(8, 2)
        ...     def forward(self, x, edge_index):
        ...         return self.conv2(self.conv1(x, edge_index).relu(), edge_index)
        >>> graph = GNNTracer().trace(GCN())
        >>> [n.op for n in graph.nodes]
        ['placeholder', 'placeholder', 'call_module', 'call_method', 'call_module', 'output']
    """

    def __init__(self, leaf_modules: Iterable[LeafSpec] = ()) -> None:
        super().__init__()
        self.record_stack_traces = True
        specs = tuple(leaf_modules)
        for spec in specs:
            if not (isinstance(spec, str) or (isinstance(spec, type) and issubclass(spec, nn.Module))):
                raise TypeError(
                    f"leaf_modules entries must be module classes or qualified names, got {spec!r}"
                )
        self._leaf_names = {s for s in specs if isinstance(s, str)}
        self._leaf_types = tuple(s for s in specs if isinstance(s, type))

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if isinstance(m, (MessagePassing, *self._leaf_types)):
            return True
        if module_qualified_name in self._leaf_names:
            return True
        return super().is_leaf_module(m, module_qualified_name)


def _user_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of the traceback that is not torch's, fxquant's or Python's."""
    internal = (
        *(os.path.dirname(m.__file__) + os.sep for m in (torch, inspect) if m.__file__),
        os.path.dirname(__file__) + os.sep,
    )
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith(internal) and not f.filename.startswith("<")
    ]
    return frames[-1] if frames else None


def _default_args(model: nn.Module) -> dict[str, Any]:
    """forward's arguments that have defaults, at their default values."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    return {
        k: p.default
        for k, p in params.items()
        if p.default is not inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def trace(
    model: nn.Module,
    concrete_args: dict[str, Any] | None = None,
    leaf_modules: Iterable[LeafSpec] = (),
) -> GraphModule:
    """Symbolically trace ``model`` into a :class:`~torch.fx.GraphModule`, GNN layers as leaves.

    Args:
        model (torch.nn.Module): the model, unmodified. It is not copied: the GraphModule
            shares its submodules and parameters.
        concrete_args (dict, optional): forward arguments to fix while tracing, as in
            :func:`torch.fx.symbolic_trace`. When it is :obj:`None` and the plain trace fails,
            arguments that have a default (PyG's ``edge_weight=None``, ``batch=None``, ...)
            are fixed to it and tracing is tried once more; the GraphModule then checks at
            run time that they are left at their defaults. (default: :obj:`None`)
        leaf_modules (iterable, optional): more modules to keep as opaque calls, as classes
            or qualified names. (default: :obj:`()`)

    Raises:
        TraceError: the model has code symbolic tracing cannot follow; the message names
            its source line and suggests ``concrete_args`` or ``leaf_modules``.

    Example:
        >>> from torch_geometric.nn.models import GCN
        >>> gm = trace(GCN(in_channels=4, hidden_channels=8, num_layers=2, out_channels=2))
        >>> [n.target for n in gm.graph.nodes if n.op == "call_module"]
        ['convs.0', 'norms.0', 'act', 'dropout', 'convs.1']
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"fxquant.trace expects a torch.nn.Module, got {type(model).__name__}")
    tracer = GNNTracer(leaf_modules)
    name = type(model).__name__
    try:
        graph = tracer.trace(model, concrete_args)
    except Exception as first:
        retry = _default_args(model) if concrete_args is None else {}
        if retry:
            tracer = GNNTracer(leaf_modules)
            try:
                graph = tracer.trace(model, retry)
            except Exception:
                raise _trace_error(name, first) from first
        else:
            raise _trace_error(name, first) from first
    return GraphModule(tracer.root, graph, name)


def _trace_error(name: str, exc: BaseException) -> TraceError:
    frame = _user_frame(exc)
    where = ""
    if frame is not None:
        where = f" at {os.path.basename(frame.filename)}:{frame.lineno}"
        if frame.line:
            where += f" ({frame.line.strip()!r})"
    return TraceError(
        f"could not trace {name}.forward{where}: {type(exc).__name__}: {exc}\n"
        "Symbolic tracing cannot follow Python control flow on tensor values or calls it "
        "does not know. Please fix the arguments that decide such branches with "
        "`concrete_args={...}`, or keep the submodule that contains the line opaque with "
        "`leaf_modules=[...]`."
    )
