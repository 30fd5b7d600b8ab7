"""Decode attention over a paged KV cache: one new query token per sequence, grouped-query
attention, K and V read through each sequence's block table; and the split-KV (Flash-Decoding)
version that spreads one sequence's context over several programs.

Shapes (one layer):

- ``q``: (B, Hq, D), the new token of each of B sequences;
- ``k_cache``, ``v_cache``: (num_blocks, block_size, Hkv, D), :class:`snippets.part8.kv_cache.
  PagedKVCache`'s storage; Hq is a multiple of Hkv, and query head h reads kv head h // (Hq/Hkv);
- ``block_tables``: (B, max_blocks) int32, row b listing sequence b's blocks in order;
- ``seq_lens``: (B,) int32, each in [1, max_blocks * block_size];
- output: (B, Hq, D) in q's dtype, ``o[b, h] = softmax(q[b, h] . K_b^T * scale) V_b``.

Versions of ``paged_decode_attention`` (never renumbered):

- v0  the library: gather every sequence's K and V out of the blocks into a padded (B, Hkv, L, D)
      tensor, then ``F.scaled_dot_product_attention`` with a length mask and ``enable_gqa``. What a
      framework without a paged kernel does: it moves the cache twice more than it must (a read
      and a write for the gather) before attention reads it.
- v1  Triton, this chapter's kernel: one program per (sequence, kv head). It loads the Hq/Hkv
      query heads that share the kv head as the rows of one tile, and walks the sequence's tokens
      in tiles of BLOCK_N, finding each token's row through the block table; every K and V byte is
      read once, by one program, and used by all the group's query heads. The online softmax of
      Part 5's FlashAttention, with a query tile of one token's heads instead of a block of tokens.
- v2  like v1, but the context of each sequence is split into ``num_splits`` chunks, one program
      per (sequence, kv head, chunk), each writing its partial output and log-sum-exp; a second
      kernel merges the chunks. For small batches, where v1 has too few programs to keep every SM
      reading (Flash-Decoding, Dao et al., 2023). Where the default count is one chunk, v2 is v1.

Versions of ``paged_decode_attention_fp8`` (the same cache stored in FP8 e4m3, one fp32 scale per
(block, kv head) for K and for V; see :func:`quantize_kv_blocks`):

- v0  the cache's values (dequantised) stored in bf16/fp16, read by v2 above: the bf16 cache.
- v1  v2's kernels reading the e4m3 cache: each K and V tile converted to q's type in registers,
      K's scales applied to the scores and V's to the probabilities, so no multiply per element.
      Half the bytes of v0 for the same values: the goal is close to 2x v0 at long contexts.

Cost model: decode attention must read K and V of every cached token, read q and write o; its
FLOPs are 4 * Hq * D per cached token (q.k and p*v). With one query row per head the FLOPs per
byte are 2 * (Hq / Hkv) / itemsize: 4 for Llama-3-8B's heads in bf16, far below any GPU's
balance point, so the metric is GB/s against the copy bandwidth. The block tables and lengths
(4 bytes per block and per sequence) are left out of the count.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from snippets._checks import (
    check_int,
    check_scalar,
    check_tensors,
    refuse_grad,
    triton_device,
    triton_interpreting,
)
from snippets.registry import Impl, Op, device_generator, register

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0                      # e4m3's largest finite value
HEAD_DIMS = (16, 32, 64, 128, 256)  # powers of two (tl.arange); tl.dot needs K >= 16
LOG2E = 1.4426950408889634          # exp2 in the kernels: e^x = 2^(x log2 e)
MAX_GRID_Y = 65535                   # CUDA's limit on gridDim.y and gridDim.z


# --8<-- [start:reference]
def paged_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, scale=None):
    """Decode attention as written on paper, one sequence at a time: gather its K and V through
    its block table, repeat each kv head for its Hq/Hkv query heads, softmax(q K^T * scale) V."""
    b, hq, d = q.shape
    page, hkv = k_cache.shape[1], k_cache.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.empty_like(q)
    for i in range(b):
        n = int(seq_lens[i])
        blocks = block_tables[i, :(n + page - 1) // page].long()
        k = k_cache[blocks].flatten(0, 1)[:n]                    # (n, Hkv, D)
        v = v_cache[blocks].flatten(0, 1)[:n]
        k = k.repeat_interleave(hq // hkv, dim=1).transpose(0, 1)   # (Hq, n, D)
        v = v.repeat_interleave(hq // hkv, dim=1).transpose(0, 1)
        scores = (k @ q[i][:, :, None])[:, :, 0] * scale          # (Hq, n)
        out[i] = (torch.softmax(scores, dim=-1)[:, None, :] @ v)[:, 0]
    return out
# --8<-- [end:reference]


# --------------------------------------------------------------------------------------------------
# Checks (before anything is launched)
# --------------------------------------------------------------------------------------------------

# --8<-- [start:checks]
def check_decode_inputs(name, q, k_cache, v_cache, block_tables, seq_lens, scale=None,
                        contents=True, kv_fp8=False) -> float:
    """Shapes, dtypes and devices of a decode-attention call, and (``contents``) the values that
    which memory a kernel reads: every length in [1, max_blocks * block_size], every block
    id a sequence uses in [0, num_blocks). Returns the softmax scale (1/sqrt(D) unless given).
    ``kv_fp8``: the cache is float8 e4m3 (its scales are checked by :func:`check_kv_scales`).

    The content checks read the tables back from the device: one synchronisation, which a serving
    loop pays once per step for all layers (the tables are the same in every layer), so the timed
    versions below leave it to their caller."""
    check_tensors(("q",), (q,), dtypes=DTYPES, device=triton_device(), allow_empty=False)
    check_tensors(("k_cache", "v_cache"), (k_cache, v_cache),
                  dtypes=(FP8,) if kv_fp8 else (q.dtype,), device=triton_device(),
                  allow_empty=False)
    check_tensors(("block_tables",), (block_tables,), dtypes=(torch.int32,),
                  device=triton_device(), allow_empty=False)
    check_tensors(("seq_lens",), (seq_lens,), dtypes=(torch.int32,), device=triton_device(),
                  allow_empty=False)
    if q.dim() != 3:
        raise ValueError(f"{name}: q must be 3-D (batch, q_heads, head_dim), got shape "
                         f"{tuple(q.shape)}")
    if k_cache.dim() != 4:
        raise ValueError(f"{name}: k_cache must be 4-D (num_blocks, block_size, kv_heads, "
                         f"head_dim), got shape {tuple(k_cache.shape)}")
    b, hq, d = q.shape
    num_blocks, page, hkv, dk = k_cache.shape
    if d not in HEAD_DIMS:
        raise ValueError(f"{name}: head_dim {d} is not supported; these kernels take {HEAD_DIMS}")
    if dk != d:
        raise ValueError(f"{name}: k_cache's head_dim is {dk} but q's is {d}")
    if hq % hkv:
        raise ValueError(f"{name}: q_heads ({hq}) must be a multiple of kv_heads ({hkv})")
    if block_tables.dim() != 2 or block_tables.shape[0] != b:
        raise ValueError(f"{name}: block_tables must be (batch={b}, max_blocks), got shape "
                         f"{tuple(block_tables.shape)}")
    if tuple(seq_lens.shape) != (b,):
        raise ValueError(f"{name}: seq_lens must have shape ({b},), got {tuple(seq_lens.shape)}")
    if b > MAX_GRID_Y:
        raise ValueError(f"{name}: batch {b} exceeds the {MAX_GRID_Y} programs of a grid's "
                         "second dimension")
    if contents:
        capacity = block_tables.shape[1] * page
        lo, hi = int(seq_lens.min()), int(seq_lens.max())
        if lo < 1 or hi > capacity:
            raise ValueError(f"{name}: seq_lens must be in [1, {capacity}] (max_blocks "
                             f"{block_tables.shape[1]} x block_size {page}), got [{lo}, {hi}]")
        used = (torch.arange(block_tables.shape[1], device=block_tables.device)[None, :]
                < (seq_lens[:, None] + page - 1) // page)
        bad = used & ((block_tables < 0) | (block_tables >= num_blocks))
        if bool(bad.any()):
            i, j = (int(x) for x in bad.nonzero()[0])
            raise ValueError(f"{name}: block_tables[{i}, {j}] = {int(block_tables[i, j])} is not "
                             f"a block of the cache (num_blocks = {num_blocks})")
    if scale is None:
        return 1.0 / math.sqrt(d)
    s = check_scalar(f"{name}: scale", scale)
    if not s > 0:
        raise ValueError(f"{name}: scale must be positive, got {scale}")
    return s
# --8<-- [end:checks]


# --------------------------------------------------------------------------------------------------
# v0: gather, then SDPA
# --------------------------------------------------------------------------------------------------

# --8<-- [start:library]
def gather_kv(k_cache, v_cache, block_tables):
    """K and V of every sequence copied into (B, Hkv, L, D) tensors, L = max_blocks * block_size
    (the table's capacity: no host sync to find the longest sequence)."""
    b, m = block_tables.shape
    page = k_cache.shape[1]
    rows = (block_tables.long()[:, :, None] * page
            + torch.arange(page, device=block_tables.device)).flatten(1)     # (B, L)
    k = k_cache.flatten(0, 1)[rows].transpose(1, 2)                          # (B, Hkv, L, D)
    v = v_cache.flatten(0, 1)[rows].transpose(1, 2)
    return k, v


def paged_attention_sdpa(q, k_cache, v_cache, block_tables, seq_lens):
    """v0: gather, then SDPA with a mask for each sequence's length, the kv heads broadcast to
    their query heads by ``enable_gqa``."""
    check_decode_inputs("paged_attention_sdpa", q, k_cache, v_cache, block_tables, seq_lens,
                        contents=False)
    k, v = gather_kv(k_cache, v_cache, block_tables)
    mask = (torch.arange(k.shape[2], device=q.device)[None, :] < seq_lens[:, None].long())
    o = F.scaled_dot_product_attention(q[:, :, None, :], k, v, attn_mask=mask[:, None, None, :],
                                       enable_gqa=True)
    return o[:, :, 0, :]
# --8<-- [end:library]


# --------------------------------------------------------------------------------------------------
# v1 and v2: Triton
# --------------------------------------------------------------------------------------------------

# --8<-- [start:pinned]
@triton.jit
def e4m3_to_f16_pinned(x):
    """e4m3 values to fp16 (exact: every e4m3 value is an fp16 value), four per asm block, in
    the layout x was loaded in. is_pure=False is the point: the compiler may not move this
    conversion, so it cannot change the tile's layout first, on the 8-bit values (for the second
    operand of P V it reads those back from shared memory one byte at a time), and convert after;
    the 16-bit tile it stores instead is read with ldmatrix's transpose. No interpreter runs PTX:
    the kernels use it on a GPU only (V_PINNED)."""
    return tl.inline_asm_elementwise(
        asm="{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; "
            "cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
        constraints="=r,=r,r", args=[x.to(tl.uint8, bitcast=True)], dtype=tl.float16,
        is_pure=False, pack=4)
# --8<-- [end:pinned]


# --8<-- [start:inner]
@triton.jit
def _attend_tokens(acc, l_i, m_i, q, k_ptr, v_ptr, table_ptr, kv_head, lo, hi, qk_scale,
                   ks_ptr, vs_ptr,
                   NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                   BLOCK_N: tl.constexpr, USE_DOT: tl.constexpr, PRECISION: tl.constexpr,
                   KV_FP8: tl.constexpr, V_PINNED: tl.constexpr):
    # Tokens lo .. hi - 1 of one sequence, BLOCK_N at a time, for the (GROUP_PAD, HEAD_DIM) tile q
    # of the query heads that share kv_head. Token t is row (table[t // PAGE] * PAGE + t % PAGE)
    # of the cache, and within it kv head kv_head: a gather of HEAD_DIM-long rows. KV_FP8: the
    # cache is e4m3, K and V tiles are converted to q's type in registers, and the scale of each
    # token's (block, kv head) multiplies its score (K's) and its probability (V's). V_PINNED: V's
    # tile is converted where it was loaded (e4m3_to_f16_pinned), not after the compiler's layout
    # change for the product.
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start in range(lo, hi, BLOCK_N):
        toks = start + offs_n
        valid = toks < hi
        block = tl.load(table_ptr + toks // PAGE, mask=valid, other=0)
        row = (block.to(tl.int64) * PAGE + toks % PAGE) * NUM_KV_HEADS + kv_head
        kv_offs = row[:, None] * HEAD_DIM + offs_d[None, :]                 # (BLOCK_N, HEAD_DIM)
        k = tl.load(k_ptr + kv_offs, mask=valid[:, None], other=0.0)
        if KV_FP8:
            k = k.to(q.dtype)
            scale_at = block * NUM_KV_HEADS + kv_head                      # (BLOCK_N,)
        if USE_DOT:   # tensor cores: (GROUP_PAD, D) x (D, BLOCK_N), fp32 sums
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        else:         # one row per head: multiply and add along D
            s = tl.sum(q[:, None, :].to(tl.float32) * k[None, :, :].to(tl.float32), axis=2)
        if KV_FP8:
            s = s * tl.load(ks_ptr + scale_at, mask=valid, other=0.0)[None, :]
        s = tl.where(valid[None, :], s * qk_scale, -float("inf"))         # log2 units
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)                                        # 0 on the first tile
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kv_offs, mask=valid[:, None], other=0.0)
        pv = p
        if KV_FP8:
            if V_PINNED:
                v = e4m3_to_f16_pinned(v).to(q.dtype)
            else:
                v = v.to(q.dtype)
            pv = p * tl.load(vs_ptr + scale_at, mask=valid, other=0.0)[None, :]
        if USE_DOT:
            acc = tl.dot(pv.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION,
                         out_dtype=tl.float32)
        else:
            acc = acc * alpha[:, None] + tl.sum(pv[:, :, None] * v[None, :, :].to(tl.float32),
                                                axis=1)
        m_i = m_new
    return acc, l_i, m_i
