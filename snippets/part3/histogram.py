"""Histogram: count how often each value in [0, bins) occurs, with atomics at three levels of the
memory system.

Versions of ``histogram`` (never renumbered); the CUDA kernels are in ``csrc/part3/histogram.cu``:

- v0  ``torch.bincount`` on the in-range values: the library baseline.
- v1  CUDA, one global ``atomicAdd`` per element: every increment is a read-modify-write in the L2.
- v2  CUDA, like v1 but each block counts into a private histogram in shared memory and adds it to
      the global one at the end: one global atomic per bin per block instead of one per element.
- v3  CUDA, like v2 but lanes of a warp that hold the same value are merged with
      ``__match_any_sync`` first: one shared-memory atomic per distinct value per warp, so a skewed
      input stops serializing 32 lanes.
- v4  Triton: ``tl.histogram`` of each block of values in registers, then one ``tl.atomic_add``
  per bin.

Semantics: ``x`` is a contiguous int32 tensor of any shape; the result is an int32 tensor of
``bins`` counts. A value outside [0, bins) is skipped (not counted and not clamped): checking the
range on the host would cost a pass over x, so every version drops such values where it reads them,
and so does the reference. Counts are int32, so x may hold at most 2**31 - 1 elements. v2 and v3
keep the histogram in shared memory and refuse more than ``MAX_SHARED_BINS`` bins (v1 and v0 take
any number).

Cost model: each element is read once (4 bytes), the counts are written once: n * 4 + bins * 4
bytes. The ceiling is the measured copy bandwidth; a histogram that runs at the speed of reading x
has hidden its atomics.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from snippets import cuda
from snippets._checks import check_int, check_tensors, triton_device
from snippets.registry import Impl, Op, register

CU_FILE = "part3/histogram.cu"
INT32_MAX = 2**31 - 1
# 32 KB of int32 counters per block: under the 48 KB a kernel gets without opting in
MAX_SHARED_BINS = 8192


# --8<-- [start:reference]
def histogram_ref(x: torch.Tensor, bins: int) -> torch.Tensor:
    """counts[v] = number of elements of x equal to v, for v in [0, bins); other values are skipped.
    Reads n * 4 bytes, writes bins * 4; no floating-point work."""
    x = x.reshape(-1)
    in_range = (x >= 0) & (x < bins)
    return torch.bincount(x[in_range].long(), minlength=bins).to(torch.int32)
# --8<-- [end:reference]


def _check(x: torch.Tensor, bins: int, device: str, max_bins: int | None = None) -> int:
    """x: a non-empty contiguous int32 tensor on ``device`` with fewer than 2**31 elements; bins in
    [1, max_bins]. Returns bins as an int."""
    check_tensors(("x",), (x,), dtypes=(torch.int32,), device=device, allow_empty=False)
    bins = check_int("bins", bins, 1)
    if max_bins is not None and bins > max_bins:
        raise ValueError(f"bins={bins} exceeds this version's limit of {max_bins} bins (its "
                         "per-block histogram lives in shared memory); use v1 or v0 for more bins")
    if x.numel() > INT32_MAX:
        raise ValueError(f"x has {x.numel()} elements; int32 counts hold at most {INT32_MAX}")
    return bins


def histogram_torch(x: torch.Tensor, bins: int) -> torch.Tensor:
    """v0: torch.bincount of the in-range values (a mask, a compaction, then the count)."""
    bins = _check(x, bins, x.device.type if isinstance(x, torch.Tensor) else "cuda")
    return histogram_ref(x, bins)


# --------------------------------------------------------------------------------------------------
# CUDA C (csrc/part3/histogram.cu), launched through CuPy
# --------------------------------------------------------------------------------------------------

# --8<-- [start:cuda_launch]
THREADS = 256


def _launch_hist(name: str, x: torch.Tensor, bins: int, shared: bool) -> torch.Tensor:
    """The one launcher of every CUDA version: a grid-stride grid of as many blocks as fit on the
    GPU at once (fewer when x is small). Privatized kernels (``shared``) get bins * 4 bytes of
    dynamic shared memory and read four values per thread per step; every block of them adds its
    whole histogram to the global one, so a grid no larger than one wave also keeps the number of
    global atomics down."""
    counts = torch.zeros(bins, dtype=torch.int32, device=x.device)
    n = x.numel()
    fn = cuda.kernel(CU_FILE, name)
    smem = 4 * bins if shared else 0
    per_thread = 4 if shared else 1
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    blocks = max(1, min(triton.cdiv(n, THREADS * per_thread),
                        sms * cuda.resident_blocks(fn, THREADS, smem)))
    cuda.launch(fn, blocks, THREADS, (x, counts, np.int64(n), np.int32(bins)), shared_mem=smem)
    return counts
# --8<-- [end:cuda_launch]


def histogram_global_atomics(x: torch.Tensor, bins: int) -> torch.Tensor:
    """v1: one global atomicAdd per in-range element."""
    cuda.require_gpu()
    return _launch_hist("hist_global", x, _check(x, bins, "cuda"), shared=False)


def histogram_shared(x: torch.Tensor, bins: int) -> torch.Tensor:
    """v2: like v1, but each block counts into its own shared-memory histogram and adds it to the
    global one once: global atomics drop from one per element to one per bin per block. At most
    MAX_SHARED_BINS bins."""
    cuda.require_gpu()
    return _launch_hist("hist_shared", x, _check(x, bins, "cuda", MAX_SHARED_BINS), shared=True)


def histogram_warp_aggregated(x: torch.Tensor, bins: int) -> torch.Tensor:
    """v3: like v2, but equal values within a warp are merged with __match_any_sync before the
    shared atomic: one atomic per distinct value per warp, so 32 lanes hitting one bin cost one
    atomic, not 32."""
    cuda.require_gpu()
    return _launch_hist("hist_warp", x, _check(x, bins, "cuda", MAX_SHARED_BINS), shared=True)


# --------------------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------------------

# --8<-- [start:triton]
BLOCK = 2048  # values per tl.histogram call
# blocks per program: the per-program histogram absorbs 32768 values before its atomics
TILES = 16
NUM_WARPS = 8


@triton.jit
def _histogram_kernel(x_ptr, counts_ptr, n, bins, BLOCK: tl.constexpr, TILES: tl.constexpr,
                      HBINS: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    acc = tl.zeros((HBINS,), dtype=tl.int32)  # this program's private histogram, in registers
    for t in range(TILES):
        offs = (pid * TILES + t) * BLOCK + tl.arange(0, BLOCK)
        inb = offs < n
        v = tl.load(x_ptr + offs, mask=inb, other=-1)
        # Values outside [0, bins) and lanes past the end go to the spare bin `bins` (HBINS > bins),
        # which is never added to the output: the same "skip" as the CUDA versions, without relying
        # on a mask argument.
        v = tl.where(inb & (v >= 0) & (v < bins), v, bins)
        acc += tl.histogram(v, HBINS)
    b = tl.arange(0, HBINS)
    tl.atomic_add(counts_ptr + b, acc, mask=(b < bins) & (acc != 0))  # one atomic per non-empty bin


def histogram_triton(x: torch.Tensor, bins: int) -> torch.Tensor:
    """v4: tl.histogram per block of values, accumulated over TILES blocks, then one atomic per bin.
    At most MAX_SHARED_BINS bins (the histogram lives in registers, HBINS = next power of two
    above bins)."""
    bins = _check(x, bins, triton_device(), MAX_SHARED_BINS)
    counts = torch.zeros(bins, dtype=torch.int32, device=x.device)
    n = x.numel()
    # A power of two (tl.arange) with room for the spare bin; at least one bin per thread of the
    # program, so tiny bin counts do not give the compiler a histogram smaller than its
    # thread layout.
    hbins = max(triton.next_power_of_2(bins + 1), 32 * NUM_WARPS)
    grid = (triton.cdiv(n, BLOCK * TILES),)
    _histogram_kernel[grid](x, counts, n, bins, BLOCK=BLOCK, TILES=TILES, HBINS=hbins,
                            num_warps=NUM_WARPS)
    return counts
# --8<-- [end:triton]


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

# "skewed": this fraction of the values is one single bin (the rest uniform): maximal contention
SKEW = 0.9
# this fraction of every input is outside [0, bins), so every check covers skipping
OUT_OF_RANGE = 1 / 1024


# --8<-- [start:inputs]
def make_inputs(size, dtype, device, gen):
    """n int32 values: uniform over [0, bins), or with SKEW of them equal to bins // 2 ("skewed");
    about one in 1024 is replaced by -1 or bins (out of range: skipped)."""
    n, bins = size["n"], size["bins"]
    x = torch.randint(0, bins, (n,), generator=gen, dtype=torch.int32)
    if size["dist"] == "skewed":
        x[torch.rand(n, generator=gen) < SKEW] = bins // 2
    u = torch.rand(n, generator=gen)
    x[u < OUT_OF_RANGE / 2] = -1
    x[(u >= OUT_OF_RANGE / 2) & (u < OUT_OF_RANGE)] = bins
    return (x.to(device), bins)
# --8<-- [end:inputs]


HEADLINE = {"n": 2**26, "bins": 256, "dist": "uniform"}  # 256 MB of int32: four times the H200's L2
SWEEP = [{"n": 2**26, "bins": 256, "dist": d} for d in ("uniform", "skewed")]
TEST_SIZES = ([{"n": n, "bins": 256, "dist": "uniform"}
               for n in (1, 31, 32, 33, 1023, 1024, 1025, 4097, 100003)]
              + [{"n": n, "bins": 256, "dist": "skewed"} for n in (33, 4097, 100003)]
              + [{"n": 5000, "bins": 1, "dist": "uniform"},
                 {"n": 5000, "bins": 7, "dist": "skewed"},
                 {"n": 100003, "bins": 4096, "dist": "uniform"},
                 {"n": 20000, "bins": MAX_SHARED_BINS, "dist": "skewed"}])
SOURCES = (cuda.source_path(CU_FILE), _launch_hist, _check)

histogram = register(Op(
    name="histogram", part=3, chapter="part3/atomics.md", title="Histogram",
    reference=histogram_ref, make_inputs=make_inputs,
    bytes_moved=lambda s, d: 4 * s["n"] + 4 * s["bins"], flops=lambda s, d: 0,
    metric="GB/s", ceiling="copy", headline=HEADLINE, sweep=SWEEP, sweep_axis="dist",
    dtypes=(torch.int32,), test_sizes=TEST_SIZES,
    tolerances={torch.int32: (0.0, 0.0)}))  # counts are exact
histogram.add(Impl("v0", histogram_torch, "PyTorch", "torch.bincount of the in-range values",
                   (histogram_ref,)))
histogram.add(Impl("v1", histogram_global_atomics, "CUDA", "one global atomic per element",
                   SOURCES))
histogram.add(Impl("v2", histogram_shared, "CUDA", "per-block histogram in shared memory", SOURCES))
histogram.add(Impl("v3", histogram_warp_aggregated, "CUDA",
                   "shared memory + warp aggregation (__match_any_sync)", SOURCES))
histogram.add(Impl("v4", histogram_triton, "Triton", "tl.histogram per program + tl.atomic_add",
                   (_histogram_kernel,), device="any"))
