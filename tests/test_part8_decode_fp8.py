"""Decode attention over an FP8 (e4m3) paged cache: the per-(block, kv head) quantisation and its
error bound; the kernels of paged_decode_attention reading the e4m3 cache (v1 and v2 with several
chunks, both inner-product paths, GQA 1 to 8, ragged lengths, pages of 16 and 5) against the
reference on the values the cache stands for; a block's scale reaching only its own tokens (a loud
block must not change the others' results); bad input refused before launch. The GPU test checks
bf16 at Llama-3-8B's head layout, and that both registered versions agree."""

from __future__ import annotations

import pytest
import torch
from helpers import NoLaunch

from conftest import DEVICE
from snippets.part8 import decode_attention as da

pytestmark = pytest.mark.op("paged_decode_attention_fp8")


def _batch(lengths, hq, hkv, d, page, dtype=torch.float32, device=DEVICE, seed=0, loud=None):
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // page) for n in lengths]
    num_blocks = sum(per_seq) + 2
    order = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(lengths), max(per_seq), dtype=torch.int32)
    start = 0
    for i, n in enumerate(per_seq):
        tables[i, :n] = order[start:start + n]
        start += n
    q = torch.randn(len(lengths), hq, d, generator=gen)
    k = torch.randn(num_blocks, page, hkv, d, generator=gen)
    v = torch.randn(num_blocks, page, hkv, d, generator=gen)
    if loud is not None:                      # one block of one head 100 times louder
        k[loud, :, 0] *= 100
        v[loud, :, 0] *= 100
    (k8, ks), (v8, vs) = da.quantize_kv_blocks(k), da.quantize_kv_blocks(v)
    cast = dict(device=device)
    return (q.to(dtype=dtype, **cast), k8.to(**cast), v8.to(**cast), ks.to(**cast),
            vs.to(**cast), tables.to(**cast), torch.tensor(lengths, dtype=torch.int32, **cast))


def _ref(q, k8, v8, ks, vs, tables, lens):
    kd, vd = da.dequantize_kv_blocks(k8, ks), da.dequantize_kv_blocks(v8, vs)
    return da.paged_attention_ref(q.double(), kd.double(), vd.double(), tables, lens)


