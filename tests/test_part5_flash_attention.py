"""FlashAttention forward and backward beyond the generic reference check: the NumPy walk-through against the
naive algorithm (float64, to rounding), the Triton kernels in fp16/fp32 (and float64 through gradcheck) under the
interpreter for both masks and ragged sequence lengths, the saved-state slot that keeps the forward out of the
timed backward, determinism, clear refusal of bad input, and compilation for sm_90. GPU tests check bf16 and the
accuracy criterion: an error at most twice PyTorch's own at the same precision, against an fp32 reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close_within, compile_script_results
from torch.nn.attention import SDPBackend, sdpa_kernel

import snippets._checks as checks
import snippets.common.attention as common_attention
from conftest import DEVICE, poison_allocator, skip_unavailable
from snippets.op_index import get_op
from snippets.part4.softmax import online_softmax_numpy
from snippets.part5 import flash_attention as fa

# (B, H, S, D, causal): one block, ragged tails of the query and key blocks, several heads, both masks
SHAPES = [(1, 1, 1, 16, False), (1, 1, 16, 16, True), (2, 3, 33, 32, True), (1, 2, 47, 16, False),
          (1, 1, 80, 64, True), (1, 2, 80, 64, False), (1, 1, 17, 32, True)]


def _qkv(shape, dtype=torch.float32, device=DEVICE, seed=0):
    b, h, s, d, _ = shape
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, s, d, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
                 for _ in range(4))


def _assert_close(out, ref, dtype, what):
    assert_close_within(out, ref, fa.TOLERANCES, dtype, what)


# ---------------------------------------------------------------- references and the NumPy walk-through

@pytest.mark.op("flash_attention_fwd")
@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_sdpa_math(causal):
    q, k, v, _ = _qkv((2, 2, 19, 8, causal), torch.float64, "cpu")
    with sdpa_kernel(SDPBackend.MATH):
        want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(fa.attention_ref(q, k, v, causal), want)


@pytest.mark.op("flash_attention_bwd")
@pytest.mark.parametrize("causal", [False, True])
def test_closed_form_backward_matches_autograd(causal):
    q, k, v, do = _qkv((2, 1, 13, 8, causal), torch.float64, "cpu", seed=1)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(fa.attention_ref(*leaves, causal), leaves, do)
    for got, exp in zip(fa.attention_bwd_ref(q, k, v, do, causal), want):
        torch.testing.assert_close(got, exp)


@pytest.mark.op("flash_attention_fwd")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n, block_m, block_n", [(1, 16, 16), (37, 16, 8), (64, 16, 16), (50, 7, 13), (9, 32, 32)])
def test_numpy_tiled_forward_is_exact(n, block_m, block_n, causal):
    """The tiled algorithm is the naive one rearranged: equal to float64 rounding, with any block sizes (also
    ones that do not divide each other, which the NumPy version allows and the kernels do not need)."""
    rng = np.random.default_rng(n)
    q, k, v = (rng.standard_normal((n, 8)) for _ in range(3))
    o, lse = fa.attention_numpy(q, k, v, causal)
    o2, lse2 = fa.flash_attention_numpy(q, k, v, causal, block_m, block_n)
    np.testing.assert_allclose(o2, o, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(lse2, lse, rtol=1e-12, atol=1e-13)


@pytest.mark.op("flash_attention_fwd")
def test_numpy_lse_is_the_online_softmax_of_part4():
    """Row i's log-sum-exp is Part 4's online (max, sum) pair for the scaled scores of row i: m + log(s)."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((24, 16)) for _ in range(3))
    _, lse = fa.flash_attention_numpy(q, k, v, block_m=8, block_n=8)
    for i in (0, 7, 23):
        p, trace = online_softmax_numpy(q[i] @ k.T / 4.0, block=8)
        m, s = trace[-1]
        assert abs(m + math.log(s) - lse[i]) < 1e-12
        np.testing.assert_allclose(p, np.exp(q[i] @ k.T / 4.0 - lse[i]), rtol=1e-12)


