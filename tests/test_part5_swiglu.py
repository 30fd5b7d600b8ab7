"""SwiGLU and GeGLU forward and backward beyond the generic reference check: GeGLU (the ACT=1 kernels)
against PyTorch's tanh GELU, gradcheck in float64 of both activations, the fused backward's saved tensors,
shapes of any rank, empty inputs and clear refusal of bad input. bf16 runs on the GPU only (``gpu`` marker)."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close_within, assert_refuses

import snippets._checks as checks
from conftest import DEVICE, poison_allocator
from snippets.part5 import swiglu as sg

REFS = {"silu": (sg.swiglu_ref, sg.swiglu_fwd_bwd_ref), "gelu_tanh": (sg.geglu_ref, sg.geglu_fwd_bwd_ref)}


def _inputs(m, n, dtype=torch.float32, device=DEVICE, seed=0):
    return sg._make_inputs_fwd_bwd({"m": m, "n": n}, dtype, device, torch.Generator().manual_seed(seed))


def _assert_close(out, ref, dtype, what):
    assert_close_within(out, ref, sg.TOLERANCES, dtype, what)


def _fwd_bwd(a, b, dc, act):
    leaves = [t.detach().requires_grad_() for t in (a, b)]
    return torch.autograd.grad(sg.GLUFunction.apply(*leaves, act), leaves, dc)


# ---------------------------------------------------------------- references (no kernels)

@pytest.mark.op("swiglu")
def test_references_match_torch():
    a, b, _ = _inputs(7, 33, torch.float64, "cpu")
    torch.testing.assert_close(sg.swiglu_ref(a, b), F.silu(a) * b)
    torch.testing.assert_close(sg.geglu_ref(a, b), F.gelu(a, approximate="tanh") * b)


@pytest.mark.op("swiglu_fwd_bwd")
def test_closed_form_backward_matches_autograd():
    a, b, dc = _inputs(6, 19, torch.float64, "cpu")
    leaves = [t.clone().requires_grad_() for t in (a, b)]
    want = torch.autograd.grad(F.silu(leaves[0]) * leaves[1], leaves, dc)
    for got, exp in zip(sg.swiglu_fwd_bwd_ref(a, b, dc), want):
        torch.testing.assert_close(got, exp)


def test_gelu_tanh_is_a_sigmoid_gate():
    """0.5 * (1 + tanh(z)) = sigmoid(2z): the identity the kernel's ACT=1 branch rests on."""
    a = torch.linspace(-8, 8, 1001, dtype=torch.float64)
    k = sg.GELU_K * (a + sg.GELU_C * a**3)
    torch.testing.assert_close(a * torch.sigmoid(k), F.gelu(a, approximate="tanh"))


# ---------------------------------------------------------------- Triton (CPU or GPU)

@pytest.mark.op("swiglu")
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m, n", [(1, 1), (3, 17), (17, 123), (123, 781), (2, 4097)])
def test_triton_forward(m, n, dtype, act, device):
    a, b, _ = _inputs(m, n, dtype, seed=m * n)
    poison_allocator(a.numel() * a.element_size(), device)
    _assert_close(sg.glu_triton(a, b, act), REFS[act][0](a.double(), b.double()), dtype, f"{act} ({m}, {n})")


@pytest.mark.op("swiglu_fwd_bwd")
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m, n", [(1, 1), (3, 17), (123, 781), (2, 4097)])
def test_triton_backward(m, n, dtype, act, device):
    a, b, dc = _inputs(m, n, dtype, seed=m + n)
    refs = REFS[act][1](a.double(), b.double(), dc.double())
    for name, o, r in zip(("da", "db"), _fwd_bwd(a, b, dc, act), refs):
        _assert_close(o, r, dtype, f"{act} {name} ({m}, {n}) {dtype}")


