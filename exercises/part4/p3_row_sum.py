"""part4.programming-model.8: Triton ladder 3/6: a row sum

Chapter: docs/part4/programming-model.md, exercise 8. Difficulty 2 of 4 (write a few lines).

out[r] = x[r, 0] + ... + x[r, n - 1]: one program per row, BLOCK_N a power of two >= n. Load the
row with a mask that adds nothing for the lanes past n, and reduce it with tl.sum.

Check it:  python -m snippets exercise check part4.programming-model.8
(--solution checks the reference solution; exercise show part4.programming-model.8 gives the hint)
"""

import torch
import triton
import triton.language as tl


@triton.jit
def row_sum_kernel(x_ptr, out_ptr, n, stride_row, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    # YOUR CODE HERE: load row `row` (masked: lanes past n add nothing), sum it, store it into out[row]
    pass


def row_sum(x: torch.Tensor, out: torch.Tensor) -> None:
    """out[r] = x[r, :].sum() for a (m, n) matrix with unit-stride columns."""
    m, n = x.shape
    row_sum_kernel[(m,)](x, out, n, x.stride(0), BLOCK_N=triton.next_power_of_2(n))