@pytest.mark.op("flash_attention_bwd")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n, block_m, block_n", [(1, 16, 16), (37, 16, 8), (40, 8, 16), (50, 7, 13)])
def test_numpy_backward_with_recomputation_is_exact(n, block_m, block_n, causal):
    rng = np.random.default_rng(n + block_m)
    q, k, v, do = (rng.standard_normal((n, 8)) for _ in range(4))
    naive = fa.attention_bwd_numpy(q, k, v, do, causal)
    o, lse = fa.flash_attention_numpy(q, k, v, causal, block_m, block_n)
    tiled = fa.flash_attention_bwd_numpy(q, k, v, o, lse, do, causal, block_m, block_n)
    t = [torch.from_numpy(a).requires_grad_() for a in (q, k, v)]
    auto = torch.autograd.grad(fa.attention_ref(*(x[None, None] for x in t), causal), t,
                               torch.from_numpy(do)[None, None])
    for name, a, b, c in zip(("dq", "dk", "dv"), naive, tiled, auto):
        np.testing.assert_allclose(b, a, rtol=1e-11, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(a, c.numpy(), rtol=1e-11, atol=1e-12, err_msg=name)


def test_score_bytes():
    assert fa.score_bytes(4, 32, 4096, 2) == 4 * 4 * 32 * 4096 * 4096 * 2  # 8 GiB in bf16 at the headline


# ---------------------------------------------------------------- cost model and registration

def test_cost_model():
    size = dict(fa.HEADLINE)
    f = fa.attention_flops(size, torch.bfloat16)
    assert f == 4 * 4 * 32 * 4096 * 4096 * 128
    assert fa.attention_flops({**size, "causal": True}, torch.bfloat16) * 2 == f
    assert fa.attention_bwd_flops(size, torch.bfloat16) * 2 == 5 * f
    assert fa.attention_bytes(size, torch.bfloat16) == 4 * 2**26 * 2  # 4 tensors of 2^26 bf16 elements (128 MiB)
    for s in fa.SWEEP:  # the same tokens at every point of the S sweep
        assert s["b"] * s["s"] == 16384 or s["d"] == 64
    assert fa.HEADLINE in fa.SWEEP
    assert any(t["s"] % 32 and t["causal"] for t in fa.TEST_SIZES)


@pytest.mark.op("flash_attention_fwd")
def test_cudnn_missing_gives_a_reason_without_gpu(monkeypatch):
    fa.cudnn_missing.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    try:
        assert "CUDA GPU" in fa.cudnn_missing()
    finally:
        fa.cudnn_missing.cache_clear()


# ---------------------------------------------------------------- Triton forward (CPU interpreter or GPU)

@pytest.mark.op("flash_attention_fwd")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_triton_forward(shape, dtype, device):
    q, k, v, _ = _qkv(shape, dtype, seed=shape[2])
    causal = shape[4]
    poison_allocator(q.numel() * q.element_size(), device)
    o, lse = fa.flash_attention_forward(q, k, v, causal)
    _assert_close(o, fa.attention_ref(q.double(), k.double(), v.double(), causal), dtype, f"o {shape} {dtype}")
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(shape[3])
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, dim=-1), rtol=1e-5, atol=1e-5)


@pytest.mark.op("flash_attention_fwd")
def test_triton_forward_other_scale_and_large_scores(device):
    """A large sm_scale makes the scores reach +-100: exp without the running max would overflow fp32."""
    q, k, v, _ = _qkv((1, 2, 40, 32, False), seed=7)
    o = fa.flash_attention(q, k, v, False, 5.0)
    s = q.double() @ k.double().transpose(-1, -2) * 5.0
    assert s.abs().max() > 90
    _assert_close(o, torch.softmax(s, -1) @ v.double(), torch.float32, "o, sm_scale = 5")


@pytest.mark.op("flash_attention_fwd")
def test_triton_forward_agrees_with_sdpa_flash_on_cpu(device):
    """v0 and v2 on the same fp16 inputs: both within fp16 rounding of each other."""
    q, k, v, _ = _qkv((1, 2, 33, 32, True), torch.float16, seed=2)
    torch.testing.assert_close(fa.attention_triton(q, k, v, True).float(),
                               fa.attention_flash_sdpa(q, k, v, True).float(), rtol=4e-3, atol=4e-3)


