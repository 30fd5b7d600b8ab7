"""W4A16: y = x @ w.T with w stored as int4 codes (two per byte) and one fp16/bf16 scale per group
of input channels, for the small M of decoding and short prefills (1 to 256 tokens at a time).

At small M a linear layer is a read of its weight: 2 * M * N * K FLOPs on N * K weights, M FLOPs
per weight byte in bf16, far below any GPU's ridge point. Four bits instead of sixteen is then a
fourfold cut in the bytes that set the time. The kernel reads the packed bytes and the scales,
dequantises in registers inside its K loop, and feeds the tensor cores fp16/bf16 tiles with fp32
sums; the full-precision weight never exists in memory.

Versions of ``int4_gemm`` (never renumbered):

- v0  cuBLAS through ``torch.matmul`` on the fp16/bf16 weight the codes stand for: the
      uncompressed layer, the bandwidth comparison the chapter's goal judges against.
- v1  Triton: one program per BLOCK_M x BLOCK_N tile of y, the packed codes and group scales
      loaded and dequantised in registers for every BLOCK_K slice of K, fp32 sums.
- v2  like v1, with split-K: at M <= 64 there are only N / BLOCK_N tiles (128 at N = 8192 with
      64-wide tiles), fewer than twice the SMs of an H100, so K is cut into SPLIT_K ranges too;
      each program writes an fp32 partial sum and one deterministic sum over the splits follows.
- v3  PyTorch, dequantise then matmul: the weight is rebuilt in memory (a write and a read of N * K
      half-precision values) and then multiplied; the naive way to run a quantised checkpoint.
- v4  Triton, a GEMV for M <= 8 on CUDA cores, no tl.dot: v2's compiled code at M = 1 reads the
      packed weight one byte per load instruction and moves it through shared memory into the
      tensor cores' operand layout at every K step, with 15 of the MMA's 16 rows padding. v4's
      program owns 128 rows of the weight and one range of K; a thread loads 16 bytes of a row
      (32 codes) at once as int32 words, turns each code into a float with an AND-OR into the
      mantissa of a power of two and one subtraction, and multiplies by x, loaded straight into
      the same register layout; every row of x reuses the dequantised weight. Split-K as in v2,
      the fp32 partials summed in a fixed order by a second small kernel. More rows than 8, or K
      not a multiple of 8: v2.
- v5  Triton, tensor cores for M <= 64 with the weight as the first operand (y^T = W x^T): on
      Hopper wgmma reads that operand from registers, so the codes, copied asynchronously to
      shared memory as packed words and read back 16 bytes at a time, are dequantised in
      registers and multiplied there, no layout conversion between; the tile is relabelled (a
      reshape and a permute of rows and k, no data moved) into the layout wgmma wants, and x and
      y are indexed with the same permutation. G a multiple of 128; otherwise v2.
- v6  like v5, for M <= 256: 128 weight rows per program (two warpgroups, each relabelled 64-row
      half one warpgroup's wgmma rows), so x is re-read by half as many programs; x loaded as a
      (BLOCK_M, 128) tile in its own k order (16-byte asynchronous copies) and relabelled on chip
      (a reshape and a permute in registers, one shared-memory round trip) instead of gathered
      4 bytes at a time in the permuted order; a third grid axis over blocks of 128 rows of x;
      split-K only while the programs fit the SMs. G a multiple of 128, M <= 256; otherwise v2.
- v7  v6's kernel with 64 weight rows a program on one warpgroup (block_n=64, 4 warps): two
      programs share an SM, so one's dequantisation and loads overlap the other's, and the K
      split counts two programs an SM. Same limits as v6.
- v8  v7 with x relabelled once per call (relabel_x, a copy of x in the weight's relabelled k
      order) instead of on chip by every program: the kernel's x tile goes from its asynchronous
      copy straight to wgmma, transposed. Same limits as v6.

Layout: x (M, K) fp16/bf16 (fp32 is accepted for tests under the interpreter), packed (N, K / 2)
uint8 (byte j of row n holds the codes of k = 2j in its low nibble and 2j + 1 in its high one, as
``snippets.part8.quant.pack_int4`` writes), scales (N, K / G) in x's dtype, zeros (N, K / G)
uint8 codes or None (symmetric: the implicit zero 8). y (M, N) in x's dtype.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from snippets import cuda
from snippets._checks import refuse_grad, triton_device, triton_interpreting
from snippets.common.gemm import INTERPRET_SMS, gemm_flops, num_sms, tolerance_for
from snippets.part8.quant import dequantize_int4, pack_int4, rtn_int4, unpack_int4
from snippets.registry import Impl, Op, device_generator, register

ACT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# --8<-- [start:reference]
def int4_gemm_ref(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                  zeros: torch.Tensor | None = None) -> torch.Tensor:
    """Dequantise, then multiply: y = x @ ((q - z) * s).T in the scales' dtype (float64 when the
    tests upcast). Bytes: N*K/2 codes + N*K/G scales (and zeros) + M*K + M*N activations; FLOPs
    2*M*N*K, so M FLOPs per weight byte at int4: bandwidth-bound for any M of decoding."""
    w = dequantize_int4(unpack_int4(packed), scales, zeros)
    return x.to(w.dtype) @ w.T
# --8<-- [end:reference]


# --------------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------------

# --8<-- [start:checks]
def check_int4_gemm(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                    zeros: torch.Tensor | None, fn: str = "int4_gemm") -> tuple[int, int, int, int]:
    """(M, N, K, group size), or a TypeError/ValueError naming the bad argument, before any
    launch: dtypes, devices, 2-D contiguous operands, packed (N, K / 2), scales (N, K / G) with G
    even and dividing K, zeros like scales."""
    device = triton_device()
    tensors = dict(x=x, packed=packed, scales=scales) | ({} if zeros is None else dict(zeros=zeros))
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != device:
            raise ValueError(f"{fn}: {name} must be on a {device} device, got {t.device}")
        if t.dim() != 2:
            raise ValueError(f"{fn}: {name} must be 2-D, got shape {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"{fn}: {name} must be contiguous, got strides {t.stride()}; "
                             "call .contiguous() first")
        if t.device != x.device:
            raise ValueError(f"{fn}: {name} is on {t.device} but x is on {x.device}")
    dtypes = ACT_DTYPES if not triton_interpreting() else (torch.float16, torch.float32)
    if x.dtype not in dtypes:
        raise TypeError(f"{fn}: x has dtype {x.dtype}; supported here: {dtypes} (the CPU "
                        "interpreter has no bf16 arithmetic)")
    if scales.dtype != x.dtype:
        raise TypeError(f"{fn}: scales must have x's dtype {x.dtype}, got {scales.dtype}")
    for name, t in (("packed", packed), ("zeros", zeros)):
        if t is not None and t.dtype != torch.uint8:
            raise TypeError(f"{fn}: {name} must be uint8 (int4 codes), got {t.dtype}")
    (m, k), n = x.shape, packed.shape[0]
    if packed.shape[1] * 2 != k:
        raise ValueError(f"{fn}: packed must be (N, K / 2) = (N, {k / 2:g}) for x of shape "
                         f"{tuple(x.shape)}, got {tuple(packed.shape)}")
    groups = scales.shape[1]
    if scales.shape[0] != n or groups == 0 or k % groups:
        raise ValueError(f"{fn}: scales must be (N, K / G) = ({n}, K / G) with G dividing K = {k},"
                         f" got {tuple(scales.shape)}")
    g = k // groups
    if g % 2:
        raise ValueError(f"{fn}: the group size K / {groups} = {g} must be even (a byte's two "
                         "codes share one scale)")
    if zeros is not None and zeros.shape != scales.shape:
        raise ValueError(f"{fn}: zeros must have the scales' shape {tuple(scales.shape)}, got "
                         f"{tuple(zeros.shape)}")
    if n == 0 or k == 0:
        raise ValueError(f"{fn}: empty weight, N = {n}, K = {k}")
    return m, n, k, g
# --8<-- [end:checks]


# --------------------------------------------------------------------------------------------------
# v1, v2: the kernel
# --------------------------------------------------------------------------------------------------

# --8<-- [start:kernel]
@triton.jit
def _int4_gemm_kernel(x_ptr, w_ptr, s_ptr, z_ptr, y_ptr, M, N, K, K_PER_SPLIT,
                      stride_xm, stride_wn, stride_sn, stride_ys, stride_ym,
                      GROUP_SIZE: tl.constexpr, HAS_ZEROS: tl.constexpr, SCALE_AFTER: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    tl.static_assert(BLOCK_K % 32 == 0)  # BLOCK_K / 2 codes per dot: tl.dot needs K >= 16
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_p = tl.arange(0, BLOCK_K // 2)  # byte p of a slice: k = 2p (low nibble), 2p + 1 (high)
    m_ok, n_ok = offs_m < M, offs_n < N
    k_lo = pid_k * K_PER_SPLIT  # this program's range of K (all of it without split-K)
    k_hi = tl.minimum(K, k_lo + K_PER_SPLIT)
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm  # (BLOCK_M, 1)
    w_cols = w_ptr + offs_n[None, :].to(tl.int64) * stride_wn  # (1, BLOCK_N)
    s_cols = s_ptr + offs_n[None, :].to(tl.int64) * stride_sn  # (1, BLOCK_N); zeros: same layout
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        # byte indices along a weight row: contiguous, so each row's BLOCK_K / 2 bytes are one
        # vectorised load (k0 is a multiple of BLOCK_K, hence even)
        byte = tl.max_contiguous(tl.multiple_of(k0 // 2 + offs_p, BLOCK_K // 2), BLOCK_K // 2)
        k_even = 2 * byte  # (BLOCK_K / 2,); K is even, so k_even < k_hi covers k_even + 1
        k_ok = k_even < k_hi
        # x's even and odd columns: the two halves of K that the low and high nibbles hold
        x_mask = m_ok[:, None] & k_ok[None, :]
        x_even = tl.load(x_rows + k_even[None, :], mask=x_mask, other=0.0)  # (BLOCK_M, BLOCK_K/2)
        x_odd = tl.load(x_rows + k_even[None, :] + 1, mask=x_mask, other=0.0)
        w_mask = k_ok[:, None] & n_ok[None, :]
        packed = tl.load(w_cols + byte[:, None], mask=w_mask, other=0)  # (BLOCK_K / 2, BLOCK_N)
        lo = (packed & 0xF).to(tl.int32)  # codes 0..15 of k = 2p and 2p + 1
        hi = (packed >> 4).to(tl.int32)
        if SCALE_AFTER:
            # the slice lies in one group: one scale (and zero) per column, (1, BLOCK_N). The dot
            # takes the integers q - z (exact in fp16/bf16) and the scale multiplies its fp32
            # result: BLOCK_M x BLOCK_N multiplies per slice instead of one per weight
            group = k0 // GROUP_SIZE
            scale = tl.load(s_cols + group, mask=n_ok[None, :], other=0.0).to(tl.float32)
            if HAS_ZEROS:
                zero = tl.load(z_ptr + offs_n[None, :].to(tl.int64) * stride_sn + group,
                               mask=n_ok[None, :], other=0).to(tl.int32)
            else:
                zero = 8  # symmetric codes: 0..15 stand for -8..7
            part = tl.dot(x_even, (lo - zero).to(x_even.dtype))
            part = tl.dot(x_odd, (hi - zero).to(x_even.dtype), part)
            acc += part * scale
        else:
            # a slice spans several groups: a scale per element, by group index (both codes of
            # a byte are in one group, G being even)
            group = (k_even // GROUP_SIZE)[:, None]
            scale = tl.load(s_cols + group, mask=w_mask, other=0.0).to(tl.float32)
            if HAS_ZEROS:
                zero = tl.load(z_ptr + offs_n[None, :].to(tl.int64) * stride_sn + group,
                               mask=w_mask, other=0).to(tl.int32)
            else:
                zero = 8
            # dequantise in registers: (code - zero) * scale, exact in fp32, rounded once
            w_lo = ((lo - zero).to(tl.float32) * scale).to(x_even.dtype)
            w_hi = ((hi - zero).to(tl.float32) * scale).to(x_even.dtype)
            acc = tl.dot(x_even, w_lo, acc)  # (BLOCK_M, BLOCK_K/2) x (BLOCK_K/2, BLOCK_N)
            acc = tl.dot(x_odd, w_hi, acc)
    # without split-K y is the output (x's dtype); with it, this split's fp32 slice of a workspace
    y_ptrs = y_ptr + pid_k * stride_ys + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])
# --8<-- [end:kernel]


# --8<-- [start:config]
def launch_config(m: int, n: int, k: int, g: int) -> dict:
    """Blocks and warps for one (M, N, K) and group size G. BLOCK_M is the smallest tile tl.dot
    takes (16) that holds M up to 64: padding rows costs tensor-core work, which is free here, not
    bytes. BLOCK_K is the largest of 256, 128, 64, 32 codes that divides G, so that a slice lies in
    one group and the scale is applied after the dot (SCALE_AFTER); 4 stages keep 3 slices in
    flight, the latency hiding a read-bound kernel lives on. Under the interpreter: 64-deep slices
    whatever G, so that the tests run both paths and cross tile edges in every direction."""
    if triton_interpreting():
        return dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, num_warps=4, num_stages=1)
    block_m = min(64, max(16, triton.next_power_of_2(m)))
    block_k = next((b for b in (256, 128, 64, 32) if g % b == 0), 128)
    return dict(BLOCK_M=block_m, BLOCK_N=128 if m > 4 and m <= 16 else 64, BLOCK_K=block_k,
                num_warps=4, num_stages=4)


def auto_split_k(m: int, n: int, k: int, config: dict) -> int:
    """The number of K ranges for v2: double it while the grid is under two programs per SM and
    each range keeps at least two BLOCK_K steps (a power of two, at least 1)."""
    sms = INTERPRET_SMS if triton_interpreting() else num_sms(torch.cuda.current_device())
    tiles = triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"])
    steps = triton.cdiv(k, config["BLOCK_K"])
    split = 1
    while tiles * split < 2 * sms and steps >= 4 * split:
        split *= 2
    return split
# --8<-- [end:config]


# --8<-- [start:launch]
def int4_gemm(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
              zeros: torch.Tensor | None = None, split_k: int | None = 1) -> torch.Tensor:
    """y = x @ dequantised(w).T with the dequantisation in registers. ``split_k``: 1 (v1), an int
    > 1, or None (v2's choice, ``auto_split_k``)."""
    m, n, k, g = check_int4_gemm(x, packed, scales, zeros)
    refuse_grad("int4_gemm", x, scales, instead="int4_gemm_ref")
    if split_k is not None and (isinstance(split_k, bool) or not isinstance(split_k, int)
                                or split_k < 1):
        raise ValueError(f"int4_gemm: split_k must be an int >= 1 or None, got {split_k!r}")
    config = launch_config(m, n, k, g)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    split = auto_split_k(m, n, k, config) if split_k is None else split_k
    # each range is a whole number of BLOCK_K steps; a range past K (when split does not divide
    # the steps evenly) writes a zero partial sum
    k_per_split = triton.cdiv(triton.cdiv(k, config["BLOCK_K"]), split) * config["BLOCK_K"]
    out = y if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n, config["BLOCK_N"]), triton.cdiv(m, config["BLOCK_M"]), split)
    _int4_gemm_kernel[grid](
        x, packed, scales, zeros if zeros is not None else scales, out, m, n, k, k_per_split,
        x.stride(0), packed.stride(0), scales.stride(0), out.stride(0) if split > 1 else 0,
        out.stride(-2), GROUP_SIZE=g, HAS_ZEROS=zeros is not None,
        SCALE_AFTER=g % config["BLOCK_K"] == 0, **config)
    if split > 1:
        y.copy_(out.sum(dim=0))  # one sum in a fixed order: deterministic, unlike atomic adds
    return y
