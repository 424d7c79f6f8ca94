"""Saving a transformed model without pickling code: :func:`save` and :func:`load`.

``torch.save(gm)`` pickles the GraphModule, and ``torch.load(path, weights_only=False)``
of a crafted file runs whatever code it carries. :func:`save` writes only data: the
quantization points as JSON (layer, site, config, node override, shared step and
bit-width table) and the trace arguments, next to ``gm.state_dict()``; :func:`load` reads
it with ``weights_only=True`` (which refuses anything but tensors and plain containers),
transforms the user's own model class again and loads the state into it. The other
code-free route, ``torch.export``, also works for a transformed model (import fxquant
first so the ops are registered).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.fx import GraphModule

from fxquant.errors import (
    FxquantFileNotFoundError,
    FxquantTypeError,
    FxquantValueError,
    UnregisteredError,
)
from fxquant.fx.tracer import LeafSpec
from fxquant.quant.api import TRACE_KEY, transform
from fxquant.quant.config import QuantConfig
from fxquant.quant.describe import quantization_points
from fxquant.quant.legacy import upgrade_point_keys
from fxquant.quant.mapping import QuantMapping
from fxquant.quant.node_bits import NodeBits
from fxquant.quant.points import QuantPoint
from fxquant.quant.sharing import share_bits, share_step
from fxquant.quant.site import part_from_json, part_to_json

__all__ = ["FORMAT", "load", "save"]

#: The version tag written into every file without shared steps or bit-width tables.
FORMAT = "fxquant-state-1"
#: The tag of a file with points that share another's step or bit-width table
#: (:func:`~fxquant.share_step`, :func:`~fxquant.share_bits`): a version that cannot
#: restore the sharing refuses it instead of loading untied copies.
FORMAT_SHARED = "fxquant-state-2"


def save(gm: GraphModule, path: str | os.PathLike[str]) -> None:
    """Write ``gm``'s quantization points and state to ``path``; no code is pickled.

    Args:
        gm (torch.fx.GraphModule): a model returned by :func:`fxquant.transform`.
        path (str or Path): the file to write.

    Example:
        >>> import os, tempfile, fxquant
        >>> from torch_geometric.nn.models import GCN
        >>> model = GCN(4, 8, num_layers=2, out_channels=2)
        >>> gm = fxquant.transform(model, bits=12, rounding="nearest")
        >>> path = os.path.join(tempfile.mkdtemp(), "gm.pt")
        >>> fxquant.save(gm, path)
        >>> again = fxquant.load(path, GCN(4, 8, num_layers=2, out_channels=2))
        >>> x, ei = torch.randn(5, 4), torch.tensor([[0, 1, 2], [1, 2, 3]])
        >>> torch.equal(again(x, ei), gm(x, ei))
        True
    """
    if not isinstance(gm, GraphModule):
        raise FxquantTypeError(f"fxquant.save expects the GraphModule fxquant.transform returns, got "
                        f"{type(gm).__name__}")
    calls = _layer_calls(gm)
    points = [{"name": name, "layer": p.layer, "site": p.site.value,
               **({"part": part_to_json(p.part)} if p.part is not None else {}),
               "config": p.config.to_dict(),
               "override": None if p.override is None else p.override.format.spec(),
               "step_source": p.__dict__.get("step_source"),
               "bits_source": p.__dict__.get("bits_source"),
               "node": calls.get(name)}
              for name, p in quantization_points(gm)]
    if not points:
        raise FxquantValueError("fxquant.save: this model has no quantization points; save its "
                         "state_dict() with torch.save instead")
    trace = getattr(gm, TRACE_KEY, {"concrete_args": None, "leaf_names": [], "leaf_classes": []})
    try:
        trace_json = json.dumps(trace)
    except TypeError as e:
        raise FxquantValueError(f"fxquant.save: the concrete_args this model was traced with are not "
                         f"plain values ({e}); they cannot be saved without pickling") from e
    folder = os.path.dirname(os.path.abspath(path)) if isinstance(path, (str, os.PathLike)) \
        else None
    if folder is not None and not os.path.isdir(folder):
        raise FxquantFileNotFoundError(f"fxquant.save: the folder of {os.fspath(path)!r} does not "
                                       "exist; please create it first")
    shared = any(p["step_source"] is not None or p["bits_source"] is not None for p in points)
    blob = {"format": FORMAT_SHARED if shared else FORMAT, "points": json.dumps(points),
            "trace": trace_json, "state_dict": gm.state_dict()}
    # the widths each NodeBits config gives (the state holds the table as it is now, which
    # training may have moved: annealing starts wider)
    tables = {name: p.config.node_bits.bits for name, p in quantization_points(gm)
              if p.config.node_bits is not None}
    if tables:
        blob["node_bits"] = tables
    torch.save(blob, path)


def _layer_calls(gm: GraphModule) -> dict[str, str]:
    """For the points of a layer called more than once (a GCN layer applied twice): the
    name of the call node each belongs to (``conv``, ``conv_1``), which a fresh trace of
    the same model names alike. Output points follow their call; input points lead to it."""
    graph_points: dict[torch.fx.Node, QuantPoint] = {}
    for n in gm.graph.nodes:
        module = gm.get_submodule(str(n.target)) if n.op == "call_module" else None
        if isinstance(module, QuantPoint):
            graph_points[n] = module
    called: dict[str, int] = {}
    for n in gm.graph.nodes:
        if n.op == "call_module" and n not in graph_points:
            called[str(n.target)] = called.get(str(n.target), 0) + 1
    found: dict[str, str] = {}
    for n, point in graph_points.items():
        if called.get(point.layer, 0) < 2:
            continue
        layer = n.args[0] if point.site.value == "output" else None
        frontier = [] if layer is not None else list(n.users)
        for _ in range(4):  # (an input point may feed a dropout that feeds the layer)
            layer = layer or next((u for u in frontier if u.op == "call_module"
                                   and str(u.target) == point.layer), None)
            frontier = [v for u in frontier for v in u.users]
        if isinstance(layer, torch.fx.Node):
            found[str(n.target)] = layer.name
    return found


class _NodeNamed:
    """A layer selector for one call node, by its name (``fxquant.load``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, node: torch.fx.Node) -> bool:
        return node.name == self.name

    def __repr__(self) -> str:
        return f"the call {self.name!r}"


