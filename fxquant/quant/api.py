"""``transform``: trace a model and insert quantization points as a mapping says.

The general form is ``transform(model, mapping)`` with a
:class:`~fxquant.quant.mapping.QuantMapping`; ``bits=``, ``format=``, ``layers=``,
``node_formats=`` and friends are sugar that builds one.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.fx import GraphModule, Node
from torch_geometric.nn import MessagePassing

from fxquant._ops.layouts import bit_width
from fxquant.errors import FxquantTypeError, FxquantValueError, user_stacklevel
from fxquant.formats import Format, IntFormat, TopN, as_format, as_scaled_format
from fxquant.fx.lazy import refuse_lazy
from fxquant.fx.selectors import LayerSpec, layer_name, layers_of
from fxquant.fx.tracer import LeafSpec, check_leaf_modules, refuse_compiled, trace
from fxquant.modes import Scale
from fxquant.quant.config import QuantConfig, check_decay
from fxquant.quant.insert import (
    check_points,
    edge_index_of,
    inner_layers,
    insert_quant_points,
    layer_input,
)
from fxquant.quant.mapping import QuantMapping, Resolved
from fxquant.quant.override import NodeOverride
from fxquant.quant.points import QuantPoint
from fxquant.quant.site import Site, SiteKind
from fxquant.quant.sites import edge_arguments, linears_of, weights_of

__all__ = ["TRACE_KEY", "plan", "remember_trace", "transform"]

#: The attribute of a transformed GraphModule that records how it was traced.
TRACE_KEY = "fxquant_trace"

_WIDTHS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_WILDCARDS = set("*?[")


def _max_bits(model: nn.Module) -> int:
    """Pattern width of the model's floating parameters (float32 when it has none)."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    return max((bit_width(d) for d in dtypes if d in _WIDTHS), default=32)


def _is_point(gm: GraphModule, node: Node) -> bool:
    return node.op == "call_module" and isinstance(gm.get_submodule(str(node.target)), QuantPoint)


def _add_selector(mapping: QuantMapping, spec: Any, config: QuantConfig, arg: str) -> None:
    if isinstance(spec, str):
        if _WILDCARDS & set(spec):
            mapping.set_pattern(spec, config, source=arg)
        else:
            mapping.set_name(spec, config, source=arg)
    elif isinstance(spec, type) and issubclass(spec, nn.Module):
        mapping.set_type(spec, config, source=arg)
    elif callable(spec) and not isinstance(spec, type):
        mapping.set_pattern(spec, config, source=arg)
    else:
        raise FxquantTypeError(
            f"{arg} entries must be a name or pattern, a module class or a predicate on "
            f"torch.fx.Node, got {spec!r}"
        )


#: what ``node_formats`` maps a layer to: ``(node ids or a bool mask, kept bits or a format)``
NodeFormats = tuple[Tensor | Iterable[int], int | str | Format]

#: how each keyword that says how to round is written inside a QuantConfig
_CONFIG_FIELD = {"bits": "format", "format": "format", "scale": "scale", "decay": "decay",
                 "momentum": "decay", "rounding": "rounding", "grad": "grad",
                 "grad_bits": "grad_format", "grad_format": "grad_format"}


def _refuse_number_keywords(mapping: QuantMapping | QuantConfig, given: dict[str, Any]) -> None:
    """A QuantConfig or QuantMapping already says how to round: a keyword that says it too
    would be dropped or contradict it, so it is an error naming both."""
    for name, value in given.items():
        if value is None:
            continue
        what = type(mapping).__name__
        where = ("into it" if isinstance(mapping, QuantConfig)
                 else "into the QuantConfigs of its entries")
        raise FxquantValueError(
            f"fxquant.transform: {name}={value!r} and a {what} were both given, and the {what} "
            f"already says how values are rounded; please put {_CONFIG_FIELD[name]}= {where} "
            f"(e.g. QuantConfig(..., {_CONFIG_FIELD[name]}=...)) or drop the {what}.")


def _layer_specs(layers: Any) -> list[Any]:
    return [layers] if isinstance(layers, (str, type)) or not isinstance(
        layers, Iterable) else list(layers)


