"""The graph pass: insert an out-of-place ``fxquant::truncate`` node after chosen layers.

Node metadata written (documented keys, as torch.fx passes do):

``node.meta["fxquant"]``
    on each inserted node: ``{"after": <layer name>, "spec": TruncationSpec}``. Metadata does
    not survive pickling; :func:`truncations` reads the op's arguments instead, which do.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.fx import GraphModule, Node

from fxquant.numerics import bit_width
from fxquant.selection import LayerSpec, layer_name, layers_of, select_layers
from fxquant.spec import RowOverride, TruncationSpec
from fxquant.tracer import trace

__all__ = ["TRUNCATE", "Truncation", "insert_truncation", "transform", "truncations"]

#: The op every inserted node calls.
TRUNCATE = torch.ops.fxquant.truncate.default


@dataclass(frozen=True)
class Truncation:
    """A truncation node found in a graph, with its arguments bound by name."""

    node: Node
    after: str
    bits: int
    rounding: str
    grad: str
    rows: Tensor | None
    rows_bits: int


def _bind(node: Node) -> dict[str, Any]:
    schema = TRUNCATE._schema
    bound: dict[str, Any] = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            bound[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            bound[arg.name] = node.kwargs[arg.name]
        else:
            bound[arg.name] = arg.default_value if arg.has_default_value() else None
    return bound


def truncations(gm: GraphModule) -> list[Truncation]:
    """Every ``fxquant::truncate`` call in ``gm``, in graph order (also after a reload).

    Example:
        >>> from torch_geometric.nn.models import GCN
        >>> gm = transform(GCN(4, 8, num_layers=2, out_channels=2), bits=12)
        >>> [(t.after, t.bits) for t in truncations(gm)]
        [('convs.0', 12), ('convs.1', 12)]
    """
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not TRUNCATE:
            continue
        b = _bind(node)
        rows = b["rows"]
        if isinstance(rows, Node) and rows.op == "get_attr":
            rows = gm.get_buffer(str(rows.target))
        x = b["x"]
        after = b["name"] or (x.name if isinstance(x, Node) else "?")
        found.append(
            Truncation(node, after, b["bits"], b["rounding"], b["grad"],
                       rows if isinstance(rows, Tensor) else None, b["rows_bits"])
        )
    return found


def insert_truncation(gm: GraphModule, specs: Mapping[Node, TruncationSpec]) -> bool:
    """Insert a truncation after each node of ``specs`` in place; returns whether it changed.

    Every user of a selected node reads the truncated value instead (out-of-place: the
    original value is still there for whatever backward saved). Row overrides become
    buffers of ``gm``, so they follow ``.to()`` and live in ``state_dict``.
    """
    if not specs:
        return False
    graph = gm.graph
    device = next((b.device for b in gm.buffers()), None) or next(
        (p.device for p in gm.parameters()), torch.device("cpu")
    )
    for node, spec in specs.items():
        kwargs: dict[str, Any] = {"rounding": spec.rounding, "grad": spec.grad,
                                  "name": layer_name(node)}
        with graph.inserting_after(node):
            new = graph.create_node("call_function", TRUNCATE, (node, spec.bits), {},
                                    name=f"{node.name}_trunc")
        if spec.override is not None:
            buffer = f"{new.name}_rows"
            gm.register_buffer(buffer, spec.override.rows.detach().clone().to(device))
            with graph.inserting_before(new):
                kwargs["rows"] = graph.get_attr(buffer)
            kwargs["rows_bits"] = spec.override.bits
        new.kwargs = kwargs
        new.meta["fxquant"] = {"after": layer_name(node), "spec": spec}
        if "stack_trace" in node.meta:
            new.meta["stack_trace"] = node.meta["stack_trace"]
        node.replace_all_uses_with(new, delete_user_cb=_not(new))
    graph.lint()
    gm.recompile()
    return True


def _not(node: Node) -> Callable[[Node], bool]:
    return lambda user: user is not node


def _max_bits(model: nn.Module) -> int:
    """Pattern width of the model's floating parameters (float32 when it has none)."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    return max((bit_width(d) for d in dtypes if d in _WIDTHS), default=32)


_WIDTHS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _is_truncation(node: Node) -> bool:
    return node.op == "call_function" and node.target is TRUNCATE


