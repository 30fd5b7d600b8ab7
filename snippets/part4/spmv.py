"""Sparse matrix times dense vector, y = A x, with A in CSR: irregular memory access.

A is given by three arrays, the CSR format: ``crow`` (M + 1 row pointers), ``col`` (nnz column
indices) and ``val`` (nnz values); the nonzeros of row r are ``col[crow[r]:crow[r+1]]`` and
``val[crow[r]:crow[r+1]]``. Row pointers and column indices are int32 or int64 (both the same),
values and x fp32, fp16 or bf16 (the same); every version accumulates in fp32 and returns y in the
values' dtype.

Versions of ``spmv`` (never renumbered):

- v0  ``torch.sparse_csr_tensor(crow, col, val) @ x``: cuSPARSE's SpMV on the GPU, the library
      baseline.
- v1  Triton, one program per row ("CSR-scalar" in Bell and Garland's names): the program walks its
      row's nonzeros in chunks of BLOCK, gathers x at their columns, and sums. Simple, and as
      balanced as the row lengths are: a row of 50 000 nonzeros is one program's serial loop while
      the GPU's other SMs run out of rows.
- v2  Triton, a fixed number of nonzeros per program (the "merge-path" / "CSR-stream" idea): program
      p takes nonzeros [p * CHUNK, (p + 1) * CHUNK) whatever rows they belong to, finds each
      nonzero's row by binary search in crow, sums the products of each row with a segmented scan,
      and adds each row's partial sum into y with one atomic per (row, program). Every program does
      the same work, so a long row is spread over many programs.
- v3  CUDA C (``csrc/sparse/spmv.cu``): one warp per row ("CSR-vector"): the 32 lanes read 32
      consecutive nonzeros at a time (coalesced), and a warp-shuffle reduction sums the row.

Cost model (``spmv_bytes``): every nonzero's value and column index is read once, the row pointers
once, y written once, and x read at least once: with int32 indices and fp32 values that is
8 bytes per nonzero + 8 bytes per row + 4 bytes per column. The x gather is where the model is a
lower bound: each gathered element brings its whole 32-byte sector into L2 and L1, so a column used
by rows far apart may be fetched from DRAM more than once (the chapter works it out). Two FLOPs per
nonzero against at least 8 bytes: memory-bound in every dtype.

Checks: ``check_csr`` validates dtypes, devices, shapes and contiguity in O(1) on the host before
any launch. The content checks (crow[0] == 0, crow nondecreasing, crow[M] == nnz, every column in
[0, N)) read the arrays, O(M + nnz) work and a device-to-host synchronisation, so they run only when
``check_contents=True`` (the default of the public functions; the timed registrations pass False,
as a solver that reuses one matrix checks it once).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from snippets import cuda
from snippets._checks import check_tensors, refuse_grad, triton_device
from snippets.registry import Impl, Op, device_generator, register

CU_FILE = "sparse/spmv.cu"  # not under csrc/part4: every file there is in the hash of every
# Part 4 version that loads CUDA (softmax, layernorm), which a new file would mark stale
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
# Row numbers are int32 in every kernel (program ids, the binary search of v2)
MAX_ROWS = 2**31 - 2


# --8<-- [start:reference]
def spmv_ref(crow: torch.Tensor, col: torch.Tensor, val: torch.Tensor,
             x: torch.Tensor) -> torch.Tensor:
    """y[r] = sum of val[j] * x[col[j]] over j in [crow[r], crow[r+1]), in at least fp32 (float64
    stays float64: the tests' exact reference), returned in val's dtype. Written with dense
    PyTorch ops: expand the row pointers into one row number per nonzero, gather, multiply, and
    add each product into its row (index_add_)."""
    acc = torch.promote_types(val.dtype, torch.float32)
    m = crow.numel() - 1
    lengths = (crow[1:] - crow[:-1]).long()
    rows = torch.repeat_interleave(torch.arange(m, device=val.device), lengths)
    prods = val.to(acc) * x.to(acc)[col.long()]
    y = torch.zeros(m, dtype=acc, device=val.device).index_add_(0, rows, prods)
    return y.to(val.dtype)
# --8<-- [end:reference]


# --8<-- [start:bytes]
def spmv_bytes(m: int, n: int, nnz: int, itemsize: int, index_size: int) -> dict[str, int]:
    """The fewest bytes y = A x must move, part by part: each nonzero's value and column index
    once, the m + 1 row pointers once, y written once, and x read once (a lower bound: the gather
    may fetch an element of x more than once, see the chapter)."""
    parts = {
        "values": nnz * itemsize,
        "columns": nnz * index_size,
        "row_pointers": (m + 1) * index_size,
        "y": m * itemsize,
        "x": n * itemsize,
    }
    parts["total"] = sum(parts.values())
    return parts
# --8<-- [end:bytes]


# --------------------------------------------------------------------------------------------------
# Checks (one place for every version)
# --------------------------------------------------------------------------------------------------

# --8<-- [start:checks]
def check_csr(name: str, crow, col, val, x, device: str,
              check_contents: bool = True) -> tuple[int, int, int]:
    """Validate a CSR matrix and a dense vector before any launch; returns (M, N, nnz).

    O(1), always: types, dtypes (val and x the same float type, crow and col the same int32/int64
    type), one device, 1-D contiguous arrays, len(col) == len(val), at least one row.
    O(M + nnz), with ``check_contents``: crow[0] == 0, crow nondecreasing, crow[M] == nnz, every
    column index in [0, N). A kernel trusts these to stay inside its arrays, so a caller that
    turns them off must know the matrix is valid (built by code that guarantees it)."""
    check_tensors(("val", "x"), (val, x), dtypes=DTYPES, device=device, same_shape=False)
    check_tensors(("crow", "col"), (crow, col), dtypes=INDEX_DTYPES, device=device,
                  same_shape=False)
    if crow.device != val.device:
        raise ValueError(f"{name}: crow is on {crow.device} but val is on {val.device}")
    for label, t in (("crow", crow), ("col", col), ("val", val), ("x", x)):
        if t.dim() != 1:
            raise ValueError(f"{name}: {label} must be 1-D, got shape {tuple(t.shape)}")
    if crow.numel() < 2:
        raise ValueError(f"{name}: crow must hold M + 1 >= 2 row pointers, got {crow.numel()}")
    m, n, nnz = crow.numel() - 1, x.numel(), val.numel()
    if col.numel() != nnz:
        raise ValueError(f"{name}: col has {col.numel()} entries but val has {nnz}; CSR needs "
                         "one column index per value")
    if m > MAX_ROWS:
        raise ValueError(f"{name}: {m} rows; the kernels number rows in int32 (at most "
                         f"{MAX_ROWS})")
    if crow.dtype == torch.int32 and nnz > 2**31 - 1:
        raise ValueError(f"{name}: {nnz} nonzeros do not fit int32 row pointers; use int64")
    if check_contents:
        if int(crow[0]) != 0:
            raise ValueError(f"{name}: crow[0] must be 0, got {int(crow[0])}")
        if int(crow[-1]) != nnz:
            raise ValueError(f"{name}: crow[M] must equal nnz = {nnz}, got {int(crow[-1])}")
        if m > 1 and bool((crow[1:] < crow[:-1]).any()):
            r = int(torch.nonzero(crow[1:] < crow[:-1])[0, 0])
            raise ValueError(f"{name}: crow must be nondecreasing, but crow[{r + 1}] = "
                             f"{int(crow[r + 1])} < crow[{r}] = {int(crow[r])}")
        if nnz > 0:
            lo, hi = int(col.min()), int(col.max())
            if lo < 0 or hi >= n:
                raise ValueError(f"{name}: column indices must lie in [0, {n}) (x has {n} "
                                 f"entries), got indices from {lo} to {hi}")
    return m, n, nnz
# --8<-- [end:checks]


# --------------------------------------------------------------------------------------------------
# v0: cuSPARSE through torch.sparse
# --------------------------------------------------------------------------------------------------

def spmv_torch(crow, col, val, x, check_contents: bool = True) -> torch.Tensor:
    """v0: ``torch.sparse_csr_tensor(...) @ x`` (cuSPARSE SpMV on the GPU). Wrapping the three
    arrays copies nothing."""
    refuse_grad("spmv_torch", val, x, instead="torch.sparse_csr_tensor(...) @ x")
    m, n, _ = check_csr("spmv_torch", crow, col, val, x, "cuda", check_contents)
    a = torch.sparse_csr_tensor(crow, col, val, size=(m, n), check_invariants=False)
    return (a @ x.unsqueeze(1)).squeeze(1)


# --------------------------------------------------------------------------------------------------
# v1: one program per row
# --------------------------------------------------------------------------------------------------

# --8<-- [start:scalar]
@triton.jit
def _spmv_row_kernel(crow_ptr, col_ptr, val_ptr, x_ptr, y_ptr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    start = tl.load(crow_ptr + row).to(tl.int64)
    end = tl.load(crow_ptr + row + 1).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.float32)
    # The row's nonzeros, BLOCK at a time: val and col are contiguous reads, x[col] a gather.
    for k in range(start, end, BLOCK):
        idx = k + offs
        mask = idx < end
        c = tl.load(col_ptr + idx, mask=mask, other=0)
        v = tl.load(val_ptr + idx, mask=mask, other=0.0).to(tl.float32)
        xv = tl.load(x_ptr + c, mask=mask, other=0.0).to(tl.float32)
        acc += v * xv
    # an empty row sums nothing and stores 0
    tl.store(y_ptr + row, tl.sum(acc, axis=0).to(y_ptr.dtype.element_ty))


# BLOCK = 32 with one warp: one nonzero per thread, and at ~10 nonzeros per row a third of the
# lanes already idle; a wider BLOCK only idles more of them on short rows.
ROW_BLOCK, ROW_NUM_WARPS = 32, 1


def spmv_scalar(crow, col, val, x, check_contents: bool = True) -> torch.Tensor:
    """v1: one program per row, BLOCK nonzeros of it per step, fp32 sum."""
    refuse_grad("spmv_scalar", val, x, instead="spmv_ref")
    m, _, _ = check_csr("spmv_scalar", crow, col, val, x, triton_device(), check_contents)
    y = torch.empty(m, dtype=val.dtype, device=val.device)
    _spmv_row_kernel[(m,)](crow, col, val, x, y, BLOCK=ROW_BLOCK, num_warps=ROW_NUM_WARPS)
    return y
# --8<-- [end:scalar]


# --------------------------------------------------------------------------------------------------
# v2: a fixed number of nonzeros per program, partial row sums added atomically
# --------------------------------------------------------------------------------------------------

# --8<-- [start:stream]
@triton.jit
def _segment_add(v_a, r_a, v_b, r_b):
    # (value, row) pairs sorted by row: add when both belong to one row, else start again.
    # Associative on sorted rows, so tl.associative_scan may combine in any tree order.
    return tl.where(r_a == r_b, v_a + v_b, v_b), r_b


@triton.jit
def _spmv_stream_kernel(crow_ptr, col_ptr, val_ptr, x_ptr, y_ptr, first_row_ptr, last_row_ptr,
                        nnz, CHUNK: tl.constexpr):
    pid = tl.program_id(0)
    chunk_start = pid.to(tl.int64) * CHUNK
    idx = chunk_start + tl.arange(0, CHUNK)
    valid = idx < nnz
    # This chunk's nonzeros lie in rows r0..r1 (found on the host, one search per chunk). Each
    # nonzero's row is the largest r in [r0, r1] with crow[r] <= idx: a binary search, one step per
    # halving of r1 - r0 (one step when the whole chunk is inside one long row).
    r0 = tl.load(first_row_ptr + pid)
    r1 = tl.load(last_row_ptr + pid)
    lo = tl.zeros((CHUNK,), tl.int32) + r0
    hi = tl.zeros((CHUNK,), tl.int32) + r1
    span = r1 - r0
    while span > 0:
        mid = (lo + hi + 1) // 2
        right = tl.load(crow_ptr + mid) <= idx
        lo = tl.where(right, mid, lo)
        hi = tl.where(right, hi, mid - 1)
        span = span // 2
    row = lo
    c = tl.load(col_ptr + idx, mask=valid, other=0)
    v = tl.load(val_ptr + idx, mask=valid, other=0.0).to(tl.float32)
    xv = tl.load(x_ptr + c, mask=valid, other=0.0).to(tl.float32)
    # Suffix sums within each row: at a row's first nonzero in this chunk, the row's whole partial
    # sum. Padding lanes carry row r1 and the value 0, so they change nothing.
    total, _ = tl.associative_scan((v * xv, row), 0, _segment_add, reverse=True)
    first = valid & ((idx == tl.load(crow_ptr + row)) | (idx == chunk_start))
    tl.atomic_add(y_ptr + row, total, mask=first, sem="relaxed")


# CHUNK nonzeros per program, 4 warps: 2 nonzeros per thread. Untuned: the chapter's exercise asks
# what moves when CHUNK grows (fewer atomics on long rows, longer binary searches on short ones).
STREAM_CHUNK, STREAM_NUM_WARPS = 256, 4


def chunk_rows(crow: torch.Tensor, nnz: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of each chunk's first and last nonzero (int32): one binary search per chunk, the
    partition step of merge-path SpMV, O(nnz / chunk * log M)."""
    starts = torch.arange(0, nnz, chunk, device=crow.device, dtype=crow.dtype)
    ends = torch.clamp(starts + chunk, max=nnz) - 1
    rows = torch.searchsorted(crow, torch.cat([starts, ends]), right=True, out_int32=True) - 1
    return rows[:starts.numel()].contiguous(), rows[starts.numel():].contiguous()


def spmv_stream(crow, col, val, x, check_contents: bool = True) -> torch.Tensor:
    """v2: like v1, but each program takes STREAM_CHUNK consecutive nonzeros instead of one row,
    so every program does the same work however the row lengths are spread. Rows split over
    programs are summed with fp32 atomics into a zeroed fp32 y (converted to val's dtype at the
    end for fp16/bf16); the order of the atomics varies, so the last bits of y may vary from run
    to run."""
    refuse_grad("spmv_stream", val, x, instead="spmv_ref")
    m, _, nnz = check_csr("spmv_stream", crow, col, val, x, triton_device(), check_contents)
    y = torch.zeros(m, dtype=torch.float32, device=val.device)
    if nnz > 0:
        first, last = chunk_rows(crow, nnz, STREAM_CHUNK)
        _spmv_stream_kernel[(first.numel(),)](crow, col, val, x, y, first, last, nnz,
                                              CHUNK=STREAM_CHUNK, num_warps=STREAM_NUM_WARPS)
    return y if val.dtype == torch.float32 else y.to(val.dtype)
# --8<-- [end:stream]


# --------------------------------------------------------------------------------------------------
# v3: CUDA C, one warp per row (csrc/sparse/spmv.cu), launched through CuPy
# --------------------------------------------------------------------------------------------------

# --8<-- [start:cuda_launch]
SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
INDEX_SUFFIX = {torch.int32: "i32", torch.int64: "i64"}
WARPS_PER_BLOCK = 8  # rows per block; passed to spmv.cu as a -D option
CU_OPTIONS = cuda.defines(CU_FILE, WARPS_PER_BLOCK=WARPS_PER_BLOCK)


def spmv_cuda(crow, col, val, x, check_contents: bool = True) -> torch.Tensor:
    """v3: one warp per row, lanes strided over the row's nonzeros, shuffle reduction."""
    refuse_grad("spmv_cuda", val, x, instead="spmv_ref")
    cuda.require_gpu()
    m, _, _ = check_csr("spmv_cuda", crow, col, val, x, "cuda", check_contents)
    fn = cuda.kernel(CU_FILE, f"spmv_warp_{SUFFIX[val.dtype]}_{INDEX_SUFFIX[crow.dtype]}",
                     CU_OPTIONS)
    y = torch.empty(m, dtype=val.dtype, device=val.device)
    cuda.launch(fn, triton.cdiv(m, WARPS_PER_BLOCK), 32 * WARPS_PER_BLOCK,
                (crow, col, val, x, y, np.int32(m)))
    return y
# --8<-- [end:cuda_launch]


# --------------------------------------------------------------------------------------------------
# Inputs: uniform random sparsity and a power-law row-length distribution
# --------------------------------------------------------------------------------------------------

# --8<-- [start:inputs]
POWER_LAW_ALPHA = 1.5  # Pareto tail exponent: a few rows thousands of times the mean length


def row_lengths(m: int, n: int, nnz: int, pattern: str, gen: torch.Generator) -> torch.Tensor:
    """Row lengths (int64, summing to exactly nnz, each at most n) of an m x n matrix.

    "uniform": every nonzero falls in a row drawn uniformly, so lengths are binomial around
    nnz / m (some rows empty). "powerlaw": lengths follow the quantiles of a Pareto distribution
    with tail exponent POWER_LAW_ALPHA, scaled to the same total and shuffled: most rows short,
    a few very long."""
    if pattern == "uniform":
        rows = torch.randint(0, m, (nnz,), generator=gen)
        return torch.bincount(rows, minlength=m)
    if pattern != "powerlaw":
        raise ValueError(f"pattern must be 'uniform' or 'powerlaw', got {pattern!r}")
    q = (torch.arange(m, dtype=torch.float64) + 0.5) / m
    w = q ** (-1.0 / POWER_LAW_ALPHA)
    lengths = torch.clamp(torch.floor(w * nnz / w.sum()).long(), max=n)
    while int(lengths.sum()) < nnz:  # hand out what flooring and the cap at n left over
        room = lengths < n
        short = nnz - int(lengths.sum())
        add = torch.zeros(m, dtype=torch.long)
        add[torch.nonzero(room)[:short, 0]] = 1
        lengths += add
    return lengths[torch.randperm(m, generator=gen)]


def make_csr(m: int, n: int, nnz: int, pattern: str, gen: torch.Generator,
             index_dtype: torch.dtype = torch.int32) -> tuple[torch.Tensor, torch.Tensor]:
    """(crow, col) on the CPU: row lengths from ``row_lengths``, columns uniform in [0, n) and
    sorted within each row (repeats allowed: CSR sums them)."""
    lengths = row_lengths(m, n, nnz, pattern, gen)
    crow = torch.zeros(m + 1, dtype=torch.long)
    crow[1:] = torch.cumsum(lengths, 0)
    rows = torch.repeat_interleave(torch.arange(m), lengths)
    col = torch.randint(0, n, (nnz,), generator=gen)
    col = (torch.sort(rows * n + col).values % n) if nnz else col
    return crow.to(index_dtype), col.to(index_dtype)
# --8<-- [end:inputs]


def _nnz(size) -> int:
    return size["m"] * size["nnz_per_row"]


def _make_inputs(size, dtype, device, gen):
    """(crow, col, val, x): int32 indices, values and x uniform in [-1, 1]. The structure is drawn
    on the host (the sort of m * nnz_per_row keys), the values on the device."""
    crow, col = make_csr(size["m"], size["n"], _nnz(size), size["pattern"], gen)
    dev_gen = device_generator(gen, device)
    val = torch.rand(_nnz(size), generator=dev_gen, device=device) * 2 - 1
    x = torch.rand(size["n"], generator=dev_gen, device=device) * 2 - 1
    return crow.to(device), col.to(device), val.to(dtype), x.to(dtype)


def _bytes(size, dtype) -> int:
    return spmv_bytes(size["m"], size["n"], _nnz(size), dtype.itemsize, 4)["total"]


def _flops(size, dtype) -> int:
    return 2 * _nnz(size)  # a multiply and an add per nonzero


# The registered (timed) versions skip the O(M + nnz) content checks: the harness's matrices are
# valid by construction, and a solver checks its matrix once, not at every product.
def _v0(crow, col, val, x):
    return spmv_torch(crow, col, val, x, check_contents=False)


def _v1(crow, col, val, x):
    return spmv_scalar(crow, col, val, x, check_contents=False)


def _v2(crow, col, val, x):
    return spmv_stream(crow, col, val, x, check_contents=False)


def _v3(crow, col, val, x):
    return spmv_cuda(crow, col, val, x, check_contents=False)


M = 2**20  # 1M x 1M: x (4 MiB fp32) fits in L2, the matrix (80 MiB at 10 per row) does not
HEADLINE = {"m": M, "n": M, "nnz_per_row": 10, "pattern": "uniform"}
SWEEP = ([{"m": M, "n": M, "nnz_per_row": k, "pattern": "uniform"} for k in (2, 4, 10, 32, 64)]
         + [{"m": M, "n": M, "nnz_per_row": k, "pattern": "powerlaw"} for k in (4, 10, 32)])
TEST_SIZES = [{"m": 1, "n": 1, "nnz_per_row": 1, "pattern": "uniform"},
              {"m": 7, "n": 13, "nnz_per_row": 3, "pattern": "uniform"},
              {"m": 300, "n": 257, "nnz_per_row": 5, "pattern": "uniform"},
              {"m": 200, "n": 1000, "nnz_per_row": 6, "pattern": "powerlaw"}]
SOURCES = ("snippets/part4/spmv.py",)

spmv_op = register(Op(
    name="spmv", part=4, chapter="part4/spmv.md", title="Sparse matrix-vector product (CSR)",
    reference=spmv_ref, make_inputs=_make_inputs, bytes_moved=_bytes, flops=_flops,
    metric="GB/s", ceiling="copy", headline=HEADLINE, sweep=SWEEP, dtypes=DTYPES,
    bench_dtypes=(torch.float32,), test_sizes=TEST_SIZES, sweep_axis="nnz_per_row",
    # y is a sum of up to thousands of products of values in [-1, 1], in fp32: the atol covers the
    # fp32 rounding of long sums near zero, the rtol one rounding of y to fp16/bf16.
    tolerances={torch.float32: (1e-5, 2e-5), torch.float16: (1e-3, 2e-3),
                torch.bfloat16: (8e-3, 1e-2)}))
spmv_op.add(Impl("v0", _v0, "PyTorch", "torch.sparse_csr_tensor @ x (cuSPARSE)",
                 (spmv_torch,), device="cuda", origin="library"))
spmv_op.add(Impl("v1", _v1, "Triton", "one program per row (CSR-scalar)",
                 (spmv_scalar, _spmv_row_kernel, *SOURCES), device="any"))
spmv_op.add(Impl("v2", _v2, "Triton", "fixed nonzeros per program, segmented scan, atomics",
                 (spmv_stream, _spmv_stream_kernel, chunk_rows, *SOURCES), device="any"))
spmv_op.add(Impl("v3", _v3, "CUDA", "one warp per row (CSR-vector), shuffle reduction",
                 (spmv_cuda, cuda.source_path(CU_FILE), *SOURCES), device="cuda"))
