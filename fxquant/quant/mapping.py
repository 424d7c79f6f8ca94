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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch_geometric.nn as pyg_nn
from torch import Tensor, nn
from torch.fx import GraphModule, Node
from torch_geometric.nn import MessagePassing

from fxquant.errors import FxquantTypeError, FxquantValueError
from fxquant.fx.selectors import layer_name, layer_names, matches, unknown_layer
from fxquant.quant.config import QuantConfig
from fxquant.quant.override import NodeOverride
from fxquant.quant.site import AnySite, Site, site_rank

__all__ = ["QuantMapping", "Resolved"]


_GLOBAL, _TYPE, _PATTERN, _NAME = range(4)
_KIND = {_GLOBAL: "global", _TYPE: "type", _PATTERN: "pattern", _NAME: "name"}


@dataclass(frozen=True)
class _Entry:
    level: int
    selector: Any  # None (global), a module class, a pattern or predicate, or a name
    site: AnySite
    config: QuantConfig | None
    source: str = "the mapping"  # how errors name where the entry came from

    def describe(self) -> str:
        what = {_GLOBAL: "global", _TYPE: f"type {getattr(self.selector, '__name__', '?')}",
                _PATTERN: f"pattern {self.selector!r}" if isinstance(self.selector, str)
                else f"predicate {getattr(self.selector, '__name__', 'lambda')}",
                _NAME: f"name {self.selector!r}"}[self.level]
        return f"{what} {self.site.value}: " + (
            self.config.describe() if self.config is not None else "not quantized")


@dataclass(frozen=True)
class Resolved:
    """What one quantization point of a traced graph gets."""

    node: Node
    site: AnySite
    config: QuantConfig
    override: NodeOverride | None


class QuantMapping:
    """Which layers and sites get which :class:`QuantConfig`.

    Precedence, from weakest to strongest (as torch.ao's ``QConfigMapping``): the global
    entry < a module type < a name pattern or predicate < an exact name. Within one level
    a later call wins. A config of :obj:`None` excludes what it matches. The global entry
    covers every PyG ``MessagePassing`` layer (the layers fxquant quantizes when nothing
    else is named); other layers are picked by type, pattern or name. Each ``set_*`` takes
    a ``site`` (default ``"output"``) and returns the mapping, so calls chain.

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
             source: str) -> QuantMapping:
        if config is not None and not isinstance(config, QuantConfig):
            raise FxquantTypeError(f"config must be a QuantConfig or None, got {config!r}; e.g. "
                            "QuantConfig(16) or QuantConfig('e4m3', scale='tensor')")
        self._entries.append(_Entry(level, selector, Site.parse(site), config, source))
        return self

    def set_global(self, config: QuantConfig | None, *, site: str | AnySite = "output",
                   source: str = "the mapping") -> QuantMapping:
        """Every ``MessagePassing`` layer, unless a stronger entry says otherwise.

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

    def set_pattern(self, pattern: str | Callable[[Node], bool], config: QuantConfig | None, *,
                    site: str | AnySite = "output", source: str = "the mapping") -> QuantMapping:
        """Layers whose name matches an fnmatch ``pattern`` (``"conv*"``), or a predicate on
        the ``torch.fx.Node``."""
        if not (isinstance(pattern, str) or (callable(pattern) and not isinstance(pattern, type))):
            raise FxquantTypeError(f"set_pattern expects an fnmatch pattern or a predicate on "
                            f"torch.fx.Node, got {pattern!r}")
        return self._add(_PATTERN, pattern, config, site, source)

    def set_name(self, name: str, config: QuantConfig | None, *,
                 site: str | AnySite = "output", source: str = "the mapping") -> QuantMapping:
        """One layer, by submodule name (``"conv1"``, ``"convs.0"``) or node name
        (``"sigmoid"``)."""
        if not isinstance(name, str):
            raise FxquantTypeError(f"set_name expects a layer name, got {name!r}")
        return self._add(_NAME, name, config, site, source)

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

    def _matches(self, entry: _Entry, gm: GraphModule, node: Node) -> bool:
        if entry.level == _GLOBAL:
            return node.op == "call_module" and isinstance(
                gm.get_submodule(str(node.target)), MessagePassing)
        if entry.level == _NAME:
            return entry.selector in layer_names(node)
        return matches(gm, node, entry.selector)

    def resolve(self, gm: GraphModule, nodes: Iterable[Node]) -> list[Resolved]:
        """The quantization points of ``gm`` among ``nodes``, in graph order; validates every
        entry first (unknown names, types that match nothing) and touches nothing."""
        nodes = list(nodes)
        for entry in self._entries:
            if entry.level == _GLOBAL:
                continue
            if not any(self._matches(entry, gm, n) for n in nodes):
                raise _no_match(gm, entry, nodes, entry.source)
        chosen: dict[tuple[Node, AnySite], tuple[tuple[int, int], QuantConfig | None]] = {}
        for order, entry in enumerate(self._entries):
            for n in nodes:
                if self._matches(entry, gm, n):
                    key, rank = (n, entry.site), (entry.level, order)
                    if key not in chosen or chosen[key][0] <= rank:
                        chosen[key] = (rank, entry.config)
        overrides: dict[tuple[Node, AnySite], NodeOverride] = {}
        for layer, site, override in self._overrides:
            matched = [n for n in nodes if matches(gm, n, layer)]
            if not matched:
                raise _no_match(gm, _Entry(_NAME, layer, site, None), nodes, "node_formats")
            for n in matched:
                if chosen.get((n, site), (None, None))[1] is None:
                    here = sorted(k[1].value for k, v in chosen.items()
                                  if k[0] is n and v[1] is not None)
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
        points = [Resolved(n, site, config, overrides.get((n, site)))
                  for (n, site), (_, config) in chosen.items() if config is not None]
        return sorted(points, key=lambda p: (order_of[p.node], site_rank(p.site)))

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
            else:
                selector = e.selector
            entries.append({"kind": _KIND[e.level], "selector": selector, "site": e.site.value,
                            "config": None if e.config is None else e.config.to_dict()})
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
            mapping._add(levels[e["kind"]], selector, config, e["site"], "the mapping")
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


def _no_match(gm: GraphModule, entry: _Entry, nodes: list[Node], arg: str) -> Exception:
    if entry.level == _TYPE:
        classes = sorted({type(gm.get_submodule(str(n.target))).__name__
                          for n in nodes if n.op == "call_module"})
        return FxquantValueError(f"no layer of class {entry.selector.__name__} in {arg}; module classes "
                          f"called in this model: {classes}")
    if entry.level == _PATTERN and not isinstance(entry.selector, str):
        return FxquantValueError(f"the predicate {getattr(entry.selector, '__name__', entry.selector)} "
                          f"in {arg} selects no layer")
    return unknown_layer(str(entry.selector), arg, [layer_name(n) for n in nodes])
