"""The graph pass: insert a :class:`~fxquant.quant.points.QuantPoint` at each resolved
quantization point of a traced model.

Around a layer (``output``, ``input``) a point is a ``call_module`` node of the graph (an
input point goes before a dropout whose one user is the layer: see :func:`_dropout_source`);
inside it (``weight``, ``message``, ``aggregate``) points are installed on the layer's
transformed copy by :mod:`fxquant.quant.sites` and registered on the GraphModule too.

Node metadata written (documented keys, as torch.fx passes do):

``node.meta["fxquant"]``
    on each inserted ``call_module`` node: ``{"layer": <layer name>, "site": Site,
    "part": <part or None>}`` (:mod:`fxquant.quant.parts`). The point module itself
    carries its config, which survives pickling where metadata does not.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassResult
from torch_geometric.nn import MessagePassing

from fxquant.errors import FxquantValueError
from fxquant.fx.graph_utils import free_name
from fxquant.fx.hetero import is_plumbing
from fxquant.fx.selectors import layer_name
from fxquant.quant.mapping import Resolved
from fxquant.quant.nodes import LayerMasks, NodeIds, new_masks, set_node_ids
from fxquant.quant.parts import layer_input, relations_of, weight_relation_rows
from fxquant.quant.points import QuantPoint
from fxquant.quant.site import AnySite, Part, Site, SiteKind, part_suffix
from fxquant.quant.sites import (
    check_install,
    install,
    linears_of,
    patched_children,
    weights_of,
)

__all__ = ["NODE_IDS_ARG", "check_points", "edge_index_of", "insert_quant_points",
           "layer_input"]


def _other_than(*new: Node) -> Callable[[Node], bool]:
    return lambda user: all(user is not n for n in new)


def edge_index_of(gm: GraphModule, node: Node) -> Node | None:
    """The ``edge_index`` argument of a call of a PyG ``MessagePassing`` layer, if a node."""
    if node.op != "call_module" or not isinstance(gm.get_submodule(str(node.target)),
                                                  MessagePassing):
        return None
    arg = node.args[1] if len(node.args) > 1 else node.kwargs.get("edge_index")
    return arg if isinstance(arg, Node) else None


def _point_name(gm: GraphModule, node: Node, site: AnySite, part: Part,
                tensor: str = "") -> str:
    """A free module name for a point: ``conv1_quant`` (the output), ``conv1_input_quant``,
    ``conv1_input_source_quant`` (a part), ``conv1_weight_lin_weight_quant``."""
    base = node.name if site is Site.OUTPUT else f"{node.name}_{site.value}"
    if tensor:
        base += f"_{tensor.replace('.', '_')}"
    if part is not None and part != "target":
        base += f"_{part_suffix(part)}"
    return free_name(gm, f"{base}_quant")


def insert_quant_points(gm: GraphModule, points: Sequence[Resolved]) -> PassResult:
    """Insert every point of ``points`` into ``gm`` in place (see the module docs).

    Every user of a rounded value reads the new value instead (out of place: the original
    value is still there for whatever backward saved). The points' buffers are created on
    the device of ``gm``'s parameters.
    """
    if not points:
        return PassResult(gm, False)
    check_points(gm, points)  # before any change
    device = next((b.device for b in gm.buffers()), None) or next(
        (p.device for p in gm.parameters()), torch.device("cpu"))
    graph = gm.graph
    inner: dict[str, dict[str, Any]] = {}
    targets = _layer_targets(gm, points)
    for p in points:
        node, layer = p.node, layer_name(p.node)
        target = targets.get(str(node.target), str(node.target))
        if p.site.inner:
            sites = inner.setdefault(target, {"layer": layer, "seen": set()})
            if (p.site.value, p.part) in sites["seen"]:
                continue  # a layer called twice: its inner sites are one set of points
            sites["seen"].add((p.site.value, p.part))
        if p.site in (Site.WEIGHT, Site.LINEAR):
            module = gm.get_submodule(target)
            names = weights_of(module) if p.site is Site.WEIGHT else linears_of(module)
            if p.site is Site.WEIGHT:  # per relation: the tensors that are; else the rest
                names = [t for t in names if (weight_relation_rows(module, t) is None)
                         == (p.part is None)]
            for tensor in names:
                name = _point_name(gm, node, p.site, p.part, tensor)
                point = QuantPoint(p.config, layer, p.site, None, tensor=tensor,
                                   part=p.part).to(device)
                gm.add_submodule(name, point)
                if p.part is None:
                    sites.setdefault(p.site.value, {})[tensor] = point
                else:
                    sites.setdefault("weight_relations", {}).setdefault(
                        tensor, {})[p.part] = point
            continue
        name = _point_name(gm, node, p.site, p.part)
        found = layer_input(gm, node) if p.site is Site.INPUT else None
        takes_dict = found is not None and isinstance(found[1], dict)
        side = "source" if found is not None and not takes_dict and p.part == "source" \
            else "target"
        point = QuantPoint(p.config, layer, p.site, p.override, part=p.part,
                           side=side).to(device)
        gm.add_submodule(name, point)
        if p.site.inner:
            if p.site is Site.MESSAGE and p.part is not None:
                sites.setdefault("message_relations", {})[p.part] = point
            else:
                sites[p.site.value] = point
            continue
        edge_index = edge_index_of(gm, node) if p.config.protect is not None else None
        extra = (edge_index,) if edge_index is not None else ()
        if p.site is Site.OUTPUT:
            _round_output(gm, node, name, layer, p, extra)
        elif takes_dict:
            _round_dict_input(gm, node, name, layer, p)
        else:  # INPUT: the first argument, or each tensor of a (source, target) pair
            _round_input(gm, node, name, point, layer, p, extra)
    # node ids first: their argument is the forward argument the masks' call passes along
    _add_node_ids(gm, [m for m in gm.modules() if isinstance(m, QuantPoint) and m.uses_node_ids])
    shared = _add_masks(gm)
    for target, sites in inner.items():
        mine = [q for q in shared if q.layer == sites["layer"]]
        drawer = mine[0] if any(q.site.inner for q in mine) else None
        module = gm.get_submodule(target)
        install(sites["layer"], module, sites.get("weight"), sites.get("message"),
                sites.get("aggregate"), sites.get("linear"), sites.get("edge"), drawer,
                sites.get("weight_relations"), sites.get("message_relations"),
                relations_of(module))
        for point in sites.values():  # registered sites, by their kind (checked before)
            if isinstance(point, QuantPoint) and isinstance(point.site, SiteKind):
                point.site.install(sites["layer"], module, point)
    graph.lint()
    gm.recompile()
    return PassResult(gm, True)


def _round_output(gm: GraphModule, node: Node, name: str, layer: str, p: Resolved,
                  extra: tuple) -> None:
    """A point after ``node`` (its users read the rounded value); for a dict part, after
    each lookup of that key that is used."""
    graph = gm.graph
    after = [node] if p.part is None else [
        u for u in node.users if u.op == "call_function" and u.target is operator.getitem
        and u.args[1] == p.part and u.users]
    for value in after:
        with graph.inserting_after(value):
            new = graph.call_module(name, (value, *extra))
        _annotate(new, node, layer, p.site, p.part)
        value.replace_all_uses_with(new, delete_user_cb=_other_than(new))


def _round_dict_input(gm: GraphModule, node: Node, name: str, layer: str,
                      p: Resolved) -> None:
    """The value of one key of the dict a layer call takes, rounded before the call."""
    graph = gm.graph
    first: dict[Any, Any] = dict(node.args[0])  # type: ignore[arg-type]  # (parts_of)
    with graph.inserting_before(node):
        new = graph.call_module(name, (first[p.part],))
    _annotate(new, node, layer, p.site, p.part)
    first[p.part] = new
    node.args = (first, *node.args[1:])


def _round_input(gm: GraphModule, node: Node, name: str, point: QuantPoint, layer: str,
                 p: Resolved, extra: tuple) -> None:
    """The layer's first argument rounded before the call: a tensor, each tensor of a pair
    of the same node set (``(x, x)``), or one part of a ``(source, target)`` pair."""
    graph = gm.graph
    found = layer_input(gm, node)
    assert found is not None  # (check_points refused a layer without one)
    where, first = found
    parts = list(first) if isinstance(first, (tuple, list)) else [first]
    chosen = {"target": 1, "source": 0}.get(str(p.part)) if p.part is not None else None
    rounded: list[Any] = []
    moved: set[Node] = set()
    for i, part in enumerate(parts):
        if not isinstance(part, Node) or (chosen is not None and i != chosen):
            rounded.append(part)
            continue
        point.__dict__["raw_input"] = _is_model_input(part, gm)
        if part in moved:  # the same tensor twice, e.g. (x, x)
            rounded.append(part)
            continue
        source = _dropout_source(gm, part, node, extra)
        with graph.inserting_before(part if source is not None else node):
            new = graph.call_module(name, (source if source is not None else part, *extra))
        _annotate(new, node, layer, p.site, p.part)
        if source is not None:  # rounds what the dropout receives
            part.args = (new, *part.args[1:])
            moved.add(part)
            rounded.append(part)
        else:
            rounded.append(new)
    value = type(first)(rounded) if isinstance(first, (tuple, list)) else rounded[0]
    if isinstance(where, str):
        node.kwargs = {**node.kwargs, where: value}
    else:
        node.args = (value, *node.args[1:])


def _layer_targets(gm: GraphModule, points: Sequence[Resolved]) -> dict[str, str]:
    """Each target of a layer rounded inside -> the first target of the same module (one
    module reached by two names is one layer: its inner sites are one set of points)."""
    first: dict[int, str] = {}
    out = {}
    for p in points:
        if p.site.inner:
            target = str(p.node.target)
            out[target] = first.setdefault(id(gm.get_submodule(target)), target)
    return out


def inner_layers(gm: GraphModule, points: Sequence[Resolved]
                 ) -> dict[str, dict[AnySite, Resolved]]:
    """The targets of the layers rounded inside, each with its inner sites' points (a layer
    called twice, or reached by two names: the first call's; a site of several parts:
    its first part's)."""
    targets = _layer_targets(gm, points)
    inner: dict[str, dict[AnySite, Resolved]] = {}
    for p in points:
        if p.site.inner:
            inner.setdefault(targets[str(p.node.target)], {}).setdefault(p.site, p)
    return inner


