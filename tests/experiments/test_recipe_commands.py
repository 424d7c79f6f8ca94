"""Each named recipe in a plain training loop (``examples/cora_recipe.py``) gives the
accuracy of the experiment command it stands for (the commands the documentation lists
beside the recipes), for the same seed."""

import json
import re
import warnings
from pathlib import Path

import pytest
import torch

import fxquant
from examples import cora_recipe
from experiments import bits_pareto, dq_table, select_bits, training
from fxquant.recipes import QuantTraining
from tests.support.data import needs_data

ROOT = Path(__file__).resolve().parents[2]
#: each recipe's command, as the documentation lists it (its results index)
DOCUMENTED = {
    "hub-messages": "python -m experiments.bits_pareto --method degree --degree-rule "
                    "hub-messages --target-bits 2 --signed-grid midrise --shared-step --anneal "
                    "50 --last-aggregate-bits 4 --select budget",
    "learned-bits": "python -m experiments.bits_pareto --method learned --target-bits 2 "
                    "--signed-grid midrise --shared-step --select budget --penalty 10",
    "budget-bits": "python -m experiments.select_bits --candidates budget --datasets "
                   "Cora,CiteSeer --seeds 0,1",
    "recommended": "python -m experiments.bits_pareto --method recommended --target-bits 2",
    "degree-quant": "python -m experiments.dq_table --only int8-dq,int4-dq",
    "lsq-protect": "python -m experiments.dq_table --only int4-lsq-p",
    "mx": "python -m experiments.dq_table --only mxfp4",
}


def _trial_as_json(out, candidate):
    """One selection trial (Cora, seed 0, 8 epochs), written as bits_pareto writes JSON."""
    row = select_bits.trial(candidate, "Cora", 0, 8)
    with open(out, "w") as f:
        json.dump({"results": [{"accs": [row["test"]]}]}, f)


#: each recipe's command, shortened to one seed and 8 epochs
COMMANDS = {
    "hub-messages": lambda out: bits_pareto.main([
        "--method", "degree", "--degree-rule", "hub-messages", "--target-bits", "2",
        "--signed-grid", "midrise", "--shared-step", "--anneal", "50", "--last-aggregate-bits",
        "4", "--select", "budget", "--seeds", "1", "--epochs", "8", "--json", out]),
    "learned-bits": lambda out: bits_pareto.main([
        "--method", "learned", "--target-bits", "2", "--signed-grid", "midrise", "--shared-step",
        "--select", "budget", "--penalty", "10", "--seeds", "1", "--epochs", "8", "--json", out]),
    "budget-bits": lambda out: _trial_as_json(out, "budget"),
    "recommended": lambda out: bits_pareto.main([
        "--method", "recommended", "--target-bits", "2", "--seeds", "1", "--epochs", "8",
        "--json", out]),
    "degree-quant": lambda out: dq_table.main(["--only", "int8-dq", "--seeds", "1", "--epochs",
                                               "8", "--json", out]),
    "lsq-protect": lambda out: dq_table.main(["--only", "int4-lsq-p", "--seeds", "1", "--epochs",
                                              "8", "--json", out]),
    "mx": lambda out: dq_table.main(["--only", "mxfp4", "--seeds", "1", "--epochs", "8",
                                     "--json", out]),
}


def test_every_recipe_has_its_command_in_the_documentation():
    """The results index lists every recipe with its command (the library names none)."""
    assert sorted(DOCUMENTED) == sorted(COMMANDS) == fxquant.recipes.available()
    text = re.sub(r"\s+", " ", (ROOT / "docs" / "source" / "results" / "index.md").read_text())
    missing = [name for name, command in DOCUMENTED.items()
               if f"`{name}`" not in text or f"`{command}`" not in text]
    assert not missing


@needs_data
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_recipe_reproduces_its_example_command(name, tmp_path):
    """The recipe in a plain loop (examples/cora_recipe.py) gives the accuracy its
    experiment command gives, for the same seed."""
    out = str(tmp_path / "out.json")
    COMMANDS[name](out)
    with open(out) as f:
        results = json.load(f)["results"]
    expected = results[-1]["accs"][0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = cora_recipe.main(["--recipe", name, "--epochs", "8", "--seed", "0"])
    assert got == expected


@needs_data
@pytest.mark.slow
def test_a_distilling_recipe_learns_from_the_fp32_run_of_its_seed(monkeypatch):
    """bits_pareto.py gives a distilling recommended recipe the logits of the FP32 run of
    the same seed (training.teacher_logits trains the same one), at its best epoch."""
    name, settings = fxquant.recipes.RECOMMENDED
    monkeypatch.setattr(fxquant.recipes, "RECOMMENDED",
                        (name, {**settings, "distill": 1.0, "float_epochs": 2}))
    given = []
    monkeypatch.setattr(QuantTraining, "set_teacher",
                        lambda self, logits: (given.append(logits.clone()),
                                              setattr(self, "_teacher", logits))[0])
    args = bits_pareto.parse_args(["--method", "recommended", "--target-bits", "2",
                                   "--seeds", "1", "--epochs", "6"])
    payload = bits_pareto.run(args)
    data, classes = training.load_data("Cora", None, "test")
    assert len(given) == 1 and payload["recipe"]["settings"]["distill"] == 1.0
    torch.testing.assert_close(given[0], training.teacher_logits("gcn", data, classes, 0, 6))
