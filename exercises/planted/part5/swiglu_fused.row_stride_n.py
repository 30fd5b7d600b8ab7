"""part5.norms-activations.4: SwiGLU on the fused output [a, b] of one GEMM

A PLANTED WRONG SOLUTION ('row_stride_n'): the solution with a bug put in on purpose, for the
checker's tests (--planted row_stride_n checks it).

Chapter: docs/part5/norms-activations.md, exercise 4. Difficulty 2 of 4 (write a few lines).

Write a SwiGLU variant that takes the fused [a | b] output of one GEMM, shape (M, 2N), instead
of two tensors: out = silu(a) * b with a = h[:, :N] and b = h[:, N:]. (Whether the strided
access costs anything at N = 7168 is the GPU half of the chapter's exercise.)

Check it:  python -m snippets exercise check part5.norms-activations.4
"""

import torch
import triton
import triton.language as tl


@triton.jit
def swiglu_kernel(h_ptr, out_ptr, n, stride_h, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    a = tl.load(h_ptr + row * n + cols, mask=mask).to(tl.float32)
    b = tl.load(h_ptr + row * n + n + cols, mask=mask).to(tl.float32)
    out = a * tl.sigmoid(a) * b
    tl.store(out_ptr + row * stride_out + cols, out, mask=mask)


def swiglu_fused(h: torch.Tensor, out: torch.Tensor, block: int = 64) -> None:
    """out (m, n) = silu(h[:, :n]) * h[:, n:] for h of shape (m, 2n)."""
    m, two_n = h.shape
    n = two_n // 2
    swiglu_kernel[(m, triton.cdiv(n, block))](h, out, n, h.stride(0), out.stride(0), BLOCK=block)
