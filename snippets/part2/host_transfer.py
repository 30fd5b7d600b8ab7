"""Moving data between host and device memory, and keeping track of device memory.

Versions of ``host_transfer`` (never renumbered). Each moves B bytes of fp32 data across the host
link and returns it on the other side; the reference returns the data itself:

- v0  host to device from pageable memory: ``x.to("cuda")``, what a program gets by default.
- v1  host to device from pinned (page-locked) memory: the DMA engine reads the source directly.
- v2  device to host into pageable memory (a preallocated buffer).
- v3  device to host into pinned memory (a preallocated buffer).

Which timer fits which version (``Impl.timer``), following CUDA's own bandwidthTest sample:

- Pinned copies (v1, v3) are DMA transfers queued on the stream; CUDA events placed around them on
  the same stream bracket exactly the transfer: the device timer.
- Pageable copies (v0, v2) are synchronous and partly done by the CPU: the driver copies between the
  pageable buffer and a pinned staging buffer with ``memcpy``, chunk by chunk, while the DMA engine
  moves the previous chunk. Part of that work can happen before the GPU reaches the start event,
  which events would not see; the host clock around the whole call (a synchronize before and after)
  sees all of it: the host timer.

Also here: :func:`footprint`, which reports what a function does to device memory (torch's allocator
and the driver's count), and :func:`unified_memory_timings`, which shows on-demand page migration
against prefetching for CUDA managed memory.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from snippets import cuda
from snippets._checks import check_tensors
from snippets.common import ceilings  # noqa: F401  (registers the host_link ceiling)
from snippets.common.inputs import block_pattern
from snippets.registry import Impl, Op, register

MiB = 1 << 20


# --8<-- [start:reference]
def transfer_ref(x: torch.Tensor, bufs: "TransferBuffers") -> torch.Tensor:
    """The data itself: a transfer computes nothing. It moves B = n * itemsize bytes once across the
    host link (PCIe or NVLink-C2C), 0 FLOPs."""
    return x.clone()
# --8<-- [end:reference]


# --8<-- [start:buffers]
@dataclass(frozen=True)
class TransferBuffers:
    """Every buffer the four versions need, holding (or ready to receive) the same n values as the
    pageable source ``x``. Allocated once per input set, outside the timed calls: allocating and
    pinning memory is not part of a transfer (pinning 1 GiB can take longer than copying it).

    - ``pinned``:      a page-locked host copy of x (the source of v1)
    - ``device``:      a device copy of x (the source of v2 and v3)
    - ``to_pageable``: a pageable host buffer, written once (so its pages exist) and filled with NaN
    - ``to_pinned``:   a page-locked host buffer filled with NaN
    """

    pinned: torch.Tensor
    device: torch.Tensor
    to_pageable: torch.Tensor
    to_pinned: torch.Tensor

    @classmethod
    def like(cls, x: torch.Tensor) -> "TransferBuffers":
        _check_host(x)
        cuda.require_gpu()
        pinned = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
        pinned.copy_(x)
        to_pinned = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
        to_pinned.fill_(float("nan"))
        return cls(pinned=pinned, device=x.to("cuda"), to_pageable=torch.full_like(x, float("nan")),
                   to_pinned=to_pinned)
# --8<-- [end:buffers]


def _check_host(x: torch.Tensor) -> None:
    check_tensors(("x",), (x,), dtypes=(torch.float32,), device="cpu", allow_empty=False)


def _check(x: torch.Tensor, bufs: TransferBuffers) -> None:
    """x: a non-empty, contiguous fp32 host tensor; bufs: made by TransferBuffers.like for
    x's shape."""
    _check_host(x)
    if not isinstance(bufs, TransferBuffers):
        raise TypeError("bufs must be a TransferBuffers (TransferBuffers.like(x)), got "
                        f"{type(bufs).__name__}")
    if bufs.device.shape != x.shape:
        raise ValueError(f"bufs were made for shape {tuple(bufs.device.shape)}, x has shape "
                         f"{tuple(x.shape)}")
    cuda.require_gpu()


# --8<-- [start:versions]
def h2d_pageable(x: torch.Tensor, bufs: TransferBuffers) -> torch.Tensor:
    """v0: ``x.to("cuda")`` from ordinary (pageable) memory. The DMA engine can only read
    page-locked memory, so the driver copies x, chunk by chunk, into a pinned staging buffer and
    transfers from there; the call returns when the data is on the device. Host timer (see the
    module docstring)."""
    _check(x, bufs)
    return x.to("cuda")


def h2d_pinned(x: torch.Tensor, bufs: TransferBuffers) -> torch.Tensor:
    """v1: like v0, but from a pinned copy of x: one DMA transfer, no staging, and asynchronous
    (``non_blocking=True``): the call returns at once and later work on the stream sees the data.
    Device timer: events on the stream bracket the transfer itself."""
    _check(x, bufs)
    return bufs.pinned.to("cuda", non_blocking=True)


