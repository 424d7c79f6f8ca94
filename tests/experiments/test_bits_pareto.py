"""experiments/bits_pareto.py: the command-line contract other tools call (1 seed, 2 epochs)."""

from __future__ import annotations

import json

import pytest
import torch

from experiments import bits_pareto, training
from fxquant.recipes import RECOMMENDED, QuantTraining
from tests.support.data import needs_data

pytestmark = needs_data

FIELDS = {"method", "target_bits", "avg_bits", "input_bits", "avg_bits_with_input", "accs",
          "fp32_accs"}


def _cora():
    return training.load_data("Cora", None, "test")[0]


def _train(gm, data, epochs, target, within_budget=False, anneal=0):
    """(test accuracy, bits, within budget) of bits_pareto's training of ``gm``."""
    run = QuantTraining(gm, target_bits=target, anneal_every=anneal,
                        anneal_bits=bits_pareto.ANNEAL_BITS, penalty=bits_pareto.DEFAULTS.penalty,
                        bits_lr=bits_pareto.DEFAULTS.bits_lr,
                        select="budget" if within_budget else "best-val")
    result = training.fit(gm, data, epochs, run=run, progress=False)
    return result.test, result.bits, result.within_budget and within_budget


def _spy_bit_report(monkeypatch) -> list:
    """Record ``(inputs, avg_bits)`` of every ``fxquant.bit_report`` call."""
    import fxquant

    calls = []
    real = fxquant.bit_report

    def spy(gm, *inputs, **kwargs):
        report = real(gm, *inputs, **kwargs)
        calls.append((inputs, report.avg_bits))
        return report

    monkeypatch.setattr(fxquant.recipes.core, "bit_report", spy)
    return calls


@pytest.mark.parametrize("method", bits_pareto.METHODS)
def test_json_contract(method, tmp_path, capsys):
    out = tmp_path / f"{method}.json"
    refit = ["--lsq-refit", "2"] if method in bits_pareto.LSQ_METHODS else []
    # (formats take 5 bits or more)
    epochs = "2"
    targets = [5.0, 6.0] if method == "format" else [2.0, 3.0]
    bits_pareto.main(["--method", method, "--target-bits", ",".join(f"{t:g}" for t in targets),
                      "--seeds", "1", "--epochs", epochs, "--dataset", "Cora", "--json",
                      str(out), *refit])
    payload = json.loads(out.read_text())
    assert [r["target_bits"] for r in payload["results"]] == targets
    if method == "recommended":  # the recipe's own grid, step and refits, not the flags'
        assert payload["signed_grid"] == "midrise" and payload["shared_step"] is True
        assert payload["lsq_refit"] == RECOMMENDED[1].get("refit_epochs", 0)
    else:
        assert payload["signed_grid"] == "symmetric" and payload["shared_step"] is False
        assert payload["lsq_refit"] == (2 if refit else 0)
    for result in payload["results"]:
        assert set(result) >= FIELDS
        assert result["method"] == method and len(result["accs"]) == 1
        assert len(result["fp32_accs"]) == 1 and result["fp32_accs"] == payload["fp32_accs"]
        assert result["input_bits"] == pytest.approx(1.0, abs=0.1)  # uint1, per-row scale
        assert result["avg_bits"] > 0
    assert "| Cora |" in capsys.readouterr().out


def test_signed_grid_and_shared_step_flags(tmp_path):
    out = tmp_path / "old.json"
    bits_pareto.main(["--method", "learned", "--target-bits", "2", "--seeds", "1", "--epochs",
                      "1", "--signed-grid", "midrise", "--shared-step", "--penalty", "10",
                      "--json", str(out)])
    payload = json.loads(out.read_text())
    assert payload["signed_grid"] == "midrise" and payload["shared_step"] is True
    assert payload["penalty"] == 10
    assert bits_pareto._label(payload, "learned") == "learned (midrise, shared step, penalty 10)"
    with pytest.raises(SystemExit):
        bits_pareto.main(["--signed-grid", "zero"])


