"""The public surface: an explicit transform signature, keywords that are never dropped,
one base exception, deprecated names that still work, and every exported name documented."""

import inspect
import pickle
import warnings

import pytest
import torch
from torch_geometric.nn import GCNConv

import fxquant
from fxquant import QuantConfig, QuantMapping


class GCN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = GCNConv(4, 8), GCNConv(8, 2)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


ROUNDING_KEYWORDS = {"bits": 8, "format": "e4m3", "scale": "tensor", "decay": 0.5,
                     "rounding": "nearest", "grad": "zero", "grad_bits": 12,
                     "grad_format": "e5m2"}


def test_transform_signature_shows_every_option():
    """No **kwargs: help() and IDEs see every option of transform."""
    for fn in (fxquant.transform, fxquant.quant.transform):
        params = inspect.signature(fn).parameters
        assert not any(p.kind is p.VAR_KEYWORD for p in params.values())
        assert {*ROUNDING_KEYWORDS, "layers", "node_formats", "inplace", "concrete_args",
                "leaf_modules"} <= set(params)
    assert "lint" in inspect.signature(fxquant.transform).parameters


def test_no_public_function_hides_options_in_kwargs():
    """Public callables take no **kwargs, except those passing the model's own inputs."""
    passes_inputs = {"bit_report", "lint", "check", "functionalize_inplace", "summary"}
    for name in fxquant.__all__:
        obj = getattr(fxquant, name)
        if inspect.isfunction(obj) and name not in passes_inputs:
            kinds = {p.kind for p in inspect.signature(obj).parameters.values()}
            assert inspect.Parameter.VAR_KEYWORD not in kinds, name


@pytest.mark.parametrize("keyword", sorted(ROUNDING_KEYWORDS))
@pytest.mark.parametrize("given", ["config", "mapping"])
def test_rounding_keyword_next_to_a_config_is_refused(keyword, given):
    """Each keyword that says how to round is an error next to a config or a mapping, naming
    both, and nothing is modified."""
    model = GCN()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = QuantConfig(16)
    mapping = config if given == "config" else QuantMapping().set_global(config)
    with pytest.raises(ValueError, match=rf"{keyword}=.* and a Quant(Config|Mapping) were both given"):
        fxquant.transform(model, mapping, **{keyword: ROUNDING_KEYWORDS[keyword]})
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_silent_drop_call_raises():
    """The call that used to drop four keywords without a word."""
    with pytest.raises(fxquant.FxquantError, match="bits=8 and a QuantConfig"):
        fxquant.transform(GCN(), QuantConfig(16), bits=8, format="e4m3", scale="tensor",
                          grad="zero")


def test_layers_and_node_formats_stay_legal_with_a_config_or_mapping():
    """layers= selects (a config) or restricts (a mapping); node_formats= adds overrides."""
    gm = fxquant.transform(GCN(), QuantConfig(16), layers="conv1",
                           node_formats={"conv1": ([0, 1], 9)}, lint="off")
    assert [p.layer for _, p in fxquant.quantization_points(gm)] == ["conv1"]
    mapping = QuantMapping().set_global(QuantConfig(16)).set_global(QuantConfig(12), site="input")
    gm = fxquant.transform(GCN(), mapping, layers="conv2", node_formats={"conv2": ([0], 9)},
                           lint="off")
    points = fxquant.quantization_points(gm)
    assert {(p.layer, p.site.value) for _, p in points} == {("conv2", "input"), ("conv2", "output")}
    assert any(p.override is not None for _, p in points)
    assert len(mapping._overrides) == 0  # the user's mapping is not changed
    with pytest.raises(ValueError, match="keeps none of the mapping's"):
        fxquant.transform(GCN(), QuantMapping().set_name("conv1", QuantConfig(16)),
                          layers="conv2")


def test_names_removed_as_announced():
    """The names 0.3.0 deprecated "for one release" are gone; files saved with them load
    (test below)."""
    with pytest.raises(AttributeError):
        fxquant.RowBits  # noqa: B018
    with pytest.raises(AttributeError):
        fxquant.quant.RowBits  # noqa: B018
    for keyword in ("number", "grad_number", "row_bits"):
        with pytest.raises(TypeError, match=keyword):
            QuantConfig("int4", scale="tensor", **{keyword: None})
    for name in ("number", "grad_number", "row_bits"):
        assert not hasattr(QuantConfig(16), name)
    with pytest.raises(TypeError, match="node_bits"):
        fxquant.transform(GCN(), bits=16, node_bits={"conv1": ([0], 9)}, lint="off")


