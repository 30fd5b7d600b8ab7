"""RoPE forward and backward beyond the generic reference check: the backward is the rotation by -theta (and
the inverse of the forward), gradcheck in float64, odd head dimensions and head counts, grouped key-value heads,
empty inputs and clear refusal of bad input. bf16 and the library versions run on the GPU only."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close_within, assert_refuses

import snippets._checks as checks
from conftest import DEVICE, poison_allocator
from snippets.part5 import rope as rp


def _inputs(b, s, h, hkv, d, dtype=torch.float32, device=DEVICE, seed=0):
    size = {"b": b, "s": s, "h": h, "hkv": hkv, "d": d}
    return rp._make_inputs_fwd_bwd(size, dtype, device, torch.Generator().manual_seed(seed))


def _assert_close(out, ref, dtype, what):
    assert_close_within(out, ref, rp.TOLERANCES, dtype, what)


def _double(*ts):
    return [t.double() for t in ts]


# ---------------------------------------------------------------- references and tables (no kernels)

@pytest.mark.op("rope")
def test_reference_rotates_pairs():
    """Each pair (x1[i], x2[i]) turns by s * theta_i: its length is kept and its angle moves by that much."""
    q, k, cos, sin, _, _ = _inputs(1, 9, 2, 1, 8, torch.float64, "cpu")
    qr, _ = rp.rope_ref(q, k, cos, sin)
    x1, x2, y1, y2 = q[..., :4], q[..., 4:], qr[..., :4], qr[..., 4:]
    torch.testing.assert_close(y1**2 + y2**2, x1**2 + x2**2)
    angle = torch.atan2(y2, y1) - torch.atan2(x2, x1)
    want = torch.arange(9.0, dtype=torch.float64)[:, None, None] * rp.BASE ** (-torch.arange(0, 8, 2) / 8)
    torch.testing.assert_close(torch.remainder(angle - want + torch.pi, 2 * torch.pi) - torch.pi,
                               torch.zeros_like(angle), atol=1e-7, rtol=0)


@pytest.mark.op("rope_fwd_bwd")
def test_closed_form_backward_matches_autograd_and_inverts():
    q, k, cos, sin, dq, dk = _inputs(2, 5, 3, 1, 10, torch.float64, "cpu")
    leaves = [t.clone().requires_grad_() for t in (q, k)]
    want = torch.autograd.grad(rp.rope_ref(*leaves, cos, sin), leaves, (dq, dk))
    got = rp.rope_fwd_bwd_ref(q, k, cos, sin, dq, dk)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    # the transpose of a rotation is its inverse: backward(forward(x)) = x
    qr, kr = rp.rope_ref(q, k, cos, sin)
    for back, orig in zip(rp.rope_fwd_bwd_ref(q, k, cos, sin, qr, kr), (q, k)):
        torch.testing.assert_close(back, orig)


# ---------------------------------------------------------------- Triton (CPU or GPU)

SHAPES = [(1, 1, 1, 1, 2), (2, 5, 3, 1, 10), (1, 17, 4, 2, 64), (3, 33, 5, 3, 80), (2, 7, 2, 2, 130),
          (1, 4, 32, 8, 128), (2, 3, 1, 0, 6)]


@pytest.mark.op("rope")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_triton_forward(shape, dtype, device):
    q, k, cos, sin, _, _ = _inputs(*shape, dtype=dtype, seed=sum(shape))
    poison_allocator(q.numel() * q.element_size(), device)
    for name, o, r in zip(("q", "k"), rp.rope_triton(q, k, cos, sin), rp.rope_ref(*_double(q, k, cos, sin))):
        _assert_close(o, r, dtype, f"{name} {shape} {dtype}")


@pytest.mark.op("rope_fwd_bwd")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_triton_backward(shape, dtype, device):
    args = _inputs(*shape, dtype=dtype, seed=sum(shape) + 1)
    for name, o, r in zip(("dq", "dk"), rp.rope_fwd_bwd_triton(*args), rp.rope_fwd_bwd_ref(*_double(*args))):
        _assert_close(o, r, dtype, f"{name} {shape} {dtype}")


@pytest.mark.op("rope_fwd_bwd")
def test_backward_kernel_inverts_forward(device):
    """BACKWARD=True applied to the forward's output gives the input back (fp32 rounding only)."""
    q, k, cos, sin, _, _ = _inputs(2, 9, 4, 2, 64, seed=3)
    qr, kr = rp.rope_triton(q, k, cos, sin)
    qb, kb = rp._rope_launch(qr, kr, cos, sin, backward=True)
    torch.testing.assert_close(qb, q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kb, k, rtol=1e-5, atol=1e-5)


@pytest.mark.op("rope_fwd_bwd")
@pytest.mark.parametrize("shape, fast", [((1, 3, 2, 1, 4), False), ((2, 2, 3, 2, 6), True)])
def test_gradcheck_float64(shape, fast, device):
    """Every input element perturbed in turn (a launch each, slow under the interpreter) for a small shape;
    gradcheck's fast mode (random projections of the Jacobian) for grouped heads and a batch of 2."""
    q, k, cos, sin, _, _ = _inputs(*shape, dtype=torch.float64, seed=5)
    leaves = tuple(t.clone().requires_grad_() for t in (q, k))
    assert torch.autograd.gradcheck(lambda q, k: rp.RoPEFunction.apply(q, k, cos, sin), leaves, eps=1e-6,
                                    atol=1e-7, rtol=1e-5, fast_mode=fast)


