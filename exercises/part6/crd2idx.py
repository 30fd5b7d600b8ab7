"""part6.layouts.4: Coordinate to index, at any depth

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
    raise NotImplementedError("YOUR CODE HERE")
