"""Where on a layer values are rounded: the built-in :class:`Site` values and the
registry of sites of one's own (:class:`SiteKind`, :func:`register_site`).

A site of one's own is a value inside a layer: its kind *installs* a small callable on the
transformed model's copy of the layer (never on its class, never on the user's instance)
that hands the value to the quantization point, as the built-in ``message`` and
``aggregate`` sites do (:mod:`fxquant.quant.sites`). Configs, the mapping, saved files,
:func:`fxquant.summary` and :func:`fxquant.bit_report` then treat it like the built-in
sites.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from enum import Enum
from typing import Any

from torch import nn

from fxquant.errors import FxquantTypeError, FxquantValueError, UnregisteredError

__all__ = [
    "AnySite",
    "Part",
    "Site",
    "SiteKind",
    "part_from_json",
    "part_suffix",
    "part_text",
    "part_to_json",
    "register_site",
    "registered_sites",
    "site_rank",
    "unregister_site",
]


class Site(str, Enum):
    """Where on a layer values are rounded: the built-in sites (a site of one's own is a
    registered :class:`SiteKind`).

    ``OUTPUT``: what the layer returns (each node type of a dict it returns, where the
    model looks it up); ``INPUT``: its first argument (node features; each part of a
    ``(source, target)`` pair and each node type of a dict with a point of its own:
    :mod:`fxquant.quant.parts`; non-float arguments pass through; where a dropout
    feeds only the layer, what the dropout receives, so that training and evaluation round
    the same range); ``WEIGHT``:
    each of its floating parameters with at least two dims; ``MESSAGE``: the output of
    ``message()``, one row per edge (PyG ``MessagePassing`` layers); ``AGGREGATE``: the
    aggregation, one row per node, before ``update()``; ``LINEAR``: the output of each
    linear transform the layer applies (its ``torch.nn.Linear`` / PyG ``Linear``
    children: ``X W`` in GCN and GAT, the MLP's layers in GIN), one row per node;
    ``EDGE``: the floating per-edge arguments the layer hands ``message()`` (those
    without an ``_i``/``_j`` suffix, one row per edge: GCN's normalisation coefficients
    ``edge_weight``, GAT's attention coefficients ``alpha``, an ``edge_attr``).

    Example:
        >>> import fxquant
        >>> fxquant.Site.parse("message"), fxquant.Site("aggregate").value
        (<Site.MESSAGE: 'message'>, 'aggregate')
        >>> from torch_geometric.nn.models import GCN
        >>> mapping = fxquant.QuantMapping().set_global(
        ...     fxquant.QuantConfig("int8", scale="tensor"), site=fxquant.Site.MESSAGE)
        >>> gm = fxquant.transform(GCN(4, 8, num_layers=1, out_channels=2), mapping)
        >>> [p.site.value for _, p in fxquant.quantization_points(gm)]
        ['message']
    """

    OUTPUT = "output"
    INPUT = "input"
    WEIGHT = "weight"
    MESSAGE = "message"
    AGGREGATE = "aggregate"
    LINEAR = "linear"
    EDGE = "edge"

    @property
    def inner(self) -> bool:
        """Rounded inside the layer's own call (not in the traced graph around it)."""
        return self not in (Site.OUTPUT, Site.INPUT)

    @property
    def per_edge(self) -> bool:
        """Its rows are edges (messages, per-edge arguments), not nodes."""
        return self in (Site.MESSAGE, Site.EDGE)

    @classmethod
    def parse(cls, value: object) -> AnySite:
        """A built-in site, or a registered :class:`SiteKind` (by name, or itself)."""
        if isinstance(value, (cls, SiteKind)):
            return value
        if isinstance(value, str) and value in _REGISTERED:
            return _REGISTERED[value]
        try:
            return cls(value)
        except ValueError:
            allowed = [s.value for s in cls] + sorted(_REGISTERED)
            raise UnregisteredError(
                f"site={value!r} is not one of {allowed}; a site of one's own must be "
                "registered first, in this process: fxquant.register_site(<a "
                "fxquant.SiteKind>)") from None

    def __str__(self) -> str:
        return str(self.value)



class SiteKind(ABC):
    """A site of one's own, registered with :func:`register_site` (an instance).

    It names the value (:attr:`name`, what configs and saved files write), says whether
    its rows are edges (:attr:`per_edge`), checks that a layer has the value
    (:meth:`check`) and makes the layer round it (:meth:`install`). Points at it are built
    like any point from their :class:`~fxquant.QuantConfig`; per-node settings and
    protection reach it where :meth:`install` passes ``node_degree=`` / ``row_nodes=`` to
    the point (protection with ``share="layer"`` always does: the layer draws the mask).

    A callable object (not a lambda) keeps the site working in copies of the model
    (``copy.deepcopy`` copies its references along) and in pickles.

    Example:
        >>> import torch, fxquant
        >>> from torch_geometric.nn import GCNConv
        >>> class RoundedUpdate:  # what the layer's update() returns, rounded
        ...     def __init__(self, owner, point):
        ...         self.owner, self.point = owner, point
        ...     def __call__(self, inputs, **kwargs):
        ...         return self.point(type(self.owner).update(self.owner, inputs, **kwargs))
        >>> class Update(SiteKind):
        ...     name = "update"
        ...     def check(self, layer, module):
        ...         if not hasattr(module, "propagate"):
        ...             raise ValueError(f"{layer!r} is not a PyG MessagePassing layer")
        ...     def install(self, layer, module, point):
        ...         module.update = RoundedUpdate(module, point)
        >>> update = register_site(Update())
        >>> class Net(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.conv = GCNConv(4, 4)
        ...     def forward(self, x, edge_index):
        ...         return self.conv(x, edge_index)
        >>> mapping = fxquant.QuantMapping().set_name("conv", fxquant.QuantConfig(8),
        ...                                           site="update")
        >>> gm = fxquant.transform(Net(), mapping)
        >>> [(name, point.site.value) for name, point in fxquant.quantization_points(gm)]
        [('conv_update_quant', 'update')]
        >>> unregister_site("update")
    """

    #: the site's name (lower case): ``QuantMapping.set_name(..., site=name)``
    name: str = ""
    #: whether its rows are edges (messages, per-edge values), not nodes
    per_edge: bool = False
    #: a registered site is always inside the layer's own call
    inner: bool = True

    @property
    def value(self) -> str:
        """The site's name (as :attr:`Site.value` is a built-in site's)."""
        return self.name

    def check(self, layer: str, module: nn.Module) -> None:
        """Raise (a :class:`ValueError` saying why) where ``module``, the layer named
        ``layer``, has no such value; called before the model is changed. Every module
        passes by default."""
        return None

    @abstractmethod
    def install(self, layer: str, module: nn.Module, point: nn.Module) -> None:
        """Make ``module`` (the transformed model's own copy of the layer ``layer``) hand
        the value to ``point`` (a :class:`~fxquant.QuantPoint`: ``value = point(value)``)
        on every call: set an attribute of the instance (a callable that torch.compile can
        inline), never of its class. Called once, after :meth:`check`."""

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


#: A site: a built-in one or a registered one.
AnySite = Site | SiteKind

#: One of several tensors a site of one call rounds, each with its own point: ``"source"``
#: or ``"target"`` (the two parts of a ``(source, target)`` input pair), a dict key (a
#: node type, where a layer takes or returns a dict: ``"paper"``), or a relation (an
#: ``int`` index of ``RGCNConv``/``FastRGCNConv``, an edge type tuple of ``HGTConv``).
#: ``None``: the site rounds one tensor.
Part = str | int | tuple[str, ...] | None


def part_text(part: Part) -> str:
    """A part as users read it: ``"source"``, ``"paper"``, ``"relation 2"``,
    ``"author__writes__paper"`` (PyG's spelling of an edge type).

    Example:
        >>> part_text(("author", "writes", "paper")), part_text(2), part_text("source")
        ('author__writes__paper', 'relation 2', 'source')
    """
    if part is None:
        return ""
    if isinstance(part, tuple):
        return "__".join(map(str, part))
    if isinstance(part, int):
        return f"relation {part}"
    return str(part)


_NOT_NAME = re.compile(r"[^0-9a-zA-Z_]+")


def part_suffix(part: Part) -> str:
    """The part in a point's module name (``conv_input_source_quant``,
    ``conv_message_r2_quant``): a Python identifier fragment, ``""`` for None."""
    if part is None:
        return ""
    text = f"r{part}" if isinstance(part, int) else part_text(part)
    return _NOT_NAME.sub("_", text)


def part_to_json(part: Part) -> Any:
    """A part as JSON (a tuple as a list)."""
    return list(part) if isinstance(part, tuple) else part


def part_from_json(data: Any) -> Part:
    """The part :func:`part_to_json` wrote."""
    if data is None or (isinstance(data, (str, int)) and not isinstance(data, bool)):
        return data
    if isinstance(data, list) and all(isinstance(k, str) for k in data):
        return tuple(data)
    raise FxquantValueError(f"not a part of a site written by fxquant: {data!r}")

_REGISTERED: dict[str, SiteKind] = {}
_SITE_NAME = re.compile(r"[a-z][a-z0-9_]*")


def register_site(kind: SiteKind) -> SiteKind:
    """Make ``kind`` known by its name: :meth:`Site.parse` (the mapping's ``site=``, configs
    and saved files) accepts it from then on. Register it in every process that uses or
    loads it (a file that names an unregistered site is refused, naming it). Returns
    ``kind``.

    Args:
        kind (SiteKind): an instance whose ``name`` (lower case, no built-in site's name)
            is not registered yet.
    """
    if not isinstance(kind, SiteKind):
        raise FxquantTypeError(f"register_site expects a fxquant.SiteKind instance, got {kind!r}")
    name = kind.name
    if not isinstance(name, str) or not _SITE_NAME.fullmatch(name):
        raise FxquantValueError(f"register_site: the name of {type(kind).__name__} must be a "
                                f"lower-case word (letters, digits and _), got {name!r}")
    if name in [s.value for s in Site]:
        raise FxquantValueError(f"register_site: {name!r} is a built-in site; please choose "
                                "another name")
    if name in _REGISTERED and _REGISTERED[name] is not kind:
        raise FxquantValueError(f"register_site: {name!r} is registered already "
                                f"({_REGISTERED[name]!r}); please unregister_site({name!r}) "
                                "first, or choose another name")
    _REGISTERED[name] = kind
    return kind


def site_rank(site: AnySite) -> int:
    """Where ``site`` sorts among a layer's sites: the built-in ones in :class:`Site`'s
    order, registered ones after them by name."""
    if isinstance(site, Site):
        return list(Site).index(site)
    return len(Site) + sorted([*_REGISTERED, site.name]).index(site.name)


def unregister_site(name: str) -> None:
    """Forget the registered site ``name``."""
    if _REGISTERED.pop(name, None) is None:
        raise FxquantValueError(f"unregister_site: no site {name!r} is registered; "
                                f"registered: {sorted(_REGISTERED)}")


def registered_sites() -> dict[str, SiteKind]:
    """The registered sites by name (a copy)."""
    return dict(_REGISTERED)
