"""Which quantization point gets which :class:`~fxquant.QuantConfig`: the
:class:`QuantMapping`, its documented precedence, and its resolution on a traced graph.

Example:
    >>> from torch_geometric.nn import GCNConv
    >>> from fxquant.quant.config import QuantConfig
    >>> mapping = (QuantMapping()
    ...            .set_global(QuantConfig(16))
    ...            .set_type(GCNConv, QuantConfig("e4m3", scale="tensor"))
    ...            .set_name("conv2", QuantConfig(8, rounding="nearest")))
    >>> print(mapping)
    QuantMapping(
      global output: top16, toward_zero, ste
      type GCNConv output: e4m3, nearest, scale tensor, ste
      name 'conv2' output: top8, nearest, ste
    )
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch_geometric.nn as pyg_nn
from torch import Tensor, nn
from torch.fx import GraphModule, Node
from torch_geometric.nn import MessagePassing
from torch_geometric.nn.dense.linear import Linear as PygLinear
from torch_geometric.nn.models import MLP

from fxquant.errors import FxquantTypeError, FxquantValueError
from fxquant.fx.hetero import is_plumbing, model_types, pooling_nodes, readout_nodes
from fxquant.fx.selectors import layer_name, layer_names, matches, unknown_layer
from fxquant.quant.config import QuantConfig
from fxquant.quant.override import NodeOverride
from fxquant.quant.parts import part_types, parts_of
from fxquant.quant.site import (
    AnySite,
    Part,
    Site,
    part_from_json,
    part_text,
    part_to_json,
    site_rank,
)

__all__ = ["READOUT", "QuantMapping", "Resolved"]


_GLOBAL, _TYPE, _NODE_TYPE, _EDGE_TYPE, _PATTERN, _NAME = range(6)
_KIND = {_GLOBAL: "global", _TYPE: "type", _NODE_TYPE: "node_type", _EDGE_TYPE: "edge_type",
         _PATTERN: "pattern", _NAME: "name"}

#: The modules of a graph classifier's head that the global entry rounds after a pooling.
READOUT: tuple[type[nn.Module], ...] = (nn.Linear, PygLinear, MLP)
#: The sites the global entry gives a pooling call and a module of the head.
_READOUT_SITES = (Site.INPUT, Site.OUTPUT, Site.WEIGHT, Site.LINEAR)


@dataclass(frozen=True)
class _Entry:
    level: int
    selector: Any  # None (global), a module class, a node or edge type, a pattern or
    site: AnySite  # predicate, or a name
    config: QuantConfig | None
    source: str = "the mapping"  # how errors name where the entry came from
    part: Part = None  # a name or pattern entry for one part of the site only

    def describe(self) -> str:
        what = {_GLOBAL: "global", _TYPE: f"type {getattr(self.selector, '__name__', '?')}",
                _NODE_TYPE: f"node type {self.selector!r}",
                _EDGE_TYPE: f"edge type {self.selector!r}",
                _PATTERN: f"pattern {self.selector!r}" if isinstance(self.selector, str)
                else f"predicate {getattr(self.selector, '__name__', 'lambda')}",
                _NAME: f"name {self.selector!r}"}[self.level]
        site = self.site.value + (f" [{part_text(self.part)}]" if self.part is not None else "")
        return f"{what} {site}: " + (
            self.config.describe() if self.config is not None else "not quantized")


@dataclass(frozen=True)
class Resolved:
    """What one quantization point of a traced graph gets."""

    node: Node
    site: AnySite
    config: QuantConfig
    override: NodeOverride | None
    #: which of the site's tensors (:mod:`fxquant.quant.parts`), None where it rounds one
    part: Part = None


class QuantMapping:
    """Which layers and sites get which :class:`QuantConfig`.

    Precedence, from weakest to strongest (as torch.ao's ``QConfigMapping``): the global
    entry < a module type < a node type < an edge type < a name pattern or predicate < an
    exact name. Within one level a later call wins. A config of :obj:`None` excludes what
    it matches. The global entry covers every PyG ``MessagePassing`` layer (the layers
    fxquant quantizes when nothing else is named) and a graph classifier's readout: PyG's
    global pooling calls (``global_add_pool``, ...) and the linear layers of the head
    after them (:data:`READOUT`), at their ``input``, ``output``, ``weight`` and
    ``linear`` sites. Other layers are picked by type, node or edge type, pattern or
    name. Each ``set_*`` takes a ``site`` (default ``"output"``) and returns the mapping,
    so calls chain.

    A site that rounds several tensors of one call (the two parts of a ``(source,
    target)`` input, the node types of a dict, the relations inside ``RGCNConv`` or
    ``HGTConv``: :mod:`fxquant.quant.parts`) has one point per part; the node type and
    edge type entries choose among them, the other entries cover all of them.

    Example:
        >>> import fxquant
        >>> from torch_geometric.nn.models import GCN
        >>> int8 = fxquant.QuantConfig("int8", scale="tensor")
        >>> mapping = (fxquant.QuantMapping()
        ...            .set_global(int8)                                    # every conv's output
        ...            .set_global(fxquant.QuantConfig("e4m3", scale="tensor"), site="message")
        ...            .set_name("convs.1", None))                          # but not the last conv
        >>> gm = fxquant.transform(GCN(4, 8, num_layers=2, out_channels=2), mapping)
        >>> [name for name, _ in fxquant.quantization_points(gm)]
        ['convs_0_message_quant', 'convs_0_quant', 'convs_1_message_quant']
    """

    def __init__(self) -> None:
        self._entries: list[_Entry] = []
        self._overrides: list[tuple[str, AnySite, NodeOverride]] = []

    # -- building ------------------------------------------------------------------------

    def _add(self, level: int, selector: Any, config: QuantConfig | None, site: object,
             source: str, part: Part = None) -> QuantMapping:
        if config is not None and not isinstance(config, QuantConfig):
            raise FxquantTypeError(f"config must be a QuantConfig or None, got {config!r}; e.g. "
                            "QuantConfig(16) or QuantConfig('e4m3', scale='tensor')")
        self._entries.append(_Entry(level, selector, Site.parse(site), config, source, part))
        return self

    def set_global(self, config: QuantConfig | None, *, site: str | AnySite = "output",
                   source: str = "the mapping") -> QuantMapping:
        """Every ``MessagePassing`` layer, and a graph classifier's pooling and head (at
        the sites they have; without the config's protection, whose draws follow node
        degrees: their rows are graphs), unless a stronger entry says otherwise.

        Every ``set_*`` takes ``source``: how error messages name where the entry came from
        (``transform``'s keyword arguments pass their own names).
        """
        return self._add(_GLOBAL, None, config, site, source)

    def set_type(self, cls: type[nn.Module], config: QuantConfig | None, *,
                 site: str | AnySite = "output", source: str = "the mapping") -> QuantMapping:
        """Every submodule that is an instance of ``cls``."""
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise FxquantTypeError(f"set_type expects a torch.nn.Module subclass, got {cls!r}")
        return self._add(_TYPE, cls, config, site, source)

    def set_node_type(self, node_type: str, config: QuantConfig | None, *,
                      site: str | AnySite = "output",
                      source: str = "the mapping") -> QuantMapping:
        """What belongs to the nodes of one type of a heterogeneous model (``"paper"``):
        every site of a layer that is that node type's copy (``to_hetero``'s, a
        ``ModuleDict`` keyed by node type); on a layer of an edge type
        (``HeteroConv``'s, ``to_hetero``'s), the sites whose rows are such nodes: the
        output and aggregation of an edge type that ends at the type, and the input part
        of that type (the target of a ``(source, target)`` pair, or its source); the
        entry of that type of a layer that takes or returns a dict (``HGTConv``).

        Example:
            >>> import fxquant
            >>> from torch_geometric.nn import HeteroConv, SAGEConv
            >>> class Net(torch.nn.Module):
            ...     def __init__(self):
            ...         super().__init__()
            ...         self.conv = HeteroConv({("author", "writes", "paper"): SAGEConv((3, 4), 8)})
            ...     def forward(self, x_dict, edge_index_dict):
            ...         return self.conv(x_dict, edge_index_dict)["paper"]
            >>> x = {"author": torch.randn(3, 3), "paper": torch.randn(2, 4)}
            >>> edges = {("author", "writes", "paper"): torch.tensor([[0, 1, 2], [0, 1, 1]])}
            >>> mapping = fxquant.QuantMapping().set_node_type(
            ...     "author", fxquant.QuantConfig("int8", scale="tensor"), site="input")
            >>> gm = fxquant.transform(Net(), mapping, example_inputs=(x, edges))
            >>> [name for name, _ in fxquant.quantization_points(gm)]
            ['conv_convs_author___writes___paper__input_source_quant']
        """
        if not isinstance(node_type, str):
            raise FxquantTypeError(f"set_node_type expects a node type (a str such as "
                                   f"'paper'), got {node_type!r}")
        return self._add(_NODE_TYPE, node_type, config, site, source)

    def set_edge_type(self, edge_type: tuple[str, str, str] | int, config: QuantConfig | None,
                      *, site: str | AnySite = "output",
                      source: str = "the mapping") -> QuantMapping:
        """What belongs to one relation: every site of a layer that is that edge type's
        copy (``HeteroConv``'s ``convs``, ``to_hetero``'s ``conv1.author__writes__paper``),
        and inside a layer that computes per relation the messages and weights of that
        relation: an edge type of ``HGTConv``, or a relation index (an ``int``) of
        ``RGCNConv`` / ``FastRGCNConv``.

        Example:
            >>> import fxquant
            >>> from torch_geometric.nn import RGCNConv
            >>> class Net(torch.nn.Module):
            ...     def __init__(self):
            ...         super().__init__()
            ...         self.conv = RGCNConv(4, 8, num_relations=3)
            ...     def forward(self, x, edge_index, edge_type):
            ...         return self.conv(x, edge_index, edge_type)
            >>> int8, int4 = (fxquant.QuantConfig(f, scale="tensor") for f in ("int8", "int4"))
            >>> mapping = (fxquant.QuantMapping().set_global(int8, site="message")
            ...            .set_edge_type(2, int4, site="message"))
            >>> gm = fxquant.transform(Net(), mapping)
            >>> [(name, p.config.format.spec()) for name, p in fxquant.quantization_points(gm)]
            [('conv_message_r0_quant', 'int8'), ('conv_message_r1_quant', 'int8'), \
('conv_message_r2_quant', 'int4')]
        """
        ok = (isinstance(edge_type, tuple) and len(edge_type) == 3
              and all(isinstance(k, str) for k in edge_type)) or (
            isinstance(edge_type, int) and not isinstance(edge_type, bool) and edge_type >= 0)
        if not ok:
            raise FxquantTypeError(
                f"set_edge_type expects an edge type (source, relation, target), e.g. "
                f"('author', 'writes', 'paper'), or a relation index >= 0 of an RGCNConv; got "
                f"{edge_type!r}")
        return self._add(_EDGE_TYPE, edge_type, config, site, source)

    def set_pattern(self, pattern: str | Callable[[Node], bool], config: QuantConfig | None, *,
                    site: str | AnySite = "output", source: str = "the mapping",
                    part: Part = None) -> QuantMapping:
        """Layers whose name matches an fnmatch ``pattern`` (``"conv*"``), or a predicate on
        the ``torch.fx.Node``. A pattern never selects what only carries the forward's
        arguments along (``x_dict["paper"]``, ``to_hetero``'s ``edge_index__...`` getters):
        they hold no value to round, and a pattern that matches only such nodes is an
        error. ``part``: as for :meth:`set_name`."""
        if not (isinstance(pattern, str) or (callable(pattern) and not isinstance(pattern, type))):
            raise FxquantTypeError(f"set_pattern expects an fnmatch pattern or a predicate on "
                            f"torch.fx.Node, got {pattern!r}")
        _check_part(part, "set_pattern")
        return self._add(_PATTERN, pattern, config, site, source, part)

    def set_name(self, name: str, config: QuantConfig | None, *,
                 site: str | AnySite = "output", source: str = "the mapping",
                 part: Part = None) -> QuantMapping:
        """One layer, by submodule name (``"conv1"``, ``"convs.0"``) or node name
        (``"sigmoid"``); with ``part``, one part of the site only (``"source"``, a node
        type of a dict, a relation: :mod:`fxquant.quant.parts`)."""
        if not isinstance(name, str):
            raise FxquantTypeError(f"set_name expects a layer name, got {name!r}")
        _check_part(part, "set_name")
        return self._add(_NAME, name, config, site, source, part)

    def set_nodes(self, layer: str, nodes: Tensor | Sequence[int], format: Any, *,
                  site: str | AnySite = "output") -> QuantMapping:
        """Rows of ``layer``'s ``site`` that belong to ``nodes`` are rounded to ``format``
        (kept bits or a format) instead; the layer must get a config of its own."""
        override = NodeOverride.parse((nodes, format), layer)
        self._overrides.append((layer, Site.parse(site), override))
        return self

    # -- reading -------------------------------------------------------------------------

    def __repr__(self) -> str:
        lines = [e.describe() for e in self._entries]
        lines += [f"nodes of {layer!r} {site.value}: {o.describe()}"
                  for layer, site, o in self._overrides]
        return "QuantMapping(\n" + "".join(f"  {line}\n" for line in lines) + ")"

    def __bool__(self) -> bool:
        return bool(self._entries)

    def _matches(self, entry: _Entry, gm: GraphModule, node: Node,
                 readout: tuple[set[Node], set[Node]] | None = None) -> bool:
        """Whether ``entry`` selects the layer ``node`` (some part of its site);
        ``readout``: the model's pooling calls and head (found once per resolve)."""
        if entry.level == _GLOBAL:
            return _covered(gm, node, entry.site, readout or _readout(gm))
        if entry.level in (_NODE_TYPE, _EDGE_TYPE):
            return any(self._matches_part(entry, gm, node, part)
                       for part in parts_of(gm, node, entry.site))
        if entry.part is not None and entry.part not in parts_of(gm, node, entry.site):
            return False
        if entry.level == _NAME:
            return entry.selector in layer_names(node)
        return matches(gm, node, entry.selector)

    @staticmethod
    def _matches_part(entry: _Entry, gm: GraphModule, node: Node, part: Part) -> bool:
        """Whether an entry that selected ``node`` covers its ``part``."""
        if entry.level in (_NODE_TYPE, _EDGE_TYPE):
            node_type, edge_type = part_types(gm, node, entry.site, part)
            found = node_type if entry.level == _NODE_TYPE else edge_type
            return found is not None and found == entry.selector
        return entry.part is None or entry.part == part

    def resolve(self, gm: GraphModule, nodes: Iterable[Node]) -> list[Resolved]:
        """The quantization points of ``gm`` among ``nodes``, in graph order; validates every
        entry first (unknown names, types that match nothing) and touches nothing. What
        only carries the forward's arguments along is never a point."""
        nodes = [n for n in nodes if not is_plumbing(gm, n)]
        for entry in self._entries:
            if entry.level == _GLOBAL:
                continue
            if not any(self._matches(entry, gm, n) for n in nodes):
                raise _no_match(gm, entry, nodes, entry.source)
        Key = tuple[Node, AnySite, Part]
        chosen: dict[Key, tuple[tuple[int, int], QuantConfig | None]] = {}
        readout = _readout(gm)
        skipped: list[Node] = []
        for order, entry in enumerate(self._entries):
            for n in nodes:
                if not self._matches(entry, gm, n, readout):
                    continue
                config = entry.config
                if entry.level == _GLOBAL and (n in readout[0] or n in readout[1]) \
                        and config is not None:
                    config = _for_readout(config)
                    if config is None:
                        skipped.append(n)
                        continue
                for part in parts_of(gm, n, entry.site):
                    if not self._matches_part(entry, gm, n, part):
                        continue
                    key, rank = (n, entry.site, part), (entry.level, order)
                    if key not in chosen or chosen[key][0] <= rank:
                        chosen[key] = (rank, config)
        rounded_nodes = {k[0] for k, v in chosen.items() if v[1] is not None}
        floats = [layer_name(n) for n in dict.fromkeys(skipped) if n not in rounded_nodes]
        if floats:
            warnings.warn(
                f"fxquant: the global config sets a bit-width per node (node_bits), which the "
                f"readout of a graph classifier ({', '.join(floats)}: one row "
                "per graph) cannot take, so it stays in floating point; please give it a "
                "config of its own with set_name", UserWarning, stacklevel=_user_stacklevel())
        overrides: dict[tuple[Node, AnySite], NodeOverride] = {}
        for layer, site, override in self._overrides:
            matched = [n for n in nodes if matches(gm, n, layer)]
            if not matched:
                raise _no_match(gm, _Entry(_NAME, layer, site, None), nodes, "node_formats")
            for n in matched:
                rounded = [k for k, v in chosen.items()
                           if k[0] is n and k[1] == site and v[1] is not None]
                if not rounded:
                    here = sorted({k[1].value for k, v in chosen.items()
                                   if k[0] is n and v[1] is not None})
                    if here:  # the layer rounds, at other sites than the override's
                        raise FxquantValueError(
                            f"node_formats[{layer!r}] sets nodes of the {site.value} site of "
                            f"{layer_name(n)!r}, which rounds only its {', '.join(here)} "
                            f"site(s); please pass site={here[0]!r} to set_nodes (or give "
                            f"the {site.value} site a config first)")
                    quantized = sorted({layer_name(k[0]) for k, v in chosen.items()
                                        if v[1] is not None})
                    raise FxquantValueError(
                        f"node_formats[{layer!r}] names {layer_name(n)!r}, which gets no "
                        f"quantization; quantized layers: {quantized}. Please give it a config "
                        "(bits=/layers=, or the mapping) first."
                    )
                overrides[(n, site)] = override
        order_of = {n: i for i, n in enumerate(nodes)}
        points = [Resolved(n, site, config, overrides.get((n, site)), part)
                  for (n, site, part), (_, config) in chosen.items() if config is not None]
        rank_of = {key: i for i, key in enumerate(
            (n, site, part) for n in nodes for site in {k[1] for k in chosen}
            for part in parts_of(gm, n, site))}
        return sorted(points, key=lambda p: (order_of[p.node], site_rank(p.site),
                                             rank_of.get((p.node, p.site, p.part), 0)))

    # -- JSON ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-able; module types by qualified class name, predicates refused."""
        entries = []
        for e in self._entries:
            if e.level == _TYPE:
                selector: Any = f"{e.selector.__module__}.{e.selector.__qualname__}"
            elif e.level == _PATTERN and not isinstance(e.selector, str):
                raise FxquantValueError("a QuantMapping with a predicate (set_pattern(callable)) cannot "
                                 "be written as JSON; please use a name or fnmatch pattern")
            elif e.level == _EDGE_TYPE:
                selector = part_to_json(e.selector)
            else:
                selector = e.selector
            entries.append({"kind": _KIND[e.level], "selector": selector, "site": e.site.value,
                            "config": None if e.config is None else e.config.to_dict(),
                            **({"part": part_to_json(e.part)} if e.part is not None else {})})
        overrides = [{"layer": layer, "site": site.value, "format": o.format.spec(),
                      "nodes": o.nodes.tolist(), "mask": o.nodes.dtype == torch.bool}
                     for layer, site, o in self._overrides]
        return {"entries": entries, "node_overrides": overrides}

    @classmethod
    def from_dict(cls, data: dict[str, Any],
                  types: Iterable[type[nn.Module]] = ()) -> QuantMapping:
        """Read :meth:`to_dict`'s output; module types are looked up among ``types`` and
        the classes of PyG's and torch's ``nn`` (nothing is imported by name)."""
        known = _known_types(types)
        mapping = cls()
        levels = {v: k for k, v in _KIND.items()}
        for e in data.get("entries", []):
            config = None if e["config"] is None else QuantConfig.from_dict(e["config"])
            selector = e["selector"]
            if e["kind"] == "type":
                if selector not in known:
                    raise FxquantValueError(f"module type {selector!r} is not among the classes given "
                                     "in types= (nor a PyG or torch.nn class)")
                selector = known[selector]
            elif e["kind"] == "edge_type":
                selector = part_from_json(selector)
            mapping._add(levels[e["kind"]], selector, config, e["site"], "the mapping",
                         part_from_json(e.get("part")))
        for o in data.get("node_overrides", []):
            nodes = torch.tensor(o["nodes"], dtype=torch.bool if o["mask"] else torch.long)
            mapping.set_nodes(o["layer"], nodes, o.get("format", o.get("number")), site=o["site"])
        return mapping

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


def _known_types(extra: Iterable[type[nn.Module]]) -> dict[str, type[nn.Module]]:
    found: dict[str, type[nn.Module]] = {}
    for namespace in (torch.nn, pyg_nn):
        for value in vars(namespace).values():
            if isinstance(value, type) and issubclass(value, nn.Module):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    for value in extra:
        found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def _check_part(part: object, where: str) -> None:
    ok = part is None or isinstance(part, str) or (
        isinstance(part, int) and not isinstance(part, bool)) or (
        isinstance(part, tuple) and all(isinstance(k, str) for k in part))
    if not ok:
        raise FxquantTypeError(f"{where}: part must be a str ('source', a node type), an int "
                               f"(a relation index) or an edge type tuple, got {part!r}")


def _readout(gm: GraphModule) -> tuple[set[Node], set[Node]]:
    """A graph classifier's pooling calls, and the :data:`READOUT` modules after them."""
    return set(pooling_nodes(gm)), set(readout_nodes(gm, READOUT))


def _covered(gm: GraphModule, node: Node, site: AnySite,
             readout: tuple[set[Node], set[Node]]) -> bool:
    """What the global entry covers: every PyG ``MessagePassing`` layer, and a graph
    classifier's pooling calls and head (:data:`READOUT` modules after a pooling) at the
    sites they have."""
    if node.op == "call_module" and isinstance(gm.get_submodule(str(node.target)),
                                               MessagePassing):
        return True
    if site not in _READOUT_SITES:
        return False
    pooling, head = readout
    if node in pooling:
        return site in (Site.INPUT, Site.OUTPUT)
    if node not in head:
        return False
    module = gm.get_submodule(str(node.target))
    if site is Site.LINEAR:
        return isinstance(module, MLP)
    return True


def _for_readout(config: QuantConfig) -> QuantConfig | None:
    """The global ``config`` as the readout takes it: without protection (its rows are
    graphs, which have no degree); None where it sets per-node bit-widths."""
    if config.node_bits is not None:
        return None
    if config.protect is None:
        return config
    return QuantConfig.from_dict({**config.to_dict(), "protect": None})


def _user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the innermost frame outside fxquant."""
    inside = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame: Any = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


def _no_match(gm: GraphModule, entry: _Entry, nodes: list[Node], arg: str) -> Exception:
    if entry.level in (_NODE_TYPE, _EDGE_TYPE):
        node_types, edge_types = model_types(gm, nodes)
        relations = sorted({str(p) for n in nodes for p in parts_of(gm, n, Site.MESSAGE)
                            if isinstance(p, int)})
        what = "node type" if entry.level == _NODE_TYPE else "edge type"
        found = (f"node types: {node_types}" if entry.level == _NODE_TYPE else
                 f"edge types: {edge_types}" + (f"; relation indices of RGCNConv layers: "
                                                 f"{relations}" if relations else ""))
        return FxquantValueError(
            f"the {what} {entry.selector!r} in {arg} selects nothing at the "
            f"{entry.site.value} site; this model's {found}. A {what} selects the layers that "
            "are its copy (HeteroConv's, to_hetero's) and its parts of layers that take or "
            "return dicts or compute per relation (QuantMapping.set_node_type / "
            "set_edge_type say which sites)")
    if entry.level in (_PATTERN, _NAME) and entry.part is not None:
        parts = sorted({repr(p) for n in nodes if matches(gm, n, entry.selector)
                        for p in parts_of(gm, n, entry.site)})
        return FxquantValueError(
            f"the {entry.site.value} site of {entry.selector!r} in {arg} has no part "
            f"{entry.part!r}; its parts: {parts}")
    plumbing = [layer_name(n) for n in gm.graph.nodes
                if n.op in ("call_module", "call_function", "call_method")
                and is_plumbing(gm, n) and isinstance(entry.selector, str)
                and matches(gm, n, entry.selector)]
    if plumbing:
        return FxquantValueError(
            f"the {'pattern' if entry.level == _PATTERN else 'name'} {entry.selector!r} in "
            f"{arg} matches only lookups of the forward's arguments ({', '.join(plumbing)}): "
            "they carry node features and edge indices along (dict lookups, to_hetero's "
            "getters) and hold no value of their own to round. Please name the layers that "
            "use them, e.g. a pattern over the convolutions ('conv*').")
    if entry.level == _TYPE:
        classes = sorted({type(gm.get_submodule(str(n.target))).__name__
                          for n in nodes if n.op == "call_module"})
        return FxquantValueError(f"no layer of class {entry.selector.__name__} in {arg}; module classes "
                          f"called in this model: {classes}")
    if entry.level == _PATTERN and not isinstance(entry.selector, str):
        return FxquantValueError(f"the predicate {getattr(entry.selector, '__name__', entry.selector)} "
                          f"in {arg} selects no layer")
    return unknown_layer(str(entry.selector), arg, [layer_name(n) for n in nodes])