# --8<-- [end:launch]


# --------------------------------------------------------------------------------------------------
# v4: a GEMV for M <= 8, no tensor cores
# --------------------------------------------------------------------------------------------------

GEMV_MAX_M = 8  # past this many rows of x the FMAs, not the bytes, set the time (the model)


# --8<-- [start:gemv_unpack]
@triton.jit
def _nibble(words, J: tl.constexpr, offset):
    """Code J (0..7) of every int32 word, minus ``offset``, as float32, with no integer-to-float
    conversion (a slow instruction on a GPU): the code, in bits 4i..4i+3 of a half-word (i = J mod
    4), is ORed into the mantissa of the float 2^(23 - 4i), whose lowest mantissa bit is worth
    2^-4i, so that bit 4i is worth 1 and the float is 2^(23 - 4i) + code, exactly; one subtraction
    leaves the code. An AND-OR and a subtraction per code, a shift per four."""
    half = words if J < 4 else words >> 16
    bits = (half & (0xF << (4 * (J % 4)))) | ((127 + 23 - 4 * (J % 4)) << 23)
    return bits.to(tl.float32, bitcast=True) - ((1 << (23 - 4 * (J % 4))) + offset)


@triton.jit
def _unpack_words(words, offset):
    """(ROWS, W) int32 words -> (ROWS, 8 W) float32 codes minus ``offset``, in k order. Word w of
    a row holds k = 8w .. 8w + 7 (little-endian bytes, low nibble first), and the joins are nested
    so that the flattened index 4a + 2b + c of (a, b, c) is the code's position in its word."""
    ev = tl.join(tl.join(_nibble(words, 0, offset), _nibble(words, 4, offset)),
                 tl.join(_nibble(words, 2, offset), _nibble(words, 6, offset)))
    od = tl.join(tl.join(_nibble(words, 1, offset), _nibble(words, 5, offset)),
                 tl.join(_nibble(words, 3, offset), _nibble(words, 7, offset)))
    return tl.reshape(tl.join(ev, od), (words.shape[0], 8 * words.shape[1]))
