"""Paged decode attention beyond the generic reference check: the reference against SDPA on the
contiguous cache; the Triton kernels (v1, and v2 with one to many chunks, including more chunks
than a short sequence has tiles) under the interpreter for GQA ratios 1, 4 and 8, ragged lengths
(1, and non-multiples of the page), pages of 16 and of 5 tokens, both inner-product paths (tl.dot
and multiply-and-sum) in fp32 and fp16, bf16 on the multiply-and-sum path; a batch built by
PagedKVCache; bad input refused before any kernel is launched. GPU tests check bf16 and fp16 at
Llama-3-8B's head layout against an fp32 reference."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import NoLaunch

from conftest import DEVICE, poison_allocator
from snippets.part8 import decode_attention as da
from snippets.part8.kv_cache import PagedKVCache

pytestmark = pytest.mark.op("paged_decode_attention")


def _batch(lengths, hq, hkv, d, page, dtype=torch.float32, device=DEVICE, seed=0, spare=3):
    """q, caches, tables and lengths with every sequence's blocks drawn at random from the cache."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // page) for n in lengths]
    num_blocks = sum(per_seq) + spare
    order = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(lengths), max(per_seq) + 1, dtype=torch.int32)   # one spare column
    start = 0
    for i, n in enumerate(per_seq):
        tables[i, :n] = order[start:start + n]
        start += n

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device=device,
                                                                           dtype=dtype)

    q = randn(len(lengths), hq, d)
    k, v = randn(num_blocks, page, hkv, d), randn(num_blocks, page, hkv, d)
    return q, k, v, tables.to(device), torch.tensor(lengths, dtype=torch.int32, device=device)


def _ref64(args):
    return da.paged_attention_ref(*(a.double() if a.is_floating_point() else a for a in args))


def _check(out, ref, dtype, what):
    rtol, atol = da.TOLERANCES[dtype]
    assert not out.isnan().any(), f"{what}: NaN in the output (an element never written?)"
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol, msg=what)


# ---------------------------------------------------------------- the reference

@pytest.mark.parametrize("hq, hkv", [(4, 4), (8, 2), (8, 1)])
def test_reference_matches_sdpa_on_the_contiguous_cache(hq, hkv):
    """Fill a PagedKVCache token by token, gather each sequence back, run SDPA with enable_gqa:
    the reference (which reads the blocks itself) agrees in float64."""
    lengths, page, d = [1, 7, 20], 4, 8
    cache = PagedKVCache(16, page, hkv, d, max_blocks_per_seq=5, dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    for t in range(max(lengths)):
        for s, n in enumerate(lengths):
            if t == 0:
                cache.add_sequence(s)
            if t < n:
                cache.append(s, *torch.randn(2, hkv, d, generator=gen, dtype=torch.float64))
    q = torch.randn(len(lengths), hq, d, generator=gen, dtype=torch.float64)
    tables, lens = cache.block_tables(range(len(lengths)))
    got = da.paged_attention_ref(q, cache.k, cache.v, tables, lens)
    for s in range(len(lengths)):
        k, v = cache.gather(s)
        want = F.scaled_dot_product_attention(q[s][:, None], k.transpose(0, 1), v.transpose(0, 1),
                                              enable_gqa=True)[:, 0]
        torch.testing.assert_close(got[s], want)


def test_cost_model():
    size = da.HEADLINE
    kv = 2 * 32 * 4096 * 8 * 128 * 2           # K and V of 32 sequences of 4096 tokens, bf16
    assert da._bytes(size, torch.bfloat16) == kv + 2 * 32 * 32 * 128 * 2
    assert da._flops(size, torch.bfloat16) == 4 * 32 * 4096 * 32 * 128
    # FLOPs per byte: 2 * (Hq / Hkv) / itemsize, to within the q and o bytes
    assert 3.99 < da._flops(size, torch.bfloat16) / da._bytes(size, torch.bfloat16) < 4.0
    ragged = da.seq_lengths({"b": 4, "ctx": 40, "ragged": True})
    assert ragged == [1, 14, 27, 40] and da.seq_lengths(da.TEST_SIZES[0]) == [1, 19, 37]
    assert da.HEADLINE in da.SWEEP


# ---------------------------------------------------------------- the Triton kernels

# (lengths, hq, hkv, d, page): GQA ratios 1, 4 and 8; lengths 1, page multiples and not;
# pages of 16 (one tile) and 5 (tiles that cross pages); a sequence of several tiles
CASES = [([1, 16, 23], 2, 2, 16, 16),
         ([5, 1, 37, 64], 8, 2, 32, 16),
         ([19, 3], 8, 1, 16, 5),
         ([40], 4, 1, 64, 8),
         ([1], 1, 1, 16, 16)]
SPLITS = [1, 2, 3, 8]    # 8 > the tiles of every sequence here: empty chunks must weigh nothing


@pytest.mark.parametrize("use_dot", [True, False], ids=["dot", "sum"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"lens{len(c[0])}-g{c[1] // c[2]}-p{c[4]}")
def test_kernels_match_the_reference(case, dtype, use_dot):
    lengths, hq, hkv, d, page = case
    args = _batch(lengths, hq, hkv, d, page, dtype)
    ref = _ref64(args)
    for splits in SPLITS:
        poison_allocator(4 * args[0].numel() * 16, DEVICE)
        out = da.paged_decode_attention(*args, num_splits=splits, use_dot=use_dot)
        assert out.dtype == dtype and out.shape == args[0].shape
        _check(out, ref, dtype, f"num_splits={splits}")


@pytest.mark.parametrize("case", CASES[1:3], ids=["g4", "g8"])
def test_bf16_kernels_match_the_reference(case):
    """bf16 under the interpreter takes the multiply-and-sum path (its tl.dot is wrong there); on
    the GPU the tensor cores (see the GPU tests)."""
    args = _batch(*case, dtype=torch.bfloat16)
    ref = _ref64(args)
    for splits in (1, 3):
        _check(da.paged_decode_attention(*args, num_splits=splits), ref, torch.bfloat16,
               f"num_splits={splits}")


def test_split_count_does_not_change_the_answer_beyond_rounding():
    """fp32: every chunking gives the same output to a few ulp; a chunking bug (a token seen
    twice or never) would move it by far more."""
    args = _batch([50, 33], 4, 1, 16, 4)
    outs = [da.paged_decode_attention(*args, num_splits=s) for s in (1, 2, 4, 7)]
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], rtol=1e-6, atol=1e-6)


