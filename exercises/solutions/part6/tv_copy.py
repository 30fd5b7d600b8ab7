"""part6.tv-layouts.1: The TV layout of a tiled copy

The reference solution.

Chapter: docs/part6/tv-layouts.md, exercise 1. Difficulty 1 of 4 (fill one line).

Write copy_tv(): the TV layout of a tiled copy in which 32 threads each load 4 consecutive floats
of one row of an 8 x 16 row-major tile, the threads going along the row first, then down the rows:
thread t takes row t / 4, columns 4 (t % 4) to 4 (t % 4) + 3, and its value v is column
4 (t % 4) + v. Positions are those of the column-major 8 x 16 tile, as everywhere in the algebra:
element (r, c) is position r + 8 c (the row-major memory comes in by composition). Mode 0 of the
layout is the thread (32 of them), mode 1 the value (4); build it with make_layout(shape, stride).

Check it:  python -m snippets exercise check part6.tv-layouts.1
"""

from snippets.part6.layout import Layout, make_layout


def copy_tv() -> Layout:
    """(thread, value) -> position r + 8 c of the element the thread loads as that value."""
    # thread t = t0 + 4 t1: t0 = t % 4 picks the group of 4 columns (4 * 8 positions),
    # t1 = t / 4 the row (+1); value v adds a column (+8)
    return make_layout(((4, 8), 4), ((32, 1), 8))
