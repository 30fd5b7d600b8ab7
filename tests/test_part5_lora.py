"""LoRA beyond the generic reference check: both Triton designs (the skinny kernel then one GEMM with an extra
K step, and the one-kernel version that computes x A^T in the K loop) on ragged shapes, ranks that are not
multiples of 16 and leading dimensions; the backward against autograd and torch.autograd.gradcheck (float64,
through the interpreter on the CPU); the U that the one-kernel forward stores; empty batches; a frozen W; clear
refusal of bad input; and the GEMM kernel compiled for sm_90 on any machine. bf16 and the autotuned launches
are marked ``gpu``."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch
import triton
from helpers import assert_close_within, compile_script_results

from conftest import DEVICE, HAS_GPU, poison_allocator
from snippets.common.introspect import layouts, parse_ptxas, ptxas_report
from snippets.part5 import lora as lo
from snippets.part5 import lora_v4 as l4

# v4 (snippets/part5/lora_v4.py) takes the forward tests too: its own tests are test_part5_lora_v4.py
FWD = {"v2": lo.lora_linear_two_kernels, "v3": lo.lora_linear_fused, "v4": l4.lora_linear_tma}
IN_LOOP = {"v2": False, "v3": True}
CPU_TYPES = (torch.float16, torch.float32)  # the interpreter has no bf16 arithmetic


def _inputs(t, d_in, d_out, r, dtype=torch.float32, device=DEVICE, seed=0, fwd_bwd=False):
    gen = torch.Generator().manual_seed(seed)
    size = {"t": t, "d_in": d_in, "d_out": d_out, "r": r}
    make = lo._make_inputs_fwd_bwd if fwd_bwd else lo._make_inputs
    return make(size, dtype, device, gen)


def _assert_close(out, ref, dtype, what):
    assert_close_within(out, ref, lo.TOLERANCES, dtype, what)


def _ref(*args):
    return lo.lora_linear_ref(*(a.double() if isinstance(a, torch.Tensor) else a for a in args))


def _ref_grads(*args):
    return lo.lora_linear_fwd_bwd_ref(*(a.double() if isinstance(a, torch.Tensor) else a for a in args))


# ---------------------------------------------------------------- registry and reference (no kernels)

@pytest.mark.op("lora_linear")
@pytest.mark.op("lora_linear_fwd_bwd")
def test_registry():
    assert list(lo.lora_linear.impls) == list(lo.lora_linear_fwd_bwd.impls) == ["v0", "v1", "v2", "v3", "v4"]
    for op in (lo.lora_linear, lo.lora_linear_fwd_bwd):
        assert op.metric == "TFLOP/s" and op.ceiling == "gemm_bf16" and op.measure_memory
        assert op.timed_dtypes() == (torch.bfloat16,)
        assert op.headline == {"t": 8192, "d_in": 4096, "d_out": 4096, "r": 16}
    size = {"t": 3, "d_in": 5, "d_out": 7, "r": 2}
    assert lo._flops(size, torch.bfloat16) == 2 * 3 * 7 * 5 + 2 * 3 * 2 * (5 + 7)
    assert lo._flops_fwd_bwd(size, torch.bfloat16) == 2 * (2 * 3 * 7 * 5) + 6 * 3 * 2 * (5 + 7)
    assert lo._bytes(size, torch.bfloat16) == (15 + 35 + 10 + 14 + 21) * 2
    # x, W and y at the headline: well beyond the 50 MB L2.
    assert lo._bytes(lo.HEADLINE, torch.bfloat16) > 3 * 50e6


@pytest.mark.op("lora_linear")
def test_reference_is_the_concatenated_product():
    """The identity both kernels use: x W^T + (scale x A^T) B^T = [x, U] @ [W, B]^T, one product over
    D_in + r."""
    x, w, a, b, scale = _inputs(9, 20, 11, 3, torch.float64, "cpu")
    u = scale * x @ a.T
    joined = torch.cat([x, u], dim=1) @ torch.cat([w, b], dim=1).T
    torch.testing.assert_close(joined, lo.lora_linear_ref(x, w, a, b, scale))
    torch.testing.assert_close(lo.lora_linear_torch(x, w, a, b, scale), lo.lora_linear_ref(x, w, a, b, scale))


@pytest.mark.op("lora_linear_fwd_bwd")
def test_closed_form_backward_matches_autograd():
    x, w, a, b, scale, dy = _inputs(6, 10, 7, 3, torch.float64, "cpu", fwd_bwd=True)
    leaves = [t.clone().requires_grad_() for t in (x, a, b)]
    want = torch.autograd.grad(lo.lora_linear_ref(leaves[0], w, leaves[1], leaves[2], scale), leaves, dy)
    for got, exp in zip(lo.lora_linear_fwd_bwd_ref(x, w, a, b, scale, dy), want):
        torch.testing.assert_close(got, exp)


@pytest.mark.op("lora_linear")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tolerance_sees_a_lost_low_rank_term(dtype):
    """The inputs make the low-rank term as large as the frozen one: dropping it (or the scale) fails."""
    x, w, a, b, scale = _inputs(64, 64, 96, 4, torch.float64, "cpu")
    rtol, atol = lo.TOLERANCES[dtype]
    ref = lo.lora_linear_ref(x, w, a, b, scale)
    assert not torch.allclose(x @ w.T, ref, rtol=rtol, atol=atol)
    assert not torch.allclose(lo.lora_linear_ref(x, w, a, b, 1.0), ref, rtol=rtol, atol=atol)


def test_block_r_and_shared_memory_model():
    assert [lo.block_r(r) for r in (1, 16, 17, 33, 64, 128)] == [16, 16, 32, 64, 64, 128]
    cfg = triton.Config(dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64), num_stages=3)
    assert lo.gemm_smem_bytes(cfg, 16, 2, False) == 3 * (128 + 256) * 64 * 2  # 144 KiB
    assert lo.gemm_smem_bytes(cfg, 16, 2, True) == 3 * (128 + 256 + 16) * 64 * 2
    # The biggest config with a 128-wide U tile needs more than the 227 KiB of an H100/H200: pruned there.
    big = triton.Config(dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=64), num_stages=4)
    assert lo.gemm_smem_bytes(big, 128, 2, True) > 227 * 1024


# ---------------------------------------------------------------- forward through the kernels

SHAPES = [(1, 16, 8, 1), (17, 40, 24, 16), (33, 65, 31, 17), (40, 72, 33, 33), (96, 64, 100, 5)]


@pytest.mark.op("lora_linear")
@pytest.mark.parametrize("version", sorted(FWD))
@pytest.mark.parametrize("dtype", CPU_TYPES)
@pytest.mark.parametrize("t, d_in, d_out, r", SHAPES)
def test_forward(version, dtype, t, d_in, d_out, r, device):
    x, w, a, b, scale = _inputs(t, d_in, d_out, r, dtype, seed=t + r)
    poison_allocator(t * max(d_in, d_out) * 4, device)
    _assert_close(FWD[version](x, w, a, b, scale), _ref(x, w, a, b, scale), dtype, f"{version} {t}x{d_in}x{d_out} r{r}")


@pytest.mark.op("lora_linear")
@pytest.mark.parametrize("version", sorted(FWD))
def test_forward_leading_dims_and_scale(version, device):
    x, w, a, b, _ = _inputs(12, 24, 20, 8, seed=3)
    x3 = x.reshape(3, 4, 24)
    for scale in (0.0, -0.5, 3):
        y = FWD[version](x3, w, a, b, scale)
        assert y.shape == (3, 4, 20)
        _assert_close(y.reshape(12, 20), _ref(x, w, a, b, scale), torch.float32, f"{version} scale {scale}")


@pytest.mark.op("lora_linear")
@pytest.mark.parametrize("version", sorted(FWD))
def test_forward_max_rank(version, device):
    x, w, a, b, scale = _inputs(20, 48, 40, lo.MAX_RANK, seed=5)
    _assert_close(FWD[version](x, w, a, b, scale), _ref(x, w, a, b, scale), torch.float32, f"{version} r=128")


@pytest.mark.op("lora_linear")
@pytest.mark.parametrize("version", sorted(FWD))
def test_forward_empty_batch(version, device):
    _, w, a, b, scale = _inputs(1, 16, 8, 2)
    y = FWD[version](torch.empty(0, 5, 16, device=device), w, a, b, scale)
    assert y.shape == (0, 5, 8)


@pytest.mark.op("lora_linear")
def test_fused_forward_stores_the_same_u(device):
    """v3's first column of programs stores U = scale x A^T: the same numbers v2's skinny kernel writes (bit
    for bit under the interpreter, where both sum the same 32-wide K slices in the same order)."""
    x, w, a, b, scale = _inputs(70, 72, 100, 20, torch.float16, seed=7)
    u_two = lo._project(x, a.T, scale)
    poison_allocator(70 * 20 * 4, device)
    y, u_one = lo._lora_matmul(x, w.T, b.T, p=a.T, scale=scale, store_u=True)
    assert not u_one.isnan().any()
    if DEVICE == "cpu":
        assert torch.equal(u_one, u_two)
    else:
        torch.testing.assert_close(u_one, u_two, rtol=2e-3, atol=2e-3)
    _assert_close(y, _ref(x, w, a, b, scale), torch.float16, "v3 with U stored")


# ---------------------------------------------------------------- backward

@pytest.mark.op("lora_linear_fwd_bwd")
@pytest.mark.parametrize("version", sorted(IN_LOOP))
@pytest.mark.parametrize("dtype", CPU_TYPES)
@pytest.mark.parametrize("t, d_in, d_out, r", [(1, 16, 8, 1), (33, 65, 31, 17), (40, 72, 33, 33)])
def test_backward(version, dtype, t, d_in, d_out, r, device):
    args = _inputs(t, d_in, d_out, r, dtype, seed=t, fwd_bwd=True)
    fn = lo.lora_linear_fwd_bwd_fused if IN_LOOP[version] else lo.lora_linear_fwd_bwd_two_kernels
    for name, got, want in zip(("dx", "dA", "dB"), fn(*args), _ref_grads(*args)):
        _assert_close(got, want, dtype, f"{version} {name} {t}x{d_in}x{d_out} r{r}")


@pytest.mark.op("lora_linear_fwd_bwd")
@pytest.mark.parametrize("in_loop", [False, True])
def test_backward_leading_dims_and_a_model_loss(in_loop, device):
    """The layer inside a model: x (batch, seq, D_in), a loss, .backward(); gradients land in .grad."""
    x, w, a, b, scale, _ = _inputs(6, 24, 20, 4, fwd_bwd=True, seed=2)
    x3, a_, b_ = (t.clone().requires_grad_() for t in (x.reshape(2, 3, 24), a, b))
    lo.lora_linear_train(x3, w, a_, b_, scale, in_loop=in_loop).square().sum().backward()
    refs = [t.detach().double().requires_grad_() for t in (x, a, b)]
    lo.lora_linear_ref(refs[0], w.double(), refs[1], refs[2], scale).square().sum().backward()
    for got, want in zip((x3.grad.reshape(6, 24), a_.grad, b_.grad), refs):
        torch.testing.assert_close(got.double(), want.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.op("lora_linear_fwd_bwd")
@pytest.mark.parametrize("in_loop", [False, True])
@pytest.mark.parametrize("t, d_in, d_out, r, fast", [(1, 3, 2, 1, False), (3, 5, 4, 2, False),
                                                    (9, 40, 37, 17, True)])
def test_gradcheck_float64(in_loop, t, d_in, d_out, r, fast, device):
    """torch.autograd.gradcheck in float64: the backward kernels against finite differences of the forward
    kernels (the interpreter runs float64 dots like any other; a GPU uses its fp64 MMA). The full check
    perturbs every input element (two forwards each); on the larger shape, which spans several tiles and a
    32-wide U tile, fast_mode compares one random projection of the Jacobian instead."""
    x, w, a, b, scale = _inputs(t, d_in, d_out, r, torch.float64, seed=t * r)
    leaves = tuple(v.clone().requires_grad_() for v in (x, a, b))
    assert torch.autograd.gradcheck(lambda x, a, b: lo.LoRALinearFunction.apply(x, w, a, b, scale, in_loop),
                                    leaves, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=fast)


@pytest.mark.op("lora_linear_fwd_bwd")
def test_gradcheck_can_fail(monkeypatch, device):
    """A backward that forgets the low-rank path of dx (V A): gradcheck must notice."""
    real = lo._backward

    def wrong(dy2, x2, w, a, b, u, scale, in_loop):
        dx, da, db = real(dy2, x2, w, a, b, u, scale, in_loop)
        return dx - scale * (dy2 @ b) @ a, da, db

    monkeypatch.setattr(lo, "_backward", wrong)
    x, w, a, b, scale = _inputs(2, 4, 3, 2, torch.float64, seed=1)
    leaves = tuple(v.clone().requires_grad_() for v in (x, a, b))
    assert not torch.autograd.gradcheck(lambda x, a, b: lo.LoRALinearFunction.apply(x, w, a, b, scale),
                                        leaves, raise_exception=False)


@pytest.mark.op("lora_linear_fwd_bwd")
@pytest.mark.parametrize("in_loop", [False, True])
def test_backward_empty_batch(in_loop, device):
    _, w, a, b, scale = _inputs(1, 16, 8, 2)
    x = torch.empty(0, 16, device=device, requires_grad=True)
    a_, b_ = a.clone().requires_grad_(), b.clone().requires_grad_()
    y = lo.lora_linear_train(x, w, a_, b_, scale, in_loop=in_loop)
    dx, da, db = torch.autograd.grad(y, (x, a_, b_), torch.empty(0, 8, device=device))
    assert dx.shape == (0, 16) and torch.equal(da, torch.zeros_like(a)) and torch.equal(db, torch.zeros_like(b))


def test_w_must_be_frozen(device):
    x, w, a, b, scale = _inputs(4, 16, 8, 2)
    with pytest.raises(ValueError, match="w must be frozen"):
        lo.lora_linear_train(x, w.clone().requires_grad_(), a, b, scale)


# ---------------------------------------------------------------- refusals

def _bad_inputs(device):
    x = torch.randn(4, 16, device=device)
    w, a, b = torch.randn(8, 16, device=device), torch.randn(2, 16, device=device), torch.randn(8, 2, device=device)
    return [
        ("float64 x", (x.double(), w, a, b, 1.0), TypeError, "dtype"),
        ("int32 inputs", (x.int(), w.int(), a.int(), b.int(), 1.0), TypeError, "dtype"),
        ("a of another dtype", (x, w, a.half(), b, 1.0), TypeError, "a has dtype torch.float16"),
        ("x with the wrong features", (x[:, :15].contiguous(), w, a, b, 1.0), ValueError, "w must be"),
        ("w transposed (D_in, D_out)", (x, w.T.contiguous(), a, b.T.contiguous().T.contiguous(), 1.0), ValueError,
         r"x has 16 features"),
        ("a of the wrong width", (x, w, torch.randn(2, 15, device=device), b, 1.0), ValueError, r"a must be \(r"),
        ("b of the wrong rank", (x, w, a, torch.randn(8, 3, device=device), 1.0), ValueError, r"b must be \(D_out"),
        ("b transposed", (x, w, a, b.T.contiguous(), 1.0), ValueError, r"b must be \(D_out"),
        ("1-D w", (x, w[0], a, b, 1.0), ValueError, "non-empty 2-D"),
        ("empty a", (x, w, a[:0], b[:, :0], 1.0), ValueError, "non-empty 2-D"),
        ("rank too large", (x, w, torch.randn(129, 16, device=device), torch.randn(8, 129, device=device), 1.0),
         ValueError, "rank r = 129"),
        ("strided x", (torch.randn(4, 32, device=device)[:, ::2], w, a, b, 1.0), ValueError, "contiguous"),
        ("0-d x", (x[0, 0], w, a, b, 1.0), ValueError, "at least one dimension"),
        ("scale a tensor", (x, w, a, b, torch.tensor(1.0)), TypeError, "scale must be a Python"),
        ("not a tensor", (x.tolist(), w, a, b, 1.0), TypeError, "torch.Tensor"),
    ]


@pytest.mark.op("lora_linear")
@pytest.mark.parametrize("version", sorted(FWD))
@pytest.mark.parametrize("case", range(len(_bad_inputs("cpu"))), ids=[c[0] for c in _bad_inputs("cpu")])
def test_bad_input(version, case, device):
    _, args, exc, msg = _bad_inputs(device)[case]
    with pytest.raises(exc, match=msg):
        FWD[version](*args)


def test_wrong_device_is_refused():
    if HAS_GPU:  # CPU tensors handed to the GPU kernels
        x, w, a, b, scale = _inputs(4, 16, 8, 2, device="cpu")
        with pytest.raises(ValueError, match="must be on a cuda device"):
            lo.lora_linear_fused(x, w, a, b, scale)
    else:  # under the interpreter the kernels take CPU tensors: a "meta" tensor is on no usable device
        x, w, a, b, scale = _inputs(4, 16, 8, 2, device="cpu")
        with pytest.raises(ValueError, match="must be on a cpu device"):
            lo.lora_linear_fused(x.to("meta"), w, a, b, scale)


# ---------------------------------------------------------------- Hopper code, compiled on any machine

COMPILE_SCRIPT = r"""
import json, re
import torch
from snippets.part5 import lora as lo
out = []
for in_loop in (False, True):
    ck = lo.compile_for_hopper(torch.bfloat16, u_in_loop=in_loop, r=16)
    ptx = ck.asm["ptx"]
    out.append(dict(in_loop=in_loop, shared=ck.metadata.shared, spills="local" in ptx,
                    shapes=sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)))))
