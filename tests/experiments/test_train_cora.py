"""experiments/train_cora.py and dq_table.py: real Cora training through truncations, and
the drivers' command lines."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch_geometric.transforms as T

import fxquant
from experiments import cli, dq_table, train_cora, training
from fxquant.datasets import load_planetoid
from tests.support.data import needs_data


@pytest.fixture(scope="session")
def cora():
    return load_planetoid("Cora", transform=T.NormalizeFeatures())


@needs_data
@pytest.mark.slow
def test_transformed_gcn_learns_cora(cora):
    """20 epochs through 10-bit truncations: far above chance (14%), first layer learns."""
    data = cora[0]
    cfg = train_cora.Config("top-10", 10, "nearest")
    model = train_cora.build(cfg, data, cora.num_classes, seed=0)
    assert len(fxquant.summary(model).splitlines()) == 4
    acc = training.fit(model, data, 20, desc="test").test
    assert acc > 0.6
    model.train()
    model.zero_grad()
    out = model(data.x, data.edge_index)
    torch.nn.functional.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
    assert model.conv1.lin.weight.grad.abs().sum() > 0


@needs_data
def test_script_smoke_with_json(tmp_path, capsys):
    """Argument parsing, the summary, lint report and table, and --json, on 2 epochs."""
    out = tmp_path / "r.json"
    configs = train_cora.main(["--sweep", "16,e4m3", "--rounding", "nearest", "--seeds", "1",
                               "--epochs", "2", "--json", str(out), "--super-nodes", "0.1:12"])
    printed = capsys.readouterr().out
    assert "fxquant lint (dynamic): no findings" in printed and "| config" in printed
    assert [c.name for c in configs] == ["FP32", "top-16", "e4m3 (tensor)"]
    payload = json.loads(out.read_text())
    assert [r["bits"] for r in payload["results"]] == [32, 16, 8]
    assert all(len(r["accs"]) == 1 for r in payload["results"])
    assert all(len(r["vals"]) == 1 and 0 <= r["vals"][0] <= 1 for r in payload["results"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bits", "40"], "--bits: must be in 1..32"),
        (["--plot", "x.png"], "--plot needs --sweep"),
        (["--sweep", "16,e9z"], "unknown format 'e9z'"),
        (["--super-nodes", "2:8"], "FRACTION:BITS"),
        (["--bits", "8", "--format", "e4m3"], "not allowed with"),
        (["--seeds", "0"], "must be >= 1"),
        (["--lsq-refit", "-3"], "number of epochs (0 or more), got '-3'"),
    ],
)
def test_script_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit):
        train_cora.parse_args(argv)
    assert message in capsys.readouterr().err


def test_no_data_gives_one_clear_message(tmp_path, monkeypatch):
    """No data folder: one message naming --root / FXQUANT_DATA and what the folder holds,
    and no download attempt."""
    from torch_geometric.datasets import Planetoid

    def no_download(self):
        raise AssertionError("must not try to download")

    monkeypatch.setattr(Planetoid, "download", no_download)
    monkeypatch.delenv("FXQUANT_DATA", raising=False)
    monkeypatch.setenv("FXQUANT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SystemExit) as e:
        train_cora.main(["--root", str(tmp_path / "nothing"), "--seeds", "1", "--epochs", "1"])
    message = str(e.value)
    assert "--root" in message and "FXQUANT_DATA" in message and "ind.cora" in message
    assert "root=" not in message.replace("--root", "")


@needs_data
def test_sites_contract_smoke(tmp_path, capsys):
    """The command-line contract of the inside-the-layer flags, on 2 epochs of one seed:
    --sites all, an integer --format, --range, --protect; --json keeps its schema."""
    out = tmp_path / "r.json"
    configs = train_cora.main(["--sites", "all", "--format", "int4", "--range", "lsq",
                               "--protect", "0.0:0.2", "--seeds", "1", "--epochs", "2",
                               "--json", str(out)])
    printed = capsys.readouterr().out
    assert "conv1_message_quant" in printed and "weight lin.weight" in printed
    payload = json.loads(out.read_text())
    results = payload["results"]
    assert results[0]["name"] == "FP32" and all(len(r["accs"]) == 1 for r in results)
    assert results[1]["sites"] == ["input", "weight", "message", "aggregate", "output"]
    assert results[1]["range"] == "lsq" and results[1]["protect"] == [0.0, 0.2]
    assert [c.name for c in configs] == ["FP32", "int4 (tensor, lsq)"]


def test_lsq_refit_refits_the_steps_on_the_first_epochs(monkeypatch):
    """--lsq-refit N (QuantTraining(refit_epochs=N)) calls fxquant.refit_steps before
    training forwards 2..N (the first fits the steps anyway), and never after."""
    from torch_geometric.data import Data
    torch.manual_seed(0)
    n = 30
    data = Data(x=torch.rand(n, 8), edge_index=torch.randint(0, n, (2, 90)),
                y=torch.randint(0, 3, (n,)))
    for mask in ("train_mask", "val_mask", "test_mask"):
        data[mask] = torch.ones(n, dtype=torch.bool)
    cfg = train_cora.Config("int4", "int4", "nearest", scale="tensor", range="lsq")
    model = train_cora.build(cfg, data, 3, seed=0)
    forwards: list[int] = []
    model.register_forward_pre_hook(lambda m, args: forwards.append(1) if m.training else None)
    calls = []
    real = fxquant.refit_steps

    def spy(gm, **kwargs):
        calls.append(len(forwards))
        return real(gm, **kwargs)

    monkeypatch.setattr(fxquant.recipes.core, "refit_steps", spy)
    run = fxquant.recipes.QuantTraining(model, refit_epochs=3)
    training.fit(model, data, 6, run=run, desc="test")
    assert calls == [1, 2]  # after the 1st and 2nd training forwards, before the next


@needs_data
@pytest.mark.parametrize("model", ["gin", "gat", "gat64"])
def test_zoo_models_smoke(model, tmp_path):
    """--model gin / gat / gat64 train with every site quantized (2 epochs, 1 seed)."""
    configs = train_cora.main(["--model", model, "--sites", "all", "--format", "e2m1",
                               "--scale", "block32", "--seeds", "1", "--epochs", "2",
                               "--dataset", "CiteSeer"])
    assert len(configs) == 2 and all(len(c.accs) == 1 for c in configs)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sites", "edges"], "unknown site(s) ['edges']"),
        (["--protect", "0.5:0.1"], "P_MIN:P_MAX"),
        (["--range", "percentile:40"], "percentile"),
        (["--bits", "8", "--range", "lsq"], "--range sets the scale of a format"),
        (["--format", "e4m3", "--range", "lsq"], "error: --range: "),
        (["--sites", "weight", "--protect", "0:0.1"], "--protect needs a site"),
    ],
)
def test_sites_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit):
        train_cora.parse_args(argv)
    assert message in capsys.readouterr().err


@needs_data
def test_dq_table_smoke(tmp_path, capsys):
    """The Degree-Quant table script: two rows, one seed, two epochs, JSON and re-reading."""

    out = tmp_path / "dq.json"
    dq_table.main(["--only", "int8,mxfp4", "--seeds", "1", "--epochs", "2", "--json", str(out)])
    dq_table.main(["--from-json", str(out)])
    printed = capsys.readouterr().out
    assert "| INT8 |" in printed and "| MXFP4 (E2M1, block-32) |" in printed
    rows = json.loads(out.read_text())["results"]  # each run's validation accuracy too
    assert all(len(r["vals"]) == len(r["accs"]) == 1 and r["vals"][0] > 0 for r in rows)


@needs_data
def test_dq_table_float_epochs(tmp_path):
    """--float-epochs reaches the quantized rows' training (the JSON records it) and runs
    through the float epochs into the rounded ones."""

    out = tmp_path / "dq.json"
    dq_table.main(["--only", "int4-lsq-p", "--seeds", "1", "--epochs", "4", "--float-epochs",
                   "2", "--json", str(out)])
    payload = json.loads(out.read_text())
    assert payload["args"]["float_epochs"] == 2
    assert all(len(r["accs"]) == 1 for r in payload["results"])


def test_dq_table_rows_named_only_run_when_named():
    """The default table keeps its rows: INT8 LSQ runs only when --only names it."""

    default = dq_table.selected(None, (0.0, 0.2))
    assert "int8-lsq-p" not in default and {"fp32", "int8", "int4-lsq-p"} <= set(default)
    assert list(dq_table.selected("int8-lsq-p", (0.0, 0.2))) == ["fp32", "int8-lsq-p"]
    assert dq_table.selected("int8-lsq-p", (0.0, 0.2))["int8-lsq-p"].range == "lsq"
    assert "int4-lsq-pe" not in default


def test_dq_table_edge_row_rounds_attention():
    """int4-lsq-pe rounds GAT's attention coefficients (the edge site, on an unsigned
    grid) on top of the int4-lsq-p row's sites, with a learned step and protection."""
    import warnings

    from torch_geometric.data import Data


    data = Data(x=torch.rand(12, 6), edge_index=torch.randint(0, 12, (2, 40)), num_nodes=12)
    rows = dq_table.selected("int4-lsq-pe", (0.0, 0.2))
    cfg, plain = rows["int4-lsq-pe"], dq_table.rows((0.0, 0.2))["int4-lsq-p"]
    assert cfg.sites == [*plain.sites, "edge"] and cfg.protect == plain.protect
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm = fxquant.transform(training.make_model("gat64", 6, 3), train_cora.mapping_for(cfg, data))
    edge = [m for m in gm.modules() if isinstance(m, fxquant.QuantPoint) and m.site.value == "edge"]
    assert len(edge) == 2 and all(m.config.range == "lsq" for m in edge)
    assert all(m.config.format.spec() == "uint4" for m in edge)  # attention is never negative
    inside = [m for m in gm.modules() if isinstance(m, fxquant.QuantPoint) and m.site.value == "message"]
    assert inside and all(m.config.format.spec() == "int4" for m in inside)