@pytest.mark.op("rope_fwd_bwd")
def test_gradcheck_can_fail(monkeypatch, device):
    """A backward that rotates by +theta (the forward again) instead of -theta: gradcheck must notice."""
    real = rp._rope_launch
    monkeypatch.setattr(rp, "_rope_launch", lambda q, k, cos, sin, backward: real(q, k, cos, sin, False))
    q, k, cos, sin, _, _ = _inputs(1, 3, 2, 1, 4, dtype=torch.float64, seed=6)
    leaves = tuple(t.clone().requires_grad_() for t in (q, k))
    assert not torch.autograd.gradcheck(lambda q, k: rp.RoPEFunction.apply(q, k, cos, sin), leaves,
                                        raise_exception=False, fast_mode=True)


@pytest.mark.op("rope")
def test_empty_inputs(device):
    q, k, cos, sin, _, _ = _inputs(2, 3, 2, 1, 8)
    qr, kr = rp.rope_triton(q[:0], k[:0], cos, sin)
    assert qr.shape == (0, 3, 2, 8) and kr.shape == (0, 3, 1, 8)
    dq, dk = rp.rope_fwd_bwd_triton(q[:0], k[:0], cos, sin, q[:0], k[:0])
    assert dq.shape == (0, 3, 2, 8) and dk.shape == (0, 3, 1, 8)


def _bad_inputs(device):
    q, k, cos, sin, _, _ = _inputs(2, 3, 2, 1, 8, device=device)
    return [
        ("float64", (q.double(), k.double(), cos.double(), sin.double()), TypeError, "dtype"),
        ("int32", (q.int(), k.int(), cos.int(), sin.int()), TypeError, "dtype"),
        ("tables of another dtype", (q, k, cos.half(), sin), TypeError, "cos has dtype torch.float16"),
        ("3-D q", (q[0], k[0], cos, sin), ValueError, r"\(batch, seq, heads, head_dim\)"),
        ("k of another length", (q, k[:, :2].contiguous(), cos, sin), ValueError, "must agree"),
        ("k of another head_dim", (q, torch.zeros(2, 3, 1, 6, device=device), cos, sin), ValueError,
         "must agree"),
        ("odd head_dim", (q[..., :7].contiguous(), k[..., :7].contiguous(), cos[:, :7].contiguous(),
                          sin[:, :7].contiguous()), ValueError, "head_dim must be even"),
        ("cos of the wrong shape", (q, k, cos[:2], sin), ValueError, r"cos must have shape \(seq, head_dim\)"),
        ("sin of the wrong shape", (q, k, cos, sin[None]), ValueError, "sin must have shape"),
        ("non-contiguous q", (q.transpose(1, 2), k, cos, sin), ValueError, "contiguous"),
        ("not a tensor", (q.tolist(), k, cos, sin), TypeError, "torch.Tensor"),
    ]


@pytest.mark.op("rope")
@pytest.mark.parametrize("case", range(len(_bad_inputs("cpu"))))
def test_refuses_bad_input(case, device):
    assert_refuses(rp.rope_triton, _bad_inputs(device)[case])


@pytest.mark.op("rope")
def test_refuses_other_devices(monkeypatch):
    q, k, cos, sin, _, _ = _inputs(1, 2, 1, 1, 4, device="cpu")
    monkeypatch.setattr(checks, "triton_interpreting", lambda: False)
    with pytest.raises(ValueError, match="cuda device"):
        rp.rope_triton(q, k, cos, sin)


# ---------------------------------------------------------------- GPU only

@pytest.mark.gpu
@pytest.mark.op("rope")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 2), (3, 33, 5, 3, 80), (2, 257, 32, 8, 128), (1, 64, 16, 4, 256)])
def test_gpu_forward_backward(shape, dtype):
    args = _inputs(*shape, dtype=dtype, device="cuda", seed=7)
    for name, o, r in zip(("q", "k"), rp.rope_triton(*args[:4]), rp.rope_ref(*_double(*args[:4]))):
        _assert_close(o, r, dtype, f"{name} {shape}")
    for name, o, r in zip(("dq", "dk"), rp.rope_fwd_bwd_triton(*args), rp.rope_fwd_bwd_ref(*_double(*args))):
        _assert_close(o, r, dtype, f"{name} {shape}")


@pytest.mark.gpu
@pytest.mark.op("rope")
def test_gpu_liger_in_place():
    """Liger-Kernel rotates q, k (and in the backward dq_rot, dk_rot) in place: references taken first."""
    if rp.liger_missing():
        pytest.skip(rp.liger_missing())
    args = _inputs(2, 129, 32, 8, 128, dtype=torch.bfloat16, device="cuda", seed=8)
    fwd_refs, bwd_refs = rp.rope_ref(*_double(*args[:4])), rp.rope_fwd_bwd_ref(*_double(*args))
    for name, o, r in zip(("dq", "dk"), rp.rope_fwd_bwd_liger(*[t.clone() for t in args]), bwd_refs):
        _assert_close(o, r, torch.bfloat16, f"liger {name}")
    for name, o, r in zip(("q", "k"), rp.rope_liger(*args[:4]), fwd_refs):
        _assert_close(o, r, torch.bfloat16, f"liger {name}")