def test_a_batch_from_the_paged_cache():
    """Sequences grown token by token in a PagedKVCache (one forked from another, then diverged by
    copy-on-write) give the kernels the tables they read."""
    hkv, d, page = 2, 16, 4
    cache = PagedKVCache(20, page, hkv, d, max_blocks_per_seq=6, device=DEVICE)
    gen = torch.Generator().manual_seed(2)

    def token():
        return torch.randn(2, hkv, d, generator=gen).to(DEVICE)

    cache.add_sequence("a")
    for _ in range(10):
        cache.append("a", *token())
    cache.fork("a", "b")
    for _ in range(7):
        cache.append("b", *token())
    cache.append("a", *token())
    q = torch.randn(2, 8, d, generator=gen).to(DEVICE)
    tables, lens = cache.block_tables(["a", "b"])
    assert lens.tolist() == [11, 17]
    ref = _ref64((q, cache.k, cache.v, tables, lens))
    for splits in (1, 3):
        _check(da.paged_decode_attention(q, cache.k, cache.v, tables, lens, num_splits=splits),
               ref, torch.float32, f"num_splits={splits}")
    # and against plain attention over the gathered sequence
    for i, s in enumerate(["a", "b"]):
        k, v = cache.gather(s)
        w = torch.softmax(torch.einsum("hd,thd->ht", q[i].repeat_interleave(1, 0).double(),
                                       k.repeat_interleave(4, 1).double()) / math.sqrt(d), -1)
        want = torch.einsum("ht,thd->hd", w, v.repeat_interleave(4, 1).double())
        torch.testing.assert_close(ref[i], want)


def test_default_splits():
    cpu = torch.device("cpu")
    assert da.default_splits(8, 8, 100, cpu) == 1                # under MIN_CHUNK: no split
    assert da.default_splits(8, 8, 4 * da.MIN_CHUNK, cpu) == 4
    assert da.default_splits(8, 8, 64 * da.MIN_CHUNK, cpu) == 4


# ---------------------------------------------------------------- bad input, before any launch

@pytest.fixture
def no_launch(monkeypatch):
    for name in ("_paged_decode_kernel", "_paged_decode_split_kernel", "_merge_splits_kernel"):
        monkeypatch.setattr(da, name, NoLaunch())


