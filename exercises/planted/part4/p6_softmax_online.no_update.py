"""part4.softmax.2: Triton ladder 6/6: the online softmax

A PLANTED WRONG SOLUTION ('no_update'): the solution with a bug put in on purpose, for the
checker's tests (--planted no_update checks it).

Chapter: docs/part4/softmax.md, exercise 2. Difficulty 3 of 4 (write most of it).

Rewrite v4 so that each chunk is reduced to a single (m, s) pair with tl.max and tl.sum, with
one exponential per element in the first pass: walk the row in chunks of BLOCK_N, keep the
running maximum m and the running sum s of exp(x - m), and rescale s whenever m grows; a second
pass writes exp(x - m) / s. (Measuring it in bf16 and fp32 at N = 2^16 is the GPU half of the
chapter's exercise.)

Check it:  python -m snippets exercise check part4.softmax.2
"""

import torch
import triton
import triton.language as tl


@triton.jit
def softmax_online_kernel(x_ptr, out_ptr, n, stride_x, stride_out, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    m = -float("inf")  # the running maximum of the row
    s = 0.0  # the running sum of exp(x - m)
    for start in range(0, n, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + cols, mask=cols < n, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
    for start in range(0, n, BLOCK_N):  # pass 2: write exp(x - m) / s
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + cols, mask=cols < n, other=float("-inf"))
        tl.store(out_row + cols, tl.exp(x - m) / s, mask=cols < n)


def softmax_online(x: torch.Tensor, out: torch.Tensor, block_n: int = 64) -> None:
    """out = softmax of each row of x, streaming the row in chunks of block_n columns (any row length)."""
    m, n = x.shape
    softmax_online_kernel[(m,)](x, out, n, x.stride(0), out.stride(0), BLOCK_N=block_n)
