"""Decode attention over an FP8 (e4m3) paged cache with fp16 products:
``paged_decode_attention_fp8`` v3 (v0 to v2 are in :mod:`snippets.part8.decode_attention`; numbers
are never reused).

v1 and v2 convert every e4m3 element of K and V to q's type, bf16. sm_90 has no instruction from
e4m3 to bf16: each pair goes to fp16 (``cvt.rn.f16x2.e4m3x2``, one instruction for two values), and
then each value to bf16 (one more instruction per value). Three conversions for every two bytes of
the cache, and conversions issue at a fraction of the rate of fp32 or integer instructions (the
CUDA programming guide's throughput table).

v3 stops at fp16. Every e4m3 value is an fp16 value, so the first step is exact and the second is
not needed, if the products take fp16 operands:

- q (bf16) is brought into fp16's range by a power of two chosen from its largest magnitude, once
  per program: the tile's largest value lands in [2^14, 2^15), every bf16 significand fits in
  fp16's, so the scaled q is exact (values more than 2^28 below the largest lose bits to fp16's
  subnormals). The power's inverse joins the softmax scale on the scores.
- P (probabilities in [0, 1]) times V's per-token scale would leave fp16's range for small scales,
  so a tile's tokens are weighed by their scale *relative to the tile's largest*, a factor in [0,
  1], and the tile's product is multiplied by that largest scale in fp32 as it joins the sum.
- K and V tiles are converted where they are loaded (:func:`e4m3_to_f16_pinned`, on a GPU), so the
  tiles that go through shared memory for the products are 16-bit (v2's finding).

fp32 queries keep v2 (fp16 products would round them more than fp32's tolerance allows).

One kernel serves one chunk or several: with one chunk it writes the output itself; with several it
writes each chunk's output and log-sum-exp, and a second kernel merges them, as v2 does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from snippets._checks import check_int, refuse_grad, triton_interpreting
from snippets.part8.decode_attention import (
    LOG2E,
    MAX_GRID_Y,
    check_decode_inputs,
    check_kv_scales,
    decode_fp8_cache_pinned,
    default_splits,
    e4m3_to_f16_pinned,
    paged_decode_attention_fp8,
    paged_decode_fp8,
    quantize_kv_blocks,
)
from snippets.registry import Impl


# --8<-- [start:q_to_f16]
@triton.jit
def q_to_f16(q):
    """q (any float tile) as fp16 times a power of two, and that power's inverse (fp32 scalar). The
    power puts the tile's largest magnitude in [2^14, 2^15): bf16 values, whose 8-bit significands
    fit fp16's 11, convert exactly. Built from exponent bits, so the power and its inverse are
    exact: with amax's biased exponent e (clamped to [15, 254], zero and tiny q included), the
    power is 2^(141 - e) (bits (268 - e) << 23) and its inverse 2^(e - 141) (bits (e - 14) << 23).
    """
    q = q.to(tl.float32)
    amax = tl.max(tl.max(tl.abs(q), axis=1), axis=0)
    e = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
    e = tl.minimum(tl.maximum(e, 15), 254)
    up = ((268 - e) << 23).to(tl.float32, bitcast=True)
    down = ((e - 14) << 23).to(tl.float32, bitcast=True)
    return (q * up).to(tl.float16), down
# --8<-- [end:q_to_f16]


@triton.jit
def _to_f16(x, PINNED: tl.constexpr):
    # e4m3 tile to fp16: the pinned PTX on a GPU, Triton's conversion under the interpreter
    if PINNED:
        return e4m3_to_f16_pinned(x)
    else:
        return x.to(tl.float16)


# --8<-- [start:kernel]
@triton.jit
def _decode_fp8_f16_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, tables_ptr, lens_ptr, o_ptr,
                           part_o_ptr, part_lse_ptr, qk_scale, stride_table,
                           NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
                           GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                           BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
                           SCALE_Q: tl.constexpr, PINNED: tl.constexpr):
    # One program per (sequence, kv head, chunk); the GROUP query heads of the kv head are the
    # rows of one tile. qk_scale is the softmax scale times log2(e) (exp2 below).
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    keep = offs_g < GROUP
    rows = seq * NUM_KV_HEADS * GROUP + kv_head * GROUP + offs_g   # (batch x query head) index
    q = tl.load(q_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=keep[:, None], other=0.0)
    if SCALE_Q:
        q16, down = q_to_f16(q)
        qk = qk_scale * down                # the inverse power joins the softmax scale
    else:
        q16 = q.to(tl.float16)
        qk = qk_scale
    seq_len = tl.load(lens_ptr + seq)
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, seq_len)
    table_ptr = tables_ptr + seq * stride_table
    acc = tl.zeros((GROUP_PAD, HEAD_DIM), dtype=tl.float32)
    l_i = tl.zeros((GROUP_PAD,), dtype=tl.float32)
    m_i = tl.full((GROUP_PAD,), -float("inf"), dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        toks = start + offs_n
        valid = toks < hi
        block = tl.load(table_ptr + toks // PAGE, mask=valid, other=0)
        row = (block.to(tl.int64) * PAGE + toks % PAGE) * NUM_KV_HEADS + kv_head
        kv_offs = row[:, None] * HEAD_DIM + offs_d[None, :]                 # (BLOCK_N, HEAD_DIM)
        scale_at = block * NUM_KV_HEADS + kv_head                           # (BLOCK_N,)
        k = _to_f16(tl.load(k_ptr + kv_offs, mask=valid[:, None], other=0.0), PINNED)
        s = tl.dot(q16, tl.trans(k))                                        # fp16 in, fp32 sums
        ks = tl.load(ks_ptr + scale_at, mask=valid, other=0.0)
        s = tl.where(valid[None, :], s * (ks * qk)[None, :], -float("inf"))   # log2 units
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)                                        # 0 on the first tile
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = _to_f16(tl.load(v_ptr + kv_offs, mask=valid[:, None], other=0.0), PINNED)
        vs = tl.load(vs_ptr + scale_at, mask=valid, other=0.0)
        top = tl.max(tl.abs(vs), axis=0)
        top = tl.where(top > 0, top, 1.0)
        pv = (p * (vs / top)[None, :]).to(tl.float16)        # weights in [-1, 1]: fp16's range
        acc = acc * alpha[:, None] + tl.dot(pv, v) * top
        m_i = m_new
    if NUM_SPLITS == 1:     # the whole sequence: seq_len >= 1, so l_i >= 1 on every row
        o = acc / l_i[:, None]
        tl.store(o_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :],
                 o.to(o_ptr.dtype.element_ty), mask=keep[:, None])
    else:                   # an empty chunk writes o = 0 and lse = -inf (weight 0 in the merge)
        has = l_i > 0
        o = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), -float("inf"))
        part = rows * NUM_SPLITS + split
        tl.store(part_o_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], o, mask=keep[:, None])
        tl.store(part_lse_ptr + part, lse, mask=keep)


@triton.jit
def _merge_kernel(part_o_ptr, part_lse_ptr, o_ptr, NUM_SPLITS: tl.constexpr,
                  SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr):
    # One program per (sequence x query head): each chunk's output weighed by 2^(lse - max lse).
    row = tl.program_id(0)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    live = offs_s < NUM_SPLITS
    lse = tl.load(part_lse_ptr + row * NUM_SPLITS + offs_s, mask=live, other=-float("inf"))
    o = tl.load(part_o_ptr + (row * NUM_SPLITS + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
                mask=live[:, None], other=0.0)
    w = tl.exp2(lse - tl.max(lse, axis=0))              # chunk 0 is never empty
    tl.store(o_ptr + row * HEAD_DIM + offs_d,
             (tl.sum(w[:, None] * o, axis=0) / tl.sum(w, axis=0)).to(o_ptr.dtype.element_ty))
# --8<-- [end:kernel]


# --8<-- [start:launch]
# Tokens per tile on a GPU (under the interpreter 16, so that small tests cross several tiles),
# warps and pipeline stages: chosen by a sweep on the H200 at the op's sizes (the chapter says how).
BLOCK_N_GPU, BLOCK_N_INTERPRET = 64, 16
NUM_WARPS, NUM_STAGES = 4, 3


def decode_f16(q, k8, v8, k_scale, v_scale, block_tables, seq_lens, scale, num_splits,
               block_n=None, num_warps=NUM_WARPS, num_stages=NUM_STAGES):
    """v3 on checked inputs (q bf16 or fp16): grid (B, Hkv, num_splits), then the merge when
    num_splits > 1. ``block_n``, ``num_warps``, ``num_stages``: the launch (None: the defaults)."""
    b, hq, d = q.shape
    page, hkv = k8.shape[1], k8.shape[2]
    group = hq // hkv
    if block_n is None:
        block_n = BLOCK_N_INTERPRET if triton_interpreting() else BLOCK_N_GPU
    o = torch.empty_like(q)
    parts = num_splits > 1
    part_o = torch.empty((b, hq, num_splits, d) if parts else (1,), device=q.device,
                         dtype=torch.float32)
    part_lse = torch.empty((b, hq, num_splits) if parts else (1,), device=q.device,
                           dtype=torch.float32)
    _decode_fp8_f16_kernel[(b, hkv, num_splits)](
        q, k8, v8, k_scale, v_scale, block_tables, seq_lens, o, part_o, part_lse,
        scale * LOG2E, block_tables.stride(0), NUM_KV_HEADS=hkv, GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=d, PAGE=page,
        BLOCK_N=block_n, NUM_SPLITS=num_splits, SCALE_Q=q.dtype != torch.float16,
        PINNED=not triton_interpreting(), num_warps=num_warps, num_stages=num_stages)
    if parts:
        _merge_kernel[(b * hq,)](part_o, part_lse, o, NUM_SPLITS=num_splits,
                                 SPLITS_PAD=triton.next_power_of_2(num_splits), HEAD_DIM=d)
    return o
# --8<-- [end:launch]


# --8<-- [start:host]
def paged_decode_attention_fp8_f16(q, k_cache, v_cache, k_scale, v_scale, block_tables,
                                   seq_lens, scale=None, num_splits=None):
    """Decode attention over an e4m3 paged cache (:func:`quantize_kv_blocks`) with fp16 products:
    the same values as :func:`paged_decode_attention_fp8`, in fewer conversions. q bf16 or fp16
    (fp32 q goes to ``paged_decode_attention_fp8`` with V pinned, v2). ``num_splits`` None: the
    default count of :func:`default_splits`."""
    name = "paged_decode_attention_fp8_f16"
    refuse_grad(name, q, k_cache, v_cache, k_scale, v_scale,
                instead="paged_decode_attention on a dequantised cache")
    scale = check_decode_inputs(name, q, k_cache, v_cache, block_tables, seq_lens, scale,
                                kv_fp8=True)
    check_kv_scales(name, k_cache, k_scale, v_scale)
    if num_splits is None:
        num_splits = default_splits(q.shape[0], k_cache.shape[2],
                                    block_tables.shape[1] * k_cache.shape[1], q.device)
    check_int(f"{name}: num_splits", num_splits, 1)
    if num_splits > MAX_GRID_Y:
        raise ValueError(f"{name}: num_splits {num_splits} exceeds {MAX_GRID_Y}")
    if q.dtype == torch.float32:
        return paged_decode_attention_fp8(q, k_cache, v_cache, k_scale, v_scale, block_tables,
                                          seq_lens, scale, num_splits, pin_v=True)
    return decode_f16(q, k_cache, v_cache, k_scale, v_scale, block_tables, seq_lens, scale,
                      num_splits)


def decode_fp8_cache_f16(q, k8, v8, k_scale, v_scale, block_tables, seq_lens, k_values,
                         v_values):
    """v3, as the harness times it (shape checks only, v2's default chunk count)."""
    name = "decode_fp8_cache_f16"
    refuse_grad(name, q, k8, v8, k_scale, v_scale, k_values, v_values,
                instead="paged_attention_sdpa on the values")
    if q.dtype == torch.float32:
        return decode_fp8_cache_pinned(q, k8, v8, k_scale, v_scale, block_tables, seq_lens,
                                       k_values, v_values)
    scale = check_decode_inputs(name, q, k8, v8, block_tables, seq_lens, contents=False,
                                kv_fp8=True)
    check_kv_scales(name, k8, k_scale, v_scale)
    splits = default_splits(q.shape[0], k8.shape[2], block_tables.shape[1] * k8.shape[1],
                            q.device)
    return decode_f16(q, k8, v8, k_scale, v_scale, block_tables, seq_lens, scale, splits)
# --8<-- [end:host]


paged_decode_fp8.add(Impl("v3", decode_fp8_cache_f16, "Triton",
                          "e4m3 to fp16 in one step, fp16 products (q scaled by a power of two)",
                          (_decode_fp8_f16_kernel, _merge_kernel, q_to_f16, _to_f16, decode_f16,
                           e4m3_to_f16_pinned, default_splits, check_decode_inputs,
                           check_kv_scales, quantize_kv_blocks, decode_fp8_cache_pinned,
                           "snippets/part8/decode_fp8.py"), device="any"))
