"""LoRA v4 (snippets/part5/lora_v4.py): v2's plan on Part 4's persistent TMA kernel.

On a CPU the kernel runs under the Triton interpreter, which emulates the tensor descriptors: a few
"SMs" (INTERPRET_SMS) and 32 x 32 tiles, so every program loops over several tiles. The forward
tests shared with v2 and v3 are in test_part5_lora.py (FWD); here: which path runs, the stored U,
the backward, the shared-memory model, and on the GPU every config at ragged and large shapes.
"""

from __future__ import annotations

import pytest
import torch
import triton
from helpers import assert_close_within, compile_script_results

from conftest import DEVICE, poison_allocator
from snippets.common.gemm import SMEM_LIMIT_SM90
from snippets.part5 import lora as lo
from snippets.part5 import lora_v4 as l4

pytestmark = [pytest.mark.op("lora_linear"), pytest.mark.op("lora_linear_fwd_bwd")]


def _inputs(t, d_in, d_out, r, dtype=torch.float16, device=DEVICE, seed=0, fwd_bwd=False):
    gen = torch.Generator().manual_seed(seed)
    size = {"t": t, "d_in": d_in, "d_out": d_out, "r": r}
    return (lo._make_inputs_fwd_bwd if fwd_bwd else lo._make_inputs)(size, dtype, device, gen)


def _double(args):
    return [a.double() if isinstance(a, torch.Tensor) else a for a in args]


@pytest.fixture
def tma_calls(monkeypatch):
    """Counts the launches of v4's kernel (lora_tma), to tell its path from v3's fallback."""
    calls = []
    real = l4.lora_tma

    def spy(*args, **kwargs):
        calls.append(args[2].shape)  # U's (or V's) shape
        return real(*args, **kwargs)

    monkeypatch.setattr(l4, "lora_tma", spy)
    return calls


# ---------------------------------------------------------------- which path runs

@pytest.mark.parametrize("t, d_in, d_out, r", [(1, 16, 8, 1), (70, 96, 80, 20), (33, 64, 40, 33)])
def test_aligned_16bit_inputs_take_the_tma_kernel(tma_calls, t, d_in, d_out, r):
    x, w, a, b, scale = _inputs(t, d_in, d_out, r, seed=t)
    y = l4.lora_linear_tma(x, w, a, b, scale)
    assert tma_calls == [(t, r)]
    assert_close_within(y, lo.lora_linear_ref(*_double((x, w, a, b, scale))), lo.TOLERANCES,
                        torch.float16, f"v4 {t}x{d_in}x{d_out} r{r}")


@pytest.mark.parametrize("case", ["d_out not a multiple of 8", "d_in not a multiple of 8", "fp32",
                                  "x at an offset"])
def test_what_tma_cannot_move_goes_to_v3(tma_calls, case):
    t, d_in, d_out, dtype = 9, 64, 40, torch.float16
    if case == "d_out not a multiple of 8":
        d_out = 33
    elif case == "d_in not a multiple of 8":
        d_in = 36
    elif case == "fp32":
        dtype = torch.float32
    x, w, a, b, scale = _inputs(t, d_in, d_out, 4, dtype, seed=3)
    if case == "x at an offset":  # a contiguous view 2 bytes into its storage
        x = torch.cat([x.new_zeros(1), x.flatten()])[1:].view(t, d_in)
        assert x.is_contiguous() and x.data_ptr() % 16
    y = l4.lora_linear_tma(x, w, a, b, scale)
    assert tma_calls == []
    torch.testing.assert_close(y, lo.lora_linear_fused(x, w, a, b, scale), rtol=0, atol=0)


