"""capstone_decode v6: v5's step with RMSNorm, SwiGLU and the residual adds carried by the GEMVs
(snippets.part8.capstone_block).

On a CPU (Triton's interpreter, float32): block_gemv with every combination of its prologue and
epilogues against the unfused reference (Part 5's RMSNorm and SwiGLU, a product, an add), at ragged
N and K, several K steps, on both of its paths (elementwise at batch 1, tl.dot from DOT_FROM rows, and
a batch split over the grid past MAX_DOT_B); the block step gives the book step's logits and cache,
step after step; bad input is refused before any launch. On a GPU: bf16 at Llama 3.2 1B's widths,
and v6's graph replays against the reference and v3."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import triton
from helpers import (
    assert_decoder_follows_book,
    assert_graph_step_matches_v3,
    assert_graph_version_refuses_loose_decoders,
)

from conftest import DEVICE, poison_allocator
from snippets.part5 import rmsnorm as rn
from snippets.part5 import swiglu as sw
from snippets.part8 import capstone as cp
from snippets.part8 import capstone_block as cb
from snippets.part8 import capstone_fused as cf

pytestmark = pytest.mark.op("capstone_decode")


def _ref(x, w, norm=None, glu=False, residual=None, eps=rn.EPS):
    """The unfused step's arithmetic in float64: RMSNorm, the product, SwiGLU of its halves, the add."""
    a = x.double() if norm is None else rn.rmsnorm_ref(x.double(), norm.double(), eps)
    y = a @ w.double().T
    if glu:
        g, u = y.chunk(2, dim=-1)
        y = sw.swiglu_ref(g, u)
    if residual is not None:
        y = y + residual.double()
    return y


def _tensors(b, n, k, glu, dtype=torch.float32, device=DEVICE, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, k, generator=gen)
    w = torch.randn((2 if glu else 1) * n, k, generator=gen) / k ** 0.5
    norm = 1 + 0.5 * torch.randn(k, generator=gen)
    res = torch.randn(b, n, generator=gen)
    return [t.to(device, dtype) for t in (x, w, norm, res)]


CASES = [  # (b, n, k): 1 row (elementwise), 3 and 20 (tl.dot, padded), 70 (two batch tiles)
    (1, 5, 37), (1, 9, 50), (3, 9, 50), (20, 33, 33), (70, 18, 20)]


@pytest.mark.parametrize("b, n, k", CASES)
@pytest.mark.parametrize("norm, glu, residual", [
    (False, False, False), (True, False, False), (False, False, True), (True, True, False),
    (False, True, True)])
def test_block_gemv_is_the_unfused_arithmetic(b, n, k, norm, glu, residual):
    x, w, g, res = _tensors(b, n, k, glu, seed=b + n + k)
    poison_allocator(b * n * 4, DEVICE)
    got = cb.block_gemv(x, w, norm=g if norm else None, glu=glu, residual=res if residual else None)
    want = _ref(x, w, g if norm else None, glu, res if residual else None)
    assert got.shape == (b, n) and got.dtype == x.dtype
    tol = 1e-5 if DEVICE == "cpu" else 1e-4
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


TMA_CASES = [  # (b, n, k): K a multiple of 8 (16-byte rows); 70 rows: two batch tiles
    (3, 9, 48), (20, 33, 64), (70, 18, 24)]


@pytest.mark.parametrize("b, n, k", TMA_CASES)
@pytest.mark.parametrize("norm, glu, residual", [
    (False, False, False), (True, False, False), (False, False, True), (True, True, False),
    (False, True, True)])
def test_tma_product_is_the_unfused_arithmetic(b, n, k, norm, glu, residual):
    """v7's transposed TMA product (fp16 here: the interpreter's bf16 dot is not trusted), with
    every prologue and epilogue, a gate tile that reads past F (n not a multiple of the tile)."""
    x, w, g, res = _tensors(b, n, k, glu, dtype=torch.float16, seed=b + n + k)
    assert cb.tma_applies(x, w)
    poison_allocator(b * n * 2, DEVICE)
    got = cb.block_gemv(x, w, norm=g if norm else None, glu=glu,
                        residual=res if residual else None, tma=True)
    want = _ref(x, w, g if norm else None, glu, res if residual else None)
    assert got.shape == (b, n) and got.dtype == x.dtype
    torch.testing.assert_close(got.double(), want, rtol=4e-3, atol=4e-3)  # fp16: x * g rounded