def _add_overrides(mapping: QuantMapping, node_formats: Any, max_bits: int) -> None:
    """``node_formats={layer: (nodes, format)}`` as ``mapping.set_nodes`` entries."""
    if node_formats is None:
        return
    if not isinstance(node_formats, Mapping):
        raise FxquantTypeError(f"node_formats must be a dict {{layer: (node_ids, format)}}, got "
                               f"{type(node_formats).__name__}")
    for key, value in node_formats.items():
        override = NodeOverride.parse(value, str(key))
        if isinstance(override.format, TopN) and override.format.bits > max_bits:
            as_format(override.format.bits, f"node_formats[{key!r}] bits", max_bits)
        mapping.set_nodes(str(key), override.nodes, override.format)


def _only_layers(gm: GraphModule, points: list[Resolved], layers: Any) -> list[Resolved]:
    """The points of ``points`` on the layers ``layers`` selects (with a QuantMapping,
    ``layers=`` restricts it); an error names a selector that matches none of them."""
    probe = QuantMapping()
    marker = QuantConfig(32)
    for spec in _layer_specs(layers):
        _add_selector(probe, spec, marker, "layers")
    chosen = {p.node for p in probe.resolve(gm, layers_of(gm, exclude=lambda n: _is_point(gm, n)))}
    kept = [p for p in points if p.node in chosen]
    if not kept:
        raise FxquantValueError(
            f"fxquant.transform: layers={layers!r} keeps none of the mapping's quantization points "
            f"(on layers {sorted({layer_name(p.node) for p in points})})")
    return kept


def _sugar(
    bits: Any, format: Any, scale: Any, decay: Any, layers: Any, rounding: Any, grad: Any,
    grad_bits: Any, grad_format: Any, node_formats: Any, max_bits: int,
) -> QuantMapping:
    """The mapping the keyword arguments describe; every value validated here."""
    if bits is not None and format is not None:
        raise FxquantValueError(
            "fxquant.transform: give bits= (top-N truncation) or format= (a number format), not "
            "both; a dict in either mixes them per layer, e.g. bits={'conv1': 16, 'conv2': 'e4m3'}"
        )
    chosen = bits if bits is not None else format
    if chosen is None:
        raise FxquantValueError("fxquant.transform: please give bits= (e.g. 16), format= (e.g. 'e4m3') "
                         "or a QuantMapping")
    if isinstance(chosen, Mapping) and layers is not None:
        raise FxquantValueError(
            "fxquant.transform: bits/format is a dict, which already names the layers; please "
            "drop layers= or pass a single value."
        )
    if grad_bits is not None and grad_format is not None:
        raise FxquantValueError("fxquant.transform: give grad_bits= or grad_format=, not both")
    gradient_format = None
    if grad_bits is not None or grad_format is not None:
        arg = "grad_bits" if grad_bits is not None else "grad_format"
        gradient_format = as_format(grad_bits if grad_bits is not None else grad_format, arg, max_bits)

    def config(number: Any, arg: str, per_layer: bool) -> QuantConfig:
        parsed, named_scale = as_scaled_format(number, arg, max_bits)
        is_format = not isinstance(parsed, TopN)
        # In a dict that mixes kept bits and formats, scale and decay apply to the formats.
        use_scale = scale if is_format or not per_layer else None
        use_decay = decay if is_format or not per_layer else None
        return QuantConfig(parsed if named_scale is None else number, rounding, scale=use_scale,
                           decay=use_decay, grad=grad, grad_format=gradient_format)

    mapping = QuantMapping()
    if isinstance(chosen, Mapping):
        if not chosen:
            raise FxquantValueError("fxquant.transform: the bits/format dict names no layer")
        numbers = {key: as_scaled_format(value, f"bits[{key!r}]", max_bits)[0]
                   for key, value in chosen.items()}
        if scale is not None and all(isinstance(n, TopN) for n in numbers.values()):
            raise FxquantValueError(
                f"scale={scale!r} applies to formats (format='e4m3', ...), not to top-N "
                "truncation of the pattern; please drop scale= or use format=."
            )
        if decay is not None and all(isinstance(n, TopN) for n in numbers.values()):
            raise FxquantValueError(f"decay={decay!r} keeps a running range for a scaled "
                                    "format; the dict names none. Please drop decay=.")
        for key, value in chosen.items():
            _add_selector(mapping, key, config(value, f"bits[{key!r}]", True), "bits")
    else:
        arg = "bits" if bits is not None else "format"
        if format is not None and not isinstance(format, Mapping):
            number = as_scaled_format(format, "format", max_bits)[0]
            if isinstance(number, TopN):
                raise FxquantValueError(f"format={format!r} is top-N truncation; please pass bits="
                                 f"{number.bits} instead")
        cfg = config(chosen, arg, False)
        if layers is None:
            mapping.set_global(cfg, source=arg)
        else:
            specs = [layers] if isinstance(layers, (str, type)) or not isinstance(
                layers, Iterable) else list(layers)
            for spec in specs:
                _add_selector(mapping, spec, cfg, "layers")
    _add_overrides(mapping, node_formats, max_bits)
    return mapping


