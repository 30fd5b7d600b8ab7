"""LayerNorm forward and backward beyond the generic reference check: the backward against torch.autograd and
torch.autograd.gradcheck (float64, through the interpreter on the CPU), every launch configuration (rows per
program, groups of the backward, short last group), leading dimensions, empty batches, determinism of the
dW/dB reduction, and clear refusal of bad input. GPU-only paths (bf16 on the GPU, the CUDA C forward, the
headline size) are marked ``gpu``."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close_within

import snippets._checks as checks
from conftest import DEVICE, poison_allocator
from snippets.part4 import layernorm as ln

TRITON_FWD = {"v3": ln.layernorm_triton}


def _inputs(m, n, dtype=torch.float32, device=DEVICE, seed=0, shape=None):
    gen = torch.Generator().manual_seed(seed)
    x, w, b, dy = ln._make_inputs_fwd_bwd({"m": m, "n": n}, dtype, device, gen)
    if shape is not None:
        x, dy = x.reshape(shape), dy.reshape(shape)
    return x, w, b, dy


def _assert_close(out, ref, dtype, what):
    assert_close_within(out, ref, ln.TOLERANCES, dtype, what)


def _check_fwd_bwd(x, w, b, dy):
    outs = ln.layernorm_fwd_bwd_triton(x, w, b, dy)
    refs = ln.layernorm_fwd_bwd_ref(x.double(), w.double(), b.double(), dy.double())
    for name, o, r in zip(("dx", "dw", "db"), outs, refs):
        _assert_close(o, r, x.dtype, f"{name} {tuple(x.shape)} {x.dtype}")


def _bad_inputs(device):
    x = torch.randn(4, 8, device=device)
    w, b = torch.ones(8, device=device), torch.zeros(8, device=device)
    return [
        ("float64 x", (x.double(), w, b), TypeError, "dtype"),
        ("int32 x", (x.int(), w.int(), b.int()), TypeError, "dtype"),
        ("w of another dtype", (x, w.half(), b), TypeError, "w has dtype torch.float16"),
        ("w of the wrong length", (x, torch.ones(7, device=device), b), ValueError, r"w must have shape \(8,\)"),
        ("b of the wrong length", (x, w, torch.zeros(9, device=device)), ValueError, r"b must have shape \(8,\)"),
        ("w with a leading dimension", (x, w[None], b), ValueError, r"w must have shape \(8,\)"),
        ("transposed x", (x.t(), torch.ones(4, device=device), torch.zeros(4, device=device)), ValueError,
         "contiguous"),
        ("strided w", (x, torch.ones(16, device=device)[::2], b), ValueError, "contiguous"),
        ("rows of length 0", (x[:, :0], w[:0], b[:0]), ValueError, "length 0"),
        ("0-d x", (x[0, 0], w[:1], b[:1]), ValueError, "at least one dimension"),
        ("not a tensor", (x.tolist(), w, b), TypeError, "torch.Tensor"),
    ]


# ---------------------------------------------------------------- reference and configs (no kernels)

@pytest.mark.op("layernorm")
def test_reference_matches_torch():
    x, w, b, _ = _inputs(7, 33, torch.float64, "cpu")
    torch.testing.assert_close(ln.layernorm_ref(x, w, b), torch.nn.functional.layer_norm(x, (33,), w, b, ln.EPS))


@pytest.mark.op("layernorm_fwd_bwd")
def test_closed_form_backward_matches_autograd():
    """The closed-form dx, dw, db of the reference are the gradients autograd finds through the forward."""
    x, w, b, dy = _inputs(6, 19, torch.float64, "cpu", shape=(2, 3, 19))
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    want = torch.autograd.grad(ln.layernorm_ref(*leaves), leaves, dy)
    for got, exp in zip(ln.layernorm_fwd_bwd_ref(x, w, b, dy), want):
        torch.testing.assert_close(got, exp)


@pytest.mark.op("layernorm")
@pytest.mark.parametrize("n", [1, 17, 1000, 1024, 1025, 4096, 16384, 65536])
def test_config_covers_the_row(n):
    block_n, cfg = ln.config_for(n)
    assert block_n >= n and block_n & (block_n - 1) == 0
    assert cfg.rows >= 1 and cfg.fwd_warps >= 1 and cfg.bwd_warps >= 1 and cfg.groups_per_sm >= 1
    assert cfg.rows * block_n <= max(4096, block_n), "a forward program holds at most one 4096-element tile"


@pytest.mark.op("layernorm_fwd_bwd")
def test_backward_groups():
    cpu = torch.device("cpu")
    assert ln.backward_groups(1, 64, cpu) == 1, "never more groups than rows"
    assert ln.backward_groups(10**6, 4096, cpu) == 4 * ln.CONFIGS[4096].groups_per_sm


@pytest.mark.op("layernorm")
@pytest.mark.parametrize("n, itemsize, expect", [(4096, 2, (1, 512)), (16384, 2, (4, 512)), (17, 4, (1, 32)),
                                                 (8192, 4, (4, 512)), (2048, 2, (1, 256))])
def test_cuda_launch_shape(n, itemsize, expect):
    vecs, threads = ln.cuda_launch_shape(n, itemsize)
    assert (vecs, threads) == expect
    assert threads % 32 == 0 and vecs * threads * (16 // itemsize) >= n


@pytest.mark.op("layernorm")
def test_cuda_launch_shape_refuses_long_rows():
    with pytest.raises(ValueError, match="do not fit one block"):
        ln.cuda_launch_shape(16385, 2)


def test_cuda_without_gpu_is_clear(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    x, w, b, _ = _inputs(2, 8, device="cpu")
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):
        ln.layernorm_cuda(x, w, b)


# ---------------------------------------------------------------- Triton forward (CPU or GPU)

@pytest.mark.op("layernorm")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m, n", [(1, 1), (1, 2), (2, 3), (7, 31), (64, 16), (3, 1024), (9, 1025), (1823, 21)])
def test_triton_forward(m, n, dtype, device):
    x, w, b, _ = _inputs(m, n, dtype, seed=m * n)
    poison_allocator(2 * x.numel() * x.element_size(), device)
    _assert_close(ln.layernorm_triton(x, w, b), ln.layernorm_ref(x.double(), w.double(), b.double()), dtype,
                  f"y ({m}, {n}) {dtype}")


@pytest.mark.op("layernorm")
def test_triton_forward_large_mean_small_spread(device):
    """Rows of 100 + N(0, 0.1^2): in fp32, the one-pass variance E[x^2] - E[x]^2 subtracts two numbers near 1e4
    and keeps about 1e4 * 6e-8 of absolute error against a variance of 0.01 (checked below, so this test can
    fail); two passes over the registers keep y within 1e-3."""
    gen = torch.Generator().manual_seed(5)
    x = (100.0 + 0.1 * torch.randn(8, 257, generator=gen, dtype=torch.float64)).float().to(device)
    w, b = torch.ones(257, device=device), torch.zeros(257, device=device)
    ref = ln.layernorm_ref(x.double(), w.double(), b.double()).cpu()
    mean = x.mean(-1, keepdim=True)
    one_pass = (x - mean) / torch.sqrt(((x * x).mean(-1, keepdim=True) - mean * mean).clamp_min(0) + ln.EPS)
    assert (one_pass.double().cpu() - ref).abs().max() > 1e-2, "the one-pass formula should lose here"
    torch.testing.assert_close(ln.layernorm_triton(x, w, b).double().cpu(), ref, rtol=1e-3, atol=1e-3)


@pytest.mark.op("layernorm")
def test_triton_forward_eps_and_constant_rows(device):
    """A constant row has variance 0: y = b, and rstd = 1/sqrt(eps) must not be inf or NaN."""
    x = torch.full((3, 40), 2.5, device=device)
    w, b = torch.full((40,), 3.0, device=device), torch.linspace(-1, 1, 40, device=device)
    # On a GPU the row sum's division rounds the mean by up to an ulp of 2.5 (2.4e-7); 1/sqrt(eps) = 316 and
    # w = 3 magnify that to ~2e-4 at most. What must not happen is inf or NaN.
    y = ln.layernorm_triton(x, w, b)
    assert y.isfinite().all()
    torch.testing.assert_close(y, b.expand(3, 40), rtol=0, atol=3e-4)
    y = ln.layernorm_triton(x + torch.arange(40.0, device=device), w, b, eps=1e3)
    ref = ln.layernorm_ref((x + torch.arange(40.0, device=device)).double(), w.double(), b.double(), eps=1e3)
    torch.testing.assert_close(y.double().cpu(), ref.cpu(), rtol=1e-5, atol=1e-5)


@pytest.mark.op("layernorm")
def test_triton_forward_leading_dims_and_empty_batch(device):
    x, w, b, _ = _inputs(6, 24, shape=(2, 3, 24))
    y = ln.layernorm_triton(x, w, b)
    assert y.shape == (2, 3, 24)
    torch.testing.assert_close(y, ln.layernorm_triton(x.reshape(6, 24), w, b).reshape(2, 3, 24))
    one_row = ln.layernorm_triton(x[0, 0], w, b)  # a 1-D x is one row
    torch.testing.assert_close(one_row, y[0, 0])
    empty = ln.layernorm_triton(x[:0], w, b)
    assert empty.shape == (0, 3, 24) and empty.dtype == x.dtype


@pytest.mark.op("layernorm")
def test_triton_forward_rows_per_program(monkeypatch, device):
    """Several rows per program with a ragged last program: 1000 rows of 64 at 16 rows per program is 63
    programs, the last holding 8 rows; at 64 rows per program, 16 programs, the last holding 40."""
    monkeypatch.setitem(ln.CONFIGS, 1024, ln.RowConfig(rows=1, fwd_warps=4, bwd_warps=4, groups_per_sm=1))
    assert ln.config_for(64)[1].rows == 16
    x, w, b, _ = _inputs(1000, 64, seed=2)
    want = ln.layernorm_ref(x.double(), w.double(), b.double())
    _assert_close(ln.layernorm_triton(x, w, b), want, torch.float32, "y, 16 rows a program")
    monkeypatch.setitem(ln.CONFIGS, 1024, ln.RowConfig(rows=4, fwd_warps=4, bwd_warps=4, groups_per_sm=1))
    _assert_close(ln.layernorm_triton(x, w, b), want, torch.float32, "y, 64 rows a program")


@pytest.mark.op("layernorm")
@pytest.mark.parametrize("case", range(len(_bad_inputs("cpu"))))
def test_triton_refuses_bad_input(case, device):
    label, args, exc, words = _bad_inputs(device)[case]
    with pytest.raises(exc, match=words):
        ln.layernorm_triton(*args)
    with pytest.raises(exc, match=words):  # accepts float64 x, but not with float32 w and b
        ln.LayerNormFunction.apply(*args)


@pytest.mark.op("layernorm")
def test_triton_refuses_long_rows_and_other_devices(monkeypatch, device):
    x = torch.zeros(1, ln.MAX_N + 1, device=device)
    with pytest.raises(ValueError, match="do not fit in registers"):
        ln.layernorm_triton(x, x[0], x[0])
    monkeypatch.setattr(checks, "triton_interpreting", lambda: False)
    cpu = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="cuda device"):
        ln.layernorm_triton(cpu, cpu[0], cpu[0])


@pytest.mark.gpu
@pytest.mark.op("layernorm")
def test_triton_refuses_mixed_devices():
    x = torch.zeros(2, 8, device="cuda")
    with pytest.raises(ValueError, match="w must be on a cuda device"):
        ln.layernorm_triton(x, torch.ones(8), torch.zeros(8, device="cuda"))


# ---------------------------------------------------------------- Triton backward (CPU or GPU)

@pytest.mark.op("layernorm_fwd_bwd")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m, n", [(1, 1), (1, 5), (4, 7), (5, 8), (37, 100), (9, 1025), (200, 33)])
def test_triton_backward(m, n, dtype, device):
    """M rows split over (4 SMs under the interpreter) x groups_per_sm groups: 1 row, fewer rows than groups,
    a short last group (37 rows), and several rows per group (200 rows)."""
    _check_fwd_bwd(*_inputs(m, n, dtype, seed=m + n))


@pytest.mark.op("layernorm_fwd_bwd")
@pytest.mark.parametrize("groups_per_sm", [1, 3, 64])
def test_triton_backward_any_number_of_groups(monkeypatch, groups_per_sm, device):
    """One group summing all rows, groups of uneven size, and one row per group: the same answer."""
    monkeypatch.setitem(ln.CONFIGS, 1024, ln.RowConfig(rows=4, fwd_warps=4, bwd_warps=4, groups_per_sm=groups_per_sm))
    _check_fwd_bwd(*_inputs(150, 48, seed=groups_per_sm))


@pytest.mark.op("layernorm_fwd_bwd")
def test_triton_backward_matches_torch_autograd_fp32(device):
    """LayerNormFunction against PyTorch's own layer_norm backward, fp32, with leading dimensions and a
    gradient arriving through a sum (autograd hands backward() an expanded, non-contiguous tensor of ones)."""
    x, w, b, dy = _inputs(12, 77, seed=3, shape=(3, 4, 77))
    ours = [t.clone().requires_grad_() for t in (x, w, b)]
    theirs = [t.clone().requires_grad_() for t in (x, w, b)]
    loss = (ln.LayerNormFunction.apply(*ours) * dy).sum() + ln.LayerNormFunction.apply(*ours).sum()
    loss.backward()
    ref = torch.nn.functional.layer_norm(theirs[0], (77,), theirs[1], theirs[2], ln.EPS)
    ((ref * dy).sum() + ref.sum()).backward()
    for a, t in zip(ours, theirs):
        torch.testing.assert_close(a.grad, t.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.op("layernorm_fwd_bwd")
@pytest.mark.parametrize("m, n", [(1, 3), (4, 6), (7, 13)])
def test_gradcheck_float64(m, n, device):
    """torch.autograd.gradcheck in float64: the backward kernels against finite differences of the forward
    kernel. The interpreter runs float64 like any other type, and so does the GPU."""
    x, w, b, _ = _inputs(m, n, torch.float64, seed=m * n)
    leaves = tuple(t.clone().requires_grad_() for t in (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w, b: ln.LayerNormFunction.apply(x, w, b, ln.EPS), leaves,
                                    eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.op("layernorm_fwd_bwd")
def test_gradcheck_can_fail(monkeypatch, device):
    """A backward with the xhat * mean(g * xhat) term dropped: gradcheck must notice."""
    real = ln._layernorm_bwd

    def wrong(dy, x, w, mean, rstd):
        dx, dw, db = real(dy, x, w, mean, rstd)
        g = dy * w
        xhat = (x - mean[:, None]) * rstd[:, None]
        return dx + rstd[:, None] * xhat * (g * xhat).mean(-1, keepdim=True), dw, db

    monkeypatch.setattr(ln, "_layernorm_bwd", wrong)
    x, w, b, _ = _inputs(3, 5, torch.float64, seed=1)
    leaves = tuple(t.clone().requires_grad_() for t in (x, w, b))
    assert not torch.autograd.gradcheck(lambda x, w, b: ln.LayerNormFunction.apply(x, w, b), leaves,
                                        raise_exception=False)


@pytest.mark.op("layernorm_fwd_bwd")
def test_backward_is_deterministic(device):
    x, w, b, dy = _inputs(300, 96, seed=4)
    first = ln.layernorm_fwd_bwd_triton(x, w, b, dy)
    second = ln.layernorm_fwd_bwd_triton(x, w, b, dy)
    for a, c in zip(first, second):
        assert torch.equal(a, c), "fixed groups, fixed order of the partial sums: the same bits every run"


@pytest.mark.op("layernorm_fwd_bwd")
def test_backward_empty_batch(device):
    x, w, b, dy = _inputs(3, 16)
    dx, dw, db = ln.layernorm_fwd_bwd_triton(x[:0], w, b, dy[:0])
    assert dx.shape == (0, 16) and torch.equal(dw, torch.zeros_like(w)) and torch.equal(db, torch.zeros_like(b))


@pytest.mark.op("layernorm_fwd_bwd")
def test_fwd_bwd_refuses_bad_dy(device):
    x, w, b, dy = _inputs(3, 16)
    with pytest.raises(ValueError, match="dy has shape"):
        ln.layernorm_fwd_bwd_triton(x, w, b, dy[:2])
    with pytest.raises(TypeError, match="dy has dtype"):
        ln.layernorm_fwd_bwd_triton(x, w, b, dy.half())
    with pytest.raises(ValueError, match="contiguous"):
        ln.layernorm_fwd_bwd_triton(x, w, b, torch.randn(16, 3, device=device).t())


# ---------------------------------------------------------------- GPU only: bf16, CUDA C, headline

@pytest.mark.gpu
@pytest.mark.op("layernorm")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m, n", [(1, 1), (5, 17), (123, 781), (64, 4096), (33, 8192), (8, 16384), (4, 65536)])
def test_gpu_forward(m, n, dtype):
    x, w, b, _ = _inputs(m, n, dtype, "cuda", seed=n)
    ref = ln.layernorm_ref(x.double(), w.double(), b.double())
    poison_allocator(2 * x.numel() * x.element_size(), "cuda")
    _assert_close(ln.layernorm_triton(x, w, b), ref, dtype, f"triton y ({m}, {n}) {dtype}")
    if n <= ln.VECS[-1] * ln.CUDA_THREADS * (16 // x.element_size()):  # the longest row the CUDA kernel takes
        poison_allocator(2 * x.numel() * x.element_size(), "cuda")
        _assert_close(ln.layernorm_cuda(x, w, b), ref, dtype, f"cuda y ({m}, {n}) {dtype}")


@pytest.mark.gpu
@pytest.mark.op("layernorm")
@pytest.mark.parametrize("offset", [1, 3])
def test_gpu_cuda_unaligned_rows(offset):
    """x starting 2 or 6 bytes past a 16-byte boundary, and rows of 100 bf16 (200 bytes, not a multiple of 16):
    the element-by-element path, with NaNs around x that a stray load would pull in."""
    buf = torch.full((offset + 7 * 100 + 8,), float("nan"), device="cuda", dtype=torch.bfloat16)
    x = buf[offset:offset + 700].view(7, 100)
    x.copy_(torch.randn(7, 100, device="cuda"))
    w, b = torch.rand(100, device="cuda").bfloat16(), torch.randn(100, device="cuda").bfloat16()
    assert x.data_ptr() % 16 != 0
    _assert_close(ln.layernorm_cuda(x, w, b), ln.layernorm_ref(x.double(), w.double(), b.double()),
                  torch.bfloat16, "cuda y unaligned")


@pytest.mark.gpu
@pytest.mark.op("layernorm")
def test_gpu_cuda_refuses_bad_input():
    for _label, args, exc, words in _bad_inputs("cuda"):
        with pytest.raises(exc, match=words):
            ln.layernorm_cuda(*args)
    with pytest.raises(ValueError, match="cuda device"):
        ln.layernorm_cuda(torch.zeros(2, 8), torch.ones(8), torch.zeros(8))
    x = torch.zeros(1, 16385, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="do not fit one block"):
        ln.layernorm_cuda(x, x[0], x[0])


@pytest.mark.gpu
@pytest.mark.op("layernorm_fwd_bwd")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m, n", [(1, 1), (123, 781), (1000, 1024), (257, 4096), (40, 16384)])
def test_gpu_backward(m, n, dtype):
    _check_fwd_bwd(*_inputs(m, n, dtype, "cuda", seed=m))


@pytest.mark.gpu
@pytest.mark.op("layernorm_fwd_bwd")
def test_gpu_headline_fwd_bwd_and_determinism():
    """The headline shape, bf16: against float64 closed-form gradients, and the same bits on a second run
    (eager PyTorch's dw is compared too, as the yardstick of what bf16 rounding allows)."""
    x, w, b, dy = _inputs(16384, 4096, torch.bfloat16, "cuda", seed=11)
    ours = ln.layernorm_fwd_bwd_triton(x, w, b, dy)
    refs = ln.layernorm_fwd_bwd_ref(x.double(), w.double(), b.double(), dy.double())
    torch_err = (ln.layernorm_fwd_bwd_torch(x, w, b, dy)[1].double() - refs[1]).abs().max().item()
    for name, o, r in zip(("dx", "dw", "db"), ours, refs):
        _assert_close(o, r, torch.bfloat16, f"{name} headline")
    assert (ours[1].double() - refs[1]).abs().max().item() <= max(2 * torch_err, 1e-2)
    again = ln.layernorm_fwd_bwd_triton(x, w, b, dy)
    assert all(torch.equal(a, c) for a, c in zip(ours, again))
