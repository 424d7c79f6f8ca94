"""The drivers' command lines: value parsers for ``argparse`` and the usage errors (exit
status 2, naming the flag) for what would fail after work has started or be ignored.

What a quantization setting may be is :class:`fxquant.QuantConfig`'s (and a recipe's) to
say: :func:`config_from_flags` builds the config one flag at a time and turns the first
:class:`fxquant.FxquantError` into a usage error that names the flag it came with, so the
drivers repeat none of the config's checks. What is left here is what only a command line
has: counts, paths, and flags that a run would ignore.

Example:
    >>> import argparse, fxquant
    >>> from experiments.cli import config_from_flags
    >>> p = argparse.ArgumentParser(prog="demo")
    >>> config = config_from_flags(p, ("--format", "e4m3"), ("--scale", "scale", "tensor"))
    >>> isinstance(config, fxquant.QuantConfig)
    True
    >>> config_from_flags(p, ("--bits", 16), ("--scale", "scale", "row"))
    Traceback (most recent call last):
    ...
    SystemExit: 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import fxquant
from experiments.training import SITES
from fxquant.formats import TopN, parse

__all__ = [
    "config_from_flags",
    "draws_in_evaluation",
    "epochs_arg",
    "fraction_arg",
    "guarded",
    "number_arg",
    "positive_int",
    "protect_arg",
    "refuse_counts",
    "refuse_float_epochs_past_training",
    "refuse_idle_eval_rng",
    "refuse_overridden",
    "refuse_results_files",
    "refuse_seeds",
    "refuse_training_flags",
    "refuse_unwritable",
    "results_subject",
    "sites_arg",
    "usage_error",
]

def usage_error(p: argparse.ArgumentParser, flag: str, error: BaseException) -> NoReturn:
    """``p.error`` (exit 2) with ``flag: error``: an fxquant error turned into a usage
    error that names the flag whose value caused it."""
    p.error(f"{flag}: {error}")


def config_from_flags(p: argparse.ArgumentParser, number: tuple[str, Any],
                      *settings: tuple[str, str, Any]) -> fxquant.QuantConfig:
    """Build a :class:`fxquant.QuantConfig` one flag at a time: ``number`` is ``(flag,
    format)`` and each of ``settings`` ``(flag, keyword, value)``; the first flag whose value
    the config refuses (together with the flags before it) is a usage error naming it, with
    the config's own message."""
    steps: list[tuple[str, dict[str, Any]]] = [(number[0], {})]
    for flag, keyword, value in settings:
        steps.append((flag, {**steps[-1][1], keyword: value}))
    for flag, kwargs in steps:
        try:
            config = fxquant.QuantConfig(number[1], **kwargs)
        except fxquant.FxquantError as e:
            usage_error(p, flag, e)
    return config


# -- values ---------------------------------------------------------------------------------


def positive_int(text: str) -> int:
    """A whole number >= 1 (``--seeds``, ``--epochs``)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def epochs_arg(text: str) -> int:
    """A count of epochs, 0 or more (``--lsq-refit``)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of epochs (0 or more), got {text!r}")
    return value


def number_arg(text: str) -> int | str:
    """An int of kept bits (1..32) or a format name that fxquant knows."""
    text = text.strip()
    try:
        value: int | str = int(text)
    except ValueError:
        value = text
    try:
        parsed = parse(value if isinstance(value, str) else f"top{value}")
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if isinstance(parsed, TopN) and not 1 <= parsed.bits <= 32:
        raise argparse.ArgumentTypeError(f"bit widths must be in 1..32, got {text!r}")
    return value


