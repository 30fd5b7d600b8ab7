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


@pytest.mark.gpu
@pytest.mark.parametrize("b", [1, 8, 32])
@pytest.mark.parametrize("n, k, glu", [(3072, 2048, False), (8192, 2048, True), (2048, 8192, False)])
def test_block_gemv_at_llama_1b_widths_in_bf16(b, n, k, glu):
    """The step's three shapes (q/k/v, gate/up, down) at batch 1 (elementwise), 8 and 32 (tl.dot), with
    the prologue and epilogue each uses: against float64, within bf16's rounding of the output."""
    x, w, g, res = _tensors(b, n, k, glu, dtype=torch.bfloat16, device="cuda", seed=b)
    norm = g if k == 2048 else None
    residual = None if glu or k == 2048 else res
    got = cb.block_gemv(x, w, norm=norm, glu=glu, residual=residual)
    want = _ref(x, w, norm, glu, residual)
    torch.testing.assert_close(got.double(), want, rtol=1.6e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("config, b", [("tiny", 2), ("llama_1b", 1), ("llama_1b", 32)])
def test_v6_replays_equal_v3s(config, b):
    """v6's graph against the reference and v3, at batch 1 (elementwise GEMVs) and 32 (tl.dot)."""
    assert_graph_step_matches_v3(cp.capstone_decode, "v6", config, b)
