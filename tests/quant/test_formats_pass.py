"""transform(format=..., scale=...): the same pass with minifloat formats."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import fxquant
from fxquant.formats import TopN
from fxquant.quant import RangeObserver
from tests.support.models import GCN, tiny_graph


def ops(gm):
    """``[(op, layer)]`` of every point, in graph order."""
    return [(p.op_call().op, p.layer) for _, p in fxquant.quantization_points(gm)]


def test_format_with_tensor_scale_matches_eager(graph):
    """After each conv: quantize(e4m3, per-tensor scale), exactly as computed by hand."""
    model = GCN()
    gm = fxquant.transform(model, format="e4m3", scale="tensor")
    assert ops(gm) == [("quantize", "conv1"), ("quantize", "conv2")]
    x, ei = graph.x, graph.edge_index
    with torch.no_grad():
        h = fxquant.quantize(model.conv1(x, ei), "e4m3", scale="tensor")
        h = fxquant.quantize(model.conv2(torch.sigmoid(h), ei), "e4m3", scale="tensor")
        assert torch.equal(gm(x, ei), torch.log_softmax(h, dim=1))


def test_dict_mixes_bits_and_formats():
    """{layer: 16} truncates, {layer: 'e3m2'} quantizes; rounding=None is each op's default."""
    gm = fxquant.transform(GCN(), bits={"conv1": 16, "conv2": "e3m2"})
    assert ops(gm) == [("truncate", "conv1"), ("quantize", "conv2")]
    found = {p.layer: (p.config.format, p.config.rounding) for _, p in
             fxquant.quantization_points(gm)}
    assert found["conv1"] == (TopN(16), "toward_zero")
    assert found["conv2"][0].spec() == "e3m2" and found["conv2"][1] == "nearest"


@pytest.mark.parametrize(("main", "kind"), [({"format": "e4m3"}, "e4m3"), ({"bits": 16}, "top16")])
def test_row_override_with_a_format(main, kind, graph):
    """node_bits accepts a format; the listed rows use it, the others the layer's number."""
    rows = torch.tensor([1, 4])
    gm = fxquant.transform(GCN(), layers="conv1", node_formats={"conv1": (rows, "e2m1")}, **main)
    (name, point), = fxquant.quantization_points(gm)
    call = point.op_call()
    assert call.op == "quantize" and call.arguments["format"] == kind
    assert call.arguments["override_format"] == "e2m1"
    interp_out = {}

    class Spy(torch.fx.Interpreter):
        def run_node(self, n):
            interp_out[n.name] = super().run_node(n)
            return interp_out[n.name]

    with torch.no_grad():
        Spy(gm).run(graph.x, graph.edge_index)
    raw, got = interp_out["conv1"], interp_out[name]
    rounding = call.arguments["rounding"]  # one rounding per point, the layer's (op default)
    assert torch.equal(got[rows], fxquant.quantize(raw[rows], "e2m1", rounding))
    other = torch.tensor([0, 2, 3, 5])
    ref = fxquant.quantize(raw, "e4m3") if kind == "e4m3" else fxquant.truncate(raw, 16)
    assert torch.equal(got[other], ref[other])
    assert "2 nodes -> e2m1" in fxquant.summary(gm)


