"""Attention without the S x S matrix: FlashAttention's forward and backward, in NumPy and
in Triton.

``o = softmax(q k^T * scale) v`` for each (batch, head), with q, k, v and o of shape (B, H, S, D),
scale = 1/sqrt(D), and an optional causal mask (query i sees keys j <= i). Two ops are registered.

Versions of ``flash_attention_fwd`` (inputs q, k, v and the causal flag; output o;
never renumbered):

- v0  ``F.scaled_dot_product_attention`` with the FlashAttention backend forced
      (``sdpa_kernel(SDPBackend.FLASH_ATTENTION)``): the library baseline, PyTorch's copy
      of FlashAttention-2.
- v1  the same call with the cuDNN backend forced (``SDPBackend.CUDNN_ATTENTION``): NVIDIA's fused
      attention, on GPUs and torch builds where cuDNN offers it.
- v2  Triton, this chapter's kernel: one program per (block of BLOCK_M queries, batch x head) walks
      the keys and values in blocks of BLOCK_N with the online softmax, keeps the (BLOCK_M, D)
      output in an fp32 accumulator, and writes o and the row log-sum-exp (for the backward).
      Causal: the key blocks entirely right of the diagonal are never visited, and the mask is
      applied only on the blocks the diagonal crosses.

Versions of ``flash_attention_bwd`` (inputs q, k, v, do, the causal flag and a slot for the
forward's saved state; outputs dq, dk, dv):

- v0  SDPA's flash backward: ``torch.autograd.grad`` through the output of v0's forward.
- v1  SDPA's cuDNN backward, the same way.
- v2  Triton, FlashAttention-2's backward: a small kernel for delta = rowsum(dO * O); one kernel
      that owns a block of keys and accumulates dK and dV over the query blocks; one that owns a
      block of queries and accumulates dQ over the key blocks. P is recomputed from q, k and the
      saved log-sum-exp, never stored; no two programs write the same element, so there are no
      atomics and the result has the same bits on every run.

What the backward op times. The goal's anchors are backward-only rates, so each backward version's
timed call is its backward alone. The forward it needs runs once per input set, on the first call,
and what it saves is kept in the ``saved`` slot that ``make_inputs`` hands to every version (one
slot per version): v0 and v1 keep the autograd graph of SDPA's output (``retain_graph=True`` lets
the backward run again and again), v2 keeps o and the log-sum-exp. The harness checks every version
once (that call runs forward and backward) before timing it, so every timed call runs only the
backward kernels. Called without a slot, a version runs both.

Cost model. FLOPs follow FlashAttention-2's convention: the forward is two matmuls of 2*S*S*D each
per head, 4*B*H*S*S*D in all (half of it with the causal mask); the backward is five such matmuls (S
and dP recomputed, then dV, dQ, dK), 2.5 times the forward. The softmax's exponentials are not
counted. Bytes: the forward must read q, k, v and write o; the backward must read q, k, v, o, dO and
the log-sum-exp and write dq, dk, dv. Metric TFLOP/s against cuBLAS's bf16 GEMM rate measured in the
same run.

Goals (B=4, H=32, S=4096, D=128, bf16, non-causal): the forward at least as fast as SDPA's flash
backend, and within reach of its cuDNN backend; the backward at least 0.8 times as fast as the
flash backend's. The chapter's goal checks and tables (docs/part5/flash-attention.md) hold the
measured rates of every GPU with results.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend

from snippets._checks import (
    GRADS_ONLY,
    check_scalar,
    check_tensors,
    refuse_grad,
    triton_device,
    triton_interpreting,
    wants_grad,
)
from snippets.common.attention import (  # the reference, inputs, cost model, SDPA baselines
    attention_bwd_bytes,
    attention_bwd_flops,
    attention_bwd_ref,
    attention_bytes,
    attention_flops,
    attention_ref,
    cudnn_missing,
    make_inputs,
    make_inputs_bwd,
    sdpa,
    sdpa_backward,
)
from snippets.registry import Impl, Op, register

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# powers of two (tl.arange), at least 16 (the K of a tensor-core tl.dot)
HEAD_DIMS = (16, 32, 64, 128)
LOG2E = 1.4426950408889634     # the kernels use exp2: e^x = 2^(x log2 e), one MUFU.EX2 instruction
MAX_GRID_Y = 65535             # CUDA's limit on gridDim.y, which carries batch x heads


# --8<-- [start:bytes]
def score_bytes(b: int, h: int, s: int, itemsize: int) -> int:
    """Bytes of the S x S score matrices of every head, written once and read once by the softmax,
    and the probabilities written once and read once by the second matmul: what an unfused attention
    adds to the 4*B*H*S*D elements of q, k, v and o."""
    return 4 * b * h * s * s * itemsize
# --8<-- [end:bytes]


# --------------------------------------------------------------------------------------------------
# The algorithm in NumPy, one head, float64
# --------------------------------------------------------------------------------------------------

# --8<-- [start:numpy_naive]
def attention_numpy(q, k, v, causal=False):
    """Attention for one head, q, k, v of shape (S, D): the S x S scores in memory. Returns o and
    the row log-sum-exp lse_i = log(sum_j exp(s_ij)), the one number per row the backward
    will need."""
    s = q @ k.T / np.sqrt(q.shape[1])
    if causal:
        s = np.where(np.tri(*s.shape, dtype=bool), s, -np.inf)
    m = s.max(axis=1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(axis=1, keepdims=True)
    return (p / l) @ v, (m + np.log(l))[:, 0]


def attention_bwd_numpy(q, k, v, do, causal=False):
    """The naive backward for one head: P in memory, then the five products."""
    scale = 1.0 / np.sqrt(q.shape[1])
    o, lse = attention_numpy(q, k, v, causal)
    s = q @ k.T * scale
    if causal:
        s = np.where(np.tri(*s.shape, dtype=bool), s, -np.inf)
    p = np.exp(s - lse[:, None])
    dv = p.T @ do
    dp = do @ v.T
    ds = p * (dp - (do * o).sum(axis=1, keepdims=True))
    return ds @ k * scale, ds.T @ q * scale, dv
# --8<-- [end:numpy_naive]


# --8<-- [start:numpy_tiled]
def flash_attention_numpy(q, k, v, causal=False, block_m=16, block_n=16):
    """The same o and lse, a block of block_m query rows at a time, reading k and v in blocks of
    block_n rows: only (block_m, block_n) scores exist at once. Each row keeps the running max m,
    the running sum l of exp(s - m) and the running output acc = sum_j exp(s_j - m) v_j; a block
    that raises the max rescales l and acc by exp(m_old - m_new) (the online softmax of Part 4, with
    a vector riding along)."""
    n, d = q.shape
    scale = 1.0 / np.sqrt(d)
    o, lse = np.empty_like(q), np.empty(n)
    for m0 in range(0, n, block_m):
        rows = np.arange(m0, min(m0 + block_m, n))
        m = np.full(rows.size, -np.inf)
        l = np.zeros(rows.size)
        acc = np.zeros((rows.size, d))
        # causal: key blocks past the diagonal are skipped
        hi = min(m0 + block_m, n) if causal else n
        for n0 in range(0, hi, block_n):
            cols = np.arange(n0, min(n0 + block_n, n))
            s = q[rows] @ k[cols].T * scale
            if causal:
                s = np.where(cols[None, :] <= rows[:, None], s, -np.inf)
            m_new = np.maximum(m, s.max(axis=1))
            alpha = np.exp(m - m_new)                  # 0 on the first block: exp(-inf)
            p = np.exp(s - m_new[:, None])
            l = l * alpha + p.sum(axis=1)
            acc = acc * alpha[:, None] + p @ v[cols]
            m = m_new
        o[rows] = acc / l[:, None]
        lse[rows] = m + np.log(l)
    return o, lse
# --8<-- [end:numpy_tiled]


# --8<-- [start:numpy_bwd]
def flash_attention_bwd_numpy(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """The backward by blocks, as the Triton kernels do it. P is recomputed from q, k and lse (one
    number per row, saved by the forward) instead of being read back from memory; delta_i =
    rowsum(dO_i * O_i) replaces rowsum(P_i * dP_i). dK and dV are accumulated per block of keys over
    the query blocks, dQ per block of queries over the key blocks, so each output block has exactly
    one owner."""
    n, d = q.shape
    scale = 1.0 / np.sqrt(d)
    delta = (do * o).sum(axis=1)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)

    def p_block(rows, cols):
        s = q[rows] @ k[cols].T * scale
        p = np.exp(s - lse[rows][:, None])
        return np.where(cols[None, :] <= rows[:, None], p, 0.0) if causal else p

    for n0 in range(0, n, block_n):              # owner of dK, dV for keys n0 .. n0 + block_n
        cols = np.arange(n0, min(n0 + block_n, n))
        lo = n0 - n0 % block_m if causal else 0  # causal: earlier queries do not see these keys
        for m0 in range(lo, n, block_m):
            rows = np.arange(m0, min(m0 + block_m, n))
            p = p_block(rows, cols)
            dv[cols] += p.T @ do[rows]
            ds = p * (do[rows] @ v[cols].T - delta[rows][:, None])
            dk[cols] += ds.T @ q[rows] * scale
    for m0 in range(0, n, block_m):                    # owner of dQ for queries m0 .. m0 + block_m
        rows = np.arange(m0, min(m0 + block_m, n))
        hi = min(m0 + block_m, n) if causal else n
        for n0 in range(0, hi, block_n):
            cols = np.arange(n0, min(n0 + block_n, n))
            p = p_block(rows, cols)
            ds = p * (do[rows] @ v[cols].T - delta[rows][:, None])
            dq[rows] += ds @ k[cols] * scale
    return dq, dk, dv
# --8<-- [end:numpy_bwd]


# --------------------------------------------------------------------------------------------------
# Library baselines: scaled_dot_product_attention with one backend forced
# --------------------------------------------------------------------------------------------------

# --8<-- [start:sdpa]
def attention_flash_sdpa(q, k, v, causal=False):
    """v0: PyTorch's FlashAttention-2 kernel."""
    return sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, causal)


