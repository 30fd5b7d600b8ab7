"""SGEMM, step by step: C = A @ B in fp32, from one thread per element towards cuBLAS.

Versions of ``sgemm`` (never renumbered); the CUDA kernels are in ``csrc/part3/sgemm/``, a file
per step:

- v0  cuBLAS through ``torch.matmul`` with TF32 switched off for the call: IEEE fp32, the baseline.
- v1  CUDA, naive: one thread per element of C, threadIdx.x down a column of C (A loads and C
  stores strided).
- v2  CUDA, like v1 with threadIdx.x along a row of C: coalesced B loads and C stores.
- v3  CUDA, 32 x 32 tiles of A and B in shared memory.
- v4  CUDA, 1-D register tiling: 64 x 64 block tile, BK = 8, 8 results per thread down a column.
- v5  CUDA, 2-D register tiling: 128 x 128 block tile, BK = 8, 8 x 8 results per thread.
- v6  CUDA, like v5 with float4 global loads, the A tile transposed (rows padded to 132) in
  shared memory.
- v7  CUDA, like v6 with warp tiling: 64 x 32 per warp, conflict-free float4 shared-memory reads.
- v8  CUDA, like v7 with two shared-memory buffers: the next tile's loads overlap this tile's FMAs.
- v11 CUDA, v8's loop as one template over tile sizes, with 64 x 64 warp tiles: 128 results
  per thread.
- v12 CUDA, the template at several tile configurations (block tile, BK, warp tile, grouped block
      order), the fastest for each shape picked by timing them once (autotuning).
- v13 CUDA, v11's warp tiling fed by 16-byte ``cp.async`` copies into 4 stages of dynamic shared
      memory (no register staging), BK = 16, the A tile K-major with padded rows.
(v9 and v10 are the CPU versions.)

Each CUDA step is a file of its own in ``csrc/part3/sgemm/``. A is M x K, B is K x N, both row-major
(contiguous) fp32; C is M x N. The cost is 2 * M * N * K FLOPs; the
fewest bytes are (M * K + K * N + M * N) * 4. The ceiling is cuBLAS itself in IEEE fp32
(``gemm_fp32``). The goal: the best version reaches at least 90% of cuBLAS fp32 at 4096^3 and
at 8192^3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import triton

from snippets import cuda
from snippets._checks import refuse_grad
from snippets.common.gemm import check_operands
from snippets.registry import Impl, Op, device_generator, register

CU_DIR = "part3/sgemm"
GRID_Y_MAX = 65535  # CUDA's limit on gridDim.y


# --8<-- [start:reference]
def sgemm_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C[i, j] = sum_k A[i, k] * B[k, j]. Each of the M * N outputs is a dot product of length K:
    2 * M * N * K FLOPs. At the least, every element of A, B and C crosses DRAM once: (M*K + K*N +
    M*N) * 4 bytes in fp32, so the arithmetic intensity can reach 2MNK / (4 (MK + KN + MN)) FLOPs
    per byte (N / 6 for a square N)."""
    m, k = a.shape
    _, n = b.shape
    c = torch.zeros((m, n), dtype=a.dtype, device=a.device)
    for kk in range(k):  # a sum of K outer products: column kk of A times row kk of B
        c += a[:, kk : kk + 1] * b[kk : kk + 1, :]
    return c
# --8<-- [end:reference]


