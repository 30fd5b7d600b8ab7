"""part8.capstone.8: Split-K with RMSNorm as the product's prologue

Chapter: docs/part8/capstone.md, exercise 8. Difficulty 2 of 4 (write a few lines).

v6's block_gemv computes rmsnorm(x, g) @ W^T in one pass over K: r = 1 / sqrt(mean(x^2) + eps) is
one number per row, so it comes out of the sum and is applied at the end. Split K into slices
[k_lo, k_hi), one program each, as v7's split-K does for the products without a norm: write
slice_partials(x, g, w, k_lo, k_hi), what one program stores for its slice, and combine(parts, k,
eps), which adds the slices into rmsnorm(x, g) @ W^T. A slice may be empty.

Check it:  python -m snippets exercise check part8.capstone.8
"""

import torch


def slice_partials(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor, k_lo: int, k_hi: int):
    """x (B, K), g (K,) the norm's weight, w (N, K). Returns (p (B, N), ss (B,)) for columns
    [k_lo, k_hi): p the slice's share of (x * g) @ W^T, ss the slice's share of the sum of x^2
    (the sum of squares is of x itself, not of x * g). An empty slice gives zeros."""
    raise NotImplementedError("YOUR CODE HERE")


def combine(parts: list, k: int, eps: float) -> torch.Tensor:
    """parts: the (p, ss) of slices that cover [0, k) once. Returns rmsnorm(x, g) @ W^T, (B, N)."""
    raise NotImplementedError("YOUR CODE HERE")
