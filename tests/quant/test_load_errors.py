"""fxquant.load of a structurally edited file: an fxquant error that names what is missing
or wrong, never a bare KeyError, TypeError or JSON error."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fxquant
from fxquant.errors import FxquantError
from fxquant.quant.config import NodeBits, QuantConfig
from tests.quant import TwoGCN

Net = TwoGCN


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A file with a node override, learned bits and a shared step, as fxquant.save
    writes it, read back as plain data."""
    torch.manual_seed(0)
    lsq = QuantConfig("uint4", scale="tensor", range="lsq")
    mapping = (fxquant.QuantMapping()
               .set_name("conv1", QuantConfig("int4", scale="tensor"))
               .set_nodes("conv1", torch.tensor([0, 3]), "int8")
               .set_name("conv1", QuantConfig("int8", scale="tensor", range="lsq",
                                              node_bits=NodeBits.learned_init(6, 4.0)),
                         site="message")
               .set_name("conv2", lsq).set_name("conv2", lsq, site="input"))
    gm = fxquant.transform(Net(), mapping, lint="off")
    fxquant.share_step(gm, "conv2_quant", "conv2_input_quant")
    gm(torch.randn(6, 4), torch.tensor([[0, 1, 2], [1, 2, 3]]))
    path = tmp_path_factory.mktemp("saved") / "gm.pt"
    fxquant.save(gm, path)
    fxquant.load(path, Net())  # the file as written loads
    return torch.load(path, weights_only=True)


def _edit(blob: dict, edit: str, pick: int) -> tuple[dict, str]:
    """``blob`` structurally edited; the word the error must name."""
    blob = dict(blob)
    points = json.loads(blob["points"])
    trace = json.loads(blob["trace"])
    state = dict(blob["state_dict"])
    point = points[pick % len(points)]
    if edit == "top":
        key = ["points", "trace", "state_dict"][pick % 3]
        del blob[key]
        return blob, key
    if edit == "point":
        key = ["name", "layer", "site", "config"][pick % 4]
        del point[key]
        named = key
    elif edit == "config":
        del point["config"]["format"]
        named = "format"
    elif edit == "node_bits":
        entry = next(p for p in points if p["config"]["node_bits"] is not None)
        key = ["num_nodes", "learned", "min_bits", "max_bits"][pick % 4]
        del entry["config"]["node_bits"][key]
        named = key
    elif edit == "trace":
        key = ["concrete_args", "leaf_names", "leaf_classes"][pick % 3]
        del trace[key]
        named = key
    elif edit == "state":
        key = sorted(state)[pick % len(state)]
        del state[key]
        named = key
    elif edit == "extra_state":
        state["conv9.weight"] = torch.ones(2)
        named = "conv9.weight"
    elif edit == "retype":
        key = ["name", "layer", "site", "config", "override", "step_source"][pick % 6]
        point[key] = 7
        named = key if key != "name" else "name"
    elif edit == "json":
        blob["points"] = blob["points"][: len(blob["points"]) // 2]
        return blob, "points"
    else:  # a list where a dict belongs
        blob["trace"] = json.dumps([trace])
        return blob, "trace"
    blob["points"], blob["trace"], blob["state_dict"] = json.dumps(points), json.dumps(trace), state
    return blob, named


EDITS = ["top", "point", "config", "node_bits", "trace", "state", "extra_state", "retype",
         "json", "shape"]


@settings(max_examples=60)
@given(edit=st.sampled_from(EDITS), pick=st.integers(0, 50))
def test_edited_files_name_what_is_wrong(saved, edit, pick, tmp_path_factory):
    """Any entry removed, retyped or added: fxquant.load raises an fxquant error naming
    it and saying how to fix it."""
    blob, named = _edit(saved, edit, pick)
    path = tmp_path_factory.mktemp("edited") / "gm.pt"
    torch.save(blob, path)
    with pytest.raises(FxquantError) as caught:
        fxquant.load(path, Net())
    message = str(caught.value)
    assert repr(named) in message or named in message, message
    assert "fxquant.save" in message or "same model" in message


def test_reported_bare_key_errors(saved, tmp_path):
    """The reported cases: a file without 'trace', a point without 'layer', a missing
    state key raised a bare KeyError."""
    for edit, pick, named in (("top", 1, "'trace'"), ("point", 1, "'layer'"),
                              ("state", 0, "conv1.bias")):
        blob, _ = _edit(saved, edit, pick)
        torch.save(blob, tmp_path / "gm.pt")
        with pytest.raises(ValueError, match=named):
            fxquant.load(tmp_path / "gm.pt", Net())