def test_dq_table_stochastic_message_row():
    """int4-lsq-ps: the int4-lsq-p row with its messages rounded stochastically (the other
    sites to nearest); named-only; the table's rounding column says so."""
    import warnings

    from torch_geometric.data import Data


    assert "int4-lsq-ps" not in dq_table.selected(None, (0.0, 0.2))
    cfg = dq_table.selected("int4-lsq-ps", (0.0, 0.2))["int4-lsq-ps"]
    plain = dq_table.rows((0.0, 0.2))["int4-lsq-p"]
    assert (cfg.sites, cfg.protect, cfg.range) == (plain.sites, plain.protect, plain.range)
    assert cfg.rounding_label == "nearest (messages stochastic)"
    assert plain.rounding_label == "nearest"
    data = Data(x=torch.rand(12, 6), edge_index=torch.randint(0, 12, (2, 40)), num_nodes=12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm = fxquant.transform(training.make_model("gat", 6, 3), train_cora.mapping_for(cfg, data))
    rounding = {(m.layer, m.site.value): m.config.rounding.value for m in gm.modules()
                if isinstance(m, fxquant.QuantPoint)}
    assert {k for k, v in rounding.items() if v == "stochastic"} == \
        {k for k in rounding if k[1] == "message"} != set()


def test_train_cora_message_rounding_reaches_the_messages_only():
    """--message-rounding stochastic: the configurations' message points round
    stochastically, the other sites as --rounding says (to nearest here); the default
    leaves every site alike."""
    from torch_geometric.data import Data

    data = Data(x=torch.rand(12, 6), edge_index=torch.randint(0, 12, (2, 40)), num_nodes=12)

    def roundings(argv):
        args = train_cora.parse_args(argv)
        cfg = train_cora.configs_for(args)[1]
        gm = fxquant.transform(training.make_model("gcn", 6, 3), train_cora.mapping_for(cfg, data))
        return {m.site.value: m.config.rounding.value for m in gm.modules()
                if isinstance(m, fxquant.QuantPoint)}

    base = ["--format", "int4", "--sites", "all", "--range", "lsq"]
    got = roundings([*base, "--message-rounding", "stochastic"])
    assert got["message"] == "stochastic"
    assert {v for k, v in got.items() if k != "message"} == {"nearest"}
    assert set(roundings(base).values()) == {"nearest"}


def test_dq_table_merge_by_row_and_seed(tmp_path, capsys):
    """--from-json A B --json OUT: rows merged by seed, a later file's re-run of a row
    replaces the earlier one seed for seed, new seeds are appended, epoch times follow."""
    import json


    def payload(first, rows):
        return {"args": {"first_seed": first, "epochs": 2, "seeds": 2}, "model": "gcn",
                "dataset": "Cora", "results": [
                    {"name": n, "number": num, "accs": accs,
                     "epoch_ms": [float(10 * a) for a in accs for _ in range(2)]}
                    for n, num, accs in rows]}

    a, b, c, out = (tmp_path / f"{n}.json" for n in "abco")
    a.write_text(json.dumps(payload(0, [("FP32", None, [0.80, 0.81]),
                                        ("INT8", "int8", [0.70, 0.71])])))
    b.write_text(json.dumps(payload(2, [("FP32", None, [0.82, 0.83]),
                                        ("INT8", "int8", [0.72, 0.73])])))
    # a re-run of the INT8 row for seeds 0..3 (after a fix)
    c.write_text(json.dumps(payload(0, [("FP32", None, [0.80, 0.81, 0.82, 0.83]),
                                        ("INT8", "int8", [0.75, 0.76, 0.77, 0.78])])))
    dq_table.main(["--from-json", str(a), str(b), "--json", str(out)])
    merged = json.loads(out.read_text())
    assert merged["results"][1]["accs"] == [0.70, 0.71, 0.72, 0.73]
    assert merged["results"][1]["seeds"] == [0, 1, 2, 3]
    assert merged["results"][1]["epoch_ms"] == pytest.approx([7.0, 7.0, 7.1, 7.1, 7.2, 7.2, 7.3, 7.3])
    assert merged["args"]["seeds"] == 4
    assert merged["results"][1]["vals"] == []  # (these files recorded none)
    dq_table.main(["--from-json", str(out), str(c), "--json", str(out)])
    assert json.loads(out.read_text())["results"][1]["accs"] == [0.75, 0.76, 0.77, 0.78]
    with_vals = payload(0, [("FP32", None, [0.80, 0.81]), ("INT8", "int8", [0.70, 0.71])])
    for r in with_vals["results"]:
        r["vals"] = [a - 0.1 for a in r["accs"]]
    a.write_text(json.dumps(with_vals))
    dq_table.main(["--from-json", str(a), "--json", str(out)])  # validation accuracies kept
    assert json.loads(out.read_text())["results"][1]["vals"] == pytest.approx([0.60, 0.61])
    gap = tmp_path / "gap.json"
    gap.write_text(json.dumps(payload(3, [("FP32", None, [0.9, 0.9]), ("X", "int8", [0.5])])))
    with pytest.raises(SystemExit) as exit_:
        dq_table.main(["--from-json", str(a), str(gap)])
    assert exit_.value.code == 2 and "not a prefix" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["gcn", "gin"])
