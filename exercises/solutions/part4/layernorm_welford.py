"""part4.layernorm.2: A streaming LayerNorm forward with Welford's update

The reference solution.

Chapter: docs/part4/layernorm.md, exercise 2. Difficulty 3 of 4 (write most of it).

Rows longer than MAX_N do not fit in registers. Write a forward that streams the row in chunks
of BLOCK_N with Welford's update for mean and variance, and a second sweep for y: reduce each
chunk to its count, its mean and its M2 (the sum of squared deviations from the chunk's own
mean) with tl.sum, and merge them into the running count, mean and M2. Then say what the second
read of x costs in the bytes model (bytes_moved). At which N it beats the register version is
the GPU half of the chapter's exercise.

Check it:  python -m snippets exercise check part4.layernorm.2
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
    for start in range(0, n, BLOCK_N):  # pass 1: Welford's update, one chunk at a time
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        n_b = tl.minimum(n - start, BLOCK_N).to(tl.float32)  # the chunk's real columns
        mean_b = tl.sum(x, axis=0) / n_b
        xc = tl.where(mask, x - mean_b, 0.0)  # the padding must not add (0 - mean_b)^2
        m2_b = tl.sum(xc * xc, axis=0)
        total = count + n_b
        delta = mean_b - mean
        mean = mean + delta * (n_b / total)
        m2 = m2 + m2_b + delta * delta * (count * n_b / total)
        count = total
    var = m2 / count  # the biased variance, as torch.nn.LayerNorm
    rstd = 1.0 / tl.sqrt(var + eps)
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
    return (3 * m * n + 2 * n) * itemsize
