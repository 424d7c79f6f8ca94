"""The per-node bits selection, the held-out graphs and the training traces, and the
planted-community generator's degree skew (tiny sizes; the numbers are the scripts' own)."""

from __future__ import annotations

import json

import pytest
import torch

from experiments import heldout_bits, select_bits, trace_training
from experiments.graphs import planted_communities
from tests.support.data import needs_data


def test_planted_communities_skew_gives_hubs_and_keeps_homophily():
    """skew > 0 makes in-degrees heavy-tailed; p_in still sets the share of edges inside a
    community; the masks split the nodes."""
    flat = planted_communities(2000, 8000, 4, 4, p_in=0.9, seed=1)
    skewed = planted_communities(2000, 8000, 4, 4, p_in=0.9, seed=1, skew=1.0)
    for g in (flat, skewed):
        same = float((g.y[g.edge_index[0]] == g.y[g.edge_index[1]]).float().mean())
        assert 0.88 < same < 0.96
        masks = g.train_mask.int() + g.val_mask.int() + g.test_mask.int()
        assert bool((masks == 1).all())
    deg = [torch.bincount(g.edge_index[1], minlength=2000) for g in (flat, skewed)]
    assert int(deg[1].max()) > 20 * int(deg[0].max())


def test_planted_communities_without_skew_is_the_graph_it_was():
    """skew=0 draws exactly as before the knob existed (bench_scale's graphs are unchanged)."""
    g = torch.Generator().manual_seed(3)
    n, e, classes = 300, 1200, 4
    y = torch.arange(n) * classes // n
    start = torch.arange(classes) * n // classes
    size = torch.diff(torch.cat([start, torch.tensor([n])]))
    src = torch.randint(0, n, (e,), generator=g)
    inside = torch.rand(e, generator=g) < 0.8
    offset = (torch.rand(e, generator=g) * size[y[src]]).long()
    dst = torch.where(inside, start[y[src]] + offset, torch.randint(0, n, (e,), generator=g))
    data = planted_communities(n, e, 5, classes, seed=3)
    assert torch.equal(data.edge_index, torch.stack([src, dst]))


def test_selection_needs_every_seed_within_budget_and_both_datasets():
    """The choice: highest joint mean validation accuracy among candidates whose every
    trial met the budget, over the seeds both datasets ran; test accuracy plays no part."""
    def row(name, dataset, seed, val, met=True, test=0.5):
        return {"candidate": name, "recipe": "r", "settings": {}, "dataset": dataset,
                "seed": seed, "val": val, "avg_bits": 2.0, "budget_met": met, "test": test}

    rows = [row("a", "Cora", 0, 0.80), row("a", "CiteSeer", 0, 0.70, test=0.1),
            row("b", "Cora", 0, 0.90), row("b", "CiteSeer", 0, 0.70, met=False, test=0.9),
            row("c", "Cora", 0, 0.79), row("c", "CiteSeer", 0, 0.70, test=0.9),
            row("d", "Cora", 0, 0.99)]  # one dataset only: not a candidate yet
    summary = select_bits.summarize(rows, score_seeds=(0,))
    assert [s["candidate"] for s in summary] == ["a", "c", "b"]
    assert summary[0]["score"] == 0.75
    assert "chosen: a" not in select_bits.report(rows)  # seeds 1 and 2 not run yet
    assert "chosen: none" in select_bits.report(rows)


def test_selection_scores_every_candidate_on_the_same_seeds():
    """A candidate with a bad extra seed is not ranked below one that never ran it: the
    score is over the scoring seeds; candidates without all of them are not chosen."""
    def row(name, dataset, seed, val):
        return {"candidate": name, "recipe": "r", "settings": {}, "dataset": dataset,
                "seed": seed, "val": val, "avg_bits": 2.0, "budget_met": True, "test": 0.5}

    rows = [row(n, d, s, v) for n, v in (("a", 0.8), ("b", 0.79)) for d in ("Cora", "CiteSeer")
            for s in (0, 1, 2)]
    rows += [row("a", "CiteSeer", 3, 0.1), row("a", "Cora", 3, 0.8)]  # a's extra seed fails
    rows += [row("c", d, 0, 0.95) for d in ("Cora", "CiteSeer")]  # one seed only
    summary = select_bits.summarize(rows, score_seeds=(0, 1, 2))
    assert [s["candidate"] for s in summary] == ["a", "b", "c"]
    assert summary[0]["score"] == pytest.approx(0.8) and summary[0]["seeds_all"] == [0, 1, 2, 3]
    assert summary[0]["val_all"]["CiteSeer"] == pytest.approx((3 * 0.8 + 0.1) / 4)
    assert not summary[2]["eligible"]
    assert "chosen: a" in select_bits.report(rows)