@pytest.mark.parametrize("b, n, k, split", [(3, 9, 48, 3), (20, 33, 64, 2), (70, 18, 24, 3),
                                         (5, 40, 80, 4)])
@pytest.mark.parametrize("residual", [False, True])
def test_tma_split_k_is_the_unfused_arithmetic(b, n, k, split, residual):
    """v7's split-K: each program sums a slice of K (the last slice of (70, 18, 24) in 3 is empty and
    must store zeros), the sum kernel adds the slices and the residual; against float64 and against
    the unsplit product."""
    x, w, _, res = _tensors(b, n, k, False, dtype=torch.float16, seed=b + n + k + split)
    poison_allocator(split * b * n * 4, DEVICE)
    got = cb.block_gemv(x, w, residual=res if residual else None, tma=True, split_k=split)
    want = _ref(x, w, None, False, res if residual else None)
    assert got.shape == (b, n) and got.dtype == x.dtype
    torch.testing.assert_close(got.double(), want, rtol=4e-3, atol=4e-3)
    whole = cb.block_gemv(x, w, residual=res if residual else None, tma=True, split_k=1)
    torch.testing.assert_close(got, whole, rtol=2e-3, atol=2e-3)  # fp32 sums in another order


def test_split_k_is_refused_where_it_cannot_apply():
    x, w, g, _ = _tensors(3, 9, 48, True, dtype=torch.float16)
    for kw in (dict(norm=g), dict(glu=True)):
        with pytest.raises(ValueError, match="split_k"):
            cb.block_gemv(x, w, tma=True, split_k=2, **kw)
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError, match="split_k"):
            cb.block_gemv(x, w[:9], tma=True, split_k=bad)


def test_split_k_for_fills_the_sms_with_slices_of_k(monkeypatch):
    """The rule, on a 132-SM GPU: 1B's output and down products (2048 rows: 32 tiles of 64) get 4
    slices at batch 8 and 32, 2 at batch 70 (two batch tiles); the LM head and the gate/up product
    fill the GPU with tiles alone; short K is not cut below 512 columns."""
    monkeypatch.setattr(cb, "triton_interpreting", lambda: False)
    monkeypatch.setattr(cb, "num_sms", lambda index: 132)
    dev = torch.device("cuda", 0)
    assert cb.split_k_for(32, 2048, 8192, 32, dev) == 4
    assert cb.split_k_for(8, 2048, 2048, 16, dev) == 4
    assert cb.split_k_for(70, 2048, 8192, 64, dev) == 2
    assert cb.split_k_for(32, 128256, 2048, 32, dev) == 1
    assert cb.split_k_for(32, 16384, 2048, 32, dev) == 1
    assert cb.split_k_for(8, 2048, 1024, 16, dev) == 2
    assert cb.split_k_for(8, 256, 65536, 16, dev) == cb.SPLIT_K_MAX


def test_tma_falls_back_where_its_rules_fail():
    """fp32, rows of K not a multiple of 8, a base off 16 bytes: v6's kernel, the same result."""
    x, w, g, _ = _tensors(3, 9, 48, False, dtype=torch.float16)
    buf = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    shifted = buf[1:].view_as(x).copy_(x)
    for xx, ww in ((x.float(), w.float()), (x[:, :44].contiguous(), w[:, :44].contiguous()),
                   (shifted, w)):
        assert not cb.tma_applies(xx, ww)
        torch.testing.assert_close(cb.block_gemv(xx, ww, norm=g[:xx.shape[1]].to(xx.dtype), tma=True),
                                   cb.block_gemv(xx, ww, norm=g[:xx.shape[1]].to(xx.dtype)),
                                   rtol=0, atol=0)


