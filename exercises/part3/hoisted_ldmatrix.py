"""part3.tensor-cores.13: v7's ldmatrix addresses, planned once per lane

Chapter: docs/part3/tensor-cores.md, exercise 13. Difficulty 3 of 4 (think first, then a few lines).

v6 computes every ldmatrix address from scratch: lane l of a warp reads row r of a tile at 16-byte
chunk c, stored at chunk r * per_row + (c ^ (r % 8)) (the XOR swizzle; per_row = 8 for the A tile,
16 for B). v7 plans the addresses once per lane: a base that does not change, plus constants, plus
one XOR with a per-lane term c0. Write c0 and the two planned offsets (in chunks from the tile's
start), so that they equal v6's for every warp, lane, 16-deep step kk and slab; b_offset must also
hold for 64 x 32 warp tiles (wn0 a multiple of 32), exercise 12's question.

Check it:  python -m snippets exercise check part3.tensor-cores.13
(--solution checks the reference solution; exercise show part3.tensor-cores.13 gives the hint)
"""

CA, CB = 8, 16  # 16-byte chunks per row: the A tile (64 halves), the B tile (128 halves)


def lane_c0(lane: int) -> int:
    """The per-lane term: (2 kk + lane // 16) ^ (lane % 8) == (2 kk) ^ lane_c0(lane) for every kk."""
    raise NotImplementedError("YOUR CODE HERE")


def a_offset(wm0: int, lane: int, i: int, kk: int) -> int:
    """Slab i (rows wm0 + 16 i ..) of the A tile at step kk: lane reads row wm0 + 16 i + lane % 16,
    chunk 2 kk + lane // 16."""
    raise NotImplementedError("YOUR CODE HERE")


def b_offset(wn0: int, lane: int, j: int, kk: int) -> int:
    """Columns wn0 + 16 j .. of the B tile at step kk: lane reads row 16 kk + lane % 16, chunk
    (wn0 + 16 j) // 8 + lane // 16."""
    raise NotImplementedError("YOUR CODE HERE")