def load(path: str | os.PathLike[str], model: nn.Module,
         leaf_modules: Iterable[LeafSpec] | None = None) -> GraphModule:
    """Rebuild a model written by :func:`save` from the user's own (untransformed) ``model``.

    Reads with ``torch.load(weights_only=True)``: a file carrying code is refused, never run.

    Args:
        path (str or Path): a file :func:`save` wrote.
        model (torch.nn.Module): a fresh instance of the model that was transformed (its
            weights are replaced by the saved ones).
        leaf_modules (iterable, optional): the ``leaf_modules`` classes of the original
            transform, when the saved names cannot be found among ``model``'s submodules.

    Example:
        >>> import os, tempfile, torch, fxquant
        >>> from torch_geometric.nn.models import GCN
        >>> gm = fxquant.transform(GCN(4, 8, num_layers=2, out_channels=2), format="int8",
        ...                        scale="tensor", decay=0.9)
        >>> path = os.path.join(tempfile.mkdtemp(), "gm.pt")
        >>> fxquant.save(gm, path)
        >>> again = fxquant.load(path, GCN(4, 8, num_layers=2, out_channels=2))  # any weights
        >>> [name for name, _ in fxquant.quantization_points(again)]
        ['convs_0_quant', 'convs_1_quant']
        >>> torch.equal(again.get_parameter("convs.0.lin.weight"), gm.get_parameter("convs.0.lin.weight"))
        True
    """
    if isinstance(path, (str, os.PathLike)) and not os.path.isfile(path):
        raise FxquantFileNotFoundError(f"fxquant.load: no file {os.fspath(path)!r}"
                                       + (" (a folder)" if os.path.isdir(path) else ""))
    try:
        blob = torch.load(path, weights_only=True)
    except Exception as e:
        raise FxquantValueError(f"fxquant.load: {path} is not a file fxquant.save wrote, or it carries "
                         f"code, which is refused ({type(e).__name__}: {str(e)[:200]})") from e
    if not isinstance(blob, dict) or blob.get("format") not in (FORMAT, FORMAT_SHARED):
        raise FxquantValueError(f"fxquant.load: {path} is not a file fxquant.save wrote "
                         f"(expected format {FORMAT!r} or {FORMAT_SHARED!r})")
    file = _File(path)
    points = file.json(blob, "points", list)
    trace = file.json(blob, "trace", dict)
    state = file.entry(blob, "state_dict", dict, "the file")
    file.entry(trace, "concrete_args", (dict, type(None)), "its 'trace' entry")
    for key in ("leaf_names", "leaf_classes"):
        if not all(isinstance(v, str) for v in file.entry(trace, key, list, "its 'trace' entry")):
            raise FxquantValueError(f"fxquant.load: {path}: {key!r} of its 'trace' entry must "
                                    f"list names; {_EDITED}")
    names = []
    for i, p in enumerate(points):
        where = f"point {i} of its 'points' entry"
        file.entry(p, "name", str, where)
        where = f"point {p['name']!r}"
        for key in ("layer", "site"):
            file.entry(p, key, str, where)
        file.entry(p, "config", dict, where)
        for key in ("override", "step_source", "bits_source", "node"):  # (older files: none)
            if p.get(key) is not None:
                file.entry(p, key, str, where)
        names.append(p["name"])
    state = dict(state)
    for name in names:  # (files of 0.9.8 and earlier keep a point's state flat)
        upgrade_point_keys(state, f"{name}.")
    mapping = QuantMapping()
    for p in points:
        # one call of a layer called several times: its node, as the saved model named it
        layer: Any = _NodeNamed(p["node"]) if p.get("node") is not None else p["layer"]
        try:
            config = _with_table(QuantConfig.from_dict(p["config"]), p["name"], blob, state)
            part = part_from_json(p.get("part"))  # (older files: none)
            if isinstance(layer, _NodeNamed):
                mapping.set_pattern(layer, config, site=p["site"], part=part)
            else:
                mapping.set_name(layer, config, site=p["site"], part=part)
        except UnregisteredError as e:
            raise UnregisteredError(f"fxquant.load: {path}: point {p['name']!r} uses a format, "
                                    f"scale or site of one's own that this process has not "
                                    f"registered: {e}") from e
        except (KeyError, TypeError, ValueError) as e:
            raise FxquantValueError(f"fxquant.load: {path}: the config of point {p['name']!r} "
                                    f"cannot be read ({type(e).__name__}: {e}); {_EDITED}") from e
        if p.get("override") is not None:
            nodes = file.entry(state, f"{p['name']}.override.nodes", torch.Tensor,
                               "its 'state_dict' entry")
            try:
                mapping.set_nodes(layer, nodes, p["override"], site=p["site"])
            except (TypeError, ValueError) as e:
                raise FxquantValueError(f"fxquant.load: {path}: the node override of point "
                                        f"{p['name']!r} cannot be read ({e}); {_EDITED}") from e
    leaves = _leaf_specs(model, trace, leaf_modules)
    gm = transform(model, mapping, concrete_args=trace["concrete_args"], leaf_modules=leaves)
    split = _split_parts(gm, points)
    traced = [name for name, _ in quantization_points(gm) if name not in split]
    if traced != names:
        raise FxquantValueError(f"fxquant.load: the model given traces to other quantization points "
                         f"({traced}) than the saved one ({names}); is it the same model class?")
    for p in points:  # bit-widths shared (absent from older files)
        if p.get("bits_source") is not None:
            share_bits(gm, p["name"], p["bits_source"])
    for new, old in split.items():  # each part starts from the one point's state
        state.update({f"{new}.{k[len(old) + 1:]}": v for k, v in list(state.items())
                      if k.startswith(f"{old}.")})
    expected = gm.state_dict()
    # older files do not say whether a learned step is fitted (it was); a file that says
    # it for some points but not others was edited
    legacy = not any(k.endswith(".step_is_fitted") for k in state)
    missing = [k for k in expected if k not in state
               and not (legacy and k.endswith(".step_is_fitted"))]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        raise FxquantValueError(
            f"fxquant.load: the state in {path} does not fit the model"
            + (f"; missing: {missing}" if missing else "")
            + (f"; not in the model: {unexpected}" if unexpected else "") + f". {_EDITED}")
    try:
        gm.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise FxquantValueError(f"fxquant.load: the state in {path} does not fit the model "
                                f"({e}); {_EDITED}") from e
    for p in points:  # steps shared (absent from older files), once they are loaded
        if p.get("step_source") is not None:
            share_step(gm, p["name"], p["step_source"])
    return gm