def test_v4_refuses_what_v3_refuses():
    x, w, a, b, scale = _inputs(4, 16, 8, 2)
    with pytest.raises(RuntimeError, match="frozen weight"):
        l4.lora_linear_tma(x, w.clone().requires_grad_(), a, b, scale)
    with pytest.raises(RuntimeError, match="gradients of its own kernels"):
        l4.lora_linear_fwd_bwd_tma(x.clone().requires_grad_(), w, a, b, scale, torch.ones(4, 8, dtype=x.dtype))
    with pytest.raises(ValueError, match=r"b must be \(D_out"):
        l4.lora_linear_tma(x, w, a, b.T.contiguous(), scale)


def test_lora_tma_refuses_a_strided_u():
    x, w, a, b, scale = _inputs(8, 16, 8, 2)
    with pytest.raises(ValueError, match="u must be contiguous"):
        l4.lora_tma(x, w.T, torch.zeros(2, 8, dtype=x.dtype, device=x.device).T, b.T)


# ---------------------------------------------------------------- U, the backward

def test_projection_is_scale_x_p_transposed_rounded_once():
    x, w, a, b, scale = _inputs(70, 96, 80, 20, seed=5)
    poison_allocator(70 * 20 * 2, DEVICE)
    u = l4.project(x, a, 3.0)
    assert u.shape == (70, 20) and u.dtype == x.dtype and not u.isnan().any()
    want = 3.0 * (x.double() @ a.double().T)
    torch.testing.assert_close(u.double(), want, rtol=2**-10, atol=2**-9)


def test_the_extra_step_is_u_times_q():
    """lora_tma with a given U: C = x W^T + U Q, U's columns past r contributing nothing."""
    x, w, a, b, scale = _inputs(70, 96, 80, 20, seed=6)
    u = torch.randn(70, 20, generator=torch.Generator().manual_seed(1)).to(x.dtype).to(x.device)
    y = l4.lora_tma(x, w.T, u, b.T)
    want = x.double() @ w.double().T + u.double() @ b.double().T
    assert_close_within(y, want, lo.TOLERANCES, torch.float16, "lora_tma")


@pytest.mark.parametrize("t, d_in, d_out, r", [(1, 16, 8, 1), (70, 96, 80, 20), (40, 72, 48, 33)])
def test_backward(tma_calls, t, d_in, d_out, r):
    args = _inputs(t, d_in, d_out, r, seed=t, fwd_bwd=True)
    got = l4.lora_linear_fwd_bwd_tma(*args)
    assert tma_calls == [(t, r), (t, r)]  # the forward (with U) and dx (with V)
    for name, g, want in zip(("dx", "dA", "dB"), got, lo.lora_linear_fwd_bwd_ref(*_double(args))):
        assert_close_within(g, want, lo.TOLERANCES, torch.float16, f"v4 {name} {t}x{d_in}x{d_out} r{r}")


def test_a_model_trains_through_v4(tma_calls):
    """Grad mode on: the forward goes through LoRALinearTMA, leading dimensions are kept, A and B get
    the gradients of a loss, W none."""
    x, w, a, b, scale = _inputs(24, 32, 16, 4, seed=2)
    xs, As, Bs = (v.clone().requires_grad_() for v in (x, a, b))
    y = l4.lora_linear_tma(xs.view(2, 12, 32), w, As, Bs, scale)
    assert y.shape == (2, 12, 16)
    y.float().square().mean().backward()
    # the same loss through the float64 reference; each gradient held to 1% of its largest entry
    xd, ad, bd = (v.double().requires_grad_() for v in (x, a, b))
    lo.lora_linear_ref(xd, w.double(), ad, bd, scale).square().mean().backward()
    for name, g, want in zip(("dx", "dA", "dB"), (xs.grad, As.grad, Bs.grad), (xd.grad, ad.grad, bd.grad)):
        tol = 1e-2 * want.abs().max().item()
        torch.testing.assert_close(g.double(), want, rtol=1e-2, atol=tol, msg=lambda m: f"{name}: {m}")
    assert tma_calls == [(24, 4), (24, 4)] and w.grad is None


