"""part3.reduction.6: A one-launch Triton sum with `tl.atomic_add`

Chapter: docs/part3/reduction.md, exercise 6. Difficulty 2 of 4 (write a few lines).

Make the Triton reduction a single launch: each program loads its block, reduces it with tl.sum,
and adds its partial sum into the single fp32 output with tl.atomic_add. (Is it faster at 2^28?
At 2^20? That part is measured on a GPU.)

Check it:  python -m snippets exercise check part3.reduction.6
(--solution checks the reference solution; exercise show part3.reduction.6 gives the hint)
"""

import torch
import triton
import triton.language as tl


@triton.jit
def sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    # YOUR CODE HERE: load this program's block (masked), reduce it, add the partial sum into out_ptr[0]
    pass


def total(x: torch.Tensor, out: torch.Tensor, block: int = 256) -> None:
    """out[0] = x.sum() in one launch (out: one fp32 element, zeroed here)."""
    out.zero_()
    n = x.numel()
    sum_kernel[(triton.cdiv(n, block),)](x, out, n, BLOCK=block)
