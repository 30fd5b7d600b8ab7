"""Sum reduction beyond the generic reference check: zero-mean data against a length-scaled error bound,
integer data that every summation order must add exactly, every pass of the multi-pass launchers, unaligned
views for the float4 path, determinism where it is promised, and clear refusal of bad input."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_refuses
from hypothesis import given, settings
from hypothesis import strategies as st

import snippets._checks as checks
from conftest import DEVICE, poison_allocator
from snippets.part3 import reduce as rd

CUDA_FNS = {
    "v1": rd.reduce_interleaved_divergent, "v2": rd.reduce_interleaved, "v3": rd.reduce_sequential,
    "v4": rd.reduce_first_add_on_load, "v5": rd.reduce_unrolled_warp, "v6": rd.reduce_shuffle,
    "v7": rd.reduce_vec4_atomic, "cg": rd.reduce_cg,
}
DETERMINISTIC = ("v1", "v2", "v3", "v4", "v5", "v6")  # no atomics: same input, same bits
# The brief's sizes, then the edges of one block (256 threads, 512 elements for v4-v6), of one float4 group,
# of the Triton block (4096), and sizes that need three or more passes of the tree versions.
SIZES = [1, 2, 3, 4, 5, 31, 32, 33, 255, 256, 257, 511, 512, 513, 1000, 4095, 4096, 4097, 65537,
         2**20 + 3, 3 * 2**20 + 7]
INTERP_SIZES = [1, 2, 3, 31, 1000, 4096, 4097]


def _bad_inputs(device):
    x = torch.randn(16, device=device)
    return [
        ("float64", (x.double(),), TypeError, "dtype"),
        ("int32", (x.int(),), TypeError, "dtype"),
        ("empty", (x[:0],), ValueError, "empty"),
        ("strided view", (x[::2],), ValueError, "contiguous"),
        ("transposed matrix", (x.view(4, 4).t(),), ValueError, "contiguous"),
        ("not a tensor", (x.tolist(),), TypeError, "torch.Tensor"),
    ]


def _assert_sum(out: torch.Tensor, x: torch.Tensor) -> None:
    """out is a 0-d float32 tensor within the length-scaled fp32 error bound of the float64 sum of x."""
    assert out.shape == () and out.dtype == torch.float32 and out.device == x.device
    ref = x.double().sum().item()
    err = abs(out.item() - ref)
    bound = rd.sum_error_bound(x)
    assert err <= bound, f"n={x.numel()} {x.dtype}: sum {out.item()!r}, exact {ref!r}, error {err:.3g} > {bound:.3g}"


def _integers(n: int, device: str, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    """Integers in [-8, 8]: every partial sum of up to 2^20 of them is an integer below 2^24, which fp32
    holds exactly, so every summation order gives the exact sum. A dropped or doubled element shows."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 9, (n,), generator=g).to(device=device, dtype=dtype)


# ---------------------------------------------------------------- reference, bound, configs (no GPU needed)

@pytest.mark.op("reduce_sum")
def test_reference_accumulates_in_fp32_or_better():
    x = torch.full((4096,), 1.0, dtype=torch.float16)  # 4096 > 2048: an fp16 running sum would stop growing
    assert rd.reduce_sum_ref(x).dtype == torch.float32 and rd.reduce_sum_ref(x).item() == 4096.0
    assert rd.reduce_sum_ref(x.double()).dtype == torch.float64


@pytest.mark.op("reduce_sum")
def test_error_bound_scales_with_n_and_catches_a_lost_element():
    gen = torch.Generator().manual_seed(0)
    small, large = torch.randn(1000, generator=gen), torch.randn(1_000_000, generator=gen)
    assert rd.sum_error_bound(large) > 100 * rd.sum_error_bound(small)
    # at the largest generic test size, an element of size 1 left out (a missed tail) is outside the bound
    assert rd.sum_error_bound(torch.randn(65537, generator=gen)) < 1.0


