"""v3 of decode attention over an e4m3 paged cache (snippets/part8/decode_fp8.py): v2's arithmetic
in one kernel for one chunk or several, its launch autotuned per shape.

CPU (interpreter): the kernel matches the float64 reference for fp16, bf16 and fp32 q (fp32 goes to
v2), one and several chunks, GQA 1 to 8, pages of 16, 5 and 8; a loud block changes only its own
heads; bad input is refused before launch. Compiled for sm_90 on the CPU: every launch the autotuner
may pick fits, spills nothing, and reads V with ldmatrix's transpose, never byte by byte. GPU: every
launch at Llama-3-8B's heads in bf16 and fp16, ragged lengths, one and several chunks, against the
reference and against v2; a long context, twice, the same bits.
"""

from __future__ import annotations

import re

import pytest
import torch
import triton
from helpers import NoLaunch
from test_part8_decode_fp8 import CASES, _batch, _ref

from conftest import DEVICE
from snippets.part8 import decode_attention as da
from snippets.part8 import decode_fp8 as d3

pytestmark = pytest.mark.op("paged_decode_attention_fp8")


# ---------------------------------------------------------------- against the reference

@pytest.mark.parametrize("case", CASES, ids=lambda c: f"lens{c[0]}-g{c[1] // c[2]}-p{c[4]}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("splits", [1, 3])
def test_v3_matches_the_reference(case, dtype, splits):
    lengths, hq, hkv, d, page = case
    args = _batch(lengths, hq, hkv, d, page, dtype)
    out = d3.paged_decode_attention_fp8_tuned(*args, num_splits=splits)
    rtol, atol = da.TOLERANCES[dtype]
    assert out.dtype == dtype and not out.isnan().any()
    torch.testing.assert_close(out.double(), _ref(*args), rtol=rtol, atol=atol)


def test_a_loud_block_changes_nothing_else():
    lengths, hq, hkv, d, page = [20, 33], 4, 2, 16, 8
    quiet = _batch(lengths, hq, hkv, d, page, torch.float16, seed=3)
    owner_block = int(quiet[5][1, 1])
    loud = _batch(lengths, hq, hkv, d, page, torch.float16, seed=3, loud=owner_block)
    a, b = (d3.paged_decode_attention_fp8_tuned(*x, num_splits=2) for x in (quiet, loud))
    torch.testing.assert_close(a[0], b[0])
    torch.testing.assert_close(a[1, 2:], b[1, 2:])
    assert not torch.allclose(a[1, :2], b[1, :2])
    rtol, atol = da.TOLERANCES[torch.float16]
    torch.testing.assert_close(b.double(), _ref(*loud), rtol=rtol, atol=atol)


def test_registered_v3_on_the_ops_inputs():
    op = da.paged_decode_fp8
    assert op.impls["v3"].fn is d3.decode_fp8_cache_tuned
    for dtype in (torch.float16, torch.bfloat16):
        size = dict(op.test_sizes[2])
        args = op.make_inputs(size, dtype, DEVICE, torch.Generator().manual_seed(0))
        ref = op.reference(*(a.double() if a.is_floating_point() and a.dtype != da.FP8 else a
                             for a in args))
        rtol, atol = da.TOLERANCES[dtype]
        torch.testing.assert_close(op.impls["v3"].fn(*args).double(), ref, rtol=rtol, atol=atol)


@pytest.mark.skipif(DEVICE != "cpu", reason="the cases are built on the CPU (the interpreter)")
def test_bad_input_raises_before_launch(monkeypatch):
    monkeypatch.setattr(d3, "tuned_kernel", lambda: NoLaunch())
    monkeypatch.setattr(d3, "_merge_kernel", NoLaunch())
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
            d3.paged_decode_attention_fp8_tuned(**{**base, **change})
    with pytest.raises(RuntimeError, match="grad"):
        d3.paged_decode_attention_fp8_tuned(**{**base, "q": q.clone().requires_grad_()})


# ---------------------------------------------------------------- what it compiles to

def _compile(cfg):
    from snippets.common.introspect import compile_for
    sig = {n: "i32" for n in d3._decode_fp8_kernel.arg_names}
    sig.update(q_ptr="*bf16", k_ptr="*fp8e4nv", v_ptr="*fp8e4nv", ks_ptr="*fp32",
               vs_ptr="*fp32", tables_ptr="*i32", lens_ptr="*i32", o_ptr="*bf16",
               part_o_ptr="*fp32", part_lse_ptr="*fp32", qk_scale="fp32")
    consts = dict(NUM_KV_HEADS=8, GROUP=4, GROUP_PAD=16, HEAD_DIM=128, PAGE=16, NUM_SPLITS=5,
                  USE_DOT=True, PINNED=True, **cfg.kwargs)
    return compile_for(d3._decode_fp8_kernel, sig, consts, num_warps=cfg.num_warps,
                       num_stages=cfg.num_stages)


@pytest.mark.cpu_only
@pytest.mark.parametrize("index", range(len(d3.LAUNCHES)))
def test_every_launch_compiles_for_sm90(index):
    """Each launch the autotuner may pick, for Llama's heads, bf16 q and an e4m3 cache, compiled for
    sm_90 on this machine: no spills, shared memory within the H100's 227 KiB, V read back with
    ldmatrix's transpose and never one byte per instruction (the pinned conversion, as in v2), and
    bf16 MMAs."""
    c = _compile(d3.LAUNCHES[index])
    assert c.spill_stores == 0
    assert c.shared <= 227 * 1024
    assert not re.search(r"ld\.shared\.b8\b", c.ptx)
    assert re.search(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16", c.ptx)
    assert re.search(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32", c.ptx)
    assert c.ptx.count("mov.b32 {lo, hi}") > 0          # e4m3_to_f16_pinned's asm block


def test_the_launches_are_tiles_of_64_and_128_tokens():
    assert sorted((c.kwargs["BLOCK_N"], c.num_warps) for c in d3.LAUNCHES) == [
        (64, 2), (64, 4), (128, 4)]
    tuner = d3.tuned_kernel()
    assert "batch" in tuner.keys and "NUM_SPLITS" in tuner.keys and "table_width" in tuner.keys


# ---------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("index", range(len(d3.LAUNCHES)))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_every_launch(index, dtype):
    """Whatever launch the autotuner picks is right: each one alone, one chunk and four, against
    the reference and within rounding of v2."""
    one = triton.autotune(configs=[d3.LAUNCHES[index]], key=["batch"])(d3._decode_fp8_kernel)
    args = _batch([1, 17, 640, 3000, 1999, 256], 32, 8, 128, 16, dtype, "cuda", seed=4)
    q, k8, v8, ks, vs, tables, lens = args
    rtol, atol = da.TOLERANCES[dtype]
    for splits in (1, 4):
        out = d3.decode_fp8(q, k8, v8, ks, vs, tables, lens, 128 ** -0.5, splits, kernel=one)
        torch.testing.assert_close(out.double(), _ref(*args), rtol=rtol, atol=atol)
        v2 = da.paged_decode_attention_fp8(*args, num_splits=splits, pin_v=True)
        torch.testing.assert_close(out.double(), v2.double(), rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, None], ids=["one-chunk", "default"])
def test_gpu_tuned(splits):
    args = _batch([1, 17, 640, 3000, 1999, 256], 32, 8, 128, 16, torch.bfloat16, "cuda", seed=5)
    out = d3.paged_decode_attention_fp8_tuned(*args, num_splits=splits)
    rtol, atol = da.TOLERANCES[torch.bfloat16]
    torch.testing.assert_close(out.double(), _ref(*args), rtol=rtol, atol=atol)


@pytest.mark.gpu
def test_gpu_long_context_and_repeat():
    """One sequence of 65536 tokens beside a short one, bf16: right, and the same bits twice."""
    args = _batch([65536, 5], 32, 8, 128, 16, torch.bfloat16, "cuda", seed=6)
    a = d3.paged_decode_attention_fp8_tuned(*args)
    b = d3.paged_decode_attention_fp8_tuned(*args)
    assert torch.equal(a, b)
    rtol, atol = da.TOLERANCES[torch.bfloat16]
    torch.testing.assert_close(a.double(), _ref(*args), rtol=rtol, atol=atol)
