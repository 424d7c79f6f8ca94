"""Speed and memory of rounding with a learned step (LSQ) on per-node bit-widths, to nearest
(``lsq_round``) and stochastically (``lsq_round_stochastic``), forward and backward.

    python -m benchmarks.bench_lsq                   # writes benchmarks/RESULTS.md
    python -m benchmarks.bench_lsq --quick --no-write   # smoke run, eager only (tests use it)

A message-sized input (400,000 x 64 float32; per-row ranges from 2-bit rows on a mid-rise
grid, a learned step), as a :class:`~fxquant.QuantPoint` rounds it in training. Speed:
ratios against ``x.clone()`` of the same tensor, medians over rounds run back to back
(``torch.utils.benchmark``, each round timing the clone right before the op), eager and
under ``torch.compile`` (compiled after a warm-up call, the compile not timed). Memory: the
extra peak resident memory of the forward (the output included) and of the backward, in a
fresh process per case, in units of the input.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

import torch
from tabulate import tabulate

import fxquant
from benchmarks.common import ROOT, interleaved_ratio, machine, publish

ROUNDINGS = ("nearest", "stochastic")
ROWS, COLUMNS = 400_000, 64


def point(rounding: str, rows: int) -> fxquant.QuantPoint:
    """A training message point: 2-bit mid-rise rows, one learned step."""
    bits = fxquant.NodeBits(torch.full((rows,), 2), min_bits=1)
    config = fxquant.QuantConfig("int8:midrise", rounding, scale="tensor", range="lsq",
                                 node_bits=bits)
    p = fxquant.QuantPoint(config, "conv", "message")
    p.train()
    return p


def speed_rows(rows: int, rounds: int, min_run_time: float, compiled: bool = True
               ) -> list[list[Any]]:
    """Eager, and with ``compiled`` also ``torch.compile``'d (warmed up first: the
    compile is not timed), for each rounding."""
    torch.manual_seed(0)
    x = torch.randn(rows, COLUMNS, requires_grad=True)
    grad = torch.ones(rows, COLUMNS)
    clone = lambda: x.detach().clone()  # noqa: E731
    out = []
    for mode in ("eager", "compiled") if compiled else ("eager",):
        for rounding in ROUNDINGS:
            p = point(rounding, rows)
            p(x)  # fits the step
            run = torch.compile(p) if mode == "compiled" else p
            forward = lambda run=run: run(x)  # noqa: E731
            both = lambda run=run: torch.autograd.backward(run(x), grad)  # noqa: E731
            both()  # warm-up (compiles the forward and the backward)
            out.append([rounding, mode] + [
                f"{interleaved_ratio(fn, clone, rounds, min_run_time)[1]:.2f}x"
                for fn in (forward, both)])
    return out


_PEAK = """
import sys, torch
from benchmarks.bench_lsq import COLUMNS, point
from benchmarks.common import resident_peak
rows, rounding = int(sys.argv[1]), sys.argv[2]
x = torch.randn(rows, COLUMNS, requires_grad=True)
p = point(rounding, rows)
p(x).sum().backward()  # warm up: the step's fit, allocator pools, lazy imports
x.grad = None
y, forward = resident_peak(lambda: p(x))
g = torch.ones_like(y)
_, backward = resident_peak(lambda: y.backward(g))
print(forward / x.nbytes, backward / x.nbytes)
"""


def memory_rows(rows: int) -> list[list[Any]]:
    out = []
    for rounding in ROUNDINGS:
        done = subprocess.run([sys.executable, "-c", _PEAK, str(rows), rounding],
                              capture_output=True, text=True, check=True, cwd=ROOT)
        forward, backward = (float(v) for v in done.stdout.split())
        out.append([rounding, f"{forward:.2f}", f"{backward:.2f}"])
    return out


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = p.parse_args(argv)
    rows = 4096 if args.quick else ROWS
    rounds, min_run_time = (1, 0.02) if args.quick else (5, 0.5)
    speed = speed_rows(rows, rounds, min_run_time, compiled=not args.quick)
    memory = memory_rows(rows)
    speed_table = tabulate(speed, headers=["rounding", "mode", "forward / clone",
                                           "forward + backward / clone"], tablefmt="github")
    memory_table = tabulate(memory, headers=["rounding", "forward", "backward"],
                            tablefmt="github")
    body = (
        f"## bench_lsq\n\n`python -m benchmarks.bench_lsq` on {machine()}.\n\n"
        f"A learned step on 2-bit mid-rise rows, {rows:,} x {COLUMNS} float32 in training "
        f"(a message point of the per-node bit recipes); ratios are medians over {rounds} "
        f"back-to-back rounds against `x.clone()`; `compiled` is the point under "
        f"`torch.compile`, its compile excluded.\n\n"
        f"{speed_table}\n\n"
        f"Extra peak memory (resident set, fresh process per case), in units of the input; "
        f"the forward's includes its output:\n\n"
        f"{memory_table}\n"
    )
    return publish("bench_lsq", body, write=not args.no_write)


if __name__ == "__main__":
    main()
