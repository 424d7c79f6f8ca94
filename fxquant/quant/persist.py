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

import json
import os
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.fx import GraphModule

from fxquant.errors import FxquantTypeError, FxquantValueError
from fxquant.fx.tracer import LeafSpec
from fxquant.quant.api import TRACE_KEY, transform
from fxquant.quant.config import QuantConfig, QuantMapping
from fxquant.quant.describe import quantization_points
from fxquant.quant.points import share_bits, share_step

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
    points = [{"name": name, "layer": p.layer, "site": p.site.value,
               "config": p.config.to_dict(),
               "override": None if p.override_number is None else p.override_number.spec(),
               "step_source": p.__dict__.get("step_source"),
               "bits_source": p.__dict__.get("bits_source")}
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
    shared = any(p["step_source"] is not None or p["bits_source"] is not None for p in points)
    torch.save({"format": FORMAT_SHARED if shared else FORMAT, "points": json.dumps(points),
                "trace": trace_json, "state_dict": gm.state_dict()}, path)


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
    """
    try:
        blob = torch.load(path, weights_only=True)
    except Exception as e:
        raise FxquantValueError(f"fxquant.load: {path} is not a file fxquant.save wrote, or it carries "
                         f"code, which is refused ({type(e).__name__}: {str(e)[:200]})") from e
    if not isinstance(blob, dict) or blob.get("format") not in (FORMAT, FORMAT_SHARED):
        raise FxquantValueError(f"fxquant.load: {path} is not a file fxquant.save wrote "
                         f"(expected format {FORMAT!r} or {FORMAT_SHARED!r})")
    points = json.loads(blob["points"])
    trace = json.loads(blob["trace"])
    state = blob["state_dict"]
    mapping = QuantMapping()
    for p in points:
        mapping.set_name(p["layer"], QuantConfig.from_dict(p["config"]), site=p["site"])
        if p["override"] is not None:
            mapping.set_nodes(p["layer"], state[f"{p['name']}.override_nodes"], p["override"],
                              site=p["site"])
    leaves = _leaf_specs(model, trace, leaf_modules)
    gm = transform(model, mapping, concrete_args=trace["concrete_args"], leaf_modules=leaves)
    names = [name for name, _ in quantization_points(gm)]
    if names != [p["name"] for p in points]:
        raise FxquantValueError(f"fxquant.load: the model given traces to other quantization points "
                         f"({names}) than the saved one ({[p['name'] for p in points]}); is it "
                         "the same model class?")
    for p in points:  # steps and bit-widths shared (absent from older files)
        if p.get("step_source") is not None:
            share_step(gm, p["name"], p["step_source"])
        if p.get("bits_source") is not None:
            share_bits(gm, p["name"], p["bits_source"])
    gm.load_state_dict(state, strict=True)
    return gm


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