def test_no_weight_decay_on_quantizer_parameters(kind):
    """Learned steps and bit-widths are never decayed (decay pulls a log-step toward 1);
    every parameter is in exactly one group."""
    import fxquant

    model = training.make_model(kind, 8, 3)
    mapping = fxquant.QuantMapping().set_global(
        fxquant.QuantConfig("int4", scale="tensor", range="lsq"), site="output")
    gm = fxquant.transform(model, mapping, lint="off")
    groups = fxquant.recipes.QuantTraining(gm).param_groups(training.param_groups(gm))
    quant = {id(p) for m in gm.modules() if isinstance(m, fxquant.QuantPoint)
             for p in m.parameters()}
    assert quant
    decayed = {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    assert not decayed & quant and decayed
    ids = [id(p) for g in groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in gm.parameters())


def test_dq_table_eval_rng_names_every_row_that_draws_in_evaluation():
    """--eval-rng refuses runs whose evaluation draws nothing: the rows it counts as drawing
    are exactly those whose evaluation moves the generator (measured, every row)."""
    import warnings


    data = training.stand_in_graph()
    for key, cfg in dq_table.rows((0.0, 0.2)).items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = train_cora.build(cfg, data, 3, 0, "gat")
            model.train()
            model(data.x, data.edge_index)  # (steps and ranges set)
            model.eval()
            before = torch.random.get_rng_state()
            with torch.no_grad():
                model(data.x, data.edge_index)
        moved = not torch.equal(before, torch.random.get_rng_state())
        assert moved == cli.draws_in_evaluation(cfg), key


@needs_data
@pytest.mark.parametrize("eval_rng", ["fork", "shared"])
def test_fit_eval_rng_fork_keeps_float_epochs_on_the_fp32_run(eval_rng):
    """A quantized run's float epochs train in float32; with ``eval_rng="fork"`` its
    evaluation (stochastic messages) leaves training's dropout masks alone, so those epochs
    repeat the FP32 run of the same seed loss for loss; shared, they drift from the second
    epoch on."""
    import warnings


    data, classes = training.load_data("Cora", None, "test")
    table = dq_table.rows((0.0, 0.2))
    losses: dict[str, list[float]] = {}
    for key in ("fp32", "int4-lsq-ps"):
        model = train_cora.build(table[key], data, classes, 0, "gat")
        run = fxquant.recipes.QuantTraining(model, float_epochs=3) \
            if isinstance(model, torch.fx.GraphModule) else None
        seen = losses.setdefault(key, [])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            training.fit(model, data, 4, run=run, progress=False, eval_rng=eval_rng,
                         on_epoch=lambda epoch, loss, logits, seen=seen: seen.append(loss))
    float_epochs = slice(0, 3)
    if eval_rng == "fork":
        assert losses["int4-lsq-ps"][float_epochs] == losses["fp32"][float_epochs]
    else:
        assert losses["int4-lsq-ps"][0] == losses["fp32"][0]
        assert losses["int4-lsq-ps"][float_epochs] != losses["fp32"][float_epochs]


def test_fit_refuses_an_unknown_eval_rng():
    with pytest.raises(ValueError, match="eval_rng"):
        training.fit(torch.nn.Linear(2, 2), training.stand_in_graph(), 1, eval_rng="private")


def test_eval_rng_reaches_every_fit_of_the_scripts(monkeypatch):
    """dq_table.py, train_cora.py and trace_training pass --eval-rng to each training run
    (on the stand-in graph, with fit replaced by a recorder)."""
    from experiments import trace_training

    seen: list[str] = []

    def fake_fit(model, data, epochs, *, eval_rng="shared", **kwargs):
        seen.append(eval_rng)
        return training.Result(0.5, None, False, [1.0], 0.5)

    monkeypatch.setattr(training, "fit", fake_fit)
    monkeypatch.setattr(training, "load_data", lambda *a: (training.stand_in_graph(), 3))
    dq_table.main(["--model", "gat", "--only", "int4-lsq-ps", "--seeds", "1", "--epochs", "2",
                   "--eval-rng", "fork"])
    assert seen == ["fork", "fork"]  # FP32 and the row
    seen.clear()
    monkeypatch.setattr(trace_training, "trace", lambda *a, **k: seen.append(k["eval_rng"]) or {
        "val": 0.0, "test": 0.0, "reported_epoch": 0, "float_epochs": 0, "trace": []})
    trace_training.main(["--model", "gat", "--row", "int4-lsq-ps", "--eval-rng", "fork"])
    assert seen == ["fork"]
    seen.clear()
    monkeypatch.setattr(fxquant, "summary", lambda *a, **k: "")
    monkeypatch.setattr(fxquant, "lint", lambda *a, **k: "")
    train_cora.main(["--model", "gat", "--format", "int4", "--range", "lsq", "--sites", "all",
                     "--message-rounding", "stochastic", "--seeds", "1", "--epochs", "2",
                     "--eval-rng", "fork"])
    assert seen == ["fork", "fork"]


ACCELERATOR = torch.device(os.environ.get("FXQUANT_TEST_DEVICE", "cuda"))


@needs_data
@pytest.mark.skipif(ACCELERATOR.type == "cuda" and not torch.cuda.is_available(),
                    reason="no CUDA device here")
def test_train_cora_runs_on_the_device(tmp_path, capsys):
    """``--device``: the transformed graph's summary and lint run on the device's data, and
    every row trains there (INT4, learned steps, protection). ``FXQUANT_TEST_DEVICE=cpu``
    runs it with the CPU standing in for the accelerator."""
    out = tmp_path / "r.json"
    configs = train_cora.main(["--device", ACCELERATOR.type, "--format", "int4", "--range",
                               "lsq", "--sites", "all", "--protect", "0:0.2", "--seeds", "1",
                               "--epochs", "3", "--json", str(out)])
    assert "Lint of the transformed graph" in capsys.readouterr().out
    assert [len(c.accs) for c in configs] == [1, 1]
    assert json.loads(out.read_text())["device"].startswith(ACCELERATOR.type)