# --8<-- [end:gemv_unpack]


# --8<-- [start:gemv_kernel]
@triton.jit
def _gemv_step(acc, x_ptr, stride_xm, M, w_rows, s_rows, z_rows, k0, k_hi,
               GROUP_SIZE: tl.constexpr, HAS_ZEROS: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_K: tl.constexpr, MASKED: tl.constexpr):
    """One BLOCK_K slice of K for BLOCK_N weight rows and every row of x: acc (BLOCK_N, BLOCK_M)."""
    # words along a row are contiguous from a multiple of BLOCK_K / 8: vector loads (16 bytes when
    # a thread holds 4 words or more of a row)
    word = tl.max_contiguous(tl.multiple_of(k0 // 8 + tl.arange(0, BLOCK_K // 8), BLOCK_K // 8),
                             BLOCK_K // 8)
    kk = tl.max_contiguous(tl.multiple_of(k0 + tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
    if MASKED:  # the last, partial slice of the range: K is a multiple of 8, so whole words
        words = tl.load(w_rows + word[None, :], mask=(8 * word < k_hi)[None, :], other=0)
    else:  # rows past N were clamped to N - 1 by the caller: no mask at all
        words = tl.load(w_rows + word[None, :])                        # (BLOCK_N, WORDS)
    if GROUP_SIZE % BLOCK_K == 0:
        # one group per slice: one scale (and zero) per row; the codes minus the zero are exact
        # small integers, the sum over the slice is scaled once
        group = k0 // GROUP_SIZE
        scale = tl.load(s_rows + group).to(tl.float32)                  # (BLOCK_N, 1)
        if HAS_ZEROS:
            zero = tl.load(z_rows + group).to(tl.float32)
        else:
            zero = 8.0  # symmetric codes: 0..15 stand for -8..7
        w = _unpack_words(words, zero)                                  # (BLOCK_N, BLOCK_K)
    else:
        # a slice spans several groups: scale (and zero) per element, by group index
        group = (kk // GROUP_SIZE)[None, :]
        # every position of the last slice reads a scale: those past the range read group 0
        group = tl.where((kk < k_hi)[None, :], group, 0) if MASKED else group
        if HAS_ZEROS:
            zero = tl.load(z_rows + group).to(tl.float32)
        else:
            zero = 8.0
        w = (_unpack_words(words, 0.0) - zero) * tl.load(s_rows + group).to(tl.float32)
        scale = 1.0
    cols = tl.arange(0, BLOCK_M)[None, :]
    for m in tl.static_range(BLOCK_M):
        # row m of x, loaded straight into the layout of w's columns (every row of the tile
        # multiplies the same slice of x); rows past M re-read row M - 1 and are never stored
        if MASKED:
            xm = tl.load(x_ptr + tl.minimum(m, M - 1) * stride_xm + kk, mask=kk < k_hi, other=0.0)
        else:
            xm = tl.load(x_ptr + tl.minimum(m, M - 1) * stride_xm + kk)
        part = tl.sum(w * xm.to(tl.float32)[None, :], axis=1)[:, None] * scale  # (BLOCK_N, 1)
        acc = tl.where(cols == m, acc + part, acc)
    return acc


@triton.jit
def _int4_gemv_kernel(x_ptr, w_ptr, s_ptr, z_ptr, y_ptr, M, N, K, K_PER_SPLIT,
                      stride_xm, stride_wn, stride_sn, stride_ys, stride_ym,
                      GROUP_SIZE: tl.constexpr, HAS_ZEROS: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y[:, n] for BLOCK_N rows n of the weight over one range of K. w_ptr: the packed codes as
    int32 words (8 codes each), stride_wn in words."""
    tl.static_assert(BLOCK_K % 8 == 0)  # whole int32 words of codes per row
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(offs_n, N - 1)[:, None].to(tl.int64)  # clamped: loads need no row mask
    w_rows = w_ptr + rows * stride_wn                        # (BLOCK_N, 1)
    s_rows = s_ptr + rows * stride_sn                        # zeros: the same layout
    z_rows = z_ptr + rows * stride_sn
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(K, k_lo + K_PER_SPLIT)
    k_full = k_lo + (k_hi - k_lo) // BLOCK_K * BLOCK_K  # the whole slices of the range
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_lo, k_full, BLOCK_K):
        acc = _gemv_step(acc, x_ptr, stride_xm, M, w_rows, s_rows, z_rows, k0, k_hi,
                         GROUP_SIZE, HAS_ZEROS, BLOCK_M, BLOCK_K, False)
    if k_full < k_hi:
        acc = _gemv_step(acc, x_ptr, stride_xm, M, w_rows, s_rows, z_rows, k_full, k_hi,
                         GROUP_SIZE, HAS_ZEROS, BLOCK_M, BLOCK_K, True)
    offs_m = tl.arange(0, BLOCK_M)[None, :]
    y_ptrs = y_ptr + pid_k * stride_ys + offs_m.to(tl.int64) * stride_ym + offs_n[:, None]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(offs_m < M) & (offs_n[:, None] < N))


@triton.jit
def _sum_splits_kernel(part_ptr, y_ptr, SPLITS, MN, BLOCK: tl.constexpr):
    """y = the sum of the SPLITS fp32 partial results, in split order (deterministic), rounded
    once to y's dtype: one launch instead of a sum and a copy."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLITS):
        total += tl.load(part_ptr + s * MN + offs, mask=ok, other=0.0)
    tl.store(y_ptr + offs, total.to(y_ptr.dtype.element_ty), mask=ok)
# --8<-- [end:gemv_kernel]


# --8<-- [start:gemv_config]
def gemv_config(m: int, n: int, k: int, g: int) -> dict:
    """v4's blocks. BLOCK_K is the largest of 128, 64, 32, 16, 8 codes that divides G, so that a
    slice lies in one group (the scale-once path); for G not a multiple of 8 (a word of codes would
    straddle two groups) 32, with a scale per element. A thread loads up to 16 bytes (32 codes) of
    a row per slice, BLOCK_K / 32 threads share a row and the rest of the 256 stack rows: BLOCK_N
    is at least the rows one pass of the threads covers (no thread idle or duplicated), two per
    thread at BLOCK_K = 128. x's slice, BLOCK_K values, is then smaller than the program's thread
    count, and the compiler loads it straight into the layout the product needs instead of
    converting it through shared memory (checked in the tests). Under the interpreter: 64-deep
    slices and 16 rows, so that small tests cross slice and row edges and run both scale paths."""
    if triton_interpreting():
        return dict(BLOCK_N=16, BLOCK_K=64, num_warps=4)
    return gemv_gpu_config(g)


def gemv_gpu_config(g: int) -> dict:
    """gemv_config's choice on a GPU (also what the compile tests build on a CPU)."""
    block_k = next((b for b in (128, 64, 32, 16, 8) if g % b == 0), 32)
    return dict(BLOCK_N=128 if block_k >= 64 else 256, BLOCK_K=block_k, num_warps=8)


def gemv_split_k(n: int, k: int, config: dict) -> int:
    """K ranges for v4: double until there are four programs per SM (so that an SM has other
    programs' loads in flight while one computes), keeping at least two slices per range."""
    sms = INTERPRET_SMS if triton_interpreting() else num_sms(torch.cuda.current_device())
    tiles = triton.cdiv(n, config["BLOCK_N"])
    steps = triton.cdiv(k, config["BLOCK_K"])
    split = 1
    while tiles * split < 4 * sms and steps >= 4 * split:
        split *= 2
    return split
# --8<-- [end:gemv_config]


# --8<-- [start:gemv_launch]
def int4_gemv(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
              zeros: torch.Tensor | None = None, split_k: int | None = None) -> torch.Tensor:
    """v4: y = x @ dequantised(w).T for M <= 8 rows of x, on CUDA cores (no tl.dot). The weight is
    read once for all M rows, as int32 words of 8 codes: K must be a multiple of 8 (it is whenever
    G is). ``split_k``: an int >= 1 or None (``gemv_split_k``'s choice)."""
    m, n, k, g = check_int4_gemm(x, packed, scales, zeros, fn="int4_gemv")
    refuse_grad("int4_gemv", x, scales, instead="int4_gemm_ref")
    if m > GEMV_MAX_M:
        raise ValueError(f"int4_gemv: M = {m} rows of x; the GEMV takes M <= {GEMV_MAX_M} (use "
                         "int4_gemm, the tensor-core kernel, for more)")
    if k % 8:
        raise ValueError(f"int4_gemv: K = {k} must be a multiple of 8 (rows of int32 words of 8 "
                         "codes); use int4_gemm")
    if packed.storage_offset() % 4:
        raise ValueError("int4_gemv: packed must start on a 4-byte boundary (it is read as int32 "
                         f"words); got storage offset {packed.storage_offset()}")
    if split_k is not None and (isinstance(split_k, bool) or not isinstance(split_k, int)
                                or split_k < 1):
        raise ValueError(f"int4_gemv: split_k must be an int >= 1 or None, got {split_k!r}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    config = gemv_config(m, n, k, g)
    split = gemv_split_k(n, k, config) if split_k is None else split_k
    k_per_split = triton.cdiv(triton.cdiv(k, config["BLOCK_K"]), split) * config["BLOCK_K"]
    out = y if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    words = packed.view(torch.int32)  # (N, K / 8): byte 4w + i of a row is byte i of word w
    grid = (triton.cdiv(n, config["BLOCK_N"]), split)
    _int4_gemv_kernel[grid](
        x, words, scales, zeros if zeros is not None else packed, out, m, n, k, k_per_split,
        x.stride(0), words.stride(0), scales.stride(0), out.stride(0) if split > 1 else 0,
        out.stride(-2), GROUP_SIZE=g, HAS_ZEROS=zeros is not None,
        BLOCK_M=triton.next_power_of_2(m), **config)
    if split > 1:
        block = 1024
        _sum_splits_kernel[(triton.cdiv(m * n, block),)](out, y, split, m * n, BLOCK=block)
    return y
# --8<-- [end:gemv_launch]


# --------------------------------------------------------------------------------------------------
# v5: tensor cores for 16 to 64 rows, the weight as the register operand
# --------------------------------------------------------------------------------------------------

TC_BLOCK_N, TC_BLOCK_K = 64, 128  # one warpgroup's wgmma rows; the slice the relabelling is for


# --8<-- [start:tc_kernel]
@triton.jit
def _relabel_rows(r):
    """The weight row that row r of v5's dot holds: r = 16 b + 8 c + a (a < 8, b < 4, c < 2) holds
    row 32 c + 8 b + a of its 64 (the inverse of the reshape-permute in _int4_tc_kernel)."""
    return 32 * ((r // 8) % 2) + 8 * (r // 16) + r % 8


@triton.jit
def _relabel_ks(k):
    """The k (within a 128-deep slice) that column k of v5's dot holds: k = 8 b + 2 a + c (c < 2,
    a < 4, b < 16) holds 32 a + 2 b + c."""
    return 32 * ((k // 2) % 4) + 2 * (k // 8) + k % 2


@triton.jit
def _int4_tc_kernel(x_ptr, w_ptr, s_ptr, z_ptr, y_ptr, M, N, K, K_PER_SPLIT,
                    stride_xm, stride_wn, stride_sn, stride_ys, stride_ym,
                    GROUP_SIZE: tl.constexpr, HAS_ZEROS: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y^T = W x^T: the dequantised weight tile is the dot's first operand, which Hopper's wgmma
    reads from registers, and x^T (small) the second, from shared memory. The weight tile is
    relabelled (rows and k permuted, a reshape and a permute: no data moves) so that the layout
    in which the words were loaded and unpacked is the one wgmma wants for its register operand;
    x^T is loaded with the same k permutation and y stored with the row one, so the products
    pair the same weights and activations. 64 x 128 slices, G a multiple of 128."""
    tl.static_assert(BLOCK_N == 64 and BLOCK_K == 128)  # the sizes the relabelling is for
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)              # rows as loaded
    rows = tl.minimum(offs_n, N - 1)[:, None].to(tl.int64)
    dot_n = pid_n * BLOCK_N + _relabel_rows(tl.arange(0, BLOCK_N))  # rows as the dot holds them
    dot_rows = tl.minimum(dot_n, N - 1)[:, None].to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    xt_cols = x_ptr + tl.minimum(offs_m, M - 1)[None, :] * stride_xm  # (1, BLOCK_M)
    ks = _relabel_ks(tl.arange(0, BLOCK_K))[:, None]                  # (BLOCK_K, 1)
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(K, k_lo + K_PER_SPLIT)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        word = tl.max_contiguous(tl.multiple_of(k0 // 8 + tl.arange(0, BLOCK_K // 8),
                                                BLOCK_K // 8), BLOCK_K // 8)
        words = tl.load(w_ptr + rows * stride_wn + word[None, :])       # (64, 16)
        group = k0 // GROUP_SIZE
        if HAS_ZEROS:
            zero = tl.load(z_ptr + rows * stride_sn + group).to(tl.float32)
        else:
            zero = 8.0
        w = _unpack_words(words, zero).to(x_ptr.dtype.element_ty)      # (64, 128), q - z exact
        # rows 32 c + 8 b + a -> 16 b + 8 c + a; k 32 a + 2 b + c -> 8 b + 2 a + c
        w = tl.reshape(tl.permute(tl.reshape(w, (2, 4, 8, 4, 16, 2)), (1, 0, 2, 4, 3, 5)),
                       (BLOCK_N, BLOCK_K))
        xt = tl.load(xt_cols + k0 + ks)                                 # (128, BLOCK_M)
        scale = tl.load(s_ptr + dot_rows * stride_sn + group).to(tl.float32)
        acc += tl.dot(w, xt) * scale                                    # fp32 sums, scaled once
    y_ptrs = y_ptr + pid_k * stride_ys + offs_m[None, :].to(tl.int64) * stride_ym + dot_n[:, None]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty),
             mask=(offs_m[None, :] < M) & (dot_n[:, None] < N))
# --8<-- [end:tc_kernel]


# --8<-- [start:tc_launch]
def check_tc_call(fn: str, version: str, max_m: int, x, packed, scales, zeros, split_k):
    """The checks of the tensor-core launchers (v5, v6) beyond :func:`check_int4_gemm`: M within
    the version's limit, G a multiple of the 128-deep slice, packed on a 4-byte boundary (read as
    int32 words), ``split_k`` an int >= 1 or None, and no input that autograd tracks. Returns
    (M, N, K, G)."""
    m, n, k, g = check_int4_gemm(x, packed, scales, zeros, fn=fn)
    refuse_grad(fn, x, scales, instead="int4_gemm_ref")
    if m > max_m:
        raise ValueError(f"{fn}: M = {m} rows of x; {version} takes M <= {max_m} (use int4_gemm)")
    if g % TC_BLOCK_K:
        raise ValueError(f"{fn}: the group size {g} must be a multiple of {TC_BLOCK_K} (one "
                         "scale per row and slice); use int4_gemm")
    if packed.storage_offset() % 4:
        raise ValueError(f"{fn}: packed must start on a 4-byte boundary (it is read as int32 "
                         f"words); got storage offset {packed.storage_offset()}")
    if split_k is not None and (isinstance(split_k, bool) or not isinstance(split_k, int)
                                or split_k < 1):
        raise ValueError(f"{fn}: split_k must be an int >= 1 or None, got {split_k!r}")
    return m, n, k, g


def int4_tc(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
            zeros: torch.Tensor | None = None, split_k: int | None = None) -> torch.Tensor:
    """v5: y = x @ dequantised(w).T for M <= 64 on the tensor cores, the dequantised weight in
    registers as the MMA's first operand (y^T = W x^T). G and K multiples of 128. ``split_k``: an
    int >= 1 or None (two programs per SM at least, each range whole 128-deep slices)."""
    m, n, k, g = check_tc_call("int4_tc", "v5", 64, x, packed, scales, zeros, split_k)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    steps = k // TC_BLOCK_K
    if split_k is None:
        sms = INTERPRET_SMS if triton_interpreting() else num_sms(torch.cuda.current_device())
        split = 1
        while triton.cdiv(n, TC_BLOCK_N) * split < 2 * sms and steps >= 4 * split:
            split *= 2
    else:
        split = split_k
    k_per_split = triton.cdiv(steps, split) * TC_BLOCK_K
    out = y if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    words = packed.view(torch.int32)
    _int4_tc_kernel[(triton.cdiv(n, TC_BLOCK_N), split)](
        x, words, scales, zeros if zeros is not None else packed, out, m, n, k, k_per_split,
        x.stride(0), words.stride(0), scales.stride(0), out.stride(0) if split > 1 else 0,
        out.stride(-2), GROUP_SIZE=g, HAS_ZEROS=zeros is not None,
        BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=TC_BLOCK_N, BLOCK_K=TC_BLOCK_K,
        num_warps=4, num_stages=3)
    if split > 1:
        block = 1024
        _sum_splits_kernel[(triton.cdiv(m * n, block),)](out, y, split, m * n, BLOCK=block)
    return y
# --8<-- [end:tc_launch]


# --------------------------------------------------------------------------------------------------
# v6: tensor cores up to 256 rows of x, 128 weight rows per program, x loaded in k order
# --------------------------------------------------------------------------------------------------

WIDE_MAX_M = 256  # past this the layer is a plain GEMM, compute-bound: v2 (or cuBLAS) takes it


def _int_in(value, allowed) -> bool:
    """``value`` is an int (not a bool, not a float equal to one) among ``allowed``."""
    return isinstance(value, int) and not isinstance(value, bool) and value in allowed


# --8<-- [start:wide_kernel]
@triton.jit
def _int4_tc_wide_kernel(x_ptr, w_ptr, s_ptr, z_ptr, y_ptr, M, N, K, K_PER_SPLIT,
                         stride_xm, stride_wn, stride_sn, stride_ys, stride_ym,
                         GROUP_SIZE: tl.constexpr, HAS_ZEROS: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         X_RELABELLED: tl.constexpr = False):
    """Like v5 (y^T = W x^T, the dequantised weight as wgmma's register operand), with BLOCK_N
    weight rows per program, one warpgroup and one relabelled 64-row half each, and x loaded as a
    (BLOCK_M, BLOCK_K) tile in its own k order, 16 contiguous bytes a thread, then relabelled in
    registers (a reshape and a permute, as for the weight) instead of gathered in the permuted
    order. A third grid axis takes M in blocks of BLOCK_M rows. X_RELABELLED (v8): x arrives
    already in the relabelled k order (:func:`relabel_x`), so its tile is only transposed."""
    tl.static_assert(BLOCK_N % 64 == 0 and BLOCK_K == 128)  # 64-row halves, v5's relabelling
    HALVES: tl.constexpr = BLOCK_N // 64
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                   # rows as loaded
    rows = tl.minimum(offs_n, N - 1)[:, None].to(tl.int64)
    r = tl.arange(0, BLOCK_N)                                          # rows as the dot holds them
    dot_n = pid_n * BLOCK_N + 64 * (r // 64) + _relabel_rows(r % 64)
    dot_rows = tl.minimum(dot_n, N - 1)[:, None].to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    x_rows = x_ptr + tl.minimum(offs_m, M - 1)[:, None].to(tl.int64) * stride_xm  # (BLOCK_M, 1)
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(K, k_lo + K_PER_SPLIT)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        word = tl.max_contiguous(tl.multiple_of(k0 // 8 + tl.arange(0, BLOCK_K // 8),
                                                BLOCK_K // 8), BLOCK_K // 8)
        words = tl.load(w_ptr + rows * stride_wn + word[None, :])      # (BLOCK_N, 16)
        group = k0 // GROUP_SIZE
        if HAS_ZEROS:
            zero = tl.load(z_ptr + rows * stride_sn + group).to(tl.float32)
        else:
            zero = 8.0
        w = _unpack_words(words, zero).to(x_ptr.dtype.element_ty)     # (BLOCK_N, 128), q - z
        # in each half h: rows 64 h + 32 c + 8 b + a -> 64 h + 16 b + 8 c + a; k as in v5
        w = tl.reshape(tl.permute(tl.reshape(w, (HALVES, 2, 4, 8, 4, 16, 2)),
                                  (0, 2, 1, 3, 5, 4, 6)), (BLOCK_N, BLOCK_K))
        ks = tl.max_contiguous(tl.multiple_of(k0 + tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
        x = tl.load(x_rows + ks[None, :])                              # (BLOCK_M, 128), k order
        if X_RELABELLED:  # relabelled once per call, by relabel_x
            xt = tl.trans(x)
        else:  # k 32 a + 2 b + c -> row 8 b + 2 a + c of x^T: the k relabelling of the weight
            xt = tl.reshape(tl.permute(tl.reshape(x, (BLOCK_M, 4, 16, 2)), (2, 1, 3, 0)),
                            (BLOCK_K, BLOCK_M))
        scale = tl.load(s_ptr + dot_rows * stride_sn + group).to(tl.float32)
        acc += tl.dot(w, xt) * scale                                   # fp32 sums, scaled once
    y_ptrs = y_ptr + pid_k * stride_ys + offs_m[None, :].to(tl.int64) * stride_ym + dot_n[:, None]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty),
             mask=(offs_m[None, :] < M) & (dot_n[:, None] < N))
# --8<-- [end:wide_kernel]


# --8<-- [start:wide_launch]
def wide_split_k(m: int, n: int, k: int, block_m: int, block_n: int, per_sm: int = 1) -> int:
    """v6's and v7's K ranges: doubled while the programs still fit the SMs, ``per_sm`` each, and
    each range keeps at least two slices. An SM holds one program of 8 warps (the register file
    nearly full) and two of 4 (at most half of it, and under half of the shared memory)."""
    sms = INTERPRET_SMS if triton_interpreting() else num_sms(torch.cuda.current_device())
    tiles = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    split = 1
    while tiles * split * 2 <= sms * per_sm and k // TC_BLOCK_K >= 4 * split:
        split *= 2
    return split


def relabel_x(x: torch.Tensor) -> torch.Tensor:
    """v8's first pass: x (M, K), K a multiple of 128, copied with each 128-deep slice's k in the
    order of the dequantised weight's relabelled k: position 8 b + 2 a + c holds k = 32 a + 2 b + c
    (the reshape and permute v6's kernel does on chip, once per program and slice)."""
    m, k = x.shape
    return x.reshape(m, k // 128, 4, 16, 2).permute(0, 1, 3, 2, 4).reshape(m, k)


def int4_tc_wide(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                 zeros: torch.Tensor | None = None, split_k: int | None = None, *,
                 block_n: int = 128, block_m: int | None = None, num_warps: int | None = None,
                 num_stages: int = 3, relabel_x_once: bool = False) -> torch.Tensor:
    """v6 (and v7, with ``block_n=64``): y = x @ dequantised(w).T for M <= 256 on the tensor
    cores, as v5 (the weight as the
    MMA's register operand), with ``block_n`` weight rows per program (64 or 128: one warpgroup
    per 64-row half) and x read in its own k order. G and K multiples of 128. ``block_m``: rows of
    x per program (16 to 128, a power of two; by default the smallest that holds M, at most 128,
    more rows taking more programs); ``num_warps``: 4 or 8, at least one warpgroup per 64 rows
    (default: exactly that); ``split_k``: an int >= 1 or None (the number of K ranges doubled
    while the programs still fit the SMs: one program an SM at 8 warps, two at 4; each range
    whole 128-deep slices); ``relabel_x_once`` (v8): x relabelled by :func:`relabel_x` before the
    launch, so the kernel copies it straight into the layout wgmma reads."""
    m, n, k, g = check_tc_call("int4_tc_wide", "v6", WIDE_MAX_M, x, packed, scales, zeros,
                               split_k)
    if not _int_in(block_n, (64, 128)):
        raise ValueError(f"int4_tc_wide: block_n must be 64 or 128, got {block_n!r}")
    if block_m is not None and not _int_in(block_m, (16, 32, 64, 128)):
        raise ValueError(f"int4_tc_wide: block_m must be 16, 32, 64, 128 or None, got {block_m!r}")
    # 128 rows on one warpgroup convert the dequantised tile's layout through shared memory and
    # spill (compiled for sm_90 on the CPU): one warpgroup per relabelled 64-row half
    num_warps = block_n // 16 if num_warps is None else num_warps
    if not _int_in(num_warps, (4, 8)) or num_warps < block_n // 16:
        raise ValueError(f"int4_tc_wide: num_warps must be 4 or 8 and at least {block_n // 16} "
                         f"for block_n = {block_n} (a warpgroup per 64 rows), got {num_warps!r}")
    if not _int_in(num_stages, range(1, 6)):
        raise ValueError(f"int4_tc_wide: num_stages must be an int from 1 to 5, got "
                         f"{num_stages!r}")
    if not isinstance(relabel_x_once, bool):
        raise TypeError(f"int4_tc_wide: relabel_x_once must be a bool, got "
                        f"{type(relabel_x_once).__name__}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    if relabel_x_once:
        x = relabel_x(x)
    # a (BLOCK_M, 128) tile of x and a (BLOCK_N, BLOCK_M) fp32 sum: 256 rows spill (compiled)
    block_m = block_m or min(128, max(16, triton.next_power_of_2(m)))
    per_sm = 2 if num_warps == 4 else 1   # one warpgroup: two programs share an SM
    split = wide_split_k(m, n, k, block_m, block_n, per_sm) if split_k is None else split_k
    k_per_split = triton.cdiv(k // TC_BLOCK_K, split) * TC_BLOCK_K
    out = y if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    words = packed.view(torch.int32)
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m), split)
    _int4_tc_wide_kernel[grid](
        x, words, scales, zeros if zeros is not None else packed, out, m, n, k, k_per_split,
        x.stride(0), words.stride(0), scales.stride(0), out.stride(0) if split > 1 else 0,
        out.stride(-2), GROUP_SIZE=g, HAS_ZEROS=zeros is not None, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=TC_BLOCK_K, X_RELABELLED=relabel_x_once, num_warps=num_warps,
        num_stages=num_stages)
    if split > 1:
        block = 1024
        _sum_splits_kernel[(triton.cdiv(m * n, block),)](out, y, split, m * n, BLOCK=block)
    return y
# --8<-- [end:wide_launch]



# --------------------------------------------------------------------------------------------------
# v9: CUDA C, mma.sync on codes dequantised by bit tricks (csrc/part8/int4_mma.cu)
# --------------------------------------------------------------------------------------------------

# --8<-- [start:mma_launch]
MMA_CU_FILE = "part8/int4_mma.cu"
MMA_MAX_M = 16      # two n8 tiles of the MMA; more rows: v8's wgmma kernel
MMA_SLAB = 128      # the K of a slab: a quad of lanes reads 64 bytes of a row, one scale
MMA_WARPS = 4       # warps a block: they take the slabs of the block's rows in turn
MMA_STAGES = 3      # slabs a warp's ring holds (csrc/part8/int4_mma.cu's STAGES)
MMA_OPTIONS = cuda.defines(MMA_CU_FILE, STAGES=MMA_STAGES, MAX_WARPS=MMA_WARPS)
MMA_SUFFIX = {torch.bfloat16: "bf16", torch.float16: "f16"}


def check_mma_call(x, packed, scales, zeros) -> tuple[int, int, int, int]:
    """int4_mma's own limits on top of check_int4_gemm's, before any launch."""
    m, n, k, g = check_int4_gemm(x, packed, scales, zeros, fn="int4_mma")
    if m > MMA_MAX_M:
        raise ValueError(f"int4_mma: M = {m} rows of x; the kernel takes M <= {MMA_MAX_M} (two n8 "
                         "tiles of the MMA); use int4_tc_wide or int4_gemm")
    if g % MMA_SLAB:
        raise ValueError(f"int4_mma: the group size G = {g} must be a multiple of {MMA_SLAB} (a "
                         "slab of K takes one scale per row); use int4_gemm")
    if x.dtype not in MMA_SUFFIX:
        raise TypeError(f"int4_mma: x must be bfloat16 or float16 (the MMA's operand types), got "
                        f"{x.dtype}")
    for name, t in (("x", x), ("packed", packed)):
        if t.data_ptr() % 16:
            raise ValueError(f"int4_mma: {name} must start on a 16-byte boundary (it is read 16 "
                             f"bytes at a time); got address {t.data_ptr():#x}")
    return m, n, k, g


def int4_mma(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
             zeros: torch.Tensor | None = None) -> torch.Tensor:
    """v9: y = x @ dequantised(w).T for M <= 16 rows of x on the tensor cores (mma.sync), the codes
    dequantised in registers with bit tricks; one block for every 16 weight rows (32 when M > 8),
    its warps taking the 128-deep slabs of K in turn through rings of cp.async copies."""
    refuse_grad("int4_mma", x, scales, instead="int4_gemm_ref")
    m, n, k, g = check_mma_call(x, packed, scales, zeros)
    cuda.require_gpu()
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    tiles = 1 if m <= 8 else 2  # m16 tiles of weight rows a block; as many n8 tiles of x's rows
    name = f"int4_mma_{MMA_SUFFIX[x.dtype]}_m{8 * tiles}" + ("_zeros" if zeros is not None else "")
    fn = cuda.kernel(MMA_CU_FILE, name, MMA_OPTIONS)
    ring = MMA_WARPS * MMA_STAGES * 2 * tiles * 512  # bytes: 16 per lane, row and stage
    with torch.cuda.device(x.device):
        cuda.launch(fn, triton.cdiv(n, 16 * tiles), 32 * MMA_WARPS,
                    (x, packed, scales, zeros if zeros is not None else packed, y, np.int32(m),
                     np.int32(n), np.int32(k), np.int32(g)), shared_mem=ring)
    return y
# --8<-- [end:mma_launch]


# --------------------------------------------------------------------------------------------------
# Baselines
# --------------------------------------------------------------------------------------------------

def dequant_matmul(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                   zeros: torch.Tensor | None = None) -> torch.Tensor:
    """v3: PyTorch, dequantise the whole weight into memory in x's dtype, then torch.matmul."""
    check_int4_gemm(x, packed, scales, zeros, fn="dequant_matmul")
    q = torch.stack((packed & 0xF, packed >> 4), dim=2).reshape(packed.shape[0], -1)
    return x @ dequantize_int4(q, scales, zeros).T


def cublas_dense(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """v0: cuBLAS through torch.matmul on the (N, K) fp16/bf16 weight: four times the weight bytes
    of the int4 versions."""
    if x.dtype != weight.dtype or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"cublas_dense: x {x.dtype} {tuple(x.shape)} and weight {weight.dtype} "
                         f"{tuple(weight.shape)} do not match")
    return x @ weight.T


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

# --8<-- [start:register]
def make_inputs(size, dtype, device, gen):
    """(x, packed, scales, dense): x (M, K) standard normal; a standard normal (N, K) weight
    quantised by RTN with symmetric groups of size["g"], its scales rounded to ``dtype``; and the
    dequantised weight in ``dtype`` for v0 (the uncompressed layer the codes stand for)."""
    dev_gen = device_generator(gen, device)
    m, n, k, g = size["m"], size["n"], size["k"], size["g"]
    x = torch.randn((m, k), generator=dev_gen, device=device).to(dtype)
    w = torch.randn((n, k), generator=dev_gen, device=device)
    codes, scales, _ = rtn_int4(w, g)
    scales = scales.to(dtype)
    dense = dequantize_int4(codes, scales.float()).to(dtype)
    return x, pack_int4(codes), scales, dense


def _reference(x, packed, scales, dense):
    """The registered reference: int4_gemm_ref on the codes (``dense`` is v0's input only)."""
    return int4_gemm_ref(x, packed, scales)


def bytes_moved(size, dtype) -> int:
    """What an int4 version must read and write: the packed codes (K / 2 bytes per output
    channel), one scale per group, x and y. v0 reads 2 bytes per weight instead of 1/2, and its rate
    is computed with this same count: rates compare times, and v0's is an 'int4-equivalent' one."""
    m, n, k, g = size["m"], size["n"], size["k"], size["g"]
    return n * k // 2 + n * (k // g) * dtype.itemsize + (m * k + m * n) * dtype.itemsize


def dense_linear(x, packed, scales, dense):
    """v0 with the registry's arguments: cuBLAS on ``dense``, the fp16/bf16 weight."""
    return cublas_dense(x, dense)


def int4_linear(x, packed, scales, dense=None):
    """v1 with the registry's arguments: int4_gemm(x, packed, scales), no split. ``dense``, v0's
    input, is not read."""
    refuse_grad("int4_linear", dense, instead="int4_gemm_ref")   # forward-only
    return int4_gemm(x, packed, scales, split_k=1)


def int4_linear_splitk(x, packed, scales, dense=None):
    """v2 with the registry's arguments: int4_gemm with auto_split_k's split. ``dense``, v0's
    input, is not read."""
    refuse_grad("int4_linear_splitk", dense, instead="int4_gemm_ref")   # forward-only
    return int4_gemm(x, packed, scales, split_k=None)


def int4_linear_gemv(x, packed, scales, dense=None):
    """v4 with the registry's arguments: int4_gemv (CUDA cores, the weight read once for all rows)
    for M <= 8 and K a multiple of 8; otherwise v2 (``int4_gemm`` with split-K), since at more
    rows the GEMV's FMAs, not its bytes, set the time (the chapter's model). So at the headline
    M = 16 and at M = 64 the v4 rows of the tables are v2's kernel."""
    refuse_grad("int4_linear_gemv", dense, instead="int4_gemm_ref")   # forward-only
    if x.shape[0] <= GEMV_MAX_M and x.shape[-1] % 8 == 0:
        return int4_gemv(x, packed, scales)
    return int4_gemm(x, packed, scales, split_k=None)


def int4_linear_tc(x, packed, scales, dense=None):
    """v5 with the registry's arguments: int4_tc (tensor cores, the weight in registers) for
    M <= 64 and G a multiple of 128; otherwise v2. At M = 1 and 4 it pads x to 16 rows of the
    MMA, so the tables compare it with v4's GEMV there."""
    refuse_grad("int4_linear_tc", dense, instead="int4_gemm_ref")   # forward-only
    groups = scales.shape[-1]
    if x.shape[0] <= 64 and groups and x.shape[-1] % (TC_BLOCK_K * groups) == 0:
        return int4_tc(x, packed, scales)
    return int4_gemm(x, packed, scales, split_k=None)


# --8<-- [start:wide_dispatch]
def tc_wide_or_v2(name, x, packed, scales, dense, **launch):
    """v6 to v8's dispatch: int4_tc_wide with ``launch`` for M <= 256 and G a multiple of 128;
    otherwise v2, as v5."""
    refuse_grad(name, dense, instead="int4_gemm_ref")   # forward-only
    groups = scales.shape[-1]
    if x.shape[0] <= WIDE_MAX_M and groups and x.shape[-1] % (TC_BLOCK_K * groups) == 0:
        return int4_tc_wide(x, packed, scales, **launch)
    return int4_gemm(x, packed, scales, split_k=None)
# --8<-- [end:wide_dispatch]


def int4_linear_tc_wide(x, packed, scales, dense=None):
    """v6 with the registry's arguments: int4_tc_wide (128 weight rows per program, x read in
    k order) where it applies (``tc_wide_or_v2``)."""
    return tc_wide_or_v2("int4_linear_tc_wide", x, packed, scales, dense)


# --8<-- [start:pair]
def int4_linear_tc_pair(x, packed, scales, dense=None):
    """v7 with the registry's arguments: int4_tc_wide with 64 weight rows a program on one
    warpgroup (``block_n=64``, 4 warps), two programs an SM, K split for that; otherwise v2, as
    v6."""
    return tc_wide_or_v2("int4_linear_tc_pair", x, packed, scales, dense, block_n=64)
# --8<-- [end:pair]


# --8<-- [start:relabelled]
def int4_linear_tc_relabelled(x, packed, scales, dense=None):
    """v8 with the registry's arguments: v7's launch with x relabelled once per call
    (``relabel_x_once``); otherwise v2, as v6 and v7."""
    return tc_wide_or_v2("int4_linear_tc_relabelled", x, packed, scales, dense, block_n=64,
                         relabel_x_once=True)
# --8<-- [end:relabelled]


# --8<-- [start:mma_dispatch]
def int4_linear_mma(x, packed, scales, dense=None):
    """v9 with the registry's arguments: int4_mma (CUDA, mma.sync) for M <= 16 and G a multiple of
    128; otherwise v8's dispatch (``tc_wide_or_v2``), so the M = 64 and 128 rows of the tables are
    v8's kernel."""
    refuse_grad("int4_linear_mma", dense, instead="int4_gemm_ref")   # forward-only
    groups = scales.shape[-1]
    if (x.shape[0] <= MMA_MAX_M and groups and x.shape[-1] % (MMA_SLAB * groups) == 0
            and x.dtype in MMA_SUFFIX and x.data_ptr() % 16 == 0):
        return int4_mma(x, packed, scales)
    return int4_linear_tc_relabelled(x, packed, scales, dense)
# --8<-- [end:mma_dispatch]


def dequant_linear(x, packed, scales, dense=None):
    """v3 with the registry's arguments: dequant_matmul(x, packed, scales)."""
    return dequant_matmul(x, packed, scales)


# M = 16 tokens against an 8192 x 8192 layer: the weight is 32 MiB of codes + 1 MiB of scales
# (128 MiB in bf16), so every size here reads well past the 50 MB L2 in v0 and v3.
HEADLINE = {"m": 16, "n": 8192, "k": 8192, "g": 128}
SWEEP = [{"m": m, "n": 8192, "k": 8192, "g": 128} for m in (1, 4, 16, 64, 128)]  # 128: issue 22
# every group size, M = 1, ragged M and N, and K not a multiple of the interpreter's BLOCK_K = 64
TEST_SIZES = [{"m": m, "n": n, "k": k, "g": g}
              for m, n, k, g in ((1, 64, 128, 32), (5, 40, 192, 64), (16, 96, 256, 128),
                                 (33, 72, 96, 32))]
MAX_K = max(s["k"] for s in [HEADLINE, *SWEEP])
SOURCES = (_int4_gemm_kernel, int4_gemm, launch_config, check_int4_gemm)
# what v6 to v8 run on top of SOURCES (v8 adds relabel_x)
WIDE_SOURCES = (*SOURCES, auto_split_k, _int4_tc_wide_kernel, _relabel_rows, _unpack_words,
                _nibble, _sum_splits_kernel, _int_in, wide_split_k, int4_tc_wide, tc_wide_or_v2)
HALF = (torch.float16, torch.bfloat16)


def _triton_dtypes() -> tuple[torch.dtype, ...]:
    return (torch.float16,) if triton_interpreting() else HALF


int4_gemm_op = register(Op(
    name="int4_gemm", part=8, chapter="part8/quantisation.md",
    title="W4A16 GEMM, small M (int4 weights, group scales)", reference=_reference,
    make_inputs=make_inputs, bytes_moved=bytes_moved, flops=gemm_flops, metric="GB/s",
    ceiling="copy", headline=HEADLINE, sweep=SWEEP, dtypes=HALF, bench_dtypes=HALF,
    test_sizes=TEST_SIZES, sweep_axis="m",
    tolerances={d: tolerance_for(MAX_K, d) for d in HALF},
    tolerance_at=lambda s, d: tolerance_for(s["k"], d)))
int4_gemm_op.add(Impl("v0", dense_linear, "PyTorch", "cuBLAS via torch.matmul, fp16/bf16 weight",
                      (cublas_dense,)))
int4_gemm_op.add(Impl("v1", int4_linear, "Triton", "int4 dequantised in registers, fp32 sums",
                      SOURCES, device="any", dtypes=_triton_dtypes()))
int4_gemm_op.add(Impl("v2", int4_linear_splitk, "Triton",
                      "like v1, split-K (fp32 partials, one sum)", (*SOURCES, auto_split_k),
                      device="any", dtypes=_triton_dtypes()))
int4_gemm_op.add(Impl("v3", dequant_linear, "PyTorch", "dequantise to memory, then torch.matmul",
                      (dequant_matmul, check_int4_gemm), origin="library"))
int4_gemm_op.add(Impl("v4", int4_linear_gemv, "Triton",
                      "GEMV on CUDA cores for M <= 8 (v2 for more), 16-byte loads",
                      (*SOURCES, auto_split_k, _int4_gemv_kernel, _gemv_step, _unpack_words,
                       _nibble, _sum_splits_kernel, gemv_config, gemv_gpu_config, gemv_split_k,
                       int4_gemv),
                      device="any", dtypes=_triton_dtypes()))
int4_gemm_op.add(Impl("v5", int4_linear_tc, "Triton",
                      "tensor cores, dequantised weight as wgmma's register operand",
                      (*SOURCES, auto_split_k, _int4_tc_kernel, _relabel_rows, _relabel_ks,
                       _unpack_words, _nibble, _sum_splits_kernel, int4_tc),
                      device="any", dtypes=_triton_dtypes()))
int4_gemm_op.add(Impl("v6", int4_linear_tc_wide, "Triton",
                      "like v5, 128 weight rows a program (two warpgroups), x read in k order "
                      "and relabelled on chip, M <= 256", WIDE_SOURCES,
                      device="any", dtypes=_triton_dtypes()))
int4_gemm_op.add(Impl("v7", int4_linear_tc_pair, "Triton",
                      "like v6, 64 weight rows a program (one warpgroup): two programs an SM, "
                      "K split for both", WIDE_SOURCES,
                      device="any", dtypes=_triton_dtypes()))
int4_gemm_op.add(Impl("v8", int4_linear_tc_relabelled, "Triton",
                      "like v7, x relabelled once per call (a first pass), so no program relabels "
                      "it on chip", (*WIDE_SOURCES, relabel_x),
                      device="any", dtypes=_triton_dtypes()))
int4_gemm_op.add(Impl("v9", int4_linear_mma, "CUDA",
                      "mma.sync on codes dequantised by bit tricks, cp.async rings, M <= 16 "
                      "(v8 for more)",
                      (cuda.source_path(MMA_CU_FILE), check_mma_call, int4_mma, int4_linear_mma,
                       *WIDE_SOURCES, relabel_x, int4_linear_tc_relabelled),
                      device="cuda", dtypes=HALF))
# --8<-- [end:register]