# --8<-- [end:inner]


# --8<-- [start:kernel]
@triton.jit
def _paged_decode_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, o_ptr, qk_scale,
                         stride_table, ks_ptr, vs_ptr, NUM_KV_HEADS: tl.constexpr,
                         GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                         PAGE: tl.constexpr, BLOCK_N: tl.constexpr, USE_DOT: tl.constexpr,
                         PRECISION: tl.constexpr, KV_FP8: tl.constexpr,
                         V_PINNED: tl.constexpr):
    # One program per (sequence, kv head): the GROUP query heads of the kv head are the rows of
    # one tile, so K and V are read once for all of them.
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + offs_g                    # query heads kv_head*GROUP .. + GROUP - 1
    q_offs = (seq * NUM_KV_HEADS * GROUP + heads)[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=offs_g[:, None] < GROUP, other=0.0)
    seq_len = tl.load(lens_ptr + seq)
    acc = tl.zeros((GROUP_PAD, HEAD_DIM), dtype=tl.float32)
    l_i = tl.zeros((GROUP_PAD,), dtype=tl.float32)
    m_i = tl.full((GROUP_PAD,), -float("inf"), dtype=tl.float32)
    acc, l_i, m_i = _attend_tokens(acc, l_i, m_i, q, k_ptr, v_ptr, tables_ptr + seq * stride_table,
                                   kv_head, 0, seq_len, qk_scale, ks_ptr, vs_ptr, NUM_KV_HEADS,
                                   HEAD_DIM, PAGE, BLOCK_N, USE_DOT, PRECISION, KV_FP8,
                                   V_PINNED)
    o = acc / l_i[:, None]                              # seq_len >= 1: l_i >= 1 on every row
    tl.store(o_ptr + q_offs, o.to(o_ptr.dtype.element_ty), mask=offs_g[:, None] < GROUP)
