"""Fused cross-entropy and the chunked linear + cross-entropy, beyond the generic reference check: the closed-form
reference against autograd, the kernel at odd sizes and chunk widths (in place and into a new buffer),
ignore_index and label smoothing against PyTorch, int64 row offsets, gradcheck in float64 through the
interpreter, chunking of the tokens, and clear refusal of bad input. GPU-only paths (bf16 on the GPU, the
headline size, peak memory, Liger-Kernel) are marked ``gpu``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from helpers import assert_close_within

import snippets._checks as checks
from conftest import DEVICE, poison_allocator
from snippets.part5 import cross_entropy as ce


def _logits(t, v, dtype=torch.float32, device=DEVICE, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return ce._make_inputs({"t": t, "v": v}, dtype, device, gen)


def _linear(t, v, d, dtype=torch.float32, device=DEVICE, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return ce._make_linear_inputs({"t": t, "v": v, "d": d}, dtype, device, gen)


def _assert_close(out, ref, tolerances, dtype, what):
    assert_close_within(out, ref, tolerances, dtype, what, same_dtype=False)


# ---------------------------------------------------------------- the reference and the sizes (no kernels)

@pytest.mark.op("cross_entropy")
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_reference_matches_torch_and_autograd(smoothing):
    """The closed-form loss and gradient equal F.cross_entropy and its autograd gradient, ignored rows and
    label smoothing included."""
    x, t = _logits(23, 50, torch.float64, "cpu")
    leaf = x.clone().requires_grad_()
    loss = F.cross_entropy(leaf, t, ignore_index=ce.IGNORE_INDEX, label_smoothing=smoothing)
    (grad,) = torch.autograd.grad(loss, leaf)
    ref_loss, ref_grad = ce.cross_entropy_ref(x, t, label_smoothing=smoothing)
    torch.testing.assert_close(ref_loss, loss.detach())
    torch.testing.assert_close(ref_grad, grad)
    assert (t == ce.IGNORE_INDEX).sum() == 3 and ref_grad[t == ce.IGNORE_INDEX].abs().max() == 0


@pytest.mark.op("linear_cross_entropy")
def test_linear_reference_matches_autograd():
    h, w, t = _linear(11, 40, 7, torch.float64, "cpu")
    leaves = [h.clone().requires_grad_(), w.clone().requires_grad_()]
    loss = F.cross_entropy(leaves[0] @ leaves[1].T, t)
    want = torch.autograd.grad(loss, leaves)
    got = ce.linear_cross_entropy_ref(h, w, t)
    torch.testing.assert_close(got[0], loss.detach())
    for g, e in zip(got[1:], want):
        torch.testing.assert_close(g, e)


def test_logits_bytes_formulas():
    sizes = ce.logits_bytes(8192, 128256)
    assert sizes["bf16 logits"] == 2_101_346_304  # 8192 * 128256 * 2: 2.1 GB
    assert sizes["fp32 copy"] == sizes["fp32 log-softmax"] == sizes["fp32 gradient"] == 2 * sizes["bf16 logits"]
    assert sizes[f"bf16 chunk of {ce.CHUNK_TOKENS} tokens"] * 8192 == sizes["bf16 logits"] * ce.CHUNK_TOKENS


# ---------------------------------------------------------------- int64 row offsets

@triton.jit
def _offset_probe(out_ptr, first_row, stride, CAST: tl.constexpr):
    row = tl.program_id(0) + first_row
    if CAST:
        tl.store(out_ptr, ce._row_offset(row, stride))
    else:
        tl.store(out_ptr, (row * stride).to(tl.int64))  # the bug the helper avoids: an int32 product


@pytest.mark.op("cross_entropy")
def test_row_offsets_are_int64(device):
    """Row 20000 of a 128256-column buffer starts at element 2,565,120,000, past 2^31 - 1. The kernel's offset
    helper gives that exactly; the same product taken in int32 (what `program_id * stride` is unless one side
    is cast) wraps to a negative offset. Checked with two scalars, without allocating 5 GB."""
    row, stride = 20000, 128256
    assert row * stride > 2**31 - 1
    out = torch.zeros(1, dtype=torch.int64, device=device)
    _offset_probe[(1,)](out, row, stride, CAST=True)
    assert out.item() == row * stride
    _offset_probe[(1,)](out, row, stride, CAST=False)
    assert out.item() != row * stride and out.item() < 0, "the int32 product should wrap, else this test is moot"


# ---------------------------------------------------------------- the fused kernel (CPU or GPU)

@pytest.mark.op("cross_entropy")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("t, v, block_v", [(1, 1, None), (3, 17, 4), (37, 1000, 128), (9, 4097, 1024),
                                           (4, 300, 512)])
@pytest.mark.parametrize("inplace", [False, True])
def test_fused_kernel(t, v, block_v, dtype, inplace, device):
    """Odd vocabularies that are no multiple of the chunk (1000 = 7 x 128 + 104, 4097 = 4 x 1024 + 1), one chunk
    wider than the row (300 in 512), a single column, and rows with ignored targets. (The registered sizes,
    with the default chunk width, run in tests/test_ops.py.)"""
    x, targets = _logits(t, v, dtype, seed=t * v)
    ref_loss, ref_grad = ce.cross_entropy_ref(x.double(), targets)
    if not inplace:
        poison_allocator(x.numel() * x.element_size(), device)
    loss, grad = ce.cross_entropy_fwd_bwd(x, targets, inplace=inplace, block_v=block_v)
    assert loss.dtype == torch.float32 and loss.dim() == 0 and grad.dtype == dtype
    assert (grad.data_ptr() == x.data_ptr()) == inplace
    _assert_close(loss, ref_loss, {dtype: (ce.TOLERANCES[dtype][0], 0.0)}, dtype, "loss")
    _assert_close(grad, ref_grad, ce.TOLERANCES, dtype, f"dlogits ({t}, {v}) {dtype}")


@pytest.mark.op("cross_entropy")
@pytest.mark.parametrize("smoothing", [0.1, 1.0])
def test_label_smoothing_matches_torch(smoothing, device):
    x, targets = _logits(29, 333, seed=3)
    leaf = x.clone().requires_grad_()
    want = F.cross_entropy(leaf, targets, ignore_index=ce.IGNORE_INDEX, label_smoothing=smoothing)
    want.backward()
    loss, grad = ce.cross_entropy_fwd_bwd(x, targets, label_smoothing=smoothing, block_v=64)
    torch.testing.assert_close(loss, want.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, leaf.grad, rtol=1e-5, atol=1e-8)


@pytest.mark.op("cross_entropy")
def test_ignore_index(device):
    """Every row ignored: the loss is 0/0 = NaN as in PyTorch, and every gradient is 0, also in place, where
    the logits must be overwritten with zeros. Any other ignore_index, even a real class, is honoured."""
    x, _ = _logits(6, 50, seed=1)
    none = torch.full((6,), ce.IGNORE_INDEX, device=device)
    loss, grad = ce.cross_entropy_fwd_bwd(x.clone(), none, inplace=True)
    assert loss.isnan() and F.cross_entropy(x, none).isnan()
    assert torch.equal(grad, torch.zeros_like(x))
    targets = torch.tensor([0, 3, 0, 7, 0, 1], device=device)
    loss, grad = ce.cross_entropy_fwd_bwd(x, targets, ignore_index=0)
    leaf = x.clone().requires_grad_()
    F.cross_entropy(leaf, targets, ignore_index=0).backward()
    torch.testing.assert_close(loss, F.cross_entropy(x, targets, ignore_index=0))
    torch.testing.assert_close(grad, leaf.grad)


@pytest.mark.op("cross_entropy")
def test_large_logits_do_not_overflow(device):
    """Logits near 1000: exp(1000) is inf in fp32, so a kernel that did not subtract the running max would
    return inf or NaN. Spread within a row of 30 keeps the answer well conditioned."""
    x, targets = _logits(7, 513, seed=2)
    x = x * 5 + 1000.0
    assert torch.exp(x).isinf().all()
    loss, grad = ce.cross_entropy_fwd_bwd(x, targets, block_v=64)
    ref_loss, ref_grad = ce.cross_entropy_ref(x.double(), targets)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-5, atol=0)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=1e-4, atol=1e-8)


@pytest.mark.op("cross_entropy")
def test_registered_versions_return_the_logits_dtype(device):
    x, targets = _logits(5, 40, torch.float16, seed=4)
    for fn in (ce.cross_entropy_new_buffer, ce.cross_entropy_inplace):
        loss, grad = fn(x.clone(), targets)
        assert loss.dtype == grad.dtype == torch.float16


# ---------------------------------------------------------------- the autograd.Functions, gradcheck

@pytest.mark.op("cross_entropy")
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_gradcheck_cross_entropy_float64(smoothing, device):
    """gradcheck in float64: the gradient the forward writes against finite differences of the loss the same
    kernel computes. The interpreter runs float64 like any type, and so does the GPU."""
    x, targets = _logits(4, 9, torch.float64, seed=5)
    leaf = x.clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x: ce.CrossEntropyFunction.apply(x, targets, False, ce.IGNORE_INDEX, smoothing), (leaf,),
        eps=1e-6, atol=1e-8, rtol=1e-6)


@pytest.mark.op("linear_cross_entropy")
@pytest.mark.parametrize("chunk", [2, 100])
def test_gradcheck_linear_float64(chunk, device):
    """gradcheck of LinearCrossEntropyFunction in float64 with chunks of 2 tokens (the last one short) and one
    chunk holding every token; the loss is multiplied by 3, so the backward gets a gradient of 3, not 1."""
    h, w, targets = _linear(5, 7, 3, torch.float64, seed=chunk)
    leaves = (h.clone().requires_grad_(), w.clone().requires_grad_())
    assert torch.autograd.gradcheck(
        lambda h, w: 3 * ce.LinearCrossEntropyFunction.apply(h, w, targets, chunk), leaves,
        eps=1e-6, atol=1e-8, rtol=1e-6)


@pytest.mark.op("linear_cross_entropy")
def test_gradcheck_can_fail(monkeypatch, device):
    """A kernel launch that forgets the one-hot term of the gradient (by pointing it at a target of -1 that is
    never a column): gradcheck must notice."""
    real = ce._launch

    def wrong(x, dx, targets, *rest):
        real(x, dx, targets, *rest)
        dx.add_(F.one_hot(targets.clamp_min(0), x.shape[1]).to(dx.dtype) / max(rest[1], 1) *
                (targets != ce.IGNORE_INDEX)[:, None])

    monkeypatch.setattr(ce, "_launch", wrong)
    h, w, targets = _linear(3, 4, 2, torch.float64, seed=1)
    leaves = (h.clone().requires_grad_(), w.clone().requires_grad_())
    assert not torch.autograd.gradcheck(lambda h, w: ce.LinearCrossEntropyFunction.apply(h, w, targets), leaves,
                                        raise_exception=False)


@pytest.mark.op("cross_entropy")
def test_function_backward_scales_only_when_needed(device):
    x, targets = _logits(6, 30, seed=6)
    leaf = x.clone().requires_grad_()
    ce.CrossEntropyFunction.apply(leaf, targets).backward()
    once = leaf.grad.clone()
    leaf.grad = None
    (2.5 * ce.CrossEntropyFunction.apply(leaf, targets)).backward()
    torch.testing.assert_close(leaf.grad, 2.5 * once)
    torch.testing.assert_close(once, ce.cross_entropy_ref(x, targets)[1], rtol=1e-5, atol=1e-9)


# ---------------------------------------------------------------- chunked linear + cross-entropy

@pytest.mark.op("linear_cross_entropy")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("t, v, d, chunk", [(1, 3, 8, 1), (37, 500, 64, 8), (37, 500, 64, 4096),
                                            (50, 257, 33, 7)])
def test_linear_chunks(t, v, d, chunk, dtype, device):
    """One token per chunk, chunks that do not divide T (37 = 4 x 8 + 5, 50 = 7 x 7 + 1), and one chunk larger
    than T; every chunk size gives the reference's answer."""
    h, w, targets = _linear(t, v, d, dtype, seed=t + chunk)
    refs = ce.linear_cross_entropy_ref(h.double(), w.double(), targets)
    poison_allocator(t * v * h.element_size(), device)
    outs = ce.linear_cross_entropy_grads(h, w, targets, chunk_tokens=chunk, block_v=128)
    assert outs[0].dtype == torch.float32 and outs[1].dtype == outs[2].dtype == dtype
    for name, o, r in zip(("loss", "dh", "dW"), outs, refs):
        _assert_close(o, r, ce.LINEAR_TOLERANCES, dtype, f"{name} ({t}, {v}, {d}) chunk {chunk} {dtype}")


