"""part4.layernorm.2: A streaming LayerNorm forward with Welford's update

Chapter: docs/part4/layernorm.md, exercise 2. Difficulty 3 of 4 (write most of it).

Rows longer than MAX_N do not fit in registers. Write a forward that streams the row in chunks
of BLOCK_N with Welford's update for mean and variance, and a second sweep for y: reduce each
chunk to its count, its mean and its M2 (the sum of squared deviations from the chunk's own
mean) with tl.sum, and merge them into the running count, mean and M2. Then say what the second
read of x costs in the bytes model (bytes_moved). At which N it beats the register version is
the GPU half of the chapter's exercise.

Check it:  python -m snippets exercise check part4.layernorm.2
(--solution checks the reference solution; exercise show part4.layernorm.2 gives the hint)
"""

import torch
import triton
import triton.language as tl


@triton.jit
def layernorm_stream_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n, stride_x, stride_y, eps,
                            BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    y_row = y_ptr + row.to(tl.int64) * stride_y
    count = 0.0  # the columns merged so far
    mean = 0.0  # their mean
    m2 = 0.0  # the sum of their squared deviations from `mean`
    # YOUR CODE HERE: pass 1, over the row in chunks of BLOCK_N columns: reduce each chunk to its count, mean
    # and M2 (in fp32, the padding left out of all three) and merge them into (count, mean, m2) with Welford's
    # update; then the biased variance and rstd = 1 / sqrt(var + eps)
    rstd = 0.0
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)
    for start in range(0, n, BLOCK_N):  # pass 2: read x again and write y
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean) * rstd * w + b
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def layernorm_stream(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, y: torch.Tensor, mean: torch.Tensor,
                     rstd: torch.Tensor, eps: float = 1e-5, block_n: int = 4096) -> None:
    """y = LayerNorm of each row of x (m, n) with weight w and bias b (n,), streaming the row in chunks of
    block_n columns (any row length); the row's mean and rstd (fp32, (m,)) are stored as a training forward
    does. Statistics in fp32 whatever the storage type; y has x's dtype."""
    m, n = x.shape
    layernorm_stream_kernel[(m,)](x, w, b, y, mean, rstd, n, x.stride(0), y.stride(0), eps, BLOCK_N=block_n)


def bytes_moved(m: int, n: int, itemsize: int) -> int:
    """The bytes model of the streaming forward for m rows of n elements of itemsize bytes, counted as the
    chapter counts the register version's (2MN + 2N): x, w, b read, y written, the per-row mean and rstd left
    out."""
    raise NotImplementedError("YOUR CODE HERE")
