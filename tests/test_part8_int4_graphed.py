"""int4_gemm v7 and v8 (snippets/part8/int4_gemm.py): the book's small-M kernels chosen by M
(int4_small_m, checked on a CPU through the interpreter) and both v7 and cuBLAS (v8) replayed from a
CUDA graph (`graphed`, GPU only): the graph captured once per set of tensors, replayed after, reading
in-place writes, recaptured for other tensors, and refused on a CPU and under autograd."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_int4_matches, int4_operands

from conftest import DEVICE, HAS_GPU
from snippets.part8 import int4_gemm as ig

HALF = torch.bfloat16 if HAS_GPU else torch.float16
pytestmark = pytest.mark.op("int4_gemm")


@pytest.mark.parametrize("m, g, expect", [(1, 128, "gemv"), (8, 64, "gemv"), (9, 128, "tc"),
                                          (64, 256, "tc"), (65, 128, "wide"), (100, 128, "wide"),
                                          (257, 128, "v2"), (16, 64, "v2")])
def test_small_m_picks_each_kernel_and_equals_it(m, g, expect):
    """int4_small_m is the kernel its rule names, bit for bit (the same launch with the same
    defaults), and right against float64."""
    k = 256
    x, packed, scales, zeros = int4_operands(m, 72, k, g, HALF, DEVICE, True)
    chosen = {"gemv": lambda: ig.int4_gemv(x, packed, scales, zeros),
              "tc": lambda: ig.int4_tc(x, packed, scales, zeros),
              "wide": lambda: ig.int4_tc_wide(x, packed, scales, zeros),
              "v2": lambda: ig.int4_gemm(x, packed, scales, zeros, split_k=None)}[expect]
    y = ig.int4_small_m(x, packed, scales, zeros)
    assert torch.equal(y, chosen())
    assert_int4_matches(y, x, packed, scales, zeros, f"int4_small_m M={m} G={g}")


def test_graphed_refuses_cpu_tensors_and_grad():
    x, packed, scales, _ = int4_operands(4, 64, 128, 128, torch.float32, "cpu")
    with pytest.raises(ValueError, match="CUDA graphs need CUDA tensors"):
        ig.graphed(ig.int4_small_m, x, packed, scales)
    with pytest.raises(RuntimeError, match="no_grad"):
        ig.int4_linear_graphed(x, packed, scales, torch.ones(1, requires_grad=True))


def test_versions_seven_and_eight():
    op = ig.int4_gemm_op
    assert op.impls["v7"].origin == "book" and op.impls["v8"].origin == "library"
    assert op.impls["v7"].device == op.impls["v8"].device == "cuda"   # graphs: a GPU only


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_graphed_replays_right_and_sees_in_place_writes(m, dtype):
    x, packed, scales, zeros = int4_operands(m, 8192, 8192, 128, dtype, "cuda")
    eager = ig.int4_small_m(x, packed, scales)
    y = ig.int4_linear_graphed(x, packed, scales)
    assert torch.equal(y, eager)                                   # the same kernels, replayed
    assert_int4_matches(y, x, packed, scales, None, f"v7 M={m} {dtype}")
    assert ig.int4_linear_graphed(x, packed, scales) is y           # replayed, not recaptured
    x.mul_(-2)                                                      # a replay reads memory now
    y2 = ig.int4_linear_graphed(x, packed, scales)
    assert y2 is y and torch.equal(y2, ig.int4_small_m(x, packed, scales))
    x2 = x.clone()                                                  # other tensors: a new graph
    y3 = ig.int4_linear_graphed(x2, packed, scales)
    assert y3 is not y and torch.equal(y3, y2)
    assert len(ig._GRAPHS[x]) == len(ig._GRAPHS[x2]) == 1


@pytest.mark.gpu
def test_gpu_graphed_cublas_is_v0():
    op = ig.int4_gemm_op
    args = op.make_inputs(op.headline, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
    assert torch.equal(op.impls["v8"].fn(*args), op.impls["v0"].fn(*args))
