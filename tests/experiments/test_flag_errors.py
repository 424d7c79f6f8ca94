"""Every experiment driver refuses, before any work, flags it would ignore or could not
run: exit 2 with a message naming the flag (the config's own message where the config
refuses the value)."""

from pathlib import Path

import pytest

from experiments import bits_pareto, dq_table, train_cora, train_ddp

#: published results (a benchmark's JSON beside the tables)
RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"

CASES = [
    (train_cora, ["--format", "int8", "--momentum", "1.5"], "--momentum"),
    (train_cora, ["--format", "int4", "--scale", "none", "--range", "lsq"], "--range"),
    (train_cora, ["--layers", "bogus"], "--layers"),
    (train_cora, ["--bits", "10", "--momentum", "0.1"], "--momentum"),
    (train_cora, ["--format", "int8", "--scale", "row", "--momentum", "0.1"], "--momentum"),
    (train_cora, ["--format", "int4", "--range", "lsq", "--momentum", "0.1"], "--momentum"),
    (train_cora, ["--bits", "10", "--scale", "row"], "--scale"),
    (train_cora, ["--format", "int8", "--lsq-refit", "3"], "--lsq-refit"),
    (train_cora, ["--model", "gin", "--super-nodes", "0.1:8"], "--super-nodes"),
    (train_cora, ["--from-json", "x.json", "--bits", "8"], "--bits"),
    (train_cora, ["--format", "int4", "--message-rounding", "stochastic"], "--message-rounding"),
    (train_cora, ["--from-json", "x.json", "--message-rounding", "stochastic"],
     "--message-rounding"),
    (bits_pareto, ["--target-bits", "nan"], "--target-bits"),
    (bits_pareto, ["--target-bits", "inf"], "--target-bits"),
    (bits_pareto, ["--target-bits", "100"], "--target-bits"),
    (bits_pareto, ["--method", "degree", "--target-bits", "12"], "--target-bits"),
    (bits_pareto, ["--input-format", "bogus"], "--input-format"),
    (bits_pareto, ["--penalty", "-5"], "--penalty"),
    (bits_pareto, ["--method", "topn", "--lsq-refit", "2"], "--lsq-refit"),
    (bits_pareto, ["--from-json", "x.json", "--method", "int"], "--method"),
    (bits_pareto, ["--from-json", str(RESULTS / "bits_heldout.json")], "--from-json"),
    (bits_pareto, ["--from-json", "no/such/file.json"], "--from-json"),
    (dq_table, ["--plot", "x.png"], "--plot"),
    (dq_table, ["--only", "bogus"], "--only"),
    (dq_table, ["--only", "int8", "--lsq-refit", "5"], "--lsq-refit"),
    (dq_table, ["--only", "fp32", "--float-epochs", "5"], "--float-epochs"),
    (dq_table, ["--from-json", str(RESULTS / "dq_citeseer_gcn.json"), "--float-epochs", "5"],
     "--float-epochs"),
    (dq_table, ["--from-json", str(RESULTS / "dq_citeseer_gcn.json"), "--lsq-refit", "5"],
     "--lsq-refit"),
    (dq_table, ["--model", "gin", "--only", "int4-lsq-pe"], "--only"),
    (dq_table, ["--from-json", str(RESULTS / "dq_reference_cora_gcn.json")], "--from-json"),
    (dq_table, ["--from-json", "no/such/file.json"], "--from-json"),
    (train_cora, ["--json", "no/such/folder/x.json"], "--json"),
    (train_cora, ["--json", str(RESULTS)], "--json"),
    (train_cora, ["--sweep", "16,8", "--plot", "no/such/folder/x.png"], "--plot"),
    (train_cora, ["--sweep", ","], "--sweep"),
    (train_cora, ["--format", "e4m3", "--rounding", "all"], "--rounding"),
    (train_cora, ["--sites", "weight", "--super-nodes", "0.1:8"], "--super-nodes"),
    (dq_table, ["--from-json", str(RESULTS / "dq_citeseer_gcn.json"), "--plot", "p.png",
                "--json", "o.json"], "--json"),
    (train_cora, ["--layers", ","], "--layers"),
    (dq_table, ["--only", "int8", "--json", "no/such/folder/d.json"], "--json"),
    (dq_table, ["--only", "int4-lsq-p", "--epochs", "20", "--float-epochs", "20"],
     "--float-epochs"),
    (dq_table, ["--only", "int8,int4", "--protect", "0.1:0.5"], "--protect"),
    (dq_table, ["--eval-rng", "fork"], "--eval-rng"),
    (dq_table, ["--only", "int4-lsq-p", "--eval-rng", "fork"], "--eval-rng"),
    (dq_table, ["--from-json", str(RESULTS / "dq_citeseer_gcn.json"), "--eval-rng", "fork"],
     "--eval-rng"),
    (dq_table, ["--eval-rng", "private"], "--eval-rng"),
    (train_cora, ["--format", "int4", "--eval-rng", "fork"], "--eval-rng"),
    (train_cora, ["--from-json", "x.json", "--eval-rng", "fork"], "--eval-rng"),
    (train_cora, ["--from-json", "no/such/file.json"], "--from-json"),
    (train_cora, ["--from-json", str(RESULTS / "bits_cora_int.json")], "--from-json"),
    (train_cora, ["--from-json", str(RESULTS / "cora_sweep.json"), "--epochs", "3"], "--epochs"),
    (train_cora, ["--from-json", str(RESULTS / "cora_sweep.json"), "--dataset", "CiteSeer"],
     "--dataset"),
    (train_cora, ["--from-json", str(RESULTS / "cora_sweep.json"), "--json", "o.json"],
     "--json"),
    (bits_pareto, ["--from-json", str(RESULTS / "cora_sweep.json")], "--from-json"),
    (bits_pareto, ["--method", "topn", "--signed-grid", "midrise"], "--signed-grid"),
    (bits_pareto, ["--method", "topn", "--shared-step"], "--shared-step"),
    (bits_pareto, ["--method", "int", "--penalty", "3"], "--penalty"),
    (bits_pareto, ["--method", "learned", "--degree-rule", "hub-messages"], "--degree-rule"),
    (bits_pareto, ["--method", "learned", "--last-aggregate-bits", "4"],
     "--last-aggregate-bits"),
    (bits_pareto, ["--method", "degree", "--hub-quantile", "0.8"], "--hub-quantile"),
    (bits_pareto, ["--method", "degree", "--anneal-refit", "2"], "--anneal-refit"),
    (bits_pareto, ["--from-json", str(RESULTS / "bits_cora_int.json"), "--json", "o.json"],
     "--json"),
    (bits_pareto, ["--method", "topn", "--json", "no/such/folder/b.json"], "--json"),
    (bits_pareto, ["--method", "topn", "--plot", "no/such/folder/b.png"], "--plot"),
    (train_ddp, ["--scale", "bogus"], "--scale"),
    (train_ddp, ["--momentum", "1.5"], "--momentum"),
    (train_ddp, ["--dropout", "1.5"], "--dropout"),
    (train_ddp, ["--lr", "-1"], "--lr"),
    (train_ddp, ["--scale", "row"], "--momentum"),
    (train_ddp, ["--format", "int8", "--rounding", "toward_zero", "--scale", "block32",
                 "--momentum", "none", "--sites", "bogus"], "--sites"),
    # flags that were ignored, mis-ran or failed after the work
    (train_cora, ["--bits", "10", "--sweep", "16,8"], "--bits"),
    (train_cora, ["--format", "e4m3", "--sweep", "16"], "--format"),
    (train_cora, ["--sweep", "16,8,16"], "--sweep"),
    (train_cora, ["--bits", "16", "--super-nodes", "1:8"], "--super-nodes"),
    (train_cora, ["--sweep", "16,8", "--plot", "p.xyz"], "--plot"),
    (train_cora, ["--from-json", str(RESULTS / "cora_sweep.json"),
                  str(RESULTS / "dq_citeseer_gat.json")], "--from-json"),
    (bits_pareto, ["--method", "format", "--target-bits", "2"], "--target-bits"),
    (bits_pareto, ["--target-bits", "2,3,2"], "--target-bits"),
    (bits_pareto, ["--bits-lr", "nan"], "--bits-lr"),
    (bits_pareto, ["--first-seed", "99999999999999999999"], "--first-seed"),
    (bits_pareto, ["--method", "topn", "--plot", "b.xyz"], "--plot"),
    (dq_table, ["--first-seed", "-1"], "--first-seed"),
    (dq_table, ["--first-seed", "99999999999999999999"], "--first-seed"),
    (dq_table, ["--from-json", str(RESULTS / "dq_cora_gcn.json"),
                str(RESULTS / "dq_cora_gat.json")], "--from-json"),
    (train_ddp, ["--format", "16", "--scale", "row"], "--scale"),
    (train_ddp, ["--format", "16", "--momentum", "0.5"], "--momentum"),
    (train_ddp, ["--num-neighbors", "5,5"], "--num-neighbors"),
    (train_ddp, ["--num-neighbors", "0,3", "--loader", "neighbor"], "--num-neighbors"),
    (train_ddp, ["--json", "no/such/folder/x.json"], "--json"),
    (train_ddp, ["--checkpoint", "no/such/folder/x.pt"], "--checkpoint"),
    (train_ddp, ["--dump-state", str(RESULTS / "dq_cora_gcn.json")], "--dump-state"),
    # values the config or the recipe refuses: its message, naming the flag
    (train_cora, ["--sweep", "16,e4m3", "--range", "lsq"], "--range"),
    (train_cora, ["--format", "int8", "--scale", "none", "--momentum", "0.1"], "--momentum"),
    (train_cora, ["--format", "e4m3", "--scale", "none", "--range", "percentile:99"], "--range"),
    (train_cora, ["--seeds", "0"], "--seeds"),
    (train_cora, ["--epochs", "0"], "--epochs"),
    (train_cora, ["--bits", "40"], "--bits"),
    (train_ddp, ["--format", "int8", "--scale", "tensor-pow2", "--rounding", "bogus"],
     "--rounding"),
    (train_ddp, ["--epochs", "0"], "--epochs"),
    (bits_pareto, ["--method", "learned", "--max-bits", "9"], "--max-bits"),
    (bits_pareto, ["--method", "learned", "--max-bits", "1"], "--max-bits"),
    (bits_pareto, ["--method", "degree", "--degree-rule", "hub-messages", "--hub-quantile",
                   "1.5"], "--hub-quantile"),
    (bits_pareto, ["--method", "degree", "--anneal", "-1"], "--anneal"),
    (bits_pareto, ["--method", "degree", "--anneal", "2", "--anneal-refit", "-1"],
     "--anneal-refit"),
    (bits_pareto, ["--method", "int", "--last-aggregate-bits", "9"], "--last-aggregate-bits"),
    (bits_pareto, ["--method", "learned", "--bits-lr", "0"], "--bits-lr"),
    (bits_pareto, ["--epochs", "0"], "--epochs"),
]


