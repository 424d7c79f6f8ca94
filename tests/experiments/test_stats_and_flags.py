"""The experiments' statistics (one paired difference, scipy's t quantiles) and their
command-line checks (the config's own validation, naming the flag)."""

import argparse
import statistics

import pytest

import fxquant
from experiments import cli
from experiments.stats import Difference, paired, t95


@pytest.mark.parametrize(("dof", "quantile"), [(1, 12.706), (4, 2.776), (9, 2.262), (16, 2.120),
                                               (30, 2.042), (100, 1.984)])
def test_t95_is_students_quantile(dof, quantile):
    """Two-sided 95%: right beyond 15 degrees of freedom too, where a table of rounded
    values said 2.09 at 16-19 and 1.96 from 30 on."""
    assert t95(dof) == pytest.approx(quantile, abs=5e-4)


def test_paired_is_a_minus_b_in_points():
    """The sign of ``scipy.stats.ttest_rel(a, b)``: positive where ``a`` is larger."""
    a, b = [0.80, 0.82, 0.81, 0.79], [0.78, 0.81, 0.80, 0.79]
    d = paired(a, b)
    diffs = [100 * (x - y) for x, y in zip(a, b, strict=True)]
    assert isinstance(d, Difference) and d.n == 4
    assert d.mean == pytest.approx(statistics.mean(diffs)) and d.mean > 0
    half = t95(3) * statistics.stdev(diffs) / 2
    assert (d.low, d.high) == (pytest.approx(d.mean - half), pytest.approx(d.mean + half))
    assert d.half_width == pytest.approx(half)
    assert paired(b, a).mean == pytest.approx(-d.mean)
    assert str(d) == f"{d.mean:+.1f} [{d.low:+.1f}, {d.high:+.1f}]"
    assert d.as_dict() == {"mean": d.mean, "low": d.low, "high": d.high}


def test_paired_takes_the_seeds_both_ran():
    """A baseline run on more seeds pairs its first ones; fewer than two pairs: no
    interval."""
    assert paired([0.5, 0.6], [0.4, 0.5, 0.9]).n == 2
    assert paired([0.5], [0.4]) is None
    assert paired([], [0.4, 0.5]) is None


def test_config_from_flags_names_the_flag_that_the_config_refuses(capsys):
    """Built one flag at a time: the first value the config refuses (with those before it)
    is a usage error naming its flag, with the config's message."""
    p = argparse.ArgumentParser(prog="demo")
    config = cli.config_from_flags(p, ("--format", "int8"), ("--scale", "scale", "tensor"),
                                   ("--momentum", "decay", 0.1))
    assert config == fxquant.QuantConfig("int8", scale="tensor", decay=0.1)
    for number, settings, flag in [
            (("--bits", 16), [("--scale", "scale", "row")], "--scale"),
            (("--format", "e4m3"), [("--scale", "scale", "tensor"), ("--range", "range", "lsq")],
             "--range"),
            (("--format", "int4"), [("--scale", "scale", "row"),
                                    ("--momentum", "decay", 0.1)], "--momentum"),
            (("--format", "int4"), [("--rounding", "rounding", "bogus")], "--rounding")]:
        with pytest.raises(SystemExit) as exit_:
            cli.config_from_flags(p, number, *settings)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and f"demo: error: {flag}: " in err, err


def test_guarded_turns_an_fxquant_error_into_a_usage_error(capsys):
    p = argparse.ArgumentParser(prog="demo")
    assert cli.guarded(p, "--hub-quantile", lambda: 3) == 3
    with pytest.raises(SystemExit):
        cli.guarded(p, "--hub-quantile",
                    lambda: fxquant.recipes.HubMessages(hub_quantile=1.5))
    assert "--hub-quantile: hub_quantile" in capsys.readouterr().err