# --8<-- [end:kernel]


# --8<-- [start:split_kernels]
@triton.jit
def _paged_decode_split_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, part_o_ptr,
                               part_lse_ptr, qk_scale, stride_table, ks_ptr, vs_ptr,
                               NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
                               GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                               PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                               NUM_SPLITS: tl.constexpr, USE_DOT: tl.constexpr,
                               PRECISION: tl.constexpr, KV_FP8: tl.constexpr,
                               V_PINNED: tl.constexpr):
    # One program per (sequence, kv head, chunk). A sequence's chunks are ceil(len / NUM_SPLITS)
    # tokens rounded up to whole tiles, so a short sequence leaves its last chunks empty: they
    # write o = 0 and lse = -inf, which the merge weighs by 2^-inf = 0.
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + offs_g
    rows = seq * NUM_KV_HEADS * GROUP + heads           # (batch x query head) index
    q = tl.load(q_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :],
                mask=offs_g[:, None] < GROUP, other=0.0)
    seq_len = tl.load(lens_ptr + seq)
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, seq_len)
    acc = tl.zeros((GROUP_PAD, HEAD_DIM), dtype=tl.float32)
    l_i = tl.zeros((GROUP_PAD,), dtype=tl.float32)
    m_i = tl.full((GROUP_PAD,), -float("inf"), dtype=tl.float32)
    acc, l_i, m_i = _attend_tokens(acc, l_i, m_i, q, k_ptr, v_ptr, tables_ptr + seq * stride_table,
                                   kv_head, lo, hi, qk_scale, ks_ptr, vs_ptr, NUM_KV_HEADS,
                                   HEAD_DIM, PAGE, BLOCK_N, USE_DOT, PRECISION, KV_FP8,
                                   V_PINNED)
    has = l_i > 0
    o = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), -float("inf"))   # log2 units
    part = rows * NUM_SPLITS + split
    keep = offs_g < GROUP
    tl.store(part_o_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], o, mask=keep[:, None])
    tl.store(part_lse_ptr + part, lse, mask=keep)