@pytest.mark.parametrize("argv, flag", [
    (["--datasets", "PubMed"], "--datasets"),
    (["--candidates", ","], "--candidates"),
    (["--seeds", "0,x"], "--seeds"),
    (["--epochs", "0"], "--epochs"),
    (["--jobs", "0"], "--jobs"),
    (["--json", "x.json"], "--json"),
    (["--report", "--trials", "no/such/trials.jsonl"], "--trials"),
    (["--report", "--seeds", "3"], "--seeds"),
    (["--merge", "a.json", "--epochs", "5", "--json", "m.json"], "--epochs"),
    (["--merge", "no/such/a.json", "--json", "m.json"], "--merge"),
])
def test_select_bits_refuses_bad_flags_before_any_work(argv, flag, tmp_path, capsys):
    """Exit 2 naming the flag, before a worker starts (where a failing dataset stalled the
    pool) and before anything is written."""
    trials = tmp_path / "trials.jsonl"
    argv = [a if not a.endswith(".json") or "/" in a else str(tmp_path / a) for a in argv]
    if "--trials" not in argv:
        argv += ["--trials", str(trials)]
    with pytest.raises(SystemExit) as e:
        select_bits.main(argv)
    assert e.value.code == 2
    assert flag in capsys.readouterr().err.strip().splitlines()[-1]
    assert not trials.exists() and not (tmp_path / "m.json").exists()


def test_select_bits_reports_trials_of_one_epoch_count(tmp_path, capsys):
    """Trials of different epoch counts are not compared: --report asks which, --epochs
    picks them."""
    def row(name, dataset, seed, epochs, val):
        return {"candidate": name, "recipe": "r", "settings": {}, "dataset": dataset,
                "seed": seed, "epochs": epochs, "val": val, "avg_bits": 2.0,
                "budget_met": True, "test": 0.5}

    rows = [row(n, d, s, e, v) for n, e, v in (("a", 200, 0.7), ("b", 2, 0.9))
            for d in ("Cora", "CiteSeer") for s in (0, 1, 2)]
    trials = tmp_path / "trials.jsonl"
    trials.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SystemExit) as e:
        select_bits.main(["--report", "--trials", str(trials)])
    assert e.value.code == 2 and "--epochs" in capsys.readouterr().err
    assert "chosen: a" in select_bits.main(["--report", "--trials", str(trials), "--epochs", "200"])
    assert "chosen: b" in select_bits.main(["--report", "--trials", str(trials), "--epochs", "2"])


def test_heldout_bits_quick():
    """The held-out run trains FP32 and the recommended recipe on a generated graph."""
    body = heldout_bits.main(["--quick", "--no-write"])
    assert "| 0.7 | 0.5 |" in body