@pytest.mark.op("reduce_sum")
@pytest.mark.parametrize("version", sorted(rd.CONFIGS))
def test_configs_are_consistent(version):
    cfg = rd.CONFIGS[version]
    assert cfg.kernel == f"reduce_{version}", "each version launches its own kernel"
    assert cfg.threads == 256, "BLOCK in csrc/part3/reduce.cu"
    expected = {"v1": 1, "v2": 1, "v3": 1, "v4": 2, "v5": 2, "v6": 2, "v7": 16, "cg": 16}[version]
    assert cfg.per_block == expected * cfg.threads
    assert cfg.atomic == (version in ("v7", "cg"))


def test_cuda_without_gpu_is_clear(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for fn in CUDA_FNS.values():
        with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):
            fn(torch.randn(8))


# ---------------------------------------------------------------- Triton and PyTorch (CPU or GPU)

@pytest.mark.op("reduce_sum")
@pytest.mark.parametrize("case", range(len(_bad_inputs("cpu"))))
def test_triton_refuses_bad_input(case, device):
    assert_refuses(rd.reduce_sum_triton, _bad_inputs(device)[case])


@pytest.mark.op("reduce_sum")
def test_triton_refuses_cpu_tensors_when_compiled(monkeypatch):
    monkeypatch.setattr(checks, "triton_interpreting", lambda: False)
    with pytest.raises(ValueError, match="cuda device"):
        rd.reduce_sum_triton(torch.randn(8))


@pytest.mark.op("reduce_sum")
@pytest.mark.parametrize("n", INTERP_SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_zero_mean(n, dtype, device):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(device=device, dtype=dtype)
    poison_allocator(4 * n, device)
    _assert_sum(rd.reduce_sum_triton(x), x)


@pytest.mark.op("reduce_sum")
@pytest.mark.parametrize("n", INTERP_SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_integers_exact(n, dtype, device):
    x = _integers(n, device, dtype, seed=n)
    assert rd.reduce_sum_triton(x).item() == x.long().sum().item()


@pytest.mark.op("reduce_sum")
def test_triton_many_passes(monkeypatch, device):
    """With 16-element blocks, 1000 elements take four launches (1000 -> 63 -> 4 -> 1): the partial-sum
    passes and their ragged ends are exercised without a 16M-element input."""
    monkeypatch.setattr(rd, "BLOCK", 16)
    launches = []
    real = rd._sum_kernel

    class Spy:
        def __getitem__(self, grid):
            launches.append(grid[0])
            return real[grid]

    monkeypatch.setattr(rd, "_sum_kernel", Spy())
    x = _integers(1000, device, seed=3)
    assert rd.reduce_sum_triton(x).item() == x.long().sum().item()
    assert launches == [63, 4, 1]


@pytest.mark.op("reduce_sum")
def test_triton_any_shape_is_summed_whole(device):
    x = _integers(6 * 7 * 5, device, seed=9).view(6, 7, 5)
    assert rd.reduce_sum_triton(x).item() == x.long().sum().item()


@pytest.mark.op("reduce_sum")
@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 5000), seed=st.integers(0, 2**31))
def test_triton_any_length(n, seed):
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    _assert_sum(rd.reduce_sum_triton(x), x)


@pytest.mark.op("reduce_sum")
def test_torch_baseline(device):
    x = torch.randn(4097, device=device).half()
    out = rd.reduce_sum_torch(x)
    assert out.dtype == torch.float32
    _assert_sum(out, x)


# ---------------------------------------------------------------- CUDA C versions (GPU only)

@pytest.mark.gpu
@pytest.mark.op("reduce_sum")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
@pytest.mark.parametrize("case", range(len(_bad_inputs("cpu"))))
def test_cuda_refuses_bad_input(name, case):
    label, args, exc, words = _bad_inputs("cuda")[case]
    with pytest.raises(exc, match=words):
        CUDA_FNS[name](*args)


@pytest.mark.gpu
@pytest.mark.op("reduce_sum")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
def test_cuda_refuses_other_dtypes_and_host_tensors(name):
    x = torch.randn(64, device="cuda")
    for dtype in (torch.float16, torch.bfloat16):
        with pytest.raises(TypeError, match="float32"):
            CUDA_FNS[name](x.to(dtype))
    with pytest.raises(ValueError, match="cuda device"):
        CUDA_FNS[name](x.cpu())


