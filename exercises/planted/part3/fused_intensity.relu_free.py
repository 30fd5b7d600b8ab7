"""part3.roofline.4: How much fusion raises the intensity

A PLANTED WRONG SOLUTION ('relu_free'): the solution with a bug put in on purpose, for the
checker's tests (--planted relu_free checks it).

Chapter: docs/part3/roofline.md, exercise 4. Difficulty 1 of 4 (fill one line).

relu(a * x + b) written as three PyTorch ops runs three kernels (a and b are scalars). Compute
the bytes and FLOPs of the three together and of one fused kernel. By how much does fusion raise
the intensity, and how much faster should the fused kernel be?

Check it:  python -m snippets exercise check part3.roofline.4
"""


def unfused(n: int, itemsize: int) -> tuple[int, int]:
    """(bytes, FLOPs) of t = a * x, u = t + b, out = relu(u): three kernels, n elements."""
    return 3 * 2 * n * itemsize, 2 * n


def fused(n: int, itemsize: int) -> tuple[int, int]:
    """(bytes, FLOPs) of one kernel computing relu(a * x + b)."""
    return 2 * n * itemsize, 3 * n


def intensity_gain(n: int, itemsize: int) -> float:
    """The fused kernel's intensity (FLOP/byte) over the three kernels'."""
    (b0, f0), (b1, f1) = unfused(n, itemsize), fused(n, itemsize)
    return (f1 / b1) / (f0 / b0)


def predicted_speedup(n: int, itemsize: int) -> float:
    """How much faster the fused kernel should be (everything memory-bound)."""
    return unfused(n, itemsize)[0] / fused(n, itemsize)[0]