def test_bits_are_those_of_the_best_validation_epoch(monkeypatch):
    """Learned bit-widths fall while training: the bits reported are counted on the
    evaluation that gave the reported accuracy, not on the final model."""
    import fxquant

    data = _cora()
    real = fxquant.bit_report
    calls = _spy_bit_report(monkeypatch)
    torch.manual_seed(0)
    model = training.make_model("gcn", data.num_features, 7)
    gm = fxquant.transform(model, bits_pareto.mapping_for("learned", 2.6, data), lint="off")
    _, report, met = _train(gm, data, 30, 2.6)
    assert met is False  # no budget asked for
    assert calls and all(inputs == () for inputs, _ in calls)  # counted, not run again
    assert report.avg_bits == calls[-1][1]
    final = real(gm, data.x, data.edge_index).avg_bits
    assert final < calls[0][1]  # the bits did fall: the epoch matters
    fp32 = training.make_model("gcn", data.num_features, 7)
    assert _train(fp32, data, 2, None)[1] is None


@pytest.mark.parametrize("target", [2.6, 3.4])
def test_select_within_budget_reports_an_epoch_that_meets_it(monkeypatch, target):
    """--select budget: the best validation epoch among those whose counted bits are
    within the target. The widths start at 4 bits (4.11 counted) and fall to 3 (3.11) in
    the first epochs: 3.4 is met from then on, 2.6 never (the best epoch overall is
    returned, flagged)."""
    import fxquant

    data = _cora()
    calls = _spy_bit_report(monkeypatch)
    torch.manual_seed(0)
    model = training.make_model("gcn", data.num_features, 7)
    gm = fxquant.transform(model, bits_pareto.mapping_for("learned", 2.6, data), lint="off")
    _, report, met = _train(gm, data, 30, target, within_budget=True)
    seen = [bits for _, bits in calls]
    assert len(seen) >= 30  # every epoch counted
    assert met == any(b <= target for b in seen) == (target == 3.4)
    assert seen[0] > 3.4  # the first epochs do not compete
    assert (report.avg_bits <= target) == met


def test_from_json_and_plot(tmp_path):
    out = tmp_path / "int.json"
    bits_pareto.main(["--method", "int", "--target-bits", "4", "--seeds", "1", "--epochs", "1",
                      "--json", str(out)])
    png = tmp_path / "p.png"
    payloads = bits_pareto.main(["--from-json", str(out), "--plot", str(png)])
    assert png.stat().st_size > 1000 and payloads[0]["results"][0]["method"] == "int"


@pytest.mark.parametrize("quantile", [0.9, 0.7])
def test_hub_messages_rule_and_last_aggregate_bits(quantile):
    """--degree-rule hub-messages: every site at floor(B) bits, the messages into the hubs
    (above the --hub-quantile of in-degrees) one fewer; --last-aggregate-bits sets the
    logits-side aggregation. Nothing is stored for the widths (they follow from the
    graph)."""
    import fxquant

    data = _cora()
    opts = bits_pareto.Options(signed_grid="midrise", degree_rule="hub-messages",
                               last_aggregate_bits=4, hub_quantile=quantile)
    torch.manual_seed(0)
    model = training.make_model("gcn", data.num_features, 7)
    gm = fxquant.transform(model, bits_pareto.mapping_for("degree", 2.0, data, opts), lint="off")
    report = fxquant.bit_report(gm, data.x, data.edge_index)
    sites = {(s.layer, s.site): s for s in report.sites}
    degree = torch.bincount(data.edge_index[1], minlength=data.num_nodes)
    hubs = degree > torch.quantile(degree.float(), opts.hub_quantile)
    messages = int((degree[hubs] + 1).sum())  # each hub's in-edges and its self loop
    for layer in ("conv1", "conv2"):
        assert sites[(layer, "message")].histogram == {
            1: messages, 2: data.edge_index.shape[1] + data.num_nodes - messages}
    for key in (("conv1", "aggregate"), ("conv1", "output"), ("conv2", "input")):
        assert sites[key].histogram == {2: data.num_nodes}
    assert sites[("conv2", "aggregate")].histogram == {4: data.num_nodes}
    value_bits = sum(s.value_bits for s in report.sites if not s.raw_input)
    steps = 32 * sum(1 for s in report.sites if not s.raw_input)
    assert report.avg_bits * sum(s.values for s in report.sites if not s.raw_input) == \
        pytest.approx(value_bits + steps)  # only the steps' storage
    assert report.avg_bits < 2.0