@triton.jit
def _merge_splits_kernel(part_o_ptr, part_lse_ptr, o_ptr, NUM_SPLITS: tl.constexpr,
                         SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr):
    # One program per (sequence x query head): o = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M),
    # M the largest lse: each chunk's normalised output weighed by its share of the softmax sum.
    row = tl.program_id(0)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    in_range = offs_s < NUM_SPLITS
    lse = tl.load(part_lse_ptr + row * NUM_SPLITS + offs_s, mask=in_range, other=-float("inf"))
    o = tl.load(part_o_ptr + (row * NUM_SPLITS + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
                mask=in_range[:, None], other=0.0)
    w = tl.exp2(lse - tl.max(lse, axis=0))              # chunk 0 is never empty: max is finite
    out = tl.sum(w[:, None] * o, axis=0) / tl.sum(w, axis=0)
    tl.store(o_ptr + row * HEAD_DIM + offs_d, out.to(o_ptr.dtype.element_ty))
# --8<-- [end:split_kernels]


# --8<-- [start:launch]
# BLOCK_N tokens per tile: 64 rows of K (16 KiB in bf16 at D = 128) per load on the GPU, enough
# bytes in flight per program; 16 under the interpreter, so that small tests cross several tiles.
BLOCK_N_GPU, BLOCK_N_INTERPRET = 64, 16
NUM_WARPS = 4
# v2's chunks are at least this many tokens: a chunk's K and V must outweigh its partial output
# (GROUP x D fp32 written and read back), and the merge's cost grows with the number of chunks.
MIN_CHUNK = 256


def _launch_config(dtype: torch.dtype, group: int, use_dot: bool | None):
    """(USE_DOT, PRECISION, GROUP_PAD, BLOCK_N). tl.dot wants at least 16 rows, so with the dot the
    group's rows are padded to 16 (the extra rows cost FLOPs, not bytes); without it to the next
    power of two (tl.arange). The interpreter computes bf16 dots wrongly (NumPy has no bf16), so
    there bf16 takes the multiply-and-sum path."""
    if use_dot is None:
        use_dot = not (triton_interpreting() and dtype == torch.bfloat16)
    pad = triton.next_power_of_2(group)
    precision = "ieee" if dtype == torch.float32 else "tf32"   # fp32: no TF32 rounding of q, k
    block_n = BLOCK_N_INTERPRET if triton_interpreting() else BLOCK_N_GPU
    return use_dot, precision, max(pad, 16) if use_dot else pad, block_n


def default_splits(batch: int, kv_heads: int, capacity: int, device: torch.device) -> int:
    """v2's chunk count when none is given: enough (sequence, kv head, chunk) programs for two per
    SM, but no chunk shorter than MIN_CHUNK tokens of the table's capacity. The SM count is the
    device's own (torch's device properties); under the interpreter, 4 chunks."""
    if device.type != "cuda":
        return max(1, min(4, capacity // MIN_CHUNK))
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = triton.cdiv(2 * sms, batch * kv_heads)
    return max(1, min(want, capacity // MIN_CHUNK))
# --8<-- [end:launch]


# --8<-- [start:host]
def _consts(q, k_cache, use_dot, scales=None, pin_v=False):
    b, hq, d = q.shape
    page, hkv = k_cache.shape[1], k_cache.shape[2]
    dot, precision, group_pad, block_n = _launch_config(q.dtype, hq // hkv, use_dot)
    return dict(NUM_KV_HEADS=hkv, GROUP=hq // hkv, GROUP_PAD=group_pad, HEAD_DIM=d, PAGE=page,
                BLOCK_N=block_n, USE_DOT=dot, PRECISION=precision, KV_FP8=scales is not None,
                V_PINNED=pin_v and scales is not None and not triton_interpreting())


def _decode(q, k_cache, v_cache, block_tables, seq_lens, scale, use_dot=None, scales=None,
            pin_v=False):
    """v1 on checked inputs: one launch, grid (B, Hkv). ``scales``: (k_scale, v_scale) of an e4m3
    cache, or None; ``pin_v``: V's conversion pinned where it is loaded (on a GPU)."""
    b, hkv = q.shape[0], k_cache.shape[2]
    o = torch.empty_like(q)
    ks, vs = scales if scales is not None else (seq_lens, seq_lens)   # unread without KV_FP8
    _paged_decode_kernel[(b, hkv)](q, k_cache, v_cache, block_tables, seq_lens, o,
                                   scale * LOG2E, block_tables.stride(0), ks, vs,
                                   num_warps=NUM_WARPS,
                                   **_consts(q, k_cache, use_dot, scales, pin_v))
    return o


def _decode_split(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits, use_dot=None,
                  scales=None, pin_v=False):
    """v2 on checked inputs: the chunks (grid (B, Hkv, num_splits)), then the merge (B x Hq)."""
    b, hq, d = q.shape
    hkv = k_cache.shape[2]
    part_o = torch.empty((b, hq, num_splits, d), device=q.device, dtype=torch.float32)
    part_lse = torch.empty((b, hq, num_splits), device=q.device, dtype=torch.float32)
    ks, vs = scales if scales is not None else (seq_lens, seq_lens)
    _paged_decode_split_kernel[(b, hkv, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, part_o, part_lse, scale * LOG2E,
        block_tables.stride(0), ks, vs, NUM_SPLITS=num_splits, num_warps=NUM_WARPS,
        **_consts(q, k_cache, use_dot, scales, pin_v))
    o = torch.empty_like(q)
    _merge_splits_kernel[(b * hq,)](part_o, part_lse, o, NUM_SPLITS=num_splits,
                                    SPLITS_PAD=triton.next_power_of_2(num_splits), HEAD_DIM=d)
    return o


def paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale=None,
                           num_splits=1, use_dot=None):
    """Decode attention over a paged cache (shapes in the module docstring). ``num_splits`` 1 is
    v1; more is v2 with that many chunks per sequence, None lets :func:`default_splits` choose.
    ``use_dot`` forces the tensor-core path (True) or the multiply-and-sum path (False)."""
    refuse_grad("paged_decode_attention", q, k_cache, v_cache, instead="paged_attention_sdpa")
    scale = check_decode_inputs("paged_decode_attention", q, k_cache, v_cache, block_tables,
                                seq_lens, scale)
    if num_splits is None:
        num_splits = default_splits(q.shape[0], k_cache.shape[2],
                                    block_tables.shape[1] * k_cache.shape[1], q.device)
    check_int("paged_decode_attention: num_splits", num_splits, 1)
    if num_splits > MAX_GRID_Y:
        raise ValueError(f"paged_decode_attention: num_splits {num_splits} exceeds {MAX_GRID_Y}")
    if use_dot is not None and not isinstance(use_dot, bool):
        raise TypeError(f"paged_decode_attention: use_dot must be None or a bool, got {use_dot!r}")
    if num_splits == 1:
        return _decode(q, k_cache, v_cache, block_tables, seq_lens, scale, use_dot)
    return _decode_split(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits, use_dot)


def paged_attention_triton(q, k_cache, v_cache, block_tables, seq_lens):
    """v1, as the harness times it: the shape checks, not the content checks (see
    check_decode_inputs)."""
    refuse_grad("paged_attention_triton", q, k_cache, v_cache, instead="paged_attention_sdpa")
    scale = check_decode_inputs("paged_attention_triton", q, k_cache, v_cache, block_tables,
                                seq_lens, contents=False)
    return _decode(q, k_cache, v_cache, block_tables, seq_lens, scale)


def paged_attention_split(q, k_cache, v_cache, block_tables, seq_lens):
    """v2, as the harness times it, with the default chunk count; where that is one chunk (a
    batch large enough to fill the GPU), v1's single launch, since partial results and a merge
    would only add work."""
    refuse_grad("paged_attention_split", q, k_cache, v_cache, instead="paged_attention_sdpa")
    scale = check_decode_inputs("paged_attention_split", q, k_cache, v_cache, block_tables,
                                seq_lens, contents=False)
    splits = default_splits(q.shape[0], k_cache.shape[2],
                            block_tables.shape[1] * k_cache.shape[1], q.device)
    if splits == 1:
        return _decode(q, k_cache, v_cache, block_tables, seq_lens, scale)
    return _decode_split(q, k_cache, v_cache, block_tables, seq_lens, scale, splits)
# --8<-- [end:host]


# --------------------------------------------------------------------------------------------------
# An FP8 cache
# --------------------------------------------------------------------------------------------------

# --8<-- [start:fp8]
def quantize_kv_blocks(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A paged cache (num_blocks, block_size, Hkv, D) in e4m3 with one fp32 scale per (block, kv
    head): the block's largest magnitude in that head maps to e4m3's 448. A block belongs to the
    sequences whose tables list it, so a scale per block never mixes two sequences' ranges (even
    a block shared by a prefix is quantised once), and a block can be quantised when it fills."""
    if not isinstance(cache, torch.Tensor):
        raise TypeError(f"quantize_kv_blocks: cache must be a torch.Tensor, got "
                        f"{type(cache).__name__}")
    check_tensors(("cache",), (cache,), dtypes=DTYPES, device=cache.device.type,
                  allow_empty=False)
    if cache.dim() != 4:
        raise ValueError(f"quantize_kv_blocks: cache must be 4-D (num_blocks, block_size, "
                         f"kv_heads, head_dim), got shape {tuple(cache.shape)}")
    amax = cache.float().abs().amax(dim=(1, 3))                          # (num_blocks, Hkv)
    scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (cache.float() / scales[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scales


def dequantize_kv_blocks(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The values an e4m3 cache stands for, in fp32."""
    return q.float() * scales[:, None, :, None]


def check_kv_scales(name: str, k_cache: torch.Tensor, k_scale, v_scale) -> None:
    """One fp32 scale per (block, kv head) of the cache, for K and for V, on its device."""
    check_tensors(("k_scale", "v_scale"), (k_scale, v_scale), dtypes=(torch.float32,),
                  device=k_cache.device.type, allow_empty=False)
    want = (k_cache.shape[0], k_cache.shape[2])
    for arg, t in (("k_scale", k_scale), ("v_scale", v_scale)):
        if tuple(t.shape) != want or not t.is_contiguous():
            raise ValueError(f"{name}: {arg} must be a contiguous (num_blocks, kv_heads) = {want} "
                             f"tensor, got shape {tuple(t.shape)}")


def paged_decode_attention_fp8(q, k_cache, v_cache, k_scale, v_scale, block_tables, seq_lens,
                               scale=None, num_splits=None, use_dot=None, pin_v=False):
    """Decode attention over an e4m3 paged cache (:func:`quantize_kv_blocks`): the kernels of
    :func:`paged_decode_attention`, which convert each K and V tile to q's type in registers and
    apply the scales to the scores and the probabilities. ``num_splits`` None: the default count.
    ``pin_v`` (v2): V's tile converted where it is loaded (:func:`e4m3_to_f16_pinned`, on a GPU;
    the same values, so the same output as without)."""
    refuse_grad("paged_decode_attention_fp8", q, k_cache, v_cache, k_scale, v_scale,
                instead="paged_decode_attention on a dequantised cache")
    scale = check_decode_inputs("paged_decode_attention_fp8", q, k_cache, v_cache, block_tables,
                                seq_lens, scale, kv_fp8=True)
    check_kv_scales("paged_decode_attention_fp8", k_cache, k_scale, v_scale)
    if num_splits is None:
        num_splits = default_splits(q.shape[0], k_cache.shape[2],
                                    block_tables.shape[1] * k_cache.shape[1], q.device)
    check_int("paged_decode_attention_fp8: num_splits", num_splits, 1)
    if num_splits > MAX_GRID_Y:
        raise ValueError(f"paged_decode_attention_fp8: num_splits {num_splits} exceeds "
                         f"{MAX_GRID_Y}")
    if not isinstance(pin_v, bool):
        raise TypeError(f"paged_decode_attention_fp8: pin_v must be a bool, got {pin_v!r}")
    scales = (k_scale, v_scale)
    if num_splits == 1:
        return _decode(q, k_cache, v_cache, block_tables, seq_lens, scale, use_dot, scales, pin_v)
    return _decode_split(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits, use_dot,
                         scales, pin_v)
# --8<-- [end:fp8]


def fp8_cache_ref(q, k8, v8, k_scale, v_scale, block_tables, seq_lens, k_values, v_values):
    """What both versions of ``paged_decode_attention_fp8`` compute: attention over the values the
    e4m3 cache stands for (``k_values``, ``v_values``: those values in q's type, or float64 when
    the tests upcast)."""
    return paged_attention_ref(q, k_values, v_values, block_tables, seq_lens)


def decode_bf16_cache(q, k8, v8, k_scale, v_scale, block_tables, seq_lens, k_values, v_values):
    """v0: the same values stored in q's type (twice e4m3's bytes), read by v2's kernels."""
    refuse_grad("decode_bf16_cache", q, k8, v8, k_scale, v_scale, k_values, v_values,
                instead="paged_attention_sdpa on the values")
    return paged_attention_split(q, k_values, v_values, block_tables, seq_lens)


def decode_fp8_cache(q, k8, v8, k_scale, v_scale, block_tables, seq_lens, k_values, v_values,
                     pin_v=False):
    """v1: v2's kernels on the e4m3 cache, as the harness times them (shape checks only)."""
    name = "decode_fp8_cache_pinned" if pin_v else "decode_fp8_cache"
    refuse_grad(name, q, k8, v8, k_scale, v_scale, k_values, v_values,
                instead="paged_attention_sdpa on the values")
    scale = check_decode_inputs(name, q, k8, v8, block_tables, seq_lens, contents=False,
                                kv_fp8=True)
    check_kv_scales(name, k8, k_scale, v_scale)
    splits = default_splits(q.shape[0], k8.shape[2], block_tables.shape[1] * k8.shape[1],
                            q.device)
    if splits == 1:
        return _decode(q, k8, v8, block_tables, seq_lens, scale, scales=(k_scale, v_scale),
                       pin_v=pin_v)
    return _decode_split(q, k8, v8, block_tables, seq_lens, scale, splits,
                         scales=(k_scale, v_scale), pin_v=pin_v)


def decode_fp8_cache_pinned(q, k8, v8, k_scale, v_scale, block_tables, seq_lens, k_values,
                            v_values):
    """v2: v1 with V's conversion pinned where V is loaded (:func:`e4m3_to_f16_pinned`)."""
    return decode_fp8_cache(q, k8, v8, k_scale, v_scale, block_tables, seq_lens, k_values,
                            v_values, pin_v=True)


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def seq_lengths(size) -> list[int]:
    """The length of each sequence of a size: all ``ctx`` tokens, or with ``ragged`` evenly spread
    from 1 to ``ctx`` (a fixed pattern, so that the cost model knows the bytes)."""
    b, ctx = size["b"], size["ctx"]
    if size.get("ragged") and b > 1:
        return [1 + (ctx - 1) * i // (b - 1) for i in range(b)]
    return [ctx] * b


def _make_inputs(size, dtype, device, gen):
    """q, K and V ~ N(0, 1); every sequence's blocks are a random permutation of the cache's, so
    that no sequence's tokens are contiguous (the gather must work), with a few blocks to spare."""
    g = device_generator(gen, device)
    b, hq, hkv, d, page = size["b"], size["hq"], size["hkv"], size["d"], size["page"]
    lens = seq_lengths(size)
    per_seq = [-(-n // page) for n in lens]
    width = max(per_seq)
    num_blocks = sum(per_seq) + 2
    order = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    tables = torch.zeros(b, width, dtype=torch.int32)
    start = 0
    for i, n in enumerate(per_seq):
        tables[i, :n] = order[start:start + n]
        start += n
    q = torch.randn(b, hq, d, generator=g, device=device).to(dtype)
    k = torch.randn(num_blocks, page, hkv, d, generator=g, device=device).to(dtype)
    v = torch.randn(num_blocks, page, hkv, d, generator=g, device=device).to(dtype)
    return q, k, v, tables.to(device), torch.tensor(lens, dtype=torch.int32, device=device)


def _bytes(size, dtype) -> int:
    # read K and V of every cached token (Hkv heads of D); read q, write o (Hq heads of D)
    tokens = sum(seq_lengths(size))
    kv = 2 * tokens * size["hkv"] * size["d"]
    return (kv + 2 * size["b"] * size["hq"] * size["d"]) * dtype.itemsize


def _flops(size, dtype) -> int:
    # q.k and p*v: 2 D each per query head per cached token
    return 4 * sum(seq_lengths(size)) * size["hq"] * size["d"]


LLAMA_HEADS = {"hq": 32, "hkv": 8, "d": 128, "page": 16}   # Llama-3-8B's attention, vLLM's page
HEADLINE = {"b": 32, "ctx": 4096, **LLAMA_HEADS}
# batch 1 (one user: v1 has only Hkv = 8 programs), 8 and 64, context 1k to 32k tokens; at
# b = 64, ctx = 32768 the cache is 8 GiB per layer in bf16.
SWEEP = [{"b": b, "ctx": c, **LLAMA_HEADS} for b in (1, 8, 64) for c in (1024, 4096, 16384, 32768)]
SWEEP.insert(0, HEADLINE)
SWEEP.append({"b": 1, "ctx": 65536, **LLAMA_HEADS})   # one user, a long context: issue 22's goal
# Tiny, for the interpreter: GQA ratios 1, 4 and 8, ragged lengths (1 and non-multiples of the
# page), pages of 16 and 5 tokens, one sequence of one token.
TEST_SIZES = [{"b": 3, "ctx": 37, "hq": 4, "hkv": 1, "d": 16, "page": 16, "ragged": True},
              {"b": 2, "ctx": 21, "hq": 2, "hkv": 2, "d": 32, "page": 5},
              {"b": 4, "ctx": 40, "hq": 8, "hkv": 1, "d": 16, "page": 8, "ragged": True},
              {"b": 1, "ctx": 1, "hq": 4, "hkv": 2, "d": 16, "page": 16}]
# Against a float64 reference: q.k in fp32 from rounded inputs, P rounded to the input type for
# the p*v dot (fp16 2^-11, bf16 2^-8 relative), o rounded once more.
TOLERANCES = {torch.float32: (1e-4, 1e-5), torch.float16: (5e-3, 5e-3),
              torch.bfloat16: (3e-2, 3e-2)}
SOURCES = ("snippets/part8/decode_attention.py",)   # launch constants live beside the kernels

paged_decode = register(Op(
    name="paged_decode_attention", part=8, chapter="part8/decode-attention.md",
    title="Paged decode attention (GQA)", reference=paged_attention_ref, make_inputs=_make_inputs,
    bytes_moved=_bytes, flops=_flops, metric="GB/s", ceiling="copy", headline=HEADLINE,
    sweep=SWEEP, dtypes=DTYPES, bench_dtypes=(torch.bfloat16, torch.float16),
    test_sizes=TEST_SIZES, tolerances=TOLERANCES, sweep_axis="ctx"))
paged_decode.add(Impl("v0", paged_attention_sdpa, "PyTorch",
                      "gather K/V out of the blocks, then SDPA (mask, enable_gqa)",
                      (F.scaled_dot_product_attention, gather_kv, check_decode_inputs),
                      device="any", origin="library"))
paged_decode.add(Impl("v1", paged_attention_triton, "Triton",
                      "one program per (sequence, kv head), GQA group as one tile",
                      (_paged_decode_kernel, _attend_tokens, _decode, _consts, _launch_config,
                       check_decode_inputs, *SOURCES), device="any"))
paged_decode.add(Impl("v2", paged_attention_split, "Triton",
                      "split-KV: chunks of the context in parallel, then a merge",
                      (_paged_decode_split_kernel, _merge_splits_kernel, _attend_tokens,
                       _decode_split, _paged_decode_kernel, _decode, _consts, _launch_config,
                       default_splits,
                       check_decode_inputs, *SOURCES), device="any"))


def _make_fp8_inputs(size, dtype, device, gen):
    """v2's inputs with K and V quantised per (block, kv head), and the values they stand for in
    q's type (v0's cache, and what the reference reads)."""
    q, k, v, tables, lens = _make_inputs(size, dtype, device, gen)
    (k8, ks), (v8, vs) = quantize_kv_blocks(k), quantize_kv_blocks(v)
    kd = dequantize_kv_blocks(k8, ks).to(dtype)
    vd = dequantize_kv_blocks(v8, vs).to(dtype)
    return q, k8, v8, ks, vs, tables, lens, kd, vd


def _fp8_bytes(size, dtype) -> int:
    # the e4m3 cache (1 byte per value) and its scales (4 bytes per block and kv head, for K and
    # for V: counted as if every block were full), q read and o written in q's type
    tokens = sum(seq_lengths(size))
    blocks = sum(-(-n // size["page"]) for n in seq_lengths(size))
    return (2 * tokens * size["hkv"] * size["d"] + 2 * 4 * blocks * size["hkv"]
            + 2 * size["b"] * size["hq"] * size["d"] * dtype.itemsize)


# Long contexts, where the cache's bytes decide the step: batch 8 at 32768 tokens is a 512 MiB
# e4m3 cache per layer (1 GiB in bf16); batch 1 and 32 bracket it.
FP8_HEADLINE = {"b": 8, "ctx": 32768, **LLAMA_HEADS}
# Batch 32 at 65536 tokens is left out: the harness checks a version against the reference on
# every floating-point argument upcast to float64 (both caches and the values they stand for),
# eight times the e4m3 cache's bytes, which an 80 GB GPU does not hold beside them.
FP8_SWEEP = [FP8_HEADLINE] + [{"b": b, "ctx": c, **LLAMA_HEADS}
                              for b in (1, 8, 32) for c in (4096, 16384, 65536)
                              if b * c < 32 * 65536]

paged_decode_fp8 = register(Op(
    name="paged_decode_attention_fp8", part=8, chapter="part8/decode-attention.md",
    title="Paged decode attention over an FP8 cache", reference=fp8_cache_ref,
    make_inputs=_make_fp8_inputs, bytes_moved=_fp8_bytes, flops=_flops, metric="GB/s",
    ceiling="copy", headline=FP8_HEADLINE, sweep=FP8_SWEEP, dtypes=DTYPES,
    bench_dtypes=(torch.bfloat16,), test_sizes=TEST_SIZES, tolerances=TOLERANCES,
    sweep_axis="ctx"))
paged_decode_fp8.add(Impl("v0", decode_bf16_cache, "Triton",
                          "the same values stored in bf16, read by paged_decode_attention v2",
                          (paged_attention_split, _paged_decode_split_kernel, _merge_splits_kernel,
                           _attend_tokens, _decode_split, _paged_decode_kernel, _decode, _consts,
                           _launch_config, default_splits, check_decode_inputs, *SOURCES),
                          device="any"))
paged_decode_fp8.add(Impl("v1", decode_fp8_cache, "Triton",
                          "e4m3 cache: tiles converted in registers, scales on scores and P",
                          (_paged_decode_split_kernel, _merge_splits_kernel, _attend_tokens,
                           _decode_split, _paged_decode_kernel, _decode, _consts, _launch_config,
                           default_splits, check_decode_inputs, check_kv_scales,
                           quantize_kv_blocks, *SOURCES), device="any"))
paged_decode_fp8.add(Impl("v2", decode_fp8_cache_pinned, "Triton",
                          "like v1, V converted where it is loaded (inline PTX, not movable)",
                          (decode_fp8_cache, e4m3_to_f16_pinned, _paged_decode_split_kernel,
                           _merge_splits_kernel, _attend_tokens, _decode_split,
                           _paged_decode_kernel, _decode, _consts, _launch_config, default_splits,
                           check_decode_inputs, check_kv_scales, quantize_kv_blocks, *SOURCES),
                          device="any"))