def _message_points(points: Sequence[Resolved], target: str, targets: dict[str, str]
                    ) -> list[Resolved]:
    """Every message point (of every part) of the layer ``target``."""
    return [p for p in points if p.site is Site.MESSAGE
            and targets[str(p.node.target)] == target]


def check_points(gm: GraphModule, points: Sequence[Resolved]) -> None:
    """Raise, changing nothing, where :func:`insert_quant_points` could not insert
    ``points``: per-node settings in a forward without named arguments, or a layer that
    cannot take the objects that round inside it (:func:`~fxquant.quant.sites.check_install`:
    not a PyG layer for messages, a layer with attributes of its own, one a transform
    before already rounds inside, or a linear child that two layers share)."""
    starred = any(n.op == "placeholder" and str(n.target).startswith("*") for n in gm.graph.nodes)
    if starred and any(p.override is not None or p.config.node_bits is not None for p in points):
        raise FxquantValueError("fxquant: per-node settings need a node_ids argument, but this "
                                "forward takes *args/**kwargs; please give it named arguments")
    children: dict[int, str] = {}
    targets = _layer_targets(gm, points)
    for target, sites in inner_layers(gm, points).items():
        module = gm.get_submodule(target)
        layer = layer_name(next(iter(sites.values())).node)
        messages = _message_points(points, target, targets)
        by_source = any(p.config.protect is not None and p.config.protect.messages == "source"
                        for p in messages)
        weights = weights_of(module) if Site.WEIGHT in sites else []
        linear = linears_of(module) if Site.LINEAR in sites else []
        check_install(
            layer, module, weights, Site.MESSAGE in sites, Site.AGGREGATE in sites, linear,
            Site.EDGE in sites, by_source,
            any(p.config.protect is not None and p.config.protect.share == "layer"
                for p in sites.values()),
            any(p.part is not None for p in messages))
        for kind in (s for s in sites if isinstance(s, SiteKind)):
            try:
                kind.check(layer, module)
            except (TypeError, ValueError) as e:
                raise FxquantValueError(f"fxquant.transform: the {kind.name} site cannot be "
                                        f"rounded on layer {layer!r}: {e}") from e
        for name in patched_children(module, weights, linear):
            other = children.setdefault(id(module.get_submodule(name)), f"{layer}.{name}")
            if other != f"{layer}.{name}":
                raise FxquantValueError(
                    f"fxquant.transform: the linear {name!r} of layer {layer!r} is the same "
                    f"module as {other!r}; its weight or output can be rounded for one layer "
                    "only. Please give the 'weight'/'linear' site to one of these layers")


