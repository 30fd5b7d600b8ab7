"""part2.matrix-add.5: Matrix add into a column slice of a wider matrix (Triton)

The reference solution.

Chapter: docs/part2/matrix-add.md, exercise 5. Difficulty 2 of 4 (write a few lines).

The kernels take a leading dimension (row stride) for every matrix. Write the Triton kernel's
body so that x, y and out may each be a column slice of a wider matrix: load a (BM, BN) tile of
x and of y with a 2-D mask, add, and store it into out, each with its own row stride.

Check it:  python -m snippets exercise check part2.matrix-add.5
"""

import torch
import triton
import triton.language as tl


@triton.jit
def matrix_add_kernel(x_ptr, y_ptr, out_ptr, m, n, ld_x, ld_y, ld_out, BM: tl.constexpr, BN: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = (rows[:, None] < m) & (cols[None, :] < n)
    x = tl.load(x_ptr + rows[:, None] * ld_x + cols[None, :], mask=mask)
    y = tl.load(y_ptr + rows[:, None] * ld_y + cols[None, :], mask=mask)
    tl.store(out_ptr + rows[:, None] * ld_out + cols[None, :], x + y, mask=mask)


def matrix_add(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, bm: int = 16, bn: int = 32) -> None:
    """out = x + y for (m, n) matrices with unit-stride columns and any row stride."""
    m, n = x.shape
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    matrix_add_kernel[grid](x, y, out, m, n, x.stride(0), y.stride(0), out.stride(0), BM=bm, BN=bn)
