"""Streams and launch overhead: overlapping copies with compute, and what a kernel launch costs.

Versions of ``stream_overlap`` (never renumbered). Each moves a pinned host buffer x of n fp32
values to the device, applies ``fma_chain`` (a Triton kernel: ``fmas`` dependent fused multiply-adds
per element, so its time can be set to match the copies') and moves the result back into a
preallocated pinned host buffer:

- v0  serial on one stream: copy everything in, compute, copy everything back. The baseline.
- v1  like v0, but in ``chunks`` pieces, still on one stream: the same work in smaller steps,
  nothing overlaps.
- v2  like v1, but chunk k goes to stream k % 2: one chunk's copies can run while another
  chunk computes.
- v3  like v2, but 4 streams: enough that an upload, a kernel and a download can all be in flight
  at once.

Versions of ``launch_overhead`` (a micro-benchmark, no library baseline). Each adds 1 to every
element of a copy of an int32 buffer of N values, one element per work item, and returns it; the
per-item work is the same in every version (one 4-byte load, an add, one 4-byte store), only the way
the N items are launched changes:

- v1  PyTorch: ``item.add_(1)`` on each one-element view, N launches of PyTorch's
  element-wise kernel.
- v2  CUDA C through CuPy: the kernel ``add_one_at`` launched <<<1, 1>>> N times.
- v3  Triton: a one-element Triton kernel launched N times (Triton's Python launch path, measured).
- v4  like v1, but the N launches are captured once in a CUDA graph and replayed with one launch
  per call.
- v5  one launch of a persistent kernel: a grid sized to the GPU whose blocks claim the N items from
      a work counter in device memory.

Timers: every version of both ops is timed with the host clock around the whole call (a synchronize
before and after). The pipelines end by waiting for their last copy into host memory (the caller
reads it), and their input starts in host memory, so the host's view is the only complete one. For
launches, the host is usually the bottleneck: events on the GPU would see the GPU waiting for the
next launch, which is the same time seen from the other end, but would leave out the first launch
and the final synchronize that v4 and v5 amortize.

Also here: :func:`launch_round_trip` (one launch followed by a synchronize, per launcher), and
:func:`trace_pipelines` and :func:`launch_summary`: a profiler timeline of v0 and v3 of
stream_overlap and a summary of launch costs, which ``python scripts/capture_streams.py OUTDIR``
writes for the chapter.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import triton
import triton.language as tl

from snippets import cuda
from snippets._checks import check_int, check_tensors, refuse_grad, triton_device

# snippets.common.ceilings registers the "host_link" ceiling (pinned copy bandwidth) that
# stream_overlap is compared against; block_pattern is the cheap, block-shifted input pattern of
# Part 2's host transfers.
from snippets.common import ceilings  # noqa: F401
from snippets.common.inputs import block_pattern
from snippets.registry import Impl, Op, register

CU_FILE = "part3/streams.cu"
MiB = 1 << 20


# --------------------------------------------------------------------------------------------------
# stream_overlap: the compute stage and the references
# --------------------------------------------------------------------------------------------------

# The multiplier of every step. Multiplying by 0.5 is exact in binary floating point, so a fused
# multiply-add (one rounding) and a multiply followed by an add (two roundings, the first of them
# exact) give the same bits: the GPU, Triton's CPU interpreter and the PyTorch loop below agree
# exactly. |C| < 1 makes each step shrink the rounding error of the previous ones, so the error does
# not grow with the number of steps.
C = 0.5


# --8<-- [start:reference]
def fma_chain_ref(x: torch.Tensor, fmas: int) -> torch.Tensor:
    """y = x, then ``fmas`` times y = C * y + x, element by element: the compute stage of the
    pipeline, written as a loop. 2 * fmas FLOPs per element."""
    y = x.clone()
    for _ in range(fmas):
        y = y * C + x
    return y


def chain_factor(fmas: int) -> float:
    """The loop above multiplies x by S = 1 + C + C^2 + ... + C^fmas = (1 - C^(fmas+1)) / (1
    - C)."""
    return (1.0 - C ** (fmas + 1)) / (1.0 - C)


def stream_overlap_ref(x: torch.Tensor, out: torch.Tensor, fmas: int, chunks: int) -> torch.Tensor:
    """What every pipeline returns: fma_chain(x) = x * S, in closed form (one multiply; the loop
    would take minutes on a CPU at the headline size). ``out`` and ``chunks`` only say where and in
    how many pieces the result is produced. Bytes across the host link: n * 4 in (H2D) + n * 4 out
    (D2H); 2 * fmas * n FLOPs."""
    return x * chain_factor(fmas)
# --8<-- [end:reference]


# --8<-- [start:fma_kernel]
# 1024 elements per program, 4 warps: each thread carries 8 independent chains, so an SM
# sub-partition always has a fused multiply-add ready to issue while earlier ones are still in
# the pipeline.
BLOCK = 1024
NUM_WARPS = 4


@triton.jit
def _fma_chain_kernel(x_ptr, y_ptr, n, fmas, c, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = x
    for _ in range(fmas):  # a loop with a run-time trip count: the work per element is an argument
        y = tl.fma(y, c, x)  # one FFMA instruction per step
    tl.store(y_ptr + offs, y, mask=mask)


def fma_chain(x: torch.Tensor, fmas: int) -> torch.Tensor:
    """y = x, then ``fmas`` times y = 0.5 * y + x, for a contiguous fp32 tensor on the GPU (or on
    the CPU under the Triton interpreter). Reads and writes each element once; the time grows
    with ``fmas``."""
    refuse_grad("fma_chain", x, instead="fma_chain_ref")
    check_tensors(("x",), (x,), dtypes=(torch.float32,), device=triton_device(), allow_empty=False)
    fmas = check_int("fmas", fmas, 0)
    y = torch.empty_like(x)
    n = x.numel()
    _fma_chain_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, fmas, C, BLOCK=BLOCK, num_warps=NUM_WARPS)
    return y
# --8<-- [end:fma_kernel]


# --------------------------------------------------------------------------------------------------
# stream_overlap: the pipeline
# --------------------------------------------------------------------------------------------------

# --8<-- [start:chunks]
def chunk_spans(n: int, chunks: int) -> list[tuple[int, int]]:
    """Split range(n) into ``chunks`` contiguous, non-empty (start, stop) spans, in order, whose
    lengths differ by at most one: the first n % chunks spans get one element more."""
    n = check_int("n", n, 1)
    chunks = check_int("chunks", chunks, 1)
    if chunks > n:
        raise ValueError(f"chunks = {chunks} is more than the {n} elements: some chunk would be "
                         "empty")
    size, extra = divmod(n, chunks)
    spans, start = [], 0
    for k in range(chunks):
        stop = start + size + (1 if k < extra else 0)
        spans.append((start, stop))
        start = stop
    return spans
# --8<-- [end:chunks]


def _check_pipeline(x: torch.Tensor, out: torch.Tensor, fmas: int, chunks: int,
                    streams: int) -> int:
    """x and out: non-empty, contiguous fp32 tensors of one shape in pinned host memory, either the
    same tensor or not overlapping; fmas >= 0; 1 <= chunks <= n; streams >= 1. Returns n. The checks
    that need no GPU come first, so they hold on any machine."""
    check_tensors(("x", "out"), (x, out), dtypes=(torch.float32,), device="cpu", allow_empty=False)
    check_int("fmas", fmas, 0)
    chunks = check_int("chunks", chunks, 1)
    check_int("streams", streams, 1)
    n = x.numel()
    if chunks > n:
        raise ValueError(f"chunks = {chunks} is more than the {n} elements of x: some chunk would "
                         "be empty")
    for name, t in (("x", x), ("out", out)):
        if not t.is_pinned():
            raise ValueError(f"{name} must be in pinned (page-locked) host memory, so that copies "
                             "are asynchronous DMA transfers: allocate it with torch.empty(..., "
                             "pin_memory=True) or call .pin_memory() once, outside the loop that "
                             "uses it")
    xs, os_ = x.data_ptr(), out.data_ptr()
    if xs != os_ and xs < os_ + out.nbytes and os_ < xs + x.nbytes:
        raise ValueError("out overlaps x at an offset: a chunk's result would overwrite input not "
                         "yet copied (out may be x itself, or a separate buffer)")
    cuda.require_gpu()
    return n


@functools.lru_cache(maxsize=None)
def _side_stream(device_index: int, k: int) -> torch.cuda.Stream:
    """The k-th side stream of a device, created once: the caching allocator keeps a pool per
    stream, so new streams on every call would keep new pools of chunk buffers too."""
    return torch.cuda.Stream(device=device_index)


# --8<-- [start:pipeline]
def run_pipeline(x: torch.Tensor, out: torch.Tensor, fmas: int, chunks: int = 1,
                 streams: int = 1) -> torch.Tensor:
    """out = fma_chain(x) for pinned host tensors x and out, in ``chunks`` pieces spread round-robin
    over ``streams`` streams (1: the caller's current stream). Returns out once it holds
    the result."""
    refuse_grad("run_pipeline", x, out, instead="fma_chain_ref")
    n = _check_pipeline(x, out, fmas, chunks, streams)
    src, dst = x.view(-1), out.view(-1)
    main = torch.cuda.current_stream()
    lanes = [main] if streams == 1 else [_side_stream(main.device.index, k) for k in range(streams)]
    for s in lanes:
        if s != main:
            # whatever the caller queued before (it may be writing x) happens first
            s.wait_stream(main)
    for k, (lo, hi) in enumerate(chunk_spans(n, chunks)):
        s = lanes[k % streams]
        with torch.cuda.stream(s):
            # Allocated while s is current, so the allocator gives this memory back to s only, once
            # the Python object dies: its next user is later work on s, which stream order puts
            # after this chunk.
            d_x = torch.empty(hi - lo, dtype=x.dtype, device=main.device)
            d_x.copy_(src[lo:hi], non_blocking=True)  # H2D on a copy engine; the host does not wait
            d_y = fma_chain(d_x, fmas)  # on the SMs, after the copy (same stream)
            dst[lo:hi].copy_(d_y, non_blocking=True)  # D2H on a copy engine, after the kernel
    for s in lanes:
        if s != main:
            main.wait_stream(s)  # join: later work on the caller's stream comes after every chunk
    main.synchronize()  # out is host memory that the caller may read as soon as this returns
    return out
# --8<-- [end:pipeline]


# --8<-- [start:versions]
def pipeline_serial(x: torch.Tensor, out: torch.Tensor, fmas: int, chunks: int) -> torch.Tensor:
    """v0: one stream, whole buffer: copy in, compute, copy out, each stage waiting for the previous
    one. ``chunks`` is checked but not used: this is what the others are compared with."""
    _check_pipeline(x, out, fmas, chunks, 1)
    return run_pipeline(x, out, fmas, 1, 1)


def pipeline_chunked(x: torch.Tensor, out: torch.Tensor, fmas: int, chunks: int) -> torch.Tensor:
    """v1: like v0, but in ``chunks`` pieces on the same stream. One stream runs its work in order,
    so chunk k + 1's upload still waits for chunk k's download: no overlap, only more launches."""
    return run_pipeline(x, out, fmas, chunks, 1)


def pipeline_2_streams(x: torch.Tensor, out: torch.Tensor, fmas: int, chunks: int) -> torch.Tensor:
    """v2: like v1, but chunks alternate between 2 streams: while one stream's chunk computes, the
    other's can upload or download. Each stream still runs its own three stages in order, so at most
    two of the three engines (H2D copy, SMs, D2H copy) are busy at once."""
    return run_pipeline(x, out, fmas, chunks, 2)


def pipeline_4_streams(x: torch.Tensor, out: torch.Tensor, fmas: int, chunks: int) -> torch.Tensor:
    """v3: like v2, but 4 streams: an upload, a kernel and a download of three different chunks can
    all run at once, so the pipeline is limited by its slowest stage."""
    return run_pipeline(x, out, fmas, chunks, 4)
# --8<-- [end:versions]


# --------------------------------------------------------------------------------------------------
# launch_overhead
# --------------------------------------------------------------------------------------------------

# --8<-- [start:launch_reference]
def launch_overhead_ref(base: torch.Tensor, launches: int) -> torch.Tensor:
    """base + 1: every one of the ``launches`` work items adds 1 to its own element, exactly once.
    Each item reads and writes 4 bytes; the cost being measured is the launch, not the work."""
    return base + 1
# --8<-- [end:launch_reference]


def _check_launches(base: torch.Tensor, launches: int, device: str) -> int:
    """base: a non-empty contiguous one-dimensional int32 tensor on ``device`` with one element
    per launch."""
    check_tensors(("base",), (base,), dtypes=(torch.int32,), device=device, allow_empty=False)
    launches = check_int("launches", launches, 1)
    if base.dim() != 1:
        raise ValueError(f"base must be one-dimensional, got shape {tuple(base.shape)}")
    if base.numel() != launches:
        raise ValueError(f"base has {base.numel()} elements but launches = {launches}: one element "
                         "per launch")
    return launches


# --8<-- [start:launch_torch]
def _add_one_each(out: torch.Tensor) -> None:
    for item in out.split(1):  # one-element views of out, all made in one call
        item.add_(1)  # one launch of PyTorch's element-wise kernel per item


def launches_torch(base: torch.Tensor, launches: int) -> torch.Tensor:
    """v1: N launches of ``add_(1)`` on one-element tensors: Python, PyTorch's dispatcher, the CUDA
    driver and the GPU's front end, N times."""
    launches = _check_launches(base, launches, "cuda")
    out = base.clone()
    _add_one_each(out)
    return out
# --8<-- [end:launch_torch]


# --8<-- [start:launch_cupy]
def launches_cupy(base: torch.Tensor, launches: int) -> torch.Tensor:
    """v2: like v1, but the kernel is add_one_at from csrc/part3/streams.cu, launched through CuPy:
    no dispatcher, only CuPy's argument packing and the driver's cuLaunchKernel per launch."""
    launches = _check_launches(base, launches, "cuda")
    fn = cuda.kernel(CU_FILE, "add_one_at")
    out = base.clone()
    cupy = cuda.cupy_module()
    # what snippets.cuda.launch does per call, done once for all N launches
    ptr = cupy.uint64(out.data_ptr())
    with cuda.cupy_stream(cupy):  # torch's current stream, so the launches order after the clone
        for i in range(launches):
            fn((1,), (1,), (ptr, np.int64(i)))
    return out
# --8<-- [end:launch_cupy]


# --8<-- [start:launch_triton]
# one compiled kernel for every i (Triton specializes ints by default)
@triton.jit(do_not_specialize=["i"])
def _add_one_at_kernel(out_ptr, i):
    p = out_ptr + i
    tl.store(p, tl.load(p) + 1)


def launches_triton(base: torch.Tensor, launches: int) -> torch.Tensor:
    """v3: like v2, but a Triton kernel: each launch goes through Triton's Python launcher, which
    binds the arguments, looks up the compiled kernel for their types and calls the driver."""
    launches = _check_launches(base, launches, triton_device())
    out = base.clone()
    launch = _add_one_at_kernel[(1,)]
    for i in range(launches):
        launch(out, i, num_warps=1)
    return out
# --8<-- [end:launch_triton]


# --8<-- [start:graph]
@functools.lru_cache(maxsize=8)
def _launch_graph(device_index: int, launches: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """v1's N launches on a static buffer, captured once per (device, N) into a CUDA graph."""
    with torch.cuda.device(device_index):
        static = torch.zeros(launches, dtype=torch.int32, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        # warm-up outside the capture: the kernel is loaded before capture
        with torch.cuda.stream(side):
            static[:1].add_(1)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # records the launches (on a capture stream) instead of running them
        with torch.cuda.graph(graph):
            _add_one_each(static)
    return graph, static


def launches_graph(base: torch.Tensor, launches: int) -> torch.Tensor:
    """v4: like v1, but the N launches were captured once in a CUDA graph; a call replays it: one
    launch from the host, N kernel nodes for the GPU's front end. The graph reads and writes fixed
    addresses, so the input is copied into its buffer and the result out of it (two more launches
    per call)."""
    launches = _check_launches(base, launches, "cuda")
    with torch.cuda.device(base.device):
        graph, static = _launch_graph(base.device.index, launches)
        static.copy_(base)
        graph.replay()
        return static.clone()  # the next replay overwrites static: hand out a copy
# --8<-- [end:graph]


# --8<-- [start:persistent_launch]
def launches_persistent(base: torch.Tensor, launches: int,
                        blocks: int | None = None) -> torch.Tensor:
    """v5: like v2, but one launch does all N items: a grid of one-thread blocks, by default as many
    as are resident on the GPU at once, each claiming items from a work counter until none is left
    (add_one_persistent). ``blocks`` overrides the grid size (any size is correct; the default fills
    the GPU once)."""
    launches = _check_launches(base, launches, "cuda")
    fn = cuda.kernel(CU_FILE, "add_one_persistent")
    if blocks is None:
        sms = torch.cuda.get_device_properties(base.device).multi_processor_count
        blocks = min(launches, sms * cuda.resident_blocks(fn, 1))
    blocks = check_int("blocks", blocks, 1)
    out = base.clone()
    # the work counter: item 0 is next
    next_item = torch.zeros(1, dtype=torch.int64, device=base.device)
    cuda.launch(fn, blocks, 1, (out, np.int64(launches), next_item))
    return out
# --8<-- [end:persistent_launch]


# --8<-- [start:round_trip]
def launch_round_trip(reps: int = 1000, warmup: int = 20) -> dict[str, float]:
    """Median host time, in microseconds, of one launch of a one-thread kernel followed by
    ``torch.cuda.synchronize()``, per launcher, and of a synchronize with nothing queued. A round
    trip is the latency a program pays whenever the host needs a result before it can go on."""
    cuda.require_gpu()
    reps, warmup = check_int("reps", reps, 1), check_int("warmup", warmup, 0)
    buf = torch.zeros(1, dtype=torch.int32, device="cuda")
    fn = cuda.kernel(CU_FILE, "add_one_at")
    graph, _ = _launch_graph(torch.cuda.current_device(), 1)
    launchers: dict[str, Callable[[], Any]] = {
        "synchronize alone, nothing queued": lambda: None,
        "PyTorch add_(1) on one element": lambda: buf.add_(1),
        "CUDA C add_one_at via CuPy": lambda: cuda.launch(fn, 1, 1, (buf, np.int64(0))),
        "Triton one-element kernel": lambda: _add_one_at_kernel[(1,)](buf, 0, num_warps=1),
        "CUDA graph of one node, replay": graph.replay,
    }
    result = {}
    for name, launch in launchers.items():
        samples = []
        for k in range(warmup + reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            launch()
            torch.cuda.synchronize()
            if k >= warmup:
                samples.append((time.perf_counter() - t0) * 1e6)
        result[name] = statistics.median(samples)
    return result
# --8<-- [end:round_trip]


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def _pipeline_inputs(size, dtype, device, gen):
    """(x, out, fmas, chunks): x a pinned host copy of the test pattern, out a pinned host buffer of
    NaN (an element a version forgets to write stays NaN). Pinning happens here, outside the
    timed calls."""
    if device != "cpu":
        raise ValueError("stream_overlap's inputs live in pinned host memory (device 'cpu'), got "
                         f"{device!r}")
    n = size["n"]
    x = torch.empty(n, dtype=dtype, pin_memory=True)
    x.copy_(block_pattern(n, gen).to(dtype))
    out = torch.empty(n, dtype=dtype, pin_memory=True)
    out.fill_(float("nan"))
    return x, out, size["fmas"], size["chunks"]


def _launch_inputs(size, dtype, device, gen):
    """(base, N): N random int32 values (not zeros: an item done twice or never shows against
    any base)."""
    n = size["launches"]
    base = torch.randint(-(2**30), 2**30, (n,), generator=gen, dtype=torch.int32)
    return base.to(device), n


# 2048 FMAs per element balance the kernel against one copy direction on an H200 over PCIe 5.0 x16:
# 64 M elements x 2048 x 2 FLOPs at the 67 TFLOP/s fp32 of the H200 datasheet take 4.1 ms, and 256
# MiB at the 63 GB/s per direction of such a link (after line encoding) take 4.3 ms. Over a faster
# link (NVLink-C2C) the kernel is the slowest stage; the tables say which it was.
FMAS = 2048
# 256 MiB of fp32 each way: 4x the H200's L2
PIPE_HEADLINE = {"n": 64 * MiB, "fmas": FMAS, "chunks": 16}
PIPE_SWEEP = [{"n": 64 * MiB, "fmas": FMAS, "chunks": c} for c in (4, 16, 64)]
PIPE_TEST_SIZES = [{"n": 1, "fmas": 3, "chunks": 1}, {"n": 17, "fmas": 8, "chunks": 3},
                   {"n": 1000, "fmas": 8, "chunks": 7}, {"n": 65536 + 3, "fmas": 64, "chunks": 16}]

stream_overlap = register(Op(
    name="stream_overlap", part=3, chapter="part3/streams.md",
    title="Copy-compute overlap with streams", reference=stream_overlap_ref,
    make_inputs=_pipeline_inputs, bytes_moved=lambda s, d: 2 * s["n"] * d.itemsize,
    flops=lambda s, d: 2 * s["fmas"] * s["n"], metric="GB/s", ceiling="host_link",
    headline=PIPE_HEADLINE, sweep=PIPE_SWEEP, sweep_axis="chunks", dtypes=(torch.float32,),
    test_sizes=PIPE_TEST_SIZES))
_PIPE_SRC = (_check_pipeline, run_pipeline, chunk_spans, fma_chain, _fma_chain_kernel)
_PIPE = dict(timer="host", inputs_on="cpu")
stream_overlap.add(Impl("v0", pipeline_serial, "PyTorch",
                        "one stream: copy all, compute, copy back", _PIPE_SRC, **_PIPE))
stream_overlap.add(Impl("v1", pipeline_chunked, "PyTorch", "chunks, one stream", _PIPE_SRC,
                        **_PIPE))
stream_overlap.add(Impl("v2", pipeline_2_streams, "PyTorch", "chunks over 2 streams", _PIPE_SRC,
                        **_PIPE))
stream_overlap.add(Impl("v3", pipeline_4_streams, "PyTorch", "chunks over 4 streams", _PIPE_SRC,
                        **_PIPE))

LAUNCH_HEADLINE = {"launches": 10_000}
launch_overhead = register(Op(
    name="launch_overhead", part=3, chapter="part3/streams.md", title="Kernel launch overhead",
    reference=launch_overhead_ref, make_inputs=_launch_inputs,
    # Each item reads and writes one int32 (the harness only uses this to size input rotation); the
    # metric is the time per launch (per work item, for v4 and v5, which do all items in one launch
    # from the host).
    bytes_moved=lambda s, d: 2 * s["launches"] * d.itemsize, flops=lambda s, d: s["launches"],
    metric="ns/launch", ceiling=None, accesses=lambda s, d: s["launches"], kind="micro",
    headline=LAUNCH_HEADLINE, sweep=[{"launches": n} for n in (100, 1000, 10_000)],
    sweep_axis="launches", dtypes=(torch.int32,), test_sizes=[{"launches": n} for n in (1, 7, 100)],
    tolerances={torch.int32: (0.0, 0.0)}))  # counts: exact
_CU = cuda.source_path(CU_FILE)
_HOST = dict(timer="host")
launch_overhead.add(Impl("v1", launches_torch, "PyTorch", "N x add_(1) on one element",
                         (_add_one_each,), **_HOST))
launch_overhead.add(Impl("v2", launches_cupy, "CUDA", "N x add_one_at<<<1, 1>>> via CuPy", (_CU,),
                         **_HOST))
launch_overhead.add(Impl("v3", launches_triton, "Triton", "N x a one-element Triton kernel",
                         (_add_one_at_kernel,), device="any", **_HOST))
launch_overhead.add(Impl("v4", launches_graph, "PyTorch",
                         "v1's N launches in a CUDA graph, replayed",
                         (_add_one_each, _launch_graph), **_HOST))
launch_overhead.add(Impl("v5", launches_persistent, "CUDA", "one persistent launch, work counter",
                         (_CU,), **_HOST))


# --------------------------------------------------------------------------------------------------
# Capture for the chapter (scripts/capture_streams.py OUTDIR writes what these return)
# --------------------------------------------------------------------------------------------------

# --8<-- [start:trace]
def gpu_events(trace_events: list[dict]) -> list[dict]:
    """The copies and kernels of a Chrome trace (``torch.profiler``'s ``export_chrome_trace``), as
    {"name", "kind": "h2d" | "d2h" | "kernel", "stream", "start_us", "dur_us"}, with times relative
    to the first of them and sorted by start. Other events (CPU ops, runtime calls, device-to-device
    copies, memsets) are dropped."""
    picked = []
    for e in trace_events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        cat, name = str(e.get("cat", "")).lower(), str(e.get("name", ""))
        if cat == "kernel":
            kind = "kernel"
        elif cat == "gpu_memcpy" and "HtoD" in name:
            kind = "h2d"
        elif cat == "gpu_memcpy" and "DtoH" in name:
            kind = "d2h"
        else:
            continue
        stream = e.get("args", {}).get("stream", e.get("tid"))
        try:
            stream = int(stream)
        except (TypeError, ValueError):
            raise ValueError(f"trace event {name!r} has no integer stream id (args.stream or tid): "
                             f"{stream!r}") from None
        picked.append((float(e["ts"]), float(e["dur"]), name, kind, stream))
    if not picked:
        return []
    t0 = min(p[0] for p in picked)
    return [{"name": name, "kind": kind, "stream": stream, "start_us": round(ts - t0, 3),
             "dur_us": round(dur, 3)}
            for ts, dur, name, kind, stream in sorted(picked)]
# --8<-- [end:trace]


def _profile_gpu(fn: Callable[[], Any]) -> list[dict]:
    """The GPU events of one call of fn. The profiler records the second of two calls: during the
    first (its warm-up step) it starts its GPU tracing, which can drop or delay the first events
    it sees."""
    from torch.profiler import ProfilerActivity, profile, schedule

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                     schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
                     on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
            for _ in range(2):
                fn()
                torch.cuda.synchronize()
                prof.step()
        if not path.exists():
            raise RuntimeError("torch.profiler wrote no trace")
        return gpu_events(json.loads(path.read_text())["traceEvents"])


def _copy_engines() -> int | None:
    """cudaDeviceProp.asyncEngineCount: how many copies the device can run at once (None
    without CuPy)."""
    try:
        props = cuda.cupy_module().cuda.runtime.getDeviceProperties(torch.cuda.current_device())
        return int(props["asyncEngineCount"])
    except Exception:  # noqa: BLE001 (CuPy missing or a property it does not report: leave it out)
        return None


def trace_pipelines(size: dict | None = None) -> dict:
    """v0 and v3 of stream_overlap at ``size`` (the headline by default), each profiled after two
    warm-up runs (Triton compiled, the allocator's pools filled); every copy and kernel of the
    profiled call with its stream, start and duration. Checks the result of the profiled call
    against the reference."""
    size = dict(size or PIPE_HEADLINE)
    x, out, fmas, chunks = _pipeline_inputs(size, torch.float32, "cpu",
                                            torch.Generator().manual_seed(0))
    expected = stream_overlap_ref(x.double(), out, fmas, chunks)
    runs = {}
    for label, fn in (("serial", pipeline_serial), ("4 streams", pipeline_4_streams)):
        for _ in range(2):
            fn(x, out, fmas, chunks)
        out.fill_(float("nan"))
        runs[label] = _profile_gpu(lambda fn=fn: fn(x, out, fmas, chunks))
        torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-6)
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "captured": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "size": size, "copy_engines": _copy_engines(), "runs": runs}


def launch_summary(launches: int = LAUNCH_HEADLINE["launches"], reps: int = 1000) -> str:
    """A text report: one launch round trip per launcher, then every launch_overhead version at
    ``launches`` launches (checked against the reference first), then the CUDA graph's
    replay alone."""
    from snippets.bench.timing import time_host

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    lines = [f"GPU: {props.name} ({props.multi_processor_count} SMs); torch {torch.__version__}, "
             f"triton {triton.__version__}, copy engines (asyncEngineCount): {_copy_engines()}", "",
             f"One launch + torch.cuda.synchronize(), host clock, median of {reps}:"]
    for name, us in launch_round_trip(reps).items():
        lines.append(f"  {name:<40} {us:8.2f} us")
    lines += ["", f"{launches} work items, host clock around each call (synchronized), median:"]
    base, n = _launch_inputs({"launches": launches}, torch.int32, "cuda",
                             torch.Generator().manual_seed(0))
    expected = launch_overhead_ref(base, n)
    for name, impl in launch_overhead.impls.items():
        if not torch.equal(impl.fn(base, n), expected):
            raise AssertionError(f"launch_overhead {name} gave a wrong result")
        t = time_host(impl.fn, [(base, n)])
        lines.append(f"  {name} {impl.desc:<44} {t.median:9.3f} ms per call "
                     f"{t.median * 1e6 / n:9.1f} ns per item")
    graph, _ = _launch_graph(torch.cuda.current_device(), n)
    t = time_host(graph.replay, [()])
    lines.append(f"  CUDA graph of {n} nodes, replay alone{'':<13} {t.median:9.3f} ms per call "
                 f"{t.median * 1e6 / n:9.1f} ns per node")
    return "\n".join(lines) + "\n"