@pytest.mark.op("flash_attention_fwd")
def test_triton_forward_error_within_twice_torch_fp16(device):
    """The accuracy criterion at fp16, on any device: the error against float64 is at most twice that of
    PyTorch's attention written out in fp16 ops (the reference run on the fp16 inputs)."""
    q, k, v, _ = _qkv((1, 2, 80, 64, False), torch.float16, seed=4)
    ref = fa.attention_ref(q.double(), k.double(), v.double())
    torch_err = (fa.attention_ref(q, k, v).double() - ref).abs().max().item()
    ours = (fa.attention_triton(q, k, v).double() - ref).abs().max().item()
    assert ours <= 2 * torch_err, (ours, torch_err)


# ---------------------------------------------------------------- Triton backward

@pytest.mark.op("flash_attention_bwd")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_triton_backward(shape, dtype, device):
    q, k, v, do = _qkv(shape, dtype, seed=shape[2] + 1)
    causal = shape[4]
    poison_allocator(q.numel() * q.element_size(), device)
    grads = fa.attention_bwd_triton(q, k, v, do, causal)
    refs = fa.attention_bwd_ref(q.double(), k.double(), v.double(), do.double(), causal)
    for name, g, r in zip(("dq", "dk", "dv"), grads, refs):
        _assert_close(g, r, dtype, f"{name} {shape} {dtype}")


@pytest.mark.op("flash_attention_bwd")
def test_autograd_function_matches_torch_autograd(device):
    """FlashAttention in a loss with two uses of the output; o.sum() hands backward() an expanded gradient."""
    q, k, v, do = _qkv((2, 2, 37, 16, True), seed=5)
    ours = [t.clone().requires_grad_() for t in (q, k, v)]
    theirs = [t.clone().double().requires_grad_() for t in (q, k, v)]
    ((fa.flash_attention(*ours, True) * do).sum() + fa.flash_attention(*ours, True).sum()).backward()
    ref = fa.attention_ref(*theirs, True)
    ((ref * do.double()).sum() + ref.sum()).backward()
    for a, t in zip(ours, theirs):
        torch.testing.assert_close(a.grad.double(), t.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.op("flash_attention_bwd")
@pytest.mark.parametrize("shape", [(1, 1, 3, 16, False), (1, 1, 4, 16, True), (2, 1, 33, 16, True)])
def test_gradcheck_float64(shape, device):
    """torch.autograd.gradcheck in float64: the three backward kernels against finite differences of the
    forward kernel (the interpreter runs float64 tl.dot; on the GPU it becomes DMMA)."""
    q, k, v, _ = _qkv(shape, torch.float64, seed=shape[2])
    leaves = tuple(t.requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: fa.flash_attention(q, k, v, shape[4]), leaves,
                                    eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=shape[2] > 4)


@pytest.mark.op("flash_attention_bwd")
def test_gradcheck_can_fail(monkeypatch, device):
    """A backward that forgets delta (dS = P * dP): gradcheck must notice."""
    real = fa._backward

    def wrong(q, k, v, o, lse2, do, causal, scale):
        return real(q, k, v, torch.zeros_like(o), lse2, do, causal, scale)

    monkeypatch.setattr(fa, "_backward", wrong)
    q, k, v, _ = _qkv((1, 1, 2, 16, False), torch.float64, seed=9)
    leaves = tuple(t.requires_grad_() for t in (q, k, v))
    assert not torch.autograd.gradcheck(lambda q, k, v: fa.flash_attention(q, k, v), leaves,
                                        raise_exception=False, fast_mode=True)


@pytest.mark.op("flash_attention_bwd")
def test_backward_from_public_forward_state(device):
    """flash_attention_backward takes the natural-log lse that flash_attention_forward returns."""
    q, k, v, do = _qkv((1, 2, 33, 32, True), seed=8)
    o, lse = fa.flash_attention_forward(q, k, v, True)
    grads = fa.flash_attention_backward(q, k, v, o, lse, do, True)
    for g, r in zip(grads, fa.attention_bwd_ref(q.double(), k.double(), v.double(), do.double(), True)):
        _assert_close(g, r, torch.float32, "public backward")


@pytest.mark.op("flash_attention_bwd")
@pytest.mark.parametrize("version", ["v0", "v2"])
def test_saved_slot_keeps_the_forward_out_of_later_calls(version, monkeypatch, device):
    """The first call on an input set runs the forward and fills the slot; later calls run only the backward
    and give the same gradients."""
    op = get_op("flash_attention_bwd")
    args = op.make_inputs({"b": 1, "h": 2, "s": 24, "d": 16, "causal": True}, torch.float16, device,
                          torch.Generator().manual_seed(0))
    saved = args[-1]
    first = op.impls[version].fn(*args)
    assert version in saved
    calls = []
    monkeypatch.setattr(fa, "_forward", lambda *a: calls.append(a))
    monkeypatch.setattr(common_attention, "sdpa", lambda *a: calls.append(a))
    second = op.impls[version].fn(*args)
    assert not calls, "the forward ran again"
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.op("flash_attention_bwd")
def test_backward_is_deterministic(device):
    """Each dQ, dK, dV block has one owner and a fixed summation order: the same bits every run."""
    q, k, v, do = _qkv((1, 2, 70, 32, True), torch.float16, seed=6)
    first = fa.attention_bwd_triton(q, k, v, do, True)
    second = fa.attention_bwd_triton(q, k, v, do, True)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


# ---------------------------------------------------------------- refusals

def _bad_inputs(device):
    q = torch.randn(1, 2, 8, 16, device=device)
    return [
        ("k of another shape", (q, q[:, :, :4].contiguous(), q), ValueError, "k has shape"),
        ("v of another dtype", (q, q, q.half()), TypeError, "v has dtype"),
        ("int32", (q.int(), q.int(), q.int()), TypeError, "dtype"),
        ("float64 without autograd", (q.double(),) * 3, TypeError, "dtype"),
        ("3-D", (q[0], q[0], q[0]), ValueError, "4-D"),
        ("head_dim 24", (torch.randn(1, 1, 4, 24, device=device),) * 3, ValueError, "head_dim 24"),
        ("head_dim 256", (torch.randn(1, 1, 4, 256, device=device),) * 3, ValueError, "head_dim 256"),
        ("non-contiguous", (q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2)), ValueError, "contiguous"),
        ("empty", (q[:, :, :0],) * 3, ValueError, "empty"),
        ("not a tensor", (q.tolist(), q, q), TypeError, "torch.Tensor"),
    ]


