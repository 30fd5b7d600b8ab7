"""Pictures of Part 6's layouts, drawn from the book's own layout algebra
(snippets/part6/layout.py), the way CuTe's ``print_latex`` draws them: the reader looks at the
function instead of reading it.

    <!-- bench:diagram layout shape=(4,8) stride=(8,1) -->
        the index each coordinate of a rank-2 layout maps to (row = mode 0, column = mode 1)
    <!-- bench:diagram tv shape=((4,8),(2,2)) stride=((32,1),(16,8)) tile=(16,8) -->
        a thread-value layout: which thread, and which of its values, owns each element of a tile
    <!-- bench:diagram swizzle bits=3 base=4 shift=3 -->
        128-byte rows of 16-byte chunks, before and after the swizzle: the chunk each one lands in

Every number in a cell is computed by calling the layout, so a picture cannot disagree with the
code; tests/test_diagrams.py reads the cells' ``data-*`` attributes back and checks them against it.
"""

from __future__ import annotations

import ast
import re

from snippets.part6.layout import Layout, Swizzle, make_layout
from snippets.site.diagrams import BLUE, FONT, GREEN, GREY, ORANGE, PURPLE, RED, SMALL, Svg, figure

# one tint per thread, cycling: eight are enough to tell neighbours apart
TINTS = (BLUE, ORANGE, GREEN, RED, PURPLE, "#8c564b", "#e377c2", "#17becf")
CELL = 34  # px


