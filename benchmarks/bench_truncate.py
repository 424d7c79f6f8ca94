"""Speed and memory of fxquant.truncate next to its baselines, in one process, on the same tensors.

    python -m benchmarks.bench_truncate                 # CPU, writes benchmarks/RESULTS.md
    python -m benchmarks.bench_truncate --device cuda   # adds a CUDA section
    python -m benchmarks.bench_truncate --quick --no-write   # smoke run (tests use it)

Times are medians of ``torch.utils.benchmark`` runs; every ratio is against ``x.clone()`` of
the same tensor (reading and writing each element once: the memory-bound floor), timed
right before the op, three rounds, median ratio. Peak extra memory is the profiler's peak
of one call, in units of the output size.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.utils.benchmark as tbench
from tabulate import tabulate

import fxquant
from benchmarks.bitplanes import bitplane_roundtrip
from benchmarks.common import machine, peak_bytes, publish
from fxquant.testing import devices_touched

ROUNDINGS = [r.value for r in fxquant.Rounding]

SIZES = [(2708, 16), (2708, 1433), (1_000_000, 64)]
SEED_MAX_ELEMENTS = 2708 * 1433  # the bit-plane baseline needs ~135 floats per value
BITS = 16
TARGETS = {
    "truncate toward_zero": "<= 2.0x", "truncate nearest": "<= 3.0x",
    "truncate stochastic": "<= 4.0x", "truncate fwd+bwd (ste)": "<= 3.0x",
    "fused toward_zero": "<= 1.3x", "fused nearest": "<= 1.3x",
}


def median_seconds(fn: Callable[[], Any], min_run_time: float, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    timer = tbench.Timer(stmt="fn()", globals={"fn": fn})
    return float(timer.blocked_autorange(min_run_time=min_run_time).median)


class _Fused:
    """A torch.compile'd truncation, compiled right before it is timed.

    Dynamo keys its cache on the code object, which every variant shares; a reset and a
    fresh compile make sure the kernel timed is the one for this rounding and size, and the
    result is checked against eager before it is timed.
    """

    def __init__(self, x: torch.Tensor, rounding: str) -> None:
        self.x, self.rounding = x, rounding

    def compile(self) -> Callable[[], Any]:
        torch._dynamo.reset()
        x, rounding = self.x, self.rounding
        fused = torch.compile(lambda t: fxquant.truncate(t, BITS, rounding), dynamic=False)
        out, eager = fused(x), fxquant.truncate(x, BITS, rounding)
        if rounding != "stochastic" and not torch.equal(out.view(torch.int32),
                                                         eager.view(torch.int32)):
            raise AssertionError(f"compiled {rounding} truncation differs from eager")
        return lambda: fused(x)


def bench_size(shape: tuple[int, int], device: torch.device, min_run_time: float,
               quick: bool, rounds: int = 3) -> list[list[Any]]:
    torch.manual_seed(0)
    x = torch.randn(shape, device=device)
    g = torch.randn(shape, device=device)
    xg = x.clone().requires_grad_()
    clone: Callable[[], Any] = lambda: x.clone()  # noqa: E731
    rows: list[tuple[str, Callable[[], Any] | _Fused]] = [
        ("x.clone()", clone),
        ("x.to(bfloat16).float()", lambda: x.to(torch.bfloat16).float()),
    ]
    for r in ROUNDINGS:
        rows.append((f"truncate {r}", partial(fxquant.truncate, x, BITS, r)))

    def fwd_bwd() -> None:
        xg.grad = None
        fxquant.truncate(xg, BITS).backward(g)

    rows.append(("truncate fwd+bwd (ste)", fwd_bwd))
    for r in ("toward_zero",) if quick else ROUNDINGS:
        rows.append((f"fused {r}", _Fused(x, r)))
    if x.numel() <= SEED_MAX_ELEMENTS and device.type == "cpu":
        rows.append(("seed bit-planes round trip", lambda: bitplane_roundtrip(x)))

    times: dict[str, float] = {}
    ratios: dict[str, float] = {}
    table = []
    for name, row in rows:
        fn = row.compile() if isinstance(row, _Fused) else row
        seed = name.startswith("seed")
        if seed:
            t = median_seconds(fn, min_run_time / 4, device)
            ratio = t / times["x.clone()"]
        else:
            # Clone and op alternate for `rounds` rounds: each ratio compares neighbours in
            # time, and the median ratio is robust to the machine's drift.
            pairs = [(median_seconds(clone, min_run_time, device),
                      median_seconds(fn, min_run_time, device)) for _ in range(rounds)]
            t = statistics.median(op for _, op in pairs)
            ratio = statistics.median(op / c for c, op in pairs)
        times[name], ratios[name] = t, ratio
        mem = ""
        if device.type == "cpu" and (name.startswith(("truncate", "fused", "seed")) or
                                     name == "x.clone()"):
            mem = f"{peak_bytes(fn) / x.nbytes:.2f}"
        table.append([f"{shape[0]}x{shape[1]}", name, f"{1e3 * t:.3f}",
                      f"{ratio:.2f}x", mem, TARGETS.get(name, "")])
    if "seed bit-planes round trip" in times:
        speedup = times["seed bit-planes round trip"] / times["truncate toward_zero"]
        table.append([f"{shape[0]}x{shape[1]}", "speedup of truncate over the seed",
                      "", f"{speedup:,.0f}x", "", ">= 1,000x" if shape == (2708, 16) else ""])
    return table


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--quick", action="store_true", help="tiny sizes, short runs (smoke test)")
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here")
    sizes = [(64, 16)] if args.quick else SIZES
    min_run_time = 0.05 if args.quick else 1.0
    rows: list[list[Any]] = []
    for shape in sizes:
        rows += bench_size(shape, device, min_run_time, args.quick, rounds=1 if args.quick else 3)
    headers = ["size", "op", "median (ms)", "vs clone", "peak extra mem (x output)", "target"]
    table = tabulate(rows, headers=headers, tablefmt="github")
    probe = torch.randn(8, 8, device=device if device.type == "cuda" else "meta")
    seen = sorted({d for r in ROUNDINGS for d in devices_touched(fxquant.truncate, probe, BITS, r)})
    where = f"{device.type}" + (f" ({torch.cuda.get_device_name()})" if device.type == "cuda" else "")
    body = (f"## bench_truncate on {where}\n\n"
            f"`python -m benchmarks.bench_truncate --device {args.device}` on {machine()}; "
            f"bits={BITS}.\n\n{table}\n\n"
            f"Devices of every tensor inside the truncation kernel for a {probe.device.type} "
            f"input: {seen} (no constant on another device).\n")
    return publish(f"bench_truncate_{device.type}", body, write=not args.no_write)


if __name__ == "__main__":
    main()
