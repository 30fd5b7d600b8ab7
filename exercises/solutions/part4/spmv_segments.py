"""part4.spmv.6: v2's segmented scan: the combine, the row sums and one atomic per row

The reference solution.

Chapter: docs/part4/spmv.md, exercise 6. Difficulty 3 of 4 (write most of it).

The segmented scan of v2 is tl.associative_scan over (value, row) pairs with a combine that adds
two pairs of the same row and restarts at a new row. Write the combine (segment_add) and the part
of v2's kernel after the binary search: the masked loads, the products in fp32, the reverse scan,
and one atomic add per row and chunk from the lane that holds the row's first nonzero in the
chunk. Then answer the chapter's question in code: why is the combine associative only on sorted
rows? counterexample() gives three (value, row) pairs with unsorted rows where the two
bracketings differ.

Check it:  python -m snippets exercise check part4.spmv.6
"""

import torch
import triton
import triton.language as tl

from snippets.part4.spmv import chunk_rows

CHUNK = 256  # nonzeros per program, v2's STREAM_CHUNK


@triton.jit
def segment_add(v_a, r_a, v_b, r_b):
    # a is what has been summed so far, b the next pair: add when both are of one row, else start again
    # from b. The result is always of b's row.
    return tl.where(r_a == r_b, v_a + v_b, v_b), r_b


@triton.jit
def spmv_chunk_kernel(crow_ptr, col_ptr, val_ptr, x_ptr, y_ptr, first_row_ptr, last_row_ptr, nnz,
                      CHUNK: tl.constexpr):
    pid = tl.program_id(0)
    chunk_start = pid.to(tl.int64) * CHUNK
    idx = chunk_start + tl.arange(0, CHUNK)
    valid = idx < nnz
    # The row of each nonzero, as in v2: the largest r in [r0, r1] with crow[r] <= idx. Padding lanes
    # (idx >= nnz) get row r1, the row of the chunk's last nonzero.
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
    # reverse: each lane gets the sum of its row's products from itself to the end of the chunk
    total, _ = tl.associative_scan((v * xv, row), 0, segment_add, reverse=True)
    # the lane of the row's first nonzero, or the chunk's first lane for a row begun in an earlier chunk
    first = valid & ((idx == tl.load(crow_ptr + row)) | (idx == chunk_start))
    tl.atomic_add(y_ptr + row, total, mask=first, sem="relaxed")


def spmv_chunks(crow: torch.Tensor, col: torch.Tensor, val: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                chunk: int = CHUNK) -> None:
    """y += A x for the CSR matrix (crow, col, val) of y.numel() rows, chunk nonzeros per program (a power of
    two). y is fp32 and zeroed by the caller: the kernel adds each row's partial sums into it atomically."""
    nnz = val.numel()
    if nnz == 0:
        return
    first, last = chunk_rows(crow, nnz, chunk)
    spmv_chunk_kernel[(first.numel(),)](crow, col, val, x, y, first, last, nnz, CHUNK=chunk, num_warps=4)


def counterexample() -> tuple[tuple[float, int], tuple[float, int], tuple[float, int]]:
    """Three (value, row) pairs a, b, c with unsorted rows for which (a o b) o c != a o (b o c)."""
    # (a o b) o c = (2, 1) o c = (4, 0); a o (b o c) = a o (4, 0) = (5, 0): the row between a and c
    # cuts a off in one bracketing and not in the other
    return (1.0, 0), (2.0, 1), (4.0, 0)


@triton.jit
def bracketings_kernel(v_ptr, r_ptr, left_v_ptr, left_r_ptr, right_v_ptr, right_r_ptr, n, BLOCK: tl.constexpr):
    # triple t is the pairs 3t, 3t + 1, 3t + 2 = a, b, c: left = (a o b) o c, right = a o (b o c)
    t = tl.arange(0, BLOCK)
    mask = t < n
    va = tl.load(v_ptr + 3 * t, mask=mask, other=0.0)
    vb = tl.load(v_ptr + 3 * t + 1, mask=mask, other=0.0)
    vc = tl.load(v_ptr + 3 * t + 2, mask=mask, other=0.0)
    ra = tl.load(r_ptr + 3 * t, mask=mask, other=0)
    rb = tl.load(r_ptr + 3 * t + 1, mask=mask, other=0)
    rc = tl.load(r_ptr + 3 * t + 2, mask=mask, other=0)
    v_ab, r_ab = segment_add(va, ra, vb, rb)
    left_v, left_r = segment_add(v_ab, r_ab, vc, rc)
    v_bc, r_bc = segment_add(vb, rb, vc, rc)
    right_v, right_r = segment_add(va, ra, v_bc, r_bc)
    tl.store(left_v_ptr + t, left_v, mask=mask)
    tl.store(left_r_ptr + t, left_r, mask=mask)
    tl.store(right_v_ptr + t, right_v, mask=mask)
    tl.store(right_r_ptr + t, right_r, mask=mask)


def bracketings(triples, device: str = "cpu") -> list[tuple[tuple[float, int], tuple[float, int]]]:
    """For each triple of (value, row) pairs (a, b, c): ((a o b) o c, a o (b o c)) with segment_add as o,
    computed in a Triton kernel (values fp32, rows int32)."""
    n = len(triples)
    v = torch.tensor([float(p[0]) for t in triples for p in t], dtype=torch.float32, device=device)
    r = torch.tensor([int(p[1]) for t in triples for p in t], dtype=torch.int32, device=device)
    left_v, right_v = torch.empty(n, device=device), torch.empty(n, device=device)
    left_r = torch.empty(n, dtype=torch.int32, device=device)
    right_r = torch.empty(n, dtype=torch.int32, device=device)
    bracketings_kernel[(1,)](v, r, left_v, left_r, right_v, right_r, n, BLOCK=triton.next_power_of_2(n))
    return [((float(lv), int(lr)), (float(rv), int(rr)))
            for lv, lr, rv, rr in zip(left_v.tolist(), left_r.tolist(), right_v.tolist(), right_r.tolist())]
