"""Saving a converted model without pickling code: :func:`save` and :func:`load`.

The file holds the program (steps, inputs), each point's and layer's settings as JSON and
the state dict (packed weight codes, steps, widths, biases); :func:`load` reads it with
``weights_only=True`` and builds the model again, without the Python class of the model it
was converted from.
"""

from __future__ import annotations

import inspect
import json
import os
from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from fxquant.errors import FxquantFileNotFoundError, FxquantTypeError, FxquantValueError
from fxquant.execution.layers import IntLayer, Placement, conv_from, layer_classes
from fxquant.execution.model import ConvertedModel, Step
from fxquant.execution.quantizer import IntQuantizer
from fxquant.fx.guards import FixedArguments

__all__ = ["FORMAT", "load", "save"]

#: the version tag of the files :func:`save` writes
FORMAT = "fxquant-converted-1"
_EMPTY = "<required>"


def save(model: ConvertedModel, path: str | os.PathLike[str]) -> None:
    """Write ``model`` to ``path``: its program and settings as JSON, its state (the packed
    codes) as tensors; no code is pickled.

    Args:
        model (ConvertedModel): :func:`fxquant.convert`'s result.
        path (str or Path): the file to write.

    Example:
        >>> import os, tempfile, torch, fxquant
        >>> from fxquant.execution import load, save
        >>> from torch_geometric.nn.models import GCN
        >>> gm = fxquant.transform(GCN(4, 8, num_layers=2, out_channels=2),
        ...                        format="int8", scale="tensor").eval()
        >>> model = fxquant.convert(gm, strict=False)   # (its products stay float32)
        >>> path = os.path.join(tempfile.mkdtemp(), "int8.pt")
        >>> save(model, path)
        >>> x, ei = torch.randn(5, 4), torch.tensor([[0, 1, 2], [1, 2, 3]])
        >>> torch.equal(load(path)(x, ei), model(x, ei))
        True
    """
    if not isinstance(model, ConvertedModel):
        raise FxquantTypeError(f"fxquant.execution.save expects a ConvertedModel, got "
                               f"{type(model).__name__}")
    kept = {}
    for key, module in model.kept.items():
        if not isinstance(module, FixedArguments):
            raise FxquantValueError(
                f"fxquant.execution.save: the converted model runs {key!r} "
                f"({type(module).__name__}) in float32 through Python code of its own, which "
                "cannot be saved without pickling it. Please save the trained model with "
                "fxquant.save and convert it again after fxquant.load")
        kept[key] = {"fixed": module.fixed, "model": module.model,
                     "unused": sorted(module.unused)}
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FxquantFileNotFoundError(f"fxquant.execution.save: the folder of "
                                       f"{os.fspath(path)!r} does not exist; please create it")
    program = {
        "inputs": [[n, _EMPTY if d is inspect.Parameter.empty else d] for n, d in model.signature],
        "steps": [asdict(s) for s in model.steps],
        "points": {k: model.point(k).meta() for k in model.points},
        "layers": {k: _layer_meta(layer) for k, layer in model.layers.items()},
        "kept": kept,
        "placements": model.report.to_dict(),
    }
    torch.save({"format": FORMAT, "program": json.dumps(program),
                "state_dict": model.state_dict()}, path)


def _layer_meta(layer: nn.Module) -> dict[str, Any]:
    assert isinstance(layer, IntLayer)
    return {"name": layer.name, "rebuild": layer.rebuild,
            "points": {k: _quantizer(p).meta() for k, p in layer.points.items()}}


def load(path: str | os.PathLike[str]) -> ConvertedModel:
    """The converted model :func:`save` wrote to ``path`` (read with ``weights_only=True``).

    Args:
        path (str or Path): the file.
    """
    if not os.path.isfile(path):
        raise FxquantFileNotFoundError(f"fxquant.execution.load: no file {os.fspath(path)!r}")
    payload = torch.load(path, weights_only=True, map_location="cpu")
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise FxquantValueError(f"fxquant.execution.load: {os.fspath(path)!r} is not a converted "
                                f"model saved by fxquant.execution.save (format {FORMAT!r})")
    program = json.loads(payload["program"])
    state: dict[str, torch.Tensor] = payload["state_dict"]
    points = {k: IntQuantizer.from_meta(meta, _prefixed(state, f"points.{k}."))
              for k, meta in program["points"].items()}
    layers: dict[str, nn.Module] = {}
    classes = {cls.kind: cls for cls in layer_classes().values()}
    for key, meta in program["layers"].items():
        rebuild = meta["rebuild"]
        inner = {name.replace("__", "."): IntQuantizer.from_meta(
            m, _prefixed(state, f"layers.{key}.points.{name}."))
            for name, m in meta["points"].items()}
        layer = classes[rebuild["cls"]](meta["name"], conv_from(rebuild), inner,  # type: ignore[call-arg, arg-type]
                                        rebuild["input_integer"])
        layer.rebuild = dict(rebuild)
        layer.configure(rebuild["input_integer"], rebuild.get("accumulate", "auto"),
                        rebuild.get("ties", "simulation"))
        layers[key] = layer
    kept: dict[str, nn.Module] = {k: FixedArguments(v["fixed"], v["model"], v["unused"])
                                  for k, v in program["kept"].items()}
    inputs = [(n, inspect.Parameter.empty if d == _EMPTY else d) for n, d in program["inputs"]]
    # (a layer's parts as this version runs them, where a file from another says otherwise)
    current = {p.where: p for layer in layers.values() if isinstance(layer, IntLayer)
               for p in layer.placements}
    placements = [Placement(**p) for p in program["placements"]]
    model = ConvertedModel(inputs, [Step(**s) for s in program["steps"]], dict(points), layers,
                           kept, [current.get(p.where, p) for p in placements])
    model.load_state_dict(state)
    return model


def _quantizer(module: nn.Module) -> IntQuantizer:
    assert isinstance(module, IntQuantizer)
    return module


def _prefixed(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
