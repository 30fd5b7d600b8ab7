"""part4.dropout.1: Seeded dropout with a base offset

The reference solution.

Chapter: docs/part4/dropout.md, exercise 1. Difficulty 2 of 4 (write a few lines).

Add a base_offset argument to seeded dropout that is added to every element index, and use it to
give the layers of a model disjoint ranges of one stream. What must the offsets of two layers
differ by?

Check it:  python -m snippets exercise check part4.dropout.1
"""

import torch
import triton
import triton.language as tl


@triton.jit
def dropout_kernel(x_ptr, out_ptr, n, p, seed, base_offset, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    keep = tl.rand(seed, base_offset + offs) >= p
    tl.store(out_ptr + offs, tl.where(keep, x / (1 - p), 0.0), mask=mask)


def dropout(x: torch.Tensor, out: torch.Tensor, p: float, seed: int, base_offset: int = 0) -> None:
    """out = x * keep / (1 - p), keep drawn from positions base_offset .. base_offset + n - 1 of the stream."""
    n = x.numel()
    dropout_kernel[(triton.cdiv(n, 256),)](x, out, n, p, seed, base_offset, BLOCK=256)


def min_offset_gap(numel: int) -> int:
    """How far apart the base offsets of two layers must be, the first with ``numel`` elements, so that they
    never share a random number."""
    return numel
