"""part1.setting-up.2: The mask of the Triton vector add

A PLANTED WRONG SOLUTION ('block_mask'): the solution with a bug put in on purpose, for the
checker's tests (--planted block_mask checks it).

Chapter: docs/part1/setting-up.md, exercise 2. Difficulty 1 of 4 (fill one line).

The last program of the vector add runs past the end of the arrays unless BLOCK divides n. Write
the mask that keeps its extra lanes from loading and storing. (The chapter's exercise: change
the mask to offs <= n and see which tests catch it; here you write the right one, and the
planted wrong solution is that one.)

Check it:  python -m snippets exercise check part1.setting-up.2
"""

import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = tl.arange(0, BLOCK) < BLOCK
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


def vector_add(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, block: int = 128) -> None:
    """out = x + y (1-D tensors of n elements; the check hands you out, filled with NaN)."""
    n = x.numel()
    add_kernel[(triton.cdiv(n, block),)](x, y, out, n, BLOCK=block)
