"""The GEMM helpers of Parts 3 to 5: operand checks, the tolerance of a product against float64,
inputs and cost, the Part 3 tensor-core kernel that Part 4 tunes, the grouped tile order, the
autotuner's config space pruned to the device's shared memory, and the persistent TMA launcher of
Part 4's matmul and Part 5's epilogue.

A is M x K and B is K x N; every sum is in fp32 (int32 for int8), C is M x N.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from snippets._checks import check_tensors, triton_interpreting
from snippets.registry import device_generator

INT32_MAX = 2**31 - 1
HALF_TYPES = (torch.float16, torch.bfloat16)


# --8<-- [start:checks]
def check_operands(a: torch.Tensor, b: torch.Tensor,
                   dtypes: tuple[torch.dtype, ...] = (torch.float32,), device: str = "cuda",
                   contiguous: bool = True) -> tuple[int, int, int]:
    """A (M x K) and B (K x N): 2-D, non-empty, one dtype from ``dtypes``, one device, contiguous
    unless ``contiguous=False`` (for kernels that take the strides as arguments), sizes that fit
    the kernels' 32-bit arithmetic. Returns (M, N, K)."""
    check_tensors(("a", "b"), (a, b), dtypes=dtypes, device=device, same_shape=False,
                  contiguous=contiguous, allow_empty=False)
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


def check_tma(**tensors: torch.Tensor) -> None:
    """The Tensor Memory Accelerator copies 2-D boxes described by a base address, a row stride and
    a box shape: the base must be 16-byte aligned, one stride must be 1 (elements contiguous along a
    row) and the other, in bytes, a multiple of 16."""
    for name, t in tensors.items():
        if t.stride(1) != 1 and t.stride(0) != 1:
            raise ValueError(f"TMA needs {name} contiguous along one dimension, got strides "
                             f"{t.stride()}")
        row = t.stride(0) if t.stride(1) == 1 else t.stride(1)
        if (row * t.element_size()) % 16:
            raise ValueError(f"TMA needs 16-byte aligned rows: {name} is {t.shape[0]} x "
                             f"{t.shape[1]} {t.dtype} with rows {row * t.element_size()} bytes "
                             "apart, not a multiple of 16 (pad that dimension to a multiple of 16 "
                             "bytes, or use the pointer-based version)")
        if t.data_ptr() % 16:
            raise ValueError(f"TMA needs {name} to start on a 16-byte boundary, its data pointer "
                             f"is {t.data_ptr():#x}; call .clone() first")
# --8<-- [end:checks]


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


def triton_half_dtypes() -> tuple[torch.dtype, ...]:
    """fp16 and bf16 on a GPU; fp16 only under the CPU interpreter, which has no bf16 arithmetic
    (NumPy stores bf16 as raw 16-bit integers, and a tl.dot on them returns garbage)."""
    return (torch.float16,) if triton_interpreting() else HALF_TYPES


def make_operands(size, dtype, device, gen):
    """A (m x k) and B (k x n) of standard normal values, drawn in fp32 on the target device from a
    seed taken from ``gen`` and rounded to ``dtype`` (the reference then uses the
    rounded values)."""
    dev_gen = device_generator(gen, device)
    a = torch.randn((size["m"], size["k"]), generator=dev_gen, device=device, dtype=torch.float32)
    b = torch.randn((size["k"], size["n"]), generator=dev_gen, device=device, dtype=torch.float32)
    return a.to(dtype), b.to(dtype)


def gemm_flops(size, dtype) -> int:
    return 2 * size["m"] * size["n"] * size["k"]  # one multiply and one add per (i, j, k)


# --------------------------------------------------------------------------------------------------
# The Part 3 tensor-core kernel (wmma_gemm v4, tf32_gemm v2), which Part 4 autotunes
# --------------------------------------------------------------------------------------------------

# --8<-- [start:matmul_kernel]
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
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
# --8<-- [end:matmul_kernel]


# --------------------------------------------------------------------------------------------------
# Part 4's matmul and Part 5's epilogue: tile order, config space, the persistent TMA launcher
# --------------------------------------------------------------------------------------------------