@pytest.mark.op("swiglu")
def test_large_gate_values(device):
    """|a| up to 60: sigmoid saturates to 0 or 1 in fp32 without NaN (exp(-a) overflows to inf, 1/inf = 0)."""
    a = torch.linspace(-60, 60, 241, device=device)[None, :]
    b = torch.ones_like(a)
    for act in ("silu", "gelu_tanh"):
        out = sg.glu_triton(a, b, act)
        assert torch.isfinite(out).all(), act
        torch.testing.assert_close(out.double().cpu(), REFS[act][0](a.double(), b.double()).cpu(),
                                   rtol=1e-5, atol=1e-5)
        da, db = _fwd_bwd(a, b, torch.ones_like(a), act)
        assert torch.isfinite(da).all() and torch.isfinite(db).all(), act


@pytest.mark.op("swiglu")
def test_any_rank_and_empty(device):
    a, b, _ = _inputs(6, 20)
    a3, b3 = a.reshape(2, 3, 20), b.reshape(2, 3, 20)
    torch.testing.assert_close(sg.swiglu_triton(a3, b3), sg.swiglu_triton(a, b).reshape(2, 3, 20))
    empty = sg.swiglu_triton(a[:0], b[:0])
    assert empty.shape == (0, 20) and empty.dtype == a.dtype
    da, db = _fwd_bwd(a[:0], b[:0], a[:0], "silu")
    assert da.shape == (0, 20) and db.shape == (0, 20)


@pytest.mark.op("swiglu")
def test_block_boundaries(monkeypatch, device):
    """A small BLOCK so that several programs and a ragged last one are exercised: 1000 elements, BLOCK 64."""
    monkeypatch.setitem(sg.CONFIG, "BLOCK", 64)
    a, b, dc = _inputs(10, 100, seed=7)
    _assert_close(sg.swiglu_triton(a, b), sg.swiglu_ref(a.double(), b.double()), torch.float32, "c")
    for o, r in zip(_fwd_bwd(a, b, dc, "silu"), sg.swiglu_fwd_bwd_ref(a.double(), b.double(), dc.double())):
        _assert_close(o, r, torch.float32, "grad")


@pytest.mark.op("swiglu_fwd_bwd")
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_gradcheck_float64(act, device):
    a, b, _ = _inputs(3, 7, torch.float64, seed=3)
    leaves = tuple(t.clone().requires_grad_() for t in (a, b))
    assert torch.autograd.gradcheck(lambda a, b: sg.GLUFunction.apply(a, b, act), leaves, eps=1e-6,
                                    atol=1e-7, rtol=1e-5)


@pytest.mark.op("swiglu_fwd_bwd")
def test_gradcheck_can_fail(monkeypatch, device):
    """A backward that forgets the a * s * (1 - s) term of silu': gradcheck must notice."""
    real = sg._glu_bwd

    def wrong(a, b, dc, act):
        da, db = real(a, b, dc, act)
        s = torch.sigmoid(a)
        return da - dc * b * a * s * (1 - s), db

    monkeypatch.setattr(sg, "_glu_bwd", wrong)
    a, b, _ = _inputs(2, 5, torch.float64, seed=1)
    leaves = tuple(t.clone().requires_grad_() for t in (a, b))
    assert not torch.autograd.gradcheck(sg.GLUFunction.apply, leaves, raise_exception=False)


@pytest.mark.op("swiglu_fwd_bwd")
def test_forward_saves_only_its_inputs(device):
    """No activation is stored: the saved tensors are a and b themselves (same storage)."""
    a, b, _ = _inputs(4, 9)
    la, lb = a.clone().requires_grad_(), b.clone().requires_grad_()
    c = sg.GLUFunction.apply(la, lb)
    saved = c.grad_fn.saved_tensors
    assert len(saved) == 2 and saved[0].data_ptr() == la.data_ptr() and saved[1].data_ptr() == lb.data_ptr()


