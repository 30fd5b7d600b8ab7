"""part5.epilogue.1: A residual in the epilogue: what it adds, what it saves

Chapter: docs/part5/epilogue.md, exercise 1. Difficulty 1 of 4 (fill one line).

Add a residual to the epilogue: C = R + gelu(AB + b). What does it add to the fused kernel's
traffic, and what does it save compared with a separate addition?

Check it:  python -m snippets exercise check part5.epilogue.1
(--solution checks the reference solution; exercise show part5.epilogue.1 gives the hint)
"""


def fused_extra_bytes(m: int, n: int, itemsize: int) -> int:
    """What adding R in the epilogue adds to the fused GEMM's traffic (C is M x N)."""
    raise NotImplementedError("YOUR CODE HERE")


def separate_add_bytes(m: int, n: int, itemsize: int) -> int:
    """The traffic of a separate addition kernel, out = C + R, after the GEMM."""
    raise NotImplementedError("YOUR CODE HERE")


def bytes_saved(m: int, n: int, itemsize: int) -> int:
    """Bytes saved by fusing the residual instead of adding it separately."""
    raise NotImplementedError("YOUR CODE HERE")
