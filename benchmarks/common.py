"""Shared by the benchmark scripts: timing against a baseline, peak memory of a call, and
the RESULTS.md sections (their command-line checks are :mod:`experiments.cli`'s)."""

from __future__ import annotations

import os
import platform
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.utils.benchmark as tbench
from torch.profiler import ProfilerActivity, profile

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
#: the repository root (the working directory of the scripts' fresh processes)
ROOT = RESULTS.parents[1]


def median_seconds(fn: Callable[[], Any], min_run_time: float) -> float:
    """``torch.utils.benchmark``'s median time of ``fn()``."""
    timer = tbench.Timer(stmt="fn()", globals={"fn": fn})
    return float(timer.blocked_autorange(min_run_time=min_run_time).median)


def interleaved_ratio(fn: Callable[[], Any], base: Callable[[], Any], rounds: int,
                      min_run_time: float) -> tuple[float, float]:
    """(median seconds of fn, median over rounds of fn / base measured back to back)."""
    pairs = [(median_seconds(base, min_run_time), median_seconds(fn, min_run_time))
             for _ in range(rounds)]
    return statistics.median(t for _, t in pairs), statistics.median(t / b for b, t in pairs)


def _status_bytes(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def resident_peak(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()`` and the bytes by which the resident set's high-water mark rose above the
    resident set before it (Linux: the mark is reset first). Run it in a fresh process,
    after a warm-up call, so that allocator pools and lazy imports are not counted."""
    base = _status_bytes("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    out = fn()
    return out, _status_bytes("VmHWM") - base


def peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes allocated on the CPU while ``fn()`` runs, its result included.

    From the profiler's memory events: allocations count at their op's start, frees at its
    end, and the running total's maximum is the peak.
    """
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    del out
    steps = []
    for e in prof.events():
        delta = e.self_cpu_memory_usage
        if delta:
            steps.append((e.time_range.start if delta > 0 else e.time_range.end, delta))
    total = peak = 0
    for _, delta in sorted(steps):
        total += delta
        peak = max(peak, total)
    return peak


def machine() -> str:
    """One line describing where the numbers come from."""
    cpu = platform.processor() or platform.machine()
    with_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                with_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{with_model or cpu}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads")


def write_section(name: str, body: str) -> None:
    """Replace this script's section of RESULTS.md (other scripts' sections stay)."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    if begin in text and end in text:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    RESULTS.write_text(text)


def publish(name: str, body: str, write: bool) -> str:
    """Print a script's section and, with ``write``, put it into RESULTS.md; the section."""
    print(body)
    if write:
        write_section(name, body)
    return body
