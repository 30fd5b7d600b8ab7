"""Part 1 ops beyond the generic reference check: bad input is refused clearly, special values, unaligned
views, launch configurations, and the divergence flags."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import snippets._checks as checks
from conftest import DEVICE
from snippets.part1 import divergence as dv
from snippets.part1 import elementwise as ew
from snippets.part1 import why_gpus

TRITON_FNS = {
    "vector_add": lambda x, y: ew.add_triton(x, y),
    "scale": lambda x, y: ew.scale_triton(x, 2.0),
    "relu": lambda x, y: ew.relu_triton(x),
    "saxpy": lambda x, y: ew.saxpy_triton(2.0, x, y),
}
CUDA_FNS = {
    "vector_add-v1": ew.add_cuda_naive, "vector_add-v2": ew.add_cuda_grid_stride, "vector_add-v3": ew.add_cuda_vec4,
    "vector_add-v5": ew.add_cuda_vec4_unrolled,
    "scale": lambda x, y: ew.scale_cuda(x, 2.0), "relu": lambda x, y: ew.relu_cuda(x),
    "saxpy": lambda x, y: ew.saxpy_cuda(2.0, x, y),
}


def _bad_inputs(device):
    x = torch.randn(64, device=device)
    return [
        ("wrong dtype", (x.double(), x.double()), TypeError, "dtype"),
        ("int dtype", (x.int(), x.int()), TypeError, "dtype"),
        ("mixed dtypes", (x, x.half()), TypeError, "dtype"),
        ("mismatched shapes", (x, torch.randn(65, device=device)), ValueError, "shape"),
        ("empty", (x[:0], x[:0]), ValueError, "empty"),
        ("non-contiguous", (x[::2], x[::2]), ValueError, "contiguous"),
        ("not a tensor", (x.tolist(), x), TypeError, "torch.Tensor"),
    ]


@pytest.mark.op("vector_add")
@pytest.mark.op("scale")
@pytest.mark.op("relu")
@pytest.mark.op("saxpy")
@pytest.mark.parametrize("name", sorted(TRITON_FNS))
@pytest.mark.parametrize("case", range(7))
def test_triton_refuses_bad_input(name, case, device):
    label, args, exc, words = _bad_inputs(device)[case]
    if name in ("scale", "relu") and label in ("mixed dtypes", "mismatched shapes"):
        pytest.skip("unary op: the second tensor is not an argument")
    with pytest.raises(exc, match=words):
        TRITON_FNS[name](*args)


@pytest.mark.op("vector_add")
def test_triton_refuses_cpu_tensors_when_compiled(monkeypatch):
    """Off the interpreter, a Triton op given host tensors must refuse them, not hand the GPU host pointers."""
    monkeypatch.setattr(checks, "triton_interpreting", lambda: False)
    x = torch.randn(16)
    with pytest.raises(ValueError, match="cuda device"):
        ew.add_triton(x, x)


@pytest.mark.op("scale")
@pytest.mark.op("saxpy")
def test_scalar_must_be_a_number(device):
    x = torch.randn(8, device=device)
    with pytest.raises(TypeError, match="alpha"):
        ew.scale_triton(x, torch.tensor(2.0))
    with pytest.raises(TypeError, match="alpha"):
        ew.saxpy_triton(True, x, x)


@pytest.mark.op("relu")
def test_relu_keeps_nan_and_signs(device):
    x = torch.tensor([float("nan"), -1.0, -0.0, 0.0, 3.0, float("inf"), float("-inf")], device=device)
    out = ew.relu_triton(x)
    torch.testing.assert_close(out, torch.relu(x), equal_nan=True)


@pytest.mark.op("vector_add")
@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 20000), dtype=st.sampled_from([torch.float32, torch.float16]))
def test_add_triton_any_length(n, dtype):
    x = torch.randn(n, device=DEVICE).to(dtype)
    y = torch.randn(n, device=DEVICE).to(dtype)
    torch.testing.assert_close(ew.add_triton(x, y), x + y)


@pytest.mark.op("vector_add")
def test_add_triton_keeps_shape(device):
    x = torch.randn(3, 5, 7, device=device)
    y = torch.randn(3, 5, 7, device=device)
    out = ew.add_triton(x, y)
    assert out.shape == (3, 5, 7)
    torch.testing.assert_close(out, x + y)


# ---------------------------------------------------------------- CUDA C versions (GPU only)

@pytest.mark.gpu
@pytest.mark.op("vector_add")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
@pytest.mark.parametrize("case", range(7))
def test_cuda_refuses_bad_input(name, case):
    label, args, exc, words = _bad_inputs("cuda")[case]
    if name in ("scale", "relu") and label in ("mixed dtypes", "mismatched shapes"):
        pytest.skip("unary op: the second tensor is not an argument")
    if label == "mixed dtypes":
        exc, words = TypeError, "dtype"
    with pytest.raises(exc, match=words):
        CUDA_FNS[name](*args)


@pytest.mark.gpu
@pytest.mark.op("vector_add")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
def test_cuda_refuses_host_tensors(name):
    x = torch.randn(16)
    with pytest.raises(ValueError, match="cuda device"):
        CUDA_FNS[name](x, x)


@pytest.mark.gpu
@pytest.mark.op("vector_add")
@pytest.mark.op("saxpy")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
@pytest.mark.parametrize("offset", [1, 2, 3])
def test_cuda_unaligned_views(name, offset):
    """x[1:] is contiguous but not 16-byte aligned: the float4 versions must fall back, not misread."""
    base_x = torch.randn(10_003 + offset, device="cuda")
    base_y = torch.randn(10_003 + offset, device="cuda")
    x, y = base_x[offset:], base_y[offset:]
    ref = {"scale": 2.0 * x, "relu": torch.relu(x), "saxpy": 2.0 * x + y}.get(name.split("-")[0], x + y)
    torch.testing.assert_close(CUDA_FNS[name](x, y), ref)


@pytest.mark.gpu
@pytest.mark.op("vector_add")
@pytest.mark.parametrize("n", [1, 3, 4, 5, 255, 256, 257, 1 << 20, (132 * 8 * 256 * 4) + 7,
                               (132 * 8 * 256 * 16) * 2 + 5])
def test_cuda_vector_add_sizes(n):
    """Sizes around the block size, the float4 tail, and past one full grid-stride sweep."""
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    for fn in (ew.add_cuda_naive, ew.add_cuda_grid_stride, ew.add_cuda_vec4, ew.add_cuda_vec4_unrolled):
        torch.testing.assert_close(fn(x, y), x + y)


@pytest.mark.gpu
@pytest.mark.op("vector_add")
def test_cuda_without_cupy_is_clear(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_cupy(name, *a, **k):
        if name == "cupy":
            raise ImportError("no cupy")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_cupy)
    from snippets import cuda

    monkeypatch.setattr(cuda, "_module", cuda._module.__wrapped__)  # bypass the caches
    monkeypatch.setattr(cuda, "_function", cuda._function.__wrapped__)
    with pytest.raises(RuntimeError, match="CuPy"):
        cuda.kernel("part1/elementwise.cu", "vector_add_v1")


@pytest.mark.gpu
def test_resident_blocks_fill_an_sm():
    from snippets import cuda

    fn = cuda.kernel("part1/elementwise.cu", "vector_add_v1")
    assert fn is cuda.kernel("part1/elementwise.cu", "vector_add_v1")
    props = torch.cuda.get_device_properties(0)
    assert cuda.resident_blocks(fn, 256) == props.max_threads_per_multi_processor // 256  # 12 registers: no limit
    heavy = cuda.kernel("part1/elementwise.cu", "vector_add_v5", ew.CU_OPTIONS)
    assert 1 <= cuda.resident_blocks(heavy, 256) <= cuda.resident_blocks(fn, 256)


def test_cuda_without_gpu_is_clear(monkeypatch):
    from snippets import cuda

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):
        ew.add_cuda_vec4(torch.randn(4), torch.randn(4))
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):
        cuda.kernel("part1/elementwise.cu", "vector_add_v1")


# ---------------------------------------------------------------- CPU vs GPU

@pytest.mark.op("cpu_vs_gpu")
def test_cpu_versions_match():
    x, y = torch.randn(1000), torch.randn(1000)
    torch.testing.assert_close(why_gpus.add_numpy(x, y), x + y)
    torch.testing.assert_close(why_gpus.add_torch_cpu(x, y), x + y)


@pytest.mark.op("cpu_vs_gpu")
def test_transfer_version_wants_host_tensors():
    x = torch.randn(4)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="host tensors"):
            why_gpus.add_gpu_with_transfers(x.cuda(), x.cuda())
    else:
        with pytest.raises((RuntimeError, AssertionError)):
            why_gpus.add_gpu_with_transfers(x, x)  # torch: no CUDA to copy to


# ---------------------------------------------------------------- warp divergence

@pytest.mark.op("warp_divergence")
@pytest.mark.parametrize("pattern", dv.PATTERNS)
def test_flag_patterns(pattern):
    n = 4096
    f = dv.make_flags(n, pattern, torch.Generator().manual_seed(0))
    assert f.dtype == torch.uint8 and f.shape == (n,)
    warps = f.view(-1, 32)
    uniform = (warps.min(1).values == warps.max(1).values)
    if pattern in ("none", "warp"):
        assert uniform.all(), "these patterns must keep every warp on one path"
    else:
        assert not uniform.any(), "these patterns must split every warp"
    if pattern != "none":
        assert 0.4 < f.float().mean() < 0.6


@pytest.mark.op("warp_divergence")
def test_two_paths_really_differ(device):
    """Paths A and B settle on different values, so a kernel that takes the wrong one is caught."""
    x = torch.rand(64, device=device) - 0.5
    a = dv.two_paths_ref(x.double(), torch.ones(64, dtype=torch.uint8, device=device))
    b = dv.two_paths_ref(x.double(), torch.zeros(64, dtype=torch.uint8, device=device))
    assert (a - b).abs().min() > 0.5


@pytest.mark.op("warp_divergence")
def test_divergence_refuses_bad_flags(device):
    x = torch.rand(64, device=device)
    with pytest.raises(ValueError, match="take_a must match"):
        dv.two_paths_triton(x, torch.ones(63, dtype=torch.uint8, device=device))
    with pytest.raises(TypeError, match="dtype"):
        dv.two_paths_triton(x, torch.ones(64, dtype=torch.float32, device=device))
    with pytest.raises(ValueError, match="unknown pattern"):
        dv.make_flags(8, "zigzag")


@pytest.mark.gpu
@pytest.mark.op("warp_divergence")
def test_divergence_cuda_refuses_host_tensors():
    x = torch.rand(64)
    with pytest.raises(ValueError, match="cuda device"):
        dv.two_paths_cuda(x, torch.ones(64, dtype=torch.uint8))
