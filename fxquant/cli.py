"""``python -m fxquant`` (also the ``fxquant`` console script).

Exit status, whatever the linted model does: 0 when the report has no error, 1 when it
has errors, 2 when the model could not be linted at all (bad arguments, a file that does
not import, a target that cannot be built). ``KeyboardInterrupt`` is the one exception
that is not turned into a status. The report goes to stdout (or ``--output FILE``);
anything the model writes to stdout goes to stderr, so JSON and SARIF stay valid: Python's
``print`` and, while the model's file is imported, built and run, file descriptor 1 itself
(``os.write(1, ...)``, a subprocess, a C extension's ``printf``). ``sys.path`` is restored
exactly after the run. Without ``--input`` the check is partial (the symbolic graph
only); the output says so first, and how to make it complete.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.util
import inspect
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fxquant._version import __version__
from fxquant.fx.tracer import TraceError
from fxquant.linter import LintReport, check, lint
from fxquant.linter.rules import (
    NOT_VISIBLE,
)

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
model's forward once (on fake tensors, or on random data). Only lint code you trust.
"""

_EPILOG = """\
TARGET is path/to/file.py:NAME, where NAME is an nn.Module class built with no arguments,
or a function returning a model or (model, example_inputs).

--input NAME=SHAPE[:DTYPE] makes an example input for forward's argument NAME, e.g.
  --input x=2708,1433 --input edge_index=2,10556:int64
and --input NAME.FIELD=SHAPE[:DTYPE] a field of a PyG Data passed as NAME, e.g.
  --input data.x=2708,1433 --input data.edge_index=2,10556:int64
lint runs the forward on fake tensors of those shapes: no data, no real compute (a forward
that needs values runs on random data instead, and the report says so). --check runs
backward on random data: floats randn, integers in [0, N), N the first dimension of the
first floating input in forward's order (a Data's x first), so an edge_index indexes real
rows. Without --input, the model is
linted symbolically (what the FX graph shows): a partial check, and the output says so
first; pass --input for the real answer.

exit status: 0 no errors, 1 errors found, 2 could not lint (usage, import or build error)
"""