#: The argument a transformed model takes the batch's global node ids through.
NODE_IDS_ARG = "node_ids"


def _add_node_ids(gm: GraphModule, points: list[QuantPoint]) -> None:
    """A ``node_ids=None`` argument (every transformed model takes one, so mini-batch code
    need not know whether the mapping has per-node settings), fed to one :class:`NodeIds`
    that ``points`` (those with per-node settings) read."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if any(str(n.target).startswith("*") for n in placeholders):
        if points:
            raise FxquantValueError("fxquant: per-node settings need a node_ids argument, but this "
                             "forward takes *args/**kwargs; please give it named arguments")
        return
    names = {str(n.target) for n in placeholders}
    arg = NODE_IDS_ARG if NODE_IDS_ARG not in names else f"fxquant_{NODE_IDS_ARG}"
    anchor = placeholders[-1] if placeholders else next(iter(graph.nodes))
    with graph.inserting_after(anchor):
        ids = graph.placeholder(arg, default_value=None)
    gm.meta["fxquant_node_ids_arg"] = arg
    if not points:
        return
    context = NodeIds()
    for point in points:
        point.attach(context)
    _add_context(gm, "fxquant_node_ids", context, ids, set_node_ids, ids)


def _add_context(gm: GraphModule, base: str, context: torch.nn.Module, after: Node | None,
                 fn: Callable[..., Any], *args: Any) -> None:
    """``context`` as a submodule named after ``base``, and a call ``fn(context, *args)``
    right after ``after`` (at the start of the graph where None)."""
    name = free_name(gm, base)
    gm.add_submodule(name, context)
    graph = gm.graph
    with graph.inserting_after(after) if after is not None else \
            graph.inserting_before(next(iter(graph.nodes))):
        holder = graph.get_attr(name)
    with graph.inserting_after(holder):
        graph.call_function(fn, (holder, *args))


def _add_masks(gm: GraphModule) -> list[QuantPoint]:
    """One :class:`LayerMasks` for the points whose protection shares one mask per layer
    (``Protection(share="layer")``), emptied at the start of every forward; returns them."""
    points = [m for m in gm.modules() if isinstance(m, QuantPoint)
              and m.config.protect is not None and m.config.protect.share == "layer"]
    if not points:
        return []
    context = LayerMasks()
    for point in points:
        point.attach_masks(context)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    # a forward argument passed along: re-traced (unpickled), the call records itself
    _add_context(gm, "fxquant_masks", context, placeholders[-1] if placeholders else None,
                 new_masks, *placeholders[-1:])
    return points


#: Dropouts that zero values and scale the rest by ``1 / (1 - p)``: rounding commutes with
#: them up to that scale (alpha dropouts add an offset, and do not).
_SCALING_DROPOUTS = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d,
                     torch.nn.Dropout3d)


def _dropout_source(gm: GraphModule, part: Node, layer: Node, extra: tuple) -> Node | None:
    """What a dropout right before ``layer`` receives, where an input point should round it.

    In training a dropout scales the values it keeps by ``1 / (1 - p)`` (2x at PyG's usual
    ``p=0.5``), in evaluation it passes them unchanged. A point after it would fit its range
    or learned step to the scaled values and, in evaluation, round the unscaled ones with
    it: on Cora's normalized features at INT4 most of them fell to zero (30% accuracy in
    evaluation against a training loss of 0.3). Rounding before the dropout gives the
    layer ``dropout(round(x))``: the same values in evaluation, and in training the
    rounded values with dropout's mask and scale. Only where the dropout's one user is the
    layer (another user would see unrounded values) and ``extra`` (the protection's
    ``edge_index``) is already computed there."""
    if part.op != "call_module" or type(gm.get_submodule(str(part.target))) \
            not in _SCALING_DROPOUTS:
        return None
    if list(part.users) != [layer] or len(part.args) != 1 or part.kwargs \
            or not isinstance(part.args[0], Node):
        return None
    return part.args[0] if all(e < part for e in extra) else None  # fx keeps node order


def _is_model_input(node: Node, gm: GraphModule | None = None) -> bool:
    """A forward argument, or a field or entry of one (``data.x``, ``x_dict["paper"]``),
    possibly through dropout."""
    while gm is not None and node.op == "call_module" and isinstance(
            gm.get_submodule(str(node.target)), torch.nn.modules.dropout._DropoutNd) \
            and node.args and isinstance(node.args[0], Node):
        node = node.args[0]
    if node.op == "placeholder":
        return True
    if gm is not None and is_plumbing(gm, node):
        return True
    return node.op == "call_function" and node.target is getattr and bool(node.args) \
        and isinstance(node.args[0], Node) and node.args[0].op == "placeholder"


def _annotate(new: Node, node: Node, layer: str, site: AnySite, part: Part = None) -> None:
    new.meta["fxquant"] = {"layer": layer, "site": site, "part": part}
    if "stack_trace" in node.meta:
        new.meta["stack_trace"] = node.meta["stack_trace"]