def _bad_inputs(device):
    a = torch.randn(4, 8, device=device)
    return [
        ("float64", (a.double(), a.double()), TypeError, "dtype"),
        ("int32", (a.int(), a.int()), TypeError, "dtype"),
        ("mixed dtypes", (a, a.half()), TypeError, "b has dtype torch.float16"),
        ("mismatched shapes", (a, a[:3]), ValueError, r"b has shape \(3, 8\)"),
        ("transposed", (a.t(), a.t()), ValueError, "contiguous"),
        ("not a tensor", (a.tolist(), a), TypeError, "torch.Tensor"),
    ]


@pytest.mark.op("swiglu")
@pytest.mark.parametrize("case", range(len(_bad_inputs("cpu"))))
def test_refuses_bad_input(case, device):
    assert_refuses(sg.swiglu_triton, _bad_inputs(device)[case])


@pytest.mark.op("swiglu")
def test_refuses_unknown_act_and_other_devices(monkeypatch, device):
    a = torch.randn(2, 8, device=device)
    with pytest.raises(ValueError, match="act must be one of"):
        sg.glu_triton(a, a, "relu")
    with pytest.raises(ValueError, match="dc has shape"):
        sg.swiglu_fwd_bwd_triton(a, a, a[:1])
    monkeypatch.setattr(checks, "triton_interpreting", lambda: False)
    with pytest.raises(ValueError, match="cuda device"):
        sg.swiglu_triton(torch.zeros(2, 8), torch.zeros(2, 8))


# ---------------------------------------------------------------- GPU only

@pytest.mark.gpu
@pytest.mark.op("swiglu")
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m, n", [(1, 1), (123, 781), (64, 7168), (3, 14337)])
def test_gpu_forward_backward(m, n, dtype, act):
    a, b, dc = _inputs(m, n, dtype, "cuda", seed=n)
    _assert_close(sg.glu_triton(a, b, act), REFS[act][0](a.double(), b.double()), dtype, f"{act} c")
    refs = REFS[act][1](a.double(), b.double(), dc.double())
    for name, o, r in zip(("da", "db"), _fwd_bwd(a, b, dc, act), refs):
        _assert_close(o, r, dtype, f"{act} {name}")


@pytest.mark.gpu
@pytest.mark.op("swiglu_fwd_bwd")
def test_gpu_fwd_bwd_peak_memory():
    """Beyond its inputs a training step through GLUFunction holds c, da and db: 3 x the size of a (eager
    autograd also keeps silu(a) and its temporaries)."""
    from snippets.bench.harness import peak_extra_bytes

    def peak(fn, args):
        gc.collect()              # garbage of earlier tests freed during the call would hide
        torch.cuda.empty_cache()  # part of its peak (the peak is measured from a baseline)
        return peak_extra_bytes(fn, args)

    args = _inputs(4096, 7168, torch.bfloat16, "cuda", seed=1)
    size = args[0].nbytes
    fused, eager = peak(sg.swiglu_fwd_bwd_triton, args), peak(sg.swiglu_fwd_bwd_torch, args)
    assert fused <= 3 * size + (1 << 20), f"fused holds {fused / size:.2f} x a"
    assert eager > 3 * size, f"eager holds {eager / size:.2f} x a (fused {fused / size:.2f} x)"


@pytest.mark.gpu
@pytest.mark.op("swiglu_fwd_bwd")
def test_gpu_liger_in_place_backward():
    """Liger-Kernel writes da, db over a, b: checked against a reference taken before the call."""
    if sg.liger_missing():
        pytest.skip(sg.liger_missing())
    a, b, dc = _inputs(123, 7168, torch.bfloat16, "cuda", seed=5)
    _assert_close(sg.swiglu_liger(a, b), sg.swiglu_ref(a.double(), b.double()), torch.bfloat16, "liger c")
    refs = sg.swiglu_fwd_bwd_ref(a.double(), b.double(), dc.double())
    for name, o, r in zip(("da", "db"), sg.swiglu_fwd_bwd_liger(a, b, dc), refs):
        _assert_close(o, r, torch.bfloat16, f"liger {name}")