def _compiled(tma: bool, block_b: int, glu: bool, split: int = 1) -> list:
    """v7's TMA tiles (or v6's tl.dot tiles) compiled for sm_90 on this machine, bf16, with the
    norm, and SwiGLU or the residual add (split > 1: v7's split-K tiles, fp32 partials out, no
    norm): ptxas's reports."""
    from snippets.common.introspect import compile_many

    ptrs = dict(g_ptr="*bf16", res_ptr="*bf16", y_ptr="*bf16" if split == 1 else "*fp32")
    ints = dict(B="i32", N="i32", K="i32", eps="fp32")
    flags = dict(NORM=split == 1, GLU=glu, RESIDUAL=not glu, BLOCK_B=block_b)
    jobs = []
    if tma:
        for bn, bk, warps, stages in cb.TMA_TILES:
            sig = dict(x_desc=f"tensordesc<bf16[{block_b}, {bk}]>",
                       w_desc=f"tensordesc<bf16[{bn}, {bk}]>", **ptrs, **ints)
            jobs.append((cb._block_gemm_tma_kernel, sig,
                         dict(**flags, SPLIT_K=split, BLOCK_N=bn, BLOCK_K=bk),
                         dict(num_warps=warps, num_stages=stages)))
    else:
        for c in cb._configs(block_b, glu, True):
            sig = dict(x_ptr="*bf16", w_ptr="*bf16", **ptrs, **ints)
            jobs.append((cb._block_gemv_kernel, sig, dict(**flags, **c.kwargs, DOT=True, IEEE=False),
                         dict(num_warps=c.num_warps, num_stages=c.num_stages)))
    return compile_many(jobs)


@pytest.mark.cpu_only
@pytest.mark.parametrize("norm, glu, residual", [(True, False, False), (False, False, True), (True, True, False)])
def test_v6s_batch_1_tiles_compile_like_decode_gemvs(norm, glu, residual):
    """At batch 1 (elementwise), v6's tiles with the norm, the residual or SwiGLU read the weight in 16-byte
    loads, as decode_gemv's do, without spills and with no more registers than decode_gemv's largest
    tile plus a margin for the extras: what v6 adds to a GEMV does not change how it streams the weight.
    SwiGLU's tile of twice the products per step stays under 128 registers (four programs of four warps
    per SM)."""
    import re

    from snippets.common.introspect import compile_many
    from snippets.part8 import decode_gemv as dg

    ints = dict(N="i32", K="i32")
    sig = dict(x_ptr="*bf16", g_ptr="*bf16", w_ptr="*bf16", res_ptr="*bf16", y_ptr="*bf16", B="i32", **ints,
               eps="fp32")
    jobs = [(cb._block_gemv_kernel, sig, dict(NORM=norm, GLU=glu, RESIDUAL=residual, DOT=False, IEEE=False,
                                              BLOCK_B=1, **c.kwargs),
             dict(num_warps=c.num_warps, divisible=[*sig][:5] + ["N", "K"]))
            for c in cb._configs(1, glu, False)]
    n = len(jobs)
    jobs += [(dg._gemv_kernel, dict(x_ptr="*bf16", w_ptr="*bf16", y_ptr="*bf16", **ints), dict(c.kwargs),
              dict(num_warps=c.num_warps, divisible=["x_ptr", "w_ptr", "y_ptr", "N", "K"]))
             for c in dg.GEMV_CONFIGS]
    ours = compile_many(jobs)
    v6, gemv = ours[:n], ours[n:]
    for k in v6:
        assert k.spill_stores == 0 and len(re.findall(r"ld\.global\.v4\.b32", k.ptx)) >= 4, k.ptxas_report
    # the tiles of decode_gemv's products per step; SwiGLU's extra tile holds twice that in registers
    for k in v6[:len(dg.GEMV_CONFIGS)]:
        assert k.registers <= max(g.registers for g in gemv) + 16, (k.registers, [g.registers for g in gemv])
    for k in v6[len(dg.GEMV_CONFIGS):]:
        assert k.registers <= 128, k.ptxas_report


@pytest.mark.cpu_only
def test_v6s_batched_tiles_spill():
    """Why v7: v6's batched tile keeps the weight tile's 64-bit addresses in registers and spills,
    at every one of its configs, for batch 8's tile with SwiGLU."""
    assert all(k.spill_stores > 0 for k in _compiled(False, 16, True))


