"""Extending fxquant from one's own code: a number format, a scale and a site defined
here (outside the package), registered, trained with, saved and loaded, and compiled; and
a fresh process that has not registered them refuses a file that uses them, naming the
call that registers each."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

import fxquant
from fxquant import QuantConfig, QuantMapping
from tests.support.models import GCN, tiny_graph

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class LogFormat(fxquant.CustomFormat):
    """``logqN``: zero and the signed powers of two ``2**e``, ``emin <= e <= 0``, in ``N``
    bits (a sign, and a code for zero and each exponent); rounded in the log domain."""

    name = "logq"
    width: int

    @classmethod
    def from_spec(cls, spec: str) -> LogFormat:
        return cls(int(spec.removeprefix("logq")))

    def spec(self) -> str:
        return f"logq{self.width}"

    @property
    def bits(self) -> int:
        return self.width

    @property
    def max_finite(self) -> float:
        return 1.0

    @property
    def emin(self) -> int:
        return -(2 ** (self.width - 1) - 2)

    def round(self, y: Tensor, rounding: str, noise: Tensor | None = None) -> Tensor:
        a = y.abs().clamp(max=1.0)
        tiny = 2.0 ** self.emin
        logs = torch.log2(a.clamp(min=tiny / 2))
        if rounding == "nearest":
            e = torch.round(logs)
        elif rounding == "toward_zero":
            e = torch.floor(logs)
        else:
            assert noise is not None
            e = torch.floor(logs + noise)
        r = torch.exp2(e.clamp(min=self.emin, max=0))
        return torch.copysign(torch.where(a < tiny / 2, 0.0, r), y)


class PerColumn(fxquant.ScaleKind):
    """One scale per column (the last dim) of a tensor."""

    name = "column"

    def bounds(self, x: Tensor) -> Tensor:
        finite = torch.where(torch.isfinite(x), x, 0.0)
        dims = tuple(range(x.dim() - 1))
        return torch.stack([finite.amin(dims, keepdim=True), finite.amax(dims, keepdim=True)],
                           dim=-1)

    def storage_bits(self, rows: int, width: int) -> int:
        return 32 * width  # (a 2-d tensor: one float32 per column)


class RoundedUpdate:
    """``layer.update`` that rounds what the layer's own ``update()`` returns."""

    def __init__(self, owner: nn.Module, point: nn.Module) -> None:
        self.owner, self.point = owner, point

    def __call__(self, inputs: Tensor, **kwargs: object) -> Tensor:
        return self.point(type(self.owner).update(self.owner, inputs, **kwargs))


class Update(fxquant.SiteKind):
    """What a PyG layer's ``update()`` returns (one row per node)."""

    name = "update"

    def check(self, layer: str, module: nn.Module) -> None:
        if not hasattr(module, "propagate"):
            raise ValueError(f"{type(module).__name__} is not a PyG MessagePassing layer")

    def install(self, layer: str, module: nn.Module, point: nn.Module) -> None:
        module.update = RoundedUpdate(module, point)


@pytest.fixture(scope="module", autouse=True)
def registered():
    fmt = fxquant.register_format(LogFormat)
    scale = fxquant.register_scale(PerColumn())
    site = fxquant.register_site(Update())
    yield fmt, scale, site
    fxquant.formats.unregister_format("logq")
    fxquant.modes.unregister_scale("column")
    fxquant.quant.site.unregister_site("update")


def _mapping() -> QuantMapping:
    return (QuantMapping()
            .set_name("conv1", QuantConfig("logq4", scale="column"))
            .set_name("conv2", QuantConfig("int4", scale="column"), site="update")
            .set_name("conv1", QuantConfig("logq5", scale="tensor"), site="update"))


def _trained(steps: int = 5) -> tuple[torch.fx.GraphModule, object]:
    torch.manual_seed(0)
    data = tiny_graph(num_nodes=8, in_channels=4)
    gm = fxquant.transform(GCN(4, 8, 2), _mapping())
    optimizer = torch.optim.Adam(gm.parameters(), lr=0.05)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.nll_loss(gm(data.x, data.edge_index), data.y)
        loss.backward()
        optimizer.step()
    return gm, data


