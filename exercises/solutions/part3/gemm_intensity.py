"""part3.roofline.6: The intensity of a skinny GEMM

The reference solution.

Chapter: docs/part3/roofline.md, exercise 6. Difficulty 2 of 4 (write a few lines).

A GEMM of M x K by K x N with M = 16 (one token's worth of rows, as in inference). Compute its
intensity for N = K = 4096. Which roof applies, and what does that say about batching? Write the
bytes (each operand read once, C written once), the FLOPs, the intensity and which roof bounds
it.

Check it:  python -m snippets exercise check part3.roofline.6
"""


def gemm_flops(m: int, n: int, k: int) -> int:
    return 2 * m * n * k


def gemm_bytes(m: int, n: int, k: int, itemsize: int) -> int:
    """Bytes when A (m x k) and B (k x n) are each read once and C (m x n) written once."""
    return itemsize * (m * k + k * n + m * n)


def intensity(m: int, n: int, k: int, itemsize: int) -> float:
    """FLOP/byte."""
    return gemm_flops(m, n, k) / gemm_bytes(m, n, k, itemsize)


def bound(m: int, n: int, k: int, itemsize: int, peak_flops: float, peak_bytes: float) -> str:
    """"memory" or "compute": which roof limits this GEMM on a GPU with these peaks (FLOP/s, bytes/s)."""
    return "memory" if intensity(m, n, k, itemsize) < peak_flops / peak_bytes else "compute"
