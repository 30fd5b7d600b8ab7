"""v3 of decode attention over an e4m3 paged cache (snippets/part8/decode_fp8.py): fp16 products, q
brought into fp16's range by an exact power of two, V's scales relative to the tile's largest.

CPU (interpreter): the power of two is exact and puts q's largest magnitude in [2^14, 2^15) for
every magnitude bf16 holds; the kernel matches the float64 reference for fp16, bf16 and fp32 q (fp32
goes to v2), one and several chunks, GQA 1 to 8, pages of 16, 5 and 8; q far outside fp16's range and
V scales far below it (where P times the scale in fp16 would flush to zero) still match; bad input is
refused before launch. Compiled for sm_90 on the CPU: no conversion to bf16, one e4m3x2 conversion per
two cached values, no byte loads from shared memory, fp16 MMAs. GPU: Llama-3-8B's heads in bf16 and
fp16, ragged lengths, against the reference and against v2.
"""

from __future__ import annotations

import re

import pytest
import torch
import triton
import triton.language as tl
from helpers import NoLaunch
from test_part8_decode_fp8 import CASES, _batch, _ref

from conftest import DEVICE
from snippets.part8 import decode_attention as da
from snippets.part8 import decode_fp8 as d3

pytestmark = pytest.mark.op("paged_decode_attention_fp8")


# ---------------------------------------------------------------- q into fp16's range

@triton.jit
def _q_to_f16_probe(q_ptr, out_ptr, down_ptr, ROWS: tl.constexpr, COLS: tl.constexpr):
    offs = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    q16, down = d3.q_to_f16(tl.load(q_ptr + offs))
    tl.store(out_ptr + offs, q16)
    tl.store(down_ptr, down)


def _probe(q):
    out = torch.empty(q.shape, dtype=torch.float16, device=q.device)
    down = torch.empty(1, dtype=torch.float32, device=q.device)
    _q_to_f16_probe[(1,)](q, out, down, ROWS=q.shape[0], COLS=q.shape[1])
    return out, down


@pytest.mark.parametrize("magnitude", [2.0**-100, 1e-20, 1e-3, 1.0, 3.0, 7e4, 1e20, 2.0**120])
def test_q_to_f16_is_exact_and_in_range(magnitude):
    """Scaled q times the inverse power is q exactly (bf16 significands fit fp16's), the largest
    magnitude lands in [2^14, 2^15), and the inverse is a power of two."""
    gen = torch.Generator().manual_seed(7)
    q = (torch.randn(16, 32, generator=gen) * magnitude).to(torch.bfloat16)
    q[3, 5] = 0.0
    q16, down = _probe(q.to(DEVICE))
    q16, down = q16.cpu(), down.cpu()
    assert torch.isfinite(q16).all()
    big = q.float().abs().amax()
    small = q.float().abs() >= big * 2.0**-28     # below that, fp16's subnormals may round
    assert torch.equal(q16.double()[small] * down.double(), q.double()[small])
    assert 2.0**14 <= q16.float().abs().amax() < 2.0**15
    assert torch.frexp(down).mantissa.item() == 0.5               # a power of two


def test_q_to_f16_on_zero_q():
    q16, down = _probe(torch.zeros(16, 16, dtype=torch.bfloat16, device=DEVICE))
    assert (q16.cpu() == 0).all() and torch.isfinite(down).all() and down.item() > 0


# ---------------------------------------------------------------- against the reference

