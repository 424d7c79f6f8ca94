"""On an accelerator (CUDA): the rounding kernels give the CPU's bits, transformed models
and recipes keep every constant on the model's device, train and compile there, and the
linter runs on accelerator inputs.

Skipped where no CUDA device is present (CI has none). ``FXQUANT_TEST_DEVICE=cpu`` runs the
same tests with the CPU standing in for the accelerator (a check of the tests themselves).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv
from torch_geometric.nn.models import GAT, GCN

import fxquant
from fxquant import QuantConfig, QuantMapping

DEVICE = torch.device(os.environ.get("FXQUANT_TEST_DEVICE", "cuda"))

pytestmark = pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(),
                                reason="no CUDA device here")


def _specials(dtype: torch.dtype) -> torch.Tensor:
    """Normal values over many binades, signed zeros, subnormals, the largest finite
    values, infinities and NaN."""
    g = torch.Generator().manual_seed(0)
    info = torch.finfo(dtype)
    normal = torch.randn(4096, generator=g, dtype=torch.float64) * \
        torch.logspace(-6, 6, 4096, dtype=torch.float64)
    edge = torch.tensor([0.0, -0.0, info.tiny, -info.tiny, info.tiny / 4, info.max, -info.max,
                         float("inf"), float("-inf"), float("nan")], dtype=torch.float64)
    return torch.cat([normal.to(dtype), edge.to(dtype)])


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    got, want = got.cpu(), want.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    bits = {torch.float32: torch.int32, torch.float64: torch.int64,
            torch.float16: torch.int16, torch.bfloat16: torch.int16}[want.dtype]
    differ = (got[~nan].view(bits) != want[~nan].view(bits)).nonzero().flatten()
    assert differ.numel() == 0, (f"{differ.numel()} elements differ, first: "
                                 f"{want[~nan][differ[:4]].tolist()} -> "
                                 f"{got[~nan][differ[:4]].tolist()}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rounding", ["toward_zero", "nearest"])
def test_truncate_gives_the_cpu_bits(dtype, rounding):
    x = _specials(dtype)
    for bits in (3, 7, 10, 12):
        if bits >= torch.finfo(dtype).bits:
            continue
        _same_bits(fxquant.truncate(x.to(DEVICE), bits, rounding),
                   fxquant.truncate(x, bits, rounding))


@pytest.mark.parametrize("scale", [None, "row", "tensor"])
@pytest.mark.parametrize("number", ["e4m3", "e5m2", "e2m1", "int8", "int4", "uint4"])
def test_quantize_gives_the_cpu_bits(number, scale):
    x = _specials(torch.float32).view(-1, 2)[:2048]  # finite rows for the row scales
    x = x[torch.isfinite(x).all(dim=1)]
    _same_bits(fxquant.quantize(x.to(DEVICE), number, scale=scale),
               fxquant.quantize(x, number, scale=scale))


def test_stochastic_rounding_is_unbiased_on_the_grid_and_its_gradient_passes():
    """Every row holds the same 16 values (so the same row scale): each rounded value is
    on the grid, and the mean over 4000 rows is the value itself within its noise."""
    values = torch.linspace(-1.9, 2.3, 16)
    x = values.repeat(4000, 1).to(DEVICE).requires_grad_()
    g = torch.Generator(device=DEVICE).manual_seed(1)
    q = fxquant.quantize(x, "e2m1", "stochastic", scale="row", generator=g)
    assert q.device == x.device
    grid = fxquant.quantize(q.detach(), "e2m1", "nearest", scale="row")
    assert torch.equal(grid, q.detach())
    spread = q.detach().std(dim=0).cpu()
    error = (q.detach().mean(dim=0).cpu() - values).abs()
    assert (error <= 5 * spread / 4000 ** 0.5 + 1e-6).all(), error
    assert (spread > 0).sum() >= 12  # values between grid points do get rounded both ways
    q.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def _graph(n: int = 60, e: int = 400, f: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, f, generator=g)
    edge_index = torch.randint(0, n, (2, e), generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    return x, edge_index, y


def _tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def _every_site(number: str) -> QuantMapping:
    config = QuantConfig(number, scale="tensor", range="lsq")
    mapping = QuantMapping()
    for site in ("output", "input", "weight", "message", "aggregate"):
        mapping.set_global(config, site=site)
    return mapping


@pytest.mark.parametrize("where", ["before", "after"])
def test_transformed_model_keeps_every_constant_on_the_device(where):
    """Transformed on the device, or on the CPU and moved: every parameter and buffer is
    there, the forward and backward run there, and the output follows the CPU model's."""
    x, edge_index, y = _graph()
    torch.manual_seed(0)
    model = GCN(16, 32, num_layers=2, out_channels=3)
    cpu = fxquant.transform(copy.deepcopy(model), _every_site("int4"))
    with torch.no_grad():
        cpu.train()
        cpu(x, edge_index)  # the first training forward fits the LSQ steps
    if where == "before":
        gm = fxquant.transform(copy.deepcopy(model).to(DEVICE), _every_site("int4"))
        gm.train()
        with torch.no_grad():
            gm(x.to(DEVICE), edge_index.to(DEVICE))
    else:
        gm = copy.deepcopy(cpu).to(DEVICE)
    wrong = {k: t.device for k, t in _tensors(gm).items() if t.device.type != DEVICE.type}
    assert not wrong, f"left off {DEVICE}: {wrong}"
    gm.eval()
    cpu.eval()
    with torch.no_grad():
        got = gm(x.to(DEVICE), edge_index.to(DEVICE)).cpu()
        want = cpu(x, edge_index)
    # a value at a rounding boundary may land one step away under other summation orders
    assert (got - want).abs().mean() <= 0.02 * want.abs().mean() + 1e-6
    gm.train()
    out = gm(x.to(DEVICE), edge_index.to(DEVICE))
    F.cross_entropy(out, y.to(DEVICE)).backward()
    steps = [p for k, p in gm.named_parameters() if "quant" in k]
    assert steps and all(p.grad is not None and p.grad.device.type == DEVICE.type
                         for p in steps)
    assert any(bool(p.grad.abs().sum() > 0) for p in steps)