def remember_trace(gm: GraphModule, concrete_args: dict[str, Any] | None,
                   leaf_modules: Iterable[LeafSpec]) -> None:
    """Record how ``gm`` was traced (JSON-able), so :func:`save` can write it."""
    names = [spec for spec in leaf_modules if isinstance(spec, str)]
    classes = [f"{spec.__module__}.{spec.__qualname__}" for spec in leaf_modules
               if not isinstance(spec, str)]
    setattr(gm, TRACE_KEY, {"concrete_args": concrete_args, "leaf_names": names,
                             "leaf_classes": classes})


def _warn_unscaled(points: Iterable[Resolved]) -> None:
    """A warning per point that rounds to an integer format with its scale left out: the
    grid then has a step of 1 (``int8``: the whole numbers -128..127), where ordinary
    activations round to -1, 0 and 1. ``scale="none"`` says the unscaled grid is meant."""
    for p in points:
        fmt, config = p.config.format, p.config
        if not isinstance(fmt, IntFormat) or config.scale is not Scale.NONE \
                or config.scale_given:
            continue
        spec = fmt.spec()
        warnings.warn(
            f"fxquant.transform: the {p.site.value} site of layer {layer_name(p.node)!r} "
            f"rounds to {spec} without a scale, so values round to the grid's levels "
            f"{fmt.level(fmt.qmin):g}..{fmt.max_finite:g} themselves (a step of 1: most "
            "activations become 0 or +-1). Please give a scale, e.g. scale='tensor' (or "
            "'row', 'tensor-pow2', 'row-pow2', 'block32'): QuantConfig("
            f"{spec!r}, scale='tensor'), transform(..., format={spec!r}, scale='tensor') or "
            f"in the format's spec ('{spec}:tensor'); scale='none' keeps the unscaled grid "
            "without this warning.", UserWarning, stacklevel=user_stacklevel())


def plan(gm: GraphModule, mapping: QuantMapping) -> list[Resolved]:
    """The quantization points ``mapping`` gives ``gm``; raises if it selects none or a
    site does not fit its layer."""
    candidates = layers_of(gm, exclude=lambda n: _is_point(gm, n))
    points = mapping.resolve(gm, candidates)
    if not points:
        raise FxquantValueError(
            "fxquant.transform: the mapping selects no layer (the global entry, and the "
            "default of bits=/format=, covers PyG MessagePassing layers, and this model calls "
            "none); please name the layers, e.g. "
            f"layers={[layer_name(n) for n in candidates][:3]}"
        )
    for p in points:
        _check_site(gm, p)
    return points


