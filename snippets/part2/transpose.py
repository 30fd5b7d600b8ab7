"""Matrix transpose, step by step: from one thread per element to tiles in shared memory and
vector loads.

Versions of ``transpose`` (never renumbered); all CUDA kernels are in ``csrc/part2/transpose.cu``:

- v0  ``x.t().contiguous()``: the library baseline.
- v1  CUDA, one thread per element: reads coalesced, writes strided.
- v2  CUDA, like v1 with the mapping swapped: writes coalesced, reads strided.
- v3  CUDA, a 32 x 32 tile through shared memory: both global sides coalesced; the column read of
      the [32][32] tile is a 32-way bank conflict.
- v4  CUDA, like v3 with tile rows padded to 33 floats: no bank conflicts.
- v5  CUDA, like v3 with an XOR swizzle instead of the padding: no bank conflicts, no wasted words.
- v6  CUDA, like v4 with 32 x 8 threads per tile: 4 elements per thread.
- v7  CUDA, like v6 with 16-byte float4 global loads and stores, 16 elements per thread; falls back
      to v6 when a dimension is not a multiple of 4 or x is not 16-byte aligned.
- v8  Triton: load a 2-D block, ``tl.trans``, store.

out = x.T as a new contiguous n x m matrix. Every element is read once and written once: the cost is
2 * m * n * itemsize bytes, the ceiling the measured copy bandwidth. The goal: the best version
reaches at least 85% of copy at 16384 x 16384 fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from snippets import cuda
from snippets._checks import check_tensors, refuse_grad, triton_device
from snippets.registry import Impl, Op, device_generator, register

CU_FILE = "part2/transpose.cu"
FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)


# --8<-- [start:reference]
def transpose_ref(x: torch.Tensor) -> torch.Tensor:
    """out[j, i] = x[i, j], materialised as a contiguous n x m matrix. Reads m * n elements and
    writes m * n: 2 * m * n * itemsize bytes, no FLOPs."""
    return x.t().contiguous()
# --8<-- [end:reference]


def transpose_torch(x: torch.Tensor) -> torch.Tensor:
    """v0: PyTorch's own copy kernel, given the strided view x.t()."""
    return x.t().contiguous()


def _check_matrix(x: torch.Tensor, dtypes: tuple, device: str) -> tuple[int, int]:
    """A contiguous, non-empty 2-D matrix of one of ``dtypes`` on ``device``; returns (m, n)."""
    check_tensors(("x",), (x,), dtypes=dtypes, device=device, allow_empty=False)
    if x.dim() != 2:
        raise ValueError(f"x must be a 2-D matrix, got shape {tuple(x.shape)}")
    return x.shape


# --------------------------------------------------------------------------------------------------
# CUDA C (csrc/part2/transpose.cu), launched through CuPy
# --------------------------------------------------------------------------------------------------

# --8<-- [start:cuda_launch]
@dataclass(frozen=True)
class TransposeConfig:
    """How a CUDA version is launched: each block of ``threads`` = (x, y) threads covers a ``tile``
    of (rows, columns) of x, so each thread moves rows * columns / (x * y) elements. The kernels
    are compiled with these numbers (``CU_OPTIONS``)."""

    kernel: str
    tile: tuple[int, int]
    threads: tuple[int, int]

    @property
    def elems_per_thread(self) -> int:
        return self.tile[0] * self.tile[1] // (self.threads[0] * self.threads[1])