@pytest.mark.parametrize("case", CASES, ids=lambda c: f"lens{c[0]}-g{c[1] // c[2]}-p{c[4]}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("splits", [1, 3])
def test_v3_matches_the_reference(case, dtype, splits):
    lengths, hq, hkv, d, page = case
    args = _batch(lengths, hq, hkv, d, page, dtype)
    out = d3.paged_decode_attention_fp8_f16(*args, num_splits=splits)
    rtol, atol = da.TOLERANCES[dtype]
    assert out.dtype == dtype and not out.isnan().any()
    torch.testing.assert_close(out.double(), _ref(*args), rtol=rtol, atol=atol)


@pytest.mark.parametrize("factor", [1e-30, 1e30])
def test_q_far_outside_fp16s_range(factor):
    """bf16 q a thousand orders of magnitude from 1: scaled by a power of two, never inf or 0."""
    args = list(_batch([5, 40, 1], 8, 2, 32, 16, torch.bfloat16))
    args[0] = (args[0].float() * factor).to(torch.bfloat16)
    out = d3.paged_decode_attention_fp8_f16(*args, num_splits=2)
    rtol, atol = da.TOLERANCES[torch.bfloat16]
    torch.testing.assert_close(out.double(), _ref(*args), rtol=rtol, atol=atol)


def test_v_scales_far_below_fp16s_range():
    """V a million times smaller than usual: P times V's scale (about 1e-8) would flush to zero in
    fp16; relative to the tile's largest scale it does not. The output, about 1e-6, must match."""
    lengths, hq, hkv, d, page = [20, 33, 7], 8, 2, 32, 8
    q, k8, v8, ks, vs, tables, lens = _batch(lengths, hq, hkv, d, page, torch.float16)
    vs = vs * 1e-6
    vs[int(tables[1, 1])] *= 50                 # one block 50x louder than the rest
    args = (q, k8, v8, ks, vs, tables, lens)
    ref = _ref(*args)
    out = d3.paged_decode_attention_fp8_f16(*args, num_splits=1)
    assert ref.abs().max() < 1e-4
    torch.testing.assert_close(out.double(), ref, rtol=5e-3, atol=5e-3 * ref.abs().max().item())


def test_a_loud_block_changes_nothing_else():
    lengths, hq, hkv, d, page = [20, 33], 4, 2, 16, 8
    quiet = _batch(lengths, hq, hkv, d, page, torch.float16, seed=3)
    owner_block = int(quiet[5][1, 1])
    loud = _batch(lengths, hq, hkv, d, page, torch.float16, seed=3, loud=owner_block)
    a, b = (d3.paged_decode_attention_fp8_f16(*x, num_splits=2) for x in (quiet, loud))
    torch.testing.assert_close(a[0], b[0])
    torch.testing.assert_close(a[1, 2:], b[1, 2:])
    assert not torch.allclose(a[1, :2], b[1, :2])
    rtol, atol = da.TOLERANCES[torch.float16]
    torch.testing.assert_close(b.double(), _ref(*loud), rtol=rtol, atol=atol)


def test_registered_v3_on_the_ops_inputs():
    op = da.paged_decode_fp8
    assert op.impls["v3"].fn is d3.decode_fp8_cache_f16
    for dtype in (torch.float16, torch.bfloat16):
        size = dict(op.test_sizes[2])
        args = op.make_inputs(size, dtype, DEVICE, torch.Generator().manual_seed(0))
        ref = op.reference(*(a.double() if a.is_floating_point() and a.dtype != da.FP8 else a
                             for a in args))
        rtol, atol = da.TOLERANCES[dtype]
        torch.testing.assert_close(op.impls["v3"].fn(*args).double(), ref, rtol=rtol, atol=atol)


@pytest.mark.skipif(DEVICE != "cpu", reason="the cases are built on the CPU (the interpreter)")
def test_bad_input_raises_before_launch(monkeypatch):
    for name in ("_decode_fp8_f16_kernel", "_merge_kernel"):
        monkeypatch.setattr(d3, name, NoLaunch())
    for name in ("_paged_decode_kernel", "_paged_decode_split_kernel", "_merge_splits_kernel"):
        monkeypatch.setattr(da, name, NoLaunch())
    q, k8, v8, ks, vs, tables, lens = _batch([5, 9], 4, 2, 16, 4, torch.bfloat16)
    base = dict(q=q, k_cache=k8, v_cache=v8, k_scale=ks, v_scale=vs, block_tables=tables,
                seq_lens=lens)
    for change, exc, match in (
            (dict(k_cache=k8.float()), TypeError, "k_cache has dtype torch.float32"),
            (dict(v_cache=v8.to(torch.float8_e5m2)), TypeError, "v_cache has dtype"),
            (dict(k_scale=ks.double()), TypeError, "k_scale has dtype torch.float64"),
            (dict(v_scale=vs[:, :1].contiguous()), ValueError, r"v_scale has shape \(7, 1\)"),
            (dict(seq_lens=torch.tensor([0, 9], dtype=torch.int32)), ValueError, "seq_lens"),
            (dict(q=q[:, :3]), ValueError, "q"),
            (dict(num_splits=0), ValueError, "num_splits must be >= 1"),
            (dict(num_splits=70000), ValueError, "exceeds 65535")):
        with pytest.raises(exc, match=match):
            d3.paged_decode_attention_fp8_f16(**{**base, **change})
    with pytest.raises(RuntimeError, match="grad"):
        d3.paged_decode_attention_fp8_f16(**{**base, "q": q.clone().requires_grad_()})


# ---------------------------------------------------------------- what it compiles to

@pytest.mark.cpu_only
def test_compiled_for_sm90_converts_once_and_multiplies_in_fp16():
    """The kernel for Llama's heads, bf16 q and an e4m3 cache, compiled for sm_90 on this machine:
    one cvt.rn.f16x2.e4m3x2 per two cached values of a tile (K and V: 2 x 64 x 128 values over 128
    threads), no conversion to bf16, no byte loads from shared memory, and fp16 MMAs."""
    from snippets.common.introspect import compile_for
    sig = {n: "i32" for n in d3._decode_fp8_f16_kernel.arg_names}
    sig.update(q_ptr="*bf16", k_ptr="*fp8e4nv", v_ptr="*fp8e4nv", ks_ptr="*fp32",
               vs_ptr="*fp32", tables_ptr="*i32", lens_ptr="*i32", o_ptr="*bf16",
               part_o_ptr="*fp32", part_lse_ptr="*fp32", qk_scale="fp32")
    consts = dict(NUM_KV_HEADS=8, GROUP=4, GROUP_PAD=16, HEAD_DIM=128, PAGE=16,
                  BLOCK_N=d3.BLOCK_N_GPU, NUM_SPLITS=5, SCALE_Q=True, PINNED=True)
    c = compile_for(d3._decode_fp8_f16_kernel, sig, consts, num_warps=d3.NUM_WARPS,
                    num_stages=d3.NUM_STAGES)
    per_thread = 2 * d3.BLOCK_N_GPU * 128 // (32 * d3.NUM_WARPS)
    assert len(re.findall(r"cvt\.rn\.f16x2\.e4m3x2", c.ptx)) == per_thread // 2
    assert not re.search(r"cvt\.rn\.bf16", c.ptx)
    assert not re.search(r"ld\.shared\.b8\b", c.ptx)
    assert re.search(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32", c.ptx)
    assert not re.search(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16", c.ptx)
    assert c.spill_stores == 0


# ---------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("splits", [1, 4, None], ids=["one-chunk", "4-chunks", "default"])
def test_gpu_llama_heads(dtype, splits):
    args = _batch([1, 17, 640, 3000, 1999, 256], 32, 8, 128, 16, dtype, "cuda", seed=4)
    out = d3.paged_decode_attention_fp8_f16(*args, num_splits=splits)
    rtol, atol = da.TOLERANCES[dtype]
    torch.testing.assert_close(out.double(), _ref(*args), rtol=rtol, atol=atol)
    v2 = da.paged_decode_attention_fp8(*args, num_splits=splits, pin_v=True)
    torch.testing.assert_close(out.double(), v2.double(), rtol=rtol, atol=atol)


@pytest.mark.gpu
def test_gpu_long_context_and_repeat():
    """One sequence of 65536 tokens (v3's long-context case), bf16: right, and the same bits twice."""
    args = _batch([65536, 5], 32, 8, 128, 16, torch.bfloat16, "cuda", seed=6)
    a = d3.paged_decode_attention_fp8_f16(*args)
    b = d3.paged_decode_attention_fp8_f16(*args)
    assert torch.equal(a, b)
    rtol, atol = da.TOLERANCES[torch.bfloat16]
    torch.testing.assert_close(a.double(), _ref(*args), rtol=rtol, atol=atol)