def _check_site(gm: GraphModule, p: Resolved) -> None:
    """A clear error where a site cannot be rounded on its layer, never a silent no-op."""
    layer, site = layer_name(p.node), p.site.value
    module = gm.get_submodule(str(p.node.target)) if p.node.op == "call_module" else None
    where = f"fxquant.transform: the {site} site of layer {layer!r}"
    if p.site.inner and module is None:
        raise FxquantValueError(f"{where}: rounding inside a layer needs a module; {layer!r} is a "
                         f"{p.node.op.replace('call_', '')} call. Please round its 'input' or "
                         "'output' instead.")
    if p.site is Site.WEIGHT:
        assert module is not None
        if not weights_of(module):
            raise FxquantValueError(f"{where}: {type(module).__name__} has no weight to round (a "
                             "floating parameter with at least two dims)")
        if p.override is not None:
            raise FxquantValueError(f"{where}: weights belong to no node, so node_formats cannot apply")
        if p.config.node_bits is not None:
            raise FxquantValueError(f"{where}: weights belong to no node, so a bit-width per "
                                    "node (node_bits) cannot apply")
    if p.site in (Site.MESSAGE, Site.AGGREGATE, Site.EDGE) \
            and not isinstance(module, MessagePassing):
        raise FxquantValueError(f"{where}: only PyG MessagePassing layers have messages and an "
                         f"aggregation; {layer!r} is {type(module).__name__ if module else 'a function'}")
    if p.site is Site.LINEAR:
        assert module is not None
        if not linears_of(module):
            raise FxquantValueError(f"{where}: {type(module).__name__} has no linear transform "
                                    "inside (a torch.nn.Linear or PyG Linear child) to round the "
                                    "output of; please round its 'weight' or 'output' instead")
    if p.site is Site.EDGE:
        assert isinstance(module, MessagePassing)
        if not edge_arguments(module):
            raise FxquantValueError(f"{where}: {type(module).__name__}.message() takes no "
                                    "per-edge argument (only node features x_i/x_j), so there "
                                    "is nothing to round there; please round its 'message' site")
    protect = p.config.protect
    if protect is not None and (p.site in (Site.LINEAR, Site.EDGE) or isinstance(
            p.site, SiteKind)) and protect.share != "layer":
        raise FxquantValueError(f"{where}: protection inside a layer's linear transforms, "
                                "per-edge arguments and registered sites follows the layer's "
                                "own mask; please pass "
                                "protect=fxquant.Protection(p_min, p_max, share='layer')")
    if p.site is Site.INPUT and p.part is None:
        found = layer_input(gm, p.node)
        first = found[1] if found is not None else None
        parts = first if isinstance(first, (tuple, list)) else [first]
        if not any(isinstance(part, Node) for part in parts):
            raise FxquantValueError(f"{where}: the layer's first argument is not a tensor of "
                                    "the graph (nor a (source, target) pair or a dict of "
                                    "them)")
    if protect is not None and (
            p.site is Site.WEIGHT or (p.site in (Site.INPUT, Site.OUTPUT)
                                      and edge_index_of(gm, p.node) is None)):
        raise FxquantValueError(f"{where}: protect= draws per node from in-degrees, so it needs the "
                         "input, output, linear, edge, message or aggregate site of a "
                         "MessagePassing layer called with an edge_index")


