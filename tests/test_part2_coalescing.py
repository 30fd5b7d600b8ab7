"""Strided and misaligned copies: bad input refused, every (n, stride, offset) against the gather reference,
the float4 path taken only where it is valid, the sector counts the chapter reasons with."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import snippets._checks as checks
from conftest import DEVICE, HAS_GPU, poison_allocator
from snippets.part2 import coalescing as co

ALL_FNS = {"v0": co.strided_copy_torch, "v1": co.strided_copy_cuda, "v2": co.strided_copy_cuda_vec4,
           "v3": co.strided_copy_triton}
CUDA_FNS = {"v1": co.strided_copy_cuda, "v2": co.strided_copy_cuda_vec4}
# Where each version's tensors must live in this session: v0 anywhere, Triton on DEVICE, CUDA on the GPU.
HOST_OK = {"v0": True, "v1": False, "v2": False, "v3": DEVICE == "cpu"}


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- refusing bad input

INT_CASES = [
    ("n float", dict(n=4.0), TypeError, "n must be a Python int"),
    ("n bool", dict(n=True), TypeError, "n must be a Python int"),
    ("n zero", dict(n=0), ValueError, "n must be >= 1"),
    ("stride zero", dict(stride=0), ValueError, "stride must be >= 1"),
    ("stride negative", dict(stride=-2), ValueError, "stride must be >= 1"),
    ("stride tensor", dict(stride=torch.tensor(2)), TypeError, "stride must be a Python int"),
    ("offset negative", dict(offset=-1), ValueError, "offset must be >= 0"),
    ("offset float", dict(offset=1.0), TypeError, "offset must be a Python int"),
]


@pytest.mark.op("strided_copy")
@pytest.mark.op("offset_copy")
@pytest.mark.parametrize("version", sorted(ALL_FNS))
@pytest.mark.parametrize("case", INT_CASES, ids=[c[0] for c in INT_CASES])
def test_int_arguments_refused(version, case):
    """Scalars are checked before the tensor, so this runs (and must refuse) on any machine."""
    _, change, exc, words = case
    args = dict(n=4, stride=1, offset=0) | change
    with pytest.raises(exc, match=words):
        ALL_FNS[version](torch.randn(64), **args)


def _bad_tensors(device):
    x = torch.randn(64, device=device)
    return [
        ("not a tensor", x.tolist(), TypeError, "torch.Tensor"),
        ("float64", x.double(), TypeError, "dtype"),
        ("float16", x.half(), TypeError, "dtype"),
        ("int32", x.int(), TypeError, "dtype"),
        ("empty", x[:0], ValueError, "empty"),
        ("non-contiguous", x[::2], ValueError, "contiguous"),
        ("two-dimensional", x.view(8, 8), ValueError, "one-dimensional"),
    ]


@pytest.mark.op("strided_copy")
@pytest.mark.parametrize("version", sorted(ALL_FNS))
@pytest.mark.parametrize("case", range(7))
def test_bad_tensor_refused(version, case):
    if not HOST_OK[version] and not HAS_GPU:
        pytest.skip("needs a CUDA GPU for a tensor the function would otherwise accept")
    device = "cpu" if HOST_OK[version] else "cuda"
    _, x, exc, words = _bad_tensors(device)[case]
    with pytest.raises(exc, match=words):
        ALL_FNS[version](x, 4, 1, 0)


@pytest.mark.op("strided_copy")
@pytest.mark.parametrize("version", sorted(CUDA_FNS))
def test_cuda_refuses_host_tensors(version):
    with pytest.raises(ValueError, match="cuda device"):
        CUDA_FNS[version](torch.randn(64), 4, 1, 0)


@pytest.mark.op("strided_copy")
def test_triton_refuses_cpu_tensors_when_compiled(monkeypatch):
    monkeypatch.setattr(checks, "triton_interpreting", lambda: False)
    with pytest.raises(ValueError, match="cuda device"):
        co.strided_copy_triton(torch.randn(64), 4, 1, 0)


@pytest.mark.op("strided_copy")
@pytest.mark.op("offset_copy")
@pytest.mark.parametrize("version", sorted(ALL_FNS))
@pytest.mark.parametrize("n, stride, offset, size", [(4, 3, 1, 10), (11, 1, 0, 10), (1, 1, 10, 10), (2, 9, 1, 10)])
def test_reading_past_the_end_refused(version, n, stride, offset, size):
    """offset + (n - 1) * stride must be a valid index of x: one past the end is refused, naming the index."""
    if not HOST_OK[version] and not HAS_GPU:
        pytest.skip("needs a CUDA GPU")
    x = torch.randn(size, device="cpu" if HOST_OK[version] else "cuda")
    last = offset + (n - 1) * stride
    with pytest.raises(ValueError, match=rf"read x\[{last}\].*only {size} elements"):
        ALL_FNS[version](x, n, stride, offset)


@pytest.mark.op("strided_copy")
def test_last_element_is_allowed(device):
    x = torch.arange(10, dtype=torch.float32, device=device)
    assert co.strided_copy_triton(x, 4, 3, 0).tolist() == [0.0, 3.0, 6.0, 9.0]  # reads x[9], the last
    assert co.strided_copy_torch(x, 4, 3, 0).tolist() == [0.0, 3.0, 6.0, 9.0]


# ---------------------------------------------------------------- inputs, reference and the sector model

@pytest.mark.op("strided_copy")
@pytest.mark.parametrize("n, stride, offset", [(1, 1, 0), (5, 3, 2), (100, 32, 7)])
def test_input_is_nan_where_not_read(n, stride, offset):
    x = co.make_strided_input(n, stride, offset, _gen(), "cpu")
    assert x.numel() == offset + (n - 1) * stride + 1
    read = torch.zeros(x.numel(), dtype=torch.bool)
    read[offset::stride] = True
    assert torch.isfinite(x[read]).all() and read.sum() == n
    assert torch.isnan(x[~read]).all()  # a kernel that reads any other element returns NaN


@pytest.mark.op("strided_copy")
def test_reference_is_the_definition():
    x = torch.arange(100, dtype=torch.float32)
    assert co.strided_copy_ref(x, 5, 7, 3).tolist() == [3.0, 10.0, 17.0, 24.0, 31.0]
    assert co.strided_copy_ref(x, 3).tolist() == [0.0, 1.0, 2.0]


@pytest.mark.op("strided_copy")
@pytest.mark.op("offset_copy")
def test_sectors_per_warp():
    """A warp's 32 fp32 loads: 4 sectors when dense and aligned, 5 when misaligned by any amount that is not a
    multiple of 8 floats, 32 (one per lane) from stride 8 on."""
    assert co.sectors_touched(32, 1) == 4
    assert co.sectors_touched(32, 1, offset=1) == 5
    assert co.sectors_touched(32, 1, offset=4) == 5
    assert co.sectors_touched(32, 1, offset=8) == 4
    assert co.sectors_touched(32, 1, offset=32) == 4
    for stride, sectors in [(2, 8), (4, 16), (8, 32), (16, 32), (32, 32)]:
        assert co.sectors_touched(32, stride) == sectors, stride
    # Over a long copy, misalignment adds one sector in total, not one per warp: neighbours share it.
    assert co.sectors_touched(32 * 1000, 1, offset=1) == 4 * 1000 + 1


@pytest.mark.op("strided_copy")
@pytest.mark.op("offset_copy")
def test_cost_model_counts_useful_bytes():
    for op in (co.strided_copy, co.offset_copy):
        for size in op.sweep:
            assert op.bytes_moved(size, torch.float32) == 8 * size["n"]
    assert [s["stride"] for s in co.strided_copy.sweep] == list(co.STRIDES)
    assert co.strided_copy.headline == co.strided_copy.sweep[-1]  # tables list the sweep in order
    assert co.offset_copy.headline == co.offset_copy.sweep[-1]
    # The plot's x axis must be one key that tells the sweep's points apart.
    for op in (co.strided_copy, co.offset_copy):
        values = [s[op.sweep_axis] for s in op.sweep]
        assert len(set(values)) == len(values)


# ---------------------------------------------------------------- Triton (CPU interpreter or GPU)

@pytest.mark.op("strided_copy")
@pytest.mark.op("offset_copy")
@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 5000), stride=st.integers(1, 40), offset=st.integers(0, 40), slack=st.integers(0, 9))
def test_triton_matches_reference(n, stride, offset, slack):
    x = torch.randn(offset + (n - 1) * stride + 1 + slack, device=DEVICE)
    poison_allocator(4 * n, DEVICE)
    out = co.strided_copy_triton(x, n, stride, offset)
    assert out.shape == (n,) and out.dtype == torch.float32
    assert torch.equal(out, co.strided_copy_ref(x, n, stride, offset))


@pytest.mark.op("offset_copy")
@pytest.mark.parametrize("view_start", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("offset", [0, 1, 3, 4, 16])
def test_triton_views_at_every_alignment(device, view_start, offset):
    """x itself a view (storage offset), so x + offset is aligned to 16 bytes for some cases and not others."""
    base = torch.randn(5000, device=device)
    x = base[view_start:]
    n = 4097
    assert torch.equal(co.strided_copy_triton(x, n, 1, offset), base[view_start + offset:][:n])


@pytest.mark.op("strided_copy")
def test_torch_baseline_copies(device):
    """v0 returns fresh memory even when the strided view is already contiguous (stride 1)."""
    x = torch.randn(100, device=device)
    out = co.strided_copy_torch(x, 50, 1, 3)
    assert out.is_contiguous() and out.data_ptr() != x[3:].data_ptr()
    assert torch.equal(out, x[3:53])


# ---------------------------------------------------------------- which CUDA kernel runs (no GPU needed)

@pytest.mark.op("strided_copy")
@pytest.mark.op("offset_copy")
@pytest.mark.parametrize("vec4, stride, start, expected", [
    (True, 1, 0, "copy_vec4"),
    (True, 1, 4, "copy_vec4"),  # x + 4 floats is 16 bytes in: still aligned
    (True, 1, 1, "strided_copy_v1"),
    (True, 1, 2, "strided_copy_v1"),
    (True, 2, 0, "strided_copy_v1"),  # strided: no float4 whatever the alignment
    (False, 1, 0, "strided_copy_v1"),
])
def test_launcher_picks_float4_only_when_valid(monkeypatch, vec4, stride, start, expected):
    launched = []
    monkeypatch.setattr(co.cuda, "kernel", lambda path, name: name)
    monkeypatch.setattr(co.cuda, "launch", lambda fn, grid, block, args: launched.append((fn, grid, args)))
    x = torch.randn(4096)
    co._launch(x, 1000, stride, start, vec4=vec4)
    ((name, grid, args),) = launched
    assert name == expected
    if name == "copy_vec4":
        assert args[0].data_ptr() == x.data_ptr() + 4 * start and grid == -(-250 // co.THREADS)
    else:
        assert int(args[3]) == stride and int(args[4]) == start


# ---------------------------------------------------------------- CUDA C versions (GPU only)

GPU_CASES = [(n, s, o) for n in (1, 2, 3, 4, 5, 255, 256, 257, 1023, 4096 * 3 + 1) for s in (1, 2, 3, 8, 33)
             for o in (0, 1, 2, 4, 7)]


@pytest.mark.gpu
@pytest.mark.op("strided_copy")
@pytest.mark.op("offset_copy")
@pytest.mark.parametrize("version", sorted(CUDA_FNS))
@pytest.mark.parametrize("n, stride, offset", GPU_CASES)
def test_cuda_matches_reference(version, n, stride, offset):
    x = co.make_strided_input(n, stride, offset, _gen(n + stride + offset), "cuda")
    poison_allocator(4 * n, "cuda")
    out = CUDA_FNS[version](x, n, stride, offset)
    assert out.shape == (n,) and out.dtype == torch.float32 and not out.isnan().any()
    assert torch.equal(out, co.strided_copy_ref(x, n, stride, offset))


@pytest.mark.gpu
@pytest.mark.op("offset_copy")
@pytest.mark.parametrize("version", sorted(CUDA_FNS))
@pytest.mark.parametrize("view_start", [0, 1, 2, 3])
@pytest.mark.parametrize("offset", [0, 1, 3, 4, 5])
@pytest.mark.parametrize("n", [1, 3, 4, 7, 8191])
def test_cuda_views_at_every_alignment(version, view_start, offset, n):
    """A view x whose data starts 0..3 floats into an allocation: the float4 path must be taken only when
    x + offset is 16-byte aligned, and give the same answer either way (tails of 0 to 3 elements included)."""
    base = torch.randn(n + view_start + offset + 5, device="cuda")
    x = base[view_start:]
    poison_allocator(4 * n, "cuda")
    assert torch.equal(CUDA_FNS[version](x, n, 1, offset), base[view_start + offset:][:n])


@pytest.mark.gpu
@pytest.mark.op("strided_copy")
def test_cuda_indices_past_2_31():
    """offset + i * stride passes 2^31 elements: a 32-bit index would wrap and read the wrong place."""
    n, stride = 2**10, 2**21 + 2**12  # the last index read, 1023 * stride, is 2^31 + 2^21 - 2^12
    need = 4 * ((n - 1) * stride + 1)
    if torch.cuda.mem_get_info()[0] < 3 * need:
        pytest.skip(f"needs {3 * need >> 30} GiB of free GPU memory")
    x = co.make_strided_input(n, stride, 0, _gen(), "cuda")
    assert x.numel() > 2**31
    ref = co.strided_copy_ref(x, n, stride, 0)
    for fn in (*CUDA_FNS.values(), co.strided_copy_triton, co.strided_copy_torch):
        assert torch.equal(fn(x, n, stride, 0), ref), fn.__name__
