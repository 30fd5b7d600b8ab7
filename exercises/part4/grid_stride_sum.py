"""part4.triton-or-cuda.7: reduce_sum v7's design in Triton: a fixed grid, a grid-stride loop, one atomic

Chapter: docs/part4/triton-or-cuda.md, exercise 7. Difficulty 2 of 4 (write a few lines).

The CUDA v7 launches a grid sized to the GPU, not to the data: each thread walks the input with a
grid-stride loop into registers, the block reduces its threads' sums with shuffles, and one thread
adds the block's sum to the output with one atomicAdd. Write the same design in Triton: `programs`
programs, each walking the input in steps of programs x BLOCK elements into a BLOCK-wide fp32
accumulator (x may be fp32 or fp16), then one tl.sum and one tl.atomic_add per program, after the
loop. The host function zeroes out and launches the grid.

Check it:  python -m snippets exercise check part4.triton-or-cuda.7
(--solution checks the reference solution; exercise show part4.triton-or-cuda.7 gives the hint)
"""

import torch
import triton
import triton.language as tl


@triton.jit
def grid_stride_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # YOUR CODE HERE: a grid-stride loop over x into a BLOCK-wide fp32 accumulator, then one tl.sum and
    # one tl.atomic_add into out_ptr[0], after the loop
    pass


def grid_stride_sum(x: torch.Tensor, out: torch.Tensor, programs: int = 4, block: int = 256) -> None:
    """out[0] = x.sum() in fp32, one launch of `programs` programs whatever x.numel()."""
    # YOUR CODE HERE: zero out (the kernel adds into it), then launch `programs` programs
    raise NotImplementedError("YOUR CODE HERE")
