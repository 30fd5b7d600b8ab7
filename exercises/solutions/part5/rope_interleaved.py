"""part5.norms-activations.6: Interleaved RoPE

The reference solution.

Chapter: docs/part5/norms-activations.md, exercise 6. Difficulty 2 of 4 (write a few lines).

Implement the interleaved RoPE layout: pair i of a head is (x[2i], x[2i + 1]), rotated by the
angle of table column i (out[2i] = x[2i] cos - x[2i + 1] sin, out[2i + 1] = x[2i] sin + x[2i +
1] cos). One program per token. (Showing that it equals the rotate-half layout after permuting
the columns of W_q and W_k is the pen-and-paper half of the chapter's exercise.)

Check it:  python -m snippets exercise check part5.norms-activations.6
"""

import torch
import triton
import triton.language as tl


@triton.jit
def rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, D: tl.constexpr, HALF: tl.constexpr):
    t = tl.program_id(0)  # the token
    i = tl.arange(0, HALF)  # the pairs
    xe = tl.load(x_ptr + t * D + 2 * i)
    xo = tl.load(x_ptr + t * D + 2 * i + 1)
    c = tl.load(cos_ptr + t * HALF + i)
    s = tl.load(sin_ptr + t * HALF + i)
    tl.store(out_ptr + t * D + 2 * i, xe * c - xo * s)
    tl.store(out_ptr + t * D + 2 * i + 1, xe * s + xo * c)


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor) -> None:
    """x, out: (T, D) contiguous, D a power of two; cos, sin: (T, D / 2)."""
    t, d = x.shape
    rope_kernel[(t,)](x, cos, sin, out, D=d, HALF=d // 2)
