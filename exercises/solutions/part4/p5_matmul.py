"""part4.matmul.8: Triton ladder 5/6: a tiled matmul with `tl.dot` (fp32)

The reference solution.

Chapter: docs/part4/matmul.md, exercise 8. Difficulty 3 of 4 (write most of it).

The tiled matrix multiply in Triton (the Triton half of the Part 3 project): each program
computes a (BLOCK_M, BLOCK_N) tile of C, looping over K in steps of BLOCK_K with tl.dot on fp32
tiles (the CPU interpreter's bf16 dot is unreliable, so this exercise stays in fp32). Any shape,
any strides.

Check it:  python -m snippets exercise check part4.matmul.8
"""

import torch
import triton
import triton.language as tl


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")
    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn, acc,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def matmul(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, block_m: int = 16, block_n: int = 32,
           block_k: int = 16) -> None:
    """c = a @ b for fp32 matrices of any shape and strides."""
    (m, k), n = a.shape, b.shape[1]
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    matmul_kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                        c.stride(1), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
