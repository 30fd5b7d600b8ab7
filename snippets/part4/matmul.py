"""A cuBLAS-class matrix product in Triton: grouped tile order, autotuning, a persistent TMA kernel
for Hopper, and the same kernels on fp8 (with scales) and int8 (exact int32 sums).

Versions of ``matmul`` (fp16 and bf16 inputs, fp32 sums, C in the input dtype; never renumbered):

- v0  cuBLAS through ``torch.matmul``: the baseline.
- v1  Triton, one program per 128 x 128 tile of C, programs in plain row-major order (the kernel of
      the Part 3 tensor-core chapter without its grouping, and with general strides).
- v2  like v1, with grouped order (GROUP_M = 8): programs running at the same time share tiles of A
      and B, so at 8192^3, where A and B no longer fit in L2, far fewer of them come from
      device memory.
- v3  like v2, autotuned: ``triton.autotune`` picks block sizes, warps and pipeline depth per (M, N,
      K) from a config space pruned to the device's shared memory.
- v4  like v3, persistent and fed by TMA (Hopper): one program per SM loops over the tiles of C in
      grouped order; tiles of A and B arrive through tensor descriptors (the copy engine, no address
      arithmetic in the threads); the epilogue stores C in two halves. Needs 16-byte aligned rows (K
      and N multiples of 8).

Versions of ``matmul_fp8`` (A and B in float8 e4m3 with an fp32 scale each, C = (A * sa) @ (B * sb)
in bf16):

- v0  cuBLAS through ``torch._scaled_mm`` (B column-major, as cuBLAS requires for fp8).
- v1  Triton: matmul v3's kernel, autotuned, with the two scales applied once in the epilogue.
- v2  Triton: matmul v4's persistent TMA kernel, with the scales in the epilogue.

Versions of ``matmul_int8`` (int8 A and B, exact int32 C):

- v0  cuBLAS through ``torch._int_mm`` (M > 16; K and N multiples of 8).
- v1  Triton: matmul v3's kernel with an int32 accumulator.
- v2  Triton: matmul v4's persistent TMA kernel with an int32 accumulator.

Every kernel takes A as M x K and B as K x N with any strides (fp8 and int8 inputs come with B
column-major, strides (1, K), the layout cuBLAS wants); the TMA versions need the last stride of
each operand to be 1 on one side or the other and 16-byte aligned rows. The cost is 2 * M * N * K
operations on at least (M*K + K*N) * in_bytes + M*N * out_bytes bytes.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from snippets._checks import refuse_grad, triton_device, triton_interpreting
from snippets.common.gemm import (
    GROUP_M,
    HALF_TYPES,
    INTERPRET,
    check_operands,
    check_tma,
    config_space,
    gemm_flops,
    launch_tma,
    make_operands,
    needs_hopper,
    prune_configs,
    set_block_shapes,
    tile_coords,
    tolerance_for,
    triton_half_dtypes,
)
from snippets.registry import Impl, Op, device_generator, register, register_ceiling

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3 number: 1.75 * 2^8
INT8_MAX_K = 2**17  # 2^17 products of at most 2^14 each stay below 2^31: int32 sums cannot overflow


# --8<-- [start:reference]
def matmul_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fp16/bf16: products exact in fp32, K of them summed in fp32 per output, C rounded to the
    input dtype once. 2 * M * N * K FLOPs on at least (M*K + K*N + M*N) * 2 bytes: 2730 FLOPs per
    byte at 8192^3."""
    return torch.matmul(a.float(), b.float()).to(a.dtype)


def matmul_fp8_ref(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                   scale_b: torch.Tensor) -> torch.Tensor:
    """fp8 e4m3 with per-tensor scales: A and B stand for A * scale_a and B * scale_b. The products
    of e4m3 numbers are exact in fp32 (4 + 4 significant bits), the scales are applied once to the
    fp32 sums, and C is bf16. Computed here in float64: the tests compare with this."""
    return (a.double() * scale_a.double()) @ (b.double() * scale_b.double())


def matmul_int8_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """int8: every product fits in 15 bits and the sums are exact in int32 while K <= 2^17. float64
    is exact here too (sums below 2^53), and float64 matrix products exist on every device; int64
    ones do not on CUDA."""
    return (a.double() @ b.double()).long()
# --8<-- [end:reference]


