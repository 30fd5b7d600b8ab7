"""CSR SpMV beyond the generic reference check: the cost model, the input generators (exact nnz, a
power-law tail), empty rows, one row, nnz = 0, a single very long row split over many programs
of v2, int64 indices, non-contiguous and bad input refused before launch, gradients refused, and
the CUDA file compiled with nvcc (no GPU needed). CPU tests run the Triton kernels under the
interpreter (fp32, fp16); bf16, cuSPARSE (v0) and the CUDA C version (v3) run on the GPU."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import assert_refuses

from conftest import DEVICE, poison_allocator
from snippets.part4 import spmv as sp

REPO_ROOT = Path(__file__).resolve().parents[1]
TRITON_FNS = {"v1": sp.spmv_scalar, "v2": sp.spmv_stream}
TOL = {torch.float32: (1e-5, 2e-5), torch.float16: (1e-3, 2e-3), torch.bfloat16: (8e-3, 1e-2)}


def _csr(lengths, n, dtype=torch.float32, index=torch.int32, device=DEVICE, seed=0):
    """(crow, col, val, x) with the given row lengths, columns uniform in [0, n), values in
    [-1, 1], on the device the Triton kernels run on (the CPU under the interpreter)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths, dtype=torch.long)
    crow = torch.zeros(lengths.numel() + 1, dtype=torch.long)
    crow[1:] = torch.cumsum(lengths, 0)
    nnz = int(crow[-1])
    col = torch.randint(0, n, (nnz,), generator=g)
    val = torch.rand(nnz, generator=g) * 2 - 1
    x = torch.rand(n, generator=g) * 2 - 1
    return (crow.to(device, index), col.to(device, index), val.to(device, dtype),
            x.to(device, dtype))


def _check(fn, args):
    crow, col, val, x = args
    poison_allocator(4 * (crow.numel() + 64), val.device.type)  # an unwritten row is NaN
    y = fn(*args)
    ref = sp.spmv_ref(crow, col, val.double(), x.double())
    assert y.dtype == val.dtype and y.shape == (crow.numel() - 1,)
    assert not y.isnan().any(), "a row was never written"
    rtol, atol = TOL[val.dtype]
    torch.testing.assert_close(y.double().cpu(), ref.cpu(), rtol=rtol, atol=atol)
    return y


# ---------------------------------------------------------------- pieces that need no kernel

@pytest.mark.op("spmv")
def test_bytes_model_counts_each_array_once():
    parts = sp.spmv_bytes(m=2**20, n=2**20, nnz=10 * 2**20, itemsize=4, index_size=4)
    # 8 bytes per nonzero, 4 (row pointer) + 4 (y) per row, 4 per column of x, one extra pointer
    assert parts["total"] == 8 * 10 * 2**20 + 8 * 2**20 + 4 * 2**20 + 4
    assert sp._bytes(sp.HEADLINE, torch.float32) == parts["total"]


@pytest.mark.op("spmv")
@pytest.mark.parametrize("pattern", ["uniform", "powerlaw"])
def test_generator_gives_exact_nnz_sorted_columns(pattern):
    g = torch.Generator().manual_seed(3)
    m, n, nnz = 4000, 3000, 4000 * 8
    crow, col = sp.make_csr(m, n, nnz, pattern, g)
    lengths = crow[1:] - crow[:-1]
    assert crow[0] == 0 and crow[-1] == nnz and (lengths >= 0).all() and (lengths <= n).all()
    assert col.min() >= 0 and col.max() < n
    for r in range(0, m, 97):  # sorted inside each row
        c = col[crow[r]:crow[r + 1]]
        assert (c[1:] >= c[:-1]).all()
    if pattern == "powerlaw":  # a heavy tail: the longest row is far above the mean of 8
        assert lengths.max() > 50 * 8
    else:
        assert lengths.max() < 4 * 8


@pytest.mark.op("spmv")
def test_powerlaw_caps_rows_at_n_and_keeps_nnz():
    g = torch.Generator().manual_seed(0)
    crow, _ = sp.make_csr(10, 6, 50, "powerlaw", g)  # the tail wants rows longer than n = 6
    assert crow[-1] == 50 and (crow[1:] - crow[:-1]).max() <= 6


