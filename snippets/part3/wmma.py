"""Tensor cores, first contact: C = A @ B on the tensor cores, through WMMA in CUDA C and ``tl.dot``
in Triton.

Versions of ``wmma_gemm`` (fp16 and bf16 inputs, fp32 sums, C in the input dtype; never renumbered);
the CUDA kernels are in ``csrc/part3/wmma_gemm.cu``:

- v0  cuBLAS through ``torch.matmul`` in the input dtype: the baseline.
- v1  CUDA WMMA, naive: one warp per 16 x 16 tile of C, fragments loaded straight from
  global memory.
- v2  CUDA WMMA, like v1 with a 128 x 128 block tile: A and B tiles staged in padded shared memory
      with 16-byte loads, 8 warps of 64 x 32 (4 x 2 accumulator fragments each).
- v3  CUDA WMMA, like v2 with two shared-memory stages filled by ``cp.async``: copies overlap
  the MMAs.
- v4  Triton, ``tl.dot`` on 128 x 128 x 64 blocks with grouped program order.
- v5  Triton, v4's kernel and launch with a 128 x 256 x 64 tile: the config that Part 4's autotuning
      sweep of this kernel found fastest at 4096^3 on the H100 and the H200.
- v6  CUDA without WMMA: PTX ``mma.sync.aligned.m16n8k16`` fed by ``ldmatrix`` (``.x4``, and
      ``.trans`` for the row-major B) from XOR-swizzled shared memory (no padding), three stages
      filled by ``cp.async``, 4 warps of 64 x 64 each; the epilogue writes C from the registers.

Versions of ``tf32_gemm`` (fp32 inputs and output, products in TF32, sums in fp32):

- v0  cuBLAS through ``torch.matmul`` with ``torch.backends.cuda.matmul.allow_tf32`` on for
  the call.
- v1  CUDA WMMA with ``wmma::precision::tf32`` (m16n16k8), the structure of ``wmma_gemm`` v2.
- v2  Triton, ``tl.dot(..., input_precision="tf32")``.
- v3  Triton, like v2 with B copied once to K-major order (B^T, N x K) and read so: Hopper's TF32
      ``wgmma`` reads both operands K-major from shared memory, and with B K-major in global memory
      too every copy into shared memory is a 16-byte ``cp.async`` instead of 4-byte ones.
- v4  Triton, v3's idea with the two tools the later Parts build: B copied K-major by Part 2's
      Triton transpose (``transpose`` v8) instead of ``b.t().contiguous()``, and the product run by
      Part 4's persistent TMA kernel (``matmul`` v4, autotuned), reading B^T through a K-major
      descriptor.

A is M x K and B is K x N, both row-major (contiguous). The cost is 2 * M * N * K FLOPs; the fewest
bytes are (M * K + K * N + M * N) * itemsize. ``wmma_gemm`` is compared with cuBLAS fp16
(``gemm_fp16``; cuBLAS bf16 is the ``gemm_bf16`` ceiling of the same run), ``tf32_gemm`` with cuBLAS
TF32 (``gemm_tf32``). ``tf32_round`` emulates TF32 rounding on the CPU, for an accuracy comparison
that runs anywhere.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from snippets import cuda
from snippets._checks import refuse_grad, triton_device, triton_interpreting
from snippets.common.gemm import (
    GROUP_M,
    HALF_TYPES,
    INTERPRET,
    check_operands,
    check_tma,
    gemm_flops,
    launch_tma,
    make_operands,
    matmul_kernel,
    needs_hopper,
    prune_configs,
    tile_coords,
    tolerance_for,
    triton_half_dtypes,
)
from snippets.part2.transpose import transpose_triton
from snippets.part4.matmul import TMA_SOURCES, autotuned
from snippets.registry import Impl, Op, register

CU_FILE = "part3/wmma_gemm.cu"
GRID_Y_MAX = 65535  # CUDA's limit on gridDim.y
# Kernel name suffix per input dtype: the .cu file instantiates each kernel once per type.
SUFFIX = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "tf32"}


# --8<-- [start:reference]
def wmma_gemm_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """What every version computes: the products of fp16 (or bf16) numbers are exact in fp32, the K
    of them per output are summed in fp32, and C is rounded to the input dtype once. 2 * M * N * K
    FLOPs on at least (M*K + K*N + M*N) * 2 bytes: at 4096^3 that is 1365 FLOPs per byte, so the
    product is compute-bound if the kernel reuses its tiles well."""
    return torch.matmul(a.float(), b.float()).to(a.dtype)
# --8<-- [end:reference]


def _reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The registered reference: the exact product (the tests call it in float64)."""
    return a @ b