@pytest.mark.op("flash_attention_fwd")
@pytest.mark.parametrize("case", range(len(_bad_inputs("cpu"))))
def test_refuses_bad_input(case, device):
    label, args, exc, words = _bad_inputs(device)[case]
    with pytest.raises(exc, match=words):
        fa.attention_triton(*args)
    do = args[0]
    with pytest.raises(exc, match=words):
        fa.attention_bwd_triton(*args, do)


@pytest.mark.op("flash_attention_fwd")
def test_refuses_bad_flags_and_devices(monkeypatch, device):
    q = torch.randn(1, 1, 8, 16, device=device)
    with pytest.raises(TypeError, match="causal must be a bool"):
        fa.attention_triton(q, q, q, 1)
    with pytest.raises(ValueError, match="sm_scale must be positive"):
        fa.flash_attention(q, q, q, False, -1.0)
    with pytest.raises(TypeError, match="sm_scale"):
        fa.flash_attention(q, q, q, False, "0.1")
    with pytest.raises(ValueError, match="batch x heads"):
        fa.attention_triton(*(torch.empty(1, 65536, 1, 16, device=device),) * 3)
    with pytest.raises(ValueError, match="do has shape"):
        fa.attention_bwd_triton(q, q, q, q[:, :, :4])
    o, lse = fa.flash_attention_forward(q, q, q)
    with pytest.raises(ValueError, match="lse must be a tensor of shape"):
        fa.flash_attention_backward(q, q, q, o, lse[..., :3], q)
    monkeypatch.setattr(checks, "triton_interpreting", lambda: False)
    cpu = torch.zeros(1, 1, 8, 16)
    with pytest.raises(ValueError, match="cuda device"):
        fa.attention_triton(cpu, cpu, cpu)


