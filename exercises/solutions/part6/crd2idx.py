"""part6.layouts.4: Coordinate to index, at any depth

The reference solution.

Chapter: docs/part6/layouts.md, exercise 4. Difficulty 2 of 4 (write a few lines).

Write crd2idx(coord, shape, stride): the offset a layout shape:stride gives a coordinate. The
coordinate may be an int (a 1-D coordinate, counted colexicographically over the whole shape) or a
tuple congruent with the shape whose entries are ints or tuples (an int entry for a nested mode is a
1-D coordinate of that mode).

Check it:  python -m snippets exercise check part6.layouts.4
"""


def size(shape) -> int:
    """The number of coordinates of a (possibly nested) shape."""
    if isinstance(shape, int):
        return shape
    n = 1
    for s in shape:
        n *= size(s)
    return n


def crd2idx(coord, shape, stride) -> int:
    """The offset of ``coord`` in the layout ``shape:stride``."""
    if isinstance(shape, int):  # a single mode: the coordinate is an int below the shape
        return coord * stride
    if isinstance(coord, int):  # a 1-D coordinate: split it colexicographically over the modes
        idx = 0
        for s, d in zip(shape, stride):
            idx += crd2idx(coord % size(s), s, d)
            coord //= size(s)
        return idx
    return sum(crd2idx(c, s, d) for c, s, d in zip(coord, shape, stride))
