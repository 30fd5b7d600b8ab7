"""part5.epilogue.1: A residual in the epilogue: what it adds, what it saves

The reference solution.

Chapter: docs/part5/epilogue.md, exercise 1. Difficulty 1 of 4 (fill one line).

Add a residual to the epilogue: C = R + gelu(AB + b). What does it add to the fused kernel's
traffic, and what does it save compared with a separate addition?

Check it:  python -m snippets exercise check part5.epilogue.1
"""


def fused_extra_bytes(m: int, n: int, itemsize: int) -> int:
    """What adding R in the epilogue adds to the fused GEMM's traffic (C is M x N)."""
    return m * n * itemsize  # read R once; C is written as before


def separate_add_bytes(m: int, n: int, itemsize: int) -> int:
    """The traffic of a separate addition kernel, out = C + R, after the GEMM."""
    return 3 * m * n * itemsize  # read C, read R, write out


def bytes_saved(m: int, n: int, itemsize: int) -> int:
    """Bytes saved by fusing the residual instead of adding it separately."""
    return separate_add_bytes(m, n, itemsize) - fused_extra_bytes(m, n, itemsize)