def _renamed(get):
    """The FutureWarning ``get()`` gives, checked to point at this file (the caller's line)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = get()
    assert [w.category for w in caught] == [FutureWarning], caught
    assert caught[0].filename == __file__, caught[0].filename
    return value, str(caught[0].message)


def test_renamed_names_warn_at_the_callers_line():
    """Names renamed in this release stay one more, with a FutureWarning naming the new one
    at the line that uses the old."""
    import fxquant.formats
    import fxquant.quant.config

    value, message = _renamed(lambda: fxquant.formats.Number)
    assert value is fxquant.formats.AnyFormat and "AnyFormat" in message
    value, message = _renamed(lambda: fxquant.quant.config.Number)
    assert value is fxquant.formats.AnyFormat
    value, message = _renamed(lambda: fxquant.quant.config.as_number)
    assert value is fxquant.formats.as_format and "as_format" in message
    config = QuantConfig("int4", scale="tensor", range="lsq",
                         node_bits=fxquant.NodeBits.learned_init(3))
    point = fxquant.QuantPoint(config, "conv1")
    value, message = _renamed(lambda: point.row_bits)
    assert value is point.node_widths.bits and "node_widths.bits" in message
    fixed = fxquant.QuantPoint(QuantConfig("int4", scale="tensor", node_bits=fxquant.NodeBits(
        torch.tensor([2, 4]))), "conv1")
    value, _ = _renamed(lambda: fixed.row_bits_table)
    assert value is fixed.node_widths.bits
    override = fxquant.QuantPoint(QuantConfig(16), "conv1",
                                  override=fxquant.NodeOverride([0], 9))
    value, message = _renamed(lambda: override.override_number)
    assert value == fxquant.TopN(9) and "override.format" in message


def test_configs_pickled_with_the_old_field_names_load():
    """A QuantConfig pickled before the renames reads its old fields."""
    config = QuantConfig("e4m3", scale="tensor", grad_format="e5m2")
    state = dict(config.__dict__)
    state["number"] = state.pop("format")
    state["grad_number"] = state.pop("grad_format")
    state["row_bits"] = state.pop("node_bits")
    old = QuantConfig.__new__(QuantConfig)
    old.__setstate__(state)
    assert old == config
    assert pickle.loads(pickle.dumps(config)) == config
    data = config.to_dict()
    data["number"] = data.pop("format")
    assert QuantConfig.from_dict(data) == config


BAD_CALLS = [
    lambda: fxquant.transform(GCN(), bits=99),
    lambda: fxquant.transform(GCN(), format="e9m9x"),
    lambda: fxquant.transform("not a model", bits=8),
    lambda: fxquant.transform(GCN(), bits=8, layers="nope"),
    lambda: fxquant.transform(GCN(), bits=8, lint="loud"),
    lambda: QuantConfig("int4", decay=0.5),
    lambda: QuantConfig("int4", scale="tensor", range="median"),
    lambda: fxquant.NodeBits(torch.tensor([1.5]), learned=False),
    lambda: fxquant.quantize(torch.ones(3), "e4m3", scale="volume"),
    lambda: fxquant.truncate(torch.ones(3, dtype=torch.int32), 8),
    lambda: fxquant.bit_report(GCN()),
    lambda: fxquant.lint(GCN(), leaf_modules="conv1"),
    lambda: fxquant.recipes.get("nope"),
    lambda: fxquant.recipes.HubMessages(target_bits=-1.0),
    lambda: fxquant.recipes.QuantTraining(fxquant.transform(GCN(), bits=8, lint="off"),
                                          select="budget"),
    lambda: QuantMapping().set_type(int, QuantConfig(8)),
]


@pytest.mark.parametrize("call", BAD_CALLS, ids=range(len(BAD_CALLS)))
def test_every_error_fxquant_raises_on_purpose_is_an_fxquant_error(call):
    """One base class catches them, and the built-in kinds still do."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(fxquant.FxquantError) as caught:
            call()
    assert isinstance(caught.value, (ValueError, TypeError, RuntimeError))


def test_errors_raised_by_the_package_all_derive_from_the_base():
    """No module of the package raises a bare built-in exception class on purpose."""
    import ast
    from pathlib import Path

    builtin = {"ValueError", "TypeError", "RuntimeError", "KeyError", "IndexError",
               "FileNotFoundError", "ImportError", "AssertionError", "NotImplementedError"}
    allowed = {("linter/torch_modes.py", "RuntimeError")}  # imitates torch's own error
    found = []
    root = Path(fxquant.__file__).parent
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) \
                    and isinstance(node.exc.func, ast.Name) and node.exc.func.id in builtin:
                where = (str(path.relative_to(root)), node.exc.func.id)
                if where not in allowed and node.exc.func.id != "NotImplementedError":
                    found.append(f"{where[0]}:{node.lineno} {where[1]}")
    assert not found


def test_exported_types_the_docs_use():
    """The types the docs name are at the top level."""
    for name in ("IntFormat", "Format", "TopN", "NodeBits", "NodeOverride", "QuantConfig",
                 "QuantMapping", "QuantPoint", "Site", "FxquantError", "BitReport", "LintReport",
                 "Finding", "ShapeSpec", "recipes"):
        assert name in fxquant.__all__, name
        assert getattr(fxquant, name) is not None