def transform(
    model: nn.Module,
    mapping: QuantMapping | QuantConfig | int | Mapping[str, Any] | None = None,
    *,
    bits: int | Mapping[str, int | str | Format] | None = None,
    format: str | Format | tuple[int, int] | Mapping[str, int | str | Format] | None = None,
    scale: str | None = None,
    decay: float | None = None,
    layers: LayerSpec | Iterable[LayerSpec] | None = None,
    rounding: str | None = None,
    grad: str | None = None,
    grad_bits: int | None = None,
    grad_format: str | Format | tuple[int, int] | None = None,
    node_formats: Mapping[str, NodeFormats] | None = None,
    inplace: bool = False,
    concrete_args: dict[str, Any] | None = None,
    leaf_modules: Iterable[LeafSpec] = (),
    momentum: float | None = None,
) -> GraphModule:
    """Trace ``model`` and round values at the quantization points a mapping chooses.

    Args:
        model (torch.nn.Module): the unmodified model (a PyG GNN, any FX-traceable module, or
            a GraphModule). It is not changed: by default the pass works on a deep copy.
        mapping (QuantMapping or QuantConfig, optional): the general form. A
            :class:`~fxquant.quant.config.QuantConfig` applies to every ``MessagePassing``
            layer (or to ``layers=``); a :class:`~fxquant.quant.mapping.QuantMapping` says
            which layer and site gets which config (``layers=`` then keeps only the points
            on those layers). Either one says how values are rounded, so ``bits``,
            ``format``, ``scale``, ``decay``, ``rounding``, ``grad``, ``grad_bits`` and
            ``grad_format`` are refused with it. An ``int`` or a dict here means ``bits=``.
        bits (int or dict): keep the top ``bits`` of each value's pattern
            (:func:`fxquant.truncate`) after every layer ``layers`` selects; or a dict
            ``{layer: bits_or_format}`` that handles exactly the listed layers (names or
            patterns), mixing kept bits (``16``) and formats (``"e4m3"``).
        format (str, Format or tuple): round to a format instead
            (:func:`fxquant.quantize`): ``"e4m3"``, ``"e5m2"``, ``"e3m2"``, ``(3, 0)``,
            ``"int8"``, ``"mxfp4"``, a format and its scale (``"int8:row"``), ...
        scale (str, optional): for formats: ``"none"`` (a plain cast), ``"tensor"``,
            ``"row"`` (one scale per node), their ``"-pow2"`` variants or ``"block32"``.
            (default: :obj:`None`: left out, a plain cast, which warns for integers)
        decay (float, optional): with ``scale="tensor"``: keep a running range
            (``decay``: the old range's weight, e.g. 0.9) and scale with it in eval.
        momentum (float, optional): the old name of ``decay`` (the same number);
            deprecated.
        layers (optional): which layers get a point after them: submodule names
            (``"conv1"``), FX node names of functions (``"sigmoid"``), fnmatch patterns
            (``"conv*"``), module classes (``GCNConv``), predicates on the node, or a list
            of these. (default: every ``MessagePassing`` layer)
        rounding (str, optional): ``"toward_zero"``, ``"nearest"`` or ``"stochastic"``;
            :obj:`None` is each number's default (toward_zero for bits, nearest for formats).
        grad (str, optional): ``"ste"`` (straight-through) or ``"zero"``.
            (default: :obj:`None`: ``"ste"``)
        grad_bits, grad_format (optional): also round the gradient flowing back through each
            point, to top-N bits or to a format. (default: off)
        node_formats (dict, optional): per-node overrides ``{layer: (node_ids, format)}``:
            rows of that layer's output that belong to these nodes (global node ids, or a
            bool mask over the nodes, e.g. from :func:`fxquant.top_degree_nodes`) are rounded
            to another format (kept bits or a format). A bit-width for every node is
            :class:`~fxquant.quant.node_bits.NodeBits` in a QuantConfig instead.
        inplace (bool, optional): share parameters and buffers with ``model`` instead of
            copying them; ``model`` itself computes as before (a layer rounded inside is
            replaced by a copy sharing its tensors), except that a ``GraphModule`` passed
            in is the one transformed. (default: :obj:`False`)
        concrete_args, leaf_modules (optional): passed to :func:`fxquant.trace`.

    Returns:
        torch.fx.GraphModule: the model with a :class:`~fxquant.quant.points.QuantPoint`
        module called at each quantization point. It takes the model's arguments plus
        ``node_ids=None``: a mini-batch passes its nodes' global ids there, of any integer
        dtype (``gm(batch.x, batch.edge_index, node_ids=batch.n_id)``), so that per-node settings
        follow the nodes (see :mod:`fxquant.quant.nodes`).

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
        def forward(self, x, edge_index, node_ids = None):
            conv1 = self.conv1(x, edge_index);  x = None
            conv1_quant = self.conv1_quant(conv1);  conv1 = None
            relu = conv1_quant.relu();  conv1_quant = None
            conv2 = self.conv2(relu, edge_index);  relu = edge_index = None
            conv2_quant = self.conv2_quant(conv2);  conv2 = None
            return conv2_quant
        >>> gm.conv1_quant
        QuantPoint(output of 'conv1': top16, toward_zero, ste)
        >>> gm = transform(GCN(), format="e4m3", scale="tensor", layers="conv1")
        >>> gm.conv1_quant
        QuantPoint(output of 'conv1': e4m3, nearest, scale tensor, ste)
    """
    if not isinstance(model, nn.Module):
        raise FxquantTypeError(f"fxquant.transform expects a torch.nn.Module, got {type(model).__name__}")
    refuse_compiled(model, "transform")
    refuse_lazy(model, "transform")
    if not isinstance(inplace, bool):
        raise FxquantTypeError(f"inplace must be True or False, got {inplace!r}")
    check_leaf_modules(leaf_modules)
    max_bits = _max_bits(model)
    if isinstance(mapping, (QuantMapping, QuantConfig)):
        _refuse_number_keywords(mapping, {
            "bits": bits, "format": format, "scale": scale, "decay": decay,
            "momentum": momentum, "rounding": rounding, "grad": grad, "grad_bits": grad_bits,
            "grad_format": grad_format})
    if isinstance(mapping, QuantMapping):
        chosen = copy.deepcopy(mapping) if node_formats else mapping
        _add_overrides(chosen, node_formats, max_bits)
    elif isinstance(mapping, QuantConfig):
        chosen = QuantMapping()
        if layers is None:
            chosen.set_global(mapping)
        else:
            for spec in _layer_specs(layers):
                _add_selector(chosen, spec, mapping, "layers")
        _add_overrides(chosen, node_formats, max_bits)
    else:
        if mapping is not None:
            if bits is not None:
                raise FxquantValueError("fxquant.transform: bits given twice (positionally and as bits=)")
            bits = mapping
        decay = check_decay(decay, momentum, "fxquant.transform: ")
        chosen = _sugar(bits, format, scale, decay, layers, rounding,
                        "ste" if grad is None else grad, grad_bits, grad_format, node_formats,
                        max_bits)

    # Trace and validate first: nothing is copied or changed on error.
    gm = model if isinstance(model, GraphModule) else trace(model, concrete_args, leaf_modules)
    points = plan(gm, chosen)
    if isinstance(mapping, QuantMapping) and layers is not None:
        points = _only_layers(gm, points, layers)
    check_points(gm, points)
    _warn_unscaled(points)
    if not inplace:
        gm = copy.deepcopy(gm)
    else:
        _own_layers(gm, inner_layers(gm, points))
    nodes = {n.name: n for n in gm.graph.nodes}
    insert_quant_points(gm, [Resolved(nodes[p.node.name], p.site, p.config, p.override,
                                      p.part) for p in points])
    remember_trace(gm, concrete_args, leaf_modules)
    return gm


