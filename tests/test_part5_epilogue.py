"""GEMM epilogue fusion: every activation of the Triton kernels (tiled and persistent TMA) against the float64
reference on ragged shapes and strided operands, refusals of bad input, the cost model, and the persistent kernel
with its epilogue compiled for sm_90 (wgmma, TMA, no spills) without a GPU."""

from __future__ import annotations

import pytest
import torch

from conftest import poison_allocator
from snippets.common.gemm import tolerance_for
from snippets.part5 import epilogue as e

TRITON = {"v3": e.matmul_bias_act, "v4": e.matmul_bias_act_persistent}
SHAPES = [(1, 8, 8), (17, 40, 24), (33, 24, 40), (64, 64, 64), (100, 136, 72)]


def _inputs(m, n, k, dtype, device):
    return e._make_inputs({"m": m, "n": n, "k": k}, dtype, device, torch.Generator().manual_seed(m * 7 + n + k))


def _assert_close(out, a, b, bias, act):
    ref = e.matmul_bias_act_ref(a.double(), b.double(), bias.double(), act)
    rtol, atol = tolerance_for(a.shape[1], a.dtype)
    assert out.dtype == a.dtype and out.shape == ref.shape
    assert not out.isnan().any(), "unwritten (NaN) outputs"
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)


@pytest.mark.op("matmul_epilogue")
@pytest.mark.parametrize("version", sorted(TRITON))
@pytest.mark.parametrize("act", e.ACTS)
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_triton_epilogue_matches_the_reference(version, act, m, n, k, device):
    a, b, bias = _inputs(m, n, k, torch.float16, device)
    poison_allocator(m * n * 2, device)
    _assert_close(TRITON[version](a, b, bias, act), a, b, bias, act)


@pytest.mark.op("matmul_epilogue")
@pytest.mark.parametrize("m, n, k", [(3, 17, 5), (45, 31, 77), (130, 70, 33)])
def test_tiled_version_takes_ragged_shapes_and_strided_operands(m, n, k, device):
    a, b, bias = _inputs(m, n, k, torch.float16, device)
    a_t = a.t().contiguous().t()          # column-major A
    b_t = b.t().contiguous().t()          # column-major B
    _assert_close(e.matmul_bias_act(a_t, b_t, bias, "gelu"), a, b, bias, "gelu")


@pytest.mark.op("matmul_epilogue")
def test_torch_versions_agree_on_cpu():
    a, b, bias = _inputs(17, 40, 24, torch.float16, "cpu")
    for fn in (e.matmul_bias_gelu_torch, e.matmul_bias_gelu_addmm, e.matmul_bias_gelu_lt):
        _assert_close(fn(a, b, bias), a, b, bias, "gelu")


def test_activations_are_what_they_claim(device):
    a, b, bias = _inputs(40, 48, 32, torch.float16, device)
    plain = e.matmul_bias_act(a, b, bias, "none").float()
    relu = e.matmul_bias_act(a, b, bias, "relu").float()
    assert (relu >= 0).all() and torch.equal(relu, plain.clamp(min=0))
    gelu = e.matmul_bias_act(a, b, bias, "gelu").float()
    silu = e.matmul_bias_act(a, b, bias, "silu").float()
    big = plain > 6  # both approach the identity for large inputs
    torch.testing.assert_close(gelu[big], plain[big], rtol=2e-3, atol=0)
    torch.testing.assert_close(silu[big], plain[big], rtol=3e-3, atol=0)
    assert (gelu[plain < -6].abs() < 1e-3).all()


def test_the_epilogue_is_not_a_no_op(device):
    """A kernel that dropped the bias or the activation fails the reference comparison."""
    a, b, bias = _inputs(32, 32, 32, torch.float16, device)
    ref = e.matmul_bias_act_ref(a.double(), b.double(), bias.double(), "gelu")
    for wrong in (e.matmul_bias_act(a, b, torch.zeros_like(bias), "gelu"), e.matmul_bias_act(a, b, bias, "none")):
        assert not torch.allclose(wrong.double(), ref, rtol=1e-2, atol=1e-1)


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("version", sorted(TRITON))
def test_bad_input_is_refused(version, device):
    fn = TRITON[version]
    a, b, bias = _inputs(16, 32, 16, torch.float16, device)
    with pytest.raises(ValueError, match=r"bias must have shape \(32,\)"):
        fn(a, b, bias[:16])
    with pytest.raises(TypeError, match="bias has dtype torch.float32"):
        fn(a, b, bias.float())
    with pytest.raises(TypeError, match="dtype torch.float32"):
        fn(a.float(), b.float(), bias.float())
    with pytest.raises(ValueError, match="inner dimensions differ"):
        fn(a, b[:8], bias)
    with pytest.raises(ValueError, match="act must be one of"):
        fn(a, b, bias, "tanh")
    with pytest.raises(ValueError, match="empty"):
        fn(a[:0], b, bias)
    with pytest.raises(ValueError, match="bias must be contiguous"):
        fn(a, b, torch.stack([bias, bias], 1)[:, 0])
    with pytest.raises(ValueError, match="2-D"):
        fn(a[0], b, bias)


