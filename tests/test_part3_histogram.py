"""Histogram beyond the generic reference check: every version at ragged sizes, skewed data (one hot bin),
out-of-range values (skipped), unaligned views (the int4 head/tail path), the shared-memory bin limit, and
refusal of bad input. Counts are integers: every comparison is exact."""

from __future__ import annotations

import pytest
import torch

from snippets.part3 import histogram as hg

CUDA_FNS = {"v1": hg.histogram_global_atomics, "v2": hg.histogram_shared, "v3": hg.histogram_warp_aggregated}
ALL_FNS = {"v0": hg.histogram_torch, **CUDA_FNS, "v4": hg.histogram_triton}
SIZES = (1, 31, 32, 33, 1023, 1024, 1025, 4097, 100003)


def _data(n: int, bins: int, dist: str = "uniform", seed: int = 0) -> torch.Tensor:
    (x, _) = hg.make_inputs({"n": n, "bins": bins, "dist": dist}, torch.int32, "cpu",
                            torch.Generator().manual_seed(seed))
    return x


def _expected(x: torch.Tensor, bins: int) -> torch.Tensor:
    """Counted independently of the reference: a Python loop over the values (small n only) or NumPy."""
    import numpy as np
    v = x.cpu().numpy().ravel()
    v = v[(v >= 0) & (v < bins)]
    return torch.from_numpy(np.bincount(v, minlength=bins).astype(np.int32))


def _assert_counts(out: torch.Tensor, x: torch.Tensor, bins: int) -> None:
    assert out.dtype == torch.int32 and out.shape == (bins,) and out.device == x.device
    exp = _expected(x, bins)
    assert torch.equal(out.cpu(), exp), f"{(out.cpu() != exp).sum().item()} bins differ"


@pytest.mark.op("histogram")
def test_reference_skips_out_of_range():
    x = torch.tensor([0, 1, 1, -1, 3, 4, 100, -7, 2], dtype=torch.int32)
    assert hg.histogram_ref(x, 4).tolist() == [1, 2, 1, 1]


@pytest.mark.op("histogram")
def test_inputs_hold_out_of_range_and_skew():
    x = _data(100003, 256, "skewed")
    assert (x < 0).any() and (x >= 256).any(), "the inputs must exercise skipping"
    assert (x == 128).float().mean() > 0.85, "skewed data puts most values in one bin"


# ---------------------------------------------------------------- Triton and PyTorch (CPU or GPU)

@pytest.mark.op("histogram")
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dist", ("uniform", "skewed"))
def test_triton_and_torch(n, dist, device):
    x = _data(n, 256, dist, seed=n).to(device)
    for fn in (hg.histogram_torch, hg.histogram_triton):
        _assert_counts(fn(x, 256), x, 256)


@pytest.mark.op("histogram")
@pytest.mark.parametrize("bins", (1, 2, 255, 257, 4096))
def test_triton_bins(bins, device):
    x = torch.randint(-3, bins + 3, (3000,), generator=torch.Generator().manual_seed(bins), dtype=torch.int32)
    x = x.to(device)
    _assert_counts(hg.histogram_triton(x, bins), x, bins)


@pytest.mark.op("histogram")
def test_triton_all_out_of_range_and_2d(device):
    x = torch.full((40, 50), 300, dtype=torch.int32, device=device)
    assert hg.histogram_triton(x, 256).sum().item() == 0
    y = _data(2000, 64).view(40, 50).to(device)
    _assert_counts(hg.histogram_triton(y, 64), y, 64)


def _bad_inputs(device):
    x = torch.randint(0, 8, (64,), dtype=torch.int32, device=device)
    return [
        ("float32", (x.float(), 8), TypeError, "dtype"),
        ("int64", (x.long(), 8), TypeError, "dtype"),
        ("empty", (x[:0], 8), ValueError, "empty"),
        ("strided", (x[::2], 8), ValueError, "contiguous"),
        ("not a tensor", (x.tolist(), 8), TypeError, "torch.Tensor"),
        ("bins 0", (x, 0), ValueError, "bins"),
        ("bins float", (x, 8.0), TypeError, "bins"),
        ("bins bool", (x, True), TypeError, "bins"),
    ]


