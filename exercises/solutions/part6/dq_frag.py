"""part6.hopper-attention.12: Step 3's fragment order, read back

The reference solution.

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
    if not 0 <= f < 16 * d:
        raise ValueError(f"float4 {f} is outside a 64 x {d} tile ({16 * d} float4s)")
    t, group = f % 128, f // 128  # the storing thread; its consumer's group c * d / 16 + j
    row = 16 * (t // 32) + (t % 32) // 4
    col = 8 * group + 2 * (t % 4)  # c * d / 2 + 8j = 8 * (c * d / 16 + j)
    return row, col