def _reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The registered reference of ``matmul``: the exact product (the tests call it in float64)."""
    return a @ b


# --------------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------------

# --8<-- [start:checks]
# check_operands and check_tma are in snippets.common.gemm; the fp8 versions add their scales.
def check_scales(scale_a: torch.Tensor, scale_b: torch.Tensor, device: torch.device) -> None:
    """Per-tensor scales: fp32 tensors of one element (0-d or shape (1,)) on the
    operands' device."""
    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(s, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(s).__name__}")
        if s.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {s.dtype}")
        if s.numel() != 1 or s.dim() > 1:
            raise ValueError(f"{name} must hold one value per tensor (shape () or (1,)), got shape "
                             f"{tuple(s.shape)}; per-row scales are not supported here")
        if s.device != device:
            raise ValueError(f"{name} is on {s.device} but the operands are on {device}")
# --8<-- [end:checks]


# --------------------------------------------------------------------------------------------------
# v1, v2, v3: one program per tile of C
# --------------------------------------------------------------------------------------------------

# The tile order, tile_coords (snippets.common.gemm), maps a program to its tile of C.

# --8<-- [start:kernel]
@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, scale_a_ptr, scale_b_ptr, M, N, K,
                   stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, INT_ACC: tl.constexpr, HAS_SCALES: tl.constexpr):
    pid_m, pid_n = tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # int64 offsets: M * K passes 2**31 at 65536 x 32768. A stride that is 1 is compiled in as a
    # constant (Triton specialises integer arguments equal to 1), so the loads stay vectorised.
    # (BLOCK_M, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :] * stride_ak
    # (BLOCK_K, BLOCK_N)
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :].to(tl.int64) * stride_bn
    if INT_ACC:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)  # int8 products summed exactly
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        # Zeros outside A and B add nothing to the sums: ragged M, N and K need no other care.
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k0), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k0) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, out_dtype=acc.dtype)  # int32 for int8 inputs, else fp32
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if HAS_SCALES:  # fp8: one multiply per element of C, not one per product
        acc = acc * (tl.load(scale_a_ptr) * tl.load(scale_b_ptr))
    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
# --8<-- [end:kernel]


# --8<-- [start:configs]
# v1 and v2: the Part 3 chapter's one config (128 x 128 x 64, 8 warps, 3 stages: 96 KB of shared
# memory); v1 in row-major order, v2 grouped by 8 block rows.
FIXED = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)
# v3 and v4 autotune over config_space (snippets.common.gemm, with GROUP_M = 8), pruned to the
# device's shared memory by prune_configs.


@functools.lru_cache(maxsize=None)
def autotuned(persistent: bool, dtype: torch.dtype):
    """v3's (or v4's) kernel wrapped in an autotuner, one per input dtype: the configs depend on the
    input width (BLOCK_K), and the autotuner's key (M, N, K and the dtypes of pointer arguments)
    cannot tell fp16 from bf16 through the TMA kernel's descriptors."""
    kernel = _matmul_tma_kernel if persistent else _matmul_kernel
    return triton.autotune(configs=config_space(dtype.itemsize, persistent), key=["M", "N", "K"],
                           prune_configs_by={"early_config_prune": prune_configs})(kernel)
# --8<-- [end:configs]


# Under the interpreter nothing is tuned: one small config, INTERPRET (snippets.common.gemm).


# --8<-- [start:launch]
def _launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: dict | None,
            scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The one launcher of v1, v2, v3: ``config`` fixes the blocks (None: autotune on a GPU)."""
    (m, k), n = a.shape, b.shape[1]
    sa, sb = scales if scales is not None else (None, None)
    args = (a, b, c, sa, sb, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1))
    flags = dict(INT_ACC=a.dtype == torch.int8, HAS_SCALES=scales is not None)
    if config is None and triton_interpreting():
        config = INTERPRET
    if config is None:
        grid = lambda meta: (  # noqa: E731
            triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)
        autotuned(False, a.dtype)[grid](*args, **flags)
    else:
        grid = (triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"]),)
        _matmul_kernel[grid](*args, **flags, **config)
    return c
# --8<-- [end:launch]


def matmul_cublas(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v0: cuBLAS through torch.matmul (fp32 sums; torch lets cuBLAS round split-K partial sums to
    the dtype, which tolerance_for allows for)."""
    check_operands(a, b, HALF_TYPES, contiguous=False)
    return torch.matmul(a, b)