TILE = 32  # the side of the square tile of v3 to v7
CONFIGS = {
    "v1": TransposeConfig("transpose_v1", tile=(8, 32), threads=(32, 8)),
    "v2": TransposeConfig("transpose_v2", tile=(32, 8), threads=(32, 8)),
    "v3": TransposeConfig("transpose_v3", tile=(TILE, TILE), threads=(TILE, TILE)),
    "v4": TransposeConfig("transpose_v4", tile=(TILE, TILE), threads=(TILE, TILE)),
    "v5": TransposeConfig("transpose_v5", tile=(TILE, TILE), threads=(TILE, TILE)),
    "v6": TransposeConfig("transpose_v6", tile=(TILE, TILE), threads=(TILE, 8)),
    # a float4 per thread: TILE / 4 threads span a tile row
    "v7": TransposeConfig("transpose_v7", tile=(TILE, TILE), threads=(TILE // 4, 8)),
}
# transpose.cu is compiled with v1's and v2's blocks, TILE, and the threads along y of each tiled
# version (its ROWS): -D options, so that the numbers are written only here
CU_OPTIONS = cuda.defines(
    CU_FILE, BLOCK_X_V1=CONFIGS["v1"].threads[0], BLOCK_Y_V1=CONFIGS["v1"].threads[1],
    BLOCK_X_V2=CONFIGS["v2"].threads[0], BLOCK_Y_V2=CONFIGS["v2"].threads[1], TILE=TILE,
    **{f"ROWS_{v.upper()}": CONFIGS[v].threads[1] for v in ("v3", "v4", "v5", "v6", "v7")})


def vector_path_ok(x: torch.Tensor) -> bool:
    """Whether v7's float4 kernel can take x: every row of x and of out = x.T must start on a
    16-byte boundary, which needs both dimensions to be multiples of 4 floats and x itself 16-byte
    aligned (a fresh allocation is; a view such as w.view(-1)[1:] is not)."""
    m, n = x.shape
    return m % 4 == 0 and n % 4 == 0 and x.data_ptr() % 16 == 0


def _launch_transpose(x: torch.Tensor, cfg: TransposeConfig) -> torch.Tensor:
    """The one launcher of every CUDA version: a 1-D grid with one block per tile."""
    cuda.require_gpu()
    m, n = _check_matrix(x, (torch.float32,), "cuda")
    out = torch.empty((n, m), dtype=x.dtype, device=x.device)
    # 2**31 - 1 blocks: 2 TiB of fp32
    blocks = triton.cdiv(m, cfg.tile[0]) * triton.cdiv(n, cfg.tile[1])
    cuda.launch(cuda.kernel(CU_FILE, cfg.kernel, CU_OPTIONS), blocks, cfg.threads,
                (x, out, np.int64(m), np.int64(n)))
    return out
# --8<-- [end:cuda_launch]


def transpose_naive(x: torch.Tensor) -> torch.Tensor:
    """v1: one thread per element, threadIdx.x along a row of x: reads coalesced, writes 4 * m
    bytes apart."""
    refuse_grad("transpose_naive", x, instead="x.t().contiguous()")
    return _launch_transpose(x, CONFIGS["v1"])


def transpose_naive_rows(x: torch.Tensor) -> torch.Tensor:
    """v2: like v1 with threadIdx.x down a column of x: writes coalesced, reads 4 * n bytes apart.
    Whichever index the warp runs along, one side of a transpose is strided."""
    refuse_grad("transpose_naive_rows", x, instead="x.t().contiguous()")
    return _launch_transpose(x, CONFIGS["v2"])


def transpose_smem(x: torch.Tensor) -> torch.Tensor:
    """v3: like v1, but a 32 x 32 tile is staged in shared memory so that the write is coalesced
    too; the column read of the [32][32] tile hits one bank 32 times."""
    refuse_grad("transpose_smem", x, instead="x.t().contiguous()")
    return _launch_transpose(x, CONFIGS["v3"])


def transpose_smem_padded(x: torch.Tensor) -> torch.Tensor:
    """v4: like v3 with rows of 33 floats in shared memory: a column read now hits 32
    different banks."""
    refuse_grad("transpose_smem_padded", x, instead="x.t().contiguous()")
    return _launch_transpose(x, CONFIGS["v4"])


def transpose_smem_swizzled(x: torch.Tensor) -> torch.Tensor:
    """v5: like v3, but column c of tile row r is stored at column c ^ r: no conflicts, and
    no padding."""
    refuse_grad("transpose_smem_swizzled", x, instead="x.t().contiguous()")
    return _launch_transpose(x, CONFIGS["v5"])


def transpose_smem_4_per_thread(x: torch.Tensor) -> torch.Tensor:
    """v6: like v4 with 32 x 8 threads per 32 x 32 tile: 4 elements per thread, so the index math is
    shared by 4 elements and each thread has 4 loads in flight before the barrier."""
    refuse_grad("transpose_smem_4_per_thread", x, instead="x.t().contiguous()")
    return _launch_transpose(x, CONFIGS["v6"])


def transpose_vec4(x: torch.Tensor) -> torch.Tensor:
    """v7: like v6 with 16-byte float4 loads and stores, 8 x 8 threads per tile, 16 elements per
    thread. Falls back to v6 when a dimension is not a multiple of 4 or x is not 16-byte aligned."""
    refuse_grad("transpose_vec4", x, instead="x.t().contiguous()")
    cuda.require_gpu()
    # refuse bad input before looking at its shape or address
    _check_matrix(x, (torch.float32,), "cuda")
    return _launch_transpose(x, CONFIGS["v7"] if vector_path_ok(x) else CONFIGS["v6"])


# --------------------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------------------

# --8<-- [start:triton]
# 64 x 64 tiles (16 KB of fp32) with 4 warps: 32 elements per thread. tl.trans changes which thread
# holds which element; the compiler does that exchange through shared memory, with its own
# conflict-free layout.
BLOCK_M, BLOCK_N, NUM_WARPS = 64, 64, 4


@triton.jit
def _transpose_kernel(x_ptr, out_ptr, m, n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)  # a 1-D grid, one program per tile, as in the CUDA versions
    tiles_n = tl.cdiv(n, BLOCK_N)
    pid_m = pid // tiles_n
    pid_n = pid % tiles_n
    # rows of x, int64: row * n passes 2**31
    offs_m = tl.arange(0, BLOCK_M).to(tl.int64) + pid_m * BLOCK_M
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64) + pid_n * BLOCK_N  # columns of x
    mask = (offs_m[:, None] < m) & (offs_n[None, :] < n)            # (BLOCK_M, BLOCK_N)
    # (BLOCK_M, BLOCK_N), rows of x
    tile = tl.load(x_ptr + offs_m[:, None] * n + offs_n[None, :], mask=mask)
    # out[j, i] = x[i, j]: the out tile is (BLOCK_N, BLOCK_M), row j at out_ptr + j * m
    mask_t = (offs_n[:, None] < n) & (offs_m[None, :] < m)          # (BLOCK_N, BLOCK_M)
    tl.store(out_ptr + offs_n[:, None] * m + offs_m[None, :], tl.trans(tile), mask=mask_t)


def transpose_triton(x: torch.Tensor) -> torch.Tensor:
    """v8: Triton; contiguous float32/float16/bfloat16 matrices."""
    refuse_grad("transpose_triton", x, instead="x.t().contiguous()")
    m, n = _check_matrix(x, FLOAT_TYPES, triton_device())
    out = torch.empty((n, m), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, BLOCK_M) * triton.cdiv(n, BLOCK_N),)
    _transpose_kernel[grid](x, out, m, n, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=NUM_WARPS)
    return out
