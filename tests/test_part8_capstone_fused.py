"""capstone_decode v5: the step with stacked q/k/v and gate/up weights, RoPE and the cache write in one
kernel, SwiGLU read from the stacked product (snippets.part8.capstone_fused).

On a CPU (Triton's interpreter, tiny models, float32): the two kernels against Part 5's references and
an explicit cache write, at ragged head counts and at a page boundary; a position past the table or the
angles writes nothing; the stacked step gives the book step's logits and cache, step after step; bad input
is refused before any launch. On a GPU: the same at Llama 3.2 1B's widths in bf16, and v5's graph replays
against the reference and v3."""

from __future__ import annotations

import pytest
import torch
from helpers import (
    assert_decoder_follows_book,
    assert_graph_step_matches_v3,
    assert_graph_version_refuses_loose_decoders,
)

from conftest import DEVICE, poison_allocator
from snippets.part5 import rope as rp
from snippets.part5 import swiglu as sw
from snippets.part8 import capstone as cp
from snippets.part8 import capstone_fused as cf

pytestmark = pytest.mark.op("capstone_decode")
PAGE = cp.BLOCK_SIZE
ATOL = 2e-6 if DEVICE == "cpu" else 5e-5


def _case(b, h, hkv, d, pages, pos, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, 1, (h + 2 * hkv) * d, generator=gen).to(DEVICE, dtype)
    cos, sin = rp.rope_tables(64, d, dtype=dtype, device=DEVICE)
    tables = torch.randperm(b * pages, generator=gen).view(b, pages).to(DEVICE, torch.int32)
    shape = (b * pages, PAGE, hkv, d)
    k_cache = torch.randn(shape, generator=gen).to(DEVICE, dtype)
    v_cache = torch.randn(shape, generator=gen).to(DEVICE, dtype)
    return qkv, cos, sin, torch.tensor([pos], device=DEVICE), k_cache, v_cache, tables


