"""FP8 GEMMs in Triton: one scale per tensor, and one scale per block (DeepSeek-V3's recipe, as
DeepGEMM runs it), with the promotion of each 128-deep partial sum to fp32 that block scales need.

Both ops take A as M x K and B as N x K (K-major, as Hopper's fp8 tensor-core instruction reads
both operands and as ``torch._scaled_mm`` wants B^T), both in float8 e4m3, and return C = A B^T
in bf16. The arithmetic is the one snippets/part6/fp8.py models on the CPU: e4m3 products are
exact in fp32, the tensor cores sum them, the scales turn the sums back into the real values.

Versions of ``fp8_gemm`` (one fp32 scale per operand: C = (A @ B^T) * a_s * b_s):

- v0  cuBLAS through ``torch._scaled_mm``.
- v1  Triton: one program per tile of C in grouped order, 128-deep K steps whose tensor-core sums
      are promoted into one fp32 accumulator (as cuBLAS does by default), and the two scales
      applied once per element of C, in the epilogue.
- v2  CUDA (csrc/fp8/fp8_gemm.cu, built for sm_90a with nvcc): DeepGEMM's design. A producer
      warpgroup loads 128-deep K-blocks of A and B with TMA (128-byte swizzle) into 6 stages; two
      consumer warpgroups own 64 rows each of a 128 x 128 tile and sum each K-block with four
      wgmma m64n128k32 e4m3 into a temporary that is then added into the fp32 accumulator (the
      promotion every 128 of K, as v1 and cuBLAS compute); the scales in the epilogue; persistent,
      tiles in grouped order. 128 columns: the accumulator and the temporary are 128 registers a
      consumer thread, of the 232 that setmaxnreg gives it.

Versions of ``fp8_gemm_blockscaled`` (A scaled per 1 x 128 block: a_scales is M x K/128; B per
128 x 128 block: b_scales is ceil(N/128) x K/128):

- v0  cuBLAS through ``torch.nn.functional.scaled_mm`` with blockwise recipes (sm_90, CUDA 12.9+).
- v1  Triton: v1's kernel with the scales moved into the K loop: each 128-deep partial product
      (fp32 from tl.dot) is multiplied by a_scale[m, kb] * b_scale[n // 128, kb] and added to
      the fp32 accumulator, so the tensor cores never sum more than 128 products in their
      narrow accumulator.
- v2  dequantise A and B to bf16 in PyTorch, then cuBLAS bf16 (what a framework without a
      block-scaled kernel does: an upper bound on the cost of not having one).
- v3  CUDA: fp8_gemm v2's kernel with the promotion multiplying each 128-deep sum by
      a_scale[m, kb] * b_scale[n // 128, kb] (a 128-column tile has one scale of B per K-block),
      the scales read from global memory one K-block ahead of their use.

The cost: 2 * M * N * K FLOPs on (M*K + N*K) bytes of fp8, (M + N/128) * K/128 * 4 bytes of block
scales and M*N*2 bytes of bf16 C.
"""

from __future__ import annotations

import ctypes
import functools
import shutil
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from snippets import cuda
from snippets._checks import refuse_grad, triton_device, triton_interpreting
from snippets.common.cubin import SM90A_FLAGS, Cubin
from snippets.common.gemm import (
    GROUP_M,
    INT32_MAX,
    prune_configs,
    tile_coords,
    tolerance_for,
)
from snippets.part6.fp8 import E4M3, dequantize_blocks, quantize_blocks, quantize_per_tensor
from snippets.part6.gemm import balanced_grid
from snippets.part6.hopper import TensorMapSpec
from snippets.registry import Impl, Op, device_generator, register, register_ceiling

BLOCK = 128  # the scale block along K (and along N for B): DeepSeek-V3's 1 x 128 and 128 x 128


# --------------------------------------------------------------------------------------------------
# References and inputs
# --------------------------------------------------------------------------------------------------

# --8<-- [start:reference]
def fp8_gemm_ref(a: torch.Tensor, b: torch.Tensor, a_s: torch.Tensor,
                 b_s: torch.Tensor) -> torch.Tensor:
    """Per-tensor scales: C = (A * a_s) @ (B * b_s)^T, dequantised and multiplied in the dtype of
    the scales (fp32: the fp32-accumulated reference; the tests pass float64). 2 * M * N * K FLOPs
    on (M*K + N*K) bytes of fp8 and M*N*2 bytes of bf16 C: 2730 FLOPs per byte at 8192^3."""
    dt = torch.float64 if a_s.dtype == torch.float64 else torch.float32
    return (a.to(dt) * a_s.to(dt)) @ (b.to(dt) * b_s.to(dt)).T


def fp8_gemm_blockscaled_ref(a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor,
                             b_scales: torch.Tensor) -> torch.Tensor:
    """Block scales: every 1 x 128 block of A and every 128 x 128 block of B times its own scale
    (snippets.part6.fp8.dequantize_blocks), then one matrix product in the scales' dtype (fp32 or
    float64). B's last block row may be short (N not a multiple of 128)."""
    dt = torch.float64 if a_scales.dtype == torch.float64 else torch.float32
    n = b.shape[0]
    b_rows = b_scales.repeat_interleave(BLOCK, 0)[:n]  # one row of scales per row of B
    a_deq = dequantize_blocks(a.to(dt), a_scales.to(dt))
    b_deq = dequantize_blocks(b.to(dt), b_rows.to(dt))
    return a_deq.to(dt) @ b_deq.to(dt).T