# --8<-- [end:triton]


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def _make_inputs(size, dtype, device, gen):
    """One m x n matrix of normal values, drawn on the target device from a seed taken from ``gen``
    (a 1 GiB input is not first built on the host)."""
    dev_gen = device_generator(gen, device)
    x = torch.randn((size["m"], size["n"]), generator=dev_gen, device=device, dtype=torch.float32)
    return (x.to(dtype),)


def _bytes(size, dtype) -> int:
    return 2 * size["m"] * size["n"] * dtype.itemsize


HEADLINE = {"m": 16384, "n": 16384}  # 1 GiB fp32 in, 1 GiB out: far beyond L2
SWEEP = [{"m": 4096, "n": 4096}, {"m": 8192, "n": 8192}, {"m": 8192, "n": 16384},
         {"m": 12345, "n": 6789}, HEADLINE]
# Edges: single rows and columns, one past / short of a 32-tile, tall and thin, odd; and multiples
# of 4 that are not multiples of 32, which v7 takes on its float4 path with partial tiles.
TEST_SIZES = [{"m": m, "n": n}
              for m, n in ((1, 1), (1, 300), (300, 1), (31, 33), (33, 31), (1023, 517),
                           (4097, 3), (36, 68), (100, 4))]
SOURCES = (cuda.source_path(CU_FILE), _launch_transpose, _check_matrix)

transpose = register(Op(
    name="transpose", part=2, chapter="part2/transpose.md", title="Transpose",
    reference=transpose_ref, make_inputs=_make_inputs, bytes_moved=_bytes, flops=lambda s, d: 0,
    metric="GB/s", ceiling="copy", headline=HEADLINE, sweep=SWEEP, dtypes=FLOAT_TYPES,
    test_sizes=TEST_SIZES,
    # a transpose moves bits: exact
    sweep_axis="n", tolerances={dt: (0.0, 0.0) for dt in FLOAT_TYPES}))
FP32 = (torch.float32,)
transpose.add(Impl("v0", transpose_torch, "PyTorch", "x.t().contiguous()"))
transpose.add(Impl("v1", transpose_naive, "CUDA", "one thread per element, writes strided", SOURCES,
                   dtypes=FP32))
transpose.add(Impl("v2", transpose_naive_rows, "CUDA", "one thread per element, reads strided",
                   SOURCES, dtypes=FP32))
transpose.add(Impl("v3", transpose_smem, "CUDA", "32x32 shared tile, 32-way bank conflicts",
                   SOURCES, dtypes=FP32))
transpose.add(Impl("v4", transpose_smem_padded, "CUDA", "shared tile padded to [32][33]", SOURCES,
                   dtypes=FP32))
transpose.add(Impl("v5", transpose_smem_swizzled, "CUDA", "shared tile, XOR swizzle", SOURCES,
                   dtypes=FP32))
transpose.add(Impl("v6", transpose_smem_4_per_thread, "CUDA",
                   "padded tile, 32x8 threads, 4 per thread", SOURCES, dtypes=FP32))
transpose.add(Impl("v7", transpose_vec4, "CUDA",
                   "padded tile, float4 loads and stores, 16 per thread",
                   (*SOURCES, vector_path_ok), dtypes=FP32))
transpose.add(Impl("v8", transpose_triton, "Triton", "64x64 blocks, tl.trans", (_transpose_kernel,),
                   device="any"))