@pytest.mark.parametrize("name", ["recommended", "degree-quant", "lsq-protect", "budget-bits"])
def test_recipes_prepare_and_train_on_the_device(name):
    """A recipe prepared from a model and graph on the device trains there: its per-node
    tables, masks, steps and widths all live on the device."""
    from torch_geometric.data import Data

    x, edge_index, y = _graph()
    data = Data(x=x, edge_index=edge_index, y=y).to(DEVICE)
    torch.manual_seed(0)
    model = GCN(16, 32, num_layers=2, out_channels=3).to(DEVICE)
    settings = {"target_bits": 2.0, "input_format": None} \
        if name in ("recommended", "budget-bits") else {}
    run = fxquant.recipes.get(name, **settings).prepare(model, data, lint="off")
    wrong = {k: t.device for k, t in _tensors(run.model).items()
             if t.device.type != DEVICE.type}
    assert not wrong, f"left off {DEVICE}: {wrong}"
    if run.distill:  # (the recommended recipe) a teacher's logits, on the CPU
        run.set_teacher(torch.randn(60, 3))
    optimizer = torch.optim.Adam(run.param_groups(), lr=0.01)
    for epoch in range(4):
        run.model.train()
        run.start_epoch(epoch)
        optimizer.zero_grad()
        out = run.model(data.x, data.edge_index)
        loss = run.loss(F.cross_entropy(out, data.y), output=out)
        loss.backward()
        optimizer.step()
        run.after_step()
        assert torch.isfinite(loss)
        run.model.eval()
        with torch.no_grad():
            acc = (run.model(data.x, data.edge_index).argmax(-1) == data.y).float().mean()
        run.observe(float(acc) + 1e-3)
    assert run.best is not None
    report = fxquant.bit_report(run.model, data.x, data.edge_index)
    assert report.avg_bits > 0


def test_compiled_transformed_model_follows_eager_on_the_device():
    x, edge_index, _ = _graph()
    torch.manual_seed(0)
    gm = fxquant.transform(GAT(16, 8, num_layers=2, out_channels=3, heads=4).to(DEVICE),
                           _every_site("int8"))
    x, edge_index = x.to(DEVICE), edge_index.to(DEVICE)
    gm.train()
    with torch.no_grad():
        gm(x, edge_index)  # fit the steps
    gm.eval()
    compiled = torch.compile(gm, fullgraph=True)
    with torch.no_grad():
        want = gm(x, edge_index)
        got = compiled(x, edge_index)
    assert (got - want).abs().mean() <= 0.02 * want.abs().mean() + 1e-6
    # the rounding op alone compiles to the same bits
    v = torch.randn(4096, device=DEVICE) * 100
    _same_bits(torch.compile(lambda t: fxquant.truncate(t, 9, "nearest"))(v),
               fxquant.truncate(v, 9, "nearest"))


def _line_of(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "_line_of" not in line)


def test_check_names_the_culprit_line_on_device_inputs():
    class Bad(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = GCNConv(16, 8)

        def forward(self, x, edge_index):
            h = self.conv(x, edge_index).sigmoid()
            h.mul_(2)  # sigmoid saved its output for backward
            return h

    x, edge_index, _ = _graph()
    model = Bad().to(DEVICE)
    before = {k: t.clone() for k, t in model.state_dict().items()}
    report = fxquant.check(model, x.to(DEVICE), edge_index.to(DEVICE))
    culprit = [f for f in report.findings if f.rule == "FXQ001"]
    assert culprit and culprit[0].location is not None
    assert culprit[0].location.line == _line_of("h.mul_(2)")
    assert all(torch.equal(before[k], t) for k, t in model.state_dict().items())
    clean = fxquant.check(GCN(16, 8, num_layers=2).to(DEVICE), x.to(DEVICE),
                          edge_index.to(DEVICE))
    assert not [f for f in clean.findings if f.rule == "FXQ001"]
