"""part5.norms-activations.1: Residual add fused into RMSNorm

Chapter: docs/part5/norms-activations.md, exercise 1. Difficulty 3 of 4 (write most of it).

Fuse the residual add into RMSNorm: h = x + r, y = rmsnorm(h) = h / sqrt(mean(h^2) + eps) * w,
returning both h and y (one program per row). Count the bytes before and after (the backward
when both outputs receive gradients is left to the chapter).

Check it:  python -m snippets exercise check part5.norms-activations.1
(--solution checks the reference solution; exercise show part5.norms-activations.1 gives the hint)
"""

import torch
import triton
import triton.language as tl


@triton.jit
def add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, h_ptr, y_ptr, n, stride, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n
    # YOUR CODE HERE: h = x + r (store it), then y = h / sqrt(mean(h^2) + eps) * w (store it)
    pass


def add_rmsnorm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, h: torch.Tensor, y: torch.Tensor,
                eps: float = 1e-6) -> None:
    """h = x + r and y = rmsnorm(h) * w for contiguous (m, n) fp32 x, r, h, y and w of n elements."""
    m, n = x.shape
    add_rmsnorm_kernel[(m,)](x, r, w, h, y, n, x.stride(0), eps, BLOCK_N=triton.next_power_of_2(n))


def bytes_unfused(m: int, n: int, itemsize: int) -> int:
    """An add kernel (h = x + r) followed by an RMSNorm kernel that reads h and w and writes y."""
    raise NotImplementedError("YOUR CODE HERE")


def bytes_fused(m: int, n: int, itemsize: int) -> int:
    """The fused kernel: reads x, r and w, writes h and y."""
    raise NotImplementedError("YOUR CODE HERE")
