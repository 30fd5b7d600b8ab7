"""part8.capstone.8: Split-K with RMSNorm as the product's prologue

The reference solution.

Chapter: docs/part8/capstone.md, exercise 8. Difficulty 2 of 4 (write a few lines).
"""

import torch


def slice_partials(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor, k_lo: int, k_hi: int):
    """x (B, K), g (K,) the norm's weight, w (N, K). Returns (p (B, N), ss (B,)) for columns
    [k_lo, k_hi): p the slice's share of (x * g) @ W^T, ss the slice's share of the sum of x^2
    (the sum of squares is of x itself, not of x * g). An empty slice gives zeros."""
    xs = x[:, k_lo:k_hi]
    return (xs * g[k_lo:k_hi]) @ w[:, k_lo:k_hi].T, (xs * xs).sum(1)


def combine(parts: list, k: int, eps: float) -> torch.Tensor:
    """parts: the (p, ss) of slices that cover [0, k) once. Returns rmsnorm(x, g) @ W^T, (B, N)."""
    p = sum(part for part, _ in parts)                    # r factors out of every slice's sum
    ss = sum(s for _, s in parts)                         # ...but needs the whole row's squares
    return p / torch.sqrt(ss / k + eps)[:, None]
