"""fxquant.lint with example inputs and fxquant.check: culprits, victims, no trace left."""

from __future__ import annotations

import copy
import re
import warnings
from pathlib import Path

import pytest
import torch
from torch_geometric.nn.models import GCN as PygGCN

import fxquant
from tests.support.lint_models import DataScale, DetachAdd, FillLeaf, LegalInplace, Raises
from tests.support.models import GCN, SeedGCN, bitplane_roundtrip, tiny_graph

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "tests" / "support" / "models.py"
LINT = ROOT / "tests" / "support" / "lint_models.py"


def line_of(path: Path, text: str, nth: int = 0) -> int:
    """1-based number of the ``nth`` line of ``path`` that contains ``text``."""
    hits = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    return hits[nth]


def at(path: Path, line: int) -> str:
    return f"{path.name}:{line}"


def locations(report, rule=None, severity=None):
    return sorted(
        f.where.rsplit("/", 1)[-1] for f in report.findings
        if (rule is None or f.rule == rule) and (severity is None or f.severity == severity)
    )


@pytest.fixture(params=["lint", "check"])
def run(request):
    """Each seed-style expectation holds for lint (forward only) and check (and backward)."""
    if request.param == "lint":
        return fxquant.lint
    return fxquant.check


def test_seed_model_names_the_two_inplace_lines_as_the_only_errors(run):
    """The `out *=` lines are the errors; the blamed index assignment is not (a warning)."""
    report = run(SeedGCN(), tiny_graph())
    culprits = [at(SEED, line_of(SEED, "out *= 2**e_decimal")),
                at(SEED, line_of(SEED, "out *= 1.0 + torch.sum"))]
    assert sorted(set(locations(report, severity="error"))) == sorted(culprits)
    assert {f.rule for f in report.errors} == {"FXQ001"}
    victim = at(SEED, line_of(SEED, "out = ((-1) ** s)"))
    assert all(f.related == "pow" and f.saved_by.endswith(victim) for f in report.errors)
    setitem = at(SEED, line_of(SEED, "bit_x[self.super_node, :, 12:] = 0"))
    assert locations(report, "FXQ002") == [setitem]


def test_seed_model_factory_anomaly_and_zero_derivative_warnings(run):
    """Every torch.arange / torch.Tensor without device=, the anomaly switch, floor and sign."""
    report = run(SeedGCN(), tiny_graph())
    factories = {at(SEED, line_of(SEED, t)) for t in (
        "exponent_bits = torch.arange(num_bits)", "torch.arange(0, 1)", "torch.arange(1, 1 + num_e_bits)",
        "torch.arange(1 + num_e_bits, 1 + num_e_bits + num_m_bits)", "exponents = -torch.arange",
        "torch.Tensor([2.0])")}
    assert factories <= set(locations(report, "FXQ005"))
    assert locations(report, "FXQ006") == [at(SEED, line_of(SEED, "set_detect_anomaly(True)"))]
    zero = {at(SEED, line_of(SEED, t)) for t in ("torch.sign(f)", "torch.floor(torch.log2(f))",
                                                  "return torch.floor(2 * out)")}
    assert zero <= set(locations(report, "FXQ007"))


def test_check_names_parameters_upstream_of_the_bitplane_path():
    """Both convs sit upstream of a bit-plane round trip: zero gradient, by name."""
    report = fxquant.check(SeedGCN(), tiny_graph())
    starved = {f.node for f in report.by_rule("FXQ008")}
    assert starved == {"conv1.bias", "conv1.lin.weight", "conv2.bias", "conv2.lin.weight"}
    assert all("cut at" in f.message for f in report.by_rule("FXQ008"))


def test_the_seed_error_is_real_and_the_victim_is_what_anomaly_mode_names():
    """Plain autograd fails on the round trip, and anomaly mode blames the pow line (the
    victim), not either `*=` line (the culprits fxquant names)."""
    x = torch.rand(5, 3, requires_grad=True) + 0.5
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        bitplane_roundtrip(x).sum().backward()
    with warnings.catch_warnings(record=True) as caught, torch.autograd.detect_anomaly():
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            bitplane_roundtrip(x).sum().backward()
    traceback = "\n".join(str(w.message) for w in caught)
    named = [int(n) for n in re.findall(rf'File "{re.escape(str(SEED))}", line (\d+)', traceback)]
    assert named and named[-1] == line_of(SEED, "out = ((-1) ** s)")
    assert not {line_of(SEED, "out *= 2**e_decimal"), line_of(SEED, "out *= 1.0 + torch.sum")} \
        & set(named)