def _own_layers(gm: GraphModule, targets: Iterable[str]) -> None:
    """Replace each layer of ``targets`` in ``gm`` (under every name it has there) by a copy
    sharing its tensors and hooks: what rounds inside a layer is set on the layer itself,
    and with ``inplace=True`` the layer is also the user's model's. Shared, not copied:
    every tensor the layer's modules hold (parameters, buffers, and computed ones such as a
    pruned ``weight``), their buffer tables (a buffer converted by ``.to()`` or replaced is
    replaced in both), their hook tables (a hook added or removed later acts on both), and
    every module of ``gm`` outside the layer (the points an earlier transform set inside it
    stay the GraphModule's)."""
    for target in targets:
        module = gm.get_submodule(target)
        inside = {id(m) for m in module.modules()}
        memo: dict[int, Any] = {id(m): m for m in gm.modules() if id(m) not in inside}
        for m in module.modules():
            for key, value in vars(m).items():
                if isinstance(value, Tensor) or ("hooks" in key and isinstance(value, dict)):
                    memo[id(value)] = value
            for table in ("_parameters", "_buffers"):
                memo.update((id(t), t) for t in vars(m)[table].values() if t is not None)
            # the buffer table itself: .to(), .double() and load_state_dict(assign=True)
            # replace buffers in it (parameters they convert in place)
            memo[id(vars(m)["_buffers"])] = vars(m)["_buffers"]
        twin = copy.deepcopy(module, memo)
        for name, found in list(gm.named_modules(remove_duplicate=False)):
            if found is module and name:
                gm.set_submodule(name, twin)
