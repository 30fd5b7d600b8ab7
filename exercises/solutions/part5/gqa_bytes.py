"""part5.flash-attention.7: The bytes grouped-query attention saves

The reference solution.

Chapter: docs/part5/flash-attention.md, exercise 7. Difficulty 1 of 4 (fill one line).

Grouped-query attention shares one K, V head among G query heads. With the forward's bytes model
(read Q, K and V once, write O once), count the bytes for H query heads with and without
sharing, and the bytes saved.

Check it:  python -m snippets exercise check part5.flash-attention.7
"""


def forward_bytes(b: int, h: int, s: int, d: int, itemsize: int, group: int = 1) -> int:
    """Bytes of the attention forward (read Q, K, V once, write O once) for b sequences of s tokens, h query
    heads of dimension d, and one K, V head per ``group`` query heads."""
    head = s * d * itemsize
    return b * head * (2 * h + 2 * (h // group))


def bytes_saved(b: int, h: int, s: int, d: int, itemsize: int, group: int = 1) -> int:
    """Bytes saved against one K, V head per query head."""
    return forward_bytes(b, h, s, d, itemsize, 1) - forward_bytes(b, h, s, d, itemsize, group)