def attention_cudnn_sdpa(q, k, v, causal=False):
    """v1: cuDNN's fused attention (its forward saves the log-sum-exp only when q needs
    a gradient)."""
    return sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, causal)


def attention_bwd_flash_sdpa(q, k, v, do, causal=False, saved=None):
    """v0: SDPA's flash backward (timed alone; see the module docstring)."""
    return sdpa_backward(SDPBackend.FLASH_ATTENTION, "v0", q, k, v, do, causal, saved)


def attention_bwd_cudnn_sdpa(q, k, v, do, causal=False, saved=None):
    """v1: SDPA's cuDNN backward (timed alone)."""
    return sdpa_backward(SDPBackend.CUDNN_ATTENTION, "v1", q, k, v, do, causal, saved)
# --8<-- [end:sdpa]


# --------------------------------------------------------------------------------------------------
# v2: the forward in Triton
# --------------------------------------------------------------------------------------------------

# --8<-- [start:fwd_inner]
@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n, offs_d, lo, hi, S, qk_scale,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr,
               HEAD_DIM: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr):
    # Key/value blocks lo, lo + BLOCK_N, ... < hi. MASKED blocks may run past S or cross the
    # diagonal; the others are whole and fully visible, so their loads and scores carry no mask
    # at all.
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        kv_offs = cols[:, None] * HEAD_DIM + offs_d[None, :]
        if MASKED:
            k = tl.load(k_base + kv_offs, mask=cols[:, None] < S, other=0.0).to(DOT)
        else:
            k = tl.load(k_base + kv_offs).to(DOT)
        # (BLOCK_M, BLOCK_N), log2 units
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        if MASKED:
            keep = cols[None, :] < S
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None])
            s = tl.where(keep, s, -float("inf"))
        # The online softmax: a new running max rescales the running sum and the accumulator.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if MASKED:
            v = tl.load(v_base + kv_offs, mask=cols[:, None] < S, other=0.0).to(DOT)
        else:
            v = tl.load(v_base + kv_offs).to(DOT)
        # P is rounded to the input type for the tensor cores; the sum stays in the
        # fp32 accumulator.
        acc = tl.dot(p.to(DOT), v, acc * alpha[:, None], input_precision=PRECISION,
                     out_dtype=acc.dtype)
        m_i = m_new
    return acc, l_i, m_i
