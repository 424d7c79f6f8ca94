"""The graph pass: insert out-of-place ``fxquant::truncate`` / ``fxquant::quantize`` nodes
after chosen layers.

Each inserted node calls a registered op whose arguments carry everything it needs (bits or
format, rounding, gradient rule, scaling, row override, the layer's name), so the graph
runs, compiles and reloads without anything else. A running amax for eval scaling is a
:class:`~fxquant.quantize.RunningAmax` submodule called just before the op.

Node metadata written (documented keys, as torch.fx passes do):

``node.meta["fxquant"]``
    on each inserted op node: ``{"after": <layer name>, "spec": QuantSpec}``. Metadata does
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

from fxquant.formats import Format
from fxquant.numerics import bit_width
from fxquant.quantize import RunningAmax
from fxquant.selection import LayerSpec, layer_name, layers_of, select_layers
from fxquant.spec import Number, QuantSpec, RowOverride, as_number
from fxquant.tracer import trace

__all__ = ["QUANTIZE", "TRUNCATE", "Inserted", "insert_truncation", "transform", "truncations"]

#: The ops inserted nodes call.
TRUNCATE = torch.ops.fxquant.truncate.default
QUANTIZE = torch.ops.fxquant.quantize.default


@dataclass(frozen=True)
class Inserted:
    """An inserted node found in a graph, its arguments bound by name (reload-safe)."""

    node: Node
    after: str
    number: Number
    rounding: str
    grad: str
    scale: str
    running: RunningAmax | None
    rows: Tensor | None
    rows_number: Number | None
    grad_number: Number | None


def _bind(node: Node) -> dict[str, Any]:
    schema = node.target._schema  # type: ignore[union-attr]
    bound: dict[str, Any] = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            bound[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            bound[arg.name] = node.kwargs[arg.name]
        else:
            bound[arg.name] = arg.default_value if arg.has_default_value() else None
    return bound


def _number(spec: str) -> Number:
    return as_number(spec, 64, "format")  # the op already checked it against its dtype


def truncations(gm: GraphModule) -> list[Inserted]:
    """Every ``fxquant::truncate`` and ``fxquant::quantize`` call in ``gm``, in graph order.

    Works on a GraphModule reloaded with ``torch.load`` too (node names and ``node.meta``
    are lost there; the op arguments are not).

    Example:
        >>> from torch_geometric.nn.models import GCN
        >>> gm = transform(GCN(4, 8, num_layers=2, out_channels=2), bits=12)
        >>> [(t.after, t.number) for t in truncations(gm)]
        [('convs.0', 12), ('convs.1', 12)]
    """
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in (TRUNCATE, QUANTIZE):
            continue
        b = _bind(node)
        rows = b["rows"]
        if isinstance(rows, Node) and rows.op == "get_attr":
            rows = gm.get_buffer(str(rows.target))
        x = b["x"]
        after = b["name"] or (x.name if isinstance(x, Node) else "?")
        amax = b.get("amax")
        running = None
        if isinstance(amax, Node) and amax.op == "call_module":
            module = gm.get_submodule(str(amax.target))
            running = module if isinstance(module, RunningAmax) else None
        rows = rows if isinstance(rows, Tensor) else None
        if node.target is TRUNCATE:
            found.append(Inserted(node, after, b["bits"], b["rounding"], b["grad"], "none", None,
                                  rows, b["rows_bits"] if rows is not None else None,
                                  b["grad_bits"] or None))
        else:
            found.append(Inserted(
                node, after, _number(b["format"]), b["rounding"], b["grad"], b["scale"], running,
                rows, _number(b["rows_format"]) if rows is not None and b["rows_format"] else None,
                _number(b["grad_format"]) if b["grad_format"] else None))
    return found


def _spec_string(number: Number) -> str:
    return f"top{number}" if isinstance(number, int) else number.spec()


def _op_call(spec: QuantSpec, after: str) -> tuple[Any, dict[str, Any]]:
    """The op and its keyword arguments, rows and amax left out (they are graph nodes)."""
    if spec.op == "truncate":
        kwargs: dict[str, Any] = {"rounding": spec.rounding, "grad": spec.grad}
        if spec.grad_number is not None:
            kwargs["grad_bits"] = spec.grad_number
        if spec.override is not None:
            kwargs["rows_bits"] = spec.override.number
        return TRUNCATE, {**kwargs, "name": after}
    kwargs = {"rounding": spec.rounding}
    if spec.scale != "none":
        kwargs["scale"] = spec.scale
    kwargs["grad"] = spec.grad
    if spec.override is not None:
        kwargs["rows_format"] = _spec_string(spec.override.number)
    if spec.grad_number is not None:
        kwargs["grad_format"] = _spec_string(spec.grad_number)
    return QUANTIZE, {**kwargs, "name": after}


def insert_truncation(gm: GraphModule, specs: Mapping[Node, QuantSpec]) -> bool:
    """Insert a node after each node of ``specs`` in place; returns whether it changed.

    Every user of a selected node reads the new value instead (out-of-place: the original
    value is still there for whatever backward saved). Row overrides become buffers of
    ``gm``, so they follow ``.to()`` and live in ``state_dict``.
    """
    if not specs:
        return False
    graph = gm.graph
    device = next((b.device for b in gm.buffers()), None) or next(
        (p.device for p in gm.parameters()), torch.device("cpu")
    )
    for node, spec in specs.items():
        after = layer_name(node)
        target, kwargs = _op_call(spec, after)
        suffix = "trunc" if target is TRUNCATE else "quant"
        first = [spec.number] if target is TRUNCATE else [_spec_string(spec.number)]
        with graph.inserting_after(node):
            new = graph.create_node("call_function", target, (node, *first), {},
                                    name=f"{node.name}_{suffix}")
        extra: dict[str, Any] = {}
        if spec.momentum is not None:
            observer = f"{new.name}_amax"
            gm.add_submodule(observer, RunningAmax(spec.momentum).to(device))
            with graph.inserting_before(new):
                extra["amax"] = graph.call_module(observer, (node,))
        if spec.override is not None:
            buffer = f"{new.name}_rows"
            gm.register_buffer(buffer, spec.override.rows.detach().clone().to(device))
            with graph.inserting_before(new):
                extra["rows"] = graph.get_attr(buffer)
        new.kwargs = {**{k: v for k, v in kwargs.items() if k != "name"}, **extra,
                      "name": kwargs["name"]}
        new.meta["fxquant"] = {"after": after, "spec": spec}
        if "stack_trace" in node.meta:
            new.meta["stack_trace"] = node.meta["stack_trace"]
        node.replace_all_uses_with(new, delete_user_cb=_not_one_of(new, extra.get("amax")))
    graph.lint()
    gm.recompile()
    return True


def _not_one_of(*nodes: Node | None) -> Callable[[Node], bool]:
    return lambda user: all(user is not n for n in nodes)


_WIDTHS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _max_bits(model: nn.Module) -> int:
    """Pattern width of the model's floating parameters (float32 when it has none)."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    return max((bit_width(d) for d in dtypes if d in _WIDTHS), default=32)