def test_leaf_fill_is_an_error(run):
    """Seed 2: X.fill_(0) on a leaf that requires grad."""
    report = run(FillLeaf(), torch.rand(3, 4))
    assert [(f.rule, f.where.rsplit("/", 1)[-1]) for f in report.errors] == [
        ("FXQ003", at(LINT, line_of(LINT, "self.X.fill_(0)")))]


def test_data_write_is_found(run):
    """Seed 2: X.data *= 2 after pow saved X gives a silently wrong gradient. lint (no
    backward) warns about `.data` (FXQ004); check compares the real gradients with those
    the forward's values imply and reports the error at the write (FXQ012), victim pow."""
    report = run(DataScale(), torch.rand(3, 4))
    line = at(LINT, line_of(LINT, "self.X.data *= 2"))
    assert locations(report, "FXQ004") == [line]
    assert not report.by_rule("FXQ001")
    if report.mode == "check":
        (error,) = report.errors
        assert (error.rule, error.where.rsplit("/", 1)[-1], error.related) == ("FXQ012", line, "pow")
        assert "'X'" in error.message
    else:
        assert not report.errors


def test_detach_add_after_pow_is_an_error(run):
    """Seed 2: X.detach().add_(100) after Y = X ** 2 fails at backward; pow is the victim."""
    model = DetachAdd()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        model(torch.rand(3, 4)).backward()
    model = DetachAdd()
    report = run(model, torch.rand(3, 4))
    assert [(f.rule, f.where.rsplit("/", 1)[-1]) for f in report.errors] == [
        ("FXQ001", at(LINT, line_of(LINT, "self.X.detach().add_(100)")))]
    assert report.errors[0].related == "pow"


def test_no_false_errors_on_legal_inplace_ops(run, graph):
    """relu_ on a Linear output, F.relu(inplace=True) after a conv, setitem on fresh zeros."""
    report = run(LegalInplace(), graph.x, graph.edge_index)
    assert not report.errors and not report.by_rule("FXQ002"), str(report)


@pytest.mark.parametrize("model", [GCN(), PygGCN(4, 8, num_layers=2, out_channels=2)])
def test_plain_pyg_gcn_is_clean(run, model, graph):
    """A plain GCN (hand-written or PyG's) has no findings at all."""
    report = run(model, graph.x, graph.edge_index)
    assert not report.findings, str(report)


def test_transformed_gcn_is_clean(run, graph):
    """fxquant's own truncation nodes pass the checks (straight-through gradient)."""
    gm = fxquant.transform(GCN(), bits=10)
    assert not run(gm, graph.x, graph.edge_index).findings


def test_nothing_is_left_behind_even_when_the_model_raises(run):
    """Anomaly/grad mode, RNG, parameters and .grad are as before; the error is reported."""
    model = Raises()
    model.lin.weight.grad = torch.full_like(model.lin.weight, 7.0)
    state = copy.deepcopy(model.state_dict())
    x = torch.rand(2, 4)
    rng = torch.get_rng_state()
    with torch.no_grad():
        report = run(model, x)
        assert torch.is_grad_enabled() is False
    assert not torch.is_anomaly_enabled()
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert torch.equal(model.lin.weight.grad, torch.full_like(model.lin.weight, 7.0))
    assert [f.rule for f in report.errors] == ["FXQ009"]  # (weight.data.mul_ is FXQ014, a warning)
    assert re.search(r"lint_models\.py:\d+$", report.errors[0].where)
    assert report.by_rule("FXQ006") and report.by_rule("FXQ004")


def test_inputs_are_not_written():
    """The example inputs are copied before the forward runs."""

    class WritesInput(torch.nn.Module):
        def forward(self, x):
            x.mul_(2)
            return x

    x = torch.ones(3)
    fxquant.lint(WritesInput(), x)
    fxquant.check(WritesInput(), x)
    assert torch.equal(x, torch.ones(3))


def test_check_with_a_loss_function(graph):
    """loss_fn picks what backward starts from; parameters it does not reach are named."""
    model = GCN()
    report = fxquant.check(model, graph.x, graph.edge_index, loss_fn=lambda out: out[:, 0].sum() * 0)
    assert {f.node for f in report.by_rule("FXQ008")} == {n for n, _ in model.named_parameters()}


def test_module_caches_are_not_left_behind(graph):
    """GCNConv(cached=True) caches the example graph; lint and check put the cache back."""
    from torch_geometric.nn import GCNConv

    conv = GCNConv(4, 2, cached=True)
    fxquant.lint(conv, graph.x, graph.edge_index)
    fxquant.check(conv, graph.x, graph.edge_index)
    assert conv._cached_edge_index is None