def test_merge_joins_consecutive_seed_ranges():
    """Two runs of one bits_pareto command over seeds 0-1 and 2 give the three-seed JSON;
    gaps or different commands are refused."""

    def payload(first, accs, bits):
        p = {"dataset": "Cora", "model": "gcn", "epochs": 200, "select": "budget",
             "signed_grid": "midrise", "shared_step": True, "fp32_accs": [0.8] * len(accs),
             "results": [{"method": "recommended", "target_bits": 2.0, "accs": accs,
                          "fp32_accs": [0.8] * len(accs), "budget_met": [True] * len(accs),
                          "avg_bits": bits, "input_bits": 1.0, "avg_bits_with_input": 1.5,
                          "avg_bits_per_seed": [bits] * len(accs)}]}
        if first:
            p["first_seed"] = first
        return p

    merged = select_bits.merge([payload(2, [0.6], 1.9), payload(0, [0.7, 0.8], 1.6)])
    (row,) = merged["results"]
    assert row["accs"] == [0.7, 0.8, 0.6] and len(merged["fp32_accs"]) == 3
    assert row["avg_bits"] == pytest.approx((2 * 1.6 + 1.9) / 3)
    assert "first_seed" not in merged and merged["merged_from"][1] == {"first_seed": 2,
                                                                       "seeds": 1}
    with pytest.raises(ValueError, match="follow on"):
        select_bits.merge([payload(0, [0.7], 1.6), payload(2, [0.6], 1.9)])
    other = payload(1, [0.6], 1.9)
    other["dataset"] = "CiteSeer"
    with pytest.raises(ValueError, match="different commands"):
        select_bits.merge([payload(0, [0.7], 1.6), other])


def test_the_recommended_recipe_is_the_published_choice():
    """fxquant.recipes.RECOMMENDED is the candidate that docs/results/bits_selection.json
    chose from the recorded trials (the same recipe and settings), and the published
    report makes that choice from the published trials."""
    import json

    import fxquant

    payload = json.loads((select_bits.ROOT / "docs" / "results" / "bits_selection.json")
                         .read_text())
    name, settings = select_bits.CANDIDATES[payload["chosen"]]
    chosen = fxquant.recipes.get(name, target_bits=select_bits.TARGET, **settings)
    assert chosen == fxquant.recipes.get("recommended", target_bits=select_bits.TARGET)
    rows = select_bits.load(select_bits.ROOT / payload["trials"])
    assert next(s["candidate"] for s in select_bits.summarize(rows) if s["budget_met"]) \
        == payload["chosen"]


@needs_data
def test_trace_training_logs_every_epoch_of_a_table_row(tmp_path):
    """trace_training: one entry per epoch from the table's own loop (the fit's callback),
    the reported epoch is the run's, ties are a share of the nodes; a float epoch rounds
    nothing in training, and the first rounded epoch's evaluation is the quantized
    model's."""
    import json

    out = tmp_path / "t.json"
    payload = trace_training.main(["--model", "gcn", "--row", "int4-lsq-p", "--epochs", "4",
                                   "--float-epochs", "2", "--lsq-refit", "4",
                                   "--refit-widen", "--json", str(out)])
    assert json.loads(out.read_text()) == payload
    assert [r["epoch"] for r in payload["trace"]] == [0, 1, 2, 3]
    assert payload["reported_epoch"] in range(4)
    assert payload["val"] == payload["trace"][payload["reported_epoch"]]["val"]
    assert all(0.0 <= r["ties"] <= 1.0 and r["abs_logit"] >= 0 for r in payload["trace"])
    assert payload["trace"][2]["abs_logit"] > 0  # fitted steps: not every logit rounds to 0


@needs_data
def test_trace_training_traces_a_recipe_and_its_learned_steps(tmp_path):
    """--recipe: the recipe's own run (its float epochs), every learned point's step and
    clipped share in each evaluation; the two points that share a step show one value; the
    steps are fitted at the first rounded epoch (placeholders of 1 before)."""
    payload = trace_training.main(["--recipe", "recommended", "--target-bits", "2",
                                   "--epochs", "32", "--every", "10", "--steps"])
    assert payload["recipe"]["name"] == "hub-messages"
    assert payload["recipe"]["settings"]["float_epochs"] == 30 == payload["float_epochs"]
    points = [r["points"] for r in payload["trace"]]
    assert len(points) == 32 and all(set(p) == set(points[-1]) for p in points)
    assert {"conv1_message_quant", "conv2_aggregate_quant", "conv2_input_quant"} <= set(points[-1])
    assert points[0]["conv1_message_quant"]["step"] == 1.0
    fitted = points[30]
    assert all(0 < v["step"] < 1 and 0 <= v["clipped"] <= 1 for v in fitted.values())
    assert fitted["conv1_quant"]["step"] == fitted["conv2_input_quant"]["step"]  # shared
    table = trace_training.step_table(payload)
    columns = table.splitlines()[0]
    assert "fitted (epoch 30)" in columns and "(epoch 31)" in columns
    assert columns.index("(epoch 30)") < columns.index("(epoch 31)")  # in epoch order
    early = dict(payload, reported_epoch=12)
    assert columns.count("|") == trace_training.step_table(early).splitlines()[1].count("|")
    assert "placeholder steps" in trace_training.step_table(early)