# --8<-- [end:fwd_inner]


# --8<-- [start:fwd_kernel]
@triton.jit
def _attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, S, qk_scale,
                     HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, DOT: tl.constexpr, COMPUTE: tl.constexpr,
                     PRECISION: tl.constexpr):
    tl.static_assert(BLOCK_M % BLOCK_N == 0,
                     "the diagonal stage must start on a key-block boundary")
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)       # batch * H + head; int64: B*H*S*D may pass 2^31
    base = bh * S * HEAD_DIM                 # contiguous (B, H, S, D): one head is an (S, D) matrix
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < S
    q_offs = offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    # read once, kept on chip
    q = tl.load(q_ptr + base + q_offs, mask=row_ok[:, None], other=0.0).to(DOT)

    m_i = tl.full([BLOCK_M], -float("inf"), COMPUTE)   # running max of each row (log2 units)
    l_i = tl.zeros([BLOCK_M], COMPUTE)                 # running sum of 2^(s - m_i)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], COMPUTE)       # running sum of 2^(s - m_i) v
    k_base = k_ptr + base
    v_base = v_ptr + base
    if CAUSAL:
        # Key blocks left of the diagonal: every key precedes every query of this block, no mask.
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n, offs_d, 0, m0,
                                   S, qk_scale, False, CAUSAL, BLOCK_N, HEAD_DIM, DOT, PRECISION)
        # The blocks the diagonal crosses: masked. Blocks right of it are never loaded.
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n, offs_d, m0,
                                   tl.minimum(m0 + BLOCK_M, S), S, qk_scale, True, CAUSAL, BLOCK_N,
                                   HEAD_DIM, DOT, PRECISION)
    else:
        # whole blocks unmasked, then the ragged tail (if any) masked
        full = (S // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n, offs_d, 0,
                                   full, S, qk_scale, False, CAUSAL, BLOCK_N, HEAD_DIM, DOT,
                                   PRECISION)
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n, offs_d, full,
                                   S, S, qk_scale, True, CAUSAL, BLOCK_N, HEAD_DIM, DOT, PRECISION)
    o = acc / l_i[:, None]
    tl.store(o_ptr + base + q_offs, o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    # The backward's one number per row: log2 of the softmax denominator, in the log2 units of
    # the scores.
    tl.store(lse_ptr + bh * S + offs_m, m_i + tl.log2(l_i), mask=row_ok)
# --8<-- [end:fwd_kernel]


# --------------------------------------------------------------------------------------------------
# v2: the backward in Triton
# --------------------------------------------------------------------------------------------------

# --8<-- [start:bwd_preprocess]
@triton.jit
def _attn_bwd_delta_kernel(o_ptr, do_ptr, delta_ptr, S, HEAD_DIM: tl.constexpr,
                           BLOCK_M: tl.constexpr, COMPUTE: tl.constexpr):
    # delta_i = sum_d dO_id O_id = sum_j P_ij dP_ij: one number per query row, read by both
    # gradient kernels.
    bh = tl.program_id(1).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs = bh * S * HEAD_DIM + offs_m[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    row_ok = offs_m < S
    o = tl.load(o_ptr + offs, mask=row_ok[:, None], other=0.0).to(COMPUTE)
    do = tl.load(do_ptr + offs, mask=row_ok[:, None], other=0.0).to(COMPUTE)
    tl.store(delta_ptr + bh * S + offs_m, tl.sum(o * do, axis=1), mask=row_ok)
# --8<-- [end:bwd_preprocess]


# --8<-- [start:bwd_dkdv]
@triton.jit
def _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base, offs_n, offs_d, lo, hi, S,
                    qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                    HEAD_DIM: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr):
    # Work in the transposed frame: s^T = k q^T is (BLOCK_N, BLOCK_M), so that P^T and dS^T come out
    # in the layout the two accumulating products (P^T dO and dS^T Q) want.
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        q_offs = rows[:, None] * HEAD_DIM + offs_d[None, :]
        if MASKED:
            q = tl.load(q_base + q_offs, mask=rows[:, None] < S, other=0.0).to(DOT)
            do = tl.load(do_base + q_offs, mask=rows[:, None] < S, other=0.0).to(DOT)
            lse = tl.load(lse_base + rows, mask=rows < S, other=0.0)
            delta = tl.load(delta_base + rows, mask=rows < S, other=0.0)
        else:
            q = tl.load(q_base + q_offs).to(DOT)
            do = tl.load(do_base + q_offs).to(DOT)
            lse = tl.load(lse_base + rows)
            delta = tl.load(delta_base + rows)
        # Recompute P^T from the saved log-sum-exp: no running max, no second pass.
        p_t = tl.exp2(tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale - lse[None, :])
        if MASKED:
            keep = rows[None, :] < S
            if CAUSAL:
                keep = keep & (offs_n[:, None] <= rows[None, :])
            p_t = tl.where(keep, p_t, 0.0)
        # dV += P^T dO
        dv = tl.dot(p_t.to(DOT), do, dv, input_precision=PRECISION, out_dtype=dv.dtype)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # dP^T = V dO^T
        ds_t = p_t * (dp_t - delta[None, :])                       # dS = P * (dP - delta)
        # dK += dS^T Q
        dk = tl.dot(ds_t.to(DOT), q, dk, input_precision=PRECISION, out_dtype=dk.dtype)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, S,
                          qk_scale, sm_scale, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr,
                          COMPUTE: tl.constexpr, PRECISION: tl.constexpr):
    tl.static_assert(BLOCK_N % BLOCK_M == 0,
                     "the query loop must step onto the diagonal block exactly")
    bh = tl.program_id(1).to(tl.int64)
    base = bh * S * HEAD_DIM
    n0 = tl.program_id(0) * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = offs_n < S
    kv_offs = offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    # this program's keys and
    k = tl.load(k_ptr + base + kv_offs, mask=col_ok[:, None], other=0.0).to(DOT)
    # values stay on chip
    v = tl.load(v_ptr + base + kv_offs, mask=col_ok[:, None], other=0.0).to(DOT)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], COMPUTE)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], COMPUTE)
    q_base, do_base = q_ptr + base, do_ptr + base
    lse_base, delta_base = lse_ptr + bh * S, delta_ptr + bh * S
    full = (S // BLOCK_M) * BLOCK_M
    if CAUSAL:
        # Queries before n0 see none of these keys: skipped. Queries n0 .. n0 + BLOCK_N cross
        # the diagonal.
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base, offs_n,
                                 offs_d, n0, tl.minimum(n0 + BLOCK_N, S), S, qk_scale, True, CAUSAL,
                                 BLOCK_M, HEAD_DIM, DOT, PRECISION)
        lo = n0 + BLOCK_N
    else:
        lo = 0
    # Later queries see every key of the block: unmasked, then the ragged tail of the
    # queries, masked.
    dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base, offs_n, offs_d,
                             lo, full, S, qk_scale, False, CAUSAL, BLOCK_M, HEAD_DIM, DOT,
                             PRECISION)
    dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base, offs_n, offs_d,
                             tl.maximum(lo, full), S, S, qk_scale, True, CAUSAL, BLOCK_M, HEAD_DIM,
                             DOT, PRECISION)
    tl.store(dk_ptr + base + kv_offs, (dk * sm_scale).to(dk_ptr.dtype.element_ty),
             mask=col_ok[:, None])
    tl.store(dv_ptr + base + kv_offs, dv.to(dv_ptr.dtype.element_ty), mask=col_ok[:, None])
