"""Part 8, the capstone's decode step v5: v3's graphed step with fewer, larger kernels.

The Nsight Systems timeline of v3 (capstone.md) shows a step of hundreds of short kernels: per
layer three small projections where one would do, RoPE, then the cache write as a chain of small
PyTorch index kernels, two products for the MLP's gate and up halves, and SwiGLU. The GEMV
chapter's sweep (``decode_gemv``) shows why the count matters: a projection of a few MB runs far
below the memory bandwidth, one of tens of MB near it. v5 changes only the plan, not the
arithmetic of any operation:

- **One product for q, k and v.** The three weights of a layer, stacked into one
  (H + 2 H_kv) D x dim matrix, read by one GEMV; likewise the MLP's gate and up weights, stacked
  into one 2 F x dim matrix. The stacked copies are made once per model (:func:`stack_weights`);
  a server would store its weights stacked and keep no other copy.
- **RoPE and the cache write in one kernel** (:func:`rope_append`): the kernel reads the row of the
  stacked product, rotates q and k with the table row at the device's position, writes q for the
  attention and k and v straight into their slot of the paged cache (the block from the sequence's
  table, the offset in the block): no index tensors, no host value.
- **SwiGLU from the stacked product** (:func:`swiglu_stacked`): gate and up are the two halves of
  each row, read in place.

Everything else is v3's: the book's RMSNorm and split-KV decode attention, cuBLAS for the other
products, one CUDA graph for the whole step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from snippets._checks import check_tensors, refuse_grad, triton_device
from snippets.part8.capstone import (
    BLOCK_SIZE,
    StaticDecoder,
    capstone_decode,
    check_timed_call,
    graphed_step,
    needs_cuda_graphs,
)
from snippets.registry import Impl

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# --8<-- [start:stack]
def stack_weights(model) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, (W_qkv, W_gu): wq, wk and wv stacked by rows into one (H + 2 H_kv) D x dim
    matrix, wg and wu into one 2 F x dim matrix. ``x @ W_qkv.T`` is q, k and v side by side in each
    row; ``x @ W_gu.T`` is gate then up. New storage: the model's own weights are left as they
    are."""
    return [(torch.cat([layer.wq, layer.wk, layer.wv]), torch.cat([layer.wg, layer.wu]))
            for layer in model.layers]
# --8<-- [end:stack]


