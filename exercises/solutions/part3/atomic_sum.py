"""part3.reduction.6: A one-launch Triton sum with `tl.atomic_add`

The reference solution.

Chapter: docs/part3/reduction.md, exercise 6. Difficulty 2 of 4 (write a few lines).

Make the Triton reduction a single launch: each program loads its block, reduces it with tl.sum,
and adds its partial sum into the single fp32 output with tl.atomic_add. (Is it faster at 2^28?
At 2^20? That part is measured on a GPU.)

Check it:  python -m snippets exercise check part3.reduction.6
"""

import torch
import triton
import triton.language as tl


@triton.jit
def sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.atomic_add(out_ptr, tl.sum(x, axis=0))


def total(x: torch.Tensor, out: torch.Tensor, block: int = 256) -> None:
    """out[0] = x.sum() in one launch (out: one fp32 element, zeroed here)."""
    out.zero_()
    n = x.numel()
    sum_kernel[(triton.cdiv(n, block),)](x, out, n, BLOCK=block)