def _reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The registered reference: the same sum, computed by one matmul (the tests call it in float64,
    where torch's float64 GEMM does no TF32 or other reduced-precision arithmetic)."""
    return a @ b


# check_operands (snippets.common.gemm): A (M x K) and B (K x N), contiguous, non-empty, 2-D,
# float32 by default, on ``device``; returns (M, N, K).


# --8<-- [start:cublas]
def sgemm_cublas(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v0: cuBLAS through torch.matmul, in IEEE fp32. torch may let cuBLAS use TF32 tensor cores for
    fp32 matmuls (10-bit mantissas); the flag is switched off for this call and
    restored afterwards."""
    check_operands(a, b)
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return torch.matmul(a, b)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
# --8<-- [end:cublas]


# --------------------------------------------------------------------------------------------------
# CUDA C (csrc/part3/sgemm/), launched through CuPy
# --------------------------------------------------------------------------------------------------

# --8<-- [start:cuda_launch]
@dataclass(frozen=True)
class SgemmConfig:
    """How a CUDA version is launched. A block of ``threads`` computes a ``tile`` = (rows, columns)
    of C and walks K in steps of ``bk``; ``rows_on_x`` puts the tile rows on gridDim.x (v1's
    mapping) instead of the tile columns. v1 and v2 read their numbers from blockDim; the other
    kernels are compiled with theirs (``CU_OPTIONS``)."""

    file: str  # in csrc/part3/sgemm/
    kernel: str
    tile: tuple[int, int]
    bk: int
    threads: tuple[int, ...]
    rows_on_x: bool = False

    @property
    def path(self) -> str:
        return f"{CU_DIR}/{self.file}"

    @property
    def results_per_thread(self) -> int:
        return self.tile[0] * self.tile[1] // math.prod(self.threads)


CONFIGS = {
    "v1": SgemmConfig("v1_naive.cu", "sgemm_v1", tile=(32, 32), bk=1, threads=(32, 32),
                      rows_on_x=True),
    "v2": SgemmConfig("v2_coalesced.cu", "sgemm_v2", tile=(32, 32), bk=1, threads=(32, 32)),
    "v3": SgemmConfig("v3_smem.cu", "sgemm_v3", tile=(32, 32), bk=32, threads=(32, 32)),
    "v4": SgemmConfig("v4_blocktile_1d.cu", "sgemm_v4", tile=(64, 64), bk=8, threads=(512,)),
    "v5": SgemmConfig("v5_blocktile_2d.cu", "sgemm_v5", tile=(128, 128), bk=8, threads=(256,)),
    "v6": SgemmConfig("v6_vectorized.cu", "sgemm_v6", tile=(128, 128), bk=8, threads=(256,)),
    "v7": SgemmConfig("v7_warptile.cu", "sgemm_v7", tile=(128, 128), bk=8, threads=(256,)),
    "v8": SgemmConfig("v8_double_buffer.cu", "sgemm_v8", tile=(128, 128), bk=8, threads=(256,)),
}


def tuned_config(bm: int, bn: int, bk: int, wm: int, wn: int, threads: int, group: int,
                 pad: int) -> SgemmConfig:
    """A configuration of the template in v11_tuned.cu; the kernel name spells out its
    template arguments."""
    return SgemmConfig("v11_tuned.cu",
                       f"sgemm_t_{bm}x{bn}_k{bk}_w{wm}x{wn}_t{threads}_g{group}_p{pad}",
                       tile=(bm, bn), bk=bk, threads=(threads,))


# The configurations of the template in v11_tuned.cu, as (bm, bn, bk, wm, wn, threads, group, pad):
# the file instantiates one kernel per entry (SGEMM_TUNED_CONFIGS below). The first is v11.
TUNED = (
    (128, 128, 8, 64, 64, 128, 0, 4),  # v11
    (128, 128, 8, 64, 64, 128, 8, 4),
    (128, 128, 8, 64, 32, 256, 8, 4),  # v8's tiles, grouped
    (128, 128, 16, 64, 32, 256, 8, 4),  # BK = 16: half the barriers per FMA
    (128, 256, 8, 64, 64, 256, 8, 4),
    (256, 128, 8, 64, 64, 256, 8, 4),
    (64, 128, 16, 32, 64, 128, 8, 4),
    (128, 256, 16, 64, 64, 256, 8, 0),  # BK = 16 in exactly 48 KB
    (256, 128, 16, 64, 64, 256, 8, 0),
    (128, 256, 8, 64, 64, 256, 16, 4),
)
TUNED_CONFIGS = [tuned_config(*c) for c in TUNED]
CONFIGS["v11"] = TUNED_CONFIGS[0]
# Each file is compiled with the numbers of these tables (-D options), which are written only here:
# v3 to v8 get their block tile, step and threads; v11_tuned.cu gets its list of configurations.
CU_OPTIONS = {cfg.path: cuda.defines(cfg.path, TILE_M=cfg.tile[0], TILE_N=cfg.tile[1],
                                     TILE_K=cfg.bk, THREADS=math.prod(cfg.threads))
              for v, cfg in CONFIGS.items() if v in ("v3", "v4", "v5", "v6", "v7", "v8")}
CU_OPTIONS[CONFIGS["v11"].path] = cuda.defines(
    CONFIGS["v11"].path,
    SGEMM_TUNED_CONFIGS="".join(f"SGEMM_TUNED({','.join(map(str, c))})" for c in TUNED))


def _launch_sgemm(a: torch.Tensor, b: torch.Tensor, cfg: SgemmConfig,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """The one launcher of every CUDA version: a 2-D grid with one block per tile of C."""
    m, n, k = check_operands(a, b)
    cuda.require_gpu()
    tiles_m, tiles_n = triton.cdiv(m, cfg.tile[0]), triton.cdiv(n, cfg.tile[1])
    grid = (tiles_m, tiles_n) if cfg.rows_on_x else (tiles_n, tiles_m)
    if grid[1] > GRID_Y_MAX:
        raise ValueError(f"{cfg.kernel}: {grid[1]} tiles along gridDim.y exceed CUDA's limit of "
                         f"{GRID_Y_MAX} (a is {m} x {k}, b is {k} x {n})")
    c = torch.empty((m, n), dtype=a.dtype, device=a.device) if out is None else out
    cuda.launch(cuda.kernel(cfg.path, cfg.kernel, CU_OPTIONS.get(cfg.path, ())), grid,
                cfg.threads, (a, b, c, np.int32(m), np.int32(n), np.int32(k)))
    return c
# --8<-- [end:cuda_launch]


def sgemm_naive(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v1: one thread per element of C, threadIdx.x down a column of C: the warp's 32 loads of A are
    K floats apart, its stores N floats apart, and its load of B is one address."""
    refuse_grad("sgemm_naive", a, b, instead="a @ b")
    return _launch_sgemm(a, b, CONFIGS["v1"])


def sgemm_coalesced(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v2: like v1 with threadIdx.x along a row of C: the warp reads 32 consecutive floats of B and
    one of A (a broadcast), and writes 32 consecutive floats of C."""
    refuse_grad("sgemm_coalesced", a, b, instead="a @ b")
    return _launch_sgemm(a, b, CONFIGS["v2"])


def sgemm_smem(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v3: like v2, but the block stages 32 x 32 tiles of A and B in shared memory, so each element
    loaded from global memory serves 32 threads instead of one."""
    refuse_grad("sgemm_smem", a, b, instead="a @ b")
    return _launch_sgemm(a, b, CONFIGS["v3"])


def sgemm_1d_tiling(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v4: like v3, but each thread computes 8 results down a column of a 64 x 64 tile (BK = 8): one
    shared load of B feeds 8 FMAs, and the accumulators live in registers."""
    refuse_grad("sgemm_1d_tiling", a, b, instead="a @ b")
    return _launch_sgemm(a, b, CONFIGS["v4"])


def sgemm_2d_tiling(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v5: like v4 in two dimensions: an 8 x 8 sub-tile per thread of a 128 x 128 tile, 16 shared
    loads per 64 FMAs instead of 9 per 8."""
    refuse_grad("sgemm_2d_tiling", a, b, instead="a @ b")
    return _launch_sgemm(a, b, CONFIGS["v5"])


def sgemm_vectorized(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v6: like v5 with 16-byte float4 global loads (guarded scalar loads where a row length is not
    a multiple of 4), the A tile stored transposed with rows padded to 132 floats (no store
    conflicts), and float4 shared-memory reads: a quarter of the load instructions."""
    refuse_grad("sgemm_vectorized", a, b, instead="a @ b")
    return _launch_sgemm(a, b, CONFIGS["v6"])


def sgemm_warptile(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v7: like v6 with warp tiling: each warp owns a 64 x 32 part of the block tile and each lane
    four 4 x 4 pieces of it, so a warp's shared-memory reads are 128 (A) and 64 (B) contiguous
    bytes: no conflicts."""
    refuse_grad("sgemm_warptile", a, b, instead="a @ b")
    return _launch_sgemm(a, b, CONFIGS["v7"])


def sgemm_double_buffer(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v8: like v7 with two shared-memory buffers: the next tile's global loads are issued before
    this tile's FMAs and stored into the other buffer after them, and one barrier per tile
    replaces two."""
    refuse_grad("sgemm_double_buffer", a, b, instead="a @ b")
    return _launch_sgemm(a, b, CONFIGS["v8"])


def sgemm_tuned(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v11: v8's double-buffered loop as a template over tile sizes, here with 64 x 64 warp tiles in
    a 128 x 128 block of 4 warps: each thread accumulates 8 x 16 = 128 results, 128 FMAs per 6
    shared-memory loads."""
    refuse_grad("sgemm_tuned", a, b, instead="a @ b")
    return _launch_sgemm(a, b, CONFIGS["v11"])


# --8<-- [start:autotune]
_TUNED: dict[tuple, SgemmConfig] = {}  # (device, M, N, K) -> the fastest configuration measured


def autotune(a: torch.Tensor, b: torch.Tensor, configs=TUNED_CONFIGS, reps: int = 5) -> SgemmConfig:
    """The fastest of ``configs`` for this problem shape, timed with CUDA events on these operands
    the first time the shape is seen and remembered after that (what ``triton.autotune`` does with
    its ``key``). Each configuration runs once untimed (compilation, caches) and then ``reps``
    times; the median decides."""
    m, n, k = check_operands(a, b)
    key = (a.device.index, m, n, k)
    if key not in _TUNED:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
        times = []
        for cfg in configs:
            _launch_sgemm(a, b, cfg, out)
            samples = []
            for _ in range(reps):
                start, end = (torch.cuda.Event(enable_timing=True),
                              torch.cuda.Event(enable_timing=True))
                start.record()
                _launch_sgemm(a, b, cfg, out)
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end))
            times.append(sorted(samples)[reps // 2])
        _TUNED[key] = configs[times.index(min(times))]
    return _TUNED[key]


def sgemm_autotuned(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v12: the template of v11 at every configuration in TUNED_CONFIGS (block tiles 64 x 128 to 256
    x 128, BK 8 or 16, 4 or 8 warps, with and without grouped block order), the fastest for this
    shape picked by :func:`autotune` on the first call."""
    refuse_grad("sgemm_autotuned", a, b, instead="a @ b")
    return _launch_sgemm(a, b, autotune(a, b))
# --8<-- [end:autotune]


# --8<-- [start:async_launch]
@dataclass(frozen=True)
class AsyncConfig(SgemmConfig):
    """A configuration of the template in v13_async.cu: ``stages`` shared-memory buffers, each an A
    tile (tile[0] rows of bk + 4 floats, K-major) and a B tile (bk rows of tile[1] floats)."""

    stages: int = 2

    @property
    def smem(self) -> int:
        """Dynamic shared memory of one block, in bytes."""
        return self.stages * (self.tile[0] * (self.bk + 4) + self.bk * self.tile[1]) * 4


def async_config(bm: int, bn: int, bk: int, wm: int, wn: int, threads: int, stages: int,
                 group: int) -> AsyncConfig:
    """A configuration of v13_async.cu; the kernel name spells out its template arguments."""
    return AsyncConfig("v13_async.cu",
                       f"sgemm_a_{bm}x{bn}_k{bk}_w{wm}x{wn}_t{threads}_s{stages}_g{group}",
                       tile=(bm, bn), bk=bk, threads=(threads,), stages=stages)


# (bm, bn, bk, wm, wn, threads, stages, group), one kernel each in v13_async.cu. The first is v13
# (4 stages of 128 x 128 x 16: 72 KiB); the second, 3 stages of 128 x 256 x 16 with 8 warps, is
# compiled and tested for the next measurement to compare with it.
ASYNC = (
    (128, 128, 16, 64, 64, 128, 4, 8),
    (128, 256, 16, 64, 64, 256, 3, 8),
)
ASYNC_CONFIGS = [async_config(*c) for c in ASYNC]
V13 = ASYNC_CONFIGS[0]   # (not in CONFIGS: that table is complete before CU_OPTIONS reads it)
# v13_async.cu is compiled with the list of ASYNC configurations (-D option), written only here
ASYNC_OPTIONS = cuda.defines(
    V13.path,
    SGEMM_ASYNC_CONFIGS="".join(f"SGEMM_ASYNC({','.join(map(str, c))})" for c in ASYNC))


def _launch_async(a: torch.Tensor, b: torch.Tensor, cfg: AsyncConfig) -> torch.Tensor:
    """The launcher of v13_async.cu: _launch_sgemm's grid, plus the dynamic shared memory, which
    above 48 KB a kernel must opt in to (its max_dynamic_shared_size_bytes attribute)."""
    m, n, k = check_operands(a, b)
    cuda.require_gpu()
    grid = (triton.cdiv(n, cfg.tile[1]), triton.cdiv(m, cfg.tile[0]))
    if grid[1] > GRID_Y_MAX:
        raise ValueError(f"{cfg.kernel}: {grid[1]} tiles along gridDim.y exceed CUDA's limit of "
                         f"{GRID_Y_MAX} (a is {m} x {k}, b is {k} x {n})")
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    fn = cuda.kernel(cfg.path, cfg.kernel, ASYNC_OPTIONS)
    if fn.max_dynamic_shared_size_bytes < cfg.smem:
        fn.max_dynamic_shared_size_bytes = cfg.smem
    cuda.launch(fn, grid, cfg.threads, (a, b, c, np.int32(m), np.int32(n), np.int32(k)),
                shared_mem=cfg.smem)
    return c


def sgemm_async(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v13: like v11 (64 x 64 warp tiles in a 128 x 128 block of 4 warps), but the tiles reach
    shared memory by 16-byte cp.async copies into 4 stages, three tiles ahead of the FMAs, with
    no register staging and one barrier per BK = 16 step; the A tile stays K-major."""
    refuse_grad("sgemm_async", a, b, instead="a @ b")
    return _launch_async(a, b, V13)
# --8<-- [end:async_launch]


# --------------------------------------------------------------------------------------------------
# The same product on the CPU, for the CPU-vs-GPU comparison
# --------------------------------------------------------------------------------------------------

# --8<-- [start:cpu]
def sgemm_numpy(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v9: NumPy on the CPU (the BLAS NumPy ships with, multi-threaded), for comparison with
    the GPU."""
    check_operands(a, b, device="cpu")
    return torch.from_numpy(a.numpy() @ b.numpy())


def sgemm_torch_cpu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v10: torch.matmul on the CPU (all cores), for comparison with the GPU."""
    check_operands(a, b, device="cpu")
    return torch.matmul(a, b)
# --8<-- [end:cpu]


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def _make_inputs(size, dtype, device, gen):
    """A (m x k) and B (k x n) of standard normal values, drawn on the target device from a seed
    taken from ``gen``."""
    dev_gen = device_generator(gen, device)
    a = torch.randn((size["m"], size["k"]), generator=dev_gen, device=device, dtype=torch.float32)
    b = torch.randn((size["k"], size["n"]), generator=dev_gen, device=device, dtype=torch.float32)
    return a.to(dtype), b.to(dtype)


def _flops(size, dtype) -> int:
    return 2 * size["m"] * size["n"] * size["k"]  # one multiply and one add per (i, j, k)


def _bytes(size, dtype) -> int:
    m, n, k = size["m"], size["n"], size["k"]
    return (m * k + k * n + m * n) * dtype.itemsize


def tolerance_for_k(k: int) -> tuple[float, float]:
    """(rtol, atol) for fp32 against float64 with standard normal inputs. An entry of C is a sum of
    K products of magnitude ~1, so it is ~sqrt(K) in size; the rounding error of a length-K fp32 sum
    grows like u * sqrt(K) * sqrt(K) (u = 2^-24, K roundings of partial sums of size ~sqrt(K)). atol
    = 1e-6 * K leaves a margin of several times that; TF32 inputs (u = 2^-11) would miss it
    by far."""
    return 1e-5, 1e-6 * k + 1e-6


HEADLINE = {"m": 4096, "n": 4096, "k": 4096}  # 3 x 64 MiB: several times the L2 of an H100/H200
SWEEP = [{"m": s, "n": s, "k": s} for s in (1024, 2048, 4096, 8192)]


def _upto_4096(size) -> bool:
    """The naive steps and the CPU versions take seconds a call at 8192^3: they are timed up
    to 4096^3."""
    return size["m"] <= 4096
TEST_SIZES = [{"m": m, "n": n, "k": k}
              for m, n, k in ((1, 1, 1), (17, 33, 9), (64, 64, 64), (127, 129, 65),
                              (256, 192, 320))]
LAUNCHER = (_launch_sgemm, check_operands)


def _sources(version: str) -> tuple:
    """What a CUDA version's speed depends on: its file, the headers it includes, and
    the launcher."""
    return (*cuda.source_files(CONFIGS[version].path), *LAUNCHER)

sgemm = register(Op(
    name="sgemm", part=3, chapter="part3/sgemm.md", title="SGEMM",
    reference=_reference, make_inputs=_make_inputs, bytes_moved=_bytes, flops=_flops,
    metric="TFLOP/s", ceiling="gemm_fp32", headline=HEADLINE, sweep=SWEEP, dtypes=(torch.float32,),
    test_sizes=TEST_SIZES, sweep_axis="m",
    # One tolerance for every size the harness and the generic tests check, so sized for the largest
    # K (8192): tolerance_for_k(8192) = (1e-5, ~8.2e-3). tests/test_part3_sgemm.py uses
    # tolerance_for_k per shape.
    tolerances={torch.float32: tolerance_for_k(max(s["k"] for s in [HEADLINE, *SWEEP]))},
    tolerance_at=lambda s, d: tolerance_for_k(s["k"])))
sgemm.add(Impl("v0", sgemm_cublas, "PyTorch", "cuBLAS via torch.matmul, TF32 off",
               (check_operands,)))
sgemm.add(Impl("v1", sgemm_naive, "CUDA", "naive, threadIdx.x along rows of C",
               _sources("v1"), bench_if=_upto_4096))
sgemm.add(Impl("v2", sgemm_coalesced, "CUDA", "naive, threadIdx.x along columns (coalesced)",
               _sources("v2"), bench_if=_upto_4096))
sgemm.add(Impl("v3", sgemm_smem, "CUDA", "32x32 shared-memory tiles",
               _sources("v3"), bench_if=_upto_4096))
sgemm.add(Impl("v4", sgemm_1d_tiling, "CUDA", "64x64 tile, 8 results per thread (1-D)",
               _sources("v4")))
sgemm.add(Impl("v5", sgemm_2d_tiling, "CUDA", "128x128 tile, 8x8 results per thread (2-D)",
               _sources("v5")))
sgemm.add(Impl("v6", sgemm_vectorized, "CUDA", "like v5, float4 loads, A transposed in smem",
               _sources("v6")))
sgemm.add(Impl("v7", sgemm_warptile, "CUDA", "like v6, 64x32 warp tiles", _sources("v7")))
sgemm.add(Impl("v8", sgemm_double_buffer, "CUDA", "like v7, double-buffered shared memory",
               _sources("v8")))
sgemm.add(Impl("v9", sgemm_numpy, "NumPy", "NumPy's BLAS on the CPU", (check_operands,),
               device="cpu", timer="host", bench_if=_upto_4096, origin="library"))
sgemm.add(Impl("v10", sgemm_torch_cpu, "PyTorch", "torch.matmul on the CPU (all cores)",
               (check_operands,), device="cpu", timer="host", bench_if=_upto_4096,
               origin="library"))
sgemm.add(Impl("v11", sgemm_tuned, "CUDA",
               "v8's loop as a template, 64x64 warp tiles, 128 results/thread", _sources("v11")))
sgemm.add(Impl("v12", sgemm_autotuned, "CUDA",
               "autotuned over 10 tile configs, grouped block order",
               (*_sources("v11"), autotune, TUNED_CONFIGS)))
sgemm.add(Impl("v13", sgemm_async, "CUDA",
               "like v11, cp.async into 4 smem stages, BK 16, A K-major",
               (*cuda.source_files(V13.path), _launch_async, check_operands,
                ASYNC_CONFIGS)))
