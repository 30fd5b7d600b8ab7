"""part4.triton-or-cuda.7: reduce_sum v7's design in Triton: a fixed grid, a grid-stride loop, one atomic

The reference solution.

Chapter: docs/part4/triton-or-cuda.md, exercise 7. Difficulty 2 of 4 (write a few lines).

The CUDA v7 launches a grid sized to the GPU, not to the data: each thread walks the input with a
grid-stride loop into registers, the block reduces its threads' sums with shuffles, and one thread
adds the block's sum to the output with one atomicAdd. Write the same design in Triton: `programs`
programs, each walking the input in steps of programs x BLOCK elements into a BLOCK-wide fp32
accumulator (x may be fp32 or fp16), then one tl.sum and one tl.atomic_add per program, after the
loop. The host function zeroes out and launches the grid.

Check it:  python -m snippets exercise check part4.triton-or-cuda.7
"""

import torch
import triton
import triton.language as tl


@triton.jit
def grid_stride_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK  # the grid's width: gridDim.x * blockDim.x in v7
    acc = tl.zeros([BLOCK], dtype=tl.float32)  # one partial sum per lane: v7's per-thread registers
    for start in range(pid * BLOCK, n, step):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.atomic_add(out_ptr, tl.sum(acc, axis=0))  # the shuffles and the block's one atomicAdd


def grid_stride_sum(x: torch.Tensor, out: torch.Tensor, programs: int = 4, block: int = 256) -> None:
    """out[0] = x.sum() in fp32, one launch of `programs` programs whatever x.numel()."""
    out.zero_()
    grid_stride_sum_kernel[(programs,)](x, out, x.numel(), BLOCK=block)