@needs_data
def test_trace_training_row_prints_what_it_printed(capsys):
    """A row's trace without --steps prints its one table, as before the learned steps
    were traced (they are in the JSON); --steps adds theirs."""
    trace_training.main(["--row", "int4-lsq-p", "--epochs", "2", "--every", "1"])
    out = capsys.readouterr().out
    assert out.count("| epoch |") == 1 and "step," not in out and len(out.splitlines()) == 5
    trace_training.main(["--row", "int8", "--epochs", "1", "--steps"])
    assert "nothing to list" in capsys.readouterr().out


def test_step_trace_counts_values_past_the_grid_and_leaves_no_hook():
    """The clipped share counts values rounded by more than half a step (past the top
    level, or the lowest of a signed grid), not the values a grid rounds within it; the
    hooks go when removed."""
    import fxquant

    config = fxquant.QuantConfig("int2", scale="tensor", range="lsq")
    gm = fxquant.transform(torch.nn.Sequential(torch.nn.Identity()),
                           fxquant.QuantMapping().set_name("0", config))
    point = next(m for m in gm.modules() if isinstance(m, fxquant.QuantPoint))
    gm.train()
    gm(torch.tensor([1.0, -1.0]))  # fits the step on the first training batch
    with torch.no_grad():
        point.log_step.fill_(0.0)  # step 1: levels -2, -1, 0, 1
    steps = trace_training.StepTrace(gm)
    assert len(point._forward_hooks) == 1
    gm.eval()
    gm(torch.tensor([0.2, 0.9, 1.4, 3.0, -2.0, -0.7, -2.7, 1.6]))
    seen = steps.take()
    name = next(iter(seen))
    assert seen[name]["step"] == 1.0
    assert seen[name]["clipped"] == 3 / 8  # 3.0, -2.7 and 1.6 lie past the grid
    assert seen[name]["max_abs"] == 3.0 and seen[name]["grid_max_abs"] == 2.0  # (-2)
    gm.train()
    gm(torch.tensor([5.0]))
    assert steps.take() == {}  # training forwards are not traced
    steps.remove()
    assert len(point._forward_hooks) == 0


def test_zero_channels_counts_rows_of_the_first_weight_rounded_to_zeros():
    """Rows (output channels) of the first two-dimensional rounded weight whose every value
    rounds to zero, in evaluation only; no hook is left behind."""
    import fxquant

    model = torch.nn.Sequential(torch.nn.Linear(4, 3, bias=False), torch.nn.Linear(3, 2))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, -0.5, 0.2, 0.0], [0.01, -0.02, 0.0, 0.03],
                                            [0.0, 0.0, 0.0, 0.0]]))
    config = fxquant.QuantConfig("int4", scale="tensor")  # step 1/7: the second row is < 1/14
    gm = fxquant.transform(model, fxquant.QuantMapping().set_name("0", config, site="weight")
                           .set_name("1", config, site="weight"))
    zeros = trace_training.ZeroChannels(gm)
    assert zeros.name is not None and "'0'" in zeros.name  # the first layer's weight
    gm.train()
    gm(torch.ones(5, 4))
    assert zeros.take() == {}  # training forwards are not traced
    gm.eval()
    gm(torch.ones(5, 4))
    seen = zeros.take()
    assert (seen["zero_channels"], seen["channels"]) == (2, 3)
    zeros.remove()
    assert not any(m._forward_hooks for m in gm.modules())


def _point_with_step_one(config, first_batch):
    import fxquant

    gm = fxquant.transform(torch.nn.Sequential(torch.nn.Identity()),
                           fxquant.QuantMapping().set_name("0", config))
    gm.train()
    gm(first_batch)  # fits the step
    point = next(m for m in gm.modules() if isinstance(m, fxquant.QuantPoint))
    with torch.no_grad():
        point.log_step.fill_(0.0)
    return gm.eval()


