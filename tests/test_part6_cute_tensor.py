"""The CuTe GEMM chapter's tour of ``cute::Tensor`` (csrc/cute/tensor_tour.cu), on the CPU.

The program makes tensors over a host array holding 0, 1, ..., 95 (an 8 x 12 matrix), tiles one
with ``local_tile`` and partitions a tile over a 2 x 2 layout of threads with ``local_partition``,
and prints every element it gets: its coordinate in the matrix and the value stored there, which
is its offset in the array. Everything it prints is checked against the book's own layout algebra
(snippets/part6/layout.py), the Python the chapters of Part 6 teach:

- a tensor's elements are its layout's offsets, row by row;
- ``local_tile(A, tiler, coord)`` is ``zipped_divide(A, tiler)`` with its second mode (which tile)
  fixed at ``coord``: the layout is the first mode, the tile starts at the second mode's offset;
- ``local_partition(T, threads, t)`` is ``zipped_divide(T, shape(threads))`` with its *first*
  mode fixed at thread ``t``'s coordinate, which is ``left_inverse(threads)(t)``;
- the coordinates come from an identity tensor cut up the same way: in the algebra, the compact
  column-major layout of the matrix, whose offset k is the coordinate (k % M, k // M);

and, independently of the algebra, against the index expressions of Part 3 (tile (p, q) holds rows
4p + i and columns 4q + j; thread (ty, tx) holds every second row and column of the tile, from
its row ty and column tx).

The checks run on the output the chapter shows (docs/part6/tensor_tour.out.txt, included there)
and, where ``nvcc`` and CuTe's headers are available, on what the program prints now, which must
also be that file, byte for byte: the page cannot show an output the program no longer prints.
CuTe's headers come from the ``nvidia-cutlass`` wheel, as for tests/test_part6_layout.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import run_cute_host_program

from snippets.part6.layout import (
    Layout,
    bundle,
    flatten,
    left_inverse,
    make_layout,
    make_layout_row_major,
    zipped_divide,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
SRC = REPO_ROOT / "csrc" / "cute" / "tensor_tour.cu"
OUTPUT = REPO_ROOT / "docs" / "part6" / "tensor_tour.out.txt"  # what the chapter shows
CHAPTER = REPO_ROOT / "docs" / "part6" / "cute-gemm.md"
BUILD = REPO_ROOT / "build" / "cute"
REGENERATE = (f"nvcc -std=c++17 -I<cutlass include> -o tensor_tour {SRC.relative_to(REPO_ROOT)}"
              f" && ./tensor_tour > {OUTPUT.relative_to(REPO_ROOT)}")

# What the program does, in the algebra's terms.
M, N = 8, 12
ROW_MAJOR = make_layout((M, N), (N, 1))                       # A
COL_MAJOR = make_layout((M, N))                               # B, and the identity tensor
BLOCKED = make_layout(((4, 2), (4, 3)), ((1, 16), (4, 32)))   # H
TILER = (4, 4)
TILE = (1, 2)                                                 # tile row 1, tile column 2
THREADS = make_layout_row_major((2, 2))                       # (2,2):(2,1)


# ------------------------------------------------------------------ the program's output


@dataclass(frozen=True)
class Block:
    """One ``== name: layout at offset N`` block: the layout without the underscores of static
    integers, the offset of its first element in the array, and its rows if it is a matrix
    (values, or (row, col, value) triples)."""

    layout: str
    offset: int
    rows: tuple


HEADER = re.compile(r"== (?P<name>.+): (?P<layout>[^ ]+) at offset (?P<offset>\d+)")
CELL = re.compile(r"\((\d+),(\d+)\)=(\d+)")
DEPTH = re.compile(r"A\(5,6\) = (\d+), B\(5,6\) = (\d+), H\(5,6\) = (\d+), "
                   r"H\(\(1,1\),\(2,1\)\) = (\d+)")


def parse(text: str) -> tuple[dict[str, Block], tuple[int, ...]]:
    """The blocks of the program's output by name, and the four values of its line on
    coordinates at any depth. Every line must be one of the three kinds the program prints."""
    blocks: dict[str, dict] = {}
    depth: tuple[int, ...] = ()
    current = None
    for n, line in enumerate(text.splitlines(), 1):
        if not line:
            current = None
        elif m := HEADER.fullmatch(line):
            assert m["name"] not in blocks, f"line {n}: a second block {m['name']!r}"
            current = blocks[m["name"]] = {"layout": m["layout"].replace("_", ""),
                                          "offset": int(m["offset"]), "rows": []}
        elif m := DEPTH.fullmatch(line):
            depth = tuple(int(x) for x in m.groups())
        elif current is not None and re.fullmatch(r"( *\d+)+", line):
            current["rows"].append(tuple(int(x) for x in line.split()))
        elif current is not None and CELL.sub("", line).strip() == "":
            current["rows"].append(tuple(tuple(map(int, c)) for c in CELL.findall(line)))
        else:
            raise AssertionError(f"line {n} is not what the program prints: {line!r}")
    return {k: Block(b["layout"], b["offset"], tuple(b["rows"])) for k, b in blocks.items()}, depth


# ------------------------------------------------------------------ the same, from the algebra


def tile_of(layout: Layout, base: int = 0) -> tuple[Layout, int]:
    """``local_tile(tensor, TILER, TILE)``: divide into tiles, keep the tile mode, fix the rest
    mode (which tile) at TILE; the tile starts where the rest mode puts it."""
    divided = zipped_divide(layout, TILER)                    # ((4,4), (2,3))
    return divided[0], base + divided[1](TILE)


def share_of(layout: Layout, base: int, t: int) -> tuple[Layout, int]:
    """``local_partition(tile, THREADS, t)``: divide by the thread layout's shape, fix the tile
    mode at thread t's coordinate (the 1-D coordinate the thread layout maps to t), keep the
    rest mode: one element of every 2 x 2 sub-tile."""
    divided = zipped_divide(layout, THREADS.shape)            # ((2,2), (2,2))
    return divided[1], base + divided[0](left_inverse(THREADS)(t))


def cells(view: tuple[Layout, int], coords: tuple[Layout, int]) -> tuple:
    """Rows of (row, col, value): the view's values, with the coordinates that the same view of
    the identity tensor (the column-major layout, offset k being (k % M, k // M)) gives."""
    (layout, base), (where, start) = view, coords
    rows = []
    for i in range(layout[0].size):
        row = []
        for j in range(layout[1].size):
            k = start + where((i, j))
            row.append((k % M, k // M, base + layout((i, j))))
        rows.append(tuple(row))
    return tuple(rows)


def expected() -> dict[str, Block]:
    """Every block the program prints, computed with the book's layout algebra."""
    out = {}
    for name, layout in (("A, row-major", ROW_MAJOR), ("B, column-major", COL_MAJOR),
                         ("H, blocked", BLOCKED)):
        values = tuple(tuple(layout((i, j)) for j in range(N)) for i in range(M))
        out[name] = Block(repr(layout), 0, values)
    divided = zipped_divide(ROW_MAJOR, TILER)                 # ((4,4), (2,3))
    every_tile = flatten(divided)                             # (4,4,2,3): the modes unpacked
    out["zipped_divide(A, (4,4))"] = Block(repr(divided), 0, ())
    out["local_tile(A, (4,4), (_,_))"] = Block(repr(every_tile), 0, ())
    # slicing with _ keeps modes 0 and 1; the others, fixed, move the start
    out["all(_,_,1,2)"] = Block(repr(bundle(every_tile[0], every_tile[1])),
                                every_tile((0, 0, *TILE)), ())
    identity_tile = tile_of(COL_MAJOR)
    for tensor, layout in (("A", ROW_MAJOR), ("H", BLOCKED)):
        tile = tile_of(layout)
        out[f"local_tile({tensor}, (4,4), (1,2))"] = Block(repr(tile[0]), tile[1],
                                                           cells(tile, identity_tile))
    tile = tile_of(ROW_MAJOR)
    for t in range(THREADS.size):
        share = share_of(*tile, t)
        out[f"local_partition(T, threads, {t})"] = Block(repr(share[0]), share[1],
                                                         cells(share, share_of(*identity_tile, t)))
    return out


def check(text: str) -> None:
    blocks, depth = parse(text)
    want = expected()
    # as sets: the order is the committed file's business, and a block printed under another's
    # name must fail on its contents
    assert set(blocks) == set(want), "the program prints other blocks than the test expects"
    for name, block in want.items():
        assert blocks[name] == block, f"block {name!r}: printed {blocks[name]}, algebra {block}"
    assert depth == (ROW_MAJOR((5, 6)), COL_MAJOR((5, 6)), BLOCKED((5, 6)),
                     BLOCKED(((1, 1), (2, 1))))
    assert depth[2] == depth[3]  # the same element, at two depths

    # Part 3's index expressions, without the algebra. A holds r * N + c at (r, c).
    p, q = TILE
    tile = blocks["local_tile(A, (4,4), (1,2))"].rows
    assert [[(r, c) for r, c, _ in row] for row in tile] == \
        [[(4 * p + i, 4 * q + j) for j in range(4)] for i in range(4)]
    assert all(v == r * N + c for row in tile for r, c, v in row)
    assert blocks["all(_,_,1,2)"] == Block(blocks["local_tile(A, (4,4), (1,2))"].layout,
                                           blocks["local_tile(A, (4,4), (1,2))"].offset, ())
    tile_h = blocks["local_tile(H, (4,4), (1,2))"].rows
    assert [[(r, c) for r, c, _ in row] for row in tile_h] == [[(r, c) for r, c, _ in row]
                                                               for row in tile]
    assert sorted(v for row in tile_h for _, _, v in row) == list(range(80, 96))  # contiguous
    owners = {}
    for t in range(4):
        ty, tx = divmod(t, 2)  # the row-major thread layout (2,2):(2,1)
        share = blocks[f"local_partition(T, threads, {t})"].rows
        assert [[(r, c) for r, c, _ in row] for row in share] == \
            [[(4 * p + ty + 2 * i, 4 * q + tx + 2 * j) for j in range(2)] for i in range(2)]
        assert all(v == r * N + c for row in share for r, c, v in row)
        owners.update({(r, c): t for row in share for r, c, _ in row})
    assert sorted(owners) == sorted((r, c) for row in tile for r, c, _ in row)  # each once


# ------------------------------------------------------------------ building and running it


@pytest.fixture(scope="module")
def printed() -> str:
    """What the program prints, built once per version of its source and of the headers."""
    return run_cute_host_program(SRC, BUILD)


def test_shown_output_follows_the_algebra():
    """The output the chapter shows: every element and every owner is where the algebra says."""
    check(OUTPUT.read_text())


@pytest.mark.slow
def test_program_follows_the_algebra(printed):
    check(printed)


@pytest.mark.slow
def test_shown_output_is_what_the_program_prints(printed):
    assert printed == OUTPUT.read_text(), (
        f"{OUTPUT.relative_to(REPO_ROOT)} is not what the program prints now; regenerate it:\n"
        f"{REGENERATE}")


def test_chapter_shows_whole_groups():
    """The chapter shows the output in three pieces, by line numbers: they must be the three
    groups the program prints (separated by blank lines), so that a change of the output cannot
    leave a piece cut in the middle of a block."""
    lines = OUTPUT.read_text().split("\n")[:-1]
    groups, first = [], 1
    for n, line in enumerate(lines + [""], 1):
        if not line:
            groups.append((first, n - 1))
            first = n + 1
    include = r'--8<-- "docs/part6/tensor_tour\.out\.txt:(\d+):(\d+)"'
    shown = re.findall(include, CHAPTER.read_text())
    assert [(int(a), int(b)) for a, b in shown] == groups


def swap(text: str, first: str, second: str) -> str:
    """``text`` with the names of two blocks exchanged: each block's contents under the other's
    name, as a program with the two confused would print them."""
    first, second = f"== {first}: ", f"== {second}: "
    return text.replace(first, "\0").replace(second, first).replace("\0", second)


@pytest.mark.parametrize("first,second", [
    ("A, row-major", "B, column-major"),            # row-major and column-major confused
    ("local_tile(A, (4,4), (1,2))", "local_tile(H, (4,4), (1,2))"),  # the tile of another layout
    ("local_partition(T, threads, 1)", "local_partition(T, threads, 2)"),  # column-major threads
    ("local_partition(T, threads, 0)", "local_partition(T, threads, 3)"),
])
def test_checks_catch_confusions(first, second):
    """The checks are not vacuous: the shown output with two blocks confused fails them."""
    with pytest.raises(AssertionError):
        check(swap(OUTPUT.read_text(), first, second))