def _with_table(config: QuantConfig, name: str, blob: dict[str, Any],
                state: dict[str, Any]) -> QuantConfig:
    """``config`` with its NodeBits widths as saved (``from_dict`` reads only the table's
    shape); a file without them (older versions) gives the saved table's."""
    rb = config.node_bits
    if rb is None:
        return config
    tables = blob.get("node_bits")
    bits = tables.get(name) if isinstance(tables, dict) else None
    if bits is None:
        bits = state.get(f"{name}.node_widths.bits")
    if not isinstance(bits, torch.Tensor) or bits.shape != rb.bits.shape:
        return config
    return dataclasses.replace(config, node_bits=NodeBits(bits, rb.learned, rb.min_bits,
                                                          rb.max_bits, rb.stored))


def _split_parts(gm: GraphModule, saved: list[dict[str, Any]]) -> dict[str, str]:
    """Points of ``gm`` that a file written before sites had parts kept in one point: the
    source part of a ``(source, target)`` input (its target part has the saved name) ->
    that saved point's name, whose state it starts from."""
    whole = {p["name"] for p in saved if p.get("part") is None and p["site"] == "input"}
    named = dict(quantization_points(gm))
    found = {}
    for name, point in named.items():
        if point.part != "source" or name in {p["name"] for p in saved}:
            continue
        partner = next((n for n, q in named.items() if n in whole and q.layer == point.layer
                        and q.site == point.site and q.part == "target"
                        and name == _source_name(n)), None)
        if partner is not None:
            found[name] = partner
    return found


