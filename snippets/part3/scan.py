"""Scan (inclusive prefix sum): out[i] = x[0] + x[1] + ... + x[i], from a tile in shared memory to
the device.

Versions of ``scan`` (never renumbered); the CUDA kernels are in ``csrc/part3/scan.cu``:

- v0  ``torch.cumsum``: the library baseline.
- v1  CUDA, Kogge-Stone scan of 1024-element tiles in shared memory, then the three-phase
      device-wide scheme: scan the tiles, scan the tile sums (the same scheme again, recursively,
      until one tile is left), add each tile's offset.
- v2  CUDA, like v1 but each tile is scanned with Brent-Kung (up-sweep, down-sweep): 2n additions
      instead of n log2(1024), at twice the number of steps.
- v3  CUDA, reduce-then-scan: 4096-element tiles, 16 elements per thread scanned sequentially in
      registers and warp shuffles across threads; pass 1 sums each tile, pass 2 (one block) scans
      the sums, pass 3 rescans each tile with its offset. Reads x twice and writes it once: 3 * n *
      4 bytes.
- v4  Triton, the v3 scheme: ``tl.sum`` per block, a one-program carry pass over the block sums,
      then ``tl.cumsum`` per block plus its offset.
- v5  CUDA, single pass with decoupled look-back: the v3 tile code, but each tile publishes its sum
      and then its inclusive prefix, and a tile adds up its predecessors' published values instead
      of waiting for a separate pass. Reads x once and writes it once.
- v6  CUDA, like v5 with the look-back done by a whole warp, 32 predecessors per step.
- v7  CUDA, CUB's recipe: like v6, but 8192-element tiles read and written with 16-byte vectors,
      the tile's sum published after one block barrier, and the look-back overlapped with the rest
      of the block's work (each warp transposes its own segment; only the carry waits).
- v8  CUDA, v7's kernel with the same 8192-element tile as 256 threads of 32 elements.
- v9  CUDA (``snippets/part3/scan_v9.py``, ``csrc/scan/scan_v9.cu``), v8's tile in a persistent
      grid, each block prefetching its next tile before the look-back of the current one.

Inputs: a non-empty contiguous 1-D float32 or int32 tensor; the result has its shape and dtype
(int32 wraps on overflow like any int32 add). fp32 addition is not associative, so each version adds
in its own order and none matches torch bit for bit: the checks compare against a float64 reference
with a relative tolerance, on inputs in [0, 1) (every prefix is a sum of positive terms, so the
error is relative to the running sum; see ``TOLERANCES``); the dedicated tests also use small
integers stored as fp32, whose sums are exact in any order.

Cost model: every element is read once and written once, 2 * n * 4 bytes; the ceiling is the
measured copy bandwidth. Goal: the best version reaches at least 75% of copy at n = 2**28.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from snippets import cuda
from snippets._checks import check_tensors, refuse_grad, triton_device
from snippets.registry import Impl, Op, register

CU_FILE = "part3/scan.cu"
DTYPES = (torch.float32, torch.int32)
SUFFIX = {torch.float32: "f32", torch.int32: "i32"}


# --8<-- [start:reference]
def scan_ref(x: torch.Tensor) -> torch.Tensor:
    """out[i] = sum of x[0..i]. Reads n elements and writes n: 2 * n * itemsize bytes, n - 1
    additions. (torch.cumsum would widen int32 to int64; the op keeps the input's dtype.)"""
    return torch.cumsum(x, dim=0, dtype=x.dtype)
# --8<-- [end:reference]


def check_scan_input(x: torch.Tensor, device: str) -> None:
    """The op's rule for every version: one 1-D tensor of DTYPES on ``device``, not empty."""
    check_tensors(("x",), (x,), dtypes=DTYPES, device=device, allow_empty=False)
    if x.dim() != 1:
        raise ValueError(f"x must be 1-D, got shape {tuple(x.shape)}; flatten it first "
                         "(x.reshape(-1))")


def scan_torch(x: torch.Tensor) -> torch.Tensor:
    """v0: torch.cumsum (on CUDA, CUB's single-pass scan)."""
    check_scan_input(x, x.device.type if isinstance(x, torch.Tensor) else "cuda")
    return torch.cumsum(x, dim=0, dtype=x.dtype)


# --------------------------------------------------------------------------------------------------
# CUDA C (csrc/part3/scan.cu), launched through CuPy
# --------------------------------------------------------------------------------------------------

TILE = 1024         # elements per tile in v1 and v2
RTS_THREADS = 256   # threads per block in v3, v5 and v6
ITEMS = 16          # elements per thread in v3, v5 and v6
RTS_TILE = RTS_THREADS * ITEMS  # elements per tile in v3, v5 and v6
SUMS_THREADS = 1024  # the one block that scans v3's tile sums
V7_THREADS = 512    # threads per block in v7
V7_ITEMS = 16       # elements per thread in v7: four 16-byte vectors
V7_TILE = V7_THREADS * V7_ITEMS  # elements per tile in v7
V8_THREADS = 256    # v8: v7's kernel, the same tile cut into half the threads ...
V8_ITEMS = 32       # ... of twice the elements: eight 16-byte vectors per thread
V8_TILE = V8_THREADS * V8_ITEMS
# scan.cu is compiled with these numbers (-D options): they are written only here
CU_OPTIONS = cuda.defines(CU_FILE, TILE=TILE, RTS_THREADS=RTS_THREADS, ITEMS=ITEMS,
                          SUMS_THREADS=SUMS_THREADS, V7_THREADS=V7_THREADS, V7_ITEMS=V7_ITEMS,
                          V8_THREADS=V8_THREADS, V8_ITEMS=V8_ITEMS)


def _kernel(name: str, dtype: torch.dtype):
    return cuda.kernel(CU_FILE, f"{name}_{SUFFIX[dtype]}", CU_OPTIONS)


# --8<-- [start:three_phase]
def _scan_three_phase(x: torch.Tensor, out: torch.Tensor, tile_kernel: str,
                      threads: int) -> torch.Tensor:
    """v1 and v2: scan each TILE-element tile (writing the tile's total to ``sums``), scan ``sums``
    in place by the same scheme (a recursion: 2**28 elements take three levels), then add to every
    tile the scanned total of the tiles before it."""
    n = x.numel()
    tiles = triton.cdiv(n, TILE)
    sums = torch.empty(tiles, dtype=x.dtype, device=x.device)
    cuda.launch(_kernel(tile_kernel, x.dtype), tiles, threads, (x, out, sums, np.int64(n)))
    if tiles > 1:
        # in place: a tile reads its input before writing
        _scan_three_phase(sums, sums, tile_kernel, threads)
        cuda.launch(_kernel("add_offsets", x.dtype), tiles - 1, TILE, (out, sums, np.int64(n)))
    return out
# --8<-- [end:three_phase]


def scan_kogge_stone(x: torch.Tensor) -> torch.Tensor:
    """v1: Kogge-Stone tiles of 1024 elements (one per thread) in the three-phase
    device-wide scheme."""
    refuse_grad("scan_kogge_stone", x, instead="torch.cumsum")
    cuda.require_gpu()
    check_scan_input(x, "cuda")
    return _scan_three_phase(x, torch.empty_like(x), "scan_tiles_ks", TILE)


def scan_brent_kung(x: torch.Tensor) -> torch.Tensor:
    """v2: like v1, but Brent-Kung tiles (512 threads, two elements each): linear work instead of n
    log n."""
    refuse_grad("scan_brent_kung", x, instead="torch.cumsum")
    cuda.require_gpu()
    check_scan_input(x, "cuda")
    return _scan_three_phase(x, torch.empty_like(x), "scan_tiles_bk", TILE // 2)


# --8<-- [start:rts_launch]
def scan_reduce_then_scan(x: torch.Tensor) -> torch.Tensor:
    """v3: like v1's three phases, but 16 elements per thread in registers and the first pass only
    sums each tile: no tile is written twice, and the tile sums fit one block's scan at any n."""
    refuse_grad("scan_reduce_then_scan", x, instead="torch.cumsum")
    cuda.require_gpu()
    check_scan_input(x, "cuda")
    n = x.numel()
    out = torch.empty_like(x)
    tiles = triton.cdiv(n, RTS_TILE)
    sums = torch.empty(tiles, dtype=x.dtype, device=x.device)
    cuda.launch(_kernel("reduce_tiles", x.dtype), tiles, RTS_THREADS, (x, sums, np.int64(n)))
    # now exclusive offsets
    cuda.launch(_kernel("scan_sums", x.dtype), 1, SUMS_THREADS, (sums, np.int64(tiles)))
    cuda.launch(_kernel("scan_tiles_rts", x.dtype), tiles, RTS_THREADS, (x, out, sums, np.int64(n)))
    return out


def launch_lookback(name: str, x: torch.Tensor, threads: int, tile: int, file: str = CU_FILE,
                    options: tuple[str, ...] = CU_OPTIONS) -> torch.Tensor:
    """The single-pass scans (v5 to v8, v10, v11): one block of ``threads`` per ``tile`` elements
    and a zeroed status array (a tile counter, then one word per tile). Each block takes its tile
    number from the counter, not from blockIdx.x. The kernel is ``<name>_f32`` or ``<name>_i32`` of
    ``csrc/<file>`` compiled with ``options``."""
    refuse_grad(name, x, instead="torch.cumsum")
    cuda.require_gpu()
    check_scan_input(x, "cuda")
    n = x.numel()
    out = torch.empty_like(x)
    tiles = triton.cdiv(n, tile)
    # [0]: tile counter; then one word per tile
    state = torch.zeros(tiles + 1, dtype=torch.int64, device=x.device)
    with torch.cuda.device(x.device):
        fn = cuda.kernel(file, f"{name}_{SUFFIX[x.dtype]}", options)
        cuda.launch(fn, tiles, threads, (x, out, state, np.int64(n)))
    return out


def scan_lookback(x: torch.Tensor) -> torch.Tensor:
    """v5: like v3, but one pass: each tile publishes its sum, then its inclusive prefix, in a
    zeroed status array, and finds its offset by looking back at its predecessors, one at a time. x
    is read once."""
    return launch_lookback("scan_lookback", x, RTS_THREADS, RTS_TILE)


def scan_lookback_warp(x: torch.Tensor) -> torch.Tensor:
    """v6: like v5, but a whole warp looks back, 32 predecessors per round trip to L2 instead of
    one: the look-back of one thread was a chain of dependent loads that the whole block waited for.
    It also scans each tile once instead of twice."""
    return launch_lookback("scan_lookback_warp", x, RTS_THREADS, RTS_TILE)
# --8<-- [end:rts_launch]


# --8<-- [start:v7_launch]
def scan_lookback_v7(x: torch.Tensor) -> torch.Tensor:
    """v7: like v6, but CUB's recipe: V7_TILE-element tiles (512 threads x 16) read and written
    with 16-byte vectors, the tile's sum published after one block barrier instead of three, and
    the look-back warp's wait overlapped with the other warps' local work. x is read once."""
    return launch_lookback("scan_lookback_v7", x, V7_THREADS, V7_TILE)
# --8<-- [end:v7_launch]


# --8<-- [start:v8_launch]
def scan_lookback_v8(x: torch.Tensor) -> torch.Tensor:
    """v8: v7's kernel with the same 8192-element tile as 256 threads x 32: half the warps, twice
    the 16-byte loads in flight per thread."""
    return launch_lookback("scan_lookback_v8", x, V8_THREADS, V8_TILE)
# --8<-- [end:v8_launch]


# --------------------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------------------

# --8<-- [start:triton]
BLOCK = 4096
NUM_WARPS = 8


@triton.jit
def _block_sum_kernel(x_ptr, sums_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.store(sums_ptr + pid, tl.sum(x, axis=0))


@triton.jit
def _carry_kernel(sums_ptr, tiles, BLOCK: tl.constexpr):
    """One program: block sums -> exclusive offsets, in place, BLOCK at a time with a
    running carry."""
    # a zero of the right type
    carry = tl.sum(tl.zeros((BLOCK,), dtype=sums_ptr.dtype.element_ty), axis=0)
    for start in range(0, tiles, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        v = tl.load(sums_ptr + offs, mask=offs < tiles, other=0)
        tl.store(sums_ptr + offs, tl.cumsum(v, axis=0) - v + carry, mask=offs < tiles)
        carry += tl.sum(v, axis=0)


@triton.jit
def _scan_block_kernel(x_ptr, out_ptr, offsets_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.store(out_ptr + offs, tl.cumsum(x, axis=0) + tl.load(offsets_ptr + pid), mask=offs < n)


def scan_triton(x: torch.Tensor) -> torch.Tensor:
    """v4: the v3 scheme in Triton: block sums, one carry program, tl.cumsum per block plus
    its offset."""
    refuse_grad("scan_triton", x, instead="torch.cumsum")
    check_scan_input(x, triton_device())
    n = x.numel()
    out = torch.empty_like(x)
    tiles = triton.cdiv(n, BLOCK)
    sums = torch.empty(tiles, dtype=x.dtype, device=x.device)
    _block_sum_kernel[(tiles,)](x, sums, n, BLOCK=BLOCK, num_warps=NUM_WARPS)
    _carry_kernel[(1,)](sums, tiles, BLOCK=BLOCK, num_warps=NUM_WARPS)
    _scan_block_kernel[(tiles,)](x, out, sums, n, BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out
# --8<-- [end:triton]


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

# --8<-- [start:inputs]
def make_inputs(size, dtype, device, gen):
    """float32: uniform in [0, 1), so the prefix grows and every output is a sum of positive terms;
    int32: uniform in [-4, 4], exact in any order."""
    n = size["n"]
    if dtype == torch.int32:
        return (torch.randint(-4, 5, (n,), generator=gen, dtype=torch.int32).to(device),)
    return (torch.rand(n, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype),)


# fp32 against float64: a sum of positive terms carries a relative error of at most (additions on
# its path) * 2**-24. Tree-shaped orders keep that path at a few dozen additions; a chain of
# per-tile carries (v4's carry pass, v5's look-back, CUB's own look-back in v0) puts one rounding
# per tile on it, which behaves like a random walk: about sqrt(65536) * 2**-24 / sqrt(3), near 1e-5,
# at 2**28 elements in 4096-element tiles.
TOLERANCES = {torch.float32: (2e-4, 1e-6), torch.int32: (0.0, 0.0)}
# --8<-- [end:inputs]

HEADLINE = {"n": 2**28}  # 1 GiB in, 1 GiB out: far beyond the L2
SWEEP = [{"n": 2**k} for k in (20, 22, 24, 26, 28)]
TEST_SIZES = [{"n": n} for n in (1, 31, 32, 33, 1023, 1024, 1025, 4097, 100003)]
THREE_PHASE = (cuda.source_path(CU_FILE), _scan_three_phase, check_scan_input)
SINGLE = (cuda.source_path(CU_FILE), check_scan_input)

scan = register(Op(
    name="scan", part=3, chapter="part3/scan.md", title="Inclusive scan (prefix sum)",
    reference=scan_ref, make_inputs=make_inputs,
    bytes_moved=lambda s, d: 2 * s["n"] * d.itemsize,
    flops=lambda s, d: s["n"] - 1 if d.is_floating_point else 0,
    metric="GB/s", ceiling="copy", headline=HEADLINE, sweep=SWEEP, dtypes=DTYPES,
    test_sizes=TEST_SIZES, tolerances=TOLERANCES, bench_dtypes=(torch.float32,)))
scan.add(Impl("v0", scan_torch, "PyTorch", "torch.cumsum"))
scan.add(Impl("v1", scan_kogge_stone, "CUDA", "Kogge-Stone tiles, three phases, recursive",
              THREE_PHASE))
scan.add(Impl("v2", scan_brent_kung, "CUDA", "Brent-Kung tiles, three phases, recursive",
              THREE_PHASE))
scan.add(Impl("v3", scan_reduce_then_scan, "CUDA", "reduce-then-scan, 16 per thread in registers",
              SINGLE))
scan.add(Impl("v4", scan_triton, "Triton", "tl.sum, carry pass, tl.cumsum per 4096",
              (_block_sum_kernel, _carry_kernel, _scan_block_kernel), device="any"))
scan.add(Impl("v5", scan_lookback, "CUDA", "single pass, decoupled look-back", SINGLE))
scan.add(Impl("v6", scan_lookback_warp, "CUDA",
              "like v5, warp-wide look-back, one block scan per tile", SINGLE))
scan.add(Impl("v7", scan_lookback_v7, "CUDA",
              "8192-element tiles, 16-byte vectors, early aggregate, overlapped look-back", SINGLE))
scan.add(Impl("v8", scan_lookback_v8, "CUDA",
              "v7's kernel, the tile as 256 threads x 32 elements", SINGLE))
