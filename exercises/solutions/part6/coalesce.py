"""part6.layout-algebra.4: Coalesce

The reference solution.

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
    modes: list[tuple[int, int]] = []
    for s, d in flatten(shape, stride):
        if s == 1:  # a mode of size 1 contributes nothing
            continue
        if modes and modes[-1][0] * modes[-1][1] == d:  # continues where the previous mode ends
            modes[-1] = (modes[-1][0] * s, modes[-1][1])
        else:
            modes.append((s, d))
    if not modes:
        return 1, 0
    if len(modes) == 1:
        return modes[0]
    return tuple(s for s, _ in modes), tuple(d for _, d in modes)