# ---------------------------------------------------------------- sm_90 compilation on any machine

COMPILE_SCRIPT = """
import json, torch
from snippets.part5 import flash_attention as fa
out = []
for kernel, d, causal, bm, bn, warps, stages in (("fwd", 128, True, 128, 64, 8, 3), ("fwd", 64, False, 128, 64, 4, 3),
                                                 ("dkdv", 128, True, 32, 128, 8, 3), ("dq", 128, False, 128, 32, 8, 3),
                                                 ("delta", 128, False, 64, 0, 4, 1)):
    ck = fa.compile_for_sm90(kernel, torch.bfloat16, d, causal, bm, bn, warps, stages)
    ptx = ck.asm["ptx"]
    out.append(dict(kernel=kernel, wgmma=ptx.count("wgmma.mma_async"), cubin=len(ck.asm["cubin"]),
                    spills="local" in ptx, shared=ck.metadata.shared))
ck = fa.compile_for_sm90("dq", torch.float64, 16, True, 32, 16, 4, 2)  # gradcheck's float64 path on the GPU
out.append(dict(kernel="dq fp64", dmma=ck.asm["ptx"].count("mma.sync"), cubin=len(ck.asm["cubin"])))
print(json.dumps(out))
"""


@pytest.mark.op("flash_attention_fwd")
@pytest.mark.op("flash_attention_bwd")
def test_kernels_compile_for_sm90():
    """Triton compiles every kernel for sm_90 on the host (a separate process: under the interpreter the
    kernels are not compiled objects). bf16 products must reach wgmma, nothing may spill to local memory, and
    the float64 path of gradcheck must compile to DMMA."""
    results = compile_script_results(COMPILE_SCRIPT)
    for r in results[:4]:
        assert r["wgmma"] > 0 and r["cubin"] > 0 and not r["spills"], r
        assert r["shared"] <= 227 * 1024, r  # what one block may use on an H100/H200
    assert results[4]["cubin"] > 0 and not results[4]["spills"]
    assert results[5]["dmma"] > 0 and results[5]["cubin"] > 0


# ---------------------------------------------------------------- GPU only: bf16, the accuracy criterion

def _fp32_and_math_errors(q, k, v, do, causal):
    """The fp32 reference (output and gradients) on the same rounded inputs, and the errors against it of
    PyTorch's attention written out in q's dtype (matmuls and softmax in bf16/fp16, as the FlashAttention tests
    build their same-precision yardstick; SDPA's math backend may upcast internally, which would make it an
    fp32 computation)."""
    leaves32 = [t.float().requires_grad_() for t in (q, k, v)]
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o32 = fa.attention_ref(*leaves32, causal)
    o = fa.attention_ref(*leaves, causal)
    g32 = torch.autograd.grad(o32, leaves32, do.float())
    g = torch.autograd.grad(o, leaves, do)
    return o32.detach(), g32, (o.float() - o32).abs().max().item(), [(a.float() - b).abs().max().item()
                                                                      for a, b in zip(g, g32)]


@pytest.mark.gpu
@pytest.mark.op("flash_attention_fwd")
@pytest.mark.op("flash_attention_bwd")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("b, h, s, d, causal", [(2, 4, 1024, 128, False), (2, 4, 1024, 128, True),
                                                (1, 8, 777, 64, True), (1, 4, 4096, 128, False),
                                                (2, 2, 2048, 64, False)])
