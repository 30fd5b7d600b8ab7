"""part6.tv-layouts.2: The B fragment of mma.m16n8k16 as a TV layout

Chapter: docs/part6/tv-layouts.md, exercise 2. Difficulty 1 of 4 (fill one line).

Write b_fragment(): the B operand's fragment of mma.m16n8k16 (B is 16 x 8, K x N) as a TV layout
over the column-major 16 x 8 tile, where element (k, n) is position k + 16 n. Lane l holds four
values of column l / 4: value v sits at row 2 (l % 4) + (v & 1) + 8 (v >> 1). Mode 0 of the
layout is the lane (32 of them), mode 1 the value (4); build it with make_layout(shape, stride).

Check it:  python -m snippets exercise check part6.tv-layouts.2
"""

from snippets.part6.layout import Layout, make_layout  # noqa: F401 (make_layout: build the layout)


def b_fragment() -> Layout:
    """(lane, value) -> position k + 16 n of the element of B that the lane holds as that value."""
    raise NotImplementedError("YOUR CODE HERE")
