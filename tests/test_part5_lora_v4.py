"""LoRA v4 (snippets/part5/lora_v4.py): v2's plan on Part 4's persistent TMA kernel.

On a CPU the kernel runs under the Triton interpreter, which emulates the tensor descriptors: a few
"SMs" (INTERPRET_SMS) and 32 x 32 tiles, so every program loops over several tiles. The forward
tests shared with v2 and v3 are in test_part5_lora.py (FWD); here: which path runs, the stored U,
the backward, the configurations (compiled for sm_90 on the CPU: their shared memory), and on the GPU
every config at ragged and large shapes.
"""

from __future__ import annotations

import pytest
import torch
import triton
from helpers import assert_close_within, compile_script_results

from conftest import DEVICE, poison_allocator
from snippets.common import gemm
from snippets.common.gemm import SMEM_LIMIT_SM90, config_space
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


# ---------------------------------------------------------------- the configurations

def test_configs_are_part4s_persistent_space():
    """The extra step runs on the CUDA cores and stages no tile in shared memory: v4 tunes over Part 4's persistent
    configurations (4 stages of 128 x 256 tiles included) with Part 4's pruning, keyed on r as well."""
    tuner = l4.tma_autotuned(True, torch.bfloat16)
    assert [str(c) for c in tuner.configs] == [str(c) for c in config_space(2, True)]
    assert tuner.keys == ["M", "N", "K", "R", "B_KMAJOR"]
    assert any(c.kwargs["BLOCK_N"] == 256 and c.num_stages == 4 for c in tuner.configs)


# ---------------------------------------------------------------- GPU: every config, ragged and large shapes

GPU_SHAPES = [(129, 256, 384, 7), (300, 1024, 520, 64), (1, 4096, 4096, 16), (2048, 4096, 1024, 128),
              (1000, 512, 2048, 33)]


@pytest.mark.gpu
@pytest.mark.parametrize("index", range(len(config_space(2, True))))
def test_every_config_gpu(monkeypatch, index):
    cfg = config_space(2, True)[index]
    one = triton.autotune(configs=[cfg], key=["M", "N", "K", "R", "B_KMAJOR"])(l4._lora_tma_kernel)
    monkeypatch.setattr(l4, "tma_autotuned", lambda persistent, dtype: one)
    for t, d_in, d_out, r in GPU_SHAPES[:2]:
        x, w, a, b, scale = _inputs(t, d_in, d_out, r, torch.bfloat16, "cuda", seed=r)
        y = l4.lora_linear_tma(x, w, a, b, scale)
        assert_close_within(y,
                            lo.lora_linear_ref(*_double((x, w, a, b, scale))), lo.TOLERANCES,
                            torch.bfloat16, f"{cfg} {t}x{d_in}x{d_out} r{r}")


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
from snippets.common.gemm import config_space
from snippets.common.introspect import triton_compile
from snippets.part5 import lora_v4 as l4
out = []
for cfg in config_space(2, True):
    bm, bn = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"]
    sig = {"a_desc": f"tensordesc<bf16[{bm}, 64]>", "b_desc": f"tensordesc<bf16[{bn}, 64]>",
           "c_desc": f"tensordesc<bf16[{bm}, {bn // 2}]>", "u_ptr": "*bf16", "q_ptr": "*bf16",
           "stride_um": "i32", "stride_qn": "i32", "M": "i32", "N": "i32", "K": "i32"}
    consts = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, GROUP_M=8, NUM_SMS=132, B_KMAJOR=True, FLATTEN=True,
                  R=16, stride_qr=1)
    divisible = [n for n, t in sig.items() if t[0] == "*" or t == "i32"]
    ck = triton_compile(l4._lora_tma_kernel, sig, consts, divisible, num_warps=cfg.num_warps,
                        num_stages=cfg.num_stages)
    ptx = ck.asm["ptx"]
    out.append(dict(cfg=str(cfg), tile=[bm, bn], shared=ck.metadata.shared, spills=".local" in ptx,
                    shapes=sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx))),
                    tma=len(re.findall(r"cp\.async\.bulk\.tensor", ptx))))
print(json.dumps(out))
"""


@pytest.mark.cpu_only
def test_kernel_compiles_for_sm90_within_the_shared_memory_for_every_config_the_pruner_keeps(monkeypatch):
    """v4's kernel (the forward's K-major W, r = 16) compiles for sm_90 to TMA copies and wgmma, without spills,
    for every configuration of Part 4's persistent space, and on an sm_90 device Part 4's pruner keeps them all
    (4 stages of 128 x 256 tiles included). The pruner counts Part 4's stages and staging tile (smem_bytes), not
    what the compiler may add for the extra step (layout conversions of U's and Q's vectors through shared memory),
    so the compiler's own count is what is held to the limit here."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    tuner = l4.tma_autotuned(True, torch.bfloat16)
    monkeypatch.setattr(gemm, "device_smem_limit", lambda index: SMEM_LIMIT_SM90)
    desc = TensorDescriptor.from_tensor(torch.empty(64, 64, dtype=torch.bfloat16), [64, 64])
    kept = {str(c) for c in tuner.early_config_prune(tuner.configs, {"a_desc": desc, "c_desc": desc})}
    assert kept == {str(c) for c in config_space(2, True)}
    results = compile_script_results(COMPILE_SCRIPT)
    assert [res["cfg"] for res in results] == [str(c) for c in config_space(2, True)]
    for res in results:
        bm, bn = res["tile"]
        assert f"m64n{bn if bm == 128 else 128}k16" in res["shapes"] and not res["spills"] and res["tma"], res
        if res["cfg"] in kept:
            assert res["shared"] <= SMEM_LIMIT_SM90, res
