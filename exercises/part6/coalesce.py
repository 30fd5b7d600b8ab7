"""part6.layout-algebra.4: Coalesce

Chapter: docs/part6/layout-algebra.md, exercise 4. Difficulty 3 of 4 (write most of it).

Write coalesce(shape, stride): the layout with the fewest modes that is the same function of the
1-D coordinate. Flatten the modes, drop those of size 1, merge a mode into the previous one when
the previous shape times its stride equals this stride. Return ints for a single mode, (1, 0) when
nothing is left, and flat tuples otherwise.

Check it:  python -m snippets exercise check part6.layout-algebra.4
"""


def flatten(shape, stride) -> list[tuple[int, int]]:
    """(shape, stride) of every leaf mode, in order."""
    if isinstance(shape, int):
        return [(shape, stride)]
    return [leaf for s, d in zip(shape, stride) for leaf in flatten(s, d)]


def coalesce(shape, stride):
    """The coalesced layout of ``shape:stride`` as (shape, stride)."""
    raise NotImplementedError("YOUR CODE HERE")
