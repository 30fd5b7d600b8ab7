"""Transpose beyond the generic reference check: every version at ragged edges, the float4 path and its
fallback, 64-bit indexing, and clear refusal of what the kernels cannot take. A transpose moves bits, so
every comparison is exact."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_refuses
from hypothesis import given, settings
from hypothesis import strategies as st

import snippets._checks as checks
from conftest import DEVICE, poison_allocator
from snippets.part2 import transpose as tp

CUDA_FNS = {
    "v1": tp.transpose_naive, "v2": tp.transpose_naive_rows, "v3": tp.transpose_smem,
    "v4": tp.transpose_smem_padded, "v5": tp.transpose_smem_swizzled, "v6": tp.transpose_smem_4_per_thread,
    "v7": tp.transpose_vec4,
}
# The brief's edge cases; then multiples of 4 that are not multiples of 32 (v7's float4 path with partial
# tiles); then multiples of 32 (whole tiles only) and odd sizes past several tiles.
SHAPES = [(1, 1), (1, 300), (300, 1), (31, 33), (33, 31), (1023, 517), (4097, 3),
          (4, 4), (36, 68), (4, 1028), (1028, 4), (100, 4), (64, 96), (96, 64), (257, 129)]
SMALL_SHAPES = [s for s in SHAPES if s[0] * s[1] <= 600_000]


def _bad_inputs(device):
    x = torch.randn(6, 8, device=device)
    return [
        ("float64", (x.double(),), TypeError, "dtype"),
        ("int32", (x.int(),), TypeError, "dtype"),
        ("empty", (x[:0],), ValueError, "empty"),
        ("1-D", (x.view(-1),), ValueError, "2-D"),
        ("3-D", (x.view(2, 3, 8),), ValueError, "2-D"),
        ("transposed view", (x.t(),), ValueError, "contiguous"),
        ("column slice", (x[:, :4],), ValueError, "contiguous"),
        ("not a tensor", (x.tolist(),), TypeError, "torch.Tensor"),
    ]


def _assert_transposed(out: torch.Tensor, x: torch.Tensor) -> None:
    m, n = x.shape
    assert out.shape == (n, m), f"shape {tuple(out.shape)}, expected {(n, m)}"
    assert out.is_contiguous() and out.dtype == x.dtype and out.device == x.device
    assert torch.equal(out, x.t()), f"{(m, n)}: {(out != x.t()).sum().item()} elements differ"


# ---------------------------------------------------------------- Triton and PyTorch (CPU or GPU)

@pytest.mark.op("transpose")
@pytest.mark.parametrize("case", range(len(_bad_inputs("cpu"))))
def test_triton_refuses_bad_input(case, device):
    assert_refuses(tp.transpose_triton, _bad_inputs(device)[case])


@pytest.mark.op("transpose")
def test_triton_refuses_cpu_tensors_when_compiled(monkeypatch):
    monkeypatch.setattr(checks, "triton_interpreting", lambda: False)
    with pytest.raises(ValueError, match="cuda device"):
        tp.transpose_triton(torch.randn(4, 4))


@pytest.mark.op("transpose")
@pytest.mark.parametrize("m, n", SMALL_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_shapes(m, n, dtype, device):
    x = torch.randn(m, n, device=device).to(dtype)
    poison_allocator(m * n * x.element_size(), device)
    _assert_transposed(tp.transpose_triton(x), x)


@pytest.mark.op("transpose")
def test_triton_bfloat16_bits(device):
    """bf16 only moves through the kernel, so its bits must arrive unchanged (NaN and -0.0 included)."""
    x = torch.randn(45, 70, device=device).to(torch.bfloat16)
    x[3, 5], x[7, 9] = float("nan"), -0.0
    out = tp.transpose_triton(x)
    assert torch.equal(out.view(torch.int16), x.view(torch.int16).t())


@pytest.mark.op("transpose")
@settings(max_examples=20, deadline=None)
@given(m=st.integers(1, 150), n=st.integers(1, 150))
def test_triton_any_shape(m, n):
    x = torch.randn(m, n, device=DEVICE)
    _assert_transposed(tp.transpose_triton(x), x)


@pytest.mark.op("transpose")
def test_torch_baseline(device):
    x = torch.randn(33, 31, device=device)
    _assert_transposed(tp.transpose_torch(x), x)


# ---------------------------------------------------------------- launch configurations (no GPU needed)

@pytest.mark.op("transpose")
@pytest.mark.parametrize("version", sorted(tp.CONFIGS))
def test_configs_are_consistent(version):
    cfg = tp.CONFIGS[version]
    assert cfg.kernel == f"transpose_{version}", "each version launches its own kernel"
    threads = cfg.threads[0] * cfg.threads[1]
    assert threads <= 1024 and threads % 32 == 0, "whole warps, at most 1024 threads per block"
    assert cfg.tile[0] * cfg.tile[1] == threads * cfg.elems_per_thread, "the tile is a whole number per thread"
    expected = {"v1": 1, "v2": 1, "v3": 1, "v4": 1, "v5": 1, "v6": 4, "v7": 16}[version]
    assert cfg.elems_per_thread == expected


@pytest.mark.op("transpose")
def test_vector_path_conditions():
    assert tp.vector_path_ok(torch.empty(4, 4))
    assert tp.vector_path_ok(torch.empty(36, 68))
    assert not tp.vector_path_ok(torch.empty(4, 6)), "rows of x would start off a 16-byte boundary"
    assert not tp.vector_path_ok(torch.empty(6, 4)), "rows of out would start off a 16-byte boundary"
    shifted = torch.empty(4 * 8 + 1)[1:].view(4, 8)  # contiguous, 4 bytes past an aligned address
    assert shifted.is_contiguous() and not tp.vector_path_ok(shifted)


def test_cuda_without_gpu_is_clear(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for fn in CUDA_FNS.values():
        with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):
            fn(torch.randn(4, 4))


# ---------------------------------------------------------------- CUDA C versions (GPU only)

@pytest.mark.gpu
@pytest.mark.op("transpose")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
@pytest.mark.parametrize("case", range(len(_bad_inputs("cpu"))))
def test_cuda_refuses_bad_input(name, case):
    label, args, exc, words = _bad_inputs("cuda")[case]
    with pytest.raises(exc, match=words):
        CUDA_FNS[name](*args)


@pytest.mark.gpu
@pytest.mark.op("transpose")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
def test_cuda_refuses_other_dtypes_and_host_tensors(name):
    x = torch.randn(8, 8, device="cuda")
    for dtype in (torch.float16, torch.bfloat16):
        with pytest.raises(TypeError, match="float32"):  # the message names the supported dtype
            CUDA_FNS[name](x.to(dtype))
    with pytest.raises(ValueError, match="cuda device"):
        CUDA_FNS[name](x.cpu())


@pytest.mark.gpu
@pytest.mark.op("transpose")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
@pytest.mark.parametrize("m, n", SHAPES)
def test_cuda_shapes(name, m, n):
    x = torch.randn(m, n, device="cuda")
    poison_allocator(m * n * 4, "cuda")
    _assert_transposed(CUDA_FNS[name](x), x)


@pytest.mark.gpu
@pytest.mark.op("transpose")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
def test_cuda_special_values_pass_through(name):
    x = torch.randn(40, 36, device="cuda")
    x[0, 1], x[2, 3], x[4, 5], x[39, 35] = float("nan"), float("inf"), -0.0, float("-inf")
    out = CUDA_FNS[name](x)
    assert torch.equal(out.view(torch.int32), x.view(torch.int32).t())


@pytest.mark.gpu
@pytest.mark.op("transpose")
@pytest.mark.parametrize("m, n, expected", [
    (64, 96, "transpose_v7"), (36, 68, "transpose_v7"), (4, 4, "transpose_v7"),
    (64, 98, "transpose_v6"), (66, 96, "transpose_v6"), (31, 33, "transpose_v6"),
])
def test_vec4_takes_the_vector_path_only_when_it_can(m, n, expected, monkeypatch):
    used = []
    real = tp._launch_transpose
    monkeypatch.setattr(tp, "_launch_transpose", lambda x, cfg: used.append(cfg.kernel) or real(x, cfg))
    x = torch.randn(m, n, device="cuda")
    _assert_transposed(tp.transpose_vec4(x), x)
    assert used == [expected]


@pytest.mark.gpu
@pytest.mark.op("transpose")
@pytest.mark.parametrize("offset", [1, 2, 3])
def test_vec4_unaligned_view_falls_back(offset):
    """A contiguous view 4, 8 or 12 bytes past an aligned address: float4 loads there would fault."""
    m, n = 68, 36
    base = torch.randn(m * n + offset, device="cuda")
    x = base[offset:].view(m, n)
    assert x.is_contiguous() and not tp.vector_path_ok(x)
    _assert_transposed(tp.transpose_vec4(x), x)


@pytest.mark.gpu
@pytest.mark.op("transpose")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m, n", [(1023, 517), (4097, 3), (3, 4097), (2048, 2048)])
def test_triton_gpu(dtype, m, n):
    x = torch.randn(m, n, device="cuda").to(dtype)
    poison_allocator(m * n * x.element_size(), "cuda")
    _assert_transposed(tp.transpose_triton(x), x)


@pytest.mark.gpu
@pytest.mark.op("transpose")
@pytest.mark.parametrize("name", [*sorted(CUDA_FNS), "v8"])
def test_64bit_offsets(name):
    """m * n > 2**31 elements: an index computed in 32 bits would wrap and write the wrong places. Checks
    the corners and a sample of elements (a full comparison would need another 8 GiB)."""
    m, n = 2**16 + 4, 2**15 + 4  # 2.1e9 elements, 8 GiB each way; multiples of 4 so v7 takes float4
    need = 2 * m * n * 4 + m * n + 2**30  # x, out, the bool mask of isnan, slack
    if torch.cuda.mem_get_info()[0] < need:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of free GPU memory")
    fn = tp.transpose_triton if name == "v8" else CUDA_FNS[name]
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.rand(m, n, device="cuda", generator=gen)
    poison_allocator(m * n * 4, "cuda")
    out = fn(x)
    assert out.shape == (n, m)
    assert not out.isnan().any(), "some elements were never written"
    torch.testing.assert_close(out[-40:, -40:], x[-40:, -40:].t(), rtol=0, atol=0)
    torch.testing.assert_close(out[:40, -40:], x[-40:, :40].t(), rtol=0, atol=0)
    rows = torch.randint(0, m, (100_000,), device="cuda", generator=gen)
    cols = torch.randint(0, n, (100_000,), device="cuda", generator=gen)
    torch.testing.assert_close(out[cols, rows], x[rows, cols], rtol=0, atol=0)
    del x, out
    torch.cuda.empty_cache()
