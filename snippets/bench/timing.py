"""How the book times code: device events around each call, warm-up first, the median of many calls,
inputs rotated (and L2 flushed when they are small) so that no call finds its data already in cache.

Every number on the site comes through these functions.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch


@dataclass(frozen=True)
class Timing:
    """Milliseconds per call: the median, and the 10th/90th percentiles as the spread."""

    median: float
    p10: float
    p90: float
    reps: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> "Timing":
        if not samples:
            raise ValueError("no timing samples")
        s = sorted(samples)
        pick = lambda q: s[min(len(s) - 1, int(q * len(s)))]  # noqa: E731
        return cls(statistics.median(s), pick(0.1), pick(0.9), len(s))


def reps_for(estimate_ms: float, budget_ms: float, lo: int = 10, hi: int = 500) -> int:
    """How many timed calls fit in ``budget_ms`` given one call's estimated time, clamped to
    [lo, hi]."""
    if estimate_ms <= 0 or not math.isfinite(estimate_ms):
        return hi
    return max(lo, min(hi, int(budget_ms / estimate_ms)))


# About 50 us at Hopper's ~2 GHz: longer than a Python-side kernel launch (Triton, CuPy or torch).
SPIN_CYCLES = 100_000
# Calls queued ahead of the GPU at a time, and the longest wait the GPU is given while the host
# queues them.
RUN_AHEAD = 50
MAX_AHEAD_MS = 50.0
_cycles_per_ms: float | None = None


def sleep_cycles_per_ms() -> float:
    """Clock cycles of ``torch.cuda._sleep`` per millisecond on this GPU, measured once
    per process."""
    global _cycles_per_ms
    if _cycles_per_ms is None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SPIN_CYCLES)
        start.record()
        torch.cuda._sleep(20 * SPIN_CYCLES)
        end.record()
        torch.cuda.synchronize()
        _cycles_per_ms = 20 * SPIN_CYCLES / max(start.elapsed_time(end), 1e-3)
    return _cycles_per_ms


# --8<-- [start:device_timer]
def time_device(fn: Callable[..., Any], arg_sets: Sequence[tuple], *, budget_ms: float = 200.0,
                warmup: int = 3, flush: torch.Tensor | None = None) -> Timing:
    """Time ``fn`` on the GPU with a pair of CUDA events around every call.

    Calls rotate through ``arg_sets`` so consecutive calls touch different memory; if ``flush`` is
    given (a buffer larger than L2) it is overwritten between calls, outside the timed region, to
    evict the last call's data. Warm-up calls, at least one per input set, first take compilation,
    autotuning, allocator growth and any per-input one-off work (a backward benchmark's saved
    forward) out of the numbers.

    Before each call the GPU is kept busy (the flush, or a short spin) while the host enqueues the
    start event and the launch: otherwise an idle GPU records the start event at once and the
    interval would include the host's launch overhead, not just the kernel. A call of several
    launches with host work between them (an autograd backward, a torch.compile'd graph) needs more:
    before each batch of calls the GPU waits while the host queues the whole batch, so it never runs
    dry in the middle of a call and waits for the host there.
    """
    # every input set once: a first call may do one-off work
    for i in range(max(warmup, len(arg_sets))):
        fn(*arg_sets[i % len(arg_sets)])
    torch.cuda.synchronize()
    probe_start, probe_end = (torch.cuda.Event(enable_timing=True),
                              torch.cuda.Event(enable_timing=True))
    probe_start.record()
    t0 = time.perf_counter()
    fn(*arg_sets[0])
    # the host's time to queue one call (all of it, if fn syncs)
    host_ms = (time.perf_counter() - t0) * 1e3
    probe_end.record()
    torch.cuda.synchronize()
    reps = reps_for(probe_start.elapsed_time(probe_end), budget_ms)
    # Calls per batch: at most RUN_AHEAD, fewer when queueing them would take the host
    # over MAX_AHEAD_MS.
    per_call_ms = 1.5 * (host_ms + 0.05)
    batch = max(1, min(RUN_AHEAD, int(MAX_AHEAD_MS / per_call_ms)))

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if i % batch == 0:  # the GPU waits while the host queues the next batch of calls
            torch.cuda._sleep(int(batch * per_call_ms * sleep_cycles_per_ms()))
        if flush is not None:
            flush.zero_()  # a write of 2x L2: whatever fn touched last is gone
        torch.cuda._sleep(SPIN_CYCLES)  # GPU busy while the host enqueues the next two commands
        starts[i].record()
        fn(*arg_sets[i % len(arg_sets)])
        ends[i].record()
    torch.cuda.synchronize()  # elapsed_time needs both events complete
    return Timing.of([s.elapsed_time(e) for s, e in zip(starts, ends)])
# --8<-- [end:device_timer]


# --8<-- [start:host_timer]
def time_host(fn: Callable[..., Any], arg_sets: Sequence[tuple], *, budget_ms: float = 300.0,
              warmup: int = 2) -> Timing:
    """Time ``fn`` with the host clock, for CPU code and for GPU code whose time includes host work
    (transfers, synchronizes). The GPU is synchronized before the clock starts and before
    it stops."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for i in range(warmup):
        fn(*arg_sets[i % len(arg_sets)])
    sync()
    t0 = time.perf_counter()
    fn(*arg_sets[0])
    sync()
    reps = reps_for((time.perf_counter() - t0) * 1e3, budget_ms, lo=5)
    samples = []
    for i in range(reps):
        sync()
        t0 = time.perf_counter()
        fn(*arg_sets[i % len(arg_sets)])
        sync()
        samples.append((time.perf_counter() - t0) * 1e3)
    return Timing.of(samples)
# --8<-- [end:host_timer]


# --8<-- [start:rotation]
def rotation(working_set_bytes: int, l2_bytes: int, cap: int = 16) -> tuple[int, bool]:
    """How many input sets to rotate through, and whether to flush L2 as well.

    Enough sets that together they span 4x L2 (so each call's inputs were evicted by the calls
    between), at most ``cap``; when even ``cap`` sets fit in 4x L2 the inputs are tiny, and the
    harness flushes L2 instead.
    """
    if working_set_bytes <= 0:
        raise ValueError(f"working set must be positive, got {working_set_bytes}")
    sets = min(cap, max(1, math.ceil(4 * l2_bytes / working_set_bytes)))
    return sets, sets * working_set_bytes < 4 * l2_bytes
# --8<-- [end:rotation]