def transform(
    model: nn.Module,
    bits: int | Mapping[str, int] | None = None,
    *,
    layers: LayerSpec | Iterable[LayerSpec] | None = None,
    rounding: str | None = None,
    grad: str = "ste",
    node_bits: Mapping[str, tuple[Tensor | Iterable[int], int]] | None = None,
    inplace: bool = False,
    concrete_args: dict[str, Any] | None = None,
    leaf_modules: Iterable[str | type[nn.Module]] = (),
    lint: str = "warn",
) -> GraphModule:
    """Trace ``model`` and keep only the top ``bits`` of the float outputs of chosen layers.

    Args:
        model (torch.nn.Module): the unmodified model (a PyG GNN, any FX-traceable module, or
            a GraphModule). It is not changed: by default the pass works on a deep copy.
        bits (int or dict): kept bits for every layer ``layers`` selects, or a dict
            ``{layer: bits}`` that truncates exactly the listed layers (names or patterns).
        layers (optional): which layers get a truncation after them: submodule names
            (``"conv1"``), FX node names of functions (``"sigmoid"``), fnmatch patterns
            (``"conv*"``), module classes (``GCNConv``), predicates on the node, or a list
            of these. (default: every ``MessagePassing`` layer)
        rounding (str, optional): ``"toward_zero"``, ``"nearest"`` or ``"stochastic"``;
            :obj:`None` is the op's default, ``"toward_zero"``.
        grad (str, optional): ``"ste"`` (straight-through, default) or ``"zero"``.
        node_bits (dict, optional): per-row overrides ``{layer: (rows, bits)}``: rows of
            that layer's output (an index tensor or a bool mask over dim 0, e.g. from
            :func:`fxquant.top_degree_nodes`) keep ``bits`` instead.
        inplace (bool, optional): share parameters with ``model`` instead of copying.
            (default: :obj:`False`)
        concrete_args (dict, optional): passed to :func:`fxquant.trace`.
        leaf_modules (iterable, optional): passed to :func:`fxquant.trace`.
        lint (str, optional): lint the graph this returns: ``"warn"`` turns findings into
            warnings (default), ``"raise"`` raises :class:`fxquant.LintError` on errors,
            ``"off"`` skips it.

    Returns:
        torch.fx.GraphModule: the model with a ``torch.ops.fxquant.truncate`` node after
        each selected layer.

    Example:
        >>> from torch_geometric.nn import GCNConv
        >>> class GCN(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.conv1, self.conv2 = GCNConv(4, 8), GCNConv(8, 2)
        ...     def forward(self, x, edge_index):
        ...         x = self.conv1(x, edge_index).relu()
        ...         return self.conv2(x, edge_index)
        >>> gm = transform(GCN(), bits=16)
        >>> print(gm.code.strip())  # doctest: +NORMALIZE_WHITESPACE
        def forward(self, x, edge_index):
            conv1 = self.conv1(x, edge_index);  x = None
            conv1_trunc = torch.ops.fxquant.truncate.default(conv1, 16,
                rounding = 'toward_zero', grad = 'ste', name = 'conv1');  conv1 = None
            relu = conv1_trunc.relu();  conv1_trunc = None
            conv2 = self.conv2(relu, edge_index);  relu = edge_index = None
            conv2_trunc = torch.ops.fxquant.truncate.default(conv2, 16,
                rounding = 'toward_zero', grad = 'ste', name = 'conv2');  conv2 = None
            return conv2_trunc
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"fxquant.transform expects a torch.nn.Module, got {type(model).__name__}")
    if bits is None:
        raise ValueError("fxquant.transform: please give bits=, e.g. bits=16 or {'conv1': 8}")
    if isinstance(bits, Mapping) and layers is not None:
        raise ValueError(
            "fxquant.transform: bits is a dict, which already names the layers to truncate; "
            "please drop layers= or pass one int for bits."
        )
    if lint not in ("warn", "raise", "off"):
        raise ValueError(f"fxquant.transform: lint={lint!r} is not one of ['warn', 'raise', 'off']")
    rounding = "toward_zero" if rounding is None else rounding
    max_bits = _max_bits(model)

    # Trace and validate first: nothing is copied or changed on error.
    gm = model if isinstance(model, GraphModule) else trace(model, concrete_args, leaf_modules)
    specs = _plan(gm, bits, layers, rounding, grad, node_bits, max_bits)

    if not inplace:
        gm = copy.deepcopy(gm)
    nodes = {n.name: n for n in gm.graph.nodes}
    insert_truncation(gm, {nodes[name]: spec for name, spec in specs.items()})
    if lint != "off":
        _lint_result(gm, lint)
    return gm


def _lint_result(gm: GraphModule, mode: str) -> None:
    from fxquant.passes.lint import lint_graph  # lint imports the tracer, which imports us
    from fxquant.report import LintError

    report = lint_graph(gm, note=False)
    if mode == "raise" and report.errors:
        raise LintError(report)
    for f in report.findings:
        if f.severity != "info":
            warnings.warn(f"fxquant lint {f.rule} ({f.severity}) at {f.location or f.node}: "
                          f"{f.message} Hint: {f.hint}", stacklevel=3)


def _plan(
    gm: GraphModule,
    bits: int | Mapping[str, int],
    layers: LayerSpec | Iterable[LayerSpec] | None,
    rounding: str,
    grad: str,
    node_bits: Mapping[str, Any] | None,
    max_bits: int,
) -> dict[str, TruncationSpec]:
    """Validate every argument and return {node name: spec}; touches nothing."""
    candidates = layers_of(gm, exclude=_is_truncation)
    per_node: dict[str, int] = {}
    if isinstance(bits, Mapping):
        if not bits:
            raise ValueError("fxquant.transform: bits={} names no layer; please list layers")
        for key, value in bits.items():
            for n in select_layers(gm, key, candidates, arg="bits"):
                per_node[n.name] = value
    else:
        for n in select_layers(gm, layers, candidates):
            per_node[n.name] = bits
        if not per_node:
            raise ValueError(
                "fxquant.transform: layers= selected no layer (the default selects PyG "
                "MessagePassing layers, and this model calls none); please name the layers, "
                f"e.g. layers={[layer_name(n) for n in candidates][:3]}"
            )

    overrides: dict[str, RowOverride] = {}
    for key, value in (node_bits or {}).items():
        matched = select_layers(gm, key, candidates, arg="node_bits")
        missing = [layer_name(n) for n in matched if n.name not in per_node]
        if missing:
            truncated = [layer_name(n) for n in candidates if n.name in per_node]
            raise ValueError(
                f"node_bits[{key!r}] names {missing}, which get no truncation; truncated "
                f"layers: {truncated}. Please add it to bits=/layers= first."
            )
        override = RowOverride.parse(value, str(key), max_bits)
        for n in matched:
            overrides[n.name] = override

    return {
        name: TruncationSpec(b, rounding, grad, overrides.get(name), max_bits=max_bits)
        for name, b in per_node.items()
    }
