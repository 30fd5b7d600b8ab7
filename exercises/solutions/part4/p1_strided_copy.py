"""part4.programming-model.6: Triton ladder 1/6: a strided load with a mask

The reference solution.

Chapter: docs/part4/programming-model.md, exercise 6. Difficulty 1 of 4 (fill one line).

out[i] = x[i * stride] for i < n, one program per BLOCK elements. Write the mask and the masked
load and store: x has (n - 1) * stride + 1 elements, so the mask is about i, not about the
address.

Check it:  python -m snippets exercise check part4.programming-model.6
"""

import torch
import triton
import triton.language as tl


@triton.jit
def strided_copy_kernel(x_ptr, out_ptr, n, stride, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # indices into out
    mask = offs < n
    x = tl.load(x_ptr + offs * stride, mask=mask)
    tl.store(out_ptr + offs, x, mask=mask)


def strided_copy(x: torch.Tensor, out: torch.Tensor, stride: int, block: int = 64) -> None:
    """out[i] = x[i * stride] for i < out.numel()."""
    n = out.numel()
    strided_copy_kernel[(triton.cdiv(n, block),)](x, out, n, stride, BLOCK=block)