# --8<-- [end:bwd_dkdv]


# --8<-- [start:bwd_dq]
@triton.jit
def _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, offs_m, offs_n, offs_d, lo, hi, S,
                  qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr,
                  HEAD_DIM: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        kv_offs = cols[:, None] * HEAD_DIM + offs_d[None, :]
        if MASKED:
            k = tl.load(k_base + kv_offs, mask=cols[:, None] < S, other=0.0).to(DOT)
            v = tl.load(v_base + kv_offs, mask=cols[:, None] < S, other=0.0).to(DOT)
        else:
            k = tl.load(k_base + kv_offs).to(DOT)
            v = tl.load(v_base + kv_offs).to(DOT)
        p = tl.exp2(tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale - lse[:, None])
        if MASKED:
            keep = cols[None, :] < S
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None])
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)                      # dP = dO V^T
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(DOT), k, dq, input_precision=PRECISION, out_dtype=dq.dtype)  # dQ += dS K
    return dq


@triton.jit
def _attn_bwd_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, S, qk_scale,
                        sm_scale, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr,
                        COMPUTE: tl.constexpr, PRECISION: tl.constexpr):
    tl.static_assert(BLOCK_M % BLOCK_N == 0,
                     "the diagonal stage must start on a key-block boundary")
    bh = tl.program_id(1).to(tl.int64)
    base = bh * S * HEAD_DIM
    m0 = tl.program_id(0) * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < S
    q_offs = offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(q_ptr + base + q_offs, mask=row_ok[:, None], other=0.0).to(DOT)
    do = tl.load(do_ptr + base + q_offs, mask=row_ok[:, None], other=0.0).to(DOT)
    lse = tl.load(lse_ptr + bh * S + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(delta_ptr + bh * S + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], COMPUTE)
    k_base, v_base = k_ptr + base, v_ptr + base
    # the forward's loop structure: unmasked left of the diagonal, masked on it, nothing past it
    if CAUSAL:
        dq = _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, offs_m, offs_n, offs_d, 0, m0, S,
                           qk_scale, False, CAUSAL, BLOCK_N, HEAD_DIM, DOT, PRECISION)
        dq = _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, offs_m, offs_n, offs_d, m0,
                           tl.minimum(m0 + BLOCK_M, S), S, qk_scale, True, CAUSAL, BLOCK_N,
                           HEAD_DIM, DOT, PRECISION)
    else:
        full = (S // BLOCK_N) * BLOCK_N
        dq = _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, offs_m, offs_n, offs_d, 0, full,
                           S, qk_scale, False, CAUSAL, BLOCK_N, HEAD_DIM, DOT, PRECISION)
        dq = _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, offs_m, offs_n, offs_d, full, S,
                           S, qk_scale, True, CAUSAL, BLOCK_N, HEAD_DIM, DOT, PRECISION)
    # s was scaled by qk_scale = scale * log2(e) inside exp2; the chain rule through s = scale * q
    # k^T leaves one factor of scale on dQ (and on dK).
    tl.store(dq_ptr + base + q_offs, (dq * sm_scale).to(dq_ptr.dtype.element_ty),
             mask=row_ok[:, None])
