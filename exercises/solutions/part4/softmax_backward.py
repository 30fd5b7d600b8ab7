"""part4.softmax.6: The backward of softmax in one pass

The reference solution.

Chapter: docs/part4/softmax.md, exercise 6. Difficulty 3 of 4 (write most of it).

Write the backward of softmax, dx = y * (g - <g, y>), as a one-pass Triton kernel (one program
per row, the row in registers). What is its cost model, and what rate should it reach?

Check it:  python -m snippets exercise check part4.softmax.6
"""

import torch
import triton
import triton.language as tl


@triton.jit
def softmax_backward_kernel(y_ptr, g_ptr, dx_ptr, n, stride, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n
    y = tl.load(y_ptr + row * stride + cols, mask=mask, other=0.0)
    g = tl.load(g_ptr + row * stride + cols, mask=mask, other=0.0)
    dot = tl.sum(g * y, axis=0)
    tl.store(dx_ptr + row * stride + cols, y * (g - dot), mask=mask)


def softmax_backward(y: torch.Tensor, g: torch.Tensor, dx: torch.Tensor) -> None:
    """dx = the gradient of softmax at its output y, for the upstream gradient g (contiguous (m, n))."""
    m, n = y.shape
    softmax_backward_kernel[(m,)](y, g, dx, n, y.stride(0), BLOCK_N=triton.next_power_of_2(n))


def bytes_moved(m: int, n: int, itemsize: int) -> int:
    """The cost model of the one-pass backward."""
    return 3 * m * n * itemsize