def sites_arg(text: str) -> list[str]:
    """A comma list of sites, or ``all``."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    if names == ["all"]:
        return list(SITES)
    unknown = [n for n in names if n not in SITES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown site(s) {unknown}; choose from {list(SITES)} "
                                         "or 'all'")
    return [s for s in SITES if s in names]


def protect_arg(text: str) -> tuple[float, float]:
    """``P_MIN:P_MAX`` with ``0 <= P_MIN <= P_MAX <= 1``."""
    low, sep, high = text.partition(":")
    try:
        pair = (float(low), float(high))
    except ValueError:
        pair = (-1.0, -1.0)
    if not sep or not 0 <= pair[0] <= pair[1] <= 1:
        raise argparse.ArgumentTypeError(f"expected P_MIN:P_MAX with 0 <= P_MIN <= P_MAX <= 1, "
                                         f"got {text!r}")
    return pair


def fraction_arg(text: str) -> float:
    """A number in [0, 1) (``--momentum``, ``--dropout``)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


# -- usage errors ---------------------------------------------------------------------------


def refuse_counts(p: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> None:
    """A usage error for each count flag (``seeds``, ``epochs``, ...) below 1."""
    for n in names:
        if getattr(args, n) < 1:
            p.error(f"--{n.replace('_', '-')} must be >= 1, got {getattr(args, n)}")


def refuse_overridden(p: argparse.ArgumentParser, args: argparse.Namespace, switch: str,
                      names: tuple[str, ...], why: str = "") -> None:
    """A usage error naming the flags of ``names`` given with ``switch`` (e.g. ``--quick``,
    which sets them itself; or ``why`` they would not be read), so that none is silently
    ignored."""
    defaults = p.parse_args([])
    given = [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) != getattr(defaults, n)]
    if given:
        p.error(f"{', '.join(given)} with {switch}: {why or switch + ' sets them itself'}, so "
                "they would be ignored; please drop one or the other")


