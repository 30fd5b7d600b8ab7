"""Scan beyond the generic reference check: every version at tile edges and multi-level sizes, exact checks on
small integers stored as fp32 (any addition order gives the same, exactly representable, sums), int32, the
relative error at large n against float64, poisoned outputs, and refusal of bad input."""

from __future__ import annotations

import pytest
import torch

from conftest import poison_allocator
from snippets.part3 import scan as sc

CUDA_FNS = {"v1": sc.scan_kogge_stone, "v2": sc.scan_brent_kung, "v3": sc.scan_reduce_then_scan,
            "v5": sc.scan_lookback, "v6": sc.scan_lookback_warp}
ALL_FNS = {"v0": sc.scan_torch, **CUDA_FNS, "v4": sc.scan_triton}
SIZES = (1, 31, 32, 33, 1023, 1024, 1025, 4095, 4096, 4097, 100003)
# 1024 * 1024 + 1: v1/v2 need three levels (1025 tile sums, then 2); 2**22 + 4097 crosses many 4096-tiles.
GPU_SIZES = SIZES + (1024 * 1024 + 1, 2**22 + 4097)


def _small_ints(n: int, dtype: torch.dtype, device: str, seed: int = 0) -> torch.Tensor:
    """Integers in [0, 8): every prefix of up to 2**21 of them is below 2**24, so exact in fp32."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 8, (n,), generator=g, dtype=torch.int32).to(device=device, dtype=dtype)


def _assert_exact(fn, x: torch.Tensor) -> None:
    poison_allocator(x.numel() * 4, x.device.type)
    out = fn(x)
    exp = torch.cumsum(x.cpu().long(), 0)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    bad = (out.cpu().long() != exp).nonzero()
    assert bad.numel() == 0, f"n={x.numel()}: {bad.numel()} wrong outputs, first at {bad[0].item()}"


@pytest.mark.op("scan")
def test_reference_keeps_dtype():
    x = torch.tensor([1, 2, 3, -10], dtype=torch.int32)
    out = sc.scan_ref(x)
    assert out.dtype == torch.int32 and out.tolist() == [1, 3, 6, -4]


# ---------------------------------------------------------------- Triton and PyTorch (CPU or GPU)

@pytest.mark.op("scan")
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", (torch.float32, torch.int32))
def test_triton_exact(n, dtype, device):
    _assert_exact(sc.scan_triton, _small_ints(n, dtype, device, seed=n))


@pytest.mark.op("scan")
def test_triton_many_carry_rounds(device):
    """More than BLOCK block sums: the carry program runs several rounds."""
    n = sc.BLOCK * (sc.BLOCK + 3) if device == "cuda" else 0
    if n == 0:
        pytest.skip("2**24 elements is too slow for the interpreter; covered on the GPU")
    _assert_exact(sc.scan_triton, _small_ints(n, torch.int32, device))


@pytest.mark.op("scan")
def test_triton_negative_int32(device):
    x = torch.randint(-1000, 1000, (5000,), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    x = x.to(device)
    assert torch.equal(sc.scan_triton(x).cpu(), torch.cumsum(x.cpu(), 0, dtype=torch.int32))


def _bad_inputs(device):
    x = torch.rand(64, device=device)
    return [
        ("float64", (x.double(),), TypeError, "dtype"),
        ("float16", (x.half(),), TypeError, "dtype"),
        ("int64", (x.long(),), TypeError, "dtype"),
        ("empty", (x[:0],), ValueError, "empty"),
        ("2-D", (x.view(8, 8),), ValueError, "1-D"),
        ("strided", (x[::2],), ValueError, "contiguous"),
        ("not a tensor", (x.tolist(),), TypeError, "torch.Tensor"),
    ]


@pytest.mark.op("scan")
@pytest.mark.parametrize("case", range(len(_bad_inputs("cpu"))))
def test_refuses_bad_input(case, device):
    _, args, exc, words = _bad_inputs(device)[case]
    for fn in (sc.scan_torch, sc.scan_triton):
        with pytest.raises(exc, match=words):
            fn(*args)


@pytest.mark.op("scan")
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal of CPU tensors without a GPU")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
def test_cuda_versions_refuse_without_gpu(name):
    with pytest.raises(RuntimeError, match="GPU"):
        CUDA_FNS[name](torch.zeros(4))


# ---------------------------------------------------------------- every version (GPU)

@pytest.mark.gpu
@pytest.mark.op("scan")
@pytest.mark.parametrize("name", sorted(ALL_FNS))
@pytest.mark.parametrize("n", GPU_SIZES)
@pytest.mark.parametrize("dtype", (torch.float32, torch.int32))
def test_gpu_exact(name, n, dtype):
    _assert_exact(ALL_FNS[name], _small_ints(n, dtype, "cuda", seed=n))


@pytest.mark.gpu
@pytest.mark.op("scan")
@pytest.mark.parametrize("name", sorted(ALL_FNS))
def test_gpu_unaligned_view_and_int32_sign(name):
    base = torch.randint(-50, 50, (70001,), generator=torch.Generator().manual_seed(7), dtype=torch.int32).cuda()
    x = base[3:]  # contiguous, not 16-byte aligned
    assert torch.equal(ALL_FNS[name](x).cpu(), torch.cumsum(x.cpu(), 0, dtype=torch.int32))


@pytest.mark.gpu
@pytest.mark.op("scan")
@pytest.mark.parametrize("name", sorted(ALL_FNS))
def test_gpu_relative_error_large_n(name):
    """2**25 fp32 values in [0, 1) against float64: the error relative to the running sum stays within the op's
    tolerance, and no tile's offset is missing (a missing 4096-element tile would be off by ~2048)."""
    (x,) = sc.make_inputs({"n": 2**25}, torch.float32, "cuda", torch.Generator().manual_seed(3))
    out = ALL_FNS[name](x).double()
    ref = torch.cumsum(x.double(), 0)
    rtol, atol = sc.TOLERANCES[torch.float32]
    rel = ((out - ref).abs() / ref.clamp_min(1e-30)).max().item()
    assert rel <= rtol, f"max relative error {rel:.3g} > {rtol}"
    assert (out[-1] - ref[-1]).abs().item() < 1000, "the last prefix is off by more than rounding"


@pytest.mark.gpu
@pytest.mark.op("scan")
@pytest.mark.parametrize("name", ("v5", "v6"))
def test_gpu_lookback_repeatable(name):
    """The look-back orders tiles by an atomic counter; run it many times to shake out a race."""
    x = _small_ints(2**21, torch.int32, "cuda")
    exp = torch.cumsum(x.long(), 0).int()
    for _ in range(20):
        assert torch.equal(ALL_FNS[name](x), exp)


@pytest.mark.gpu
@pytest.mark.op("scan")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
def test_gpu_refuses_bad_input(name):
    for _, args, exc, words in _bad_inputs("cuda"):
        with pytest.raises(exc, match=words):
            CUDA_FNS[name](*args)
    with pytest.raises(ValueError, match="cuda"):
        CUDA_FNS[name](torch.zeros(4))
