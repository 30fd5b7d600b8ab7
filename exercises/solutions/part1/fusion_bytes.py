"""part1.elementwise.4: The bytes of x * y + z, two kernels against one

The reference solution.

Chapter: docs/part1/elementwise.md, exercise 4. Difficulty 1 of 4 (fill one line).

out = x * y + z written in PyTorch runs two kernels. Count the bytes of the two-kernel version
and of a fused kernel, and predict the speed-up of fusing from the bytes alone.

Check it:  python -m snippets exercise check part1.elementwise.4
"""


def bytes_two_kernels(n: int, itemsize: int) -> int:
    """Bytes of t = x * y followed by out = t + z, two kernels, n elements of ``itemsize`` bytes."""
    return 3 * n * itemsize + 3 * n * itemsize


def bytes_fused(n: int, itemsize: int) -> int:
    """Bytes of one kernel computing out = x * y + z."""
    return 4 * n * itemsize


def predicted_speedup(n: int, itemsize: int) -> float:
    """The speed-up of fusing that the bytes alone predict (both memory-bound)."""
    return bytes_two_kernels(n, itemsize) / bytes_fused(n, itemsize)