def _rope_append_ref(qkv, cos, sin, pos, k_cache, v_cache, tables, h, hkv):
    """Part 5's RoPE on the three slices, and the cache written by indexing: what v3's step does."""
    b, d = qkv.shape[0], k_cache.shape[-1]
    q, k, v = qkv[:, 0].split([h * d, hkv * d, hkv * d], dim=-1)
    p = int(pos)
    q, k = rp.rope_ref(q.reshape(b, 1, h, d).float(), k.reshape(b, 1, hkv, d).float(),
                       cos[p:p + 1].float(), sin[p:p + 1].float())
    kc, vc = k_cache.clone(), v_cache.clone()
    for s in range(b):
        page = int(tables[s, p // PAGE])
        kc[page, p % PAGE] = k[s, 0].to(kc.dtype)
        vc[page, p % PAGE] = v[s].reshape(hkv, d)
    return q[:, 0].to(qkv.dtype), kc, vc


@pytest.mark.parametrize("b, h, hkv, d, pages, pos", [
    (1, 1, 1, 2, 1, 0), (2, 4, 2, 8, 2, 15), (2, 4, 2, 8, 2, 16), (3, 6, 3, 16, 3, 33),
    (2, 8, 1, 6, 2, 31)])
def test_rope_append_is_rope_and_the_cache_write(b, h, hkv, d, pages, pos):
    """Ragged head counts (6 heads in a block of 8), D = 6 (half 3 in a block of 4), the last slot of a
    page (15, 31) and the first of the next (16)."""
    qkv, cos, sin, p, kc, vc, tables = _case(b, h, hkv, d, pages, pos, seed=pos + 7 * h)
    want_q, want_k, want_v = _rope_append_ref(qkv, cos, sin, p, kc, vc, tables, h, hkv)
    poison_allocator(b * h * d * 4, DEVICE)
    q = cf.rope_append(qkv, cos, sin, p, kc, vc, tables, h, hkv)
    torch.testing.assert_close(q, want_q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(kc, want_k, rtol=1e-6, atol=1e-6)   # one slot changed, the rest kept
    assert torch.equal(vc, want_v)                                  # v is copied, not rounded


@pytest.mark.parametrize("pos", [-1, 2 * PAGE, 64])
def test_a_position_out_of_range_writes_nothing(pos):
    """Past the table's pages (32 for two pages) or the 64 angles, or negative: the cache is left as it
    was (the decoder refuses such a position on the host; the kernel must not write out of bounds)."""
    qkv, cos, sin, p, kc, vc, tables = _case(2, 4, 2, 8, 2, 0)
    p.fill_(pos)
    k0, v0 = kc.clone(), vc.clone()
    cf.rope_append(qkv, cos, sin, p, kc, vc, tables, 4, 2)
    assert torch.equal(kc, k0) and torch.equal(vc, v0)


@pytest.mark.parametrize("rows, f", [(1, 1), (2, 5), (3, 1024), (2, 1500)])
def test_swiglu_stacked_is_swiglu_of_the_halves(rows, f):
    gu = torch.randn(rows, 1, 2 * f, generator=torch.Generator().manual_seed(f)).to(DEVICE)
    want = sw.swiglu_ref(gu[..., :f], gu[..., f:])
    poison_allocator(rows * f * 4, DEVICE)
    torch.testing.assert_close(cf.swiglu_stacked(gu), want, rtol=1e-6, atol=1e-6)


def test_stacked_weights_are_the_layers_weights():
    model = cp.Llama(cp.TINY, seed=0, device=DEVICE)
    (w_qkv, w_gu), layer = cf.stack_weights(model)[0], model.layers[0]
    h, hkv, d = cp.TINY.n_heads, cp.TINY.n_kv_heads, cp.TINY.head_dim
    assert torch.equal(w_qkv, torch.cat([layer.wq, layer.wk, layer.wv]))
    assert w_qkv.shape == ((h + 2 * hkv) * d, cp.TINY.dim)
    assert torch.equal(w_gu[:cp.TINY.ffn_dim], layer.wg) and torch.equal(w_gu[cp.TINY.ffn_dim:], layer.wu)
    assert w_qkv.data_ptr() != layer.wq.data_ptr()  # new storage: the model is left as it was


def test_stacked_step_is_the_book_step():
    """The stacked decoder over one cache gives the book decoder's logits and cache, step after step."""
    assert_decoder_follows_book(cf.StackedDecoder.over, 14, ATOL)


@pytest.mark.parametrize("bad, words", [
    (lambda a: {**a, "qkv": a["qkv"][..., :-1]}, "qkv must be"),
    (lambda a: {**a, "qkv": a["qkv"].expand(2, 3, -1)}, "contiguous|qkv must be"),
    (lambda a: {**a, "pos": a["pos"].int()}, "pos must be a torch.int64"),
    (lambda a: {**a, "pos": a["pos"].repeat(2)}, "one position"),
    (lambda a: {**a, "tables": a["tables"].long()}, "tables must be a torch.int32"),
    (lambda a: {**a, "tables": a["tables"][:1]}, "tables must be a contiguous"),
    (lambda a: {**a, "v_cache": a["v_cache"][:, :, :1].contiguous()}, "alike"),
    (lambda a: {**a, "n_kv_heads": 3}, "alike|must divide"),
    (lambda a: {**a, "cos": a["cos"][:, :4].contiguous()}, "cos and sin must be"),
    (lambda a: {**a, "k_cache": a["k_cache"].double()}, "dtype"),
])
def test_rope_append_refuses_bad_input(bad, words):
    qkv, cos, sin, p, kc, vc, tables = _case(2, 4, 2, 8, 2, 3)
    args = dict(qkv=qkv, cos=cos, sin=sin, pos=p, k_cache=kc, v_cache=vc, tables=tables, n_heads=4,
                n_kv_heads=2)
    before = kc.clone()
    with pytest.raises((ValueError, TypeError), match=words):
        cf.rope_append(**bad(args))
    assert torch.equal(kc, before)


def test_swiglu_stacked_refuses_bad_input():
    with pytest.raises(ValueError, match="2 F"):
        cf.swiglu_stacked(torch.zeros(2, 5, device=DEVICE))
    with pytest.raises(ValueError, match="contiguous"):
        cf.swiglu_stacked(torch.zeros(4, 6, device=DEVICE).t())
    with pytest.raises(TypeError, match="dtype"):
        cf.swiglu_stacked(torch.zeros(2, 6, dtype=torch.int32, device=DEVICE))


def test_v5_refuses_a_decoder_that_is_not_fixed():
    assert_graph_version_refuses_loose_decoders(cf.decode_stacked_graph)


@pytest.mark.gpu
def test_kernels_at_llama_1b_widths_in_bf16():
    """32 heads over 8 KV heads of 128, F = 8192: against the fp32 references, within bf16's rounding."""
    qkv, cos, sin, p, kc, vc, tables = _case(4, 32, 8, 128, 3, 37, dtype=torch.bfloat16)
    want_q, want_k, want_v = _rope_append_ref(qkv, cos, sin, p, kc, vc, tables, 32, 8)
    q = cf.rope_append(qkv, cos, sin, p, kc, vc, tables, 32, 8)
    torch.testing.assert_close(q.float(), want_q.float(), rtol=0, atol=2e-2)
    torch.testing.assert_close(kc.float(), want_k.float(), rtol=0, atol=2e-2)
    assert torch.equal(vc, want_v)
    gu = torch.randn(4, 1, 2 * 8192, device="cuda").bfloat16()
    want = sw.swiglu_ref(gu[..., :8192].float(), gu[..., 8192:].float())
    torch.testing.assert_close(cf.swiglu_stacked(gu).float(), want, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("config, b", [("tiny", 2), ("llama_1b", 1)])
def test_v5_replays_equal_v3s(config, b):
    """v5's graph against the reference and v3: the harness's inputs, bf16."""
    assert_graph_step_matches_v3(cp.capstone_decode, "v5", config, b)