# --8<-- [start:tile_order]
@triton.jit
def tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Which tile (row pid_m, column pid_n) of C the tile_id-th program computes."""
    if GROUP_M == 1:
        # Row-major: programs 0, 1, 2, ... walk along the first block row of C, then the second, ...
        pid_m = tile_id // num_pid_n
        pid_n = tile_id % num_pid_n
    else:
        # Grouped: programs walk down GROUP_M block rows of one block column before moving one
        # column right.
        num_pid_in_group = GROUP_M * num_pid_n
        first_pid_m = (tile_id // num_pid_in_group) * GROUP_M
        group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)  # the last group may be short
        pid_m = first_pid_m + (tile_id % num_pid_in_group) % group_size_m
        pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n
# --8<-- [end:tile_order]


# --8<-- [start:configs]
# Grouped order of v2 and later: programs walk down 8 block rows of C before moving right.
GROUP_M = 8

# The autotuned space, per input width in bytes: tile shapes from 64 x 64 (many programs: small or
# skinny problems) to 256 x 128 (the most reuse per byte loaded); K steps of 128 bytes (64 halves,
# 128 fp8/int8 values: one TMA box row and one 128-byte shared-memory swizzle); 3 or 4 stages; 4 or
# 8 warps (one or two warpgroups).
TILES = ((64, 64), (64, 128), (128, 64), (128, 128), (128, 256), (256, 128))


def config_space(in_bytes: int, persistent: bool = False) -> list[triton.Config]:
    block_k = 128 // in_bytes
    tiles = TILES if not persistent else ((128, 128), (128, 256), (256, 128))
    out = []
    for bm, bn in tiles:
        for stages in (3, 4):
            for warps in (4, 8):
                if bm * bn >= 128 * 256 and warps == 4:
                    # a 32K-element fp32 accumulator over 128 threads is 256 registers each: spills
                    continue
                kw = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=block_k, GROUP_M=GROUP_M)
                out.append(triton.Config(kw, num_warps=warps, num_stages=stages,
                                         pre_hook=set_block_shapes if persistent else None))
    return out


def smem_bytes(cfg: triton.Config, in_bytes: int, out_bytes: int, persistent: bool) -> int:
    """Shared memory a config needs: num_stages buffers of an A tile and a B tile, plus (persistent
    kernel) the staging tile of the epilogue's TMA store, half of C's tile."""
    k = cfg.kwargs
    tiles = cfg.num_stages * (k["BLOCK_M"] + k["BLOCK_N"]) * k["BLOCK_K"] * in_bytes
    return tiles + (k["BLOCK_M"] * k["BLOCK_N"] // 2 * out_bytes if persistent else 0)


# Shared memory one block may use after opting in, on compute capability 9.0 (H100, H200): 227 KiB
# (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"). Used when no GPU
# is there to ask.
SMEM_LIMIT_SM90 = 227 * 1024


@functools.lru_cache(maxsize=None)
def device_smem_limit(index: int) -> int:
    """Bytes of shared memory one program may use on this GPU (227 KB on an H100 or H200)."""
    return triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]


def prune_configs(configs, named_args, **kwargs):
    """Drop the configs whose shared memory exceeds the device's limit (they would fail
    to launch)."""
    first = named_args.get("a_ptr", named_args.get("a_desc"))
    base = getattr(first, "base", first)
    out = named_args.get("c_ptr", named_args.get("c_desc"))
    out = getattr(out, "base", out)
    persistent = "a_desc" in named_args
    limit = device_smem_limit(base.device.index or 0)
    kept = [c for c in configs
            if smem_bytes(c, base.element_size(), out.element_size(), persistent) <= limit]
    return kept or configs[:1]
# --8<-- [end:configs]


# Under the interpreter there is nothing to tune (and every config would be run): one small config,
# so that the CPU tests cover several tiles and groups even at small sizes.
INTERPRET = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, num_warps=4, num_stages=2)


# --8<-- [start:tma_launch]
def set_block_shapes(nargs: dict) -> None:
    """Autotuner pre-hook (and the fixed-config path): a host descriptor's box is part of the
    descriptor, so it must match the config about to run."""
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [bm, bk]
    nargs["b_desc"].block_shape = [bn, bk] if nargs["B_KMAJOR"] else [bk, bn]
    nargs["c_desc"].block_shape = [bm, bn // 2]


@functools.lru_cache(maxsize=None)
def num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


INTERPRET_SMS = 3  # under the interpreter: few "SMs", so each program loops over several tiles


def launch_tma(kernel, autotuned, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
               extra: tuple, flags: dict) -> torch.Tensor:
    """The one launcher of the persistent TMA kernels: ``kernel(a_desc, b_desc, c_desc, *extra, M,
    N, K, BLOCK_M, ..., NUM_SMS, B_KMAJOR, FLATTEN, **flags)``, one program per SM (at most one per
    tile). ``autotuned(True, dtype)`` is the kernel under the autotuner, used on a GPU; the
    interpreter runs one small config."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    check_tma(a=a, b=b, c=c)
    if a.stride(1) != 1:
        raise ValueError("TMA version: a must be row-major (K contiguous), got strides "
                         f"{a.stride()}")
    (m, k), n = a.shape, b.shape[1]
    b_kmajor = b.stride(0) == 1 and (b.stride(1) != 1 or n == 1)
    # Boxes are set per config by set_block_shapes; [16, 16] is only a placeholder.
    a_desc = TensorDescriptor(a, [m, k], [a.stride(0), 1], [16, 16])
    b_desc = (TensorDescriptor(b, [n, k], [b.stride(1), 1], [16, 16]) if b_kmajor
              else TensorDescriptor(b, [k, n], [b.stride(0), 1], [16, 16]))
    c_desc = TensorDescriptor(c, [m, n], [c.stride(0), 1], [16, 16])
    interp = triton_interpreting()
    sms = INTERPRET_SMS if interp else num_sms(a.device.index or 0)
    flags = dict(NUM_SMS=sms, B_KMAJOR=b_kmajor, FLATTEN=True, **flags)
    args = (a_desc, b_desc, c_desc, *extra, m, n, k)
    if interp:
        cfg = {key: v for key, v in INTERPRET.items() if key not in ("num_warps", "num_stages")}
        set_block_shapes({"a_desc": a_desc, "b_desc": b_desc, "c_desc": c_desc, **cfg, **flags})
        tiles = triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"])
        kernel[(min(sms, tiles),)](*args, **flags, **cfg)
    else:
        grid = lambda meta: (  # noqa
            min(sms, triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"])),)
        autotuned(True, a.dtype)[grid](*args, **flags)
    return c
# --8<-- [end:tma_launch]


def needs_hopper() -> str | None:
    """For ``Impl(requires=...)``: the TMA versions need sm_90 (the interpreter
    emulates descriptors)."""
    if triton_interpreting():
        return None
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if torch.cuda.get_device_capability() < (9, 0):
        return ("TMA needs compute capability 9.0 (Hopper), this GPU has "
                f"{torch.cuda.get_device_capability()}")
    return None
