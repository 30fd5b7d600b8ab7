"""part3.roofline.6: The intensity of a skinny GEMM

Chapter: docs/part3/roofline.md, exercise 6. Difficulty 2 of 4 (write a few lines).

A GEMM of M x K by K x N with M = 16 (one token's worth of rows, as in inference). Compute its
intensity for N = K = 4096. Which roof applies, and what does that say about batching? Write the
bytes (each operand read once, C written once), the FLOPs, the intensity and which roof bounds
it.

Check it:  python -m snippets exercise check part3.roofline.6
(--solution checks the reference solution; exercise show part3.roofline.6 gives the hint)
"""


def gemm_flops(m: int, n: int, k: int) -> int:
    raise NotImplementedError("YOUR CODE HERE")


def gemm_bytes(m: int, n: int, k: int, itemsize: int) -> int:
    """Bytes when A (m x k) and B (k x n) are each read once and C (m x n) written once."""
    raise NotImplementedError("YOUR CODE HERE")


def intensity(m: int, n: int, k: int, itemsize: int) -> float:
    """FLOP/byte."""
    raise NotImplementedError("YOUR CODE HERE")


def bound(m: int, n: int, k: int, itemsize: int, peak_flops: float, peak_bytes: float) -> str:
    """"memory" or "compute": which roof limits this GEMM on a GPU with these peaks (FLOP/s, bytes/s)."""
    raise NotImplementedError("YOUR CODE HERE")