print(json.dumps(out))
"""


@pytest.mark.op("lora_linear")
def test_gemm_kernel_compiles_to_wgmma_for_sm90():
    """Both modes of the GEMM kernel reach Hopper's wgmma for bf16 (the U dot too, as m64n16k16 when it is
    computed in the loop), with the shared memory gemm_smem_bytes predicts and no spills."""
    results = compile_script_results(COMPILE_SCRIPT)
    cfg = triton.Config(dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64), num_stages=3)
    for res in results:
        assert "m64n256k16" in res["shapes"] and not res["spills"], res
        assert ("m64n16k16" in res["shapes"]) == res["in_loop"], res
        assert res["shared"] == lo.gemm_smem_bytes(cfg, 16, 2, res["in_loop"]), res


# ---------------------------------------------------------------- why the fused GEMM is slower: compile-time facts

# Part 3's tensor-core kernel (snippets.common.gemm.matmul_kernel: B = K x N, N contiguous, no low-rank step) and
# this chapter's kernel as the forward launches it (B = W^T, a view: K contiguous), U given (v2) and U in the K
# loop (v3), bf16, r = 16, compiled for sm_90 with the same tiles, warps and stages.
FACTS_SCRIPT = r"""
import json
import torch
import triton.language as tl
from snippets.common.gemm import GROUP_M, matmul_kernel
from snippets.common.introspect import triton_compile
from snippets.part5 import lora as lo
out = []
for bm, bn, warps, stages in CONFIGS:
    sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16",
           **{n: "i32" for n in ("M", "N", "K", "stride_am", "stride_bk", "stride_cm")}}
    consts = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, GROUP_M=GROUP_M, INPUT_PRECISION="ieee")
    built = {"matmul_kernel": triton_compile(matmul_kernel, sig, consts, list(sig), num_warps=warps,
                                             num_stages=stages)}
    for v in ("v2", "v3"):
        built[v] = lo.compile_for_hopper(torch.bfloat16, u_in_loop=v == "v3", r=16, block_m=bm, block_n=bn,
                                         num_warps=warps, num_stages=stages)
    for name, ck in built.items():
        out.append(dict(config=[bm, bn, warps, stages], kernel=name, ptx=ck.asm["ptx"], ttgir=ck.asm["ttgir"],
                        shared=ck.metadata.shared, entry=ck.metadata.name))
