"""``python -m fxquant`` (also the ``fxquant`` console script).

Exit status: 0 when the report has no error, 1 when it has errors, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["main"]

_DTYPES = {
    "float32": torch.float32, "float": torch.float32, "float64": torch.float64,
    "double": torch.float64, "float16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "int64": torch.int64, "long": torch.int64,
    "int32": torch.int32, "int": torch.int32, "bool": torch.bool,
}

_DESCRIPTION = """\
Lint a model for autograd traps: in-place ops that break backward (named at the culprit's
line, not the victim's), writes into leaves, .data, tensors created without device=,
anomaly mode in forward, and ops that give parameters zero gradient.

WARNING: linting imports the file, which runs its top-level code, and then runs the
model's forward once on random example inputs. Only lint code you trust.
"""

_EPILOG = """\
TARGET is path/to/file.py:NAME, where NAME is an nn.Module class built with no arguments,
or a function returning a model or (model, example_inputs).

--input NAME=SHAPE[:DTYPE] makes an example input for forward's argument NAME, e.g.
  --input x=2708,1433 --input edge_index=2,10556:int64
Floating inputs are randn; integer inputs are in [0, N), N the first dimension of the first
floating input (so an edge_index indexes real rows). Without --input, the model is linted
symbolically (what the FX graph shows).

exit status: 0 no errors, 1 errors found, 2 usage error
"""


class _UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fxquant", description=_DESCRIPTION, epilog=_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    lint = sub.add_parser("lint", help="lint a model (imports and runs the file)",
                          description=_DESCRIPTION, epilog=_EPILOG,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    lint.add_argument("target", metavar="TARGET", help="path/to/file.py:NAME")
    lint.add_argument("--input", action="append", default=[], metavar="NAME=SHAPE[:DTYPE]",
                      help="an example input for forward (repeat for several)")
    lint.add_argument("--format", choices=["table", "json", "sarif"], default="table")
    lint.add_argument("--check", action="store_true",
                      help="also run backward (fxquant.check): exact culprits, zero gradients")
    return parser


def _load(target: str) -> Any:
    path_text, sep, name = target.rpartition(":")
    if not sep or not path_text or not name:
        raise _UsageError(f"TARGET must look like path/to/file.py:NAME, got {target!r}")
    path = Path(path_text)
    if not path.is_file():
        raise _UsageError(f"no such file: {path}")
    spec = importlib.util.spec_from_file_location(f"_fxquant_target_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise _UsageError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.resolve().parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    if not hasattr(module, name):
        names = sorted(k for k, v in vars(module).items() if not k.startswith("_") and callable(v))
        raise _UsageError(f"{path} has no {name!r}; callables there: {names}")
    return getattr(module, name)


def _build(obj: Any, name: str) -> tuple[nn.Module, tuple[Any, ...] | None]:
    try:
        made = obj()
    except TypeError as e:
        raise _UsageError(f"cannot build {name} with no arguments: {e}") from e
    inputs: tuple[Any, ...] | None = None
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module):
        made, raw = made
        inputs = tuple(raw) if isinstance(raw, (tuple, list)) else (raw,)
    if not isinstance(made, nn.Module):
        raise _UsageError(f"{name} must be an nn.Module class or return a model, got "
                          f"{type(made).__name__}")
    return made, inputs


def _inputs(model: nn.Module, specs: list[str]) -> tuple[Any, ...]:
    params = [p for p in inspect.signature(model.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    order = [p.name for p in params]
    given: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    for spec in specs:
        name, eq, rest = spec.partition("=")
        shape_text, _, dtype_text = rest.partition(":")
        if not eq or not name or not shape_text:
            raise _UsageError(f"--input must look like NAME=SHAPE[:DTYPE], got {spec!r}")
        if name not in order:
            raise _UsageError(f"--input {name!r}: forward has no argument {name!r}; it takes {order}")
        try:
            shape = tuple(int(s) for s in shape_text.split(","))
        except ValueError:
            raise _UsageError(f"--input {name!r}: SHAPE must be comma-separated ints, "
                              f"got {shape_text!r}") from None
        dtype = _DTYPES.get(dtype_text or "float32")
        if dtype is None:
            raise _UsageError(f"--input {name!r}: unknown dtype {dtype_text!r}; "
                              f"choose from {sorted(_DTYPES)}")
        given[name] = (shape, dtype)
    missing = [p.name for p in params if p.name not in given and p.default is p.empty]
    if missing:
        raise _UsageError(f"forward needs {missing}; please add --input for them")
    first_float = next((s for s, d in given.values() if d.is_floating_point), None)
    rows = first_float[0] if first_float else 10
    values: list[Any] = []
    for p in params:
        if p.name not in given:
            break
        shape, dtype = given[p.name]
        if dtype.is_floating_point:
            values.append(torch.randn(shape, dtype=dtype))
        elif dtype == torch.bool:
            values.append(torch.randint(0, 2, shape).bool())
        else:
            values.append(torch.randint(0, max(rows, 1), shape, dtype=dtype))
    return tuple(values)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = _parser().parse_args(argv)
    import fxquant

    try:
        obj = _load(args.target)
        model, inputs = _build(obj, args.target.rpartition(":")[2])
        if args.input:
            inputs = _inputs(model, args.input)
    except _UsageError as e:
        print(f"fxquant: error: {e}", file=sys.stderr)
        return 2
    if args.check and not inputs:
        print("fxquant: error: --check runs backward and needs example inputs (--input)",
              file=sys.stderr)
        return 2
    run = fxquant.check if args.check else fxquant.lint
    try:
        report = run(model, *(inputs or ()))
    except fxquant.TraceError as e:
        print(f"fxquant: error: {e}\nPass --input so the real forward runs instead.",
              file=sys.stderr)
        return 2
    if args.format == "json":
        print(report.to_json())
    elif args.format == "sarif":
        print(report.to_sarif())
    else:
        print(report)
    return 1 if report.errors else 0
