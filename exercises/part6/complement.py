"""part6.layout-algebra.5: Complement of a flat layout

Chapter: docs/part6/layout-algebra.md, exercise 5. Difficulty 3 of 4 (write most of it).

Write complement(shape, stride, cotarget): the layout of the offsets in [0, cotarget) that the flat
layout shape:stride leaves out. Drop the modes of size 1 or stride 0, sort the rest by stride and
walk them keeping `covered`, the span the modes so far tile with their holes filled: before a mode
of stride d the complement gets a mode (d // covered):covered, and covered becomes d * size. A
last mode ceil(cotarget / covered):covered repeats everything up to the cotarget (the whole span
when cotarget is None). Raise ValueError when a stride falls inside the span already covered (the
modes overlap). Return the result coalesced.

Check it:  python -m snippets exercise check part6.layout-algebra.5
"""


def coalesce(shapes: list[int], strides: list[int]):
    """The flat layout shapes:strides with modes of size 1 dropped and neighbours merged, as
    (shape, stride): ints for one mode, (1, 0) for none."""
    out: list[tuple[int, int]] = []
    for s, d in zip(shapes, strides):
        if s == 1:
            continue
        if out and out[-1][0] * out[-1][1] == d:
            out[-1] = (out[-1][0] * s, out[-1][1])
        else:
            out.append((s, d))
    if not out:
        return 1, 0
    if len(out) == 1:
        return out[0]
    return tuple(s for s, _ in out), tuple(d for _, d in out)


def complement(shape, stride, cotarget=None):
    """The complement of the flat layout ``shape:stride`` up to ``cotarget``, as (shape, stride)."""
    raise NotImplementedError("YOUR CODE HERE")
