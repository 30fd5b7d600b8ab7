"""Matrix addition beyond the generic reference check: leading dimensions (column slices of wider matrices,
broadcast rows), grids larger than gridDim.y allows, and clear refusal of what the kernels cannot take."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_refuses
from hypothesis import given, settings
from hypothesis import strategies as st

import snippets._checks as checks
from conftest import DEVICE, poison_allocator
from snippets.op_index import get_op
from snippets.part2 import matrix_add as ma

CUDA_FNS = {"v1": ma.matrix_add_cuda, "v2": ma.matrix_add_cuda_column_major, "v4": ma.matrix_add_cuda_vec4}
SHAPES = [(1, 1), (1, 300), (300, 1), (31, 33), (33, 31), (129, 257), (1023, 517), (4097, 3)]


def _bad_inputs(device):
    x = torch.randn(6, 8, device=device)
    return [
        ("float64", (x.double(), x.double()), TypeError, "dtype"),
        ("int32", (x.int(), x.int()), TypeError, "dtype"),
        ("mixed dtypes", (x, x.half()), TypeError, "dtype"),
        ("mismatched shapes", (x, torch.randn(8, 6, device=device)), ValueError, "shape"),
        ("empty", (x[:0], x[:0]), ValueError, "empty"),
        ("1-D", (x.view(-1), x.view(-1)), ValueError, "2-D"),
        ("3-D", (x.view(2, 3, 8), x.view(2, 3, 8)), ValueError, "2-D"),
        ("strided columns", (x[:, ::2], x[:, ::2]), ValueError, "unit-stride"),
        ("transposed view", (x.t(), x.t()), ValueError, "unit-stride"),
        ("second input strided", (x[:, :4], x[:, ::2]), ValueError, "unit-stride"),
        ("not a tensor", (x.tolist(), x), TypeError, "torch.Tensor"),
    ]


def _strided(m: int, n: int, pad: int, offset: int, device: str, dtype=torch.float32) -> torch.Tensor:
    """An m x n column slice of an m x (n + pad) matrix, starting at column ``offset`` (<= pad): rows are
    n + pad elements apart, and for offset > 0 the data does not start at the allocation."""
    wide = torch.randn(m, n + pad, device=device).to(dtype)
    x = wide[:, offset:offset + n]
    assert x.stride() == (n + pad, 1) or m == 1
    return x


def _check(out: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> None:
    ref = x.double() + y.double()
    assert out.shape == x.shape and out.is_contiguous() and out.dtype == x.dtype
    rtol, atol = get_op("matrix_add").tolerance(x.dtype)
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)


# ---------------------------------------------------------------- Triton (CPU interpreter or GPU)

@pytest.mark.op("matrix_add")
@pytest.mark.parametrize("case", range(len(_bad_inputs("cpu"))))
def test_triton_refuses_bad_input(case, device):
    assert_refuses(ma.matrix_add_triton, _bad_inputs(device)[case])


@pytest.mark.op("matrix_add")
def test_triton_refuses_cpu_tensors_when_compiled(monkeypatch):
    monkeypatch.setattr(checks, "triton_interpreting", lambda: False)
    x = torch.randn(4, 4)
    with pytest.raises(ValueError, match="cuda device"):
        ma.matrix_add_triton(x, x)


@pytest.mark.op("matrix_add")
@pytest.mark.parametrize("m, n", SHAPES)
@pytest.mark.parametrize("pad_x, off_x, pad_y, off_y", [(0, 0, 0, 0), (5, 2, 0, 0), (64, 0, 3, 3)])
def test_triton_leading_dimensions(m, n, pad_x, off_x, pad_y, off_y, device):
    """x and y with different row spacings (and unaligned starts): each kernel must use each input's own
    stride(0), not n."""
    x = _strided(m, n, pad_x, off_x, device)
    y = _strided(m, n, pad_y, off_y, device)
    poison_allocator(m * n * 4, device)
    _check(ma.matrix_add_triton(x, y), x, y)


@pytest.mark.op("matrix_add")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_triton_broadcast_row(dtype, device):
    """y = row.expand(m, n) has row stride 0: every row of y is the same memory. Reading it is legal."""
    x = torch.randn(37, 45, device=device).to(dtype)
    y = torch.randn(1, 45, device=device).to(dtype).expand(37, 45)
    assert y.stride() == (0, 1)
    _check(ma.matrix_add_triton(x, y), x, y)


@pytest.mark.op("matrix_add")
@settings(max_examples=20, deadline=None)
@given(m=st.integers(1, 70), n=st.integers(1, 300), pad=st.integers(0, 9), dtype=st.sampled_from(
    [torch.float32, torch.float16]))
def test_triton_any_shape(m, n, pad, dtype):
    x = _strided(m, n, pad, pad // 2, DEVICE, dtype)
    y = torch.randn(m, n, device=DEVICE).to(dtype)
    _check(ma.matrix_add_triton(x, y), x, y)


@pytest.mark.op("matrix_add")
@pytest.mark.parametrize("cap", [1, 2, 3])
def test_triton_capped_grid_loops_over_rows(cap, monkeypatch, device):
    """With the grid's second axis capped below the number of row blocks, each program must loop over
    several row blocks; a program that handled only its first one would leave NaN rows behind."""
    monkeypatch.setattr(ma, "MAX_GRID_Y", cap)
    m, n = 7 * ma.BLOCK_M + 3, 50
    x = torch.randn(m, n, device=device)
    y = torch.randn(m, n, device=device)
    poison_allocator(m * n * 4, device)
    _check(ma.matrix_add_triton(x, y), x, y)


def test_refusal_names_the_strides():
    x = torch.randn(4, 6)[:, ::2]
    with pytest.raises(ValueError, match=r"strides \(6, 2\)"):
        ma._check_matrices(x, x, (torch.float32,), "cpu")


# ---------------------------------------------------------------- CUDA C versions (GPU only)

@pytest.mark.gpu
@pytest.mark.op("matrix_add")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
@pytest.mark.parametrize("case", range(len(_bad_inputs("cpu"))))
def test_cuda_refuses_bad_input(name, case):
    label, args, exc, words = _bad_inputs("cuda")[case]
    with pytest.raises(exc, match=words):
        CUDA_FNS[name](*args)


@pytest.mark.gpu
@pytest.mark.op("matrix_add")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
def test_cuda_refuses_half_and_host_tensors(name):
    x = torch.randn(4, 4, device="cuda")
    with pytest.raises(TypeError, match="float32"):
        CUDA_FNS[name](x.half(), x.half())
    with pytest.raises(TypeError, match="float32"):
        CUDA_FNS[name](x.bfloat16(), x.bfloat16())
    with pytest.raises(ValueError, match="cuda device"):
        CUDA_FNS[name](x.cpu(), x.cpu())


@pytest.mark.gpu
@pytest.mark.op("matrix_add")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
@pytest.mark.parametrize("m, n", SHAPES)
@pytest.mark.parametrize("pad_x, off_x, pad_y, off_y", [(0, 0, 0, 0), (5, 2, 0, 0), (64, 0, 3, 3)])
def test_cuda_leading_dimensions(name, m, n, pad_x, off_x, pad_y, off_y):
    x = _strided(m, n, pad_x, off_x, "cuda")
    y = _strided(m, n, pad_y, off_y, "cuda")
    poison_allocator(m * n * 4, "cuda")
    out = CUDA_FNS[name](x, y)
    assert out.shape == (m, n) and out.is_contiguous()
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)  # one fp32 add per element, as torch does


@pytest.mark.gpu
@pytest.mark.op("matrix_add")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
def test_cuda_broadcast_row(name):
    x = torch.randn(37, 45, device="cuda")
    y = torch.randn(1, 45, device="cuda").expand(37, 45)
    torch.testing.assert_close(CUDA_FNS[name](x, y), x + y, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.op("matrix_add")
@pytest.mark.parametrize("fn, m, n", [
    (ma.matrix_add_cuda, ma.MAX_GRID_Y * 8 + 9, 3),               # v1: rows need more than 65535 blocks in y
    (ma.matrix_add_cuda_column_major, 2, ma.MAX_GRID_Y * 8 + 9),  # v2: columns do
    (ma.matrix_add_triton, ma.MAX_GRID_Y * ma.BLOCK_M + 5, 2),    # v3: rows need more than 65535 programs
])
def test_grid_y_limit(fn, m, n):
    """Past 65535 blocks in y the grid is capped and the kernels loop: the last rows or columns must be
    written too (poisoned memory would show through)."""
    x = torch.randn(m, n, device="cuda")
    y = torch.randn(m, n, device="cuda")
    poison_allocator(m * n * 4, "cuda")
    out = fn(x, y)
    assert not out.isnan().any()
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.op("matrix_add")
@pytest.mark.parametrize("name", sorted(CUDA_FNS))
@pytest.mark.parametrize("cap", [1, 3])
def test_cuda_capped_grid_loops(name, cap, monkeypatch):
    """The same with a small cap: the y loop of both kernels must cover every row (v1) or column (v2)."""
    monkeypatch.setattr(ma, "MAX_GRID_Y", cap)
    m, n = 8 * 7 + 5, 8 * 9 + 3
    x = torch.randn(m, n, device="cuda")
    y = torch.randn(m, n, device="cuda")
    poison_allocator(m * n * 4, "cuda")
    torch.testing.assert_close(CUDA_FNS[name](x, y), x + y, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.op("matrix_add")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_triton_gpu_dtypes_and_slices(dtype):
    x = _strided(1000, 777, 49, 7, "cuda", dtype)
    y = _strided(1000, 777, 0, 0, "cuda", dtype)
    _check(ma.matrix_add_triton(x, y), x, y)


@pytest.mark.gpu
@pytest.mark.op("matrix_add")
@pytest.mark.parametrize("m, n, pad, off", [(5, 8, 0, 0), (5, 8, 4, 0), (5, 8, 0, 1), (7, 10, 0, 0),
                                            (3, 4, 6, 2), (70000, 4, 0, 0)])
def test_vec4_takes_or_leaves_the_vector_path(m, n, pad, off):
    """v4 runs float4 only on 16-byte-aligned rows; odd widths, odd pitches and offset views must still be
    right (through v1)."""
    base = torch.randn(m, n + pad + off, device="cuda")
    x = base[:, off:off + n]
    y = torch.randn(m, n, device="cuda")
    torch.testing.assert_close(ma.matrix_add_cuda_vec4(x, y), x + y, rtol=0, atol=0)