def test_empty_batch_trains():
    _, w, a, b, scale = _inputs(1, 16, 8, 2)
    x = torch.empty(0, 16, dtype=w.dtype, device=w.device, requires_grad=True)
    As = a.clone().requires_grad_()
    y = l4.lora_linear_tma(x, w, As, b, scale)
    y.sum().backward()
    assert y.shape == (0, 8) and torch.equal(As.grad, torch.zeros_like(a))


# ---------------------------------------------------------------- the shared-memory model

def test_configs_fit_the_h100_shared_memory_as_the_pruner_counts_it():
    """At r <= 16 (BLOCK_R = 16) every 3-stage config fits in 227 KiB and the two widest 4-stage ones do
    not (Part 4's kernel fits them; the U and Q tiles tip them over); at BLOCK_R = 128 only the 128 x 128
    tiles fit."""
    fits = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages):
            l4.tma_smem_bytes(c, 16, 2) <= SMEM_LIMIT_SM90 for c in l4.tma_configs()}
    assert fits == {(128, 128, 4, 3): True, (128, 128, 4, 4): True, (128, 128, 8, 3): True,
                    (128, 128, 8, 4): True, (128, 256, 8, 3): True, (128, 256, 8, 4): False,
                    (256, 128, 8, 3): True, (256, 128, 8, 4): False}
    wide = [c for c in l4.tma_configs() if c.kwargs["BLOCK_N"] == 256 and c.num_stages == 3][0]
    # 3 x (128 + 256) x 64 x 2 bytes of boxes, a 128 x 128 staging half of C, U and Q at 128 wide
    assert l4.tma_smem_bytes(wide, 128, 2) == 3 * 384 * 128 + 128 * 128 * 2 + 384 * 128 * 2 > SMEM_LIMIT_SM90
    assert {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in l4.tma_configs()
            if l4.tma_smem_bytes(c, 128, 2) <= SMEM_LIMIT_SM90} == {(128, 128)}


# ---------------------------------------------------------------- GPU: every config, ragged and large shapes

GPU_SHAPES = [(129, 256, 384, 7), (300, 1024, 520, 64), (1, 4096, 4096, 16), (2048, 4096, 1024, 128),
              (1000, 512, 2048, 33)]


@pytest.mark.gpu
@pytest.mark.parametrize("index", range(len(l4.tma_configs())))
def test_every_config_gpu(monkeypatch, index):
    cfg = l4.tma_configs()[index]
    one = triton.autotune(configs=[cfg], key=["M", "N", "K", "BLOCK_R", "B_KMAJOR"],
                          prune_configs_by={"early_config_prune": l4.prune_tma})(l4._lora_tma_kernel)
    monkeypatch.setattr(l4, "tma_autotuned", lambda persistent, dtype: one)
    ran = 0
    for t, d_in, d_out, r in GPU_SHAPES[:2]:
        if l4.tma_smem_bytes(cfg, lo.block_r(r), 2) > SMEM_LIMIT_SM90:
            continue  # the pruner keeps it out on a GPU
        x, w, a, b, scale = _inputs(t, d_in, d_out, r, torch.bfloat16, "cuda", seed=r)
        try:
            y = l4.lora_linear_tma(x, w, a, b, scale)
        except triton.runtime.errors.OutOfResources:
            # the model is a few KiB short of the compiler's count: the autotuner drops such a config
            assert cfg.num_stages == 4, cfg
            continue
        ran += 1
        assert_close_within(y,
                            lo.lora_linear_ref(*_double((x, w, a, b, scale))), lo.TOLERANCES,
                            torch.bfloat16, f"{cfg} {t}x{d_in}x{d_out} r{r}")
    assert ran or cfg.num_stages == 4, cfg


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("t, d_in, d_out, r", GPU_SHAPES)
def test_forward_and_backward_gpu(tma_calls, dtype, t, d_in, d_out, r):
    x, w, a, b, scale = _inputs(t, d_in, d_out, r, dtype, "cuda", seed=t)
    assert_close_within(l4.lora_linear_tma(x, w, a, b, scale), lo.lora_linear_ref(*_double((x, w, a, b, scale))),
                        lo.TOLERANCES, dtype, f"v4 forward {t}x{d_in}x{d_out} r{r}")
    args = _inputs(t, d_in, d_out, r, dtype, "cuda", seed=t + 1, fwd_bwd=True)
    for name, g, want in zip(("dx", "dA", "dB"), l4.lora_linear_fwd_bwd_tma(*args),
                             lo.lora_linear_fwd_bwd_ref(*_double(args))):
        assert_close_within(g, want, lo.TOLERANCES, dtype, f"v4 {name} {t}x{d_in}x{d_out} r{r}")
    assert tma_calls == [(t, r)] * 3