def parse_tuple(text: str, name: str):
    """``(4,(2,2))`` -> (4, (2, 2)); an int stays an int. Raises ValueError naming the argument."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise ValueError(f"{name}= takes an int or a nested tuple of ints, got {text!r}") from None

    def ok(v) -> bool:
        return isinstance(v, int) or (isinstance(v, tuple) and len(v) > 0 and all(map(ok, v)))

    if not ok(value):
        raise ValueError(f"{name}= takes an int or a nested tuple of ints, got {text!r}")
    return value


def _key(kind: str, *parts) -> str:
    """An id-safe key for a figure (its marker and pattern ids are built from it)."""
    return re.sub(r"[^A-Za-z0-9]+", "-", f"{kind}-{'-'.join(map(str, parts))}").strip("-")


def _rank2(layout: Layout) -> tuple[int, int]:
    """Rows and columns of the grid a layout is drawn on: the sizes of its two modes (a rank-1
    layout is one row)."""
    if isinstance(layout.shape, int) or len(layout.shape) == 1:
        return 1, layout.size
    if len(layout.shape) != 2:
        raise ValueError(f"a layout picture needs a rank-1 or rank-2 layout, got {layout}")
    return layout[0].size, layout[1].size


def layout_cells(layout: Layout) -> list[tuple[int, int, int]]:
    """(row, column, index) of every coordinate of a rank-2 layout."""
    rows, cols = _rank2(layout)
    if rows == 1 and (isinstance(layout.shape, int) or len(layout.shape) == 1):
        return [(0, j, layout(j)) for j in range(cols)]
    return [(i, j, layout((i, j))) for i in range(rows) for j in range(cols)]


def draw_layout(layout: Layout) -> str:
    cells = layout_cells(layout)
    rows, cols = _rank2(layout)
    if rows * cols > 512:
        raise ValueError(f"{layout} has {rows * cols} elements: draw one of at most 512")
    x0, y0 = 36, 34
    svg = Svg(x0 + cols * CELL + 12, y0 + rows * CELL + 12, _key("layout", layout))
    for j in range(cols):
        svg.text(x0 + j * CELL + CELL / 2, y0 - 12, str(j), size=SMALL, anchor="middle")
    for i in range(rows):
        svg.text(x0 - 8, y0 + i * CELL + CELL / 2, str(i), size=SMALL, anchor="end")
    span = max(1, layout.cosize)
    for i, j, idx in cells:
        x, y = x0 + j * CELL, y0 + i * CELL
        # the tint darkens with the index, so runs of consecutive indices show as bands
        svg.rect(
            x,
            y,
            CELL,
            CELL,
            fill=BLUE,
            opacity=round(0.08 + 0.4 * idx / span, 3),
            stroke=GREY,
            role="cell",
            row=i,
            col=j,
            index=idx,
        )
        svg.text(x + CELL / 2, y + CELL / 2, str(idx), size=SMALL, anchor="middle")
    label = (
        f"The layout {layout} drawn as a {rows} by {cols} grid: the cell in row i, column j "
        f"holds the index the layout maps coordinate (i, j) to."
    )
    return figure(
        svg.render(label),
        f"The layout {layout}: each cell holds the index of its coordinate "
        "(row = mode 0, column = mode 1)",
    )


def tv_cells(tv: Layout, tile: tuple[int, int]) -> dict[tuple[int, int], tuple[int, int]]:
    """{(row, column) of the tile: (thread, value)} for a thread-value layout whose indices are
    column-major positions in a ``tile`` (rows, columns). Raises if two (thread, value) pairs claim
    one element or an index falls outside the tile."""
    rows, cols = tile
    threads, values = tv[0].size, tv[1].size
    owner: dict[tuple[int, int], tuple[int, int]] = {}
    for t in range(threads):
        for v in range(values):
            idx = tv((t, v))
            if not 0 <= idx < rows * cols:
                raise ValueError(
                    f"{tv}: thread {t} value {v} maps to {idx}, outside the {rows}x{cols} tile"
                )
            cell = (idx % rows, idx // rows)
            if cell in owner:
                raise ValueError(
                    f"{tv}: element {cell} is owned twice: by {owner[cell]} and {(t, v)}"
                )
            owner[cell] = (t, v)
    return owner


def draw_tv(tv: Layout, tile: tuple[int, int]) -> str:
    rows, cols = tile
    if rows * cols > 512:
        raise ValueError(f"a {rows}x{cols} tile: draw one of at most 512 elements")
    owner = tv_cells(tv, tile)
    x0, y0, w = 36, 34, CELL + 8
    svg = Svg(x0 + cols * w + 12, y0 + rows * CELL + 12, _key("tv", tv, tile))
    for j in range(cols):
        svg.text(x0 + j * w + w / 2, y0 - 12, str(j), size=SMALL, anchor="middle")
    for i in range(rows):
        svg.text(x0 - 8, y0 + i * CELL + CELL / 2, str(i), size=SMALL, anchor="end")
    for i in range(rows):
        for j in range(cols):
            x, y = x0 + j * w, y0 + i * CELL
            if (i, j) not in owner:
                svg.rect(
                    x, y, w, CELL, fill="none", stroke=GREY, dash="3 2", role="cell", row=i, col=j
                )
                continue
            t, v = owner[(i, j)]
            svg.rect(
                x,
                y,
                w,
                CELL,
                fill=TINTS[t % len(TINTS)],
                opacity=0.3,
                stroke=GREY,
                role="cell",
                row=i,
                col=j,
                thread=t,
                value=v,
            )
            svg.text(x + w / 2, y + CELL / 2 - 6, f"T{t}", size=SMALL, anchor="middle")
            svg.text(x + w / 2, y + CELL / 2 + 7, f"V{v}", size=SMALL, anchor="middle")
    label = (
        f"The thread-value layout {tv} over a {rows} by {cols} tile: each element is labelled "
        f"with the thread T that owns it and the index V of that value among the thread's "
        f"{tv[1].size}; threads are tinted in turn."
    )
    return figure(
        svg.render(label), f"{tv} over a {rows}x{cols} tile: thread and value of each element"
    )


def swizzle_chunks(
    sw: Swizzle, rows: int = 8, chunk: int = 16, row_bytes: int = 128
) -> list[tuple[int, int, int]]:
    """(row, chunk, chunk after the swizzle) for every 16-byte chunk of ``rows`` rows of
    ``row_bytes``: the swizzle applied to the chunk's byte offset."""
    out = []
    for r in range(rows):
        for c in range(row_bytes // chunk):
            off = sw(r * row_bytes + c * chunk)
            if off // row_bytes != r:
                raise ValueError(f"{sw} moves byte {r * row_bytes + c * chunk} to another row")
            out.append((r, c, (off % row_bytes) // chunk))
    return out


def draw_swizzle(sw: Swizzle) -> str:
    cells = swizzle_chunks(sw)
    per_row = 8
    x0, y0, gap = 44, 40, 40
    svg = Svg(
        x0 + 2 * per_row * CELL + gap + 12,
        y0 + 8 * CELL + 16,
        _key("swizzle", sw.bits, sw.base, sw.shift),
    )
    for k, title in enumerate(("before", f"after {sw}")):
        svg.text(
            x0 + k * (per_row * CELL + gap) + per_row * CELL / 2,
            12,
            title,
            size=FONT,
            anchor="middle",
        )
        for c in range(per_row):
            svg.text(
                x0 + k * (per_row * CELL + gap) + c * CELL + CELL / 2,
                y0 - 10,
                str(c),
                size=SMALL,
                anchor="middle",
            )
    for r in range(8):
        svg.text(x0 - 8, y0 + r * CELL + CELL / 2, f"row {r}", size=SMALL, anchor="end")
    for r, c, new in cells:
        for k, col in enumerate((c, new)):
            x = x0 + k * (per_row * CELL + gap) + col * CELL
            svg.rect(
                x,
                y0 + r * CELL,
                CELL,
                CELL,
                fill=TINTS[c % len(TINTS)],
                opacity=0.3,
                stroke=GREY,
                role="before" if k == 0 else "after",
                row=r,
                chunk=c,
                lands=new,
            )
            svg.text(x + CELL / 2, y0 + r * CELL + CELL / 2, str(c), size=SMALL, anchor="middle")
    label = (
        f"Eight 128-byte rows of eight 16-byte chunks, before and after {sw}: each chunk keeps "
        f"its tint and number; after the swizzle, the eight chunks numbered c sit in eight "
        f"different columns, one per row."
    )
    return figure(svg.render(label), f"{sw} on 128-byte rows: where each 16-byte chunk lands")


def render(name: str, kw: dict[str, str]) -> str:
    """The ``bench:diagram layout|tv|swizzle ...`` directives."""
    if name == "layout":
        shape = parse_tuple(kw.get("shape", "(4,8)"), "shape")
        stride = parse_tuple(kw["stride"], "stride") if "stride" in kw else None
        return draw_layout(make_layout(shape, stride))
    if name == "tv":
        tv = make_layout(
            parse_tuple(kw.get("shape", "((4,8),(2,2))"), "shape"),
            parse_tuple(kw.get("stride", "((32,1),(16,8))"), "stride"),
        )
        tile = parse_tuple(kw.get("tile", "(16,8)"), "tile")
        if not (
            isinstance(tile, tuple) and len(tile) == 2 and all(isinstance(t, int) for t in tile)
        ):
            raise ValueError(f"tile= takes (rows,columns), got {kw.get('tile')!r}")
        return draw_tv(tv, tile)
    if name == "swizzle":
        bits, base, shift = (int(kw.get(k, d)) for k, d in (("bits", 3), ("base", 4), ("shift", 3)))
        return draw_swizzle(Swizzle(bits, base, shift))
    raise ValueError(f"unknown layout diagram {name!r}")