def test_gpu_error_within_twice_torch(b, h, s, d, causal, dtype):
    """The issue's accuracy criterion: against an fp32 reference, the Triton forward's and backward's largest
    errors are at most twice those of PyTorch's attention computed in the same precision (plus a floor of one
    bf16/fp16 ulp at 1/64 for outputs that PyTorch happens to get exactly right)."""
    gen = torch.Generator(device="cuda").manual_seed(s + d)
    q, k, v, do = (torch.randn(b, h, s, d, device="cuda", generator=gen).to(dtype) for _ in range(4))
    o32, g32, torch_o_err, torch_g_err = _fp32_and_math_errors(q, k, v, do, causal)
    floor = torch.finfo(dtype).eps / 64
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = fa.flash_attention(*leaves, causal)
    ours_o = (o.float() - o32).abs().max().item()
    assert ours_o <= 2 * torch_o_err + floor, (ours_o, torch_o_err)
    grads = torch.autograd.grad(o, leaves, do)
    for name, g, r, t in zip(("dq", "dk", "dv"), grads, g32, torch_g_err):
        ours = (g.float() - r).abs().max().item()
        assert ours <= 2 * t + floor, (name, ours, t)


@pytest.mark.gpu
@pytest.mark.op("flash_attention_fwd")
@pytest.mark.parametrize("version", ["v0", "v1", "v2"])
def test_gpu_versions_at_a_benchmark_shape(version):
    """Every forward version at a sweep shape (B=16, S=1024, causal), bf16, against float64, as the harness
    checks it before timing."""
    op = get_op("flash_attention_fwd")
    impl = op.impls[version]
    if impl.unavailable():
        skip_unavailable(impl.unavailable())
    size = {"b": 2, "h": 8, "s": 1024, "d": 128, "causal": True}
    args = op.make_inputs(size, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
    _assert_close(impl.fn(*args), op.reference_fp64(args), torch.bfloat16, f"{version} o")


@pytest.mark.gpu
@pytest.mark.op("flash_attention_bwd")
@pytest.mark.parametrize("version", ["v0", "v1", "v2"])
def test_gpu_backward_versions_time_only_the_backward(version):
    """After the first call fills the slot, a call launches no forward kernel: the profiler sees no kernel
    whose name says forward (flash_fwd, attn_fwd, cudnn fprop)."""
    op = get_op("flash_attention_bwd")
    impl = op.impls[version]
    if impl.unavailable():
        skip_unavailable(impl.unavailable())
    args = op.make_inputs({"b": 1, "h": 4, "s": 512, "d": 128, "causal": False}, torch.bfloat16, "cuda",
                          torch.Generator().manual_seed(0))
    first = impl.fn(*args)
    for g, r, name in zip(first, op.reference_fp64(args), ("dq", "dk", "dv")):
        _assert_close(g, r, torch.bfloat16, f"{version} {name}")
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        impl.fn(*args)
        torch.cuda.synchronize()
    names = [e.key.lower() for e in prof.key_averages()]
    assert names, "no kernels recorded"
    assert not [n for n in names if "fwd" in n or "fprop" in n], names


def test_launch_policy_tunes_only_long_16_bit_sequences(monkeypatch):
    """On a GPU: bf16/fp16 at S >= TUNE_MIN_S are autotuned; short sequences and fp32 take one fixed launch
    (tuning them costs more than it saves), fp64 (the gradient check) the small blocks; whole blocks in each
    fixed launch nest as the kernels require (causal diagonal: BLOCK_M a multiple of BLOCK_N in fwd and dq,
    BLOCK_N a multiple of BLOCK_M in dkdv)."""
    monkeypatch.setattr(fa, "triton_interpreting", lambda: False)
    for dtype in (torch.bfloat16, torch.float16):
        assert fa._fixed_launch("fwd", dtype, fa.TUNE_MIN_S) is None
        assert fa._fixed_launch("fwd", dtype, fa.TUNE_MIN_S - 1) == fa.FIXED_LAUNCH["fwd"]
    assert fa._fixed_launch("dq", torch.float32, 4096) == fa.FIXED_LAUNCH["dq"]
    assert fa._fixed_launch("dkdv", torch.float64, 4096)[:2] == fa.INTERPRETER_BLOCKS["dkdv"]
    for table in (fa.FIXED_LAUNCH, {k: (*v, 4, 2) for k, v in fa.INTERPRETER_BLOCKS.items()}):
        assert table["fwd"][0] % table["fwd"][1] == 0 and table["dq"][0] % table["dq"][1] == 0
        assert table["dkdv"][1] % table["dkdv"][0] == 0