# --8<-- [end:bwd_dq]


# --------------------------------------------------------------------------------------------------
# Launch configurations
# --------------------------------------------------------------------------------------------------

# --8<-- [start:configs]
def _cfg(block_m, block_n, warps, stages):
    return triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=warps,
                         num_stages=stages)


# Candidates for the GPU, tried by triton.autotune on the first call for each (S, D, causal, dtype).
# The reasoning for D = 128 in bf16 on an H100/H200: a (128, 128) bf16 q tile is 32 KB of shared
# memory and each pipeline stage of k and v another 2 * BLOCK_N * 256 bytes, so BLOCK_N = 128 fits
# only two stages in the 227 KB an SM gives one block (a config that does not fit is skipped by the
# autotuner); the fp32 accumulator of a (128, 128) tile is 64 KB of registers, 128 per thread over 4
# warps, so 8 warps leave more room for P. Every forward config has BLOCK_M a multiple of BLOCK_N
# (the causal diagonal stage needs it).
FWD_CONFIGS = [_cfg(128, 64, 4, 3), _cfg(128, 64, 8, 3), _cfg(128, 128, 8, 2), _cfg(128, 32, 4, 4),
               _cfg(64, 64, 4, 3), _cfg(64, 32, 4, 4)]
# The dK/dV kernel holds k, v and two fp32 (BLOCK_N, D) accumulators: BLOCK_N = 128 at D = 128 is
# 128 KB of accumulators, which wants 8 warps; its query blocks (BLOCK_M) are short because each
# step makes five (BLOCK_N, BLOCK_M)-sized products and transposes. BLOCK_N is a multiple of BLOCK_M
# in every config.
DKDV_CONFIGS = [_cfg(32, 128, 8, 3), _cfg(64, 128, 8, 3), _cfg(32, 64, 4, 3), _cfg(64, 64, 4, 3),
                _cfg(16, 64, 4, 4)]
# The dQ kernel mirrors the forward (BLOCK_M a multiple of BLOCK_N), with one fp32 (BLOCK_M,
# D) accumulator.
DQ_CONFIGS = [_cfg(128, 32, 8, 3), _cfg(128, 64, 8, 3), _cfg(64, 32, 4, 3), _cfg(64, 64, 4, 3),
              _cfg(128, 32, 4, 3)]
# Triton adds the dtypes of the tensor arguments to the key
AUTOTUNE_KEY = ["S", "HEAD_DIM", "CAUSAL"]

_attn_fwd_tuned = triton.autotune(FWD_CONFIGS, key=AUTOTUNE_KEY)(_attn_fwd_kernel)
_attn_bwd_dkdv_tuned = triton.autotune(DKDV_CONFIGS, key=AUTOTUNE_KEY)(_attn_bwd_dkdv_kernel)
_attn_bwd_dq_tuned = triton.autotune(DQ_CONFIGS, key=AUTOTUNE_KEY)(_attn_bwd_dq_kernel)

# Under the interpreter: one small config per kernel, so that tests at S = 16..80 still see several
# blocks, ragged tails and diagonal blocks made of several inner steps. (BLOCK_M, BLOCK_N) of
# each kernel.
INTERPRETER_BLOCKS = {"fwd": (32, 16), "dkdv": (16, 32), "dq": (32, 16)}
DELTA_BLOCK_M = 64  # the delta kernel reads two (64, D) tiles per program: a streaming reduction
# Fixed launches on the GPU where tuning does not pay: S < TUNE_MIN_S (a few blocks per head:
# launch-bound, and every new S would be tuned again) and fp32 inputs (IEEE products on the FMA
# units, never the fast path). fp64, which only the gradient check uses, takes the interpreter's
# small blocks. (BLOCK_M, BLOCK_N, warps, stages).
TUNE_MIN_S = 512
FIXED_LAUNCH = {"fwd": (64, 32, 4, 2), "dkdv": (32, 64, 4, 2), "dq": (64, 32, 4, 2)}
# --8<-- [end:configs]