@pytest.mark.cpu_only
@pytest.mark.parametrize("block_b, glu, split", [(16, True, 1), (32, False, 1), (32, True, 1),
                                                (32, False, 4)])
def test_v7s_tiles_load_by_tma_into_wgmma_without_spills(block_b, glu, split):
    """v7's tiles load by TMA, multiply with wgmma, and none spills, with either epilogue and with
    split-K's partial sums."""
    for k, tile in zip(_compiled(True, block_b, glu, split), cb.TMA_TILES):
        assert k.spill_stores == 0 and k.spill_loads == 0, (tile, k.ptxas_report)
        assert "cp.async.bulk.tensor" in k.ptx and "wgmma" in k.ptx, tile


def test_the_norm_uses_the_whole_row_and_eps():
    """A row of x = c (every element): RMSNorm makes it sign(c) * norm whatever c, unless eps is
    comparable with c^2; sums of squares taken over one K step, or without eps, give other values."""
    k = 40
    x = torch.full((2, k), 1e-3, device=DEVICE)
    x[1] = 3.0
    w = torch.eye(k, device=DEVICE)
    got = cb.block_gemv(x, w, norm=torch.ones(k, device=DEVICE), eps=1e-6)
    want = _ref(x, w, torch.ones(k, device=DEVICE), eps=1e-6)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    assert abs(float(got[0, 0]) - 1e-3 / (1e-6 + 1e-6) ** 0.5) < 1e-5  # eps is half of it
    assert abs(float(got[1, 0]) - 1.0) < 1e-5


def test_the_result_is_new_storage():
    x, w, _, res = _tensors(2, 8, 16, False)
    before = res.clone()
    y = cb.block_gemv(x, w, residual=res)
    assert y.data_ptr() != res.data_ptr() and torch.equal(res, before)


def test_block_step_is_the_book_step():
    """The block decoder over one cache gives the book decoder's logits and cache, step after step."""
    assert_decoder_follows_book(cb.BlockDecoder.over, 13, 1e-5 if DEVICE == "cpu" else 1e-4)
    assert issubclass(cb.BlockDecoder, cf.StackedDecoder)


def test_a_dropped_decoder_and_its_views_are_freed_at_once():
    """A decoder refers to its views and a view to its decoder weakly: dropping the decoder frees
    it, its views, its cache and its model by reference counting, with the cycle collector off
    (a benchmark sweep that builds an 8B model per job must not wait for it). A view outliving
    its decoder still steps, and says so if asked for another view."""
    gc.disable()
    try:
        model = cp.Llama(cp.TINY, seed=0, device=DEVICE)
        dec = cp.StaticDecoder(model, 1, 8, fixed_position=True)
        book = dec.with_backend("book")
        block = cb.BlockDecoder.over(dec)
        assert book.with_backend("torch") is dec and block.with_backend("book") is book
        assert cf.StackedDecoder.over(book) is dec._views["stacked"] and block.k is dec.k
        refs = [weakref.ref(o) for o in (dec, book, block, dec._views["stacked"], dec.k, model)]
        del model, dec, book
        tok = torch.zeros(1, dtype=torch.long, device=DEVICE)
        assert block.step(tok).shape == (1, cp.TINY.vocab)    # holds its own cache and weights
        assert cb.BlockDecoder.over(block) is block
        with pytest.raises(RuntimeError, match="has been freed"):
            block.with_backend("torch")
        del block
        assert [r() for r in refs] == [None] * len(refs)
    finally:
        gc.enable()


