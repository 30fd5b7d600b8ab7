"""part8.kv-cache.1: Slots a paged cache wastes

The reference solution.

Chapter: docs/part8/kv-cache.md, exercise 1. Difficulty 1 of 4 (fill one line).

A sequence of n tokens in a paged cache with blocks of b tokens holds ceil(n / b) blocks. Write
wasted_slots(n, b), the slots of its blocks that hold no token, and expected_waste(b), the mean of
wasted_slots over lengths spread evenly over the residues modulo b.

Check it:  python -m snippets exercise check part8.kv-cache.1
"""


def wasted_slots(n: int, block_size: int) -> int:
    """Slots of the ceil(n / block_size) blocks of an n-token sequence that hold no token."""
    return -n % block_size  # block_size * ceil(n / block_size) - n: 0 when block_size divides n


def expected_waste(block_size: int) -> float:
    """The mean of wasted_slots(n, block_size) over n = 0 .. block_size - 1 (each residue once)."""
    return (block_size - 1) / 2  # the mean of 0, block_size - 1, ..., 1
