"""Timers: warm-up, then repeats; median and p95 (BENCHMARKS.md "How to measure").

CPU: ``time.perf_counter_ns`` (monotonic) around each call, >= 5 repeats.
CUDA: a pair of CUDA events on the current stream around each call, >= 20 repeats; ``setup`` runs
before the start event and is followed by a synchronize, so it is never timed.

``setup`` (optional) builds the arguments of one call outside the timed region: that is how "cold"
cases get a fresh SparseTensor per repeat (relations rebuilt) while "hot" cases reuse one tensor
(relations cached).
"""
from __future__ import annotations

import gc
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import torch

MIN_REPEATS_CPU = 5
MIN_REPEATS_CUDA = 20


@dataclass
class Timing:
    """Wall time of one measured call, in milliseconds."""

    median_ms: float
    p95_ms: float
    min_ms: float
    max_ms: float
    repeats: int
    warmup: int
    clock: str
    samples_ms: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    v = sorted(values)
    if not v:
        return math.nan
    pos = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def default_repeats(device: str) -> int:
    return MIN_REPEATS_CUDA if device == "cuda" else MIN_REPEATS_CPU


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(
    fn: Callable[[Any], Any],
    *,
    device: str,
    repeats: Optional[int] = None,
    warmup: int = 1,
    setup: Optional[Callable[[], Any]] = None,
) -> Timing:
    """Times ``fn(setup())`` (or ``fn(None)``); at least the device's minimum number of repeats.

    The value ``fn`` returns is dropped only after the clock stops, so freeing outputs is not timed.
    The garbage collector is paused while timing (it is run once before).
    """
    n = max(int(repeats) if repeats else 0, default_repeats(device))
    samples: list[float] = []
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for i in range(warmup + n):
            args = setup() if setup is not None else None
            if device == "cuda":
                torch.cuda.synchronize()
                start.record()
                out = fn(args)
                end.record()
                end.synchronize()
                ms = float(start.elapsed_time(end))
            else:
                t0 = time.perf_counter_ns()
                out = fn(args)
                ms = (time.perf_counter_ns() - t0) / 1e6
            del out, args
            if i >= warmup:
                samples.append(ms)
    finally:
        if was_enabled:
            gc.enable()
    return Timing(
        median_ms=percentile(samples, 50.0),
        p95_ms=percentile(samples, 95.0),
        min_ms=min(samples),
        max_ms=max(samples),
        repeats=n,
        warmup=warmup,
        clock="cuda_event" if device == "cuda" else "perf_counter_ns",
        samples_ms=[round(s, 6) for s in samples],
    )
