"""decode_gemv: the batch-1 projection (y = x W^T, one row of x) of the capstone chapter. On a CPU the Triton
version runs under the interpreter at small ragged sizes; on a GPU both versions run at the op's own shapes,
up to the 128256-row output head, against the fp32 reference."""

from __future__ import annotations

import pytest
import torch

from conftest import poison_allocator
from snippets._checks import triton_interpreting
from snippets.part8 import decode_gemv as g

pytestmark = pytest.mark.op("decode_gemv")


def _inputs(n, k, device, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return g.make_inputs({"n": n, "k": k}, dtype, device, gen)


def _check(y, x, w, label):
    assert y.shape == (1, w.shape[0]) and y.dtype == x.dtype, label
    rtol, atol = g.tolerance(w.shape[1], x.dtype)
    torch.testing.assert_close(y.float(), g.gemv_ref(x, w).float(), rtol=rtol, atol=atol,
                               msg=lambda s: f"{label}: {s}")


@pytest.mark.parametrize("n, k", [(1, 1), (3, 31), (4, 32), (9, 100), (130, 257)])
def test_triton_any_shape(device, n, k):
    """Under the interpreter 4 rows and 32 columns a step: N and K that cut both, one row, one column."""
    dtype = torch.float32 if triton_interpreting() else torch.bfloat16
    x, w = _inputs(n, k, device, dtype, seed=n * 1000 + k)
    poison_allocator(n * 4, device)
    _check(g.gemv_triton(x, w), x, w, f"v1 {n}x{k}")


def test_reference_sums_in_fp32():
    """The reference rounds once: sums that cancel in fp16 come out exact."""
    x = torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float16)
    w = torch.tensor([[2048.0, 1.0, -2048.0]], dtype=torch.float16)  # 2048 + 1 is not an fp16 number
    assert g.gemv_ref(x, w).item() == 1.0


@pytest.mark.parametrize("bad, words", [
    (lambda x, w: (x.expand(2, -1).contiguous(), w), "one row of x"),
    (lambda x, w: (x[:, :-1].contiguous(), w), "K = 31 columns but w has 32"),
    (lambda x, w: (x.flatten(), w), r"x must be \(1, K\)"),
    (lambda x, w: (x, w.t()), "contiguous"),
    (lambda x, w: (x.double(), w.double()), "dtype"),
])
def test_bad_input_refused_before_launch(device, bad, words):
    x, w = _inputs(8, 32, device, torch.float16)
    with pytest.raises((ValueError, TypeError), match=words):
        g.gemv_triton(*bad(x, w))


def test_a_weight_that_trains_is_refused(device):
    x, w = _inputs(8, 32, device, torch.float16)
    w.requires_grad_(True)
    with pytest.raises(RuntimeError, match="F.linear"):
        g.gemv_triton(x, w)
    with torch.no_grad():
        g.gemv_triton(x, w)


def test_the_sweep_is_the_1b_projections():
    """K = 2048 (Llama 3.2 1B's hidden) and the rows of its K/V, Q/O, fused QKV, gate/up, fused gate-up and
    output-head matrices; the cost model is the weight's bytes plus x and y."""
    assert [s["n"] for s in g.gemv_op.sweep] == [512, 2048, 3072, 8192, 16384, 128256]
    assert {s["k"] for s in g.gemv_op.sweep} == {2048}
    assert g.bytes_moved({"n": 3, "k": 5}, torch.bfloat16) == (15 + 5 + 3) * 2
    assert g.flops({"n": 3, "k": 5}, torch.bfloat16) == 30


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", g.HALF)
@pytest.mark.parametrize("n", [s["n"] for s in g.SWEEP])
def test_gpu_versions_at_the_op_shapes(n, dtype):
    x, w = _inputs(n, 2048, "cuda", dtype, seed=n)
    for name, fn in (("v0", g.gemv_cublas), ("v1", g.gemv_triton)):
        _check(fn(x, w), x, w, f"{name} {n} {dtype}")


@pytest.mark.gpu
def test_gpu_cpu_tensors_refused():
    x, w = _inputs(8, 32, "cpu", torch.bfloat16)
    for fn in (g.gemv_cublas, g.gemv_triton):
        with pytest.raises(ValueError, match="cuda"):
            fn(x, w)