def test_the_registered_format_scale_and_site_round_where_the_mapping_says():
    """Each extension shows in the summary and rounds its values onto its grid."""
    gm, data = _trained(steps=0)
    points = dict(fxquant.quantization_points(gm))
    assert {n: (p.site.value, p.config.format.spec(), p.config.scale.value)
            for n, p in points.items()} == {
        "conv1_update_quant": ("update", "logq5", "tensor"),
        "conv1_quant": ("output", "logq4", "column"),
        "conv2_update_quant": ("update", "int4", "column")}
    seen = {}
    for name, point in points.items():
        point.register_forward_hook(lambda m, a, out, name=name: seen.setdefault(name, out))
    gm.eval()(data.x, data.edge_index)
    out = seen["conv1_quant"]
    scale = out.abs().amax(0)  # column by column, a power of two times the column's scale
    levels = out / torch.where(scale > 0, scale, 1.0)
    nonzero = levels[levels != 0].abs()
    assert torch.equal(torch.exp2(torch.round(torch.log2(nonzero))), nonzero)
    assert bool((levels.abs() <= 1).all())
    assert "update" in fxquant.summary(gm)


def test_training_saving_loading_and_counting_bits(tmp_path):
    """The parameters learn through every extension; a saved model loads with the same
    outputs; bit_report counts the format's bits and the scale's storage."""
    before = GCN(4, 8, 2)
    gm, data = _trained()
    assert not torch.equal(gm.get_parameter("conv1.lin.weight"), before.conv1.lin.weight)
    fxquant.save(gm, tmp_path / "gm.pt")
    again = fxquant.load(tmp_path / "gm.pt", GCN(4, 8, 2))
    gm.eval(), again.eval()
    assert torch.equal(again(data.x, data.edge_index), gm(data.x, data.edge_index))
    report = fxquant.bit_report(gm, data.x, data.edge_index)
    sites = {s.name: s for s in report.sites}
    conv1 = sites["conv1_quant"]
    assert conv1.value_bits == 4 * conv1.values and conv1.storage_bits == 32 * 8


@pytest.mark.slow
def test_compiled_with_fullgraph_equals_eager():
    """torch.compile(fullgraph=True) of a model rounding with all three: the same outputs."""
    gm, data = _trained(steps=2)
    gm.eval()
    compiled = torch.compile(gm, fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(data.x, data.edge_index), gm(data.x, data.edge_index))


_LOAD = textwrap.dedent("""
    import sys
    import fxquant
    from tests.support.models import GCN
    try:
        fxquant.load(sys.argv[1], GCN(4, 8, 2))
    except fxquant.FxquantError as e:
        print(type(e).__name__, e)
    else:
        print("loaded")
""")


@pytest.mark.parametrize(("format", "scale", "site", "register"), [
    ("logq4", "tensor", "output", "register_format"),
    ("int4", "column", "output", "register_scale"),
    ("int8", "tensor", "update", "register_site"),
])
def test_a_fresh_process_without_the_extension_names_what_to_register(tmp_path, format, scale,
                                                                      site, register):
    """A file saved with an extension, loaded by a process that has not registered it:
    a clear error that names the registration, not a crash or a wrong model."""
    config = QuantConfig(format, scale=scale)
    gm = fxquant.transform(GCN(4, 8, 2), QuantMapping().set_name("conv1", config, site=site))
    fxquant.save(gm, tmp_path / "gm.pt")
    run = subprocess.run([sys.executable, "-c", _LOAD, str(tmp_path / "gm.pt")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("UnregisteredError"), run.stdout
    assert f"fxquant.{register}" in run.stdout and "conv1" in run.stdout


def test_registrations_are_checked():
    """A name of a built-in, or one registered twice, is refused with a reason."""
    with pytest.raises(ValueError, match="built-in"):
        fxquant.register_scale(type("Tensor", (PerColumn,), {"name": "tensor"})())
    with pytest.raises(ValueError, match="registered already"):
        fxquant.register_site(Update())
    with pytest.raises(TypeError, match="CustomFormat"):
        fxquant.register_format(int)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="node_bits"):
        QuantConfig("int8", scale="column", node_bits=fxquant.NodeBits(torch.tensor([2, 4])))
    assert math.isclose(LogFormat(4).max_finite, 1.0)