def test_tma_version_refuses_unaligned_rows(device):
    a, b, bias = _inputs(16, 36, 20, torch.float16, device)  # K = 20: rows of A are 40 bytes apart
    with pytest.raises(ValueError, match="16-byte aligned rows"):
        e.matmul_bias_act_persistent(a, b, bias)
    _assert_close(e.matmul_bias_act(a, b, bias, "gelu"), a, b, bias, "gelu")  # the tiled one takes them


# ---------------------------------------------------------------- the cost model

def test_epilogue_cost_counts_two_round_trips_of_c():
    c = e.epilogue_cost(4096, 2048, 1024, 2, tflops=1000.0, bandwidth_gbs=5000.0)
    assert c.extra_bytes == (4 * 4096 * 2048 + 2048) * 2
    assert c.gemm_bytes == e.matmul_epilogue.bytes_moved({"m": 4096, "n": 2048, "k": 1024}, torch.bfloat16)
    assert c.gemm_s == pytest.approx(2 * 4096 * 2048 * 1024 / 1e15)
    assert c.overhead == pytest.approx(c.extra_s / c.gemm_s)
    # The passes grow with M N, the GEMM with M N K: the overhead halves when K doubles.
    rates = dict(tflops=1000.0, bandwidth_gbs=5000.0)
    small, large = e.epilogue_cost(4096, 4096, 4096, 2, **rates), e.epilogue_cost(4096, 4096, 8192, 2, **rates)
    assert large.overhead == pytest.approx(small.overhead / 2, rel=1e-3)


# ---------------------------------------------------------------- sm_90, without a GPU

@pytest.mark.op("matmul_epilogue")
def test_persistent_epilogue_compiles_for_hopper_without_spills():
    from snippets.common.introspect import compile_many

    fused, plain, tiled = compile_many([e.hopper_job(torch.bfloat16, "gelu"), e.hopper_job(torch.bfloat16, "none"),
                                        e.hopper_job(torch.float16, "silu", persistent=False, block_n=128)])
    for c in (fused, plain, tiled):
        assert "wgmma.mma_async" in c.ptx, c.name          # Hopper's tensor-core instruction
        assert c.spill_stores == 0 and c.spill_loads == 0, (c.name, c.ptxas_report)
    assert "cp.async.bulk.tensor" in fused.ptx             # TMA copies
    assert "ex2.approx" in fused.ptx and "ex2.approx" not in plain.ptx  # the GELU's exponential, only with gelu


# ---------------------------------------------------------------- GPU only

@pytest.mark.gpu
@pytest.mark.parametrize("version", sorted(TRITON))
@pytest.mark.parametrize("act", e.ACTS)
@pytest.mark.parametrize("m, n, k", [(100, 136, 72), (1000, 1024, 512), (4096, 4096, 4096)])
def test_bf16_on_gpu(version, act, m, n, k):
    a, b, bias = _inputs(m, n, k, torch.bfloat16, "cuda")
    _assert_close(TRITON[version](a, b, bias, act), a, b, bias, act)


@pytest.mark.gpu
@pytest.mark.parametrize("fn", [e.matmul_bias_gelu_torch, e.matmul_bias_gelu_addmm, e.matmul_bias_gelu_lt,
                                e.matmul_bias_gelu_compiled], ids=["v0", "v2", "v5", "v1"])
def test_library_versions_on_gpu(fn):
    a, b, bias = _inputs(1024, 1024, 1024, torch.bfloat16, "cuda")
    _assert_close(fn(a, b, bias), a, b, bias, "gelu")
