"""part1.elementwise.1: A GELU op in Triton, and its bytes

Chapter: docs/part1/elementwise.md, exercise 1. Difficulty 2 of 4 (write a few lines).

Add a GELU op with the triton_map pattern: GELU(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2))),
computed in fp32. Write the kernel's arithmetic (the loads, the mask and the store are given)
and bytes_moved(n, itemsize): how many bytes does it move? Predict its rate from the chapter's
tables before measuring it (python -m snippets bench is the measuring part, on a GPU).

Check it:  python -m snippets exercise check part1.elementwise.1
(--solution checks the reference solution; exercise show part1.elementwise.1 gives the hint)
"""

import torch
import triton
import triton.language as tl


@triton.jit
def gelu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    out = x  # YOUR CODE HERE: GELU(x) = 0.5 x (1 + erf(x / sqrt(2)))
    tl.store(out_ptr + offs, out, mask=mask)


def gelu(x: torch.Tensor, out: torch.Tensor, block: int = 256) -> None:
    """out = GELU(x), element-wise (fp32)."""
    n = x.numel()
    gelu_kernel[(triton.cdiv(n, block),)](x, out, n, BLOCK=block)


def bytes_moved(n: int, itemsize: int) -> int:
    """The fewest bytes GELU on n elements of ``itemsize`` bytes must move through device memory."""
    raise NotImplementedError("YOUR CODE HERE")