def scaled_error(c: torch.Tensor, ref: torch.Tensor) -> float:
    """max |C - ref| / max |ref|: the error metric of the goals (one number per product, which the
    test holds to a multiple of the fp32-accumulated reference's own error)."""
    c64, r64 = c.double(), ref.double()
    return float((c64 - r64).abs().max() / r64.abs().max().clamp(min=1e-300))
# --8<-- [end:reference]


# --8<-- [start:quantize]
def quantize_activation(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M x K) -> (e4m3 M x K, fp32 scales M x K/128): one scale per 1 x 128 block."""
    return quantize_blocks(x, (1, BLOCK))


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (N x K) -> (e4m3 N x K, fp32 scales N/128 x K/128): one scale per 128 x 128 block."""
    return quantize_blocks(w, (BLOCK, BLOCK))


def make_per_tensor_inputs(size, dtype, device, gen):
    """A (m x k) and B (n x k) of standard normal values, each quantised to e4m3 with one fp32
    scale (snippets.part6.fp8.quantize_per_tensor: its largest magnitude maps to 448)."""
    dev_gen = device_generator(gen, device)
    a = torch.randn((size["m"], size["k"]), generator=dev_gen, device=device)
    b = torch.randn((size["n"], size["k"]), generator=dev_gen, device=device)
    (a8, a_s), (b8, b_s) = quantize_per_tensor(a), quantize_per_tensor(b)
    return a8, b8, a_s, b_s


def make_blockscaled_inputs(size, dtype, device, gen):
    """A (m x k) and B (n x k) of standard normal values, A quantised per 1 x 128 block and B per
    128 x 128 block: (a, a_scales, b, b_scales), the order of the block-scaled functions."""
    dev_gen = device_generator(gen, device)
    a = torch.randn((size["m"], size["k"]), generator=dev_gen, device=device)
    b = torch.randn((size["n"], size["k"]), generator=dev_gen, device=device)
    (a8, a_sc), (b8, b_sc) = quantize_activation(a), quantize_weight(b)
    return a8, a_sc, b8, b_sc
# --8<-- [end:quantize]


# --------------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------------

# --8<-- [start:checks]
def check_fp8_operands(name: str, a: torch.Tensor, b: torch.Tensor,
                       device: str) -> tuple[int, int, int]:
    """A (M x K) and B (N x K): tensors, float8_e4m3fn, 2-D, non-empty, on ``device``, one shared
    K, contiguous along K (stride 1 in the last dimension: the layout both ops read), sizes that
    fit 32-bit arithmetic. Returns (M, N, K)."""
    for arg, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {arg} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != E4M3:
            raise TypeError(f"{name}: {arg} must be torch.float8_e4m3fn, got {t.dtype}")
        if t.dim() != 2:
            raise ValueError(f"{name}: {arg} must be 2-D, got shape {tuple(t.shape)}")
        if t.numel() == 0:
            raise ValueError(f"{name}: {arg} is empty, shape {tuple(t.shape)}")
        if t.device.type != device:
            raise ValueError(f"{name}: {arg} must be on a {device} device, got {t.device}")
        if t.stride(1) != 1 or t.stride(0) < t.shape[1]:
            raise ValueError(f"{name}: {arg} must be K-major (row-major {tuple(t.shape)}, strides "
                             f"(>= K, 1)), got strides {t.stride()}; pass .contiguous()")
    (m, k), (n, k2) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"{name}: a is {m} x {k} and b is {n} x {k2}: b is N x K (B transposed), "
                         "its K must equal a's")
    for dim, v in (("M", m), ("N", n), ("K", k)):
        if v > INT32_MAX:
            raise ValueError(f"{name}: {dim} = {v} does not fit 32-bit sizes")
    return m, n, k


def check_tensor_scales(name: str, a_s: torch.Tensor, b_s: torch.Tensor,
                        device: torch.device) -> None:
    """Per-tensor scales: fp32 tensors of one element (shape () or (1,)) on the operands' device."""
    for arg, s in (("a_s", a_s), ("b_s", b_s)):
        if not isinstance(s, torch.Tensor):
            raise TypeError(f"{name}: {arg} must be a torch.Tensor, got {type(s).__name__}")
        if s.dtype != torch.float32:
            raise TypeError(f"{name}: {arg} must be float32, got {s.dtype}")
        if s.numel() != 1 or s.dim() > 1:
            raise ValueError(f"{name}: {arg} must hold one value (shape () or (1,)), got shape "
                             f"{tuple(s.shape)}; block scales go to fp8_gemm_blockscaled")
        if s.device != device:
            raise ValueError(f"{name}: {arg} is on {s.device} but the operands are on {device}")


