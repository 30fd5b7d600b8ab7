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

Versions of ``tf32_gemm`` (fp32 inputs and output, products in TF32, sums in fp32):

- v0  cuBLAS through ``torch.matmul`` with ``torch.backends.cuda.matmul.allow_tf32`` on for
  the call.
- v1  CUDA WMMA with ``wmma::precision::tf32`` (m16n16k8), the structure of ``wmma_gemm`` v2.
- v2  Triton, ``tl.dot(..., input_precision="tf32")``.

A is M x K and B is K x N, both row-major (contiguous). The cost is 2 * M * N * K FLOPs; the fewest
bytes are (M * K + K * N + M * N) * itemsize. ``wmma_gemm`` is compared with cuBLAS fp16
(``gemm_fp16``; cuBLAS bf16 is the ``gemm_bf16`` ceiling of the same run), ``tf32_gemm`` with cuBLAS
TF32 (``gemm_tf32``). ``tf32_round`` emulates TF32 rounding on the CPU, for an accuracy comparison
that runs anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from snippets import cuda
from snippets._checks import check_tensors, triton_device, triton_interpreting
from snippets.registry import Impl, Op, device_generator, register

CU_FILE = "part3/wmma_gemm.cu"
INT32_MAX = 2**31 - 1
GRID_Y_MAX = 65535  # CUDA's limit on gridDim.y
HALF_TYPES = (torch.float16, torch.bfloat16)
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


def check_operands(a: torch.Tensor, b: torch.Tensor, dtypes: tuple[torch.dtype, ...],
                   device: str = "cuda") -> tuple[int, int, int]:
    """A (M x K) and B (K x N): contiguous, non-empty, 2-D, one of ``dtypes``, on ``device``;
    returns (M, N, K)."""
    check_tensors(("a", "b"), (a, b), dtypes=dtypes, device=device, same_shape=False,
                  allow_empty=False)
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"a and b must be 2-D matrices, got shapes {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"inner dimensions differ: a is {m} x {k} but b is {k2} x {n} (a.shape[1] "
                         "must equal b.shape[0])")
    for name, v in (("M", m), ("N", n), ("K", k)):
        if v > INT32_MAX:
            raise ValueError(f"{name} = {v} does not fit the kernels' 32-bit sizes")
    return m, n, k


# --8<-- [start:tolerance]
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
TF32_UNIT_ROUNDOFF = 2.0**-11  # 10 stored mantissa bits, like fp16


def tolerance_for(k: int, dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) against the float64 product, for standard normal inputs of ``dtype`` (float32
    meaning: fp32 inputs multiplied in TF32). An entry of C is a sum of K products of size ~1, so it
    is ~sqrt(K).

    fp16/bf16: the products are exact in fp32 and the fp32 sum is off by ~1e-6 * K at most, so the
    error that matters is the final rounding of C to the dtype, at most u * |C| (u = 2^-11 for fp16,
    2^-8 for bf16): rtol = 2u. atol = 16u * sqrt(K) leaves room for cuBLAS rounding partial sums (of
    size ~sqrt(K)) to the dtype, which torch allows it in split-K kernels
    (allow_fp16/bf16_reduced_precision_reduction): even 16 partial sums added one by one in the
    dtype stay within it. A wrong tile or index is off by ~sqrt(K): 1/(16u) = 128 (fp16) or 16
    (bf16) times atol.

    TF32: each input is rounded to a 10-bit mantissa (relative error up to u = 2^-11 when rounded to
    nearest, 2^-10 when the low bits are simply dropped), so each product is off by ~u and the K
    errors add up like a random walk: ~u * sqrt(K). atol = 16u * sqrt(K) is several standard
    deviations of that even for truncation, and more than 100 times the fp32 tolerance of the SGEMM
    chapter. Truncation also shrinks every input a little, which shrinks C by up to ~2u of itself:
    rtol = 2u."""
    if dtype == torch.float32:
        return 2 * TF32_UNIT_ROUNDOFF, 16 * TF32_UNIT_ROUNDOFF * math.sqrt(k) + 1e-6 * k
    u = UNIT_ROUNDOFF[dtype]
    return 2 * u, 16 * u * math.sqrt(k) + 1e-6 * k
# --8<-- [end:tolerance]


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
class Config:
    """How a CUDA version is launched and what it accepts. A block of ``threads`` computes a
    ``tile`` = (rows, columns) of C; the kernel name gets the dtype's suffix (``wmma_v2`` ->
    ``wmma_v2_f16``). ``multiple``: M, N and K must be multiples of these; ``align``: A and B must
    start on a multiple of this many bytes (load_matrix_sync from global memory needs 32, the
    16-byte copies 16)."""

    kernel: str
    tile: tuple[int, int]
    threads: int
    multiple: tuple[int, int, int]
    align: int
    why: str  # the reason for the size rule, for the error message


CONFIGS = {
    "v1": Config("wmma_v1", tile=(32, 32), threads=128, multiple=(16, 16, 16), align=32,
                 why="v1 loads whole 16 x 16 fragments from global memory, with no bounds checks"),
    "v2": Config("wmma_v2", tile=(128, 128), threads=256, multiple=(1, 8, 8), align=16,
                 why="rows are copied in 16-byte pieces of 8 elements"),
    "v3": Config("wmma_v3", tile=(128, 128), threads=256, multiple=(1, 8, 8), align=16,
                 why="rows are copied in 16-byte pieces of 8 elements"),
}
TF32_CONFIG = Config("wmma_v2", tile=(128, 128), threads=256, multiple=(1, 4, 4), align=16,
                     why="rows are copied in 16-byte pieces of 4 floats")


def check_supported(cfg: Config, a: torch.Tensor, b: torch.Tensor) -> None:
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


def _launch_wmma(a: torch.Tensor, b: torch.Tensor, cfg: Config,
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
    cuda.launch(cuda.kernel(CU_FILE, f"{cfg.kernel}_{SUFFIX[a.dtype]}"), grid, cfg.threads,
                (a, b, c, np.int32(m), np.int32(n), np.int32(k)))
    return c
# --8<-- [end:cuda_launch]


def wmma_naive(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v1: one warp per 16 x 16 tile of C; each step loads a 16 x 16 fragment of A and one of B
    straight from global memory and issues one m16n16k16 MMA. M, N and K must be multiples of 16."""
    return _launch_wmma(a, b, CONFIGS["v1"], HALF_TYPES)


