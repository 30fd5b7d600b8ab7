"""Matrix addition with two-dimensional grids, and what the thread-to-element mapping does to
its speed.

Versions of ``matrix_add`` (never renumbered):

- v0  ``torch.add``: the library baseline.
- v1  CUDA, a 2-D grid of 32 x 8 blocks; threadIdx.x runs along a row, so a warp reads 128
  contiguous bytes.
- v2  CUDA, the same kernel with the mapping swapped: threadIdx.x runs down a column, so a warp
      touches 32 different rows (column-major access of a row-major matrix, uncoalesced).
- v3  Triton, 2-D blocks of BLOCK_M x BLOCK_N elements with a mask on each dimension.
- v4  CUDA, like v1 but 4 columns per thread with 16-byte loads and 64 x 4 blocks: a warp covers 512
      contiguous bytes of a row instead of 128 (falls back to v1 when rows are not 16-byte aligned).

Inputs are row-major ``m x n`` matrices whose rows may be spaced wider than ``n`` (a column slice
``w[:, :n]`` of a wider matrix): the CUDA and Triton versions take each matrix's *leading dimension*
(``stride(0)``, the distance between row starts in elements). The columns must be unit-stride. The
output is a new contiguous matrix. Like vector add, the op reads each input once and writes the
output once: its cost is bytes moved, and its ceiling the measured copy bandwidth.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from snippets import cuda
from snippets._checks import check_tensors, refuse_grad, triton_device
from snippets.registry import Impl, Op, device_generator, register

CU_FILE = "part2/matrix_add.cu"
FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y (and Triton's on axis 1); gridDim.x allows 2**31 - 1


# --8<-- [start:reference]
def matrix_add_ref(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """out = x + y for m x n matrices. Reads 2mn elements, writes mn: 3 * m * n * itemsize bytes,
    mn FLOPs."""
    return x + y
# --8<-- [end:reference]


# --8<-- [start:checks]
def _check_matrices(x: torch.Tensor, y: torch.Tensor, dtypes: tuple,
                    device: str) -> tuple[int, int]:
    """Two m x n matrices of one dtype on one device, each with unit-stride columns; returns (m, n).
    Rows may be spaced wider than n (a leading dimension larger than n): only the columns must
    be packed."""
    check_tensors(("x", "y"), (x, y), dtypes=dtypes, device=device, contiguous=False,
                  allow_empty=False)
    if x.dim() != 2:
        raise ValueError(f"x and y must be 2-D matrices, got shape {tuple(x.shape)}")
    for name, t in (("x", x), ("y", y)):
        # A stride along a dimension of size 1 is never used, so any value is fine there.
        if t.stride(1) != 1 and t.shape[1] != 1:
            raise ValueError(f"{name} must have unit-stride columns (stride(1) == 1), got strides "
                             f"{t.stride()} for shape {tuple(t.shape)}; call .contiguous() first")
    return x.shape
# --8<-- [end:checks]


# --------------------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------------------

# --8<-- [start:triton]
# 32 x 128 elements per program (16 KB of fp32 per input) with 8 warps: 16 elements per thread, as
# four 16-byte vectors along a row, the same per-thread load as Part 1's vector add.
BLOCK_M, BLOCK_N, NUM_WARPS = 32, 128, 8


@triton.jit
def _matrix_add_kernel(x_ptr, y_ptr, out_ptr, m, n, stride_xm, stride_ym, stride_om,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_n = tl.program_id(0)  # which block of BLOCK_N columns (axis 0 allows 2**31 - 1 programs)
    # int64 indices: pid * BLOCK (< m or n) fits in int32, but row * stride can pass 2**31. Adding
    # the product to an int64 arange widens the sum.
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64) + pid_n * BLOCK_N
    mask_n = offs_n < n
    # Axis 1 allows at most 65535 programs: each program loops over every num_programs(1)-th block
    # of rows.
    for pid_m in range(tl.program_id(1), tl.cdiv(m, BLOCK_M), tl.num_programs(1)):
        offs_m = tl.arange(0, BLOCK_M).to(tl.int64) + pid_m * BLOCK_M
        # (BLOCK_M, BLOCK_N): both edges can be ragged
        mask = (offs_m[:, None] < m) & mask_n[None, :]
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_n[None, :], mask=mask)
        y = tl.load(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], mask=mask)
        out = x.to(tl.float32) + y.to(tl.float32)  # add in fp32, round once on the store
        tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=mask)


def matrix_add_triton(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """v3: a 2-D grid of 2-D blocks; float32/float16/bfloat16, rows of each input at any spacing."""
    refuse_grad("matrix_add_triton", x, y, instead="x + y")
    m, n = _check_matrices(x, y, FLOAT_TYPES, triton_device())
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(n, BLOCK_N), min(triton.cdiv(m, BLOCK_M), MAX_GRID_Y))
    _matrix_add_kernel[grid](x, y, out, m, n, x.stride(0), y.stride(0), out.stride(0),
                             BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=NUM_WARPS)
    return out
# --8<-- [end:triton]


# --------------------------------------------------------------------------------------------------
# CUDA C (csrc/part2/matrix_add.cu), launched through CuPy
# --------------------------------------------------------------------------------------------------

# --8<-- [start:cuda_launch]
BLOCK = (32, 8)  # 256 threads: one warp per 32 threads along x, 8 warps along y


def _launch_matrix_add(name: str, threads_along_rows: bool, x: torch.Tensor, y: torch.Tensor,
                       block: tuple[int, int] = BLOCK, vec: int = 1) -> torch.Tensor:
    """The one launcher of every CUDA version. blockIdx.x/threadIdx.x cover the columns (``vec`` per
    thread) and blockIdx.y/threadIdx.y the rows (v1, v4), or the other way round (v2,
    ``threads_along_rows``). The grid's y dimension is capped at 65535 blocks; the kernels loop over
    the rest."""
    cuda.require_gpu()
    m, n = _check_matrices(x, y, (torch.float32,), "cuda")
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    along_x, along_y = (m, n) if threads_along_rows else (triton.cdiv(n, vec), m)
    grid = (triton.cdiv(along_x, block[0]), min(triton.cdiv(along_y, block[1]), MAX_GRID_Y))
    cuda.launch(cuda.kernel(CU_FILE, name), grid, block,
                (x, y, out, np.int64(m), np.int64(n), np.int64(x.stride(0)), np.int64(y.stride(0)),
                 np.int64(out.stride(0))))
    return out
# --8<-- [end:cuda_launch]


def matrix_add_cuda(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """v1: a 2-D grid, threadIdx.x along a row: each warp reads 32 consecutive floats of x and
    of y."""
    refuse_grad("matrix_add_cuda", x, y, instead="x + y")
    return _launch_matrix_add("matrix_add_v1", False, x, y)


def matrix_add_cuda_column_major(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """v2: like v1 with threadIdx.x and threadIdx.y swapped over the matrix: each warp touches one
    float in each of 32 rows. Same arithmetic and block shape; only the memory access
    pattern differs."""
    refuse_grad("matrix_add_cuda_column_major", x, y, instead="x + y")
    return _launch_matrix_add("matrix_add_v2", True, x, y)


def matrix_add_cuda_vec4(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """v4: like v1, but 4 columns per thread with 16-byte accesses and 64 x 4 blocks, so each warp
    reads 512 contiguous bytes of a row. Rows that are not 16-byte aligned (n or a leading dimension
    not a multiple of 4, or an offset view) take v1 instead."""
    refuse_grad("matrix_add_cuda_vec4", x, y, instead="x + y")
    cuda.require_gpu()
    _, n = _check_matrices(x, y, (torch.float32,), "cuda")  # validate before looking at strides
    aligned = n % 4 == 0 and all(t.stride(0) % 4 == 0 and t.data_ptr() % 16 == 0 for t in (x, y))
    if not aligned:
        return _launch_matrix_add("matrix_add_v1", False, x, y)
    return _launch_matrix_add("matrix_add_v4", False, x, y, block=(64, 4), vec=4)


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def _randn(shape: tuple[int, ...], dtype: torch.dtype, device: str,
           gen: torch.Generator) -> torch.Tensor:
    """Normal values drawn where they will live: a generator on the target device, seeded from
    ``gen``, so a 1 GiB input does not first cross from the host."""
    dev_gen = device_generator(gen, device)
    return torch.randn(shape, generator=dev_gen, device=device, dtype=torch.float32).to(dtype)


def _make_inputs(size, dtype, device, gen):
    shape = (size["m"], size["n"])
    return _randn(shape, dtype, device, gen), _randn(shape, dtype, device, gen)


def _bytes(size, dtype) -> int:
    return 3 * size["m"] * size["n"] * dtype.itemsize


HEADLINE = {"m": 16384, "n": 16384}  # 1 GiB per fp32 matrix, 3 GiB moved per call: far beyond L2
SWEEP = [{"m": 8192, "n": 8192}, {"m": 4096, "n": 16384}, {"m": 16384, "n": 4096},
         {"m": 12345, "n": 6789}, HEADLINE]
TEST_SIZES = [{"m": m, "n": n}
              for m, n in ((1, 1), (1, 300), (300, 1), (31, 33), (33, 31), (129, 257),
                           (1023, 517))]

matrix_add = register(Op(
    name="matrix_add", part=2, chapter="part2/matrix-add.md", title="Matrix addition",
    reference=matrix_add_ref, make_inputs=_make_inputs, bytes_moved=_bytes,
    flops=lambda s, d: s["m"] * s["n"], metric="GB/s", ceiling="copy", headline=HEADLINE,
    sweep=SWEEP, dtypes=FLOAT_TYPES, test_sizes=TEST_SIZES, sweep_axis="n"))
matrix_add.add(Impl("v0", torch.add, "PyTorch", "torch.add"))
matrix_add.add(Impl("v1", matrix_add_cuda, "CUDA", "2-D grid, threadIdx.x along rows (coalesced)",
                    (cuda.source_path(CU_FILE), _launch_matrix_add, _check_matrices),
                    dtypes=(torch.float32,)))
matrix_add.add(Impl("v2", matrix_add_cuda_column_major, "CUDA",
                    "2-D grid, threadIdx.x down columns (uncoalesced)",
                    (cuda.source_path(CU_FILE), _launch_matrix_add, _check_matrices),
                    dtypes=(torch.float32,)))
matrix_add.add(Impl("v3", matrix_add_triton, "Triton",
                    "2-D blocks of 32 x 128, masks on both edges",
                    (_matrix_add_kernel, _check_matrices), device="any"))
matrix_add.add(Impl("v4", matrix_add_cuda_vec4, "CUDA",
                    "like v1, 4 columns per thread, 16-byte accesses",
                    (cuda.source_path(CU_FILE), _launch_matrix_add, _check_matrices),
                    dtypes=(torch.float32,)))