def test_anneal_starts_two_bits_above_and_drops_one_every_e_epochs():
    import fxquant

    data = _cora()
    opts = bits_pareto.Options(signed_grid="midrise", degree_rule="hub-messages")
    torch.manual_seed(0)
    model = training.make_model("gcn", data.num_features, 7)
    gm = fxquant.transform(model, bits_pareto.mapping_for("degree", 2.0, data, opts), lint="off")
    point = gm.get_submodule("conv1_message_quant")
    final = point.node_widths.bits.clone()
    seen = []
    point.register_forward_pre_hook(
        lambda m, args: seen.append(float((m.node_widths.bits - final).mean())) if m.training
        else None)
    _, report, met = _train(gm, data, 5, 2.0, within_budget=True, anneal=2)
    assert seen == [2.0, 2.0, 1.0, 1.0, 0.0]
    assert torch.equal(point.node_widths.bits, final)
    assert met and report.avg_bits < 2.0  # --select budget: the annealing epochs do not compete


def test_degree_flags_in_the_json_and_their_errors(tmp_path, capsys):
    out = tmp_path / "hubs.json"
    bits_pareto.main(["--method", "degree", "--degree-rule", "hub-messages", "--target-bits",
                      "2", "--seeds", "1", "--epochs", "2", "--signed-grid", "midrise",
                      "--anneal", "1", "--anneal-refit", "1", "--last-aggregate-bits", "4",
                      "--select", "budget", "--refit-widen", "--json", str(out)])
    payload = json.loads(out.read_text())
    assert (payload["degree_rule"], payload["anneal"], payload["anneal_refit"],
            payload["last_aggregate_bits"], payload["refit_widen"]) == ("hub-messages", 1, 1, 4,
                                                                        True)
    assert bits_pareto._label(payload, "degree") == ("degree (midrise, hub-messages, last "
                                                     "aggregate 4 bits, anneal 1, refit 1 "
                                                     "after each drop, within budget)")
    for bad, message in ((["--method", "learned", "--anneal", "5"], "--anneal"),
                         (["--method", "degree", "--anneal-refit", "5"], "--anneal-refit"),
                         (["--method", "degree", "--anneal", "5", "--anneal-refit", "-1"],
                          "--anneal-refit"),
                         (["--method", "topn", "--last-aggregate-bits", "4"],
                          "--last-aggregate-bits"),
                         (["--method", "int", "--last-aggregate-bits", "9"], "--last-aggregate-bits"),
                         (["--method", "int", "--last-aggregate-bits", "1"], "--last-aggregate-bits"),
                         (["--method", "learned", "--max-bits", "1"], "--max-bits"),
                         (["--method", "int", "--max-bits", "4"], "--max-bits"),
                         (["--method", "int", "--bits-lr", "0.1"], "--bits-lr"),
                         (["--method", "degree", "--hub-quantile", "0.5"], "--hub-quantile"),
                         (["--method", "degree", "--refit-widen"], "--refit-widen"),
                         (["--method", "degree", "--degree-rule", "hub-messages",
                           "--hub-quantile", "1"], "--hub-quantile")):
        with pytest.raises(SystemExit):
            bits_pareto.main(bad)
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("how, tables", [("layer", 2), ("all", 1)])
def test_shared_bits_one_table_per_layer_or_model(how, tables, tmp_path):
    import fxquant

    data = _cora()
    model = training.make_model("gcn", data.num_features, 7)
    args = bits_pareto.parse_args(["--method", "learned", "--shared-bits", how])
    gm = bits_pareto.prepare("learned", 2.0, data, model, args).model
    points = [m for m in gm.modules() if isinstance(m, fxquant.QuantPoint)
              and m.node_widths is not None and m.node_widths.learned]
    assert len(points) == 6 and len({id(m.node_widths.bits) for m in points}) == tables
    if how == "layer":
        assert all(m.node_widths.bits is points[0].node_widths.bits for m in points if m.layer == "conv1")
    out = tmp_path / "shared.json"
    bits_pareto.main(["--method", "learned", "--target-bits", "2", "--seeds", "1", "--epochs",
                      "1", "--shared-bits", how, "--bits-lr", "0.02", "--json", str(out)])
    payload = json.loads(out.read_text())
    assert (payload["shared_bits"], payload["bits_lr"]) == (how, 0.02)
    assert bits_pareto._label(payload, "learned").endswith(
        f"bits shared per {'model' if how == 'all' else 'layer'}, bits lr 0.02)")
    with pytest.raises(SystemExit):
        bits_pareto.main(["--method", "int", "--shared-bits", how])