def d2h_pageable(x: torch.Tensor, bufs: TransferBuffers) -> torch.Tensor:
    """v2: device to host, into a pageable buffer: staged through the driver's pinned buffer, then
    copied by the CPU; synchronous. Host timer. (``.cpu()`` would also allocate a new buffer on
    every call, and the kernel would have to fault in its pages as the copy first touches them.)"""
    _check(x, bufs)
    return bufs.to_pageable.copy_(bufs.device)


def d2h_pinned(x: torch.Tensor, bufs: TransferBuffers) -> torch.Tensor:
    """v3: like v2, but into a pinned buffer: one DMA transfer. The host must wait for it before it
    reads the result, so the call is synchronous (a non-blocking copy would return a buffer still
    being written). Device timer: the end event is recorded after the wait, so the few microseconds
    for the host to notice that the copy finished are counted, as they are for any caller."""
    _check(x, bufs)
    return bufs.to_pinned.copy_(bufs.device)
# --8<-- [end:versions]


# --------------------------------------------------------------------------------------------------
# Device-memory footprint
# --------------------------------------------------------------------------------------------------

# --8<-- [start:footprint]
def footprint(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, int]:
    """Run ``fn(*args, **kwargs)`` once and report what it did to the current GPU's memory,
    in bytes.

    Two views: torch's caching allocator (``allocated``: bytes in live tensors; ``reserved``: bytes
    the allocator holds from the driver, live or cached for reuse) and the driver's
    (``cudaMemGetInfo``: free bytes on the device, which counts every process and library, and
    whatever torch keeps cached).

    - ``peak_allocated_delta``: the most that fn had allocated at any moment beyond what was
      live before
    - ``retained``: allocated after minus before: what fn kept alive (its result included; it is
      released after the measurement)
    - ``reserved_delta`` and ``peak_reserved_delta``: growth of torch's pool
    - ``device_used_delta``: the driver's free memory before minus after
    - the raw ``*_before`` / ``*_after`` values and ``device_total``

    Resets torch's peak counters (``torch.cuda.reset_peak_memory_stats``). Raises ``RuntimeError``
    without a GPU: there is no device memory to account for.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("footprint measures GPU memory, and torch sees no CUDA GPU "
                           "(torch.cuda.is_available() is False)")
    torch.cuda.synchronize()  # pending frees and allocations settle first
    free_before, total = torch.cuda.mem_get_info()
    allocated_before = torch.cuda.memory_allocated()
    reserved_before = torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    result = fn(*args, **kwargs)
    torch.cuda.synchronize()  # fn's kernels have run (and its stream-ordered frees have happened)
    free_after, _ = torch.cuda.mem_get_info()
    stats = {
        "allocated_before": allocated_before,
        "allocated_after": torch.cuda.memory_allocated(),
        "peak_allocated_delta": torch.cuda.max_memory_allocated() - allocated_before,
        "reserved_before": reserved_before,
        "reserved_after": torch.cuda.memory_reserved(),
        "peak_reserved_delta": torch.cuda.max_memory_reserved() - reserved_before,
        "device_free_before": free_before,
        "device_free_after": free_after,
        "device_total": total,
    }
    stats["retained"] = stats["allocated_after"] - allocated_before
    stats["reserved_delta"] = stats["reserved_after"] - reserved_before
    stats["device_used_delta"] = free_before - free_after
    del result
    return stats
# --8<-- [end:footprint]


# --------------------------------------------------------------------------------------------------
# Unified (managed) memory: on-demand migration against prefetching
# --------------------------------------------------------------------------------------------------

# never more than 1 GiB of managed memory, and never more than half the free memory
MAX_MANAGED = 1 << 30
_CONCURRENT_MANAGED_ACCESS = 89  # cudaDevAttrConcurrentManagedAccess (driver_types.h)


# --8<-- [start:unified]
def unified_memory_timings(nbytes: int = 256 * MiB) -> dict[str, float]:
    """Time a GPU pass over ``nbytes`` of managed memory whose pages live in host memory, first
    touched on demand (every first touch of a page faults, and the driver migrates it), then after
    a prefetch.

    Managed memory (``cudaMallocManaged``, here through CuPy) has one address valid on host and
    device; the driver moves pages to whichever side touches them. Steps, each timed with CUDA
    events on torch's stream:

    1. the CPU writes 0.5 everywhere (pages now in host memory); a GPU sum reads
       it: ``on_demand_ms``;
    2. the CPU writes 0.25 everywhere (the pages migrate back to the host);
       ``cudaMemPrefetchAsync`` moves them all to the device in bulk: ``prefetch_ms``;
       the same GPU sum: ``after_prefetch_ms``.

    Returns those times and both sums (which must be n / 2 and n / 4). Refuses more than 1 GiB or
    more than half the free device memory, and devices that cannot share managed memory with the CPU
    while kernels run.
    """
    from snippets.bench.timing import SPIN_CYCLES

    cuda.require_gpu()
    cupy = cuda.cupy_module()
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise TypeError(f"nbytes must be a Python int, got {type(nbytes).__name__}")
    if nbytes <= 0 or nbytes % 4 or nbytes > MAX_MANAGED:
        raise ValueError(f"nbytes must be a positive multiple of 4 of at most {MAX_MANAGED} (1 "
                         f"GiB), got {nbytes}")
    dev = torch.cuda.current_device()
    free, _ = torch.cuda.mem_get_info(dev)
    if nbytes > free // 2:
        raise RuntimeError(f"asked for {nbytes} bytes of managed memory with only {free} bytes "
                           "free on the GPU")
    if not cupy.cuda.runtime.deviceGetAttribute(_CONCURRENT_MANAGED_ACCESS, dev):
        raise RuntimeError("this device cannot migrate managed memory on demand "
                           "(concurrentManagedAccess = 0)")

    n = nbytes // 4
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    with cupy.cuda.Device(dev):
        mem = cupy.cuda.malloc_managed(nbytes)  # a MemoryPointer over a ManagedMemory
    try:
        # One address, two views: a NumPy array for the CPU, a torch tensor for the GPU (no copy).
        host = np.ctypeslib.as_array(ctypes.cast(mem.ptr, ctypes.POINTER(ctypes.c_float)),
                                     shape=(n,))
        gpu = torch.as_tensor(cupy.ndarray((n,), dtype=cupy.float32, memptr=mem),
                              device=f"cuda:{dev}")
        if gpu.data_ptr() != mem.ptr:
            raise RuntimeError("torch copied the managed array instead of viewing it")
        events = [torch.cuda.Event(enable_timing=True) for _ in range(5)]

        host.fill(1.0)
        # warm-up: torch's reduction kernel loaded, the pages mapped once
        gpu.sum(dtype=torch.float64)
        torch.cuda.synchronize()

        host.fill(0.5)  # CPU writes: every page back in host memory
        # GPU busy while the host enqueues: the events time only the GPU work
        torch.cuda._sleep(SPIN_CYCLES)
        events[0].record()
        # each first touch of a page faults; the driver migrates it
        first = gpu.sum(dtype=torch.float64)
        events[1].record()
        torch.cuda.synchronize()

        host.fill(0.25)
        torch.cuda._sleep(SPIN_CYCLES)
        events[2].record()
        mem.mem.prefetch(stream)  # cudaMemPrefetchAsync to this device: bulk migration, no faults
        events[3].record()
        second = gpu.sum(dtype=torch.float64)
        events[4].record()
        torch.cuda.synchronize()
        return {
            "bytes": float(nbytes),
            "on_demand_ms": events[0].elapsed_time(events[1]),
            "prefetch_ms": events[2].elapsed_time(events[3]),
            "after_prefetch_ms": events[3].elapsed_time(events[4]),
            "on_demand_sum": first.item(),
            "after_prefetch_sum": second.item(),
        }
    finally:
        torch.cuda.synchronize()  # nothing may still use the memory when it is freed
        host = gpu = None
        del mem
# --8<-- [end:unified]


# The ceiling, the host link itself ("host_link": pinned copies, the faster direction), is
# registered by snippets.common.ceilings, which Part 3's streams chapter is compared
# against too.


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def _make_inputs(size, dtype, device, gen):
    """(x, bufs): the pageable source and every other buffer; the same for every version."""
    itemsize = dtype.itemsize
    if size["bytes"] % itemsize:
        raise ValueError(f"bytes = {size['bytes']} is not a whole number of {dtype} elements")
    x = block_pattern(size["bytes"] // itemsize, gen).to(dtype)
    return x, TransferBuffers.like(x)


HEADLINE = {"bytes": 256 * MiB}  # 4x the H200's L2; the link's rate is flat long before this size
SWEEP = [{"bytes": b * MiB} for b in (1, 4, 16, 64, 256)]
host_transfer = register(Op(
    name="host_transfer", part=2, chapter="part2/managing-memory.md", title="Host-device transfers",
    reference=transfer_ref, make_inputs=_make_inputs,
    bytes_moved=lambda s, d: s["bytes"], flops=lambda s, d: 0,
    metric="GB/s", ceiling="host_link", headline=HEADLINE, sweep=SWEEP, sweep_axis="bytes",
    dtypes=(torch.float32,), test_sizes=[{"bytes": 4 * n} for n in (1, 17, 1000, 65536 + 3)],
    tolerances={torch.float32: (0.0, 0.0)}))  # a copy is exact
_SRC = (_check, TransferBuffers)
host_transfer.add(Impl("v0", h2d_pageable, "PyTorch", "host to device, pageable: x.to('cuda')",
                       _SRC, timer="host"))
host_transfer.add(Impl("v1", h2d_pinned, "PyTorch", "host to device, pinned", _SRC,
                       origin="library"))
host_transfer.add(Impl("v2", d2h_pageable, "PyTorch", "device to host, pageable", _SRC,
                       timer="host", origin="library"))
host_transfer.add(Impl("v3", d2h_pinned, "PyTorch", "device to host, pinned", _SRC,
                       origin="library"))