def _fixed_launch(kernel: str, dtype: torch.dtype, s: int) -> tuple[int, int, int, int] | None:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for a launch that is not tuned, or None
    to autotune."""
    if triton_interpreting() or dtype == torch.float64:
        return (*INTERPRETER_BLOCKS[kernel], 4, 2)
    if dtype == torch.float32 or s < TUNE_MIN_S:
        return FIXED_LAUNCH[kernel]
    return None


# --------------------------------------------------------------------------------------------------
# Host functions
# --------------------------------------------------------------------------------------------------

# --8<-- [start:checks]
def _check_qkv(q, k, v, causal, sm_scale, dtypes=DTYPES, extra=(), extra_names=()) -> float:
    """q, k, v (and any ``extra`` tensors of the same shape): one dtype, one device, contiguous (B,
    H, S, D) with D in HEAD_DIMS; returns the softmax scale (1/sqrt(D) unless given)."""
    check_tensors(("q", "k", "v", *extra_names), (q, k, v, *extra), dtypes=dtypes,
                  device=triton_device(), allow_empty=False)
    if q.dim() != 4:
        raise ValueError("q, k and v must be 4-D (batch, heads, seq_len, head_dim), got shape "
                         f"{tuple(q.shape)}")
    b, h, s, d = q.shape
    if d not in HEAD_DIMS:
        raise ValueError(f"head_dim {d} is not supported; these kernels take head_dim in "
                         f"{HEAD_DIMS}")
    if b * h > MAX_GRID_Y:
        raise ValueError(f"batch x heads = {b * h} exceeds the {MAX_GRID_Y} programs of a grid's "
                         "second dimension")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if sm_scale is None:
        return 1.0 / math.sqrt(d)
    scale = check_scalar("sm_scale", sm_scale)
    if not scale > 0:
        raise ValueError(f"sm_scale must be positive, got {sm_scale}")
    return scale


def _types(dtype: torch.dtype):
    """(DOT, COMPUTE, PRECISION) for inputs of ``dtype``: what tl.dot's operands are cast to, the
    accumulators' type, and tl.dot's input_precision. fp32 inputs use "ieee" (TF32 would round q and
    k to 10 mantissa bits); float64 (for gradcheck) computes in float64. The interpreter has no bf16
    arithmetic (NumPy has no bf16), so there bf16 operands are widened to fp32; on the GPU they go
    to the tensor cores as they are."""
    if dtype == torch.float64:
        return tl.float64, tl.float64, "ieee"
    if dtype == torch.float32:
        return tl.float32, tl.float32, "ieee"
    if dtype == torch.bfloat16 and triton_interpreting():
        return tl.float32, tl.float32, "ieee"
    return (tl.bfloat16 if dtype == torch.bfloat16 else tl.float16), tl.float32, "tf32"
# --8<-- [end:checks]


# --8<-- [start:fwd_host]
def _forward(q, k, v, causal: bool, sm_scale: float):
    """Launch the forward on checked inputs: o (q's dtype) and lse2, the log2-domain log-sum-exp of
    each row of the scaled scores (fp32; float64 for float64 inputs), shape (B, H, S)."""
    b, h, s, d = q.shape
    dot, compute, precision = _types(q.dtype)
    o = torch.empty_like(q)
    lse2 = torch.empty((b, h, s), device=q.device,
                       dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
    args = (q, k, v, o, lse2, s, sm_scale * LOG2E)
    consts = dict(HEAD_DIM=d, CAUSAL=causal, DOT=dot, COMPUTE=compute, PRECISION=precision)
    fixed = _fixed_launch("fwd", q.dtype, s)
    if fixed:
        bm, bn, warps, stages = fixed
        _attn_fwd_kernel[(triton.cdiv(s, bm), b * h)](*args, BLOCK_M=bm, BLOCK_N=bn,
                                                      num_warps=warps, num_stages=stages, **consts)
    else:
        _attn_fwd_tuned[lambda meta: (triton.cdiv(s, meta["BLOCK_M"]), b * h)](*args, **consts)
    return o, lse2


def flash_attention_forward(q, k, v, causal: bool = False, sm_scale: float | None = None):
    """v2 with its saved state: (o, lse), lse the natural log-sum-exp of each row's scaled scores
    (B, H, S)."""
    refuse_grad("flash_attention_forward", q, k, v, instead="flash_attention")
    scale = _check_qkv(q, k, v, causal, sm_scale)
    o, lse2 = _forward(q, k, v, causal, scale)
    return o, lse2 / LOG2E


def attention_triton(q, k, v, causal=False):
    """v2: the Triton forward (one launch). The log-sum-exp is written too: the kernel that trains
    is the one timed. With grad mode on and q, k or v requiring grad, the call goes through
    FlashAttention (below), whose backward gives them their gradients."""
    scale = _check_qkv(q, k, v, causal, None)
    if wants_grad(q, k, v):
        return FlashAttention.apply(q, k, v, causal, scale)
    return _forward(q, k, v, causal, scale)[0]
# --8<-- [end:fwd_host]


# --8<-- [start:bwd_host]
def _backward(q, k, v, o, lse2, do, causal: bool, sm_scale: float):
    """Launch the backward on checked inputs: delta, then dK/dV, then dQ (three launches,
    no atomics)."""
    b, h, s, d = q.shape
    dot, compute, precision = _types(q.dtype)
    delta = torch.empty_like(lse2)
    _attn_bwd_delta_kernel[(triton.cdiv(s, DELTA_BLOCK_M), b * h)](
        o, do, delta, s, HEAD_DIM=d, BLOCK_M=DELTA_BLOCK_M, COMPUTE=compute)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    consts = dict(HEAD_DIM=d, CAUSAL=causal, DOT=dot, COMPUTE=compute, PRECISION=precision)
    dkdv_args = (q, k, v, do, lse2, delta, dk, dv, s, sm_scale * LOG2E, sm_scale)
    dq_args = (q, k, v, do, lse2, delta, dq, s, sm_scale * LOG2E, sm_scale)
    fixed_dkdv, fixed_dq = _fixed_launch("dkdv", q.dtype, s), _fixed_launch("dq", q.dtype, s)
    if fixed_dkdv and fixed_dq:
        bm, bn, warps, stages = fixed_dkdv
        _attn_bwd_dkdv_kernel[(triton.cdiv(s, bn), b * h)](*dkdv_args, BLOCK_M=bm, BLOCK_N=bn,
                                                           num_warps=warps, num_stages=stages,
                                                           **consts)
        bm, bn, warps, stages = fixed_dq
        _attn_bwd_dq_kernel[(triton.cdiv(s, bm), b * h)](*dq_args, BLOCK_M=bm, BLOCK_N=bn,
                                                         num_warps=warps, num_stages=stages,
                                                         **consts)
    else:
        _attn_bwd_dkdv_tuned[lambda meta: (triton.cdiv(s, meta["BLOCK_N"]), b * h)](
            *dkdv_args, **consts)
        _attn_bwd_dq_tuned[lambda meta: (triton.cdiv(s, meta["BLOCK_M"]), b * h)](
            *dq_args, **consts)
    return dq, dk, dv


def flash_attention_backward(q, k, v, o, lse, do, causal: bool = False,
                             sm_scale: float | None = None):
    """(dq, dk, dv) from the forward's inputs, its output o and its lse (natural log, as
    flash_attention_forward returns it) and the incoming gradient do."""
    refuse_grad("flash_attention_backward", q, k, v, o, lse, do, instead="flash_attention",
                why=GRADS_ONLY)
    scale = _check_qkv(q, k, v, causal, sm_scale, extra=(o, do), extra_names=("o", "do"))
    want = (*q.shape[:3],)
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != want or lse.device != q.device:
        raise ValueError(
            f"lse must be a tensor of shape {want} on {q.device}, got "
            f"{tuple(lse.shape) if isinstance(lse, torch.Tensor) else type(lse).__name__}")
    lse2 = (lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32)
            * LOG2E).contiguous()
    return _backward(q, k, v, o, lse2, do, causal, scale)
# --8<-- [end:bwd_host]


# --8<-- [start:function]
class FlashAttention(torch.autograd.Function):
    """Attention that trains. The forward saves q, k, v, o and one log-sum-exp per row (4 bytes a
    row, against S*4 bytes a row for P); the backward recomputes P from them. float64 is accepted
    too, for torch.autograd.gradcheck."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, sm_scale=None):
        scale = _check_qkv(q, k, v, causal, sm_scale, dtypes=(*DTYPES, torch.float64))
        o, lse2 = _forward(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse2)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse2 = ctx.saved_tensors
        do = do.contiguous()  # autograd may hand over a broadcast view (the gradient of o.sum())
        return (*_backward(q, k, v, o, lse2, do, ctx.causal, ctx.scale), None, None)