class _UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fxquant", description=_DESCRIPTION, epilog=_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"fxquant {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    lint_cmd = sub.add_parser("lint", help="lint a model (imports and runs the file)",
                              description=_DESCRIPTION, epilog=_EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    lint_cmd.add_argument("target", metavar="TARGET", help="path/to/file.py:NAME")
    lint_cmd.add_argument("--input", action="append", default=[], metavar="NAME=SHAPE[:DTYPE]",
                          help="an example input for forward (repeat for several)")
    lint_cmd.add_argument("--format", choices=["table", "json", "sarif"], default="table",
                          help="the report's form (default: table)")
    lint_cmd.add_argument("--output", metavar="FILE", default=None,
                          help="write the report to FILE instead of stdout")
    lint_cmd.add_argument("--check", action="store_true",
                          help="also run backward (fxquant.check): exact culprits, zero gradients")
    return parser


@contextlib.contextmanager
def _sys_path_with(folder: str) -> Iterator[None]:
    """``folder`` first on sys.path while the block runs; sys.path exactly as before after."""
    before = list(sys.path)
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path[:] = before


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
    try:
        spec.loader.exec_module(module)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # SystemExit at import is "could not run", not a status
        raise _UsageError(f"importing {path} raised {type(e).__name__}: {e}") from e
    if not hasattr(module, name):
        names = sorted(k for k, v in vars(module).items() if not k.startswith("_") and callable(v))
        raise _UsageError(f"{path} has no {name!r}; callables there: {names}")
    return getattr(module, name)


def _build(obj: Any, name: str) -> tuple[nn.Module, tuple[Any, ...] | None]:
    try:
        made = obj()
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        raise _UsageError(f"cannot build {name} with no arguments: {type(e).__name__}: {e}") from e
    inputs: tuple[Any, ...] | None = None
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module):
        made, raw = made
        inputs = tuple(raw) if isinstance(raw, (tuple, list)) else (raw,)
    if not isinstance(made, nn.Module):
        raise _UsageError(f"{name} must be an nn.Module class or return a model, got "
                          f"{type(made).__name__}")
    return made, inputs


def _shape(name: str, text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise _UsageError(f"--input {name!r}: SHAPE must be comma-separated ints, "
                          f"got {text!r}") from None
    if any(d < 0 for d in shape):
        raise _UsageError(f"--input {name!r}: sizes must be >= 0, got {text!r}")
    return shape


def _inputs(model: nn.Module, specs: list[str], real: bool) -> tuple[Any, ...]:
    """Example inputs from --input specs: meta tensors (lint runs on fake tensors, from
    shapes alone), or random data when ``real`` (check runs backward on values)."""
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError) as e:
        raise _UsageError(f"cannot read the arguments of {type(model).__name__}.forward: {e}") from e
    params = [p for p in signature.parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    order = [p.name for p in params]
    given: dict[str, dict[str, tuple[tuple[int, ...], torch.dtype]]] = {}
    for spec in specs:
        name, eq, rest = spec.partition("=")
        shape_text, _, dtype_text = rest.partition(":")
        if not eq or not name or not shape_text:
            raise _UsageError(f"--input must look like NAME=SHAPE[:DTYPE], got {spec!r}")
        arg, dot, field = name.partition(".")
        if arg not in order:
            raise _UsageError(f"--input {name!r}: forward has no argument {arg!r}; it takes {order}")
        if dot and not field.isidentifier():
            raise _UsageError(f"--input {name!r}: a Data field is NAME.FIELD, e.g. data.x")
        shape = _shape(name, shape_text)
        dtype = _DTYPES.get(dtype_text or "float32")
        if dtype is None:
            raise _UsageError(f"--input {name!r}: unknown dtype {dtype_text!r}; "
                              f"choose from {sorted(_DTYPES)}")
        fields = given.setdefault(arg, {})
        if field in fields:
            raise _UsageError(f"--input {name!r} is given twice; please give it once")
        if bool(dot) != bool(fields and "" not in fields) and fields:
            raise _UsageError(f"--input {name!r}: {arg!r} is given both as a tensor and as "
                              "Data fields")
        fields[field] = (shape, dtype)
    missing = [p.name for p in params if p.name not in given and p.default is p.empty]
    if missing:
        raise _UsageError(f"forward needs {missing}; please add --input for them")
    # in forward's order, not the order the flags came in (a Data's x first)
    ordered = [given[name] for name in sorted(given, key=order.index)]
    first_float = next((s for f in ordered
                        for _, (s, d) in sorted(f.items(), key=lambda kv: kv[0] != "x")
                        if d.is_floating_point), None)
    rows = first_float[0] if first_float else 10

    def make(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if not real:
            return torch.empty(shape, dtype=dtype, device="meta")
        try:
            if dtype.is_floating_point:
                return torch.randn(shape, dtype=dtype)
            if dtype == torch.bool:
                return torch.randint(0, 2, shape).bool()
            return torch.randint(0, max(rows, 1), shape, dtype=dtype)
        except (RuntimeError, MemoryError) as e:  # (a shape too large for this machine)
            raise _UsageError(f"--input of shape {list(shape)} ({dtype}): --check needs real "
                              f"values and cannot allocate them here ({str(e).splitlines()[0]}); "
                              "please pass smaller shapes, or lint without --check "
                              "(shapes only)") from e

    values: list[Any] = []
    last = max((order.index(name) for name in given), default=-1)
    for p in params[:last + 1]:
        if p.name not in given:  # skipped for a later one: its default, as forward has it
            values.append(p.default)
            continue
        fields = given[p.name]
        if "" in fields:
            values.append(make(*fields[""]))
        else:  # NAME.FIELD specs: a PyG Data with those fields
            from torch_geometric.data import Data

            values.append(Data(**{f: make(*spec) for f, spec in fields.items()}))
    return tuple(values)


def _render(report: LintReport, fmt: str) -> str:
    if fmt == "json":
        return report.to_json()
    if fmt == "sarif":
        return report.to_sarif()
    return str(report)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Everything written to stdout while the block runs goes to stderr: ``sys.stdout``
    and file descriptor 1 itself (subprocesses, ``os.write(1, ...)``, C-level prints);
    both are put back, and C's stdio buffers flushed, when it exits."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no file descriptor 1 to protect
        saved = -1
    try:
        if saved >= 0:
            os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        _flush_c_stdio()
        if saved >= 0:
            os.dup2(saved, 1)
            os.close(saved)


def _flush_c_stdio() -> None:
    """``fflush(NULL)``: output a C extension buffered lands where it was written from."""
    with contextlib.suppress(OSError, AttributeError, TypeError):  # no C library to ask
        ctypes.CDLL(None).fflush(None)


def _run(args: argparse.Namespace) -> LintReport:
    """Load, build and lint; anything the model writes to stdout goes to stderr."""
    path = Path(args.target.rpartition(":")[0])
    with _sys_path_with(str(path.resolve().parent)), _stdout_to_stderr():
        obj = _load(args.target)
        model, inputs = _build(obj, args.target.rpartition(":")[2])
        if args.input:
            inputs = _inputs(model, args.input, real=args.check)
        if args.check and not inputs:
            raise _UsageError("--check runs backward and needs example inputs (--input)")
        run = check if args.check else lint
        try:
            report = run(model, *(inputs or ()))
        except TraceError as e:
            raise _UsageError(f"{e}\nPass --input so the real forward runs instead.") from e
        untraced = [f for f in report.by_rule(NOT_VISIBLE.id) if f.node == "trace"]
        if report.mode == "symbolic" and untraced:  # nothing could be linted at all
            raise _UsageError(f"{untraced[0].message}\nPass --input so the real forward runs "
                              "instead.")
        return report


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0 clean, 1 errors found, 2 could not lint)."""
    args = _parser().parse_args(argv)
    if args.output and (Path(args.output).is_dir()
                        or not Path(args.output).resolve().parent.is_dir()):
        print(f"fxquant: error: --output {args.output}: not a file in an existing folder",
              file=sys.stderr)
        return 2
    try:
        report = _run(args)
    except _UsageError as e:
        print(f"fxquant: error: {e}", file=sys.stderr)
        return 2
    text = _render(report, args.format)
    if report.partial and (args.format != "table" or args.output):
        print(f"fxquant: {report.partial}", file=sys.stderr)
    if args.output:
        try:
            Path(args.output).write_text(text + "\n")
        except OSError as e:
            print(f"fxquant: error: cannot write --output {args.output}: {e}", file=sys.stderr)
            return 2
    else:
        print(text)
    return 1 if report.errors else 0
