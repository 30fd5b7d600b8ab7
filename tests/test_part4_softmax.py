"""Fused softmax beyond the generic reference check: every launch configuration v3 can pick, the online
kernel with many chunks (so the rescaling runs), -inf in the data, rows where exp(x) overflows without the max
subtraction, the dispatcher's choice, the NumPy walk-through of the online recurrence, the cost model of the
unfused chain, and clear refusal of bad input. CPU tests run the Triton kernels under the interpreter (fp32,
fp16); bf16 and the CUDA C version run on the GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_refuses

import snippets._checks as checks
from conftest import poison_allocator
from snippets.part4 import softmax as sm

TRITON_FNS = {"v2": sm.softmax_one_pass, "v3": sm.softmax_persistent, "v4": sm.softmax_online,
              "softmax": sm.softmax}
TOL = {torch.float32: (1e-5, 1e-7), torch.float16: (1e-3, 1e-7), torch.bfloat16: (8e-3, 1e-7)}


def _logits(m: int, n: int, device: str, dtype=torch.float32, scale: float = 3.0, offset: float = 0.0,
            seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (offset + scale * torch.randn(m, n, generator=g)).to(device=device, dtype=dtype)


def _assert_softmax(y: torch.Tensor, x: torch.Tensor) -> None:
    """y is softmax(x) in x's dtype: within the dtype's tolerance of the float64 reference, rows summing to 1."""
    assert y.dtype == x.dtype and y.shape == x.shape and y.device == x.device
    ref = sm.softmax_ref(x.double())
    rtol, atol = TOL[x.dtype]
    torch.testing.assert_close(y.double().cpu(), ref.cpu(), rtol=rtol, atol=atol)
    row_sums = y.double().sum(dim=-1)
    tol = row_sum_tolerance(x.shape[1], x.dtype)
    worst = (row_sums - 1).abs().max().item()
    assert worst <= tol, f"a row sums to 1 {worst:+.3g} away, more than {tol:.3g} (N = {x.shape[1]})"


def row_sum_tolerance(n: int, dtype: torch.dtype) -> float:
    """How far from 1 a row of N outputs may sum. Each output is its exact value rounded once to the dtype,
    off by at most u = eps/2 of itself (fp16 subnormals, below 2^-14, by half their spacing absolute), so
    the N roundings move the sum by at most u * sum(y) = u, plus N half-spacings: 2u leaves room for a
    truncating conversion. Inside the kernel the outputs share one fp32 row sum as divisor, so its
    rounding (and the exponentials') moves the whole row together: a few fp32 ulps * sqrt(N) (observed
    under 0.2 u32 * sqrt(N) on the interpreter). Not N times the element-wise rtol, which at N = 1025 in
    fp16 was 1.03 and checked nothing."""
    info = torch.finfo(dtype)
    return 2 * (info.eps / 2) + n * info.tiny * info.eps / 2 + 4 * 2.0**-24 * n**0.5


def _run(fn, x: torch.Tensor, **kw) -> torch.Tensor:
    poison_allocator(x.numel() * x.element_size(), x.device.type)  # an unwritten output element is NaN
    return fn(x, **kw)


# ---------------------------------------------------------------- pieces that need no kernel

@pytest.mark.op("softmax")
def test_reference_is_the_textbook_formula():
    x = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    e = np.exp(np.array([1.0, 2.0, 3.0]))
    torch.testing.assert_close(sm.softmax_ref(x)[0], torch.from_numpy(e / e.sum()))
    torch.testing.assert_close(sm.softmax_ref(x)[1], torch.full((3,), 1 / 3, dtype=torch.float64))
    assert sm.softmax_ref(x.half()).dtype == torch.float16


def test_naive_formula_overflows_in_fp32_and_reference_does_not():
    x = torch.tensor([[100.0, 101.0, 102.0]])  # exp(100) > 3.4e38, fp32's largest value
    naive = torch.exp(x) / torch.exp(x).sum(dim=-1, keepdim=True)
    assert torch.isnan(naive).all()
    assert torch.allclose(sm.softmax_ref(x), torch.softmax(x.double(), -1).float())


def test_chain_bytes_counts_eight_passes_against_two():
    steps = sm.chain_bytes(16384, 8192, 4)
    full = 16384 * 8192 * 4
    assert steps["fused"] == 2 * full
    assert steps["chain"] == 8 * full + 4 * 16384 * 4  # plus the row maxima and sums, written and read back
    assert steps["chain"] / steps["fused"] == pytest.approx(4.0, rel=1e-3)


@pytest.mark.parametrize("block", [1, 2, 3, 7, 64, 1000])
def test_numpy_online_recurrence_matches_direct_softmax(block):
    x = np.random.default_rng(block).normal(50.0, 10.0, size=123)
    y, trace = sm.online_softmax_numpy(x, block)
    e = np.exp(x - x.max())
    np.testing.assert_allclose(y, e / e.sum(), rtol=1e-13)
    assert len(trace) == -(-x.size // block)
    # after each block the pair is (max so far, sum of exp(x - max so far) over everything seen so far)
    for i, (m, s) in enumerate(trace):
        seen = x[:(i + 1) * block]
        assert m == seen.max()
        assert s == pytest.approx(np.exp(seen - seen.max()).sum(), rel=1e-13)


def test_numpy_online_recurrence_rescales_when_the_max_grows():
    _, trace = sm.online_softmax_numpy(np.array([0.0, 0.0, 1000.0, 0.0]), block=2)
    assert trace[0] == (0.0, 2.0)
    assert trace[1][0] == 1000.0 and trace[1][1] == pytest.approx(1.0)  # exp(0 - 1000) terms vanish, no overflow


@pytest.mark.op("softmax")
def test_config_table_is_consistent():
    limits = sorted(sm.PERSISTENT_CONFIGS)
    assert sm.PERSISTENT_MAX_N == limits[-1] <= sm.ONE_PASS_MAX_N
    assert sm.ONE_PASS_MAX_N == 32 * 32 * sm.row_num_warps(sm.ONE_PASS_MAX_N), "32 warps x 32 values per thread"
    for limit in limits:
        cfg = sm.PERSISTENT_CONFIGS[limit]
        assert limit & (limit - 1) == 0, "keys are BLOCK_N values: powers of two"
        assert cfg.num_warps in (1, 2, 4, 8, 16, 32) and cfg.programs_per_sm >= 1 and cfg.num_stages >= 1
    assert sm.persistent_config(1) == sm.PERSISTENT_CONFIGS[limits[0]]
    with pytest.raises(ValueError, match="no one-pass config"):
        sm.persistent_config(2 * sm.ONE_PASS_MAX_N)
    assert [sm.row_num_warps(b) for b in (1, 2048, 8192, 2**15, 2**18)] == [4, 4, 8, 32, 32]
    assert [sm.cuda_threads(n) for n in (1, 32, 33, 8192, 8193, 16384)] == [32, 32, 32, 256, 288, 512]


# ---------------------------------------------------------------- Triton kernels (CPU interpreter or GPU)

@pytest.mark.op("softmax")
@pytest.mark.parametrize("version", sorted(TRITON_FNS))
@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (3, 17), (4, 1024), (5, 1025), (9, 781)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_versions(version, shape, dtype, device):
    x = _logits(*shape, device, dtype, seed=shape[1])
    _assert_softmax(_run(TRITON_FNS[version], x), x)


@pytest.mark.op("softmax")
@pytest.mark.parametrize("limit", sorted(sm.PERSISTENT_CONFIGS))
def test_persistent_every_config(limit, device):
    # A row length that picks each entry of the table (BLOCK_N = limit), more rows than programs.
    n = limit // 2 + 3 if limit > 1 else 1
    x = _logits(5, n, device, seed=limit)
    _assert_softmax(_run(sm.softmax_persistent, x), x)


@pytest.mark.op("softmax")
@pytest.mark.parametrize("cfg", [sm.PersistentConfig(4, 1, 1, False), sm.PersistentConfig(4, 2, 2, True)])
def test_persistent_config_override(cfg, device):
    x = _logits(11, 300, device)
    _assert_softmax(_run(sm.softmax_persistent, x, config=cfg), x)


@pytest.mark.op("softmax")
@pytest.mark.parametrize("block_n", [1, 4, 16, 64])
@pytest.mark.parametrize("n", [1, 5, 64, 300])
def test_online_many_chunks(block_n, n, device):
    # Increasing rows put the max in the last chunk, so every chunk raises the running max and rescales the sum.
    x = _logits(3, n, device, seed=n) + torch.linspace(0, 30, n, device=device)
    _assert_softmax(_run(sm.softmax_online, x, block_n=block_n), x)


@pytest.mark.op("softmax")
@pytest.mark.parametrize("version", sorted(TRITON_FNS))
def test_large_logits_do_not_overflow(version, device):
    x = _logits(4, 100, device, offset=1000.0)  # exp(1000) is inf in fp32: the max must be subtracted first
    y = _run(TRITON_FNS[version], x)
    assert torch.isfinite(y).all()
    _assert_softmax(y, x)


@pytest.mark.op("softmax")
@pytest.mark.parametrize("version", sorted(TRITON_FNS))
def test_minus_infinity_entries_get_zero(version, device):
    # Masked attention scores are -inf: they must come out as exactly 0, and a whole -inf chunk must not turn
    # the online kernel's running sum into NaN.
    x = _logits(3, 50, device)
    x[:, :20] = float("-inf")
    x[1, 30:40] = float("-inf")
    kw = {"block_n": 8} if version == "v4" else {}
    y = _run(TRITON_FNS[version], x, **kw)
    assert (y[:, :20] == 0).all() and (y[1, 30:40] == 0).all()
    torch.testing.assert_close(y, torch.softmax(x, dim=-1), rtol=1e-5, atol=1e-7)


@pytest.mark.op("softmax")
def test_dispatch_picks_one_pass_then_online(monkeypatch, device):
    called = []
    monkeypatch.setattr(sm, "softmax_one_pass", lambda x: called.append("v2") or torch.zeros_like(x))
    monkeypatch.setattr(sm, "softmax_online", lambda x: called.append("v4") or torch.zeros_like(x))
    sm.softmax(torch.zeros(2, sm.ONE_PASS_MAX_N, device=device))
    sm.softmax(torch.zeros(1, sm.ONE_PASS_MAX_N + 1, device=device))
    assert called == ["v2", "v4"]


@pytest.mark.op("softmax")
def test_persistent_refuses_rows_too_long(device):
    x = torch.zeros(1, sm.PERSISTENT_MAX_N + 1, device=device)
    with pytest.raises(ValueError, match="does not fit"):
        sm.softmax_persistent(x)


def _bad_inputs(device):
    x = torch.randn(4, 6, device=device)
    return [
        ("float64", x.double(), TypeError, "dtype"),
        ("int32", x.int(), TypeError, "dtype"),
        ("1-D", x[0], ValueError, "2-D"),
        ("3-D", x.view(2, 2, 6), ValueError, "2-D"),
        ("empty rows", x[:0], ValueError, "empty"),
        ("empty columns", x[:, :0], ValueError, "empty"),
        ("transposed", x.t(), ValueError, "contiguous"),
        ("column slice", x[:, :3], ValueError, "contiguous"),
        ("not a tensor", x.tolist(), TypeError, "torch.Tensor"),
    ]


@pytest.mark.op("softmax")
@pytest.mark.parametrize("version", sorted(TRITON_FNS))
@pytest.mark.parametrize("case", range(len(_bad_inputs("cpu"))))
def test_triton_refuses_bad_input(version, case, device):
    assert_refuses(TRITON_FNS[version], _bad_inputs(device)[case])


@pytest.mark.op("softmax")
@pytest.mark.parametrize("version", sorted(TRITON_FNS))
def test_refuses_rows_too_long_for_int32_offsets(version, monkeypatch, device):
    monkeypatch.setattr(sm, "MAX_COLS", 64)
    with pytest.raises(ValueError, match="int32"):
        TRITON_FNS[version](torch.zeros(1, 65, device=device))


@pytest.mark.op("softmax")
def test_online_refuses_bad_block(device):
    x = torch.zeros(2, 8, device=device)
    with pytest.raises(ValueError, match="power of two"):
        sm.softmax_online(x, block_n=6)
    with pytest.raises(TypeError, match="int"):
        sm.softmax_online(x, block_n=4.0)


@pytest.mark.op("softmax")
def test_triton_refuses_cpu_tensors_when_compiled(monkeypatch):
    monkeypatch.setattr(checks, "triton_interpreting", lambda: False)
    with pytest.raises(ValueError, match="cuda device"):
        sm.softmax(torch.randn(2, 8))


def test_cuda_without_gpu_is_clear(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):
        sm.softmax_cuda(torch.randn(2, 8))


# ---------------------------------------------------------------- GPU only: bf16, the CUDA C version

@pytest.mark.gpu
@pytest.mark.op("softmax")
@pytest.mark.parametrize("version", sorted(TRITON_FNS))
@pytest.mark.parametrize("n", [1, 17, 1000, 4096, 8192, 16384, 32768, 40000])
def test_triton_bf16_gpu(version, n):
    if version == "v3" and n > sm.PERSISTENT_MAX_N:
        pytest.skip("v3 stops at PERSISTENT_MAX_N")
    x = _logits(33, n, "cuda", torch.bfloat16, seed=n)
    _assert_softmax(_run(TRITON_FNS[version], x), x)


@pytest.mark.gpu
@pytest.mark.op("softmax")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1, 3, 17, 32, 255, 1000, 1024, 1823, 4100, 8192, 16383, 16384])
def test_cuda_gpu(dtype, n):
    # n * itemsize % 16 picks the vector or the scalar kernel; both are covered across these sizes.
    x = _logits(19, n, "cuda", dtype, seed=n)
    _assert_softmax(_run(sm.softmax_cuda, x), x)


@pytest.mark.gpu
@pytest.mark.op("softmax")
def test_cuda_unaligned_view_takes_the_scalar_kernel():
    # A contiguous view that starts one fp32 element (4 bytes) into its buffer: rows of 8 floats are 32 bytes,
    # but no row starts on a 16-byte boundary, so a 16-byte load would be misaligned.
    flat = torch.randn(1 + 5 * 8, device="cuda")
    x = flat[1:].view(5, 8)
    assert x.is_contiguous() and x.data_ptr() % 16 != 0
    _assert_softmax(_run(sm.softmax_cuda, x), x)


@pytest.mark.gpu
@pytest.mark.op("softmax")
def test_cuda_refuses_rows_too_long():
    with pytest.raises(ValueError, match="at most"):
        sm.softmax_cuda(torch.zeros(1, sm.CUDA_MAX_N + 1, device="cuda"))


@pytest.mark.gpu
@pytest.mark.op("softmax")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_headline_size_gpu(dtype):
    x = _logits(16384, 8192, "cuda", dtype)
    want = torch.softmax(x.float(), dim=-1)
    rtol, atol = TOL[dtype]
    for fn in (sm.softmax, sm.softmax_one_pass, sm.softmax_online, sm.softmax_cuda):
        torch.testing.assert_close(fn(x).float(), want, rtol=rtol, atol=atol)
