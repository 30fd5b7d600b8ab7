"""Explanatory pictures drawn from the book's own parameters: ``bench:diagram``.

A chapter asks for one with a directive on a line of its own, like the measured figures::

    <!-- bench:diagram grid n=20 block=8 -->            a grid of blocks of threads over an array
    <!-- bench:diagram grid n=20 block=8 style=triton --> the same as Triton programs and offsets
    <!-- bench:diagram coalescing strides=1,2,8 -->      a warp's 32 reads at each stride, and the
                                                        32-byte sectors they touch
    <!-- bench:diagram banks col=1 -->                   the bank each lane reads for one column of
                                                        a 32 x 32 tile: plain, padded, swizzled
    <!-- bench:diagram sgemm v5 -->                      an SGEMM step's block, warp and thread tiles
    <!-- bench:diagram online_softmax x=1,2,0.5,7,3,9 block=2 -->
                                                        the (max, sum) state of the online softmax,
                                                        block by block
    <!-- bench:diagram causal_blocks s=384 -->           the key blocks each query block of the
                                                        FlashAttention forward skips, masks or
                                                        computes whole
    <!-- bench:diagram flash_backward s=256 -->          the two passes of its backward
    <!-- bench:diagram layout shape=(4,8) stride=(8,1) -->  Part 6's layouts, thread-value layouts
    <!-- bench:diagram tv ... -->, <!-- bench:diagram swizzle ... -->  and swizzles
                                                        (snippets/site/layouts.py)

Nothing here is typed twice: the numbers come from the modules that run the kernels (the SGEMM
configurations and the template arguments of the CUDA files, the attention kernels' block sizes and
loop bounds, the bank and sector arithmetic of Part 2, the online recurrence of Part 4), so a
picture changes when the code does, and tests/test_diagrams.py checks each against its arithmetic.

Every picture is an inline SVG with ``role="img"``, an ``aria-label`` and a ``<title>`` (its alt
text), inside a ``<figure>`` with a caption. Its marks carry ``data-*`` attributes (the lane, the
bank, the block's class, ...), which the tests read back. The text takes the page's colour (the
``.bench-plot svg text`` rule of extra.css), so every fill behind text is a light tint that reads
on the light and on the dark palette.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from html import escape

# Colours that read on a light and on a dark page (the plots' palette), used as tints.
BLUE, ORANGE, GREEN, RED, PURPLE, GREY = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                          "#888888")
FONT = 12  # px: the size of labels
SMALL = 10  # px: numbers inside cells


# ---------------------------------------------------------------------------------------------- SVG

def _num(v: float) -> str:
    """A coordinate, short: 12, 12.5, 12.25."""
    return f"{v:.2f}".rstrip("0").rstrip(".") if v != int(v) else str(int(v))


def _attrs(d: dict) -> str:
    out = []
    for k, v in d.items():
        if v is None:
            continue
        k = k.rstrip("_").replace("_", "-")
        out.append(f'{k}="{escape(_num(v) if isinstance(v, float) else str(v))}"')
    return " ".join(out)


class Svg:
    """A small SVG writer: rectangles, lines, arrows and text, in pixels."""

    def __init__(self, width: float, height: float, key: str) -> None:
        self.width, self.height, self.key, self.items = width, height, key, []
        self.defs: list[str] = []

    def rect(self, x, y, w, h, *, fill="none", stroke=GREY, opacity=None, dash=None, width=1.0,
             title=None, **data) -> None:
        a = _attrs({"x": float(x), "y": float(y), "width": float(w), "height": float(h),
                    "fill": fill, "fill_opacity": opacity, "stroke": stroke,
                    "stroke_width": float(width), "stroke_dasharray": dash,
                    **{f"data_{k}": v for k, v in data.items()}})
        tip = f"<title>{escape(title)}</title>" if title else ""
        self.items.append(f"<rect {a}>{tip}</rect>" if tip else f"<rect {a}/>")

    def line(self, x1, y1, x2, y2, *, stroke=GREY, width=1.0, dash=None, arrow=False,
             opacity=None, **data) -> None:
        a = _attrs({"x1": float(x1), "y1": float(y1), "x2": float(x2), "y2": float(y2),
                    "stroke": stroke, "stroke_width": float(width), "stroke_dasharray": dash,
                    "stroke_opacity": opacity,
                    "marker_end": f"url(#arrow-{self.key})" if arrow else None,
                    **{f"data_{k}": v for k, v in data.items()}})
        self.items.append(f"<line {a}/>")

    def text(self, x, y, s: str, *, size=FONT, anchor="start", weight=None, italic=False,
             **data) -> None:
        a = _attrs({"x": float(x), "y": float(y), "font_size": size, "text_anchor": anchor,
                    "font_weight": weight, "font_style": "italic" if italic else None,
                    "dominant_baseline": "middle", **{f"data_{k}": v for k, v in data.items()}})
        self.items.append(f"<text {a}>{escape(s)}</text>")

    def hatch(self, colour: str) -> str:
        """A diagonal hatch in ``colour``, defined once per figure; returns the fill to use."""
        name = f"hatch-{len(self.defs)}-{self.key}"
        self.defs.append(f'<pattern id="{name}" width="6" height="6" patternUnits="userSpaceOnUse" '
                         f'patternTransform="rotate(45)"><rect width="6" height="6" '
                         f'fill="{colour}" fill-opacity="0.25"/><line x1="0" y1="0" x2="0" '
                         f'y2="6" stroke="{colour}" stroke-width="2.5"/></pattern>')
        return f"url(#{name})"

    def render(self, label: str) -> str:
        arrow = (f'<marker id="arrow-{self.key}" viewBox="0 0 10 10" refX="9" refY="5" '
                 'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
                 f'<path d="M 0 0 L 10 5 L 0 10 z" fill="{GREY}"/></marker>')
        w, h = math.ceil(self.width), math.ceil(self.height)
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{escape(label)}" '
                f'width="{w}" height="{h}" viewBox="0 0 {w} {h}" class="km-diagram" '
                f'data-diagram="{escape(self.key)}">')
        return "\n".join([head, f"<title>{escape(label)}</title>",
                          "<defs>" + arrow + "".join(self.defs) + "</defs>", *self.items, "</svg>"])


def figure(svg: str, caption: str) -> str:
    """The picture and its caption (HTML: ``caption`` is escaped here, so it is plain text)."""
    return (f'<figure class="bench-plot bench-diagram">\n{svg}\n'
            f"<figcaption>{escape(caption, quote=False)}</figcaption>\n</figure>")


def _ints(text: str, name: str) -> list[int]:
    try:
        out = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise ValueError(f"{name}= takes integers separated by commas, got {text!r}") from None
    if not out:
        raise ValueError(f"{name}= is empty")
    return out


def _int(kw: dict, name: str, default: int, lo: int = 1, hi: int = 1 << 20) -> int:
    v = _ints(kw.get(name, str(default)), name)
    if len(v) != 1 or not lo <= v[0] <= hi:
        raise ValueError(f"{name}= takes one integer in [{lo}, {hi}], got {kw.get(name)!r}")
    return v[0]


# ------------------------------------------------------------------- grid: blocks, threads, indices

@dataclass(frozen=True)
class ThreadSlot:
    block: int
    thread: int
    index: int  # blockIdx.x * blockDim.x + threadIdx.x
    active: bool  # index < n: the bounds check lets it through


def grid_map(n: int, block: int) -> list[ThreadSlot]:
    """Every thread of a 1-D launch over ``n`` elements with ``block`` threads per block:
    cdiv(n, block) blocks, thread t of block b on element b * block + t, active when that is < n."""
    blocks = -(-n // block)
    return [ThreadSlot(b, t, b * block + t, b * block + t < n)
            for b in range(blocks) for t in range(block)]


def draw_grid(n: int, block: int, style: str = "cuda") -> str:
    if style not in ("cuda", "triton"):
        raise ValueError(f"style= takes cuda or triton, got {style!r}")
    if n > 64 or block > 16:
        raise ValueError(f"n={n}, block={block}: at most 64 elements and 16 per block fit a page")
    slots = grid_map(n, block)
    blocks = slots[-1].block + 1
    cw, gap, left, top = 26.0, 14.0, 92.0, 30.0
    width = left + blocks * block * cw + (blocks - 1) * gap + 12
    cuda = style == "cuda"
    svg = Svg(width, 262, f"grid-{style}-{n}-{block}")
    bx = [left + b * (block * cw + gap) for b in range(blocks)]
    svg.text(6, top + 8, "grid", weight="bold")
    svg.text(6, top + 26, f"{blocks} blocks" if cuda else f"{blocks} programs", size=SMALL)
    svg.text(6, top + 52, "threadIdx.x" if cuda else "tl.arange", size=SMALL)
    svg.text(6, top + 86, "i" if cuda else "offs", size=SMALL)
    svg.text(6, top + 170, "x[i]" if cuda else "x[offs]", size=SMALL)
    array_w = width - left - 12
    ew = array_w / n
    for b in range(blocks):
        svg.rect(bx[b] - 4, top, block * cw + 8, 104, stroke=BLUE, width=1.5, fill=BLUE,
                 opacity=0.06, role="block", block=b)
        svg.text(bx[b] + block * cw / 2, top + 14,
                 f"blockIdx.x = {b}" if cuda else f"program_id(0) = {b}", size=SMALL,
                 anchor="middle")
    for s in slots:
        x = bx[s.block] + s.thread * cw
        colour = GREEN if s.active else GREY
        svg.rect(x + 1, top + 40, cw - 2, 24, fill=colour, opacity=0.18 if s.active else 0.05,
                 stroke=colour, dash=None if s.active else "3 2", role="thread", block=s.block,
                 thread=s.thread, index=s.index, active=int(s.active))
        svg.text(x + cw / 2, top + 52, str(s.thread), size=SMALL, anchor="middle")
        svg.text(x + cw / 2, top + 86, str(s.index), size=SMALL, anchor="middle",
                 italic=not s.active)
        if s.active:
            svg.line(x + cw / 2, top + 96, left + (s.index + 0.5) * ew, top + 156, stroke=GREEN,
                     width=1.0, opacity=0.8, role="map", index=s.index)
        else:
            svg.text(x + cw / 2, top + 118, "×", size=FONT, anchor="middle")
    for i in range(n):
        svg.rect(left + i * ew, top + 158, ew, 24, fill=GREEN, opacity=0.12, stroke=GREEN,
                 role="element", index=i)
        svg.text(left + (i + 0.5) * ew, top + 170, str(i), size=SMALL, anchor="middle")
    masked = sum(not s.active for s in slots)
    if cuda:
        formula = "i = blockIdx.x * blockDim.x + threadIdx.x;   if (i < n) ..."
    else:
        formula = "offs = pid * BLOCK + tl.arange(0, BLOCK);   mask = offs < n"
    svg.text(left, top + 202, formula, size=FONT)
    svg.text(left, top + 220, f"n = {n}, {'blockDim.x' if cuda else 'BLOCK'} = {block}: "
             f"{len(slots)} {'threads' if cuda else 'offsets'}, {masked} past the end "
             f"({'they skip the body' if cuda else 'masked off'})", size=SMALL)
    who = "threads" if cuda else "offsets"
    label = (f"A grid of {blocks} {'blocks' if cuda else 'programs'} of {block} {who} over an "
             f"array of {n} elements: {who} map to elements in order, block after block; the "
             f"last {masked} {who} fall past the end and are masked.")
    if cuda:
        caption = (f"A launch of {blocks} blocks of {block} threads over n = {n} elements. Thread "
                   f"t of block b works on element i = b · {block} + t, so consecutive threads "
                   f"touch consecutive elements; the {masked} threads with i ≥ n fail the bounds "
                   "check and do nothing. Blocks in practice hold 128 to 1024 threads, whole "
                   "warps of 32; the arithmetic is the same.")
    else:
        caption = (f"The same launch in Triton: {blocks} programs, each owning a block of "
                   f"BLOCK = {block} offsets, pid · {block} + tl.arange(0, {block}). There are no "
                   f"threads to name: the {masked} offsets past n = {n} are switched off by the "
                   "mask on tl.load and tl.store, and the compiler spreads each block over the "
                   "program's num_warps · 32 threads.")
    return figure(svg.render(label), caption)


# --------------------------------------------------------------------- coalescing: warps and sectors

def warp_bytes(stride: int, lanes: int = 32, itemsize: int = 4) -> list[int]:
    """The byte address each lane reads when lane k reads x[k * stride] (x sector-aligned)."""
    return [k * stride * itemsize for k in range(lanes)]


def draw_coalescing(strides: list[int], lanes: int = 32, itemsize: int = 4) -> str:
    from snippets.part2.coalescing import SECTOR, sectors_touched

    if any(s < 1 or s > 16 for s in strides) or len(strides) > 4:
        raise ValueError(f"strides= takes up to 4 strides from 1 to 16, got {strides}")
    cw, left, top, panel = 18.0, 70.0, 8.0, 132.0
    span = lanes * max(strides) * itemsize  # bytes drawn: the widest access
    bw = lanes * cw / span  # pixels per byte
    width = left + lanes * cw + 14
    svg = Svg(width, top + panel * len(strides) + 4, f"coalescing-{'-'.join(map(str, strides))}")
    for p, stride in enumerate(strides):
        y = top + p * panel
        addr = warp_bytes(stride, lanes, itemsize)
        touched = sorted({a // SECTOR for a in addr})
        count = sectors_touched(lanes, stride=stride, itemsize=itemsize)
        if count != len(touched):
            raise ValueError(f"stride {stride}: {len(touched)} sectors drawn, sectors_touched "
                             f"says {count}")
        svg.text(6, y + 12, f"stride {stride}", weight="bold")
        svg.text(left, y + 12, f"lane k reads x[{stride}k] ({itemsize} bytes): {count} sectors, "
                 f"{count * SECTOR} bytes moved for {lanes * itemsize} used", size=SMALL)
        svg.text(6, y + 38, "lanes", size=SMALL)
        svg.text(6, y + 102, "memory", size=SMALL)
        for k in range(lanes):
            svg.rect(left + k * cw + 1, y + 28, cw - 2, 20, fill=BLUE, opacity=0.15, stroke=BLUE,
                     role="lane", lane=k)
            if k % 4 == 0 or k == lanes - 1:
                svg.text(left + (k + 0.5) * cw, y + 38, str(k), size=8, anchor="middle")
            svg.line(left + (k + 0.5) * cw, y + 48, left + (addr[k] + itemsize / 2) * bw, y + 90,
                     stroke=BLUE, width=0.8, opacity=0.7, role="read", lane=k, byte=addr[k])
        for sec in range(span // SECTOR):
            hit = sec in touched
            svg.rect(left + sec * SECTOR * bw, y + 92, SECTOR * bw, 22,
                     fill=ORANGE if hit else "none", opacity=0.25 if hit else None,
                     stroke=ORANGE if hit else GREY, width=1.2 if hit else 0.6, role="sector",
                     sector=sec, touched=int(hit))
        for a in addr:
            svg.rect(left + a * bw, y + 92, itemsize * bw, 22, fill=BLUE, opacity=0.7,
                     stroke="none", role="used", byte=a)
    label = ("A warp's 32 reads at strides " + ", ".join(map(str, strides)) + ": lanes above, "
             "memory in 32-byte sectors below; the sectors a read touches are shaded, the bytes "
             "it uses are dark.")
    caption = ("One warp-wide load at each stride. Each lane reads one "
               f"{itemsize}-byte element (dark); memory moves whole {SECTOR}-byte sectors "
               "(shaded). " + " ".join(
                   f"Stride {s}: {sectors_touched(lanes, stride=s, itemsize=itemsize)} sectors."
                   for s in strides) + " Past a stride of 8 every lane has a sector of its own, "
               "and the count stops growing.")
    return figure(svg.render(label), caption)


# -------------------------------------------------------------------------- banks: a column read

def bank_reads(layout: str, col: int, stride: int = 32) -> list[tuple[int, int, int]]:
    """(lane, word, bank) for each lane of a warp reading column ``col`` of a ``stride``-wide
    tile, lane l on row l, in ``layout`` (Part 2's ``word_address``)."""
    from snippets.part2.banks import BANKS, word_address

    return [(lane, int(w), int(w) % BANKS)
            for lane in range(32) for w in [word_address(lane, col, stride, layout)]]


def draw_banks(col: int = 1) -> str:
    from snippets.part2.banks import BANKS, LAYOUTS, conflict_ways, pitch

    if not 0 <= col < 32:
        raise ValueError(f"col= takes a column of the 32-wide tile, 0 to 31, got {col}")
    cw, left, top, panel = 18.0, 84.0, 8.0, 128.0
    width = left + 32 * cw + 14
    svg = Svg(width, top + panel * len(LAYOUTS) + 4, f"banks-{col}")
    formulas = {"plain": f"word = 32·l + {col}", "padded": f"word = 33·l + {col}",
                "swizzled": f"word = 32·l + ({col} XOR l)"}
    for p, layout in enumerate(LAYOUTS):
        y = top + p * panel
        reads = bank_reads(layout, col)
        hits = [0] * BANKS
        for _, _, b in reads:
            hits[b] += 1
        ways = conflict_ways(32, layout)
        verdict = f"{ways}-way conflict: {ways} passes" if ways > 1 else "no conflict: 1 pass"
        svg.text(6, y + 12, layout, weight="bold")
        svg.text(left, y + 12, f"rows of {pitch(32, layout)} words, lane l reads row l: "
                 f"{formulas[layout]}, bank = word mod 32 — {verdict}", size=SMALL)
        svg.text(6, y + 38, "lanes", size=SMALL)
        svg.text(6, y + 104, "banks", size=SMALL)
        for lane, word, bank in reads:
            hue = f"hsl({bank * 360 // BANKS}, 70%, 45%)"
            svg.rect(left + lane * cw + 1, y + 28, cw - 2, 20, fill=hue, opacity=0.25,
                     stroke=hue, role="lane", lane=lane, word=word, bank=bank,
                     title=f"lane {lane}: word {word}, bank {bank}")
            svg.line(left + (lane + 0.5) * cw, y + 48, left + (bank + 0.5) * cw, y + 92,
                     stroke=hue, width=1.0, opacity=0.8, role="read", lane=lane, bank=bank)
        for bank in range(BANKS):
            svg.rect(left + bank * cw + 1, y + 94, cw - 2, 20,
                     fill=RED if hits[bank] > 1 else GREY, opacity=0.3 if hits[bank] else 0.05,
                     stroke=RED if hits[bank] > 1 else GREY, role="bank", bank=bank,
                     hits=hits[bank], title=f"bank {bank}: {hits[bank]} lanes")
            svg.text(left + (bank + 0.5) * cw, y + 104, str(hits[bank]) if hits[bank] else "",
                     size=8, anchor="middle")
        for k in range(0, 32, 4):
            svg.text(left + (k + 0.5) * cw, y + 122, str(k), size=8, anchor="middle")
    label = (f"Which of the 32 banks each lane of a warp reads for column {col} of a 32 by 32 "
             "tile: all in one bank with the plain layout, one bank each when rows are padded to "
             "33 words or swizzled by XOR.")
    caption = (f"A warp reads column {col} of a 32 × 32 fp32 tile, lane l from row l; the number "
               "under each bank is how many lanes read it. Plain rows of 32 words put every "
               "lane's word in the same bank: 32 passes. Padding each row to 33 words shifts row "
               f"l by l banks, (l + {col}) mod 32; the XOR swizzle stores column c of row l at "
               f"c XOR l, bank {col} XOR l. Both spread the warp over all 32 banks.")
    return figure(svg.render(label), caption)


# ------------------------------------------------------------------------------ SGEMM tile ladder

@dataclass(frozen=True)
class SgemmTiles:
    """The tile hierarchy of one SGEMM step: a BM x BN block tile walked along K in steps of BK by
    ``threads`` threads, each owning TM x TN results (in 4 x 4 pieces inside a WM x WN warp tile
    when ``wm`` is set)."""

    version: str
    bm: int
    bn: int
    bk: int
    threads: int
    tm: int
    tn: int
    wm: int = 0
    wn: int = 0

    def pieces(self, tid: int) -> list[tuple[int, int, int, int]]:
        """(row, col, height, width) of the parts of the block tile thread ``tid`` computes, by
        the kernel's own index arithmetic."""
        if self.version == "v3":  # a 2-D block: threadIdx.y = tid / 32 is the row
            side = self.bn
            return [(tid // side, tid % side, 1, 1)]
        if self.version == "v4":  # tcol = tid % BN, trow = (tid / BN) * TM
            return [((tid // self.bn) * self.tm, tid % self.bn, self.tm, 1)]
        if not self.wm:  # v5, v6: tr = (tid / (BN / TN)) * TM, tc = (tid % (BN / TN)) * TN
            per_row = self.bn // self.tn
            return [((tid // per_row) * self.tm, (tid % per_row) * self.tn, self.tm, self.tn)]
        warp, lane = divmod(tid, 32)  # v7, v8: warptile.cuh
        warps_n = self.bn // self.wn
        wm0, wn0 = (warp // warps_n) * self.wm, (warp % warps_n) * self.wn
        lm, ln = divmod(lane, LANES_N)
        return [(wm0 + im * (self.wm // 2) + lm * 4, wn0 + jn * (self.wn // 2) + ln * 4, 4, 4)
                for im in range(2) for jn in range(2)]


LANES_N = 4  # a warp tile's 32 lanes as 8 x 4 (warptile.cuh's LANES_M, LANES_N; checked below)


def _literal(path: str, name: str) -> int:
    """The value of a template argument written ``/*NAME=*/value`` in csrc/<path>."""
    from snippets import cuda

    text = cuda.source_path(path).read_text()
    found = set(re.findall(rf"/\*{name}=\*/\s*(\d+)", text))
    if len(found) != 1:
        raise ValueError(f"csrc/{path}: expected one /*{name}=*/ template argument, found "
                         f"{sorted(found)}")
    return int(found.pop())


def sgemm_tiles(version: str) -> SgemmTiles:
    """The tiles of SGEMM step ``version`` (v3 to v8): the block tile, BK and threads from CONFIGS
    in snippets/part3/sgemm.py, the thread and warp tiles from the template arguments of its CUDA
    file."""
    from snippets import cuda
    from snippets.part3.sgemm import CONFIGS

    if version not in ("v3", "v4", "v5", "v6", "v7", "v8"):
        raise ValueError(f"sgemm pictures exist for v3 to v8, not {version!r}")
    cfg = CONFIGS[version]
    bm, bn = cfg.tile
    threads = math.prod(cfg.threads)
    per = cfg.results_per_thread
    if version == "v3":
        t = SgemmTiles(version, bm, bn, cfg.bk, threads, 1, 1)
    elif version == "v4":
        t = SgemmTiles(version, bm, bn, cfg.bk, threads, per, 1)
    elif version in ("v5", "v6"):
        t = SgemmTiles(version, bm, bn, cfg.bk, threads, _literal(cfg.path, "TM"),
                       _literal(cfg.path, "TN"))
    else:
        header = cuda.source_path("part3/sgemm/warptile.cuh").read_text()
        if not re.search(r"LANES_M = 8, LANES_N = 4;", header):
            raise ValueError("warptile.cuh: the 8 x 4 lane grid this picture draws has changed")
        t = SgemmTiles(version, bm, bn, cfg.bk, threads, 8, 8, _literal(cfg.path, "WM"),
                       _literal(cfg.path, "WN"))
    if t.tm * t.tn != per or (t.wm and (bm // t.wm) * (bn // t.wn) * 32 != threads):
        raise ValueError(f"{version}: tiles {t} do not match CONFIGS ({per} results per thread)")
    return t


def _bbox(pieces) -> tuple[int, int, int, int]:
    r0 = min(p[0] for p in pieces)
    c0 = min(p[1] for p in pieces)
    r1 = max(p[0] + p[2] for p in pieces)
    c1 = max(p[1] + p[3] for p in pieces)
    return r0, c0, r1 - r0, c1 - c0


def draw_sgemm(version: str) -> str:
    t = sgemm_tiles(version)
    scale = 256 / max(t.bm, t.bn)  # pixels per element: every block tile is drawn 256 px wide
    gap, top, left = 14.0, 34.0, 40.0
    ka = t.bk * scale  # the width of sA and the height of sB
    cx, cy = left + ka + gap, top + ka + gap  # the C tile's corner
    legend_x = cx + t.bn * scale + 26
    width = legend_x + 250
    height = cy + t.bm * scale + 30
    svg = Svg(width, height, f"sgemm-{version}")
    thread0 = t.pieces(0)
    warp0 = [p for tid in range(min(32, t.threads)) for p in t.pieces(tid)]
    # the shared tiles: sA (BM x BK) left of C, sB (BK x BN) above it
    svg.rect(left, cy, ka, t.bm * scale, fill=PURPLE, opacity=0.1, stroke=PURPLE, role="sA")
    svg.rect(cx, top, t.bn * scale, ka, fill=PURPLE, opacity=0.1, stroke=PURPLE, role="sB")
    svg.text(left + ka / 2, cy - 8, "sA", size=SMALL, anchor="middle")
    svg.text(cx - 8, top + ka / 2, "sB", size=SMALL, anchor="end")
    svg.text(left + ka / 2, cy + t.bm * scale + 12, f"BK = {t.bk}", size=SMALL, anchor="middle")
    # what thread 0 reads from them for each k: its rows of sA, its columns of sB
    for r0, c0, h, w in thread0:
        svg.rect(left, cy + r0 * scale, ka, h * scale, fill=ORANGE, opacity=0.55, stroke="none",
                 role="sA-read")
        svg.rect(cx + c0 * scale, top, w * scale, ka, fill=ORANGE, opacity=0.55, stroke="none",
                 role="sB-read")
    # the C tile, the thread tiles, warp 0 and thread 0
    svg.rect(cx, cy, t.bn * scale, t.bm * scale, fill=BLUE, opacity=0.05, stroke=BLUE, width=2,
             role="block", rows=t.bm, cols=t.bn)
    step_r, step_c = (4, 4) if t.wm else (t.tm, t.tn)
    if min(step_r, step_c) * scale >= 4:
        for r in range(step_r, t.bm, step_r):
            svg.line(cx, cy + r * scale, cx + t.bn * scale, cy + r * scale, stroke=GREY,
                     width=0.4, opacity=0.6)
        for c in range(step_c, t.bn, step_c):
            svg.line(cx + c * scale, cy, cx + c * scale, cy + t.bm * scale, stroke=GREY,
                     width=0.4, opacity=0.6)
    for r0, c0, h, w in warp0:
        svg.rect(cx + c0 * scale, cy + r0 * scale, w * scale, h * scale, fill=ORANGE,
                 opacity=0.22, stroke="none", role="warp0", r=r0, c=c0, rows=h, cols=w)
    for r0, c0, h, w in thread0:
        svg.rect(cx + c0 * scale, cy + r0 * scale, w * scale, h * scale, fill=ORANGE,
                 opacity=0.85, stroke=ORANGE, role="thread0", r=r0, c=c0, rows=h, cols=w)
    if t.wm:
        warps_n = t.bn // t.wn
        for wi in range(t.threads // 32):
            r0, c0 = (wi // warps_n) * t.wm, (wi % warps_n) * t.wn
            svg.rect(cx + c0 * scale, cy + r0 * scale, t.wn * scale, t.wm * scale, stroke=GREEN,
                     width=2, role="warptile", warp=wi)
            svg.text(cx + c0 * scale + t.wn * scale / 2, cy + (r0 + t.wm) * scale - 10,
                     f"warp {wi}", size=SMALL, anchor="middle")
    svg.text(cx + t.bn * scale / 2, cy + t.bm * scale + 14, f"block tile {t.bm} × {t.bn} of C",
             size=SMALL, anchor="middle")
    # the legend
    wr0, wc0, wh, ww = _bbox(warp0)
    lines = [(BLUE, 0.1, f"block tile {t.bm} × {t.bn}: one block, {t.threads} threads"),
             (PURPLE, 0.15, f"sA {t.bm} × {t.bk} and sB {t.bk} × {t.bn} in shared memory")]
    if t.wm:
        lines.append((GREEN, 0.0, f"warp tiles {t.wm} × {t.wn}: {t.threads // 32} warps"))
        lines.append((ORANGE, 0.22, f"warp 0: its 32 lanes' results, {wh} × {ww}"))
        lines.append((ORANGE, 0.85, f"lane 0: four 4 × 4 pieces, {t.tm * t.tn} results"))
    else:
        lines.append((ORANGE, 0.22, f"warp 0 (threads 0-31): a {wh} × {ww} strip"))
        own = "one result" if t.tm * t.tn == 1 else f"{t.tm} × {t.tn} results"
        lines.append((ORANGE, 0.85, f"thread 0: {own}"))
    lines.append((ORANGE, 0.55, "what thread 0 reads for each k"))
    for i, (colour, op, text) in enumerate(lines):
        y = top + 6 + i * 22
        svg.rect(legend_x, y, 14, 14, fill=colour if op else "none", opacity=op or None,
                 stroke=colour, width=2 if not op else 1)
        svg.text(legend_x + 20, y + 7, text, size=SMALL)
    fma = t.tm * t.tn
    loads = 2 if t.tm * t.tn == 1 else t.tm + t.tn
    y = top + 6 + len(lines) * 22 + 10
    svg.text(legend_x, y, f"per k, each thread reads {loads} values", size=SMALL)
    svg.text(legend_x, y + 15, f"from shared memory for {fma} FMA" + ("s" if fma > 1 else ""),
             size=SMALL)
    intensity = t.bm * t.bn / (2 * (t.bm + t.bn))
    svg.text(legend_x, y + 34, f"global intensity {intensity:g} FLOP/byte", size=SMALL)
    if t.wm:
        own = f"lane 0 owns four 4 × 4 pieces ({t.tm * t.tn} results) spread over its warp tile"
    elif fma == 1:
        own = "each thread owns one result"
    else:
        own = f"each thread owns {t.tm} × {t.tn} results"
    label = (f"SGEMM {version}: a {t.bm} by {t.bn} block tile of C computed by {t.threads} "
             f"threads from a {t.bm} by {t.bk} tile of A and a {t.bk} by {t.bn} tile of B in "
             f"shared memory; {own}; warp 0 covers {wh} by {ww}.")
    caption = (f"{version}: the block tile ({t.bm} × {t.bn}, BK = {t.bk}, {t.threads} threads), "
               + (f"its {t.threads // 32} warp tiles of {t.wm} × {t.wn}, " if t.wm else "")
               + f"warp 0's results (light) and thread 0's (dark); {own}. The shaded rows of sA "
               f"and columns of sB are what thread 0 reads from shared memory at each k: "
               f"{loads} values for {fma} FMA{'s' if fma > 1 else ''}. Drawn from CONFIGS in "
               "snippets/part3/sgemm.py and the template arguments of the CUDA file.")
    return figure(svg.render(label), caption)


# ------------------------------------------------------------------------- online softmax state

@dataclass(frozen=True)
class OnlineStep:
    values: tuple[float, ...]
    m_old: float
    m_new: float
    factor: float  # exp(m_old - m_new): what the old sum is multiplied by (0 for the first block)
    block_sum: float  # sum of exp(x - m_new) over the block
    s: float  # the running sum after the block


def online_steps(x: list[float], block: int) -> list[OnlineStep]:
    """The online softmax's state block by block, checked against Part 4's
    ``online_softmax_numpy`` (its trace of (max, sum) after each block)."""
    import numpy as np

    from snippets.part4.softmax import online_softmax_numpy

    _, trace = online_softmax_numpy(np.array(x, dtype=np.float64), block)
    steps, m, s = [], -math.inf, 0.0
    for k, start in enumerate(range(0, len(x), block)):
        chunk = tuple(x[start:start + block])
        m_new = max(m, *chunk)
        factor = math.exp(m - m_new) if m != -math.inf else 0.0
        block_sum = sum(math.exp(v - m_new) for v in chunk)
        s = s * factor + block_sum
        if not (trace[k][0] == m_new and math.isclose(trace[k][1], s, rel_tol=1e-12)):
            raise ValueError(f"block {k}: drawn (m, s) = ({m_new}, {s}), online_softmax_numpy "
                             f"gives {trace[k]}")
        steps.append(OnlineStep(chunk, m, m_new, factor, block_sum, s))
        m = m_new
    return steps


def _g(v: float) -> str:
    return "−∞" if v == -math.inf else f"{v:.4g}".replace("-", "−")


def draw_online_softmax(x: list[float], block: int) -> str:
    if not 2 <= len(x) <= 12 or not 1 <= block <= 4 or len(x) % block:
        raise ValueError("online_softmax draws 2 to 12 values in equal blocks of 1 to 4")
    steps = online_steps(x, block)
    colw, left, top = 150.0, 10.0, 20.0
    width = left + colw * (len(steps) + 1) + 10
    svg = Svg(width, 226, f"online-{block}-{len(x)}")
    box_w, box_h, box_y = 120.0, 44.0, 124.0

    def state(col: int, m_run: float, s_run: float, **data) -> tuple[float, float]:
        x0 = left + col * colw + (colw - box_w) / 2
        svg.rect(x0, box_y, box_w, box_h, fill=PURPLE, opacity=0.12, stroke=PURPLE, width=1.5,
                 **data)
        svg.text(x0 + box_w / 2, box_y + 14, f"m = {_g(m_run)}", size=SMALL, anchor="middle")
        svg.text(x0 + box_w / 2, box_y + 31, f"s = {_g(s_run)}", size=SMALL, anchor="middle")
        return x0, x0 + box_w

    svg.text(left + colw / 2, top + 6, "start", size=SMALL, anchor="middle")
    prev = state(0, -math.inf, 0.0, role="state", step=0)
    for k, st in enumerate(steps, 1):
        xc = left + k * colw + colw / 2
        raised = st.m_new > st.m_old
        svg.text(xc, top + 6, f"block {k}" + (": the max rises" if raised and k > 1 else ""),
                 size=SMALL, anchor="middle")
        cell = 34.0
        x0 = xc - cell * len(st.values) / 2
        for j, v in enumerate(st.values):
            top_v = v == st.m_new and raised
            svg.rect(x0 + j * cell + 1, top + 18, cell - 2, 26, fill=ORANGE if top_v else BLUE,
                     opacity=0.3 if top_v else 0.12, stroke=ORANGE if top_v else BLUE,
                     role="value", block=k, value=v)
            svg.text(x0 + j * cell + cell / 2, top + 31, _g(v), size=SMALL, anchor="middle")
        svg.line(xc, top + 46, xc, box_y - 2, stroke=BLUE, arrow=True)
        svg.text(xc + 6, top + 72, f"+ Σ e^(x − {_g(st.m_new)})", size=SMALL)
        svg.text(xc + 6, top + 88, f"= {_g(st.block_sum)}", size=SMALL)
        here = state(k, st.m_new, st.s, role="state", step=k, m=repr(st.m_new), s=repr(st.s))
        svg.line(prev[1] + 2, box_y + box_h / 2, here[0] - 2, box_y + box_h / 2, stroke=PURPLE,
                 arrow=True, role="rescale", step=k, factor=repr(st.factor))
        fx = (prev[1] + here[0]) / 2
        factor = "× 0" if k == 1 else f"× e^({_g(st.m_old)} − {_g(st.m_new)})"
        svg.text(fx, box_y + box_h + 14, factor, size=SMALL, anchor="middle")
        if k > 1:
            svg.text(fx, box_y + box_h + 28, f"= {_g(st.factor)}", size=SMALL, anchor="middle")
        prev = here
    last = steps[-1]
    svg.text(left, 214, f"after the last block: y_i = e^(x_i − {_g(last.m_new)}) / {_g(last.s)}",
             size=FONT)
    label = ("The online softmax over " + ", ".join(_g(v) for v in x) + f" in blocks of {block}: "
             "after each block the running max m and sum s are updated, and the old sum is "
             "rescaled by e to the power old max minus new max whenever the max rises.")
    caption = (f"The online softmax of the row above in blocks of {block}, the values of "
               "online_softmax_numpy's trace. Each block merges its own sum into the running "
               "state (m, s); when the block raises the max, the old sum is multiplied by "
               "e^(m_old − m_new) ≤ 1 first, so every term stays shifted by the current max. "
               "After the last block, (m, s) are the row's max and the softmax denominator.")
    return figure(svg.render(label), caption)


# ------------------------------------------------------------------- FlashAttention block classes

def attention_blocks(kernel: str, s: int, block_m: int, block_n: int,
                     causal: bool = True) -> list[list[str]]:
    """What each kernel of snippets/part5/flash_attention.py does with each (query block, key
    block) of an S x S score matrix: ``full`` (loaded and scored with no mask), ``masked``
    (scored with the mask) or ``skipped`` (never loaded), from the loop bounds each kernel runs.
    Rows are query blocks of ``block_m``, columns key blocks of ``block_n``; ``fwd`` and ``dq``
    programs own a row, ``dkdv`` programs a column."""
    if kernel not in ("fwd", "dq", "dkdv"):
        raise ValueError(f"kernel= takes fwd, dq or dkdv, got {kernel!r}")
    nq, nk = -(-s // block_m), -(-s // block_n)
    out = [["skipped"] * nk for _ in range(nq)]
    if kernel in ("fwd", "dq"):
        if block_m % block_n:
            raise ValueError(f"{kernel}: BLOCK_M = {block_m} must be a multiple of BLOCK_N")
        for i in range(nq):
            m0 = i * block_m
            if causal:  # unmasked over [0, m0), masked over [m0, min(m0 + BLOCK_M, S))
                stages = [(0, m0, "full"), (m0, min(m0 + block_m, s), "masked")]
            else:  # the whole key blocks unmasked, the ragged tail masked
                full = (s // block_n) * block_n
                stages = [(0, full, "full"), (full, s, "masked")]
            for lo, hi, kind in stages:
                for start_n in range(lo, hi, block_n):
                    out[i][start_n // block_n] = kind
    else:
        if block_n % block_m:
            raise ValueError(f"dkdv: BLOCK_N = {block_n} must be a multiple of BLOCK_M")
        full = (s // block_m) * block_m
        for j in range(nk):
            n0 = j * block_n
            stages = []
            if causal:  # the query blocks that straddle the diagonal, masked
                stages.append((n0, min(n0 + block_n, s), "masked"))
                lo = n0 + block_n
            else:
                lo = 0
            stages += [(lo, full, "full"), (max(lo, full), s, "masked")]
            for lo_, hi, kind in stages:
                for start_m in range(lo_, hi, block_m):
                    out[start_m // block_m][j] = kind
    return out


def block_counts(classes: list[list[str]]) -> dict[str, int]:
    flat = [c for row in classes for c in row]
    return {k: flat.count(k) for k in ("full", "masked", "skipped")}


KIND_STYLE = {"full": (BLUE, 0.35), "masked": (ORANGE, None), "skipped": (GREY, 0.0)}


def _block_grid(svg: Svg, x0: float, y0: float, classes, s: int, block_m: int, block_n: int,
                scale: float, kernel: str, focus: int | None = None, hatch: str = "") -> None:
    """One score matrix as a grid of blocks, queries down and keys across, with the causal
    diagonal; with ``focus``, the one program (row or column) the picture follows stands out."""
    for i, row in enumerate(classes):
        for j, kind in enumerate(row):
            program = j if kernel == "dkdv" else i
            dim = focus is not None and program != focus
            colour, op = KIND_STYLE[kind]
            h = min(block_m, s - i * block_m) * scale
            w = min(block_n, s - j * block_n) * scale
            if kind == "masked":
                fill, opacity = hatch, (0.35 if dim else None)
            elif kind == "full":
                fill, opacity = colour, op * (0.35 if dim else 1)
            else:
                fill, opacity = "none", None
            svg.rect(x0 + j * block_n * scale, y0 + i * block_m * scale, w, h, fill=fill,
                     opacity=opacity,
                     stroke=GREY if kind == "skipped" else colour,
                     dash="2 2" if kind == "skipped" else None, width=0.8, role="block",
                     kernel=kernel, qb=i, kb=j, kind=kind, program=program,
                     focus=int(focus is not None and not dim),
                     title=f"query block {i}, key block {j}: {kind}")
    svg.line(x0, y0, x0 + s * scale, y0 + s * scale, stroke=RED, width=1.2, dash="5 3")


def _legend(svg: Svg, x: float, y: float, counts: dict[str, int], hatch: str) -> None:
    text = {"full": "full: computed whole, no mask", "masked": "masked: the diagonal crosses them",
            "skipped": "skipped: never loaded"}
    for k, kind in enumerate(("full", "masked", "skipped")):
        colour, op = KIND_STYLE[kind]
        svg.rect(x, y + k * 22, 14, 14, fill=hatch if kind == "masked" else
                 (colour if op else "none"), opacity=op or None,
                 stroke=GREY if kind == "skipped" else colour,
                 dash="2 2" if kind == "skipped" else None)
        svg.text(x + 20, y + k * 22 + 7, f"{counts[kind]} {text[kind]}", size=SMALL,
                 role="count", kind=kind, count=counts[kind])


def _launch_blocks(kernel: str, kw: dict) -> tuple[int, int]:
    from snippets.part5.flash_attention import FIXED_LAUNCH

    bm, bn = FIXED_LAUNCH[kernel][:2]
    return _int(kw, "block_m", bm), _int(kw, "block_n", bn)


def draw_causal_blocks(s: int, block_m: int, block_n: int) -> str:
    classes = attention_blocks("fwd", s, block_m, block_n, causal=True)
    counts = block_counts(classes)
    scale = min(1.0, 384 / s)
    left, top = 96.0, 40.0
    side = s * scale
    width = left + side + 260
    svg = Svg(width, top + side + 34, f"causal-{s}-{block_m}-{block_n}")
    hatch = svg.hatch(ORANGE)
    _block_grid(svg, left, top, classes, s, block_m, block_n, scale, "fwd", hatch=hatch)
    svg.text(left + side / 2, top - 24, f"keys, in blocks of BLOCK_N = {block_n}", size=SMALL,
             anchor="middle")
    svg.text(left + side / 2, top - 10, "j →", size=SMALL, anchor="middle")
    for i in range(len(classes)):
        svg.text(left - 6, top + (i + 0.5) * block_m * scale, f"program {i}", size=SMALL,
                 anchor="end")
    svg.text(6, top + side + 20, f"queries i ↓, blocks of BLOCK_M = {block_m}", size=SMALL)
    _legend(svg, left + side + 20, top + 4, counts, hatch)
    svg.text(left + side + 20, top + 84, "dashed red: the diagonal j = i", size=SMALL)
    total = len(classes) * len(classes[0])
    svg.text(left + side + 20, top + 106, f"{total - counts['skipped']} of {total} blocks "
             "visited", size=SMALL)
    label = (f"The causal FlashAttention forward at S = {s} with BLOCK_M = {block_m} and BLOCK_N "
             f"= {block_n}: of {total} blocks of the score matrix, {counts['full']} are computed "
             f"without a mask, {counts['masked']} straddle the diagonal and are masked, and "
             f"{counts['skipped']} lie above it and are skipped.")
    caption = (f"The score matrix of one head at S = {s}, in the blocks of the forward's fixed "
               f"launch (BLOCK_M = {block_m}, BLOCK_N = {block_n}); program i owns row i. Left of "
               "the diagonal a block is computed whole with no mask; the "
               f"{block_m // block_n} blocks of each row that the diagonal crosses are masked; "
               "blocks right of it are never loaded. Drawn from the loop bounds of the kernel in "
               "snippets/part5/flash_attention.py.")
    return figure(svg.render(label), caption)


def draw_flash_backward(s: int, kw: dict) -> str:
    dkdv = _launch_blocks("dkdv", {})
    dq = _launch_blocks("dq", {})
    c_kv = attention_blocks("dkdv", s, *dkdv)
    c_q = attention_blocks("dq", s, *dq)
    col = _int(kw, "col", len(c_kv[0]) // 2, 0, len(c_kv[0]) - 1)
    row = _int(kw, "row", len(c_q) // 2, 0, len(c_q) - 1)
    scale = min(1.0, 256 / s)
    side = s * scale
    top, left1 = 58.0, 20.0
    left2 = left1 + side + 130
    width = left2 + side + 60
    svg = Svg(width, top + side + 150, f"flash-bwd-{s}")
    hatch = svg.hatch(ORANGE)
    _block_grid(svg, left1, top, c_kv, s, *dkdv, scale, "dkdv", focus=col, hatch=hatch)
    _block_grid(svg, left2, top, c_q, s, *dq, scale, "dq", focus=row, hatch=hatch)
    # the programs the picture follows, and the way they walk
    x = left1 + (col + 0.5) * dkdv[1] * scale
    svg.rect(left1 + col * dkdv[1] * scale, top, dkdv[1] * scale, side, stroke=GREEN, width=2.5,
             role="program", kernel="dkdv", index=col)
    first = next(i for i, r in enumerate(c_kv) if r[col] != "skipped")
    svg.line(x, top + first * dkdv[0] * scale + 4, x, top + side - 4, stroke=GREEN, width=2,
             arrow=True)
    y = top + (row + 0.5) * dq[0] * scale
    svg.rect(left2, top + row * dq[0] * scale, side, dq[0] * scale, stroke=GREEN, width=2.5,
             role="program", kernel="dq", index=row)
    last = max(j for j, k in enumerate(c_q[row]) if k != "skipped")
    svg.line(left2 + 4, y, left2 + (last + 1) * dq[1] * scale - 4, y, stroke=GREEN, width=2,
             arrow=True)
    svg.text(left1, 14, "pass 1: dK, dV", weight="bold")
    svg.text(left1, 30, f"BLOCK_M = {dkdv[0]}, BLOCK_N = {dkdv[1]}: a program per key block",
             size=SMALL)
    svg.text(left2, 14, "pass 2: dQ", weight="bold")
    svg.text(left2, 30, f"BLOCK_M = {dq[0]}, BLOCK_N = {dq[1]}: a program per query block",
             size=SMALL)
    svg.text(left1, top - 10, "keys →   queries ↓", size=SMALL)
    svg.text(left2, top - 10, "keys →   queries ↓", size=SMALL)
    ny = top + side + 18
    svg.text(left1, ny, f"program {col} keeps K, V of its key block on chip", size=SMALL)
    svg.text(left1, ny + 15, "and walks the query blocks down its column,", size=SMALL)
    svg.text(left1, ny + 30, "accumulating dK and dV: no atomics", size=SMALL)
    svg.text(left2, ny, f"program {row} keeps Q, dO, lse, δ of its query block", size=SMALL)
    svg.text(left2, ny + 15, "and walks the key blocks along its row,", size=SMALL)
    svg.text(left2, ny + 30, "accumulating dQ", size=SMALL)
    counts_kv, counts_q = block_counts(c_kv), block_counts(c_q)
    _legend(svg, left1, ny + 50, counts_kv, hatch)
    _legend(svg, left2, ny + 50, counts_q, hatch)
    label = (f"The two passes of the causal FlashAttention backward at S = {s}. Pass 1 has one "
             f"program per key block of {dkdv[1]} keys, each walking down its column of query "
             f"blocks of {dkdv[0]} to accumulate dK and dV; pass 2 has one program per query "
             f"block of {dq[0]}, each walking along its row of key blocks of {dq[1]} to "
             "accumulate dQ. Both skip the blocks above the diagonal and mask the ones it "
             "crosses.")
    caption = (f"The backward at S = {s} with the fixed launches' blocks. Pass 1 (dK, dV): "
               f"program {col} holds its key and value block and walks down its column; the "
               "query blocks above the diagonal see none of its keys and are skipped, the ones "
               "the diagonal crosses are masked, the rest run unmasked. Pass 2 (dQ) walks a row "
               "of key blocks, like the forward. Each program owns what it writes, so neither "
               "pass needs atomics; S and dP are recomputed in both. Drawn from the loop bounds "
               "of the kernels in snippets/part5/flash_attention.py.")
    return figure(svg.render(label), caption)


# ------------------------------------------------------------------------------------ dispatch

def _floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v]
    except ValueError:
        raise ValueError(f"x= takes numbers separated by commas, got {text!r}") from None


def render_diagram(pos: list[str], kw: dict[str, str]) -> str:
    """The ``bench:diagram NAME key=value ...`` directive."""
    name = pos[0] if pos else ""
    if name == "grid":
        return draw_grid(_int(kw, "n", 20), _int(kw, "block", 8), kw.get("style", "cuda"))
    if name == "coalescing":
        return draw_coalescing(_ints(kw.get("strides", "1,2,8"), "strides"))
    if name == "banks":
        return draw_banks(_int(kw, "col", 1, 0, 31))
    if name == "sgemm":
        if len(pos) != 2:
            raise ValueError("bench:diagram sgemm takes a version: sgemm v5")
        return draw_sgemm(pos[1])
    if name == "online_softmax":
        return draw_online_softmax(_floats(kw.get("x", "1,2,0.5,7,3,9")), _int(kw, "block", 2))
    if name == "causal_blocks":
        return draw_causal_blocks(_int(kw, "s", 384), *_launch_blocks("fwd", kw))
    if name == "flash_backward":
        return draw_flash_backward(_int(kw, "s", 256), kw)
    if name in ("layout", "tv", "swizzle"):  # Part 6's layouts (snippets/site/layouts.py)
        from snippets.site.layouts import render

        return render(name, kw)
    raise ValueError(f"unknown diagram {name!r}; known: grid, coalescing, banks, sgemm, "
                     "online_softmax, causal_blocks, flash_backward, layout, tv, swizzle")