@pytest.mark.parametrize(("script", "argv", "flag"), CASES,
                         ids=[f"{s.__name__.split('.')[-1]} {' '.join(a)}" for s, a, _ in CASES])
def test_bad_flags_exit_2_naming_the_flag(script, argv, flag, capsys):
    """A usage error (exit 2) that names the flag, raised by the parser before any work."""
    with pytest.raises(SystemExit) as exit_:
        script.parse_args(argv)
    assert exit_.value.code == 2
    assert flag in capsys.readouterr().err


def test_emulated_ranks_under_torchrun_are_refused(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as exit_:
        train_ddp.parse_args(["--emulate-world", "3"])
    assert exit_.value.code == 2 and "--emulate-world" in capsys.readouterr().err


def test_khop_takes_every_neighbour_spelled_as_minus_one():
    assert train_ddp.parse_args(["--num-neighbors=-1,-1,-1"]).num_neighbors == [-1, -1, -1]
    assert train_ddp.parse_args([]).num_neighbors == [10, 10]


def test_from_json_keeps_the_dataset_that_titles_its_plot(tmp_path):
    """With --plot, --dataset names the plot, so --from-json accepts it."""
    args = train_cora.parse_args(["--from-json", str(RESULTS / "cora_sweep.json"), "--plot",
                                  str(tmp_path / "p.png"), "--dataset", "CiteSeer"])
    assert args.dataset == "CiteSeer"


def test_protection_defaults_and_applies_where_rows_protect():
    """--protect left out is Degree-Quant's 0:0.2 (recorded in the JSON as before); given,
    it reaches the rows that protect nodes."""
    assert dq_table.parse_args(["--only", "int8"]).protect == (0.0, 0.2)
    args = dq_table.parse_args(["--only", "int8,int4-lsq-p", "--protect", "0.1:0.5"])
    assert args.protect == (0.1, 0.5)
    assert dq_table.selected(args.only, args.protect)["int4-lsq-p"].protect == (0.1, 0.5)


@pytest.mark.parametrize("argv", [["--scale", "row", "--momentum", "none"],
                                  ["--scale", "block32", "--momentum", "none", "--format", "e2m1"],
                                  ["--scale", "tensor"], []])
def test_ddp_scales_can_run(argv):
    """--momentum none turns the running range off, so every --scale can run; 0.1 stays the
    default for --scale tensor."""
    args = train_ddp.parse_args(argv)
    config = train_ddp.build_config(args)
    assert (config.decay is None) == ("none" in argv)

