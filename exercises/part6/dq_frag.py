"""part6.hopper-attention.12: Step 3's fragment order, read back

Chapter: docs/part6/hopper-attention.md, exercise 12. Difficulty 2 of 4 (a few lines).

Write frag_coords(f, d): where the first value of float4 number f of one 64 x d dQ tile, in step
3's fragment order, belongs. Consumer c's thread t (0..127, warp t // 32, lane t % 32) stores its
register group j (columns 8j.., of the c-th half of d) as float4 number (c * d / 16 + j) * 128 + t;
the float4 holds rows r and r + 8 (r = 16 * warp + lane // 4) at columns col and col + 1
(col = c * d / 2 + 8j + 2 * (lane % 4)). Return (r, col). f outside the tile (f < 0 or
f >= 16 * d) is a ValueError.

Check it:  python -m snippets exercise check part6.hopper-attention.12
"""


def frag_coords(f: int, d: int) -> tuple[int, int]:
    """(row, column) in the 64 x d tile of the first of the four values of float4 number f."""
    raise NotImplementedError("YOUR CODE HERE")