def _is_inserted(node: Node) -> bool:
    return node.op == "call_function" and node.target in (TRUNCATE, QUANTIZE)


def transform(
    model: nn.Module,
    bits: int | Mapping[str, int | str | Format] | None = None,
    *,
    format: str | Format | tuple[int, int] | Mapping[str, int | str | Format] | None = None,
    scale: str | None = None,
    momentum: float | None = None,
    layers: LayerSpec | Iterable[LayerSpec] | None = None,
    rounding: str | None = None,
    grad: str = "ste",
    grad_bits: int | None = None,
    grad_format: str | Format | tuple[int, int] | None = None,
    node_bits: Mapping[str, tuple[Tensor | Iterable[int], int | str | Format]] | None = None,
    inplace: bool = False,
    concrete_args: dict[str, Any] | None = None,
    leaf_modules: Iterable[str | type[nn.Module]] = (),
    lint: str = "warn",
) -> GraphModule:
    """Trace ``model`` and round the float outputs of chosen layers to fewer bits.

    Args:
        model (torch.nn.Module): the unmodified model (a PyG GNN, any FX-traceable module, or
            a GraphModule). It is not changed: by default the pass works on a deep copy.
        bits (int or dict): keep the top ``bits`` of each value's pattern
            (:func:`fxquant.truncate`) after every layer ``layers`` selects; or a dict
            ``{layer: bits_or_format}`` that handles exactly the listed layers (names or
            patterns), mixing kept bits (``16``) and formats (``"e4m3"``).
        format (str, Format, tuple or dict): round to a number format instead
            (:func:`fxquant.quantize`): ``"e4m3"``, ``"e5m2"``, ``"e3m2"``, ``(3, 0)``, ...
            Giving both ``bits`` and ``format`` is an error.
        scale (str, optional): for formats: :obj:`None` (plain cast, default), ``"tensor"``,
            ``"row"`` (one scale per node), or their ``"-pow2"`` variants.
        momentum (float, optional): with ``scale="tensor"``: keep a running amax
            (a :class:`~fxquant.quantize.RunningAmax` buffer) and scale with it in eval.
        layers (optional): which layers get a node after them: submodule names
            (``"conv1"``), FX node names of functions (``"sigmoid"``), fnmatch patterns
            (``"conv*"``), module classes (``GCNConv``), predicates on the node, or a list
            of these. (default: every ``MessagePassing`` layer)
        rounding (str, optional): ``"toward_zero"``, ``"nearest"`` or ``"stochastic"``;
            :obj:`None` is each op's default (toward_zero for bits, nearest for formats).
        grad (str, optional): ``"ste"`` (straight-through, default) or ``"zero"``.
        grad_bits, grad_format (optional): also round the gradient flowing back through each
            inserted node, to top-N bits or to a format. (default: off)
        node_bits (dict, optional): per-row overrides ``{layer: (rows, bits_or_format)}``:
            rows of that layer's output (an index tensor or a bool mask over dim 0, e.g.
            from :func:`fxquant.top_degree_nodes`) keep other bits or another format.
        inplace (bool, optional): share parameters with ``model`` instead of copying.
            (default: :obj:`False`)
        concrete_args, leaf_modules (optional): passed to :func:`fxquant.trace`.
        lint (str, optional): lint the graph this returns: ``"warn"`` turns findings into
            warnings (default), ``"raise"`` raises :class:`fxquant.LintError` on errors,
            ``"off"`` skips it.

    Returns:
        torch.fx.GraphModule: the model with a ``torch.ops.fxquant.truncate`` (or
        ``quantize``) node after each selected layer.

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
        >>> gm = transform(GCN(), format="e4m3", scale="tensor", layers="conv1")
        >>> print(gm.code.strip().splitlines()[2].strip())  # doctest: +NORMALIZE_WHITESPACE
        conv1_quant = torch.ops.fxquant.quantize.default(conv1, 'e4m3', rounding = 'nearest',
            scale = 'tensor', grad = 'ste', name = 'conv1');  conv1 = None
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"fxquant.transform expects a torch.nn.Module, got {type(model).__name__}")
    if lint not in ("warn", "raise", "off"):
        raise ValueError(f"fxquant.transform: lint={lint!r} is not one of ['warn', 'raise', 'off']")
    if bits is not None and format is not None:
        raise ValueError(
            "fxquant.transform: give bits= (top-N truncation) or format= (a number format), not "
            "both; a dict in either mixes them per layer, e.g. bits={'conv1': 16, 'conv2': 'e4m3'}"
        )
    chosen = bits if bits is not None else format
    if chosen is None:
        raise ValueError("fxquant.transform: please give bits= (e.g. 16) or format= (e.g. 'e4m3')")
    if isinstance(chosen, Mapping) and layers is not None:
        raise ValueError(
            "fxquant.transform: bits/format is a dict, which already names the layers; please "
            "drop layers= or pass a single value."
        )
    if grad_bits is not None and grad_format is not None:
        raise ValueError("fxquant.transform: give grad_bits= or grad_format=, not both")
    max_bits = _max_bits(model)
    if format is not None and not isinstance(format, Mapping):
        chosen = as_number(format, max_bits, "format")
    grad_number = None if grad_bits is None and grad_format is None else as_number(
        grad_bits if grad_bits is not None else grad_format, max_bits,
        "grad_bits" if grad_bits is not None else "grad_format")
    options = {"rounding": rounding, "grad": grad, "scale": "none" if scale is None else scale,
               "momentum": momentum, "grad_number": grad_number}

    # Trace and validate first: nothing is copied or changed on error.
    gm = model if isinstance(model, GraphModule) else trace(model, concrete_args, leaf_modules)
    specs = _plan(gm, chosen, layers, node_bits, max_bits, options)

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
    chosen: Any,
    layers: LayerSpec | Iterable[LayerSpec] | None,
    node_bits: Mapping[str, Any] | None,
    max_bits: int,
    options: dict[str, Any],
) -> dict[str, QuantSpec]:
    """Validate every argument and return {node name: spec}; touches nothing."""
    candidates = layers_of(gm, exclude=_is_inserted)
    per_node: dict[str, Number] = {}
    if isinstance(chosen, Mapping):
        if not chosen:
            raise ValueError("fxquant.transform: the bits/format dict names no layer")
        for key, value in chosen.items():
            number = as_number(value, max_bits, f"bits[{key!r}]")
            for n in select_layers(gm, key, candidates, arg="bits"):
                per_node[n.name] = number
    else:
        number = chosen if isinstance(chosen, Format) else as_number(chosen, max_bits, "bits")
        for n in select_layers(gm, layers, candidates):
            per_node[n.name] = number
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

    specs = {}
    for name, number in per_node.items():
        scale = options["scale"] if isinstance(number, Format) else "none"
        momentum = options["momentum"] if isinstance(number, Format) else None
        specs[name] = QuantSpec(number, options["rounding"], options["grad"], scale, momentum,
                                options["grad_number"], overrides.get(name), max_bits=max_bits)
    if options["scale"] != "none" and not any(isinstance(n, Format) for n in per_node.values()):
        raise ValueError(
            f"scale={options['scale']!r} applies to formats (format='e4m3', ...), not to top-N "
            "truncation of the pattern; please drop scale= or use format=."
        )
    return specs