@pytest.mark.gpu
@pytest.mark.op("reduce_sum")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
@pytest.mark.parametrize("n", SIZES)
def test_cuda_zero_mean(name, n):
    x = torch.randn(n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(n))
    poison_allocator(4 * n, "cuda")
    _assert_sum(CUDA_FNS[name](x), x)


@pytest.mark.gpu
@pytest.mark.op("reduce_sum")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
@pytest.mark.parametrize("n", SIZES[:-1])  # up to 2^20 + 3 integers of at most 8: partial sums stay below 2^24
def test_cuda_integers_exact(name, n):
    x = _integers(n, "cuda", seed=n)
    poison_allocator(4 * n, "cuda")
    assert CUDA_FNS[name](x).item() == x.long().sum().item()


@pytest.mark.gpu
@pytest.mark.op("reduce_sum")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
@pytest.mark.parametrize("offset", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 1000, 4097, 65537])
def test_cuda_unaligned_views_read_only_their_elements(name, offset, n):
    """x starts 4, 8 or 12 bytes past a 16-byte boundary, between NaNs: v7 sums 0-3 head elements one by one
    before its float4 loads; a load before the start or past the end would pull in a NaN."""
    buf = torch.full((n + 8,), float("nan"), device="cuda")
    x = buf[offset:offset + n]
    x.copy_(_integers(n, "cuda", seed=offset))
    assert x.is_contiguous() and x.data_ptr() % 16 != 0
    assert CUDA_FNS[name](x).item() == x.long().sum().item()


@pytest.mark.gpu
@pytest.mark.op("reduce_sum")
@pytest.mark.parametrize("name", DETERMINISTIC)
def test_tree_versions_are_deterministic(name):
    x = torch.randn(3 * 2**20 + 7, device="cuda")
    a, b = CUDA_FNS[name](x), CUDA_FNS[name](x)
    assert torch.equal(a, b), "no atomics: the same additions in the same order every time"


@pytest.mark.gpu
@pytest.mark.op("reduce_sum")
def test_atomic_versions_agree_within_tolerance():
    """v7 and the cg variant add block sums in arrival order: the bits may differ between runs (not asserted
    either way), but every run is within the bound, and torch.sum repeats itself exactly."""
    x = torch.randn(2**24 + 5, device="cuda")
    for _ in range(3):
        _assert_sum(rd.reduce_vec4_atomic(x), x)
        _assert_sum(rd.reduce_cg(x), x)
    assert torch.equal(rd.reduce_sum_torch(x), rd.reduce_sum_torch(x))


@pytest.mark.gpu
@pytest.mark.op("reduce_sum")
def test_v7_grid_is_one_wave():
    cfg = rd.CONFIGS["v7"]
    fn = rd.cuda.kernel(rd.CU_FILE, cfg.kernel, rd.CU_OPTIONS + cfg.options)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    per_sm = rd.cuda.resident_blocks(fn, cfg.threads)
    assert per_sm >= 1
    assert rd._grid_stride_blocks(fn, cfg, 2**28, torch.device("cuda")) == sms * per_sm
    assert rd._grid_stride_blocks(fn, cfg, 1, torch.device("cuda")) == 1


@pytest.mark.gpu
@pytest.mark.op("reduce_sum")
@pytest.mark.parametrize("name", [*sorted(CUDA_FNS), "v8"])
def test_headline_size(name):
    x = torch.randn(2**28, device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
    fn = rd.reduce_sum_triton if name == "v8" else CUDA_FNS[name]
    _assert_sum(fn(x), x)
    del x
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.op("reduce_sum")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 31, 4097, 65537, 2**20 + 3])
def test_triton_gpu(dtype, n):
    x = torch.randn(n, device="cuda").to(dtype)
    poison_allocator(4 * n, "cuda")
    _assert_sum(rd.reduce_sum_triton(x), x)
    assert rd.reduce_sum_triton(x).item() == rd.reduce_sum_triton(x).item(), "no atomics: deterministic"
