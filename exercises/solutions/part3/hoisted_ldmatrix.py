"""part3.tensor-cores.13: v7's ldmatrix addresses, planned once per lane

The reference solution.

Chapter: docs/part3/tensor-cores.md, exercise 13. Difficulty 3 of 4 (think first, then a few lines).

v6 computes every ldmatrix address from scratch: lane l of a warp reads row r of a tile at 16-byte
chunk c, stored at chunk r * per_row + (c ^ (r % 8)) (the XOR swizzle; per_row = 8 for the A tile,
16 for B). v7 plans the addresses once per lane: a base that does not change, plus constants, plus
one XOR with a per-lane term c0. Write c0 and the two planned offsets (in chunks from the tile's
start), so that they equal v6's for every warp, lane, 16-deep step kk and slab; b_offset must also
hold for 64 x 32 warp tiles (wn0 a multiple of 32), exercise 12's question.

Check it:  python -m snippets exercise check part3.tensor-cores.13
"""

CA, CB = 8, 16  # 16-byte chunks per row: the A tile (64 halves), the B tile (128 halves)


def lane_c0(lane: int) -> int:
    """The per-lane term: (2 kk + lane // 16) ^ (lane % 8) == (2 kk) ^ lane_c0(lane) for every kk."""
    return (lane // 16) ^ (lane % 8)


def a_offset(wm0: int, lane: int, i: int, kk: int) -> int:
    """Slab i (rows wm0 + 16 i ..) of the A tile at step kk: lane reads row wm0 + 16 i + lane % 16,
    chunk 2 kk + lane // 16."""
    return (wm0 + lane % 16) * CA + i * 16 * CA + ((2 * kk) ^ lane_c0(lane))


def b_offset(wn0: int, lane: int, j: int, kk: int) -> int:
    """Columns wn0 + 16 j .. of the B tile at step kk: lane reads row 16 kk + lane % 16, chunk
    (wn0 + 16 j) // 8 + lane // 16."""
    group, within = (wn0 // 8) & ~7, (wn0 // 8) & 7  # the 128-byte line, and the chunk in it
    return (lane % 16) * CB + kk * 16 * CB + group + (within ^ (2 * j) ^ lane_c0(lane))
