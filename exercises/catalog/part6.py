"""Part 6's exercises: layouts as functions, coalesce, swizzles (all Python, checked on a CPU)."""

from __future__ import annotations

import math
import random

from exercises import compare
from exercises.engine import Exercise, Run


def _random_layout(rng: random.Random, depth: int = 2):
    """A (shape, stride) pair of up to 3 modes, nested up to ``depth``."""
    if depth == 0 or rng.random() < 0.5:
        return rng.randint(1, 5), rng.choice([0, 1, 2, 3, 4, 8, 16, 32])
    modes = [_random_layout(rng, depth - 1) for _ in range(rng.randint(1, 3))]
    return tuple(m[0] for m in modes), tuple(m[1] for m in modes)


def _coords(shape, rng: random.Random, k: int):
    """``k`` coordinates of ``shape``: 1-D ints, and congruent tuples at the top level."""

    def size(s):
        return s if isinstance(s, int) else math.prod(size(x) for x in s)

    out = [rng.randrange(size(shape)) for _ in range(k)]
    if not isinstance(shape, int):
        out += [tuple(rng.randrange(size(s)) for s in shape) for _ in range(k)]
    return out


# ------------------------------------------------------------------------------------------- layouts.4
def _check_crd2idx(run: Run) -> None:
    mine, ref = run.module(), run.solution()
    fixed = [
        (5, (4, 8), (1, 4)),
        ((1, 2), (4, 8), (8, 1)),
        ((5, 6), ((4, 2), (4, 2)), ((1, 16), (4, 32))),
        (((1, 1), (2, 1)), ((4, 2), (4, 2)), ((1, 16), (4, 32))),
        (3, 8, 32),
    ]
    with run.case(
        "the chapter's layouts",
        hint="a 1-D coordinate is split colexicographically: the first "
        "mode takes coord % size(mode 0), the rest goes on with coord // size(mode 0)",
    ):
        compare.functions("crd2idx", getattr(mine, "crd2idx", None), ref.crd2idx, fixed)
    rng = random.Random(61)
    cases = []
    for _ in range(300):
        shape, stride = _random_layout(rng)
        cases += [(c, shape, stride) for c in _coords(shape, rng, 2)]
    with run.case(
        f"{len(cases)} random coordinates of random nested layouts",
        hint="an int entry for a nested mode is itself a 1-D coordinate of that mode: recurse",
    ):
        compare.functions("crd2idx", getattr(mine, "crd2idx", None), ref.crd2idx, cases)


crd2idx = Exercise(
    id="part6.layouts.4",
    title="Coordinate to index, at any depth",
    difficulty=2,
    kind="model",
    files=("part6/crd2idx.py",),
    task="Write crd2idx(coord, shape, stride): the offset a layout shape:stride gives a coordinate. The "
    "coordinate may be an int (a 1-D coordinate, counted colexicographically over the whole shape) or a tuple "
    "congruent with the shape whose entries are ints or tuples (an int entry for a nested mode is a 1-D "
    "coordinate of that mode).",
    hint="three cases: an int shape (coord * stride); an int coordinate of a tuple shape (split it over the "
    "modes, first mode fastest); a tuple coordinate (the sum over the modes)",
    check=_check_crd2idx,
    planted={"row_major_split": "crd2idx(5, (4, 8), (1, 4))"},
)


# -------------------------------------------------------------------------------------- layout-algebra.4
def _check_coalesce(run: Run) -> None:
    mine, ref = run.module(), run.solution()
    fixed = [
        ((2, (1, 6)), (1, (6, 2))),
        ((4, 8), (8, 1)),
        (((2, 4), (3, 2)), ((1, 2), (8, 24))),
        ((1, 1), (3, 5)),
        ((4, 1, 2), (1, 7, 4)),
        (8, 2),
    ]
    with run.case(
        "the chapter's layouts",
        hint="merge when the previous mode's shape x stride equals this "
        "mode's stride; drop modes of size 1",
    ):
        compare.functions("coalesce", getattr(mine, "coalesce", None), ref.coalesce, fixed)
    rng = random.Random(62)
    cases = [_random_layout(rng) for _ in range(500)]
    with run.case(
        f"{len(cases)} random nested layouts",
        hint="flatten first; a layout with no mode left is (1, 0); one mode is a pair of ints",
    ):
        compare.functions("coalesce", getattr(mine, "coalesce", None), ref.coalesce, cases)


coalesce = Exercise(
    id="part6.layout-algebra.4",
    title="Coalesce",
    difficulty=3,
    kind="model",
    files=("part6/coalesce.py",),
    task="Write coalesce(shape, stride): the layout with the fewest modes that is the same function of the 1-D "
    "coordinate. Flatten the modes, drop those of size 1, merge a mode into the previous one when the "
    "previous shape times its stride equals this stride. Return ints for a single mode, (1, 0) when nothing "
    "is left, and flat tuples otherwise.",
    hint="walk the flattened modes once, keeping a list of (shape, stride): extend the last entry or append",
    check=_check_coalesce,
    planted={
        "keeps_size_one": "coalesce((2, (1, 6)), (1, (6, 2)))",
        "merges_wrong": "coalesce((2, (1, 6)), (1, (6, 2)))",
    },
)


# --------------------------------------------------------------------------------------------- swizzles.3
def _check_swizzle(run: Run) -> None:
    mine, ref = run.module(), run.solution()
    with run.case(
        "Swizzle<3,4,3> on the first 1024 byte offsets (Hopper's 128-byte swizzle)",
        hint="bits 7-9 (the row modulo 8) are XOR-ed into bits 4-6 (the 16-byte chunk)",
    ):
        compare.functions(
            "swizzle",
            getattr(mine, "swizzle", None),
            ref.swizzle,
            [(o, 3, 4, 3) for o in range(1024)],
        )
    cases = [
        (o, b, m, s)
        for b, m, s in ((2, 4, 3), (3, 3, 3), (1, 0, 5), (2, 2, -2), (3, 4, 4))
        for o in range(512)
    ]
    with run.case(
        "other swizzles, a negative shift among them",
        hint="for a negative S the read bits start at M and are shifted left by -S",
    ):
        compare.functions("swizzle", getattr(mine, "swizzle", None), ref.swizzle, cases)


swizzle = Exercise(
    id="part6.swizzles.3",
    title="The swizzle function",
    difficulty=1,
    kind="model",
    files=("part6/swizzle.py",),
    task="Write swizzle(offset, bits, base, shift), CuTe's Swizzle<B, M, S> on an offset: XOR the B bits that "
    "start at bit M + S into the B bits that start at bit M (for a negative S, the B bits at M into those at "
    "M - S). The lowest M bits never change.",
    hint="mask = ((1 << B) - 1) << (M + max(0, S)); offset ^ ((offset & mask) >> S)",
    check=_check_swizzle,
    planted={"wrong_mask": "swizzle(16, 3, 4, 3)"},
)

EXERCISES = [crd2idx, coalesce, swizzle]