def test_select_budget_judges_fixed_bits_too():
    """Uniform int3 with its float32 steps counts 3.0004 bits: over a budget of 3.0, within
    3.1; the flag says so for fixed bit-widths as for learned ones."""
    import fxquant

    data = _cora()
    for target, within in ((3.0, False), (3.1, True)):
        torch.manual_seed(0)
        model = training.make_model("gcn", data.num_features, 7)
        gm = fxquant.transform(model, bits_pareto.mapping_for("int", target, data), lint="off")
        _, report, met = _train(gm, data, 2, target, within_budget=True)
        assert met is within and report.avg_bits == pytest.approx(3.0, abs=1e-3)


def test_recommended_runs_the_chosen_recipe_and_takes_no_other_flag(tmp_path, capsys):
    """--method recommended: the chosen recipe with its chosen settings, today's JSON fields
    plus the recipe that ran; a flag it would ignore is a usage error naming it."""
    import fxquant

    out = tmp_path / "recommended.json"
    bits_pareto.main(["--method", "recommended", "--target-bits", "2", "--seeds", "1",
                      "--epochs", "3", "--dataset", "Cora", "--json", str(out)])
    payload = json.loads(out.read_text())
    (result,) = payload["results"]
    assert set(result) >= FIELDS | {"budget_met"} and result["method"] == "recommended"
    name, settings = fxquant.recipes.RECOMMENDED
    assert payload["recipe"]["name"] == name
    assert all(payload["recipe"]["settings"][k] == v for k, v in settings.items())
    assert payload["select"] == "budget" and payload["signed_grid"] == "midrise"
    assert "recommended (" in capsys.readouterr().out
    for flag in (["--penalty", "3"], ["--shared-step"], ["--anneal", "5"], ["--select", "budget"]):
        with pytest.raises(SystemExit):
            bits_pareto.parse_args(["--method", "recommended", *flag])
        assert flag[0] in capsys.readouterr().err


def test_first_seed_runs_the_same_seeds_as_one_command(tmp_path):
    """--first-seed S --seeds N gives seeds S.. exactly as a run from seed 0 gives them."""
    both, last = tmp_path / "both.json", tmp_path / "last.json"
    common = ["--method", "int", "--target-bits", "2", "--epochs", "2", "--dataset", "Cora"]
    bits_pareto.main([*common, "--seeds", "2", "--json", str(both)])
    bits_pareto.main([*common, "--seeds", "1", "--first-seed", "1", "--json", str(last)])
    a, b = json.loads(both.read_text()), json.loads(last.read_text())
    assert b["first_seed"] == 1 and "first_seed" not in a
    assert b["fp32_accs"] == a["fp32_accs"][1:]
    assert b["results"][0]["accs"] == a["results"][0]["accs"][1:]
    assert b["results"][0]["avg_bits_per_seed"] == a["results"][0]["avg_bits_per_seed"][1:]
    with pytest.raises(SystemExit):
        bits_pareto.parse_args(["--first-seed", "-1"])