def _source_name(target: str) -> str:
    """The name the source part's point gets beside the target part's (``conv_input_quant``
    -> ``conv_input_source_quant``)."""
    stem, _, number = target.rpartition("_quant")
    return f"{stem}_source_quant{number}"


_EDITED = ("the file was not written by this version of fxquant.save, or it was edited; "
           "please save the model again with fxquant.save")


class _File:
    """Reads the entries of a file :func:`save` wrote; a missing or mistyped entry is an
    error naming it (not a bare ``KeyError``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path

    def entry(self, container: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
        if not isinstance(container, dict) or key not in container:
            raise FxquantValueError(f"fxquant.load: {self.path}: {where} has no {key!r} entry; "
                                    f"{_EDITED}")
        value = container[key]
        if not isinstance(value, kind):
            raise FxquantValueError(f"fxquant.load: {self.path}: {key!r} of {where} is a "
                                    f"{type(value).__name__}, not what fxquant.save writes; "
                                    f"{_EDITED}")
        return value

    def json(self, blob: dict[str, Any], key: str, kind: type) -> Any:
        text = self.entry(blob, key, str, "the file")
        try:
            value = json.loads(text)
        except ValueError as e:
            raise FxquantValueError(f"fxquant.load: {self.path}: its {key!r} entry is not JSON "
                                    f"({e}); {_EDITED}") from e
        if not isinstance(value, kind):
            raise FxquantValueError(f"fxquant.load: {self.path}: its {key!r} entry is a "
                                    f"{type(value).__name__}, not what fxquant.save writes; "
                                    f"{_EDITED}")
        return value


def _leaf_specs(model: nn.Module, trace: dict[str, Any],
                given: Iterable[LeafSpec] | None) -> list[LeafSpec]:
    """The saved leaf_modules: names as they are, classes found among the model's modules."""
    if given is not None:
        return list(given)
    classes = {f"{type(m).__module__}.{type(m).__qualname__}": type(m) for m in model.modules()}
    missing = [c for c in trace["leaf_classes"] if c not in classes]
    if missing:
        raise FxquantValueError(f"fxquant.load: the model was traced with leaf_modules classes "
                         f"{missing}, which the model given does not use; please pass "
                         "leaf_modules=[...] to fxquant.load")
    return [*trace["leaf_names"], *(classes[c] for c in trace["leaf_classes"])]