def test_step_trace_clipping_is_the_grids_not_the_rounding_error():
    """Stochastic rounding moves values inside the grid by up to a step: none of them is
    past the edge. Per-node widths: each row against its own grid; an unsigned grid's
    negatives (what a ReLU would zero) are not counted."""
    import fxquant

    gm = _point_with_step_one(fxquant.QuantConfig("int2", "stochastic", scale="tensor",
                                                  range="lsq"), torch.tensor([1.0, -1.0]))
    steps = trace_training.StepTrace(gm)
    torch.manual_seed(0)
    gm(torch.linspace(-2.4, 1.4, 1000))  # levels -2..1: every value within half a step
    assert next(iter(steps.take().values()))["clipped"] == 0.0
    gm(torch.tensor([0.5, 1.6, -2.6, 0.0]))
    assert next(iter(steps.take().values()))["clipped"] == 0.5
    bits = fxquant.NodeBits(torch.tensor([1.0, 2.0]), min_bits=1, max_bits=2)
    gm = _point_with_step_one(fxquant.QuantConfig("uint8", scale="tensor", range="lsq",
                                                  node_bits=bits),
                              torch.tensor([[1.0, 0.5], [2.0, 1.0]]))
    steps = trace_training.StepTrace(gm)
    gm(torch.tensor([[1.4, -0.7], [1.4, 3.6]]))  # row 0 tops at 1, row 1 at 3
    assert next(iter(steps.take().values()))["clipped"] == 0.25


@pytest.mark.parametrize("argv, flag", [
    (["--recipe", "recommended", "--row", "int4"], "--row"),
    (["--recipe", "recommended", "--float-epochs", "3"], "--float-epochs"),
    (["--recipe", "hub-messages", "--lsq-refit", "3"], "--lsq-refit"),
    (["--recipe", "hub-messages", "--step-lr", "0.1"], "--step-lr"),
    (["--recipe", "hub-messages", "--protect", "0:0.1"], "--protect"),
    (["--target-bits", "2"], "--target-bits"),
    (["--recipe", "lsq-protect", "--target-bits", "2"], "--target-bits"),
    (["--recipe", "hub-messages", "--target-bits", "nan"], "--target-bits"),
    (["--recipe", "recommended", "--epochs", "30"], "--epochs"),
    (["--recipe", "recommended", "--target-bits", "40"], "--target-bits"),
    (["--recipe", "recommended", "--epochs", "0"], "--epochs"),
    (["--row", "int9"], "--row"),
    (["--row", "fp32", "--lsq-refit", "3"], "--lsq-refit"),
    (["--row", "fp32", "--float-epochs", "3"], "--float-epochs"),
    (["--row", "int4", "--step-lr", "0.5"], "--step-lr"),
    (["--row", "int4-dq", "--lsq-refit", "5"], "--lsq-refit"),
    (["--lsq-refit", "31", "--float-epochs", "30", "--refit-widen"], "--refit-widen"),
    (["--row", "int4-lsq-pe", "--model", "gin"], "--model gin"),
    (["--epochs", "0"], "--epochs"),
    (["--step-lr", "-1"], "--step-lr"),
    (["--json", "/nonexistent-folder/t.json"], "--json"),
    (["--step-lr", "inf"], "--step-lr"),
    (["--epochs", "5", "--float-epochs", "5"], "--float-epochs"),
    (["--row", "int8", "--protect", "0.1:0.5"], "--protect"),
    (["--row", "int4-lsq-p", "--eval-rng", "fork"], "--eval-rng"),
    (["--recipe", "hub-messages", "--eval-rng", "fork"], "--eval-rng"),
])
def test_trace_training_refuses_bad_flags_before_any_work(argv, flag, capsys):
    """A flag that would be ignored, or fail after training, exits 2 naming it (on the
    error line: argparse's usage line lists every flag)."""
    with pytest.raises(SystemExit) as e:
        trace_training.main(argv)
    assert e.value.code == 2
    assert flag in capsys.readouterr().err.strip().splitlines()[-1]