@pytest.mark.op("histogram")
@pytest.mark.parametrize("case", range(len(_bad_inputs("cpu"))))
def test_refuses_bad_input(case, device):
    _, args, exc, words = _bad_inputs(device)[case]
    for fn in (hg.histogram_torch, hg.histogram_triton):
        with pytest.raises(exc, match=words):
            fn(*args)


@pytest.mark.op("histogram")
def test_triton_refuses_too_many_bins(device):
    x = torch.zeros(10, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=str(hg.MAX_SHARED_BINS)):
        hg.histogram_triton(x, hg.MAX_SHARED_BINS + 1)


@pytest.mark.op("histogram")
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal of CPU tensors without a GPU")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
def test_cuda_versions_refuse_without_gpu(name):
    with pytest.raises(RuntimeError, match="GPU"):
        CUDA_FNS[name](torch.zeros(4, dtype=torch.int32), 4)


# ---------------------------------------------------------------- CUDA versions (GPU)

@pytest.mark.gpu
@pytest.mark.op("histogram")
@pytest.mark.parametrize("name", sorted(ALL_FNS))
@pytest.mark.parametrize("n", SIZES + (2**22 + 5,))
@pytest.mark.parametrize("dist", ("uniform", "skewed"))
def test_gpu_versions(name, n, dist):
    x = _data(n, 256, dist, seed=n).cuda()
    _assert_counts(ALL_FNS[name](x, 256), x, 256)


@pytest.mark.gpu
@pytest.mark.op("histogram")
@pytest.mark.parametrize("name", sorted(ALL_FNS))
@pytest.mark.parametrize("bins", (1, 3, 32, 1000, 4096, hg.MAX_SHARED_BINS))
def test_gpu_bins(name, bins):
    x = _data(300007, bins, "skewed", seed=bins).cuda()
    _assert_counts(ALL_FNS[name](x, bins), x, bins)


@pytest.mark.gpu
@pytest.mark.op("histogram")
@pytest.mark.parametrize("name", sorted(ALL_FNS))
@pytest.mark.parametrize("start", (1, 2, 3))
@pytest.mark.parametrize("n", (1, 2, 5, 6, 7, 8, 1030))
def test_gpu_unaligned_views(name, start, n):
    """x[start:] is contiguous but not 16-byte aligned: the int4 kernels count the head and tail separately."""
    base = _data(n + start, 64, "uniform", seed=start * 1000 + n).cuda()
    x = base[start:]
    _assert_counts(ALL_FNS[name](x, 64), x, 64)


@pytest.mark.gpu
@pytest.mark.op("histogram")
@pytest.mark.parametrize("name", sorted(ALL_FNS))
def test_gpu_one_value_only(name):
    """Every element in one bin: the worst case for atomics (v1 serializes all n on one address)."""
    x = torch.full((2**20 + 3,), 5, dtype=torch.int32, device="cuda")
    out = ALL_FNS[name](x, 8)
    assert out.tolist() == [0, 0, 0, 0, 0, 2**20 + 3, 0, 0]


@pytest.mark.gpu
@pytest.mark.op("histogram")
@pytest.mark.parametrize("name", ("v2", "v3"))
def test_gpu_shared_versions_refuse_too_many_bins(name):
    x = torch.zeros(10, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match=str(hg.MAX_SHARED_BINS)):
        CUDA_FNS[name](x, hg.MAX_SHARED_BINS + 1)
    _assert_counts(hg.histogram_global_atomics(x, 3 * hg.MAX_SHARED_BINS), x, 3 * hg.MAX_SHARED_BINS)


@pytest.mark.gpu
@pytest.mark.op("histogram")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
def test_gpu_refuses_cpu_tensor(name):
    with pytest.raises(ValueError, match="cuda"):
        CUDA_FNS[name](torch.zeros(4, dtype=torch.int32), 4)