def test_block_quantisation_error_bound():
    """Each element within half an e4m3 step of its block's scale (relative 2^-4 in the normal
    range, plus the subnormal floor), the block's largest magnitude exactly at 448, and a loud
    block leaves the others' scales alone."""
    x = torch.randn(6, 16, 4, 32, generator=torch.Generator().manual_seed(1))
    x[2, :, 1] *= 50
    q, s = da.quantize_kv_blocks(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (6, 4) and s.dtype == torch.float32
    back = da.dequantize_kv_blocks(q, s)
    bound = x.abs() * 2.0**-4 + s[:, None, :, None] * 2.0**-10   # half a normal / subnormal step
    assert ((back - x).abs() <= bound * (1 + 1e-6)).all()
    assert torch.allclose(q.float().abs().amax(dim=(1, 3)), torch.full((6, 4), 448.0))
    assert s[2, 1] > 30 * s[2, 0] and torch.allclose(s[3], da.quantize_kv_blocks(x[3:4])[1][0])
    zero, s0 = da.quantize_kv_blocks(torch.zeros(1, 4, 2, 8))
    assert (s0 == 1).all() and (zero.float() == 0).all()          # an empty block: no 0/0


CASES = [([5, 40, 1], 8, 2, 32, 16), ([37], 4, 4, 16, 5), ([3, 17, 64, 9], 8, 1, 16, 8)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"lens{c[0]}-g{c[1] // c[2]}-p{c[4]}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("use_dot", [True, False])
def test_fp8_cache_matches_the_reference(case, dtype, splits, use_dot):
    lengths, hq, hkv, d, page = case
    args = _batch(lengths, hq, hkv, d, page, dtype)
    out = da.paged_decode_attention_fp8(*args, num_splits=splits, use_dot=use_dot)
    rtol, atol = da.TOLERANCES[dtype]
    assert out.dtype == dtype and not out.isnan().any()
    torch.testing.assert_close(out.double(), _ref(*args), rtol=rtol, atol=atol)


def test_a_loud_block_changes_nothing_else():
    """Scales are per (block, kv head): making one block of head 0 loud changes the output only
    of the query heads of kv head 0 in the sequence that owns the block, and stays right there."""
    lengths, hq, hkv, d, page = [20, 33], 4, 2, 16, 8
    quiet = _batch(lengths, hq, hkv, d, page, seed=3)
    owner_block = int(quiet[5][1, 1])                   # sequence 1's second block
    loud = _batch(lengths, hq, hkv, d, page, seed=3, loud=owner_block)
    a, b = (da.paged_decode_attention_fp8(*x, num_splits=2) for x in (quiet, loud))
    torch.testing.assert_close(a[0], b[0])               # the other sequence: unchanged
    torch.testing.assert_close(a[1, 2:], b[1, 2:])       # kv head 1's query heads: unchanged
    assert not torch.allclose(a[1, :2], b[1, :2])
    torch.testing.assert_close(b.double(), _ref(*loud), rtol=1e-4, atol=1e-5)


def test_the_registered_versions_agree_on_the_same_values():
    op = da.paged_decode_fp8
    size = dict(op.test_sizes[0])
    args = op.make_inputs(size, torch.float32, DEVICE, torch.Generator().manual_seed(0))
    ref = op.reference(*(a.double() if a.is_floating_point() and a.dtype != da.FP8 else a
                         for a in args))
    for name, impl in op.impls.items():
        torch.testing.assert_close(impl.fn(*args).double(), ref, rtol=1e-4, atol=1e-5, msg=name)
    # v0's cache is twice the bytes of v1's for the same values: the model counts v1's
    assert args[7].element_size() == 4 and args[1].element_size() == 1


@pytest.mark.skipif(DEVICE != "cpu", reason="the cases are built on the CPU (the interpreter)")
def test_bad_input_raises_before_launch(monkeypatch):
    for name in ("_paged_decode_kernel", "_paged_decode_split_kernel", "_merge_splits_kernel"):
        monkeypatch.setattr(da, name, NoLaunch())
    q, k8, v8, ks, vs, tables, lens = _batch([5, 9], 4, 2, 16, 4)
    base = dict(q=q, k_cache=k8, v_cache=v8, k_scale=ks, v_scale=vs, block_tables=tables,
                seq_lens=lens)
    for change, exc, match in (
            (dict(k_cache=k8.float()), TypeError, "k_cache has dtype torch.float32"),
            (dict(k_scale=ks.double()), TypeError, "k_scale has dtype torch.float64"),
            (dict(v_scale=vs[:, :1].contiguous()), ValueError, r"v_scale has shape \(7, 1\)"),
            (dict(k_scale=ks[:, :1].contiguous(), v_scale=vs[:, :1].contiguous()), ValueError,
             r"k_scale must be a contiguous \(num_blocks, kv_heads\) = \(7, 2\)"),
            (dict(k_scale=ks.t().contiguous().t()), ValueError, "k_scale.*contiguous"),
            (dict(seq_lens=torch.tensor([0, 9], dtype=torch.int32)), ValueError, "seq_lens"),
            (dict(num_splits=0), ValueError, "num_splits must be >= 1")):
        with pytest.raises(exc, match=match):
            da.paged_decode_attention_fp8(**{**base, **change})
    with pytest.raises(RuntimeError, match="grad"):
        da.paged_decode_attention_fp8(**{**base, "q": q.clone().requires_grad_()})


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 4, None], ids=["v1", "v2-4", "v2-default"])
def test_gpu_llama_heads_bf16(splits):
    """Llama-3-8B's heads, pages of 16, ragged lengths up to 3000, bf16 q on the tensor-core path,
    against the float64 reference on the cache's values: within bf16's tolerance."""
    args = _batch([1, 17, 640, 3000, 1999, 256], 32, 8, 128, 16, torch.bfloat16, "cuda", seed=4)
    out = da.paged_decode_attention_fp8(*args, num_splits=splits)
    rtol, atol = da.TOLERANCES[torch.bfloat16]
    torch.testing.assert_close(out.double(), _ref(*args), rtol=rtol, atol=atol)


