"""1-D convolution (conv1d_constant): the definition, refusals, edge sizes, and every CUDA version on the GPU."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import DEVICE, poison_allocator
from snippets.part2 import conv1d as cv

CUDA_FNS = {"v1": cv.conv1d_cuda_global, "v2": cv.conv1d_cuda_constant, "v3": cv.conv1d_cuda_shared,
            "v5": cv.conv1d_cuda_shared_const}
EDGE_SIZES = [(1, 1), (1, 63), (2, 3), (5, 7), (31, 63), (62, 63), (63, 63), (64, 63), (257, 31),
              (cv.TILE - 1, 15), (cv.TILE, 15), (cv.TILE + 1, 15), (3 * cv.TILE + 37, 63), (100_003, 9)]


def _inputs(n, k, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return cv._make_inputs({"n": n, "k": k}, torch.float32, device, gen)


def _by_definition(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """out[i] = sum_j w[j] x[i + j - k//2], term by term in Python floats (float64)."""
    n, k = x.numel(), w.numel()
    xs, ws = x.tolist(), w.tolist()
    return torch.tensor([sum(ws[j] * xs[i + j - k // 2] for j in range(k) if 0 <= i + j - k // 2 < n)
                         for i in range(n)], dtype=torch.float64)


# ---------------------------------------------------------------- the reference

@pytest.mark.op("conv1d_constant")
@pytest.mark.parametrize("n, k", [(1, 1), (1, 7), (3, 7), (10, 3), (40, 9), (7, 15)])
def test_reference_is_the_definition(n, k):
    x, w = _inputs(n, k, "cpu")
    torch.testing.assert_close(cv.conv1d_ref(x.double(), w.double()), _by_definition(x, w), rtol=1e-12, atol=1e-12)


@pytest.mark.op("conv1d_constant")
def test_cross_correlation_not_convolution(device):
    """No filter flip: w = [0, 0, 1] reads one sample to the right, out[i] = x[i + 1] (and 0 at the end)."""
    x = torch.arange(1.0, 9.0, device=device)
    w = torch.tensor([0.0, 0.0, 1.0], device=device)
    expected = torch.tensor([2.0, 3, 4, 5, 6, 7, 8, 0], device=device)
    for fn in (cv.conv1d_ref, cv.conv1d_triton, cv.conv1d_torch):
        torch.testing.assert_close(fn(x, w), expected, rtol=0, atol=0)


# ---------------------------------------------------------------- Triton (interpreter on CPU) and torch

@pytest.mark.op("conv1d_constant")
@pytest.mark.parametrize("n, k", [(1, 1), (1, 63), (5, 7), (62, 63), (1023, 3), (1025, 31), (3000, 63)])
def test_triton_edges(n, k, device):
    x, w = _inputs(n, k, device)
    poison_allocator(4 * n, device)
    out = cv.conv1d_triton(x, w)
    assert not out.isnan().any()
    torch.testing.assert_close(out.double().cpu(), cv.conv1d_ref(x.double(), w.double()).cpu(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.op("conv1d_constant")
@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 3000), half=st.integers(0, 31))
def test_triton_any_size(n, half):
    x, w = _inputs(n, 2 * half + 1, DEVICE, seed=n)
    torch.testing.assert_close(cv.conv1d_triton(x, w).double().cpu(),
                               cv.conv1d_ref(x.double(), w.double()).cpu(), rtol=1e-5, atol=1e-5)


@pytest.mark.op("conv1d_constant")
@pytest.mark.parametrize("previous", [True, False])
def test_torch_baseline_restores_tf32_flag(previous):
    x, w = _inputs(100, 5, "cpu")
    saved = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = previous
        cv.conv1d_torch(x, w)
        assert torch.backends.cudnn.allow_tf32 is previous
        with pytest.raises(ValueError):
            cv.conv1d_torch(x, w[:4])  # even: refused before the flag is touched
        assert torch.backends.cudnn.allow_tf32 is previous
    finally:
        torch.backends.cudnn.allow_tf32 = saved


# ---------------------------------------------------------------- refusals

def _bad(device):
    x = torch.randn(64, device=device)
    w = torch.randn(5, device=device)
    return [
        ("even k", (x, torch.randn(4, device=device)), ValueError, "odd"),
        ("k = 2", (x, torch.randn(2, device=device)), ValueError, "odd"),
        ("k > 63", (x, torch.randn(65, device=device)), ValueError, "63"),
        ("empty filter", (x, w[:0]), ValueError, "empty"),
        ("empty signal", (x[:0], w), ValueError, "empty"),
        ("float64", (x.double(), w.double()), TypeError, "dtype"),
        ("mixed dtypes", (x, w.half()), TypeError, "dtype"),
        ("2-D signal", (x.view(8, 8), w), ValueError, "1-D"),
        ("2-D filter", (x, torch.randn(1, 5, device=device)), ValueError, "1-D"),
        ("non-contiguous", (x[::2], w), ValueError, "contiguous"),
        ("not a tensor", (x.tolist(), w), TypeError, "torch.Tensor"),
    ]


@pytest.mark.op("conv1d_constant")
@pytest.mark.parametrize("case", range(11))
def test_triton_and_torch_refuse_bad_input(case, device):
    label, args, exc, words = _bad(device)[case]
    with pytest.raises(exc, match=words):
        cv.conv1d_triton(*args)
    with pytest.raises(exc, match=words):
        cv.conv1d_torch(*args)


def test_cuda_without_gpu_is_clear(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):
        cv.conv1d_cuda_constant(torch.randn(8), torch.randn(3))


def test_cost_model():
    op = cv.conv1d_constant
    assert op.bytes_moved({"n": 1000, "k": 31}, torch.float32) == (2000 + 31) * 4
    assert op.flops({"n": 1000, "k": 31}, torch.float32) == 2 * 1000 * 31
    assert {s["k"] for s in op.sweep} == {3, 7, 15, 31, 63} and op.headline in list(op.sweep)


# ---------------------------------------------------------------- CUDA versions (GPU only)

@pytest.mark.gpu
@pytest.mark.op("conv1d_constant")
@pytest.mark.parametrize("version", sorted(CUDA_FNS))
@pytest.mark.parametrize("n, k", EDGE_SIZES)
def test_cuda_matches_float64(version, n, k):
    x, w = _inputs(n, k, "cuda", seed=n + k)
    poison_allocator(4 * n, "cuda")
    out = CUDA_FNS[version](x, w)
    assert out.shape == x.shape and out.dtype == torch.float32 and out.is_cuda
    assert not out.isnan().any(), f"{version}: unwritten outputs"
    torch.testing.assert_close(out.double(), cv.conv1d_ref(x.double(), w.double()), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.op("conv1d_constant")
@pytest.mark.parametrize("version", ["v2", "v5"])
def test_constant_filter_follows_each_call(version):
    """The constant array is global to the module: each call must copy its own filter, in stream order, so two
    calls queued back to back (no synchronize in between) each see their own filter."""
    x, w1 = _inputs(5000, 31, "cuda", seed=1)
    _, w2 = _inputs(5000, 31, "cuda", seed=2)
    w3 = torch.zeros(3, device="cuda")
    w3[1] = 2.0  # out = 2x
    a = CUDA_FNS[version](x, w1)
    b = CUDA_FNS[version](x, w2)
    c = CUDA_FNS[version](x, w3)
    torch.testing.assert_close(a.double(), cv.conv1d_ref(x.double(), w1.double()), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b.double(), cv.conv1d_ref(x.double(), w2.double()), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c, 2 * x, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.op("conv1d_constant")
def test_torch_baseline_is_fp32_on_gpu():
    """With TF32 (10-bit mantissa) cuDNN would miss the fp32 tolerance by orders of magnitude."""
    x, w = _inputs(1 << 20, 63, "cuda")
    torch.testing.assert_close(cv.conv1d_torch(x, w).double(), cv.conv1d_ref(x.double(), w.double()),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.op("conv1d_constant")
@pytest.mark.parametrize("version", sorted(CUDA_FNS))
@pytest.mark.parametrize("case", range(11))
def test_cuda_refuses_bad_input(version, case):
    label, args, exc, words = _bad("cuda")[case]
    with pytest.raises(exc, match=words):
        CUDA_FNS[version](*args)


@pytest.mark.gpu
@pytest.mark.op("conv1d_constant")
@pytest.mark.parametrize("version", sorted(CUDA_FNS))
def test_cuda_refuses_host_tensors(version):
    with pytest.raises(ValueError, match="cuda device"):
        CUDA_FNS[version](torch.randn(16), torch.randn(3))
    with pytest.raises(ValueError, match="cuda"):
        CUDA_FNS[version](torch.randn(16, device="cuda"), torch.randn(3))  # the filter on the host