def _half(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    m, n, _ = check_operands(a, b, triton_half_dtypes(), device=triton_device(), contiguous=False)
    return torch.empty((m, n), dtype=a.dtype, device=a.device)


def matmul_rowmajor(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v1: one program per 128 x 128 tile of C, tl.dot on 64-deep slices, programs in
    row-major order."""
    refuse_grad("matmul_rowmajor", a, b, instead="a @ b")
    return _launch(a, b, _half(a, b), dict(FIXED, GROUP_M=1))


def matmul_grouped(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v2: like v1, but programs are grouped by 8 block rows: the ~130 programs running at once
    share 8 tiles of A's rows and ~16 of B's columns instead of 1 and ~130, so each tile read from
    device memory serves many programs out of L2."""
    refuse_grad("matmul_grouped", a, b, instead="a @ b")
    return _launch(a, b, _half(a, b), dict(FIXED, GROUP_M=GROUP_M))


def matmul_autotuned(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v3: like v2, with the blocks, warps and stages autotuned per (M, N, K) and dtype."""
    refuse_grad("matmul_autotuned", a, b, instead="a @ b")
    return _launch(a, b, _half(a, b), None)


# --------------------------------------------------------------------------------------------------
# v4: persistent, TMA
# --------------------------------------------------------------------------------------------------

# --8<-- [start:persistent]
@triton.jit
def _matmul_tma_kernel(a_desc, b_desc, c_desc, scale_a_ptr, scale_b_ptr, M, N, K,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, B_KMAJOR: tl.constexpr,
                       INT_ACC: tl.constexpr, HAS_SCALES: tl.constexpr, FLATTEN: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    # One program per SM, each taking every NUM_SMS-th tile: no launch or ramp-up per tile, and the
    # epilogue of one tile overlaps the first loads of the next. flatten=True lets the compiler
    # pipeline the two loops as one, so those loads are issued before the stores finish.
    for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        if INT_ACC:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            # Each load is one TMA copy of a box into shared memory; boxes hanging over the edge of
            # the matrix are filled with zeros by the copy engine, so there are no masks.
            a = a_desc.load([off_m, k * BLOCK_K])        # (BLOCK_M, BLOCK_K)
            if B_KMAJOR:
                b = b_desc.load([off_n, k * BLOCK_K]).T  # stored N x K: K-major, as fp8 wgmma wants
            else:
                b = b_desc.load([k * BLOCK_K, off_n])    # (BLOCK_K, BLOCK_N)
            acc = tl.dot(a, b, acc, out_dtype=acc.dtype)
        if HAS_SCALES:
            acc = acc * (tl.load(scale_a_ptr) * tl.load(scale_b_ptr))
        # Epilogue in two halves of BLOCK_N / 2 columns: each half is converted and stored on its
        # own, so only half of C's tile is live in the output dtype at a time, and the shared-memory
        # staging tile of the TMA store is half as large. Out-of-range rows and columns of a box are
        # not written.
        halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        left, right = tl.split(halves)
        c_desc.store([off_m, off_n], left.to(c_desc.dtype))
        c_desc.store([off_m, off_n + BLOCK_N // 2], right.to(c_desc.dtype))
# --8<-- [end:persistent]


# --8<-- [start:tma_launch]
def _launch_tma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """v4 (and its fp8 and int8 forms) through the persistent TMA launcher (launch_tma of
    snippets.common.gemm): the scales, if any, are the kernel's two extra arguments."""
    sa, sb = scales if scales is not None else (None, None)
    flags = dict(INT_ACC=a.dtype == torch.int8, HAS_SCALES=scales is not None)
    return launch_tma(_matmul_tma_kernel, autotuned, a, b, c, (sa, sb), flags)
# --8<-- [end:tma_launch]


def matmul_persistent(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v4: like v3, persistent (a grid of one program per SM looping over tiles in grouped order)
    and with A, B and C moved by TMA through tensor descriptors; the epilogue is split in
    two halves."""
    refuse_grad("matmul_persistent", a, b, instead="a @ b")
    return _launch_tma(a, b, _half(a, b))


# --8<-- [start:compile_sm90]
def compile_for_hopper(dtype: torch.dtype, persistent: bool = True, num_warps: int = 8,
                       num_stages: int = 3, **blocks: int):
    """Compile v4's kernel (persistent=True) or v3's for sm_90 on any machine, GPU or not: Triton's
    compiler runs on the host, so the whole path to PTX and a cubin (wgmma, TMA copies) can be
    checked without a Hopper GPU. Inputs of ``dtype`` with the output dtype of its op; B K-major for
    8-bit inputs, as they arrive. Returns the compiled kernel (``.asm["ptx"]``,
    ``.metadata.shared``). Needs TRITON_INTERPRET unset."""
    from snippets.common.introspect import TRITON_TYPES, triton_compile

    out = {FP8: torch.bfloat16, torch.int8: torch.int32}.get(dtype, dtype)
    bm, bn, bk = (blocks.get("BLOCK_M", 128), blocks.get("BLOCK_N", 256),
                  blocks.get("BLOCK_K", 128 // dtype.itemsize))
    t_in, t_out = TRITON_TYPES[dtype], TRITON_TYPES[out]
    kmajor = dtype.itemsize == 1
    scaled = dtype == FP8
    consts = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=GROUP_M, INT_ACC=dtype == torch.int8,
                  HAS_SCALES=scaled)
    sig = {"scale_a_ptr": "*fp32" if scaled else "constexpr",
           "scale_b_ptr": "*fp32" if scaled else "constexpr", "M": "i32", "N": "i32", "K": "i32"}
    if not scaled:
        consts.update(scale_a_ptr=None, scale_b_ptr=None)
    if persistent:
        kernel = _matmul_tma_kernel
        sig = {"a_desc": f"tensordesc<{t_in}[{bm}, {bk}]>",
               "b_desc": (f"tensordesc<{t_in}[{bn}, {bk}]>" if kmajor
                          else f"tensordesc<{t_in}[{bk}, {bn}]>"),
               "c_desc": f"tensordesc<{t_out}[{bm}, {bn // 2}]>", **sig}
        consts.update(NUM_SMS=132, B_KMAJOR=kmajor, FLATTEN=True)
    else:
        kernel = _matmul_kernel
        sig = {"a_ptr": f"*{t_in}", "b_ptr": f"*{t_in}", "c_ptr": f"*{t_out}", **sig,
               **{s: "i32" for s in ("stride_am", "stride_bk", "stride_cm")}}
        consts.update(stride_ak=1, stride_bn=1, stride_cn=1)
        if kmajor:  # B column-major: its stride along K is the constant 1
            sig["stride_bn"], consts["stride_bk"] = "i32", 1
            del sig["stride_bk"], consts["stride_bn"]
    # What a launch on 16-byte aligned tensors with sizes that are multiples of 16 tells
    # the compiler.
    divisible = [n for n, t in sig.items() if n not in consts and (t[0] == "*" or t == "i32")]
    return triton_compile(kernel, sig, consts, divisible, num_warps=num_warps,
                          num_stages=num_stages)
# --8<-- [end:compile_sm90]


# --------------------------------------------------------------------------------------------------
# fp8 and int8
# --------------------------------------------------------------------------------------------------

def _check_fp8(a, b, scale_a, scale_b, device):
    m, n, k = check_operands(a, b, (FP8,), device=device, contiguous=False)
    check_scales(scale_a, scale_b, a.device)
    return m, n, k


# --8<-- [start:fp8]
def fp8_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (any float dtype) -> (x8, scale) with x ~ x8 * scale: one fp32 scale for the whole tensor
    that maps its largest magnitude to e4m3's largest finite value, 448, so the full range of the
    format is used."""
    amax = x.abs().max().float().clamp(min=1e-12)
    scale = amax / FP8_MAX
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def matmul_fp8_cublas(a, b, scale_a, scale_b):
    """v0: cuBLAS through torch._scaled_mm: A row-major, B column-major, sizes multiples of 16."""
    m, n, k = _check_fp8(a, b, scale_a, scale_b, "cuda")
    if a.stride(1) != 1 or b.stride(0) != 1:
        raise ValueError("torch._scaled_mm needs a row-major and b column-major, got strides "
                         f"{a.stride()} and {b.stride()} (b = b.t().contiguous().t() makes b "
                         "column-major)")
    if m % 16 or n % 16 or k % 16:
        raise ValueError(f"torch._scaled_mm needs M, N and K multiples of 16, got {m} x {n} x {k}")
    return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)


def matmul_fp8_triton(a, b, scale_a, scale_b):
    """v1: matmul v3's autotuned kernel on fp8 tiles: tl.dot multiplies e4m3 directly (wgmma on
    Hopper) and sums in fp32; the scales multiply each element of C once, in the epilogue."""
    refuse_grad("matmul_fp8_triton", a, b, scale_a, scale_b, instead="matmul_fp8_ref")
    m, n, _ = _check_fp8(a, b, scale_a, scale_b, triton_device())
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    return _launch(a, b, c, None, scales=(scale_a, scale_b))


def matmul_fp8_persistent(a, b, scale_a, scale_b):
    """v2: matmul v4's persistent TMA kernel on fp8, scales in the epilogue; B is read K-major
    (column-major B is B^T row-major), the layout Hopper's fp8 tensor-core instruction needs for
    both operands."""
    refuse_grad("matmul_fp8_persistent", a, b, scale_a, scale_b, instead="matmul_fp8_ref")
    m, n, _ = _check_fp8(a, b, scale_a, scale_b, triton_device())
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    return _launch_tma(a, b, c, scales=(scale_a, scale_b))
# --8<-- [end:fp8]


# --8<-- [start:int8]
def _check_int8(a, b, device):
    m, n, k = check_operands(a, b, (torch.int8,), device=device, contiguous=False)
    if k > INT8_MAX_K:
        raise ValueError(f"K = {k} > {INT8_MAX_K}: K products of up to 128 * 128 could overflow "
                         "the int32 sums")
    return m, n, k


def matmul_int8_cublas(a, b):
    """v0: cuBLAS through torch._int_mm (int32 output): M > 16, K and N multiples of 8."""
    m, n, k = _check_int8(a, b, "cuda")
    if m <= 16 or n % 8 or k % 8:
        raise ValueError(f"torch._int_mm needs M > 16 and K, N multiples of 8, got {m} x {n} x {k}")
    return torch._int_mm(a, b)


def matmul_int8_triton(a, b):
    """v1: matmul v3's autotuned kernel with an int32 accumulator: tl.dot on int8 sums exactly."""
    m, n, _ = _check_int8(a, b, triton_device())
    return _launch(a, b, torch.empty((m, n), dtype=torch.int32, device=a.device), None)


def matmul_int8_persistent(a, b):
    """v2: matmul v4's persistent TMA kernel with an int32 accumulator (B column-major: K-major for
    the int8 tensor-core instruction, as for fp8)."""
    m, n, _ = _check_int8(a, b, triton_device())
    return _launch_tma(a, b, torch.empty((m, n), dtype=torch.int32, device=a.device))
# --8<-- [end:int8]


# --------------------------------------------------------------------------------------------------
# Ceilings: cuBLAS fp8 and int8, measured like the harness's gemm_bf16
# --------------------------------------------------------------------------------------------------

def _measure_ceiling(name: str, quick: bool) -> dict:
    from snippets.bench.timing import time_device

    m = 4096 if quick else 8192
    gen = torch.Generator().manual_seed(0)
    if name == "gemm_fp8":
        args = _make_fp8_inputs({"m": m, "n": m, "k": m}, FP8, "cuda", gen)
        fn, how = (matmul_fp8_cublas,
                   f"torch._scaled_mm {m}x{m}x{m} float8_e4m3fn, per-tensor scales, bf16 out")
    else:
        args = _make_int8_inputs({"m": m, "n": m, "k": m}, torch.int8, "cuda", gen)
        fn, how = matmul_int8_cublas, f"torch._int_mm {m}x{m}x{m} int8, int32 out"
    t = time_device(fn, [args], budget_ms=400)
    return {"value": 2 * m**3 / (t.median * 1e-3) / 1e12, "unit": "TFLOP/s", "how": how}


register_ceiling("gemm_fp8", "cuBLAS fp8 (e4m3) GEMM rate, torch._scaled_mm",
                 functools.partial(_measure_ceiling, "gemm_fp8"))
register_ceiling("gemm_int8", "cuBLAS int8 GEMM rate (int32 sums), torch._int_mm",
                 functools.partial(_measure_ceiling, "gemm_int8"))


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def _column_major(x: torch.Tensor) -> torch.Tensor:
    """The same K x N matrix stored column by column (strides (1, K)): B^T is row-major."""
    return x.t().contiguous().t()


def _make_fp8_inputs(size, dtype, device, gen):
    """A (m x k) row-major and B (k x n) column-major in e4m3, each quantized from standard normal
    values with its own per-tensor scale (0-d fp32)."""
    dev_gen = device_generator(gen, device)
    a = torch.randn((size["m"], size["k"]), generator=dev_gen, device=device)
    b = torch.randn((size["k"], size["n"]), generator=dev_gen, device=device)
    (a8, sa), (b8, sb) = fp8_quantize(a), fp8_quantize(b)
    return a8, _column_major(b8), sa, sb


def _make_int8_inputs(size, dtype, device, gen):
    """A (m x k) row-major and B (k x n) column-major, uniform over all of int8 (-128 ... 127)."""
    dev_gen = device_generator(gen, device)
    a = torch.randint(-128, 128, (size["m"], size["k"]), generator=dev_gen, device=device,
                      dtype=torch.int8)
    b = torch.randint(-128, 128, (size["k"], size["n"]), generator=dev_gen, device=device,
                      dtype=torch.int8)
    return a, _column_major(b)


def _bytes(out_dtypes):
    def bytes_moved(size, dtype) -> int:
        m, n, k = size["m"], size["n"], size["k"]
        return (m * k + k * n) * dtype.itemsize + m * n * out_dtypes.get(dtype, dtype).itemsize
    return bytes_moved


# 8192^3: A, B and C are 128 MiB each in bf16, several times the 50 MB L2; 4096^3 (32 MiB each) is
# the other size of the goal. 1024 and 2048 show where cuBLAS's many kernels beat one tuned one.
HEADLINE = {"m": 8192, "n": 8192, "k": 8192}
SWEEP = [{"m": s, "n": s, "k": s} for s in (1024, 2048, 4096, 8192)]
LOW_SWEEP = [{"m": s, "n": s, "k": s} for s in (4096, 8192)]


# --8<-- [start:odd_shapes]
def odd_shapes() -> list[dict]:
    """Shapes the square sweep hides: one token and one small batch of rows against a big weight (M
    = 16, 128: few tiles of C, far fewer than SMs, and the time goes into reading B), and sizes one
    off a power of two (ragged tiles everywhere, rows not 16-byte aligned: the TMA version
    refuses them)."""
    return [{"m": 16, "n": 8192, "k": 8192}, {"m": 128, "n": 8192, "k": 8192},
            {"m": 4095, "n": 4097, "k": 4099}]
# --8<-- [end:odd_shapes]


# Every registered version runs at every test size (tests/test_ops.py): K and N multiples of 16 for
# the TMA versions (16-byte rows of 1-byte int8/fp8), M > 16 and multiples of 16 for cuBLAS fp8 and
# int8. The module's own tests cover ragged shapes for the versions that take them.
TEST_SIZES = [{"m": m, "n": n, "k": k}
              for m, n, k in ((1, 8, 8), (17, 40, 24), (64, 64, 64), (100, 136, 72))]
LOW_TEST_SIZES = [{"m": m, "n": n, "k": k}
                  for m, n, k in ((32, 16, 16), (48, 80, 96), (96, 64, 160))]
MAX_K = max(s["k"] for s in [HEADLINE, *SWEEP])

SOURCES = (_matmul_kernel, tile_coords, _launch, check_operands)
TUNED_SOURCES = (*SOURCES, config_space, prune_configs, autotuned)
TMA_SOURCES = (_matmul_tma_kernel, tile_coords, _launch_tma, launch_tma, set_block_shapes,
               config_space, prune_configs, autotuned, check_tma)

matmul = register(Op(
    name="matmul", part=4, chapter="part4/matmul.md", title="Matrix product (fp16/bf16)",
    reference=_reference, make_inputs=make_operands, bytes_moved=_bytes({}), flops=gemm_flops,
    metric="TFLOP/s", ceiling="gemm_bf16", headline=HEADLINE, sweep=SWEEP,
    dtypes=(torch.bfloat16, torch.float16), bench_dtypes=(torch.bfloat16, torch.float16),
    test_sizes=TEST_SIZES, sweep_axis="m",
    tolerances={d: tolerance_for(MAX_K, d) for d in HALF_TYPES},
    tolerance_at=lambda s, d: tolerance_for(s["k"], d)))
matmul.add(Impl("v0", matmul_cublas, "PyTorch", "cuBLAS via torch.matmul", (check_operands,)))
matmul.add(Impl("v1", matmul_rowmajor, "Triton", "128x128x64 tiles, row-major program order",
                SOURCES, device="any", dtypes=triton_half_dtypes()))
matmul.add(Impl("v2", matmul_grouped, "Triton", "like v1, grouped order (GROUP_M=8)", SOURCES,
                device="any", dtypes=triton_half_dtypes()))
matmul.add(Impl("v3", matmul_autotuned, "Triton", "like v2, autotuned blocks/warps/stages",
                TUNED_SOURCES, device="any", dtypes=triton_half_dtypes()))
matmul.add(Impl("v4", matmul_persistent, "Triton", "persistent, TMA descriptors, split epilogue",
                TMA_SOURCES, device="any", dtypes=triton_half_dtypes(), requires=needs_hopper))


def needs_fp8() -> str | None:
    """cuBLAS fp8 needs compute capability 8.9 (Ada) or 9.0 (Hopper)."""
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if torch.cuda.get_device_capability() < (8, 9):
        return ("fp8 tensor cores need compute capability 8.9+, this GPU has "
                f"{torch.cuda.get_device_capability()}")
    return None


FP8_OUT = {FP8: torch.bfloat16}
matmul_fp8 = register(Op(
    name="matmul_fp8", part=4, chapter="part4/matmul.md",
    title="Matrix product (fp8 e4m3, per-tensor scales)", reference=matmul_fp8_ref,
    make_inputs=_make_fp8_inputs, bytes_moved=_bytes(FP8_OUT), flops=gemm_flops, metric="TFLOP/s",
    ceiling="gemm_fp8", headline=HEADLINE, sweep=LOW_SWEEP, dtypes=(FP8,), bench_dtypes=(FP8,),
    test_sizes=LOW_TEST_SIZES, sweep_axis="m", output_dtypes=FP8_OUT,
    # The products and fp32 sums are (nearly) exact; what is left is C's rounding to bf16.
    tolerances={FP8: tolerance_for(MAX_K, torch.bfloat16)},
    tolerance_at=lambda s, d: tolerance_for(s["k"], torch.bfloat16)))
matmul_fp8.add(Impl("v0", matmul_fp8_cublas, "PyTorch", "cuBLAS via torch._scaled_mm",
                    (check_operands,), requires=needs_fp8))
matmul_fp8.add(Impl("v1", matmul_fp8_triton, "Triton", "matmul v3's kernel, scales in the epilogue",
                    TUNED_SOURCES, device="any"))
matmul_fp8.add(Impl("v2", matmul_fp8_persistent, "Triton",
                    "matmul v4's persistent TMA kernel, scaled", TMA_SOURCES, device="any",
                    requires=needs_hopper))

INT8_OUT = {torch.int8: torch.int32}
matmul_int8 = register(Op(
    name="matmul_int8", part=4, chapter="part4/matmul.md",
    title="Matrix product (int8, int32 sums)", reference=matmul_int8_ref,
    make_inputs=_make_int8_inputs, bytes_moved=_bytes(INT8_OUT), flops=gemm_flops, metric="TFLOP/s",
    ceiling="gemm_int8", headline=HEADLINE, sweep=LOW_SWEEP, dtypes=(torch.int8,),
    bench_dtypes=(torch.int8,), test_sizes=LOW_TEST_SIZES, sweep_axis="m", output_dtypes=INT8_OUT,
    tolerances={torch.int8: (0.0, 0.0)}))
matmul_int8.add(Impl("v0", matmul_int8_cublas, "PyTorch", "cuBLAS via torch._int_mm",
                     (check_operands,)))
matmul_int8.add(Impl("v1", matmul_int8_triton, "Triton", "matmul v3's kernel, int32 accumulator",
                     TUNED_SOURCES, device="any"))
matmul_int8.add(Impl("v2", matmul_int8_persistent, "Triton",
                     "matmul v4's persistent TMA kernel, int32", TMA_SOURCES, device="any",
                     requires=needs_hopper))

