"""Speed and memory of fxquant.quantize (every preset and integer format) and truncate.

    python -m benchmarks.bench_quantize                 # writes benchmarks/RESULTS.md
    python -m benchmarks.bench_quantize --quick --no-write   # smoke run (tests use it)

Speed: 1,000,000 x 64 float32, nearest rounding, ratios against ``x.clone()`` of the same
tensor, as the median over rounds in which clone and the op run next to each other (each
a ``torch.utils.benchmark`` median). Eager with a per-tensor scale from the data;
compiled (``torch.compile``) with a running scale (the range comes in as a tensor, as a
:class:`~fxquant.quant.observers.RangeObserver` in eval gives it) and with the range
computed from the data inside the compiled function.

Memory: the extra peak resident memory of one call, in a fresh process per case (the
kernel's high-water mark above what the input already takes), in units of the input.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from functools import partial
from typing import Any

import torch
from tabulate import tabulate

import fxquant
from benchmarks.common import ROOT, interleaved_ratio, machine, publish

FORMATS = ["e4m3", "e5m2", "fp16", "bf16", "e3m2", "e2m3", "e2m1",
           "int8", "int4", "int2", "uint8", "int8:asym"]
SHAPE = (1_000_000, 64)


def speed_rows(shape: tuple[int, int], rounds: int, min_run_time: float,
               compiled: bool) -> list[list[Any]]:
    torch.manual_seed(0)
    x = torch.randn(shape)
    clone = lambda: x.clone()  # noqa: E731
    rows = []
    for name in FORMATS:
        eager = lambda name=name: fxquant.quantize(x, name, scale="tensor")  # noqa: E731
        t, r = interleaved_ratio(eager, clone, rounds, min_run_time)
        row = [name, f"{1e3 * t:.1f}", f"{r:.2f}x", "<= 4.0x"]
        if compiled:
            bounds = torch.stack([x.min(), x.max()])  # (lo, hi): a running range's form
            torch._dynamo.reset()
            running = torch.compile(lambda t, b, name=name: torch.ops.fxquant.quantize(
                t, name, scale="tensor", bounds=b), dynamic=False)
            dynamic = torch.compile(lambda t, name=name: fxquant.quantize(t, name, scale="tensor"),
                                    dynamic=False)
            for fn, args in ((running, (x, bounds)), (dynamic, (x,))):
                expected = torch.ops.fxquant.quantize(x, name, scale="tensor", bounds=args[1]) \
                    if len(args) == 2 else fxquant.quantize(x, name, scale="tensor")
                got = fn(*args)
                same = (got.view(torch.int32) == expected.view(torch.int32)) | (
                    got.isnan() & expected.isnan())
                if not bool(same.all()):
                    raise AssertionError(f"compiled {name} differs from eager")
                _, rc = interleaved_ratio(partial(fn, *args), clone, rounds, min_run_time)
                row.append(f"{rc:.2f}x")
            row[-2:] = [f"{row[-2]} (<= 1.3x)", f"{row[-1]} (<= 1.5x)"]
        rows.append(row)
    return rows


_PEAK = """
import math, sys, torch, fxquant
from benchmarks.common import resident_peak
n, case = int(sys.argv[1]), sys.argv[2]
op, number, rounding, scale, nan = case.split("|")
x = torch.randn(n)
if nan == "nan":
    x[n // 3] = math.nan
x = x.view(-1, 64)
fn = (lambda: fxquant.truncate(x, int(number), rounding)) if op == "truncate" else (
    lambda: fxquant.quantize(x, number, rounding, scale=None if scale == "none" else scale))
fn()  # warm up: allocator pools and lazy imports are not the kernel's
y, extra = resident_peak(fn)
print(extra / x.nbytes)
"""

MEMORY_CASES = [
    "truncate|16|toward_zero|none|", "truncate|16|nearest|none|nan", "truncate|12|stochastic|none|",
    "truncate|5|nearest|none|", "truncate|5|toward_zero|none|nan",
    "quantize|e4m3|nearest|tensor|", "quantize|e4m3|nearest|none|nan",
    "quantize|e2m1|nearest|tensor|", "quantize|e2m1|toward_zero|row|",
    "quantize|e2m1|stochastic|tensor|", "quantize|e3m2|nearest|block32|",
    "quantize|e5m2|nearest|tensor-pow2|nan", "quantize|int8|nearest|tensor|",
    "quantize|int4|stochastic|row|", "quantize|int8:asym|nearest|tensor|nan",
    "quantize|int4|nearest|block32|",
]


def memory_rows(n: int) -> list[list[Any]]:
    rows = []
    for case in MEMORY_CASES:
        done = subprocess.run([sys.executable, "-c", _PEAK, str(n), case], capture_output=True,
                              text=True, check=True, cwd=ROOT)
        op, number, rounding, scale, nan = case.split("|")
        label = f"{op}({number}, {rounding}" + (f", scale={scale}" if scale != "none" else "") \
            + (", one NaN" if nan else "") + ")"
        rows.append([label, f"{float(done.stdout.strip()):.2f}", "<= 2.0"])
    return rows


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, no compile (smoke test)")
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = p.parse_args(argv)
    shape = (2048, 64) if args.quick else SHAPE
    rounds, min_run_time = (1, 0.02) if args.quick else (5, 0.5)
    speed = speed_rows(shape, rounds, min_run_time, compiled=not args.quick)
    headers = ["format", "eager (ms)", "eager / clone", "target"]
    if not args.quick:
        headers += ["compiled, running scale / clone", "compiled, range from data / clone"]
    memory = memory_rows(64 * 1024 if args.quick else 25_600_000)
    body = (
        f"## bench_quantize\n\n`python -m benchmarks.bench_quantize` on {machine()}.\n\n"
        f"{shape[0]:,} x {shape[1]} float32, nearest rounding, per-tensor scale; ratios are "
        f"medians over {rounds} back-to-back rounds against `x.clone()`.\n\n"
        f"{tabulate(speed, headers=headers, tablefmt='github')}\n\n"
        f"Extra peak memory of one call (resident set above the input, fresh process per "
        f"case, {25_600_000 if not args.quick else 64 * 1024:,} float32 values), in units of "
        f"the input:\n\n"
        f"{tabulate(memory, headers=['call', 'extra peak (x input)', 'target'], tablefmt='github')}\n"
    )
    return publish("bench_quantize", body, write=not args.no_write)


if __name__ == "__main__":
    main()