def test_running_range_trains_evaluates_and_is_saved(tmp_path, graph):
    """decay= keeps a range buffer: updated in train, used in eval, in state_dict, reloaded."""
    model = GCN()
    kwargs = {"format": "e4m3", "scale": "tensor", "decay": 0.5, "layers": "conv1"}
    gm = fxquant.transform(model, **kwargs)
    observer = gm.get_submodule("conv1_quant.observer")
    assert isinstance(observer, RangeObserver) and not observer.seen
    gm.train()
    gm(graph.x, graph.edge_index)
    raw = model.conv1(graph.x, graph.edge_index).detach()
    first = torch.stack([raw.min(), raw.max()])
    assert torch.allclose(observer.running, first)
    gm(graph.x * 3, graph.edge_index)
    assert torch.allclose(observer.running, 0.5 * first + 0.5 * 3 * first, rtol=1e-5)
    gm.eval()
    with torch.no_grad():
        out = gm(graph.x, graph.edge_index)
        amax = observer.running.abs().max()
        factor = torch.div(torch.tensor(448.0), amax)
        expected_h = fxquant.quantize(raw * factor, "e4m3") / factor
        h = model.conv2(torch.sigmoid(expected_h), graph.edge_index)
        assert torch.allclose(out, torch.log_softmax(h, dim=1))
    assert "conv1_quant.observer.running" in gm.state_dict()
    assert "running, decay 0.5" in fxquant.summary(gm)

    torch.save(gm.state_dict(), tmp_path / "sd.pt")
    fresh = fxquant.transform(GCN(), **kwargs).eval()
    fresh.load_state_dict(torch.load(tmp_path / "sd.pt", weights_only=True))
    with torch.no_grad():
        assert torch.equal(fresh(graph.x, graph.edge_index), out)

    torch.save(gm, tmp_path / "gm.pt")
    torch.save((graph.x, graph.edge_index), tmp_path / "in.pt")
    script = textwrap.dedent(f"""
        import torch, fxquant
        gm = torch.load({str(tmp_path / 'gm.pt')!r}, weights_only=False).eval()
        x, ei = torch.load({str(tmp_path / 'in.pt')!r})
        with torch.no_grad():
            torch.save(gm(x, ei), {str(tmp_path / 'out.pt')!r})
        print(fxquant.summary(gm))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert torch.equal(torch.load(tmp_path / "out.pt"), out)
    assert "e4m3" in done.stdout and "running, decay 0.5" in done.stdout


def test_gradient_format_through_transform():
    """grad_format reaches the op; training still runs and every layer learns."""
    data = tiny_graph(num_nodes=12)
    gm = fxquant.transform(GCN(), format="e4m3", scale="row", grad_format="e5m2")
    assert all(p.op_call().arguments["grad_format"] == "e5m2"
               for _, p in fxquant.quantization_points(gm))
    loss = torch.nn.functional.nll_loss(gm(data.x, data.edge_index), data.y)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in gm.parameters())


def test_meta_device_with_formats():
    """Row scales, running amax and row overrides all run on meta."""
    model = GCN(add_self_loops=False, normalize=False)
    gm = fxquant.transform(model, format="e3m2", scale="tensor", decay=0.9,
                           node_formats={"conv1": ([0], "e2m1")}).to("meta")
    out = gm(torch.randn(6, 4, device="meta"), torch.randint(0, 6, (2, 10), device="meta"))
    assert out.device.type == "meta" and out.shape == (6, 2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bits": 8, "format": "e4m3"}, "not both"),
        ({"bits": 8, "scale": "tensor"}, "applies to formats"),
        ({"format": "e4m3", "scale": "row", "decay": 0.9}, "needs a format with scale='tensor'"),
        ({"format": "e4m3", "scale": "tensor", "decay": 1.5}, r"decay must be a number in \[0, 1\)"),
        ({"format": "e4m3", "grad_bits": 8, "grad_format": "e5m2"}, "grad_bits= or grad_format="),
        ({"format": "e4m3x"}, "unknown format 'e4m3x'"),
        ({"format": (10, 30)}, "at most 32 bits"),
        ({"format": "e4m3", "scale": "block"}, "scale='block'"),
        ({"bits": {"conv1": "nope"}}, r"bits\['conv1'\]: unknown format 'nope'"),
    ],
)
def test_bad_format_arguments(kwargs, match):
    """Each bad argument is named, nothing is changed."""
    with pytest.raises((ValueError, TypeError), match=match):
        fxquant.transform(GCN(), **kwargs)


@pytest.mark.slow
def test_compile_transformed_with_formats(graph):
    """torch.compile(fullgraph=True) runs a quantized GCN and agrees with eager."""
    gm = fxquant.transform(GCN(), format="e4m3", scale="row").eval()
    compiled = torch.compile(gm, fullgraph=True)
    with torch.no_grad():
        assert torch.allclose(compiled(graph.x, graph.edge_index), gm(graph.x, graph.edge_index))