def refuse_seeds(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--seeds`` and ``--first-seed``: at least one seed, none negative or past what
    ``torch.manual_seed`` takes."""
    first = getattr(args, "first_seed", 0)
    if args.seeds < 1:
        p.error(f"--seeds must be >= 1, got {args.seeds}")
    if first < 0 or first + args.seeds > 2**63:
        p.error(f"--first-seed must lie in 0..2**63 - --seeds, got {first}")


def refuse_unwritable(p: argparse.ArgumentParser, args: argparse.Namespace,
                      *flags: str) -> None:
    """A usage error for each output flag (``"--json"``, ``"--plot"``) whose path is a
    folder or lies in no existing folder: checked before training, which would otherwise
    end, minutes later, in a traceback with nothing written."""
    for flag in flags:
        path = getattr(args, flag.lstrip("-").replace("-", "_"), None)
        if path and (os.path.isdir(path) or not os.path.isdir(
                os.path.dirname(os.path.abspath(path)))):
            p.error(f"{flag} {path}: not a file in an existing folder")
        if path and flag == "--plot":
            from matplotlib.backend_bases import FigureCanvasBase

            kinds = FigureCanvasBase.get_supported_filetypes()
            if os.path.splitext(path)[1].lstrip(".").lower() not in kinds:
                p.error(f"--plot {path}: matplotlib writes {', '.join(sorted(kinds))}; please "
                        "end the name with one of them (e.g. .png)")


def refuse_float_epochs_past_training(p: argparse.ArgumentParser,
                                      args: argparse.Namespace) -> None:
    """``--float-epochs`` at or past ``--epochs``: the learned steps would never be fitted
    and every evaluation would round with the placeholder step (one class for all)."""
    if args.float_epochs and args.float_epochs >= args.epochs:
        p.error(f"--float-epochs {args.float_epochs} with --epochs {args.epochs}: no epoch "
                "would train rounded, and the learned steps would never be fitted; please "
                "give --float-epochs below --epochs")


def draws_in_evaluation(cfg: Any) -> bool:
    """Whether evaluating a configuration (a row of ``train_cora``/``dq_table``: its
    ``rounding`` and ``message_rounding``) draws random numbers: where it rounds
    stochastically."""
    return "stochastic" in (cfg.rounding, cfg.message_rounding)


def refuse_idle_eval_rng(p: argparse.ArgumentParser, eval_rng: str, configs: Sequence[Any],
                         hint: str = "") -> None:
    """``--eval-rng fork`` keeps evaluation's random draws out of training: a usage error
    when none of ``configs`` draws any (it would be ignored)."""
    if eval_rng != "shared" and not any(draws_in_evaluation(c) for c in configs):
        p.error(f"--eval-rng {eval_rng} keeps evaluation's random draws out of training; "
                f"nothing run rounds stochastically, so evaluation draws nothing and it would "
                f"be ignored{hint}")


def refuse_training_flags(p: argparse.ArgumentParser, args: argparse.Namespace,
                          keep: tuple[str, ...] = (), writes_json: bool = False) -> None:
    """With ``--from-json`` (no training): a usage error naming every flag given that only
    training reads (``--from-json``, ``--plot`` and the flags named in ``keep`` aside),
    and ``--json`` unless the script writes the files it read (``writes_json``)."""
    if args.json and not writes_json:
        p.error("--json writes the results of training; with --from-json nothing trains, "
                "so it would be ignored: please drop it")
    defaults = p.parse_args([])
    given = [f"--{name.replace('_', '-')}" for name, value in vars(args).items()
             if name not in ("from_json", "plot", "json", *keep)
             and value != getattr(defaults, name)]
    if given:
        p.error(f"{', '.join(given)}: --from-json trains nothing, so these would be "
                "ignored; please drop them")


def refuse_results_files(p: argparse.ArgumentParser, paths: Sequence[str],
                         fields: tuple[str, ...], script: str,
                         payload_fields: tuple[str, ...] = (), one_subject: bool = False) -> None:
    """A usage error for each ``--from-json`` file that cannot be read, or that lacks the
    ``payload_fields`` or whose results lack the ``fields`` that ``script --json`` writes
    (another script's results); with ``one_subject`` (a script that pairs every row
    against one FP32 line), one if the files hold different models or datasets."""
    subjects: dict[str, tuple[str, str]] = {}
    for path in paths:
        try:
            with open(path) as f:
                payload = json.load(f)
        except (OSError, ValueError) as e:
            p.error(f"--from-json {path}: cannot read it as JSON ({e})")
        results = payload.get("results") if isinstance(payload, dict) else None
        if not isinstance(results, list) or not results or not set(payload_fields) <= \
                payload.keys() or not all(isinstance(r, dict) and set(fields) <= r.keys()
                                          for r in results):
            needs = f"{list(payload_fields)} and " if payload_fields else ""
            p.error(f"--from-json {path}: not a file {script} --json writes (it needs "
                    f"{needs}results with {list(fields)}); please leave it out")
        subjects[path] = results_subject(payload)
    if one_subject and len(set(subjects.values())) > 1:
        held = "; ".join(f"{path}: {model} on {dataset}"
                         for path, (model, dataset) in subjects.items())
        p.error(f"--from-json: the files hold results of different models or datasets "
                f"({held}), which would be paired against one FP32 line; please pass files "
                "of one model and dataset")


def results_subject(payload: dict[str, Any]) -> tuple[str, str]:
    """``(model, dataset)`` of a ``--json`` file (files written before either was recorded:
    the GCN, on the dataset of its arguments, else Cora)."""
    args: dict[str, Any] = payload["args"] if isinstance(payload.get("args"), dict) else {}
    return (str(payload.get("model", args.get("model", "gcn"))),
            str(payload.get("dataset", args.get("dataset", "Cora"))))


def guarded(p: argparse.ArgumentParser, flag: str, build: Callable[[], Any]) -> Any:
    """``build()``, with an :class:`fxquant.FxquantError` turned into a usage error naming
    ``flag`` (a recipe or a mapping built from the flags' values)."""
    try:
        return build()
    except fxquant.FxquantError as e:
        usage_error(p, flag, e)