def check_block_scales(name: str, m: int, n: int, k: int, a_scales: torch.Tensor,
                       b_scales: torch.Tensor, device: torch.device) -> None:
    """Block scales: K a multiple of 128; a_scales fp32 of shape (M, K/128) (one per 1 x 128 block
    of A) and b_scales fp32 of shape (ceil(N/128), K/128) (one per 128 x 128 block of B), any
    strides, on the operands' device."""
    if k % BLOCK:
        raise ValueError(f"{name}: K = {k} must be a multiple of {BLOCK} (one scale per {BLOCK} "
                         "elements of K)")
    want = {"a_scales": (m, k // BLOCK), "b_scales": (-(-n // BLOCK), k // BLOCK)}
    for arg, s in (("a_scales", a_scales), ("b_scales", b_scales)):
        if not isinstance(s, torch.Tensor):
            raise TypeError(f"{name}: {arg} must be a torch.Tensor, got {type(s).__name__}")
        if s.dtype != torch.float32:
            raise TypeError(f"{name}: {arg} must be float32, got {s.dtype}")
        if tuple(s.shape) != want[arg]:
            raise ValueError(f"{name}: {arg} must have shape {want[arg]} for M, N, K = {m}, {n}, "
                             f"{k}, got {tuple(s.shape)}")
        if s.device != device:
            raise ValueError(f"{name}: {arg} is on {s.device} but the operands are on {device}")


def needs_fp8_triton() -> str | None:
    """For ``Impl(requires=...)`` of the Triton versions: fp8 tensor cores (compute capability 8.9,
    Ada, or 9.0, Hopper) and torch's float8 types; the CPU interpreter emulates them."""
    if not hasattr(torch, "float8_e4m3fn"):
        return f"torch {torch.__version__} has no float8_e4m3fn"
    if triton_interpreting():
        return None
    return needs_fp8_cuda()


def needs_fp8_cuda() -> str | None:
    """For the cuBLAS versions: a CUDA GPU with fp8 tensor cores."""
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if torch.cuda.get_device_capability() < (8, 9):
        return ("fp8 tensor cores need compute capability 8.9+, this GPU has "
                f"{torch.cuda.get_device_capability()}")
    return None


def needs_blockwise_cublas() -> str | None:
    """cuBLAS's 1 x 128 / 128 x 128 block scaling: compute capability 9.0 exactly, CUDA 12.9+, and
    a torch with ``torch.nn.functional.scaled_mm`` and its blockwise recipes."""
    reason = needs_fp8_cuda()
    if reason:
        return reason
    if torch.cuda.get_device_capability() != (9, 0):
        return ("cuBLAS blockwise fp8 scaling needs compute capability 9.0, this GPU has "
                f"{torch.cuda.get_device_capability()}")
    cuda = tuple(int(x) for x in (torch.version.cuda or "0.0").split(".")[:2])
    if cuda < (12, 9):
        return f"cuBLAS blockwise fp8 scaling needs CUDA 12.9+, torch was built with {cuda}"
    recipes = getattr(torch.nn.functional, "ScalingType", None)
    if not hasattr(torch.nn.functional, "scaled_mm") or not hasattr(recipes, "BlockWise1x128"):
        return f"torch {torch.__version__} has no scaled_mm with blockwise recipes"
    return None
# --8<-- [end:checks]


# --------------------------------------------------------------------------------------------------
# The kernel: per-tensor scales in the epilogue, or block scales in the K loop
# --------------------------------------------------------------------------------------------------

# --8<-- [start:kernel]
@triton.jit
def _fp8_gemm_kernel(a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, M, N, K,
                     stride_am, stride_bn, stride_cm, stride_asm, stride_ask, stride_bsn,
                     stride_bsk,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr, BLOCKWISE: tl.constexpr):
    # BLOCKWISE: one K step is one scale block, and a program's columns never straddle two blocks
    # of B's scales in a way the per-column load below cannot express (it loads one per column).
    tl.static_assert(not BLOCKWISE or BLOCK_K == 128, "block scales change every 128 along K")
    pid_m, pid_n = tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # A is M x K and B is N x K, both K-major (stride 1 along K): the (BLOCK_K, BLOCK_N) tile of
    # B^T is read column by column, the operand layout fp8 wgmma needs. int64 rows: M * K can pass
    # 2**31.
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]  # (BM, BK)
    b_ptrs = b_ptr + offs_n[None, :].to(tl.int64) * stride_bn + offs_k[:, None]  # (BK, BN)
    if BLOCKWISE:
        as_ptrs = as_ptr + offs_m * stride_asm                 # (BLOCK_M,): row m's scales
        bs_ptrs = bs_ptr + (offs_n // 128) * stride_bsn        # (BLOCK_N,): column n's block row
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        # Zeros outside A and B add nothing: ragged M, N (and K, per tensor) need no other care.
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k0), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k0) & (offs_n[None, :] < N), other=0.0)
        if BLOCKWISE:
            # Promotion: the tensor cores sum this block's 128 products (in their own accumulator),
            # the result comes out as fp32, is scaled by its two block scales and added here in
            # fp32 registers. The scales cannot go inside the tensor-core sum: they differ per
            # block of K.
            kb = k0 // BLOCK_K
            a_s = tl.load(as_ptrs + kb * stride_ask, mask=offs_m < M, other=0.0)
            b_s = tl.load(bs_ptrs + kb * stride_bsk, mask=offs_n < N, other=0.0)
            partial = tl.dot(a, b, out_dtype=tl.float32)
            acc += partial * a_s[:, None] * b_s[None, :]
        else:
            # One fp32 accumulator through all of K. max_num_imprecise_acc=BLOCK_K: on sm_90 Triton
            # lets fp8 wgmma sum all of K in the tensor cores' narrow accumulator unless told
            # otherwise (its default is 2**30); this promotes into fp32 every K step, as cuBLAS does
            # without use_fast_accum, so v0 and v1 compute the same thing.
            acc = tl.dot(a, b, acc, out_dtype=tl.float32, max_num_imprecise_acc=BLOCK_K)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if not BLOCKWISE:  # per tensor: one multiply per element of C, not one per product
        acc = acc * (tl.load(as_ptr) * tl.load(bs_ptr))
    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
# --8<-- [end:kernel]


# --8<-- [start:configs]
# Hopper configs: 128 x 128 and 128 x 256 tiles of C, K steps of 128 fp8 values (128 bytes: one
# 128-byte shared-memory swizzle row, and exactly one scale block), 3 or 4 stages, 8 warps (two
# warpgroups: a 128 x 256 fp32 accumulator over 256 threads is 128 registers each). Shared memory
# per config: stages * (BLOCK_M + BLOCK_N) * 128 bytes, at most 4 * 384 * 128 = 192 KiB, under the
# 227 KiB of sm_90; prune_configs (snippets.common.gemm) drops what a smaller GPU cannot hold.
HOPPER_TILES = ((128, 128), (128, 256))


