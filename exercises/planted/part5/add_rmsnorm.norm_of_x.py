"""part5.norms-activations.1: Residual add fused into RMSNorm

A PLANTED WRONG SOLUTION ('norm_of_x'): the solution with a bug put in on purpose, for the
checker's tests (--planted norm_of_x checks it).

Chapter: docs/part5/norms-activations.md, exercise 1. Difficulty 3 of 4 (write most of it).

Fuse the residual add into RMSNorm: h = x + r, y = rmsnorm(h) = h / sqrt(mean(h^2) + eps) * w,
returning both h and y (one program per row). Count the bytes before and after (the backward
when both outputs receive gradients is left to the chapter).

Check it:  python -m snippets exercise check part5.norms-activations.1
"""

import torch
import triton
import triton.language as tl


@triton.jit
def add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, h_ptr, y_ptr, n, stride, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    r = tl.load(r_ptr + row * stride + cols, mask=mask, other=0.0)
    h = x + r
    tl.store(h_ptr + row * stride + cols, h, mask=mask)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(y_ptr + row * stride + cols, h * rstd * w, mask=mask)


def add_rmsnorm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, h: torch.Tensor, y: torch.Tensor,
                eps: float = 1e-6) -> None:
    """h = x + r and y = rmsnorm(h) * w for contiguous (m, n) fp32 x, r, h, y and w of n elements."""
    m, n = x.shape
    add_rmsnorm_kernel[(m,)](x, r, w, h, y, n, x.stride(0), eps, BLOCK_N=triton.next_power_of_2(n))


def bytes_unfused(m: int, n: int, itemsize: int) -> int:
    """An add kernel (h = x + r) followed by an RMSNorm kernel that reads h and w and writes y."""
    return 3 * m * n * itemsize + (2 * m * n + n) * itemsize


def bytes_fused(m: int, n: int, itemsize: int) -> int:
    """The fused kernel: reads x, r and w, writes h and y."""
    return (4 * m * n + n) * itemsize