print(json.dumps(out))
"""
# The headline's likely pick (the largest tile, 3 stages) and the one-warpgroup config of the space.
FACTS_CONFIGS = [(128, 256, 8, 3), (128, 128, 4, 4)]


def _k_loop(ptx: str) -> list[str]:
    """The instructions of the innermost loop of ``ptx``: from the label a later branch jumps back to, to that
    branch (the K loop of these kernels)."""
    lines = [ln.strip() for ln in ptx.splitlines()]
    labels = {m.group(1): i for i, ln in enumerate(lines) if (m := re.match(r"(\$L__BB\w+):", ln))}
    loops = [(labels[m.group(1)], i) for i, ln in enumerate(lines)
             if (m := re.search(r"\bbra(?:\.uni)?\s+(\$L__BB\w+);", ln)) and labels.get(m.group(1), i) < i]
    assert loops, "no loop found in the PTX"
    start, end = min(loops, key=lambda se: se[1] - se[0])
    return [ln for ln in lines[start + 1:end + 1] if ln and not ln.startswith(("$", "//", ".", "{", "}"))]


def _facts(res: dict) -> dict:
    """What the build does with its operand tiles: bytes per cp.async copy (global -> shared) and how many; the
    nvmma_shared layouts (swizzle bytes, transposed = stored K-major for B); the wgmma shapes with B's transpose
    flag (imm-trans-b); shared memory, registers, spills; in the K loop, its instructions, its wgmma and any
    read of shared memory by the threads (ld.shared, ldmatrix), which operands fed to wgmma from shared memory
    do not need."""
    ptx, ttgir = res["ptx"], res["ttgir"]
    copies = Counter(int(s, 0) for s in re.findall(
        r"cp\.async\.\w+\.shared\.global\S*\s+\[[^\]]+\],\s*\[[^\]]+\],\s*(0x[0-9a-fA-F]+|\d+)", ptx))
    shared_layouts = {(int(w), t == "true") for v in layouts(ttgir).values()
                      for w, t in re.findall(r"nvmma_shared<\{swizzlingByteWidth = (\d+), transposed = (\w+)", v)}
    wgmma = Counter(f"{shape} trans-b {tb}" for shape, tb in re.findall(
        r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)\.[^;]*,\s*\d,\s*\d,\s*\d,\s*(\d);", ptx))
    loop = _k_loop(ptx)
    ptxas = parse_ptxas(ptxas_report(ptx)).get(res["entry"], {})
    return dict(copies=copies, shared_layouts=shared_layouts, wgmma=wgmma, shared=res["shared"],
                registers=ptxas.get("registers"), spills=ptxas.get("spill_store_bytes"), loop=len(loop),
                loop_wgmma=sum("wgmma.mma_async" in ln for ln in loop),
                loop_shared_reads=sum(bool(re.search(r"\b(ld\.shared|ldmatrix)", ln)) for ln in loop))


@pytest.mark.op("lora_linear")
def test_w_transposed_costs_no_narrow_copies_and_no_shared_round_trip_on_sm90():
    """The suspicion that W read as a K-major B (x @ W^T) makes the GEMM slow, checked in the sm_90 build: x's
    and W's tiles arrive in 16-byte cp.async copies, as many as in Part 3's kernel with an N-major B; W's tile is
    stored K-major (nvmma_shared transposed) and wgmma reads it with trans-b 0, its native form for B (Part 3's
    kernel uses trans-b 1); no K loop reads shared memory from the threads; v2 needs the same shared memory as
    Part 3's kernel and v3 only its A^T tile more. What v3 adds to the loop is one narrow wgmma (n16, x A^T) per
    wide one."""
    script = FACTS_SCRIPT.replace("CONFIGS", repr(FACTS_CONFIGS))
    by = {(tuple(r["config"]), r["kernel"]): _facts(r) for r in compile_script_results(script)}
    for bm, bn, warps, stages in FACTS_CONFIGS:
        cfg = (bm, bn, warps, stages)
        mm, v2, v3 = (by[cfg, k] for k in ("matmul_kernel", "v2", "v3"))
        n_wide = f"m64n{bn}k16"
        assert set(mm["copies"]) == set(v2["copies"]) == {16} and v2["copies"] == mm["copies"], (cfg, mm, v2)
        # v3: the same 16-byte copies of x and W, plus the 64 x 16 tile of A^T (2 KiB a stage), which 8 warps
        # copy in 8-byte pieces and 4 warps in 16-byte ones
        assert v3["copies"][16] >= mm["copies"][16] and set(v3["copies"]) <= {16, 8}, (cfg, v3)
        assert (128, True) in v2["shared_layouts"] and (128, True) in v3["shared_layouts"], (cfg, v2)
        assert mm["shared_layouts"] == {(128, False)}, (cfg, mm)
        assert set(mm["wgmma"]) == {f"{n_wide} trans-b 1"}, (cfg, mm)
        assert set(v2["wgmma"]) == {f"{n_wide} trans-b 0"}, (cfg, v2)
        assert set(v3["wgmma"]) == {f"{n_wide} trans-b 0", "m64n16k16 trans-b 0"}, (cfg, v3)
        for f in (mm, v2, v3):
            assert f["loop_shared_reads"] == 0 and f["spills"] == 0, (cfg, f)
        assert v2["loop_wgmma"] == mm["loop_wgmma"] and v3["loop_wgmma"] == 2 * mm["loop_wgmma"], (cfg, mm, v3)
        assert v2["shared"] == mm["shared"], (cfg, mm, v2)
        assert v3["shared"] - v2["shared"] == stages * 64 * 16 * 2, (cfg, v2, v3)


# ---------------------------------------------------------------- GPU: bf16, autotuned launches

@pytest.mark.gpu
@pytest.mark.op("lora_linear")
@pytest.mark.parametrize("version", sorted(FWD))
@pytest.mark.parametrize("t, d_in, d_out, r", [(512, 1024, 768, 16), (300, 1000, 520, 64), (129, 256, 384, 7)])
def test_forward_bf16_gpu(version, t, d_in, d_out, r):
    x, w, a, b, scale = _inputs(t, d_in, d_out, r, torch.bfloat16, "cuda", seed=r)
    _assert_close(FWD[version](x, w, a, b, scale), _ref(x, w, a, b, scale), torch.bfloat16, f"{version} bf16")


@pytest.mark.gpu
@pytest.mark.op("lora_linear_fwd_bwd")
@pytest.mark.parametrize("in_loop", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_backward_half_gpu(in_loop, dtype):
    args = _inputs(1024, 512, 768, 16, dtype, "cuda", seed=11, fwd_bwd=True)
    fn = lo.lora_linear_fwd_bwd_fused if in_loop else lo.lora_linear_fwd_bwd_two_kernels
    for name, got, want in zip(("dx", "dA", "dB"), fn(*args), _ref_grads(*args)):
        _assert_close(got, want, dtype, f"in_loop={in_loop} {name} {dtype}")


@pytest.mark.gpu
@pytest.mark.op("lora_linear")
def test_headline_bf16_gpu():
    """The benchmarked size, once, in both designs (the harness checks it too, before timing)."""
    x, w, a, b, scale = lo._make_inputs(lo.HEADLINE, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
    ref = lo.lora_linear_ref(x.float(), w.float(), a.float(), b.float(), scale)
    rtol, atol = lo.TOLERANCES[torch.bfloat16]
    for version, fn in FWD.items():
        torch.testing.assert_close(fn(x, w, a, b, scale).float(), ref, rtol=rtol, atol=atol,
                                   msg=lambda m: f"{version}: {m}")