def fp8_configs() -> list[triton.Config]:
    return [triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=BLOCK, GROUP_M=GROUP_M),
                          num_warps=8, num_stages=stages)
            for bm, bn in HOPPER_TILES for stages in (3, 4)]


@functools.lru_cache(maxsize=None)
def autotuned():
    """The kernel wrapped in an autotuner keyed on (M, N, K) and the scaling (BLOCKWISE is a
    constexpr argument: the tuner's cache keys on it through the call's specialisation)."""
    return triton.autotune(configs=fp8_configs(), key=["M", "N", "K", "BLOCKWISE"],
                           prune_configs_by={"early_config_prune": prune_configs})(_fp8_gemm_kernel)


# Under the interpreter nothing is tuned: one small config (BLOCK_K stays 128, the scale block).
INTERPRET = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=BLOCK, GROUP_M=2, num_warps=4, num_stages=2)
# --8<-- [end:configs]


# --8<-- [start:launch]
def _launch(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
            blockwise: bool, config: dict | None = None) -> torch.Tensor:
    """The one launcher of both Triton versions: allocates C (bf16) and launches the kernel with
    the autotuner on a GPU, or ``config`` (the interpreter's by default)."""
    (m, k), n = a.shape, b.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    sa = (a_scale.stride(0), a_scale.stride(1)) if blockwise else (0, 0)
    sb = (b_scale.stride(0), b_scale.stride(1)) if blockwise else (0, 0)
    args = (a, b, c, a_scale, b_scale, m, n, k, a.stride(0), b.stride(0), c.stride(0), *sa, *sb)
    if config is None and triton_interpreting():
        config = INTERPRET
    if config is None:
        grid = lambda meta: (  # noqa: E731
            triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)
        autotuned()[grid](*args, BLOCKWISE=blockwise)
    else:
        grid = (triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"]),)
        _fp8_gemm_kernel[grid](*args, BLOCKWISE=blockwise, **config)
    return c
# --8<-- [end:launch]


# --------------------------------------------------------------------------------------------------
# The public functions
# --------------------------------------------------------------------------------------------------

# --8<-- [start:per_tensor]
def fp8_gemm_cublas(a, b, a_s, b_s):
    """fp8_gemm v0: cuBLAS through torch._scaled_mm (B^T is column-major: a view of N x K B);
    M, N, K multiples of 16 as cuBLAS requires."""
    name = "fp8_gemm_cublas"
    m, n, k = check_fp8_operands(name, a, b, "cuda")
    check_tensor_scales(name, a_s, b_s, a.device)
    if m % 16 or n % 16 or k % 16:
        raise ValueError(f"{name}: torch._scaled_mm needs M, N, K multiples of 16, got {m} x {n} "
                         f"x {k}")
    return torch._scaled_mm(a, b.T, scale_a=a_s, scale_b=b_s, out_dtype=torch.bfloat16)


def fp8_gemm_triton(a, b, a_s, b_s):
    """fp8_gemm v1: the Triton kernel with one fp32 accumulator over all of K (each 128-deep
    tensor-core sum promoted into it) and the scales in the epilogue; autotuned over the Hopper
    configs."""
    name = "fp8_gemm_triton"
    refuse_grad(name, a, b, a_s, b_s, instead="fp8_gemm_ref")
    check_fp8_operands(name, a, b, triton_device())
    check_tensor_scales(name, a_s, b_s, a.device)
    return _launch(a, b, a_s, b_s, blockwise=False)
# --8<-- [end:per_tensor]


# --8<-- [start:blockscaled]
def fp8_gemm_blockscaled_cublas(a, a_scales, b, b_scales):
    """fp8_gemm_blockscaled v0: cuBLAS through torch.nn.functional.scaled_mm with the recipes
    BlockWise1x128 (A) and BlockWise128x128 (B). cuBLAS wants A's scales M-major (stride (1, M))
    and B's as a K-major (L4, N/128) matrix with the K/128 blocks padded to L4, a multiple of 4."""
    name = "fp8_gemm_blockscaled_cublas"
    m, n, k = check_fp8_operands(name, a, b, "cuda")
    check_block_scales(name, m, n, k, a_scales, b_scales, a.device)
    reason = needs_blockwise_cublas()
    if reason:
        raise RuntimeError(f"{name}: {reason}")
    F = torch.nn.functional
    kb = k // BLOCK
    l4 = -(-kb // 4) * 4
    sa = a_scales.t().contiguous().t()                         # (M, K/128), stride (1, M)
    sb = torch.zeros((b_scales.shape[0], l4), dtype=torch.float32, device=a.device)
    sb[:, :kb] = b_scales                                      # (N/128, L4) row-major ...
    return F.scaled_mm(a, b.T, sa, F.ScalingType.BlockWise1x128, sb.t(),  # ... read as (L4, N/128)
                       F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)


def fp8_gemm_blockscaled_triton(a, a_scales, b, b_scales):
    """fp8_gemm_blockscaled v1: the same kernel as fp8_gemm v1, with each 128-deep partial product
    scaled by its two block scales and promoted into the fp32 accumulator inside the K loop."""
    name = "fp8_gemm_blockscaled_triton"
    refuse_grad(name, a, a_scales, b, b_scales, instead="fp8_gemm_blockscaled_ref")
    m, n, k = check_fp8_operands(name, a, b, triton_device())
    check_block_scales(name, m, n, k, a_scales, b_scales, a.device)
    return _launch(a, b, a_scales, b_scales, blockwise=True)


def fp8_gemm_blockscaled_dequant(a, a_scales, b, b_scales):
    """fp8_gemm_blockscaled v2: dequantise both operands to bf16 in PyTorch, then cuBLAS bf16: two
    extra passes over A and B (fp8 read, bf16 written and read again) and bf16's tensor-core
    rate, half of fp8's."""
    name = "fp8_gemm_blockscaled_dequant"
    m, n, k = check_fp8_operands(name, a, b, "cuda")
    check_block_scales(name, m, n, k, a_scales, b_scales, a.device)
    a16 = (a.float().reshape(m, k // BLOCK, BLOCK) * a_scales[:, :, None]).reshape(m, k)
    b_rows = b_scales.repeat_interleave(BLOCK, 0)[:n]
    b16 = (b.float().reshape(n, k // BLOCK, BLOCK) * b_rows[:, :, None]).reshape(n, k)
    return torch.matmul(a16.to(torch.bfloat16), b16.to(torch.bfloat16).T)
# --8<-- [end:blockscaled]


# --------------------------------------------------------------------------------------------------
# The CUDA versions (csrc/fp8/fp8_gemm.cu): TMA, a producer and two consumer warpgroups, wgmma e4m3
# --------------------------------------------------------------------------------------------------

# --8<-- [start:cuda_config]
CU_FILE = "fp8/fp8_gemm.cu"
CUBIN = Cubin(CU_FILE, SM90A_FLAGS, name="fp8_gemm")


@dataclass(frozen=True)
class CudaConfig:
    """The constants of csrc/fp8/fp8_gemm.cu, mirrored for the launcher (a CPU test compares):
    a block of a producer and ``consumers`` warpgroups computes a ``block_m`` x ``block_n`` tile
    of C, ``stages`` K-blocks of ``block_k`` fp8 values (128 bytes, one 128B-swizzled row) in
    flight."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = BLOCK
    stages: int = 6
    consumers: int = 2
    group_m: int = 8
    producer_regs: int = 40
    consumer_regs: int = 232

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    @property
    def stage_bytes(self) -> int:
        return (self.block_m + self.block_n) * self.block_k  # one byte per e4m3 value

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: the stages, 1024 bytes of alignment slack (tiles start on the
        swizzle's 1024-byte repeat), a full and an empty mbarrier (8 bytes each) per stage."""
        return self.stages * self.stage_bytes + 1024 + 2 * 8 * self.stages

    @property
    def accumulator_registers(self) -> int:
        """fp32 registers a consumer thread holds for acc and the wgmma temporary together: two
        64 x block_n tiles over the warpgroup's 128 threads."""
        return 2 * 64 * self.block_n // 128


CUDA_CONFIG = CudaConfig()
KERNELS = {False: "fp8_gemm_tensor", True: "fp8_gemm_block"}  # by BLOCKWISE
# fp8_gemm v3 and fp8_gemm_blockscaled v4: the same with 16-byte stores of C (and a balanced grid)
KERNELS16 = {False: "fp8_gemm_tensor16", True: "fp8_gemm_block16"}
# --8<-- [end:cuda_config]


# --8<-- [start:cuda_checks]
def needs_fp8_sm90() -> str | None:
    """For the CUDA versions: an sm_90 GPU (the kernels are built for sm_90a: wgmma, setmaxnreg),
    nvcc on PATH to build them, and CuPy to load them."""
    reason = needs_fp8_cuda()
    if reason:
        return reason
    cap = torch.cuda.get_device_capability()
    if cap != (9, 0):
        return f"the fp8 CUDA kernels are compiled for sm_90a (H100, H200); this GPU is {cap}"
    if shutil.which("nvcc") is None:
        return "needs nvcc on PATH to compile the sm_90a kernels"
    try:
        cuda.cupy_module()
    except RuntimeError as exc:
        return str(exc)
    return None


def tma_specs(name: str, a: torch.Tensor, b: torch.Tensor,
              cfg: CudaConfig = CUDA_CONFIG) -> tuple[TensorMapSpec, TensorMapSpec]:
    """What TMA adds to check_fp8_operands (run it first): A and B on one device, 16-byte aligned
    starts, row strides a multiple of 16 bytes (K % 16 == 0 for contiguous rows), and a tile count
    that fits 32-bit ints. Returns the two tensor maps' specs: dimensions innermost first (K, rows),
    boxes of 128 (K) x block rows, the 128B swizzle; TMA fills rows and columns outside A and B
    with zeros, so ragged M, N and K need nothing else."""
    if a.device != b.device:
        raise ValueError(f"{name}: a is on {a.device}, b on {b.device}")
    tiles = -(-a.shape[0] // cfg.block_m) * -(-b.shape[0] // cfg.block_n)
    if tiles > INT32_MAX:
        raise ValueError(f"{name}: {tiles} tiles of C do not fit the kernel's 32-bit tile index")
    specs = []
    for arg, t, rows in (("a", a, cfg.block_m), ("b", b, cfg.block_n)):
        try:
            specs.append(TensorMapSpec(1, (t.shape[1], t.shape[0]), (t.stride(0),),
                                       (cfg.block_k, rows), swizzle="128B",
                                       global_address=t.data_ptr()).validate())
        except ValueError as exc:
            raise ValueError(f"{name}: {arg} cannot be read by TMA (its rows must start 16-byte "
                             f"aligned, K % 16 == 0 when contiguous): {exc}") from None
    return specs[0], specs[1]
# --8<-- [end:cuda_checks]


# --8<-- [start:cuda_tensor_map]
CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0  # CUtensorMapDataType (cuda.h): TMA copies fp8 as bytes
CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3
CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0  # out-of-bounds elements arrive as zeros


@functools.lru_cache(maxsize=None)
def encode_tiled():
    """The driver's cuTensorMapEncodeTiled (libcuda, through ctypes)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise RuntimeError("the fp8 CUDA kernels encode TMA tensor maps through the CUDA driver, "
                           f"and libcuda.so.1 cannot be loaded: {exc}") from None
    fn = lib.cuTensorMapEncodeTiled
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p,
                   u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def encode_fp8_tensor_map(spec: TensorMapSpec) -> bytes:
    """The 128-byte CUtensorMap of an e4m3 operand (as UINT8: TMA moves bytes, wgmma reads them as
    e4m3), from a spec tma_specs validated."""
    raw = ctypes.create_string_buffer(128 + 64)  # CUtensorMap is declared 64-byte aligned
    addr = (ctypes.addressof(raw) + 63) & ~63
    rank = spec.rank
    dims = (ctypes.c_uint64 * rank)(*spec.global_shape)
    strides = (ctypes.c_uint64 * max(1, rank - 1))(*spec.global_strides)
    box = (ctypes.c_uint32 * rank)(*spec.box_shape)
    elem = (ctypes.c_uint32 * rank)(*spec.element_strides)
    err = encode_tiled()(addr, CU_TENSOR_MAP_DATA_TYPE_UINT8, rank, spec.global_address, dims,
                         strides, box, elem, spec.interleave.tensor_map_interleave,
                         spec.swizzle.tensor_map_swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err:
        raise RuntimeError(f"cuTensorMapEncodeTiled returned CUresult {err} for {spec}")
    return ctypes.string_at(addr, 128)


# (device, specs) -> the maps on that device: a map depends only on its spec (address, shape,
# strides, box), so a hit is right even for a new tensor at a freed one's address.
TENSOR_MAPS: dict[tuple, torch.Tensor] = {}


def device_fp8_tensor_maps(specs: tuple[TensorMapSpec, ...], device) -> torch.Tensor:
    """A's and B's tensor maps, 128 bytes each, in one tensor on ``device``; encoded and copied once
    per spec (a timing loop does neither)."""
    key = (str(device), *specs)
    maps = TENSOR_MAPS.get(key)
    if maps is None:
        host = bytearray(b"".join(encode_fp8_tensor_map(spec) for spec in specs))
        maps = torch.frombuffer(host, dtype=torch.uint8).to(device)  # 256-byte aligned
        if len(TENSOR_MAPS) > 256:
            TENSOR_MAPS.clear()
        TENSOR_MAPS[key] = maps
    return maps
# --8<-- [end:cuda_tensor_map]


# --8<-- [start:cuda_launch]
def cuda_grid(m: int, n: int, sms: int, cfg: CudaConfig = CUDA_CONFIG,
              balanced: bool = False) -> int:
    """Persistent: one block per SM (__launch_bounds__(384, 1) and ~194 KiB of shared memory allow
    no second), never more blocks than tiles; ``balanced`` (v3, v4): the fewest blocks that take
    the same rounds of tiles (the Hopper GEMM's ``balanced_grid``)."""
    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    fit = min(sms, tiles)
    return balanced_grid(tiles, fit) if balanced else fit


def launch_cuda(name: str, a: torch.Tensor, b: torch.Tensor, specs, blockwise: bool,
                scale_args: tuple, store16: bool = False) -> torch.Tensor:
    """The one launcher of the CUDA versions (operands and scales already checked); ``store16``:
    the kernels with 16-byte stores of C, on the balanced grid (v3 and v4)."""
    reason = needs_fp8_sm90()
    if reason:
        raise RuntimeError(f"{name}: {reason}")
    cfg = CUDA_CONFIG
    (m, k), n = a.shape, b.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    index = a.device.index if a.device.index is not None else 0
    tmaps = device_fp8_tensor_maps(specs, a.device)
    fn = CUBIN.kernel((KERNELS16 if store16 else KERNELS)[blockwise], index)
    if fn.max_dynamic_shared_size_bytes < cfg.smem_bytes:
        fn.max_dynamic_shared_size_bytes = cfg.smem_bytes  # above 48 KiB needs the opt-in
    with torch.cuda.device(a.device):
        sms = torch.cuda.get_device_properties(a.device).multi_processor_count
        cuda.launch(fn, cuda_grid(m, n, sms, balanced=store16), cfg.threads,
                    (tmaps, c, np.int32(m), np.int32(n), np.int32(k), np.int64(n), *scale_args),
                    shared_mem=cfg.smem_bytes)
    return c


def tensor_scaled_cuda(name: str, a, b, a_s, b_s, store16: bool) -> torch.Tensor:
    """The per-tensor-scaled versions' checks and launch (v2, and v3 with ``store16``)."""
    refuse_grad(name, a, b, a_s, b_s, instead="fp8_gemm_ref")
    check_fp8_operands(name, a, b, "cuda")
    check_tensor_scales(name, a_s, b_s, a.device)
    specs = tma_specs(name, a, b)
    return launch_cuda(name, a, b, specs, False, (a_s, b_s), store16=store16)


def block_scaled_cuda(name: str, a, a_scales, b, b_scales, store16: bool) -> torch.Tensor:
    """The block-scaled versions' checks and launch (v3, and v4 with ``store16``)."""
    refuse_grad(name, a, a_scales, b, b_scales, instead="fp8_gemm_blockscaled_ref")
    m, n, k = check_fp8_operands(name, a, b, "cuda")
    check_block_scales(name, m, n, k, a_scales, b_scales, a.device)
    specs = tma_specs(name, a, b)
    strides = (*a_scales.stride(), *b_scales.stride())
    return launch_cuda(name, a, b, specs, True,
                       (a_scales, b_scales, *(np.int64(s) for s in strides)), store16=store16)


def fp8_gemm_cuda(a, b, a_s, b_s):
    """fp8_gemm v2: csrc/fp8/fp8_gemm.cu's fp8_gemm_tensor. TMA loads by a producer warpgroup, two
    consumer warpgroups of wgmma m64n128k32 e4m3 whose 128-deep sums are promoted into an fp32
    accumulator, the scales in the epilogue, persistent over 128 x 128 tiles in grouped order."""
    return tensor_scaled_cuda("fp8_gemm_cuda", a, b, a_s, b_s, store16=False)


def fp8_gemm_blockscaled_cuda(a, a_scales, b, b_scales):
    """fp8_gemm_blockscaled v3: the same kernel (fp8_gemm_block) with each 128-deep sum multiplied
    by a_scales[m, kb] * b_scales[n // 128, kb] as it is promoted; the scales are read one K-block
    ahead, any strides."""
    return block_scaled_cuda("fp8_gemm_blockscaled_cuda", a, a_scales, b, b_scales, store16=False)


def fp8_gemm_cuda16(a, b, a_s, b_s):
    """fp8_gemm v3: v2 with the Hopper GEMM's last two steps, 16-byte stores of C
    (fp8_gemm_tensor16) and the balanced persistent grid."""
    return tensor_scaled_cuda("fp8_gemm_cuda16", a, b, a_s, b_s, store16=True)


def fp8_gemm_blockscaled_cuda16(a, a_scales, b, b_scales):
    """fp8_gemm_blockscaled v4: v3 with 16-byte stores of C (fp8_gemm_block16) and the
    balanced persistent grid."""
    return block_scaled_cuda("fp8_gemm_blockscaled_cuda16", a, a_scales, b, b_scales, store16=True)
# --8<-- [end:cuda_launch]


# --------------------------------------------------------------------------------------------------
# The ceiling: cuBLAS fp8 with per-tensor scales at 8192^3
# --------------------------------------------------------------------------------------------------

def _measure_ceiling(quick: bool) -> dict:
    from snippets.bench.timing import time_device

    m = 4096 if quick else 8192
    args = make_per_tensor_inputs({"m": m, "n": m, "k": m}, E4M3, "cuda",
                                  torch.Generator().manual_seed(0))
    t = time_device(fp8_gemm_cublas, [args], budget_ms=400)
    return {"value": 2 * m**3 / (t.median * 1e-3) / 1e12, "unit": "TFLOP/s",
            "how": f"torch._scaled_mm {m}x{m}x{m} float8_e4m3fn (B^T column-major), per-tensor "
                   "scales, bf16 out"}


# Part 4 measures the same rate as "gemm_fp8"; a chapter of Part 6 cannot import Part 4 (the import
# rule), so this one registers its own, measured the same way with this module's v0.
CEILING = "gemm_fp8_scaled_mm"
register_ceiling(CEILING, "cuBLAS fp8 (e4m3) GEMM rate, torch._scaled_mm per-tensor, B K-major",
                 _measure_ceiling)


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def gemm_flops(size, dtype) -> int:
    return 2 * size["m"] * size["n"] * size["k"]  # one multiply and one add per (i, j, k)


def per_tensor_bytes(size, dtype) -> int:
    m, n, k = size["m"], size["n"], size["k"]
    return (m * k + n * k) + m * n * 2  # fp8 A and B, bf16 C


def blockscaled_bytes(size, dtype) -> int:
    m, n, k = size["m"], size["n"], size["k"]
    scales = (m + -(-n // BLOCK)) * (k // BLOCK) * 4  # fp32 scales of A's rows and B's blocks
    return per_tensor_bytes(size, dtype) + scales


FP8_TO_BF16 = {E4M3: torch.bfloat16}
HEADLINE = {"m": 8192, "n": 8192, "k": 8192}
SWEEP = [{"m": s, "n": s, "k": s} for s in (2048, 4096, 6144, 8192)]
# DeepSeek-V3's shapes are the reason for the recipe: 7168 is its hidden size; K = 16384 is long
# enough that an unpromoted tensor-core sum would lose precision (snippets/part6/fp8.py's model).
BS_HEADLINE = {"m": 4096, "n": 7168, "k": 16384}
BS_SWEEP = [{"m": m, "n": 7168, "k": 16384} for m in (1024, 2048, 4096)]
# Multiples of 16 (cuBLAS fp8), ragged against the 32 x 32 interpreter tiles only where the
# Triton versions allow it: the module's tests cover ragged shapes for them.
TEST_SIZES = [{"m": m, "n": n, "k": k} for m, n, k in ((16, 16, 128), (48, 80, 256),
                                                       (96, 64, 160))]
BS_TEST_SIZES = [{"m": m, "n": n, "k": k} for m, n, k in ((16, 128, 128), (48, 256, 384),
                                                          (96, 128, 512))]
MAX_K = max(s["k"] for s in [HEADLINE, *SWEEP, BS_HEADLINE, *BS_SWEEP])
# e4m3 products are exact in fp32 and 128-deep partial sums lose at most ~1e-6 relative; what is
# left is C's rounding to bf16 (tolerance_for of snippets.common.gemm at bf16, K-sized).
TOLERANCES = {E4M3: tolerance_for(MAX_K, torch.bfloat16)}

SOURCES = (_fp8_gemm_kernel, tile_coords, _launch, fp8_configs, autotuned, prune_configs,
           check_fp8_operands)

CUDA_SOURCES = (cuda.source_path(CU_FILE), CUBIN.build, launch_cuda, tma_specs, check_fp8_operands,
                encode_fp8_tensor_map, device_fp8_tensor_maps, cuda_grid, needs_fp8_sm90)

fp8_gemm = register(Op(
    name="fp8_gemm", part=6, chapter="part6/fp8-gemm.md",
    title="FP8 GEMM (e4m3, per-tensor scales)", reference=fp8_gemm_ref,
    make_inputs=make_per_tensor_inputs, bytes_moved=per_tensor_bytes, flops=gemm_flops,
    metric="TFLOP/s", ceiling=CEILING, headline=HEADLINE, sweep=SWEEP, dtypes=(E4M3,),
    bench_dtypes=(E4M3,), test_sizes=TEST_SIZES, sweep_axis="m", output_dtypes=FP8_TO_BF16,
    tolerances=TOLERANCES, tolerance_at=lambda s, d: tolerance_for(s["k"], torch.bfloat16)))
fp8_gemm.add(Impl("v0", fp8_gemm_cublas, "PyTorch", "cuBLAS via torch._scaled_mm",
                  (check_fp8_operands, check_tensor_scales), requires=needs_fp8_cuda,
                  origin="library"))
fp8_gemm.add(Impl("v1", fp8_gemm_triton, "Triton", "promoted every K step, scales in the epilogue",
                  (*SOURCES, check_tensor_scales), device="any", requires=needs_fp8_triton))
fp8_gemm.add(Impl("v2", fp8_gemm_cuda, "CUDA",
                  "TMA producer + 2 wgmma consumers, promoted every 128, persistent",
                  (*CUDA_SOURCES, check_tensor_scales), requires=needs_fp8_sm90))
fp8_gemm.add(Impl("v3", fp8_gemm_cuda16, "CUDA",
                  "like v2, 16-byte stores of C, balanced grid",
                  (*CUDA_SOURCES, check_tensor_scales), requires=needs_fp8_sm90))

fp8_gemm_blockscaled = register(Op(
    name="fp8_gemm_blockscaled", part=6, chapter="part6/fp8-gemm.md",
    title="FP8 GEMM (e4m3, 1x128 / 128x128 block scales)", reference=fp8_gemm_blockscaled_ref,
    make_inputs=make_blockscaled_inputs, bytes_moved=blockscaled_bytes, flops=gemm_flops,
    metric="TFLOP/s", ceiling=CEILING, headline=BS_HEADLINE, sweep=BS_SWEEP, dtypes=(E4M3,),
    bench_dtypes=(E4M3,), test_sizes=BS_TEST_SIZES, sweep_axis="m", output_dtypes=FP8_TO_BF16,
    tolerances=TOLERANCES, tolerance_at=lambda s, d: tolerance_for(s["k"], torch.bfloat16)))
fp8_gemm_blockscaled.add(Impl(
    "v0", fp8_gemm_blockscaled_cublas, "PyTorch", "cuBLAS blockwise via F.scaled_mm",
    (check_fp8_operands, check_block_scales, needs_blockwise_cublas),
    requires=needs_blockwise_cublas, origin="library"))
fp8_gemm_blockscaled.add(Impl(
    "v1", fp8_gemm_blockscaled_triton, "Triton", "block scales promoted to fp32 every K block",
    (*SOURCES, check_block_scales), device="any", requires=needs_fp8_triton))
fp8_gemm_blockscaled.add(Impl(
    "v2", fp8_gemm_blockscaled_dequant, "PyTorch", "dequantise to bf16, then cuBLAS bf16",
    (check_fp8_operands, check_block_scales), requires=needs_fp8_cuda, origin="library"))
fp8_gemm_blockscaled.add(Impl(
    "v3", fp8_gemm_blockscaled_cuda, "CUDA", "v2 of fp8_gemm with block scales at each promotion",
    (*CUDA_SOURCES, check_block_scales), requires=needs_fp8_sm90))
fp8_gemm_blockscaled.add(Impl(
    "v4", fp8_gemm_blockscaled_cuda16, "CUDA", "like v3, 16-byte stores of C, balanced grid",
    (*CUDA_SOURCES, check_block_scales), requires=needs_fp8_sm90))


__all__ = [
    "BLOCK", "BS_HEADLINE", "CEILING", "CUBIN", "CUDA_CONFIG", "CU_FILE", "CudaConfig", "HEADLINE",
    "KERNELS", "KERNELS16", "cuda_grid", "device_fp8_tensor_maps", "encode_fp8_tensor_map",
    "fp8_gemm_blockscaled_cuda", "fp8_gemm_blockscaled_cuda16", "fp8_gemm_cuda", "fp8_gemm_cuda16",
    "launch_cuda", "needs_fp8_sm90", "tma_specs",
    "check_block_scales", "check_fp8_operands",
    "check_tensor_scales", "fp8_configs", "fp8_gemm", "fp8_gemm_blockscaled",
    "fp8_gemm_blockscaled_cublas", "fp8_gemm_blockscaled_dequant", "fp8_gemm_blockscaled_ref",
    "fp8_gemm_blockscaled_triton", "fp8_gemm_cublas", "fp8_gemm_ref", "fp8_gemm_triton",
    "make_blockscaled_inputs", "make_per_tensor_inputs", "needs_blockwise_cublas",
    "needs_fp8_cuda", "needs_fp8_triton", "quantize_activation", "quantize_weight",
    "scaled_error",
]
