"""part4.programming-model.7: Triton ladder 2/6: a broadcast add

A PLANTED WRONG SOLUTION ('row_mask_only'): the solution with a bug put in on purpose, for the
checker's tests (--planted row_mask_only checks it).

Chapter: docs/part4/programming-model.md, exercise 7. Difficulty 2 of 4 (write a few lines).

out[i, j] = x[i] + y[j] for x of m elements and y of n: each program computes a (BM, BN) tile of
out from BM elements of x and BN of y. Write the 2-D offsets, the masks and the broadcast (out
has a row stride of its own).

Check it:  python -m snippets exercise check part4.programming-model.7
"""

import torch
import triton
import triton.language as tl


@triton.jit
def outer_add_kernel(x_ptr, y_ptr, out_ptr, m, n, ld_out, BM: tl.constexpr, BN: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    x = tl.load(x_ptr + rows, mask=rows < m)
    y = tl.load(y_ptr + cols, mask=cols < n)
    mask = (rows[:, None] < m) & (cols[None, :] >= 0)
    tl.store(out_ptr + rows[:, None] * ld_out + cols[None, :], x[:, None] + y[None, :], mask=mask)


def outer_add(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, bm: int = 16, bn: int = 32) -> None:
    """out[i, j] = x[i] + y[j]; out is (x.numel(), y.numel()) with unit-stride columns."""
    m, n = x.numel(), y.numel()
    outer_add_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](x, y, out, m, n, out.stride(0), BM=bm, BN=bn)