def _cases():
    q, k, v, tables, lens = _batch([5, 9], 4, 2, 16, 4, device="cpu")
    bad_table = tables.clone()
    bad_table[1, 2] = k.shape[0]            # a block sequence 1 (9 tokens, 3 blocks) reads
    unused = tables.clone()
    unused[0, 3] = 10_000                   # past sequence 0's 2 blocks: never read, accepted
    base = dict(q=q, k_cache=k, v_cache=v, block_tables=tables, seq_lens=lens)
    return [
        ("q dtype", dict(q=q.double()), TypeError, "q has dtype torch.float64"),
        ("k dtype", dict(k_cache=k.half()), TypeError, "k_cache has dtype torch.float16"),
        ("v shape", dict(v_cache=v[:, :2].contiguous()), ValueError, "v_cache has shape"),
        ("q 2-D", dict(q=q[0]), ValueError, "q must be 3-D"),
        ("heads", dict(q=q[:, :3].contiguous()), ValueError, r"q_heads \(3\) must be a multiple"),
        ("head dim", dict(q=q[..., :8].contiguous()), ValueError, "head_dim 8 is not supported"),
        ("tables int64", dict(block_tables=tables.long()), TypeError, "block_tables has dtype"),
        ("tables batch", dict(block_tables=tables[:1]), ValueError, r"block_tables must be \(b"),
        ("lens shape", dict(seq_lens=lens[:1]), ValueError, r"seq_lens must have shape \(2,\)"),
        ("len 0", dict(seq_lens=torch.tensor([0, 9], dtype=torch.int32)), ValueError,
         r"seq_lens must be in \[1, 16\]"),
        ("len past table", dict(seq_lens=torch.tensor([5, 17], dtype=torch.int32)), ValueError,
         r"got \[5, 17\]"),
        ("block id", dict(block_tables=bad_table), ValueError,
         rf"block_tables\[1, 2\] = {k.shape[0]} is not a block"),
        ("strided q", dict(q=q.transpose(0, 1).contiguous().transpose(0, 1)), ValueError,
         "q must be contiguous"),
        ("scale", dict(scale=-1.0), ValueError, "scale must be positive"),
        ("splits", dict(num_splits=0), ValueError, "num_splits must be >= 1"),
        ("use_dot", dict(use_dot=1), TypeError, "use_dot must be None or a bool"),
    ], base, unused


@pytest.mark.skipif(DEVICE != "cpu", reason="the cases are built on the CPU (the interpreter)")
@pytest.mark.parametrize("index", range(16))
def test_bad_input_raises_before_launch(no_launch, index):
    cases, base, _ = _cases()
    what, change, exc, match = cases[index]
    with pytest.raises(exc, match=match):
        da.paged_decode_attention(**{**base, **change})


@pytest.mark.skipif(DEVICE != "cpu", reason="the cases are built on the CPU (the interpreter)")
def test_unused_table_entries_are_not_checked():
    _, base, unused = _cases()
    want = da.paged_decode_attention(**base)
    torch.testing.assert_close(da.paged_decode_attention(**{**base, "block_tables": unused}), want)


# ---------------------------------------------------------------- on the GPU

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("splits", [1, 4, None], ids=["v1", "v2-4", "v2-default"])
def test_gpu_llama_heads(dtype, splits):
    """Llama-3-8B's head layout (32 query heads, 8 kv heads, D = 128), pages of 16, ragged
    lengths from 1 to 3000, on the tensor-core path, against an fp32 reference: within the
    dtype's tolerance, and no worse than twice PyTorch's own error in that dtype."""
    lengths = [1, 17, 640, 3000, 1999, 256]
    args = _batch(lengths, 32, 8, 128, 16, dtype, device="cuda", seed=4)
    ref = da.paged_attention_ref(*(a.float() if a.is_floating_point() else a for a in args))
    torch_err = (da.paged_attention_ref(*args).float() - ref).abs().max().item()
    out = da.paged_decode_attention(*args, num_splits=splits)
    _check(out, ref.double(), dtype, f"{dtype} num_splits={splits}")
    err = (out.float() - ref).abs().max().item()
    assert err <= 2 * torch_err + torch.finfo(dtype).eps / 64, (err, torch_err)


@pytest.mark.gpu
def test_gpu_registered_versions_agree():
    op = da.paged_decode
    size = {**da.LLAMA_HEADS, "b": 5, "ctx": 1500, "ragged": True}
    args = op.make_inputs(size, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
    ref = _ref64(args)
    for name, impl in op.impls.items():
        _check(impl.fn(*args), ref, torch.bfloat16, name)
