"""Decode attention over an FP8 (e4m3) paged cache, its launch tuned for the cache's bytes:
``paged_decode_attention_fp8`` v3 (v0 to v2 are in :mod:`snippets.part8.decode_attention`; numbers
are never reused).

v2 reads the e4m3 cache with the bf16 cache's launch: tiles of 64 tokens, four warps, the chunk
count of :func:`default_splits`. A 64-token tile of e4m3 K and V is half the bytes of the same tile
in bf16, so each program has half the bytes in flight, in a kernel that spends most of its time
waiting on memory. The experiments of the chapter found the launch, not the conversions, deciding
v2's speed. v3 is v2's arithmetic (K converted to q's type by the compiler, V converted where it is
loaded with the pinned PTX, K's scales on the scores, V's on the probabilities, the product
accumulated by the dot) with:

- the launch chosen per shape by Triton's autotuner among tiles of 64 tokens on two or four warps
  and of 128 tokens on four: a 128-token tile restores the bf16 tile's bytes per load, and two warps
  let more programs share an SM when the grid is large (a grid that does not fit the GPU in one wave
  pays a tail);
- one kernel for one chunk or several: with one chunk it writes the output itself, with several it
  writes each chunk's output and log-sum-exp and a second kernel merges them.

fp32 queries go to v2 (its fp32 products are the IEEE path). Under the interpreter, bf16 takes the
multiply-and-sum path instead of the dot (NumPy has no bf16 products), as v2 does.
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

# --8<-- [start:launch]
# The launches the autotuner tries, keyed on the grid's shape (batch, kv heads, chunks) and the
# table's width: tiles of 64 tokens on two or four warps, and of 128 tokens (an e4m3 tile of 128
# tokens is the bytes of a bf16 tile of 64) on four (on two, that tile spills registers); three
# stages. Under the interpreter one launch, 16-token tiles, so that small tests cross several tiles.
LAUNCHES = [triton.Config({"BLOCK_N": n}, num_warps=w, num_stages=3)
            for n, w in ((64, 2), (64, 4), (128, 4))]
INTERPRET_LAUNCH = [triton.Config({"BLOCK_N": 16}, num_warps=4, num_stages=1)]
# --8<-- [end:launch]


# --8<-- [start:kernel]
@triton.jit
def _decode_fp8_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, tables_ptr, lens_ptr, o_ptr,
                       part_o_ptr, part_lse_ptr, qk_scale, stride_table, batch, table_width,
                       NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
                       GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                       NUM_SPLITS: tl.constexpr, USE_DOT: tl.constexpr, PINNED: tl.constexpr,
                       BLOCK_N: tl.constexpr):
    # One program per (sequence, kv head, chunk); the GROUP query heads of the kv head are the
    # rows of one tile. qk_scale is the softmax scale times log2(e) (exp2 below). batch and
    # table_width are read by the autotuner's key only.
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    keep = offs_g < GROUP
    rows = seq * NUM_KV_HEADS * GROUP + kv_head * GROUP + offs_g   # (batch x query head) index
    q = tl.load(q_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=keep[:, None], other=0.0)
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
        k = tl.load(k_ptr + kv_offs, mask=valid[:, None], other=0.0).to(q.dtype)
        if USE_DOT:   # tensor cores: (GROUP_PAD, D) x (D, BLOCK_N), fp32 sums
            s = tl.dot(q, tl.trans(k))
        else:         # one row per head: multiply and add along D
            s = tl.sum(q[:, None, :].to(tl.float32) * k[None, :, :].to(tl.float32), axis=2)
        s = s * tl.load(ks_ptr + scale_at, mask=valid, other=0.0)[None, :]
        s = tl.where(valid[None, :], s * qk_scale, -float("inf"))         # log2 units
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)                                        # 0 on the first tile
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kv_offs, mask=valid[:, None], other=0.0)
        if PINNED:    # converted where it is loaded: the tile in shared memory is 16-bit
            v = e4m3_to_f16_pinned(v).to(q.dtype)
        else:
            v = v.to(q.dtype)
        pv = p * tl.load(vs_ptr + scale_at, mask=valid, other=0.0)[None, :]
        if USE_DOT:
            acc = tl.dot(pv.to(v.dtype), v, acc * alpha[:, None])
        else:
            acc = acc * alpha[:, None] + tl.sum(pv[:, :, None] * v[None, :, :].to(tl.float32),
                                                axis=1)
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


_TUNED = {}


def tuned_kernel():
    """The kernel under the autotuner (built once per process; under the interpreter with its one
    launch). Key: the grid's shape and the table's width."""
    interpreting = triton_interpreting()
    if interpreting not in _TUNED:
        _TUNED[interpreting] = triton.autotune(
            configs=INTERPRET_LAUNCH if interpreting else LAUNCHES,
            key=["batch", "table_width", "NUM_KV_HEADS", "GROUP", "HEAD_DIM", "NUM_SPLITS"],
        )(_decode_fp8_kernel)
    return _TUNED[interpreting]


def decode_fp8(q, k8, v8, k_scale, v_scale, block_tables, seq_lens, scale, num_splits,
               kernel=None):
    """v3 on checked inputs (q bf16 or fp16): grid (B, Hkv, num_splits), then the merge when
    num_splits > 1. ``kernel``: the launch to use (None: :func:`tuned_kernel`)."""
    b, hq, d = q.shape
    page, hkv = k8.shape[1], k8.shape[2]
    group = hq // hkv
    use_dot = not (triton_interpreting() and q.dtype == torch.bfloat16)
    o = torch.empty_like(q)
    parts = num_splits > 1
    part_o = torch.empty((b, hq, num_splits, d) if parts else (1,), device=q.device,
                         dtype=torch.float32)
    part_lse = torch.empty((b, hq, num_splits) if parts else (1,), device=q.device,
                           dtype=torch.float32)
    (kernel or tuned_kernel())[(b, hkv, num_splits)](
        q, k8, v8, k_scale, v_scale, block_tables, seq_lens, o, part_o, part_lse,
        scale * LOG2E, block_tables.stride(0), b, block_tables.shape[1], NUM_KV_HEADS=hkv,
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)) if use_dot
        else triton.next_power_of_2(group), HEAD_DIM=d, PAGE=page, NUM_SPLITS=num_splits,
        USE_DOT=use_dot, PINNED=not triton_interpreting())
    if parts:
        _merge_kernel[(b * hq,)](part_o, part_lse, o, NUM_SPLITS=num_splits,
                                 SPLITS_PAD=triton.next_power_of_2(num_splits), HEAD_DIM=d)
    return o


# --8<-- [start:host]
def paged_decode_attention_fp8_tuned(q, k_cache, v_cache, k_scale, v_scale, block_tables,
                                     seq_lens, scale=None, num_splits=None):
    """Decode attention over an e4m3 paged cache (:func:`quantize_kv_blocks`), v3: the arithmetic of
    :func:`paged_decode_attention_fp8` with V pinned (v2), the launch tuned per shape. q bf16 or
    fp16 (fp32 q goes to v2). ``num_splits`` None: the default count of :func:`default_splits`."""
    name = "paged_decode_attention_fp8_tuned"
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
    return decode_fp8(q, k_cache, v_cache, k_scale, v_scale, block_tables, seq_lens, scale,
                      num_splits)


def decode_fp8_cache_tuned(q, k8, v8, k_scale, v_scale, block_tables, seq_lens, k_values,
                           v_values):
    """v3, as the harness times it (shape checks only, v2's default chunk count)."""
    name = "decode_fp8_cache_tuned"
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
    return decode_fp8(q, k8, v8, k_scale, v_scale, block_tables, seq_lens, scale, splits)
# --8<-- [end:host]


paged_decode_fp8.add(Impl("v3", decode_fp8_cache_tuned, "Triton",
                          "like v2, launch autotuned per shape (64/128-token tiles, 2/4 warps)",
                          (_decode_fp8_kernel, _merge_kernel, tuned_kernel, decode_fp8,
                           e4m3_to_f16_pinned, default_splits, check_decode_inputs,
                           check_kv_scales, quantize_kv_blocks, decode_fp8_cache_pinned,
                           "snippets/part8/decode_fp8.py"), device="any"))