# --8<-- [start:rope_append_kernel]
@triton.jit
def _rope_append_kernel(qkv_ptr, cos_ptr, sin_ptr, pos_ptr, tables_ptr, q_ptr, kc_ptr, vc_ptr,
                        stride_row, stride_table, n_pages, n_angles, H, H_KV,
                        PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                        BLOCK_HKV: tl.constexpr, BLOCK_HALF: tl.constexpr):
    b = tl.program_id(0)                       # one program per sequence: one new token each
    HALF: tl.constexpr = HEAD_DIM // 2
    pos = tl.load(pos_ptr)                     # the position, read on the device
    # a position past the table or the angles writes nothing (the decoder refuses it on the host
    # first; this keeps a caller that does not from writing out of bounds)
    ok = (pos >= 0) & (pos < n_pages * PAGE) & (pos < n_angles)
    pos = tl.where(ok, pos, 0)
    page = tl.load(tables_ptr + b * stride_table + pos // PAGE).to(tl.int64)
    slot = page * PAGE + pos % PAGE            # the row of the (pages * PAGE, H_kv, D) cache
    cols = tl.arange(0, BLOCK_HALF)
    col_ok = cols < HALF
    row = qkv_ptr + b.to(tl.int64) * stride_row
    hq = tl.arange(0, BLOCK_H)
    hk = tl.arange(0, BLOCK_HKV)
    mq = (hq < H)[:, None] & col_ok[None, :]
    mk = (hk < H_KV)[:, None] & col_ok[None, :]
    q_off = hq[:, None] * HEAD_DIM + cols[None, :]                 # q: columns 0 .. H D
    k_off = H * HEAD_DIM + hk[:, None] * HEAD_DIM + cols[None, :]  # then k: H_kv D columns
    v_off = k_off + H_KV * HEAD_DIM                                # then v
    # every load before any store (a store could alias a later load, for all the compiler knows)
    q1 = tl.load(row + q_off, mask=mq, other=0.0).to(tl.float32)
    q2 = tl.load(row + q_off + HALF, mask=mq, other=0.0).to(tl.float32)
    k1 = tl.load(row + k_off, mask=mk, other=0.0).to(tl.float32)
    k2 = tl.load(row + k_off + HALF, mask=mk, other=0.0).to(tl.float32)
    v1 = tl.load(row + v_off, mask=mk, other=0.0)
    v2 = tl.load(row + v_off + HALF, mask=mk, other=0.0)
    c1 = tl.load(cos_ptr + pos * HEAD_DIM + cols, mask=col_ok, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + pos * HEAD_DIM + HALF + cols, mask=col_ok, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + pos * HEAD_DIM + cols, mask=col_ok, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + pos * HEAD_DIM + HALF + cols, mask=col_ok, other=0.0).to(tl.float32)
    # y = x cos + rotate_half(x) sin, per half: (x1 c1 - x2 s1, x2 c2 + x1 s2), rounded once
    q_out = q_ptr + b.to(tl.int64) * H * HEAD_DIM + q_off
    tl.store(q_out, (q1 * c1[None, :] - q2 * s1[None, :]).to(q_ptr.dtype.element_ty), mask=mq)
    tl.store(q_out + HALF, (q2 * c2[None, :] + q1 * s2[None, :]).to(q_ptr.dtype.element_ty),
             mask=mq)
    cache = slot * H_KV * HEAD_DIM + hk[:, None] * HEAD_DIM + cols[None, :]
    mk = (hk < tl.where(ok, H_KV, 0))[:, None] & col_ok[None, :]   # no head at a bad position
    tl.store(kc_ptr + cache, (k1 * c1[None, :] - k2 * s1[None, :]).to(kc_ptr.dtype.element_ty),
             mask=mk)
    tl.store(kc_ptr + cache + HALF,
             (k2 * c2[None, :] + k1 * s2[None, :]).to(kc_ptr.dtype.element_ty), mask=mk)
    tl.store(vc_ptr + cache, v1, mask=mk)
    tl.store(vc_ptr + cache + HALF, v2, mask=mk)
# --8<-- [end:rope_append_kernel]


# --8<-- [start:rope_append]
def rope_append(qkv, cos, sin, pos, k_cache, v_cache, tables, n_heads: int, n_kv_heads: int):
    """q rotated (B, H, D), returned; k rotated and v written into the paged cache at position
    ``pos`` (a one-element int64 device tensor: read on the device, as a CUDA graph needs), in
    the block ``tables[b, pos // PAGE]`` of each sequence b. ``qkv`` (B, 1, (H + 2 H_kv) D) or
    (B, (H + 2 H_kv) D) is the stacked product's output, rows contiguous; ``cos`` and ``sin``
    (positions, D) are the model's tables; ``k_cache`` and ``v_cache`` (pages, PAGE, H_kv, D) one
    layer's cache. A position past the table or the angles writes nothing: the caller (the
    decoder) refuses it on the host, where it knows the position."""
    name = "rope_append"
    check_tensors(("qkv", "cos", "sin", "k_cache", "v_cache"), (qkv, cos, sin, k_cache, v_cache),
                  dtypes=DTYPES, device=triton_device(), same_shape=False)
    refuse_grad(name, qkv, cos, sin, instead="StaticDecoder.step")
    for label, t, dtype in (("pos", pos, torch.int64), ("tables", tables, torch.int32)):
        if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.device != qkv.device:
            raise TypeError(f"{name}: {label} must be a {dtype} tensor on {qkv.device}, got "
                            f"{getattr(t, 'dtype', type(t).__name__)}")
    if pos.numel() != 1:
        raise ValueError(f"{name}: pos must hold one position, got shape {tuple(pos.shape)}")
    h, hkv = int(n_heads), int(n_kv_heads)
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.shape[2] != hkv:
        raise ValueError(f"{name}: k_cache and v_cache must be (pages, page, {hkv}, D) alike, got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    _, page, _, d = k_cache.shape
    if page != BLOCK_SIZE or d % 2 or h % hkv:
        raise ValueError(f"{name}: page {page} (must be {BLOCK_SIZE}), head_dim {d} (must be "
                         f"even), {h} heads over {hkv} KV heads (must divide)")
    width = (h + 2 * hkv) * d
    if qkv.shape[-1] != width or (qkv.dim() == 3 and qkv.shape[1] != 1) or qkv.dim() not in (2, 3):
        raise ValueError(f"{name}: qkv must be (B, 1, {width}) or (B, {width}) for {h} + 2 x {hkv} "
                         f"heads of {d}, got {tuple(qkv.shape)}")
    rows = qkv.reshape(-1, width)
    b = rows.shape[0]
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[1] != d:
        raise ValueError(f"{name}: cos and sin must be (positions, {d}), got {tuple(cos.shape)} "
                         f"and {tuple(sin.shape)}")
    if tables.dim() != 2 or tables.shape[0] != b or not tables.is_contiguous():
        raise ValueError(f"{name}: tables must be a contiguous ({b}, pages per sequence) tensor, "
                         f"got {tuple(tables.shape)}")
    q = torch.empty(b, h, d, dtype=qkv.dtype, device=qkv.device)
    if b == 0:
        return q
    _rope_append_kernel[(b,)](rows, cos, sin, pos, tables, q, k_cache, v_cache,
                              rows.stride(0), tables.stride(0), tables.shape[1], cos.shape[0],
                              h, hkv, PAGE=page, HEAD_DIM=d,
                              BLOCK_H=triton.next_power_of_2(h),
                              BLOCK_HKV=triton.next_power_of_2(hkv),
                              BLOCK_HALF=triton.next_power_of_2(max(d // 2, 1)),
                              num_warps=4)
    return q
# --8<-- [end:rope_append]


# --8<-- [start:swiglu_stacked]
@triton.jit
def _swiglu_stacked_kernel(gu_ptr, out_ptr, F, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < F
    g = tl.load(gu_ptr + row * 2 * F + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * F + F + cols, mask=mask, other=0.0).to(tl.float32)
    silu = g / (1.0 + tl.exp(-g))
    tl.store(out_ptr + row * F + cols, (silu * u).to(out_ptr.dtype.element_ty), mask=mask)


def swiglu_stacked(gu: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, where each row of ``gu`` (..., 2 F), contiguous, is gate then up: what
    ``x @ W_gu.T`` gives. Returns (..., F), in fp32 inside and rounded once, as Part 5's
    swiglu_triton."""
    check_tensors(("gu",), (gu,), dtypes=DTYPES, device=triton_device())
    refuse_grad("swiglu_stacked", gu, instead="swiglu_triton on the two halves")
    if gu.dim() == 0 or gu.shape[-1] % 2:
        raise ValueError(f"swiglu_stacked: the last dimension must be 2 F (gate, then up), got "
                         f"shape {tuple(gu.shape)}")
    f = gu.shape[-1] // 2
    out = torch.empty(*gu.shape[:-1], f, dtype=gu.dtype, device=gu.device)
    rows = gu.numel() // max(gu.shape[-1], 1)
    if out.numel():
        block = min(1024, triton.next_power_of_2(f))
        _swiglu_stacked_kernel[(rows, triton.cdiv(f, block))](gu, out, f, BLOCK=block,
                                                             num_warps=4)
    return out
# --8<-- [end:swiglu_stacked]


# --8<-- [start:step]
class StackedDecoder(StaticDecoder):
    """A :class:`StaticDecoder` of the book backend whose step uses the stacked weights: per layer
    one product for q, k and v, RoPE and the cache write in one kernel, one product for the MLP's
    gate and up halves and SwiGLU read from it. Made by :meth:`over` on an existing decoder, whose
    cache, tables and position it shares (as ``with_backend``'s views do)."""

    @classmethod
    def over(cls, decoder: StaticDecoder) -> StackedDecoder:
        """The stacked decoder over ``decoder``'s cache (made once, then reused: its stacked
        weights and its graph belong to the decoder's family of views)."""
        if type(decoder) is cls:                       # already one: itself
            return decoder
        views = decoder._views
        if "stacked" not in views:
            other = decoder.with_backend("book").view(cls)
            other.weights = stack_weights(decoder.model)
            views["stacked"] = other
        return views["stacked"]

    def _step(self, tokens: torch.Tensor) -> torch.Tensor:
        model, ops, cfg = self.model, self.ops, self.model.cfg
        b, h, hkv, d = self.batch, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        lens = (self.pos + 1).to(torch.int32).repeat(b)                    # (B,), on the device
        x = model.embed[tokens][:, None]                                   # (B, 1, dim)
        for i, layer in enumerate(model.layers):
            w_qkv, w_gu = self.weights[i]
            a = ops["norm"](x, layer.attn_norm)
            q = rope_append(a @ w_qkv.T, model.cos, model.sin, self.pos, self.k[i], self.v[i],
                            self.tables, h, hkv)                           # (B, H, D)
            o = ops["decode_attention"](q, self.k[i], self.v[i], self.tables, lens)
            x = x + o.reshape(b, 1, h * d) @ layer.wo.T
            m = ops["norm"](x, layer.mlp_norm)
            x = x + swiglu_stacked(m @ w_gu.T) @ layer.wd.T
        if not self.fixed_position:
            self.pos += 1
        return (ops["norm"](x, model.norm) @ model.lm_head.T)[:, 0]
# --8<-- [end:step]


# --8<-- [start:op_version]
def decode_stacked_graph(decoder, tokens, k_cache, v_cache):
    """v5: the stacked step (:class:`StackedDecoder`) captured once in a CUDA graph and replayed,
    as v3 does with v2's step."""
    check_timed_call("decode_stacked_graph", decoder, tokens, k_cache, v_cache)
    return graphed_step(StackedDecoder.over(decoder), tokens)


capstone_decode.add(Impl("v5", decode_stacked_graph, "Triton",
                         "v3 with stacked q/k/v and gate/up products, RoPE + cache write and "
                         "SwiGLU as one kernel each",
                         (StackedDecoder, stack_weights, rope_append, _rope_append_kernel,
                          swiglu_stacked, _swiglu_stacked_kernel, "snippets/part8/capstone.py"),
                         requires=needs_cuda_graphs))
# --8<-- [end:op_version]