@pytest.mark.gpu
def test_gpu_registered_versions_agree():
    op = da.paged_decode_fp8
    size = {**da.LLAMA_HEADS, "b": 5, "ctx": 1500, "ragged": True}
    args = op.make_inputs(size, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
    ref = op.reference(*(a.double() if a.is_floating_point() and a.dtype != da.FP8 else a
                         for a in args))
    rtol, atol = da.TOLERANCES[torch.bfloat16]
    for name, impl in op.impls.items():
        torch.testing.assert_close(impl.fn(*args).double(), ref, rtol=rtol, atol=atol, msg=name)


# ---------------------------------------------------------------- v2: V's conversion pinned

def _split_kernel_ptx(pinned: bool) -> str:
    """The split kernel for Llama's heads, bf16 q and an e4m3 cache, compiled for sm_90 on this
    machine's Triton (no GPU needed)."""
    from snippets.common.introspect import compile_for
    sig = {n: "i32" for n in da._paged_decode_split_kernel.arg_names}
    sig.update(q_ptr="*bf16", k_ptr="*fp8e4nv", v_ptr="*fp8e4nv", tables_ptr="*i32",
               lens_ptr="*i32", part_o_ptr="*fp32", part_lse_ptr="*fp32", qk_scale="fp32",
               ks_ptr="*fp32", vs_ptr="*fp32")
    consts = dict(NUM_KV_HEADS=8, GROUP=4, GROUP_PAD=16, HEAD_DIM=128, PAGE=16,
                  BLOCK_N=da.BLOCK_N_GPU, NUM_SPLITS=5, USE_DOT=True, PRECISION="tf32",
                  KV_FP8=True, V_PINNED=pinned)
    return compile_for(da._paged_decode_split_kernel, sig, consts, num_warps=da.NUM_WARPS).ptx


def test_pinned_conversion_removes_the_byte_loads_of_v():
    """The compile-time fact v2 rests on (Triton 3.6, the runner's, and 3.9 alike): v1's kernel
    reads V's e4m3 tile back from shared memory one byte per instruction for the P V product, and
    v2's, which converts V to fp16 before the compiler's layout change, has no byte loads and
    reads the 16-bit tile with ldmatrix's transpose; its own conversion is the inline PTX."""
    import re
    v1, v2 = _split_kernel_ptx(False), _split_kernel_ptx(True)
    assert len(re.findall(r"ld\.shared\.b8\b", v1)) > 0
    assert len(re.findall(r"ld\.shared\.b8\b", v2)) == 0
    assert re.search(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16", v2)
    assert not re.search(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16", v1)
    assert v2.count("mov.b32 {lo, hi}") > 0          # the asm block of e4m3_to_f16_pinned


def test_pin_v_must_be_a_bool():
    args = _batch([5, 9], 4, 2, 16, 4)
    with pytest.raises(TypeError, match="pin_v must be a bool"):
        da.paged_decode_attention_fp8(*args, pin_v=1)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, None], ids=["one-program", "split"])
def test_gpu_pinned_conversion_gives_the_same_bits(splits):
    """v2 converts the same e4m3 values to the same bf16 values as v1, feeding the same products:
    its output must equal v1's exactly (a wrong byte order in the asm's packing would not)."""
    args = _batch([1, 17, 640, 3000, 1999, 256], 32, 8, 128, 16, torch.bfloat16, "cuda", seed=5)
    a = da.paged_decode_attention_fp8(*args, num_splits=splits)
    b = da.paged_decode_attention_fp8(*args, num_splits=splits, pin_v=True)
    assert torch.equal(a, b), f"max difference {(a.float() - b.float()).abs().max().item()}"
    rtol, atol = da.TOLERANCES[torch.bfloat16]
    torch.testing.assert_close(b.double(), _ref(*args), rtol=rtol, atol=atol)
