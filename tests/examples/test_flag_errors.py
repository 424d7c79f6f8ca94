"""Every short example refuses values it cannot run: exit 2 with a message naming the flag
(before, a traceback or a silent no-op)."""

import pytest

from examples import cora_recipe, ddp, fix_inplace, per_node_bits, quickstart, train_cora


@pytest.mark.parametrize(("main", "argv", "flag"), [
    (quickstart.main, ["--steps", "0"], "--steps"),
    (fix_inplace.main, ["--steps", "0"], "--steps"),
    (ddp.main, ["--steps", "-2"], "--steps"),
    (per_node_bits.main, ["--steps", "0"], "--steps"),
    (per_node_bits.main, ["--budget", "nan"], "--budget"),
    (per_node_bits.main, ["--budget", "0"], "--budget"),
    (cora_recipe.main, ["--epochs", "0"], "--epochs"),
    (cora_recipe.main, ["--seed", "99999999999999999999"], "--seed"),
    (train_cora.main, ["--seeds", "0"], "--seeds"),
    (train_cora.main, ["--epochs", "-1"], "--epochs"),
])
def test_short_examples_refuse_values_they_cannot_run(main, argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert flag in capsys.readouterr().err