def flash_attention(q, k, v, causal: bool = False, sm_scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * sm_scale) v over (B, H, S, D) tensors,
    differentiable: FlashAttention.apply."""
    return FlashAttention.apply(q, k, v, causal, sm_scale)


def attention_bwd_triton(q, k, v, do, causal=False, saved=None):
    """v2: the Triton backward (three launches). The first call on an input set runs the forward and
    keeps o and lse2 in ``saved["v2"]``; the timed calls run only the backward."""
    refuse_grad("attention_bwd_triton", q, k, v, do, instead="flash_attention", why=GRADS_ONLY)
    scale = _check_qkv(q, k, v, causal, None, extra=(do,), extra_names=("do",))
    if saved is None:
        saved = {}
    if "v2" not in saved:
        saved["v2"] = _forward(q, k, v, causal, scale)
    o, lse2 = saved["v2"]
    return _backward(q, k, v, o, lse2, do, causal, scale)
# --8<-- [end:function]


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

HEADLINE = {"b": 4, "h": 32, "s": 4096, "d": 128, "causal": False}
# S from 1024 to 16384 at B * S = 16384 (FlashAttention-2's benchmark shape: the same number of
# tokens at every point, 128 MiB per bf16 tensor), with and without the causal mask; and D = 64 at
# the headline S, 32 heads.
SWEEP = [{"b": 16384 // s, "h": 32, "s": s, "d": 128, "causal": causal}
         for causal in (False, True) for s in (1024, 2048, 4096, 8192, 16384)]
SWEEP += [{"b": 4, "h": 32, "s": 4096, "d": 64, "causal": causal} for causal in (False, True)]
# Tiny, for the interpreter: one block, ragged tails (S = 33, 80 with BLOCK_M = 32), several heads,
# both masks.
TEST_SIZES = [{"b": 1, "h": 1, "s": 16, "d": 16, "causal": False},
              {"b": 2, "h": 3, "s": 33, "d": 32, "causal": True},
              {"b": 1, "h": 2, "s": 80, "d": 64, "causal": False},
              {"b": 1, "h": 1, "s": 80, "d": 64, "causal": True},
              {"b": 1, "h": 2, "s": 47, "d": 16, "causal": False}]
# Against a float64 reference. fp16: q k^T and P V take fp16 operands with fp32 sums, P is rounded
# to fp16 (2^-11 relative) and o once more; the backward rounds P and dS to fp16 for its products.
# bf16 has 3 bits fewer (2^-8), and the tolerance is sized for the GPU at S = 16384, where dV sums
# 16384 rounded products. fp32 uses IEEE products: a few ulp of fp32 times the length of the sums.
TOLERANCES = {torch.float32: (1e-4, 1e-5), torch.float16: (5e-3, 5e-3),
              torch.bfloat16: (3e-2, 3e-2)}
SOURCES = ("snippets/part5/flash_attention.py",)  # configs and tables live beside the kernels

flash_attention_fwd = register(Op(
    name="flash_attention_fwd", part=5, chapter="part5/flash-attention.md",
    title="FlashAttention forward", reference=attention_ref, make_inputs=make_inputs,
    bytes_moved=attention_bytes, flops=attention_flops, metric="TFLOP/s", ceiling="gemm_bf16",
    headline=HEADLINE, sweep=SWEEP, dtypes=DTYPES, bench_dtypes=(torch.bfloat16,),
    test_sizes=TEST_SIZES, tolerances=TOLERANCES, sweep_axis="s", measure_memory=True))
flash_attention_fwd.add(Impl("v0", attention_flash_sdpa, "PyTorch",
                             "SDPA, FlashAttention-2 backend",
                             (F.scaled_dot_product_attention, sdpa), device="any",
                             dtypes=(torch.bfloat16, torch.float16)))
flash_attention_fwd.add(Impl("v1", attention_cudnn_sdpa, "PyTorch", "SDPA, cuDNN backend",
                             (F.scaled_dot_product_attention, sdpa), device="cuda",
                             dtypes=(torch.bfloat16, torch.float16), requires=cudnn_missing,
                             origin="library"))
flash_attention_fwd.add(Impl("v2", attention_triton, "Triton",
                             "online softmax over K/V blocks, causal skipping",
                             (_attn_fwd_kernel, _fwd_inner, _forward, _types, *SOURCES),
                             device="any"))

flash_attention_bwd = register(Op(
    name="flash_attention_bwd", part=5, chapter="part5/flash-attention.md",
    title="FlashAttention backward", reference=attention_bwd_ref, make_inputs=make_inputs_bwd,
    bytes_moved=attention_bwd_bytes, flops=attention_bwd_flops, metric="TFLOP/s",
    ceiling="gemm_bf16", headline=HEADLINE, sweep=SWEEP, dtypes=DTYPES,
    bench_dtypes=(torch.bfloat16,), test_sizes=TEST_SIZES, tolerances=TOLERANCES, sweep_axis="s"))
flash_attention_bwd.add(Impl("v0", attention_bwd_flash_sdpa, "PyTorch",
                             "SDPA flash backward (autograd.grad)",
                             (F.scaled_dot_product_attention, sdpa, sdpa_backward), device="any",
                             dtypes=(torch.bfloat16, torch.float16)))
flash_attention_bwd.add(Impl("v1", attention_bwd_cudnn_sdpa, "PyTorch",
                             "SDPA cuDNN backward (autograd.grad)",
                             (F.scaled_dot_product_attention, sdpa, sdpa_backward), device="cuda",
                             dtypes=(torch.bfloat16, torch.float16), requires=cudnn_missing,
                             origin="library"))
flash_attention_bwd.add(Impl("v2", attention_bwd_triton, "Triton",
                             "FA2 backward: delta, dK/dV per key block, dQ per query block",
                             (_attn_bwd_delta_kernel, _attn_bwd_dkdv_kernel, _bwd_dkdv_inner,
                              _attn_bwd_dq_kernel, _bwd_dq_inner, _backward, _types, *SOURCES),
                             device="any"))


# --------------------------------------------------------------------------------------------------
# Compiling for Hopper without a GPU (the tests check that the GPU code paths reach the
# tensor cores)
# --------------------------------------------------------------------------------------------------

def compile_for_sm90(kernel: str, dtype: torch.dtype, head_dim: int, causal: bool, block_m: int,
                     block_n: int, num_warps: int = 4, num_stages: int = 3):
    """Compile one of the kernels ("fwd", "dkdv", "dq", "delta") for compute capability 9.0 on any
    machine (not under TRITON_INTERPRET, where kernels are not compilable objects); returns Triton's
    CompiledKernel, whose ``asm`` holds ttir, ttgir, llir, ptx and cubin. The types are the
    GPU's (``_types``)."""
    from snippets.common.introspect import TRITON_TYPES, triton_compile

    ty = TRITON_TYPES[dtype]
    stat = "fp64" if dtype == torch.float64 else "fp32"
    dot, compute, precision = _types(dtype)
    fn, sig = {
        "fwd": (_attn_fwd_kernel, dict(q_ptr=ty, k_ptr=ty, v_ptr=ty, o_ptr=ty, lse_ptr=stat)),
        "dkdv": (_attn_bwd_dkdv_kernel, dict(q_ptr=ty, k_ptr=ty, v_ptr=ty, do_ptr=ty, lse_ptr=stat,
                                             delta_ptr=stat, dk_ptr=ty, dv_ptr=ty)),
        "dq": (_attn_bwd_dq_kernel,
               dict(q_ptr=ty, k_ptr=ty, v_ptr=ty, do_ptr=ty, lse_ptr=stat, delta_ptr=stat,
                    dq_ptr=ty)),
        "delta": (_attn_bwd_delta_kernel, dict(o_ptr=ty, do_ptr=ty, delta_ptr=stat)),
    }[kernel]
    signature = {name: "*" + t for name, t in sig.items()}
    consts = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, COMPUTE=compute)
    if kernel != "delta":
        consts.update(CAUSAL=causal, BLOCK_N=block_n, DOT=dot, PRECISION=precision)
    for name in fn.arg_names:
        if name not in signature and name not in consts:
            signature[name] = "i32" if name == "S" else "fp32"
    # every pointer divisible: torch allocations are 16-byte aligned
    return triton_compile(fn, signature, consts, list(sig), num_warps=num_warps,
                          num_stages=num_stages)