@pytest.mark.parametrize("bad, err, words", [
    (lambda a: {**a, "w": a["w"][:, :-1].contiguous()}, ValueError, "same K"),
    (lambda a: {**a, "x": a["x"][0]}, ValueError, "must be \\(B, K\\)"),
    (lambda a: {**a, "w": a["w"].t()}, ValueError, "contiguous|same K"),
    (lambda a: {**a, "norm": a["norm"][:-1]}, ValueError, "norm must be"),
    (lambda a: {**a, "residual": a["residual"][:, :-1].contiguous()}, ValueError,
     "residual must be"),
    (lambda a: {**a, "glu": True, "w": a["w"][:-1]}, ValueError, "2 F rows"),
    (lambda a: {**a, "w": a["w"].double()}, TypeError, "dtype"),
    (lambda a: {**a, "norm": a["norm"].half()}, TypeError, "norm has dtype"),
    (lambda a: {**a, "eps": 0.0}, ValueError, "eps must be positive"),
    (lambda a: {**a, "x": a["x"][:0]}, ValueError, "empty"),
    (lambda a: {**a, "w": a["w"].clone().requires_grad_()}, RuntimeError, "grad"),
])
def test_block_gemv_refuses_bad_input(bad, err, words):
    x, w, g, res = _tensors(2, 6, 8, False)
    with pytest.raises(err, match=words):
        cb.block_gemv(**bad(dict(x=x, w=w, norm=g, residual=res)))


def test_v6_refuses_a_decoder_that_is_not_fixed():
    assert_graph_version_refuses_loose_decoders(cb.decode_block_graph)


def test_v7_step_is_the_book_step():
    """v7's decoder is its own view (not v6's) and follows the book decoder (fp32 here: v6's
    kernel; its TMA product is tested above and on the GPU)."""
    assert_decoder_follows_book(cb.TmaBlockDecoder.over, 13, 1e-5 if DEVICE == "cpu" else 1e-4)
    assert cb.TmaBlockDecoder.KEY != cb.BlockDecoder.KEY and cb.TmaBlockDecoder.TMA
    assert_graph_version_refuses_loose_decoders(cb.decode_block_tma_graph)


@pytest.mark.gpu
@pytest.mark.parametrize("b", [1, 8, 32])
@pytest.mark.parametrize("n, k, glu", [(3072, 2048, False), (8192, 2048, True), (2048, 8192, False)])
@pytest.mark.parametrize("tma", [False, True])
def test_block_gemv_at_llama_1b_widths_in_bf16(b, n, k, glu, tma):
    """The step's three shapes (q/k/v, gate/up, down) at batch 1 (elementwise), 8 and 32 (tl.dot), with
    the prologue and epilogue each uses: against float64, within bf16's rounding of the output."""
    x, w, g, res = _tensors(b, n, k, glu, dtype=torch.bfloat16, device="cuda", seed=b)
    norm = g if k == 2048 else None
    residual = None if glu or k == 2048 else res
    assert cb.tma_applies(x, w)  # on the runner's Hopper GPUs
    got = cb.block_gemv(x, w, norm=norm, glu=glu, residual=residual, tma=tma)
    want = _ref(x, w, norm, glu, residual)
    torch.testing.assert_close(got.double(), want, rtol=1.6e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("b", [8, 32])
def test_split_k_at_the_down_products_width_is_deterministic(b):
    """1B's down product (2048 rows, K = 8192) is split on the runner's GPUs; two calls give the
    same bits (the slices are added in a fixed order), and the split agrees with the unsplit product
    to the fp32 sums' order."""
    x, w, _, res = _tensors(b, 2048, 8192, False, dtype=torch.bfloat16, device="cuda", seed=b)
    block_b = max(cb.MIN_DOT_B, triton.next_power_of_2(b))
    assert cb.split_k_for(b, 2048, 8192, block_b, x.device) > 1
    first = cb.block_gemv(x, w, residual=res, tma=True)
    assert torch.equal(first, cb.block_gemv(x, w, residual=res, tma=True))
    whole = cb.block_gemv(x, w, residual=res, tma=True, split_k=1)
    torch.testing.assert_close(first, whole, rtol=1.6e-2, atol=2e-2)
    torch.testing.assert_close(first.double(), _ref(x, w, None, False, res), rtol=1.6e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("config, b", [("tiny", 2), ("llama_1b", 1), ("llama_1b", 32)])
@pytest.mark.parametrize("version", ["v6", "v7"])
def test_v6_replays_equal_v3s(config, b, version):
    """v6's and v7's graphs against the reference and v3, at batch 1 (elementwise GEMVs) and 32
    (tl.dot; v7: TMA)."""
    assert_graph_step_matches_v3(cp.capstone_decode, version, config, b)
