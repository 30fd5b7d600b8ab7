"""part6.swizzles.3: The swizzle function

Chapter: docs/part6/swizzles.md, exercise 3. Difficulty 1 of 4 (fill one line).

Write swizzle(offset, bits, base, shift), CuTe's Swizzle<B, M, S> on an offset: XOR the B bits
that start at bit M + S into the B bits that start at bit M (for a negative S, the B bits at M
into those at M - S). The lowest M bits never change.

Check it:  python -m snippets exercise check part6.swizzles.3
"""


def swizzle(offset: int, bits: int, base: int, shift: int) -> int:
    """``offset`` after Swizzle<bits, base, shift>."""
    raise NotImplementedError("YOUR CODE HERE")
