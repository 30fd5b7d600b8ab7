"""part4.debugging.3: A row-wise maximum, and the value of masked lanes

The reference solution.

Chapter: docs/part4/debugging.md, exercise 3. Difficulty 2 of 4 (write a few lines).

Write a kernel that computes a row-wise maximum (one program per row, BLOCK_N >= n). The
chapter's exercise: with other=0.0 on the masked load it is wrong; find the input on which it
is, and fix it. The check includes that input.

Check it:  python -m snippets exercise check part4.debugging.3
"""

import torch
import triton
import triton.language as tl


@triton.jit
def row_max_kernel(x_ptr, out_ptr, n, stride, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n, other=float("-inf"))
    tl.store(out_ptr + row, tl.max(x, axis=0))


def row_max(x: torch.Tensor, out: torch.Tensor) -> None:
    """out[r] = max of row r of the (m, n) matrix x. BLOCK_N is a power of two, often larger than n."""
    m, n = x.shape
    row_max_kernel[(m,)](x, out, n, x.stride(0), BLOCK_N=max(16, triton.next_power_of_2(n)))