# The operand checks (check_operands) and the tolerance (tolerance_for) of every GEMM are in
# snippets.common.gemm.


# --8<-- [start:cublas]
def wmma_cublas(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v0: cuBLAS through torch.matmul in fp16 or bf16 (fp32 accumulation; torch lets cuBLAS round
    split-K partial sums to the dtype, which tolerance_for allows for)."""
    check_operands(a, b, HALF_TYPES)
    return torch.matmul(a, b)


def tf32_cublas(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v0 of tf32_gemm: cuBLAS on fp32 inputs with TF32 allowed for this call (the caller's setting
    is put back afterwards). torch.set_float32_matmul_precision("high") sets the same flag for the
    whole process."""
    check_operands(a, b, (torch.float32,))
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return torch.matmul(a, b)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
# --8<-- [end:cublas]


# --------------------------------------------------------------------------------------------------
# CUDA C (csrc/part3/wmma_gemm.cu), launched through CuPy
# --------------------------------------------------------------------------------------------------

# --8<-- [start:cuda_launch]
@dataclass(frozen=True)
class WmmaConfig:
    """How a CUDA version is launched and what it accepts. A block of ``threads`` computes a
    ``tile`` = (rows, columns) of C; the kernel name gets the dtype's suffix (``wmma_v2`` ->
    ``wmma_v2_f16``). ``multiple``: M, N and K must be multiples of these; ``align``: A and B must
    start on a multiple of this many bytes (load_matrix_sync from global memory needs 32, the
    16-byte copies 16). ``smem``: bytes of dynamic shared memory per block (v6; the others declare
    theirs statically)."""

    kernel: str
    tile: tuple[int, int]
    threads: int
    multiple: tuple[int, int, int]
    align: int
    why: str  # the reason for the size rule, for the error message
    smem: int = 0


# v6's block tile of C, K step (elements: one 128-byte row of its A tile) and pipeline depth
MMA_TILE, MMA_BK, MMA_STAGES = (128, 128), 64, 3
CONFIGS = {
    "v1": WmmaConfig("wmma_v1", tile=(32, 32), threads=128, multiple=(16, 16, 16), align=32,
                     why="v1 loads whole 16 x 16 fragments from global memory, with no bounds "
                         "checks"),
    "v2": WmmaConfig("wmma_v2", tile=(128, 128), threads=256, multiple=(1, 8, 8), align=16,
                     why="rows are copied in 16-byte pieces of 8 elements"),
    "v3": WmmaConfig("wmma_v3", tile=(128, 128), threads=256, multiple=(1, 8, 8), align=16,
                     why="rows are copied in 16-byte pieces of 8 elements"),
    # MMA_STAGES stages of a 128 x MMA_BK tile of A and an MMA_BK x 128 tile of B, 2 bytes each:
    # 96 KiB, so two blocks fit an SM's 227 KiB
    "v6": WmmaConfig("mma_v6", tile=MMA_TILE, threads=128, multiple=(1, 8, 8), align=16,
                     why="rows are copied in 16-byte pieces of 8 elements",
                     smem=MMA_STAGES * (MMA_TILE[0] + MMA_TILE[1]) * MMA_BK * 2),
}
TF32_CONFIG = WmmaConfig("wmma_v2", tile=(128, 128), threads=256, multiple=(1, 4, 4), align=16,
                         why="rows are copied in 16-byte pieces of 4 floats")
# wmma_gemm.cu is compiled with v1's and v2's tiles and threads (-D options; v3 and TF32_CONFIG use
# v2's kernel template): the numbers are written only here
CU_OPTIONS = cuda.defines(CU_FILE, NAIVE_TILE=CONFIGS["v1"].tile[0],
                          NAIVE_THREADS=CONFIGS["v1"].threads, TILED_M=CONFIGS["v2"].tile[0],
                          TILED_N=CONFIGS["v2"].tile[1], TILED_THREADS=CONFIGS["v2"].threads,
                          MMA_BM=CONFIGS["v6"].tile[0], MMA_BN=CONFIGS["v6"].tile[1],
                          MMA_BK=MMA_BK, MMA_THREADS=CONFIGS["v6"].threads,
                          MMA_STAGES=MMA_STAGES)


def check_supported(cfg: WmmaConfig, a: torch.Tensor, b: torch.Tensor) -> None:
    """Refuse, with a ValueError that says why, the shapes and alignments ``cfg``'s kernel
    cannot take."""
    (m, k), n = a.shape, b.shape[1]
    for name, v, q in (("M", m, cfg.multiple[0]), ("N", n, cfg.multiple[1]),
                       ("K", k, cfg.multiple[2])):
        if v % q:
            raise ValueError(f"{cfg.kernel}: {name} = {v} is not a multiple of {q} ({cfg.why}); "
                             "the Triton version takes any size")
    for name, t in (("a", a), ("b", b)):
        if t.data_ptr() % cfg.align:
            raise ValueError(f"{cfg.kernel}: {name} must start on a {cfg.align}-byte boundary, its "
                             f"data pointer is {t.data_ptr():#x} (a view into another tensor?); "
                             "call .clone() first")


def _launch_wmma(a: torch.Tensor, b: torch.Tensor, cfg: WmmaConfig,
                 dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
    """The one launcher of every CUDA version: a 2-D grid with one block per tile of C."""
    m, n, k = check_operands(a, b, dtypes)
    check_supported(cfg, a, b)
    cuda.require_gpu()
    grid = (triton.cdiv(n, cfg.tile[1]), triton.cdiv(m, cfg.tile[0]))
    if grid[1] > GRID_Y_MAX:
        raise ValueError(f"{cfg.kernel}: {grid[1]} tiles along gridDim.y exceed CUDA's limit of "
                         f"{GRID_Y_MAX} (a is {m} x {k})")
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    fn = cuda.kernel(CU_FILE, f"{cfg.kernel}_{SUFFIX[a.dtype]}", CU_OPTIONS)
    if fn.max_dynamic_shared_size_bytes < cfg.smem:
        fn.max_dynamic_shared_size_bytes = cfg.smem  # above 48 KB needs the opt-in
    cuda.launch(fn, grid, cfg.threads, (a, b, c, np.int32(m), np.int32(n), np.int32(k)),
                shared_mem=cfg.smem)
    return c
# --8<-- [end:cuda_launch]


def wmma_naive(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v1: one warp per 16 x 16 tile of C; each step loads a 16 x 16 fragment of A and one of B
    straight from global memory and issues one m16n16k16 MMA. M, N and K must be multiples of 16."""
    refuse_grad("wmma_naive", a, b, instead="a @ b")
    return _launch_wmma(a, b, CONFIGS["v1"], HALF_TYPES)


def wmma_smem(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v2: like v1, but a block of 8 warps computes a 128 x 128 tile of C: the block stages 128 x 32
    tiles of A and 32 x 128 tiles of B in padded shared memory with 16-byte loads, and each warp
    computes 64 x 32 of C from them (4 x 2 fragments), so each fragment loaded serves 2 or 4 MMAs.
    Any M; N, K multiples of 8."""
    refuse_grad("wmma_smem", a, b, instead="a @ b")
    return _launch_wmma(a, b, CONFIGS["v2"], HALF_TYPES)


def wmma_async(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v3: like v2 with two shared-memory stages filled by cp.async: the copies of the next tile go
    straight from global to shared memory (no staging registers) while the tensor cores work on the
    current one."""
    refuse_grad("wmma_async", a, b, instead="a @ b")
    return _launch_wmma(a, b, CONFIGS["v3"], HALF_TYPES)


# --8<-- [start:mma_swizzle]
def mma_swizzle(row: int, chunk: int, chunks_per_row: int) -> int:
    """Where v6 stores 16-byte chunk ``chunk`` of row ``row`` of a shared tile, in chunks from the
    tile's start (csrc/part3/wmma_gemm.cu, swizzle): rows are whole 128-byte lines (8 chunks, or
    16 for B's 256-byte rows), and the chunk index is XORed with row % 8, which permutes the chunks
    of each line. Shared memory has 32 banks of 4 bytes, so a chunk at offset o (in chunks) lies in
    bank group o % 8 (banks 4 (o % 8) .. 4 (o % 8) + 3)."""
    return row * chunks_per_row + (chunk ^ (row % 8))
# --8<-- [end:mma_swizzle]


def wmma_mma(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v6: like v3 (a 128 x 128 block tile, cp.async into shared memory), without WMMA: PTX
    mma.sync.aligned.m16n8k16 whose fragments ldmatrix loads (.x4: four 8 x 8 matrices per
    instruction; .trans for B, which is row-major), shared tiles XOR-swizzled instead of padded,
    three stages in flight, 4 warps of 64 x 64 (twice v3's FLOPs per byte read from shared memory),
    and C written from the accumulator registers, whose layout PTX specifies. Any M; N, K
    multiples of 8."""
    refuse_grad("wmma_mma", a, b, instead="a @ b")
    return _launch_wmma(a, b, CONFIGS["v6"], HALF_TYPES)


def tf32_wmma(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v1 of tf32_gemm: wmma_gemm v2's kernel on fp32 tiles, with m16n16k8 TF32 fragments; each
    fragment element is rounded to TF32 (wmma::__float_to_tf32) before the MMA. Any M; N, K
    multiples of 4."""
    refuse_grad("tf32_wmma", a, b, instead="a @ b")
    return _launch_wmma(a, b, TF32_CONFIG, (torch.float32,))


# --------------------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------------------

# --8<-- [start:triton]
# The kernel is matmul_kernel of snippets/common/gemm.py (Part 4 tunes it); this is its launch.

# One fixed config per input width, sized for an H100/H200 SM (up to 227 KB of shared memory): 8
# warps, a 128 x 128 tile of C, and 3 stages of A and B tiles in flight: (128 + 128) x 64 x 2 bytes
# x 3 = 96 KB for fp16/bf16; fp32 tiles are twice as wide in bytes, so BLOCK_K is halved to keep the
# same 96 KB.
TRITON_CONFIGS = {
    2: dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
    4: dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, GROUP_M=8, num_warps=8, num_stages=3),
}


def _launch_triton(kernel, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                   config: dict) -> torch.Tensor:
    """The one launcher of the Triton versions: one program per tile of C. ``kernel`` is a
    ``@triton.jit`` kernel with its blocks, warps and stages in ``config``, or an autotuner with
    ``config = {}`` (the autotuner picks them). ``b`` is B (K x N) for matmul_kernel, B^T (N x K)
    for matmul_kmajor_kernel: either way its rows are b.stride(0) apart."""
    (m, k), n = a.shape, c.shape[1]
    grid = lambda meta: (  # noqa: E731
        triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)
    kernel[grid](a, b, c, m, n, k, a.stride(0), b.stride(0), c.stride(0),
                 INPUT_PRECISION="tf32", **config)
    return c


def _triton_gemm(a: torch.Tensor, b: torch.Tensor, dtypes: tuple[torch.dtype, ...],
                 config: dict | None = None) -> torch.Tensor:
    """matmul_kernel with ``config``, by default the fixed config of the input width."""
    m, n, k = check_operands(a, b, dtypes, device=triton_device())
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    return _launch_triton(matmul_kernel, a, b, c, config or TRITON_CONFIGS[a.element_size()])
# --8<-- [end:triton]


def wmma_triton(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v4: Triton. Each program computes a 128 x 128 tile of C with tl.dot on 64-deep slices of A
    and B; the compiler picks the tensor-core instructions, the shared-memory layout and the 3-stage
    copy pipeline."""
    refuse_grad("wmma_triton", a, b, instead="a @ b")
    return _triton_gemm(a, b, triton_half_dtypes())


def tf32_triton(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v2 of tf32_gemm: the same Triton kernel on fp32 inputs, tl.dot with input_precision="tf32".
    (Under the CPU interpreter the dot is computed in plain fp32, which is more accurate than TF32
    and passes the same tolerance.)"""
    refuse_grad("tf32_triton", a, b, instead="a @ b")
    return _triton_gemm(a, b, (torch.float32,))


# --8<-- [start:wide]
# v5: v4's kernel and launch with the config that Part 4's autotuning sweep of matmul_kernel found
# fastest at 4096^3 in bf16 on the H100 and the H200 (benchmarks/results/outputs/*/
# autotune_matmul.json, best_config; fp16 runs at the same tensor-core rate). A 128 x 256 tile of C
# per program: per 64-deep step 2 * 128 * 256 * 64 FLOPs for (128 + 256) * 64 * 2 bytes of A and B,
# 85 FLOPs per byte against 64 for 128 x 128; 3 stages of them are 144 KiB of shared memory (of
# 227), and the fp32 accumulator is 128 registers of each of the 256 threads.
WIDE_CONFIG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
# --8<-- [end:wide]


def wmma_triton_wide(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v5: like v4 (the same kernel and launch), with 128 x 256 x 64 blocks, 8 warps, 3 stages: the
    config Part 4's autotuner chose for this kernel at 4096^3. Only the tile changes, so the
    difference from v4 is what a larger tile buys: more FLOPs per byte copied into shared
    memory, and per wgmma (m64n256k16 instead of m64n128k16)."""
    refuse_grad("wmma_triton_wide", a, b, instead="a @ b")
    return _triton_gemm(a, b, triton_half_dtypes(), WIDE_CONFIG)


# --8<-- [start:kmajor_kernel]
@triton.jit
def matmul_kmajor_kernel(a_ptr, bt_ptr, c_ptr, M, N, K, stride_am, stride_bn, stride_cm,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    # matmul_kernel with B given K-major: bt_ptr is B^T, N x K with rows stride_bn apart, so the
    # K values of one column of B are contiguous. Only the pointers to B and their step change.
    pid_m, pid_n = tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # (BLOCK_M, BLOCK_K), K contiguous
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    # (BLOCK_K, BLOCK_N), K contiguous: element (k, n) of B is element (n, k) of B^T
    b_ptrs = bt_ptr + offs_n[None, :].to(tl.int64) * stride_bn + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k0), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k0) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K  # the next BLOCK_K columns of B^T
    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
# --8<-- [end:kmajor_kernel]


# --8<-- [start:kmajor_configs]
# tf32_gemm v3's configs: 8 warps (two warpgroups), BLOCK_K = 32 floats = 128 bytes (one row of the
# 128-byte swizzle, as BLOCK_K = 64 is for fp16), and tiles of 128 x 256 (the fp16 sweep's best
# shape, 144 KiB at 3 stages), 256 x 128, or 128 x 128 with a fourth stage. Every one compiles for
# sm_90 within 227 KiB and without spills (tests/test_part3_tf32_layout.py); the autotuner keeps the
# fastest per (M, N, K).
KMAJOR_CONFIGS = [
    triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=32, GROUP_M=GROUP_M), num_warps=8,
                  num_stages=stages)
    for bm, bn, stages in ((128, 256, 3), (256, 128, 3), (128, 128, 4), (128, 256, 4))]


@functools.lru_cache(maxsize=None)
def kmajor_autotuned():
    """matmul_kmajor_kernel under triton.autotune, built on first use (a GPU launch; under the CPU
    interpreter nothing can be timed and INTERPRET's one config runs instead)."""
    return triton.autotune(configs=KMAJOR_CONFIGS, key=["M", "N", "K"],
                           prune_configs_by={"early_config_prune": prune_configs})(
        matmul_kmajor_kernel)
# --8<-- [end:kmajor_configs]


# --8<-- [start:kmajor]
def tf32_kmajor(a: torch.Tensor, b: torch.Tensor, config: dict | None = None) -> torch.Tensor:
    """v3 of tf32_gemm: like v2, but B is first copied to K-major order, B^T as an N x K contiguous
    tensor (K * N * 4 bytes read and as many written, inside the timed call), and the kernel reads
    it so. Hopper's TF32 wgmma takes both operands from shared memory K-major; v2's B is N-major in
    global memory, and the compiler transposes it on the way in with one 4-byte cp.async per
    element. Here every copy is a 16-byte cp.async. ``config`` fixes the blocks, warps and stages
    (a dict like KMAJOR_CONFIGS' entries); by default the autotuner picks among KMAJOR_CONFIGS."""
    refuse_grad("tf32_kmajor", a, b, instead="a @ b")
    m, n, k = check_operands(a, b, (torch.float32,), device=triton_device())
    bt = b.t().contiguous()  # (N, K)
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if config is None and triton_interpreting():
        config = INTERPRET
    if config is None:
        return _launch_triton(kmajor_autotuned(), a, bt, c, {})
    return _launch_triton(matmul_kmajor_kernel, a, bt, c, config)
# --8<-- [end:kmajor]


# --8<-- [start:persistent]
def tf32_persistent(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v4 of tf32_gemm: v3's plan, B copied to K-major order and then multiplied, with the two steps
    done by the kernels the later Parts build. The copy is Part 2's Triton transpose (``transpose``
    v8: a tile of B read by rows and written by rows of B^T), the product Part 4's persistent TMA
    kernel (``matmul`` v4, autotuned; B^T handed over as a K-major view, so every TMA box of B is
    K-major as the TF32 ``wgmma`` needs). TMA moves rows that are multiples of 16 bytes: K and N
    must be multiples of 4, and A must start on a 16-byte boundary; both are refused before any
    launch."""
    refuse_grad("tf32_persistent", a, b, instead="a @ b")
    m, n, k = check_operands(a, b, (torch.float32,), device=triton_device())
    if k % 4 or n % 4:  # checked before the transpose: no launch on input the product refuses
        raise ValueError(f"tf32_persistent: TMA copies rows of whole 16-byte units, so K and N "
                         f"must be multiples of 4 floats, got K = {k}, N = {n} (tf32_kmajor "
                         "takes any shape)")
    check_tma(a=a)  # and A must start on a 16-byte boundary
    bt = transpose_triton(b)  # (N, K), K contiguous: K * N * 4 bytes read and as many written
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    # Part 4's kernel through its launcher (launch_tma): B^T's view bt.t() is B again, K x N with
    # K-major strides, so it gets the K-major descriptor; on fp32 operands the kernel's tl.dot is a
    # TF32 one (tl.dot's default precision for fp32)
    tuned = autotuned(True, torch.float32)  # Part 4's persistent kernel under its fp32 autotuner
    return launch_tma(tuned.fn, autotuned, a, bt.t(), c, (None, None),
                      dict(INT_ACC=False, HAS_SCALES=False))
# --8<-- [end:persistent]


# --------------------------------------------------------------------------------------------------
# TF32 on the CPU
# --------------------------------------------------------------------------------------------------

# --8<-- [start:tf32_round]
def tf32_round(x: torch.Tensor) -> torch.Tensor:
    """fp32 values rounded to TF32 as the GPU's cvt.rna.tf32.f32 does (what wmma::__float_to_tf32
    calls): to the nearest number with a 10-bit mantissa, ties away from zero. The result is still
    float32, with the low 13 of its 23 mantissa bits zero. Infinities and NaN pass
    through unchanged.

    On the bits: adding 0x1000 (half of the last kept bit, 0x2000) to the magnitude and clearing the
    low 13 bits rounds to nearest; a carry out of the mantissa correctly bumps the exponent."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise TypeError("tf32_round takes a float32 tensor, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    bits = x.contiguous().view(torch.int32)
    sign = bits & -(2**31)                              # 0x80000000
    mag = bits & 0x7FFFFFFF
    special = (mag & 0x7F800000) == 0x7F800000          # exponent all ones: inf or NaN
    rounded = ((torch.where(special, 0, mag) + 0x1000) & ~0x1FFF) | sign
    return torch.where(special, bits, rounded).view(torch.float32).view(x.shape)


def tf32_matmul_emulated(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The product an ideal TF32 tensor core would give: inputs rounded to TF32, products and sums
    exact (float64 here; the real hardware sums in fp32, which adds far less error than the rounding
    of the inputs)."""
    return tf32_round(a).double() @ tf32_round(b).double()
# --8<-- [end:tf32_round]


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def _bytes(size, dtype) -> int:
    m, n, k = size["m"], size["n"], size["k"]
    return (m * k + k * n + m * n) * dtype.itemsize


# 4096^3: 3 x 32 MiB in fp16, 3 x 64 MiB in fp32. 8192^3 is left out: v1 would take tens of ms per
# call there.
HEADLINE = {"m": 4096, "n": 4096, "k": 4096}
SWEEP = [{"m": s, "n": s, "k": s} for s in (1024, 2048, 4096)]
MAX_K = max(s["k"] for s in [HEADLINE, *SWEEP])
# Every registered version runs at every test size (tests/test_ops.py), and v1 takes only multiples
# of 16; tests/test_part3_wmma.py covers the ragged shapes that v2, v3 and v4 accept and the
# refusals of v1.
WMMA_TEST_SIZES = [{"m": m, "n": n, "k": k}
                   for m, n, k in ((16, 16, 16), (32, 48, 16), (64, 64, 64),
                                  (48, 80, 96), (144, 272, 48))]
# tf32_gemm v1 takes any M and N, K multiples of 4.
TF32_TEST_SIZES = [{"m": m, "n": n, "k": k} for m, n, k in ((1, 4, 4), (17, 36, 20), (64, 64, 64),
                                                           (130, 136, 68))]
SOURCES = (cuda.source_path(CU_FILE), _launch_wmma, check_operands, check_supported)
TRITON_SOURCES = (matmul_kernel, _triton_gemm, _launch_triton, check_operands)
KMAJOR_SOURCES = (matmul_kmajor_kernel, tf32_kmajor, _launch_triton, prune_configs,
                  check_operands)
PERSISTENT_SOURCES = (tf32_persistent, transpose_triton, *TMA_SOURCES,
                      check_operands)

wmma_gemm = register(Op(
    name="wmma_gemm", part=3, chapter="part3/tensor-cores.md", title="Tensor-core GEMM (fp16/bf16)",
    reference=_reference, make_inputs=make_operands, bytes_moved=_bytes, flops=gemm_flops,
    metric="TFLOP/s", ceiling="gemm_fp16", headline=HEADLINE, sweep=SWEEP, dtypes=HALF_TYPES,
    test_sizes=WMMA_TEST_SIZES, sweep_axis="m", bench_dtypes=HALF_TYPES,
    # The harness's tolerance is sized for the largest K; the tests hold each shape to its own K.
    tolerances={d: tolerance_for(MAX_K, d) for d in HALF_TYPES},
    tolerance_at=lambda s, d: tolerance_for(s["k"], d)))
wmma_gemm.add(Impl("v0", wmma_cublas, "PyTorch", "cuBLAS via torch.matmul", (check_operands,)))
wmma_gemm.add(Impl("v1", wmma_naive, "CUDA", "WMMA, one warp per 16x16 tile, from global", SOURCES))
wmma_gemm.add(Impl("v2", wmma_smem, "CUDA", "WMMA, 128x128 tile, shared memory, 4x2 frags/warp",
                   SOURCES))
wmma_gemm.add(Impl("v3", wmma_async, "CUDA", "like v2, cp.async double buffering", SOURCES))
wmma_gemm.add(Impl("v4", wmma_triton, "Triton", "tl.dot, 128x128x64, 3 stages", TRITON_SOURCES,
                   device="any", dtypes=triton_half_dtypes()))
wmma_gemm.add(Impl("v5", wmma_triton_wide, "Triton", "like v4, 128x256x64 (Part 4's tuned config)",
                   TRITON_SOURCES, device="any", dtypes=triton_half_dtypes()))
wmma_gemm.add(Impl("v6", wmma_mma, "CUDA", "mma.sync m16n8k16 + ldmatrix, swizzled, 3 stages",
                   SOURCES))

tf32_gemm = register(Op(
    name="tf32_gemm", part=3, chapter="part3/tensor-cores.md", title="TF32 GEMM",
    reference=_reference, make_inputs=make_operands, bytes_moved=_bytes, flops=gemm_flops,
    metric="TFLOP/s", ceiling="gemm_tf32", headline=HEADLINE, sweep=SWEEP, dtypes=(torch.float32,),
    test_sizes=TF32_TEST_SIZES, sweep_axis="m",
    tolerances={torch.float32: tolerance_for(MAX_K, torch.float32)},
    tolerance_at=lambda s, d: tolerance_for(s["k"], d)))
tf32_gemm.add(Impl("v0", tf32_cublas, "PyTorch", "cuBLAS via torch.matmul, TF32 on",
                   (check_operands,)))
tf32_gemm.add(Impl("v1", tf32_wmma, "CUDA", "WMMA tf32 m16n16k8, shared-memory tiles", SOURCES))
tf32_gemm.add(Impl("v2", tf32_triton, "Triton", "tl.dot, input_precision=tf32", TRITON_SOURCES,
                   device="any"))
tf32_gemm.add(Impl("v3", tf32_kmajor, "Triton", "like v2, B copied K-major: 16-byte cp.async",
                   KMAJOR_SOURCES, device="any"))
tf32_gemm.add(Impl("v4", tf32_persistent, "Triton",
                   "B^T by Part 2's transpose, Part 4's persistent TMA kernel",
                   PERSISTENT_SOURCES, device="any", requires=needs_hopper))