@pytest.mark.gpu
def test_headline_gpu_and_repeatable():
    """The benchmarked size in bf16, twice: the same bits (no split-K, no atomics)."""
    x, w, a, b, scale = lo._make_inputs(lo.HEADLINE, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
    y = l4.lora_linear_tma(x, w, a, b, scale)
    ref = lo.lora_linear_ref(x.float(), w.float(), a.float(), b.float(), scale)
    rtol, atol = lo.TOLERANCES[torch.bfloat16]
    torch.testing.assert_close(y.float(), ref, rtol=rtol, atol=atol)
    assert torch.equal(y, l4.lora_linear_tma(x, w, a, b, scale))


# ---------------------------------------------------------------- sm_90, compiled on the CPU

COMPILE_SCRIPT = r"""
import json, re
from snippets.common.introspect import triton_compile
from snippets.part5 import lora_v4 as l4
out = []
for bm, bn, warps, stages, br in ((128, 256, 8, 3, 16), (128, 128, 4, 4, 16), (128, 128, 8, 3, 128)):
    sig = {"a_desc": f"tensordesc<bf16[{bm}, 64]>", "b_desc": f"tensordesc<bf16[{bn}, 64]>",
           "c_desc": f"tensordesc<bf16[{bm}, {bn // 2}]>", "u_ptr": "*bf16", "q_ptr": "*bf16", "R": "i32",
           "stride_um": "i32", "stride_qn": "i32", "M": "i32", "N": "i32", "K": "i32"}
    consts = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, GROUP_M=8, NUM_SMS=132, B_KMAJOR=True, FLATTEN=True,
                  BLOCK_R=br, stride_qr=1)
    divisible = [n for n, t in sig.items() if t[0] == "*" or t == "i32"]
    ck = triton_compile(l4._lora_tma_kernel, sig, consts, divisible, num_warps=warps, num_stages=stages)
    ptx = ck.asm["ptx"]
    out.append(dict(cfg=[bm, bn, warps, stages, br], shared=ck.metadata.shared, spills=".local" in ptx,
                    shapes=sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx))),
                    tma=len(re.findall(r"cp\.async\.bulk\.tensor", ptx))))
print(json.dumps(out))
"""


@pytest.mark.cpu_only
def test_kernel_compiles_for_sm90_with_the_shared_memory_the_pruner_counts():
    """v4's kernel (the forward's K-major W) compiles for sm_90 to TMA copies and wgmma, without spills. At
    BLOCK_R = 16 the pruner's count is the compiler's to within the mbarriers (a few dozen bytes); at BLOCK_R =
    128 the compiler needs more than the count, and a configuration the count lets through can fail to launch:
    the autotuner then drops it (Triton's autotuner skips a config that runs out of resources)."""
    for res in compile_script_results(COMPILE_SCRIPT):
        bm, bn, warps, stages, br = res["cfg"]
        cfg = triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64), num_warps=warps, num_stages=stages)
        model = l4.tma_smem_bytes(cfg, br, 2)
        assert f"m64n{bn if bm == 128 else 128}k16" in res["shapes"] and not res["spills"] and res["tma"], res
        if br == 16:
            assert 0 <= res["shared"] - model <= 64, (res, model)
        else:
            assert res["shared"] > model, (res, model)