@pytest.mark.op("linear_cross_entropy")
def test_linear_chunking_changes_only_rounding(device):
    """In fp32, 1, 5 and 40 tokens per chunk agree to fp32 rounding: chunking reorders the dW sum and nothing
    else."""
    h, w, targets = _linear(40, 300, 24, seed=9)
    runs = [ce.linear_cross_entropy_grads(h, w, targets, chunk_tokens=c) for c in (1, 5, 40)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.op("linear_cross_entropy")
def test_linear_frozen_weight_and_smoothing(device):
    """W that needs no gradient: no dW is computed (None), dh is unchanged; label smoothing flows through."""
    h, w, targets = _linear(9, 60, 12, seed=2)
    hl = h.clone().requires_grad_()
    loss = ce.LinearCrossEntropyFunction.apply(hl, w, targets, 4, ce.IGNORE_INDEX, 0.1)
    loss.backward()
    assert w.grad is None
    ref = h.clone().requires_grad_()
    want = F.cross_entropy(ref @ w.T, targets, label_smoothing=0.1)
    want.backward()
    torch.testing.assert_close(loss, want.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(hl.grad, ref.grad, rtol=1e-5, atol=1e-7)
    assert ce.linear_cross_entropy_grads(h, w, targets, need_dw=False)[2] is None


# ---------------------------------------------------------------- bad input

def _bad_logits(device):
    x = torch.randn(4, 10, device=device)
    t = torch.tensor([1, 2, 3, 4], device=device)
    return [
        ("target = V", (x, torch.tensor([1, 2, 10, 4], device=device)), ValueError, r"10, outside \[0, 10\)"),
        ("negative target", (x, torch.tensor([1, -1, 3, 4], device=device)), ValueError, r"-1, outside \[0, 10\)"),
        ("int32 targets", (x, t.int()), TypeError, "targets has dtype torch.int32"),
        ("float targets", (x, t.float()), TypeError, "targets has dtype torch.float32"),
        ("int logits", (x.long(), t), TypeError, "logits has dtype torch.int64"),
        ("1-D logits", (x[0], t[:1]), ValueError, "must be 2-D"),
        ("3-D logits", (x[None], t), ValueError, "must be 2-D"),
        ("short targets", (x, t[:3]), ValueError, r"targets must have shape \(4,\)"),
        ("2-D targets", (x, t[:, None]), ValueError, r"targets must have shape \(4,\)"),
        ("no tokens", (x[:0], t[:0]), ValueError, "empty"),
        ("no classes", (x[:, :0], t), ValueError, "empty"),
        ("transposed logits", (torch.randn(10, 4, device=device).t(), t), ValueError, "contiguous"),
        ("strided targets", (x, torch.arange(8, device=device)[::2]), ValueError, "contiguous"),
        ("not a tensor", (x.tolist(), t), TypeError, "torch.Tensor"),
    ]


@pytest.mark.op("cross_entropy")
@pytest.mark.parametrize("case", range(len(_bad_logits("cpu"))), ids=[c[0] for c in _bad_logits("cpu")])
def test_refuses_bad_logits(case, device):
    _, args, exc, words = _bad_logits(device)[case]
    with pytest.raises(exc, match=words):
        ce.cross_entropy_fwd_bwd(*args)


@pytest.mark.op("cross_entropy")
def test_refuses_bad_options(device):
    x, t = _logits(3, 8)
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        ce.cross_entropy_fwd_bwd(x, t, label_smoothing=1.5)
    with pytest.raises(ValueError, match="power of two"):
        ce.cross_entropy_fwd_bwd(x, t, block_v=96)
    with pytest.raises(TypeError, match="ignore_index must be a Python int"):
        ce.cross_entropy_fwd_bwd(x, t, ignore_index=-100.0)


@pytest.mark.op("cross_entropy")
def test_refuses_other_devices(monkeypatch):
    monkeypatch.setattr(checks, "triton_interpreting", lambda: False)
    x, t = torch.zeros(2, 8), torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="cuda device"):
        ce.cross_entropy_fwd_bwd(x, t)


@pytest.mark.op("linear_cross_entropy")
def test_linear_refuses_bad_input(device):
    h, w, t = _linear(4, 10, 6)
    cases = [
        ((h, w[:, :5].contiguous(), t), ValueError, "h has hidden size 6 but W has 5"),
        ((h, w.T.contiguous(), t), ValueError, "hidden size"),
        ((h, w.half(), t), TypeError, "W has dtype torch.float16 but h has dtype torch.float32"),
        ((h, w, t[:2]), ValueError, r"targets must have shape \(4,\)"),
        ((h[0], w, t), ValueError, "h must be"),
        ((h[:0], w, t[:0]), ValueError, "empty input"),
        ((h, w, torch.tensor([0, 1, 2, 10], device=device)), ValueError, r"10, outside \[0, 10\)"),
        ((h, w, t.int()), TypeError, "targets has dtype torch.int32"),
    ]
    for args, exc, words in cases:
        with pytest.raises(exc, match=words):
            ce.linear_cross_entropy_grads(*args)
    with pytest.raises(ValueError, match="chunk_tokens must be >= 1"):
        ce.linear_cross_entropy_grads(h, w, t, chunk_tokens=0)


@pytest.mark.gpu
@pytest.mark.op("cross_entropy")
def test_refuses_mixed_devices():
    x = torch.zeros(2, 8, device="cuda")
    with pytest.raises(ValueError, match="targets must be on a cuda device|targets is on"):
        ce.cross_entropy_fwd_bwd(x, torch.zeros(2, dtype=torch.int64))


# ---------------------------------------------------------------- GPU only: bf16, the headline, memory

@pytest.mark.gpu
@pytest.mark.op("cross_entropy")
@pytest.mark.parametrize("t, v", [(1, 1), (123, 781), (64, 32000), (16, 128256), (8, 151936)])
@pytest.mark.parametrize("inplace", [False, True])
def test_gpu_bf16(t, v, inplace):
    x, targets = _logits(t, v, torch.bfloat16, "cuda", seed=v)
    ref_loss, ref_grad = ce.cross_entropy_ref(x.double(), targets)
    loss, grad = ce.cross_entropy_fwd_bwd(x, targets, inplace=inplace)
    _assert_close(loss, ref_loss, {torch.bfloat16: (8e-3, 0.0)}, torch.bfloat16, "loss")
    _assert_close(grad, ref_grad, {torch.bfloat16: (8e-3, 1e-9)}, torch.bfloat16, f"dlogits ({t}, {v})")


@pytest.mark.gpu
@pytest.mark.op("cross_entropy")
def test_gpu_rows_past_int32_offsets():
    """17000 rows of 128256 fp32 logits (8.7 GB): the last rows start past element 2^31. Only a few rows are
    compared with the reference (the whole float64 reference would need 17 GB more)."""
    t, v = 17000, 128256
    x, targets = _logits(t, v, torch.float32, "cuda", seed=7)
    assert (t - 1) * v > 2**31
    rows = torch.tensor([0, 16743, 16744, t - 1], device="cuda")
    keep_x, keep_t = x[rows].double(), targets[rows]
    n = int((targets != ce.IGNORE_INDEX).sum())
    _, grad = ce.cross_entropy_fwd_bwd(x, targets, inplace=True)
    ref = ce.cross_entropy_ref(keep_x, keep_t)[1] * (keep_t != ce.IGNORE_INDEX).sum() / n
    torch.testing.assert_close(grad[rows].double(), ref, rtol=1e-5, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.op("cross_entropy")
def test_gpu_headline_error_and_memory():
    """8192 x 128256 bf16: in place, the error against float64 is at most twice eager PyTorch's, and the call
    allocates under a quarter of what the new-buffer version does (that one allocates the (T, V) gradient)."""
    x, targets = _logits(8192, 128256, torch.bfloat16, "cuda", seed=8)
    ref_loss, ref_grad = ce.cross_entropy_ref(x.double(), targets)
    eager_err = (ce.cross_entropy_torch(x, targets)[1].double() - ref_grad).abs().max().item()
    peaks = {}
    for inplace in (False, True):
        xi = x.clone()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        loss, grad = ce.cross_entropy_fwd_bwd(xi, targets, inplace=inplace)
        torch.cuda.synchronize()
        peaks[inplace] = torch.cuda.max_memory_allocated() - base
        assert abs(loss.item() - ref_loss.item()) < 1e-4 * ref_loss.item()
        assert (grad.double() - ref_grad).abs().max().item() <= max(2 * eager_err, 1e-6)
        del xi, loss, grad
    assert peaks[False] >= x.numel() * 2 and peaks[True] < peaks[False] / 4, peaks


@pytest.mark.gpu
@pytest.mark.op("linear_cross_entropy")
def test_gpu_linear_bf16_and_memory():
    """T 4096, V 32000, D 1024 in bf16: gradients within twice eager's error against float64, and the peak
    extra memory at most one chunk of logits plus dh, dW and small change."""
    t, v, d = 4096, 32000, 1024
    h, w, targets = _linear(t, v, d, torch.bfloat16, "cuda", seed=10)
    refs = ce.linear_cross_entropy_ref(h.double(), w.double(), targets)
    eager = ce.linear_cross_entropy_torch(h, w, targets)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    ours = ce.linear_cross_entropy_chunked(h, w, targets)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    for name, o, e, r in zip(("loss", "dh", "dW"), ours, eager, refs):
        err_e = (e.double() - r).abs().max().item()
        err_o = (o.double() - r).abs().max().item()
        assert err_o <= 2 * err_e + 1e-6, f"{name}: {err_o:.3g} against eager's {err_e:.3g}"
    chunk = min(ce.CHUNK_TOKENS, t) * v * 2
    assert peak <= chunk + (t * d + v * d) * 2 + 2**24, f"peak extra {peak / 1e6:.0f} MB"