def wmma_smem(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v2: like v1, but a block of 8 warps computes a 128 x 128 tile of C: the block stages 128 x 32
    tiles of A and 32 x 128 tiles of B in padded shared memory with 16-byte loads, and each warp
    computes 64 x 32 of C from them (4 x 2 fragments), so each fragment loaded serves 2 or 4 MMAs.
    Any M; N, K multiples of 8."""
    return _launch_wmma(a, b, CONFIGS["v2"], HALF_TYPES)


def wmma_async(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v3: like v2 with two shared-memory stages filled by cp.async: the copies of the next tile go
    straight from global to shared memory (no staging registers) while the tensor cores work on the
    current one."""
    return _launch_wmma(a, b, CONFIGS["v3"], HALF_TYPES)


def tf32_wmma(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v1 of tf32_gemm: wmma_gemm v2's kernel on fp32 tiles, with m16n16k8 TF32 fragments; each
    fragment element is rounded to TF32 (wmma::__float_to_tf32) before the MMA. Any M; N, K
    multiples of 4."""
    return _launch_wmma(a, b, TF32_CONFIG, (torch.float32,))


# --------------------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------------------

# --8<-- [start:triton]
@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    # Grouped order: consecutive programs take GROUP_M block rows of C down one block column before
    # moving right, so the tiles of A and B they share are still in L2 when the next program
    # needs them.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)  # the last group may be short
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # int64 row offsets: M * K passes 2**31 at 65536 x 32768.
    # (BLOCK_M, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    # (BLOCK_K, BLOCK_N)
    b_ptrs = b_ptr + offs_k[:, None].to(tl.int64) * stride_bk + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        # Zeros outside A and B add nothing to the sums, so ragged M, N and K need no other care.
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k0), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k0) & (offs_n[None, :] < N), other=0.0)
        # One block-level matrix product on the tensor cores, summed into fp32. INPUT_PRECISION
        # matters only for fp32 operands ("tf32": rounded to TF32 for the tensor cores; "ieee":
        # plain fp32 FMAs).
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


# One fixed config per input width, sized for an H100/H200 SM (up to 227 KB of shared memory): 8
# warps, a 128 x 128 tile of C, and 3 stages of A and B tiles in flight: (128 + 128) x 64 x 2 bytes
# x 3 = 96 KB for fp16/bf16; fp32 tiles are twice as wide in bytes, so BLOCK_K is halved to keep the
# same 96 KB.
TRITON_CONFIGS = {
    2: dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
    4: dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, GROUP_M=8, num_warps=8, num_stages=3),
}


def _triton_gemm(a: torch.Tensor, b: torch.Tensor, dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
    m, n, k = check_operands(a, b, dtypes, device=triton_device())
    cfg = TRITON_CONFIGS[a.element_size()]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
    _matmul_kernel[grid](a, b, c, m, n, k, a.stride(0), b.stride(0), c.stride(0),
                         INPUT_PRECISION="tf32", **cfg)
    return c
# --8<-- [end:triton]


def triton_half_dtypes() -> tuple[torch.dtype, ...]:
    """fp16 and bf16 on a GPU; fp16 only under the CPU interpreter, which has no bf16 arithmetic
    (NumPy stores bf16 as raw 16-bit integers, and a tl.dot on them returns garbage)."""
    return (torch.float16,) if triton_interpreting() else HALF_TYPES


def wmma_triton(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v4: Triton. Each program computes a 128 x 128 tile of C with tl.dot on 64-deep slices of A
    and B; the compiler picks the tensor-core instructions, the shared-memory layout and the 3-stage
    copy pipeline."""
    return _triton_gemm(a, b, triton_half_dtypes())


def tf32_triton(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v2 of tf32_gemm: the same Triton kernel on fp32 inputs, tl.dot with input_precision="tf32".
    (Under the CPU interpreter the dot is computed in plain fp32, which is more accurate than TF32
    and passes the same tolerance.)"""
    return _triton_gemm(a, b, (torch.float32,))


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

def _make_inputs(size, dtype, device, gen):
    """A (m x k) and B (k x n) of standard normal values, drawn in fp32 on the target device from a
    seed taken from ``gen`` and rounded to ``dtype`` (the reference then uses the
    rounded values)."""
    dev_gen = device_generator(gen, device)
    a = torch.randn((size["m"], size["k"]), generator=dev_gen, device=device, dtype=torch.float32)
    b = torch.randn((size["k"], size["n"]), generator=dev_gen, device=device, dtype=torch.float32)
    return a.to(dtype), b.to(dtype)


def _flops(size, dtype) -> int:
    return 2 * size["m"] * size["n"] * size["k"]  # one multiply and one add per (i, j, k)


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
TRITON_SOURCES = (_matmul_kernel, _triton_gemm, check_operands)

wmma_gemm = register(Op(
    name="wmma_gemm", part=3, chapter="part3/tensor-cores.md", title="Tensor-core GEMM (fp16/bf16)",
    reference=_reference, make_inputs=_make_inputs, bytes_moved=_bytes, flops=_flops,
    metric="TFLOP/s", ceiling="gemm_fp16", headline=HEADLINE, sweep=SWEEP, dtypes=HALF_TYPES,
    test_sizes=WMMA_TEST_SIZES, sweep_axis="m", bench_dtypes=HALF_TYPES,
    # One tolerance per dtype for every size checked, so sized for the largest K; the module's tests
    # use tolerance_for per shape.
    tolerances={d: tolerance_for(MAX_K, d) for d in HALF_TYPES}))
wmma_gemm.add(Impl("v0", wmma_cublas, "PyTorch", "cuBLAS via torch.matmul", (check_operands,)))
wmma_gemm.add(Impl("v1", wmma_naive, "CUDA", "WMMA, one warp per 16x16 tile, from global", SOURCES))
wmma_gemm.add(Impl("v2", wmma_smem, "CUDA", "WMMA, 128x128 tile, shared memory, 4x2 frags/warp",
                   SOURCES))
wmma_gemm.add(Impl("v3", wmma_async, "CUDA", "like v2, cp.async double buffering", SOURCES))
wmma_gemm.add(Impl("v4", wmma_triton, "Triton", "tl.dot, 128x128x64, 3 stages", TRITON_SOURCES,
                   device="any", dtypes=triton_half_dtypes()))

tf32_gemm = register(Op(
    name="tf32_gemm", part=3, chapter="part3/tensor-cores.md", title="TF32 GEMM",
    reference=_reference, make_inputs=_make_inputs, bytes_moved=_bytes, flops=_flops,
    metric="TFLOP/s", ceiling="gemm_tf32", headline=HEADLINE, sweep=SWEEP, dtypes=(torch.float32,),
    test_sizes=TF32_TEST_SIZES, sweep_axis="m",
    tolerances={torch.float32: tolerance_for(MAX_K, torch.float32)}))
tf32_gemm.add(Impl("v0", tf32_cublas, "PyTorch", "cuBLAS via torch.matmul, TF32 on",
                   (check_operands,)))
tf32_gemm.add(Impl("v1", tf32_wmma, "CUDA", "WMMA tf32 m16n16k8, shared-memory tiles", SOURCES))
tf32_gemm.add(Impl("v2", tf32_triton, "Triton", "tl.dot, input_precision=tf32", TRITON_SOURCES,
                   device="any"))