@pytest.mark.op("spmv")
def test_chunk_rows_bound_each_chunk():
    crow, col, val, x = _csr([0, 3, 0, 0, 700, 1, 0], 50)
    first, last = sp.chunk_rows(crow, int(crow[-1]), 256)
    # chunk 0 starts in row 1 (row 0 is empty), chunks 1 and 2 lie in row 4, chunk 2 ends in row 5
    assert first.tolist() == [1, 4, 4] and last.tolist() == [4, 4, 5]


# -------------------------------------------------------- the Triton kernels (interpreter here)

CASES = {
    "one row": [5],
    "one empty row": [0],
    "empty rows between": [0, 3, 0, 0, 7, 0, 1, 0],
    "nnz = 0": [0, 0, 0],
    "one very long row": [2, 1, 1500, 0, 3],  # v2 splits the long row over 6 programs
    "rows of one chunk exactly": [256, 256, 1, 255],
    "many short rows": [1, 2, 3] * 60,
}


def _columns(case: str) -> int:
    """37 columns, or as many as the longest row has nonzeros: cuSPARSE (v0) refuses a matrix with
    more nonzeros than M x N entries."""
    return max(37, max(CASES[case]))


@pytest.mark.op("spmv")
@pytest.mark.parametrize("version", sorted(TRITON_FNS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", sorted(CASES))
def test_triton_cases(version, dtype, case):
    _check(TRITON_FNS[version], _csr(CASES[case], _columns(case), dtype))


@pytest.mark.op("spmv")
@pytest.mark.parametrize("version", sorted(TRITON_FNS))
def test_int64_indices(version):
    _check(TRITON_FNS[version], _csr([4, 0, 300, 9], 1000, index=torch.int64))


@pytest.mark.op("spmv")
def test_empty_rows_are_exact_zeros():
    y = sp.spmv_stream(*_csr([0, 3, 0], 5))
    assert y[0] == 0 and y[2] == 0


@pytest.mark.op("spmv")
@pytest.mark.parametrize("version", sorted(TRITON_FNS))
def test_a_wrong_row_would_be_caught(version):
    # Two rows that gather the same x with values of opposite sign: a kernel that summed across the
    # row boundary would give 0 for both, far outside the tolerance.
    crow = torch.tensor([0, 2, 4], dtype=torch.int32, device=DEVICE)
    col = torch.tensor([0, 1, 0, 1], dtype=torch.int32, device=DEVICE)
    val = torch.tensor([1.0, 1.0, -1.0, -1.0], device=DEVICE)
    y = TRITON_FNS[version](crow, col, val, torch.tensor([1.0, 2.0], device=DEVICE))
    assert y.tolist() == [3.0, -3.0]


# ---------------------------------------------------------------- bad input, before any launch

def _ints(*values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _bad_inputs():
    crow, col, val, x = _csr([2, 0, 3], 4)
    return [
        ("x of another dtype", (crow, col, val, x.half()), TypeError, "dtype"),
        ("integer values", (crow, col, col, x), TypeError, "dtype"),
        ("float row pointers", (crow.float(), col, val, x), TypeError, "dtype"),
        ("int32 rows, int64 columns", (crow, col.long(), val, x), TypeError, "dtype"),
        ("2-D x", (crow, col, val, x[:, None]), ValueError, "x must be 1-D"),
        ("non-contiguous x", (crow, col, val, torch.rand(8, device=DEVICE)[::2]), ValueError,
         "contiguous"),
        ("non-contiguous values", (crow, col, torch.rand(10, device=DEVICE)[::2], x), ValueError,
         "contiguous"),
        ("col shorter than val", (crow, col[:-1], val, x), ValueError, "col has 4 entries"),
        ("no row pointers", (crow[:1], col, val, x), ValueError, "M \\+ 1 >= 2"),
        ("crow[0] != 0", (crow + 1, col, val, x), ValueError, "crow\\[0\\] must be 0"),
        ("crow[M] != nnz", (_ints(0, 2, 2, 4), col, val, x),
         ValueError, "must equal nnz = 5"),
        ("decreasing crow", (_ints(0, 3, 2, 5), col, val, x),
         ValueError, "nondecreasing, but crow\\[2\\] = 2 < crow\\[1\\] = 3"),
        ("column past x", (crow, _ints(0, 1, 2, 3, 4), val, x),
         ValueError, "in \\[0, 4\\)"),
        ("negative column", (crow, _ints(0, -1, 2, 3, 0), val, x),
         ValueError, "from -1 to 3"),
        ("a list, not a tensor", (crow, col, val.tolist(), x), TypeError, "torch.Tensor"),
    ]


@pytest.mark.op("spmv")
@pytest.mark.parametrize("case", _bad_inputs(), ids=lambda c: c[0])
def test_bad_input_raises(case):
    assert_refuses(sp.spmv_scalar, case, sp.spmv_stream)


@pytest.mark.op("spmv")
def test_contents_are_checked_only_on_request():
    # crow[M] != nnz is found by the O(M + nnz) checks; with check_contents=False the O(1) checks
    # pass
    # (a caller who says the matrix is valid owns the consequences: nothing is launched here)
    crow, col, val, x = _csr([2, 0, 3], 4)
    bad = torch.tensor([0, 2, 2, 4], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="must equal nnz"):
        sp.check_csr("f", bad, col, val, x, DEVICE)
    assert sp.check_csr("f", bad, col, val, x, DEVICE, check_contents=False) == (3, 4, 5)


@pytest.mark.op("spmv")
@pytest.mark.parametrize("version", sorted(TRITON_FNS))
def test_refuses_grad(version):
    crow, col, val, x = _csr([2, 1], 3)
    with pytest.raises(RuntimeError, match="forward-only"):
        TRITON_FNS[version](crow, col, val.requires_grad_(), x)
    with torch.no_grad():
        _check(TRITON_FNS[version], (crow, col, val, x))


def test_cuda_without_gpu_is_clear(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):
        sp.spmv_cuda(*_csr([2, 1], 3, device="cpu"))


# -------------------------------------------------------- the CUDA file compiles (no GPU needed)

NVCC = shutil.which("nvcc")


@pytest.mark.op("spmv")
@pytest.mark.skipif(NVCC is None,
                    reason="nvcc is not on PATH, so csrc/sparse/spmv.cu cannot be compiled")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_cuda_compiles_every_kernel_without_spills(arch, tmp_path):
    opts = list(sp.CU_OPTIONS)
    cmd = [NVCC, "-std=c++17", "-c", f"-arch={arch}", "-Xptxas", "-v", *opts,
           "csrc/sparse/spmv.cu", "-o", str(tmp_path / "spmv.o")]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    log = proc.stderr + proc.stdout
    entries = set(re.findall(r"Compiling entry function '(\w+)'", log))
    want = {f"spmv_warp_{t}_{i}" for t in sp.SUFFIX.values() for i in sp.INDEX_SUFFIX.values()}
    assert entries == want
    spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", log)]
    assert spills and not any(spills), log


# ---------------------------------------------------------------- GPU only: bf16, cuSPARSE, CUDA C

GPU_FNS = {"v0": sp.spmv_torch, "v1": sp.spmv_scalar, "v2": sp.spmv_stream, "v3": sp.spmv_cuda}


@pytest.mark.gpu
@pytest.mark.op("spmv")
@pytest.mark.parametrize("version", sorted(GPU_FNS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_gpu(version, dtype, index, case):
    _check(GPU_FNS[version], _csr(CASES[case], _columns(case), dtype, index, "cuda"))


@pytest.mark.gpu
@pytest.mark.op("spmv")
@pytest.mark.parametrize("version", sorted(GPU_FNS))
@pytest.mark.parametrize("pattern", ["uniform", "powerlaw"])
def test_gpu_large(version, pattern):
    size = {"m": 2**16, "n": 2**16, "nnz_per_row": 10, "pattern": pattern}
    args = sp._make_inputs(size, torch.float32, "cuda", torch.Generator().manual_seed(0))
    _check(GPU_FNS[version], args)
