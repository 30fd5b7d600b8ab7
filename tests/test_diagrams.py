"""The explanatory pictures (``bench:diagram``, snippets/site/diagrams.py) say what the code does.

Each picture is drawn from the parameters of the code it explains, and its marks carry ``data-*``
attributes; these tests read the SVG back and check it against the arithmetic it illustrates: a
thread's global index, the sectors of a strided warp load, the bank of each lane's word, the SGEMM
tiles (every element of a block tile owned by exactly one thread), the online softmax's running
state, and the blocks each FlashAttention kernel computes, masks or skips, against the causal mask
element by element. Every picture has a caption and alt text, and every directive in the chapters
renders.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import torch

from snippets.site import diagrams as dg
from snippets.site.fmt import _args
from snippets.site.page import DIRECTIVE, render_page

REPO_ROOT = Path(__file__).resolve().parent.parent
NS = "{http://www.w3.org/2000/svg}"


def svg_of(html: str) -> ET.Element:
    m = re.search(r"<svg .*?</svg>", html, re.DOTALL)
    assert m, "no SVG in the figure"
    return ET.fromstring(m.group(0))


def marks(html: str, role: str, tag: str = "rect") -> list[dict]:
    return [e.attrib for e in svg_of(html).iter(f"{NS}{tag}") if e.get("data-role") == role]


def draw(spec: str) -> str:
    pos, kw = _args(spec)
    return dg.render_diagram(pos, kw)


ALL_SPECS = ["grid", "grid n=37 block=16 style=triton", "coalescing", "coalescing strides=1,3,16",
             "banks", "banks col=0", "sgemm v3", "sgemm v4", "sgemm v5", "sgemm v6", "sgemm v7",
             "sgemm v8", "online_softmax", "online_softmax x=3,1,4,1,5,9,2,6 block=4",
             "causal_blocks", "causal_blocks s=512 block_m=128 block_n=64", "flash_backward",
             "flash_backward s=320 col=0 row=4", "layout", "layout shape=((4,2),(4,2)) stride=((1,16),(4,32))",
             "layout shape=8 stride=32", "tv", "tv shape=((4,8),(2,2,2)) stride=((32,1),(16,8,128)) tile=(16,16)",
             "swizzle", "swizzle bits=2 base=4 shift=3"]


# ---------------------------------------------------------------------------------- every picture

@pytest.mark.parametrize("spec", ALL_SPECS)
def test_a_picture_has_alt_text_a_caption_and_renders_as_one_html_block(spec):
    html = draw(spec)
    root = svg_of(html)
    assert root.get("role") == "img" and len(root.get("aria-label", "")) > 40
    assert root.find(f"{NS}title").text == root.get("aria-label")
    caption = re.search(r"<figcaption>(.+?)</figcaption>", html, re.DOTALL)
    assert caption and len(caption.group(1)) > 60
    assert html.startswith('<figure class="bench-plot bench-diagram">')
    assert "\n\n" not in html, "a blank line would end the raw HTML block in Markdown"
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) == len(set(ids)) and all(root.get("data-diagram") in i for i in ids)
    assert html == draw(spec), "not deterministic"


def test_two_pictures_on_one_page_share_no_id():
    ids = [re.findall(r'\bid="([^"]+)"', draw(s)) for s in ("sgemm v3", "sgemm v4",
                                                            "causal_blocks", "flash_backward")]
    flat = [i for group in ids for i in group]
    assert len(flat) == len(set(flat))


def test_bad_requests_are_refused():
    for spec in ("nope", "sgemm", "sgemm v2", "grid style=opencl", "grid n=500", "banks col=32",
                 "coalescing strides=0", "online_softmax x=1,2,3 block=2",
                 "causal_blocks block_m=32 block_n=64"):
        with pytest.raises(ValueError):
            draw(spec)


def test_the_chapters_directives_render():
    """Every bench:diagram of the chapters renders, and each kind is used where the brief put it."""
    used: dict[str, set[str]] = {}
    for page in sorted((REPO_ROOT / "docs").rglob("*.md")):
        text = page.read_text()
        found = [m for m in DIRECTIVE.finditer(text) if m.group(2) == "diagram"]
        for m in found:
            pos, _ = _args(m.group(3))
            used.setdefault(" ".join(pos), set()).add(page.relative_to(REPO_ROOT / "docs").as_posix())
        if found:
            out = render_page("\n\n".join(m.group(0).strip() for m in found) + "\n", str(page))
            assert out.count('class="bench-plot bench-diagram"') == len(found)
    assert used.get("grid") == {"part1/execution-model.md", "part4/programming-model.md"}
    assert used.get("coalescing") == {"part2/coalescing.md"}
    assert used.get("banks") == {"part2/bank-conflicts.md"}
    assert {k for k in used if k.startswith("sgemm")} == {"sgemm v3", "sgemm v4", "sgemm v5",
                                                         "sgemm v7"}
    assert used.get("online_softmax") == {"part4/softmax.md"}
    assert used.get("causal_blocks") == {"part5/flash-attention.md"}
    assert used.get("flash_backward") == {"part5/flash-attention.md"}
    assert used.get("layout") == {"part6/layouts.md", "part6/layout-algebra.md"}
    assert used.get("tv") == {"part6/tv-layouts.md"}
    assert used.get("swizzle") == {"part6/swizzles.md"}


# ------------------------------------------------------------------------------------ the grid

@pytest.mark.parametrize("n,block", [(20, 8), (16, 8), (1, 4), (37, 16)])
def test_each_thread_handles_element_block_times_blockdim_plus_thread(n, block):
    slots = dg.grid_map(n, block)
    assert len({s.block for s in slots}) == math.ceil(n / block)
    for s in slots:
        assert s.index == s.block * block + s.thread and s.active == (s.index < n)
    assert sorted(s.index for s in slots if s.active) == list(range(n))
    html = dg.draw_grid(n, block)
    threads = marks(html, "thread")
    assert len(threads) == len(slots)
    for t in threads:
        index = int(t["data-block"]) * block + int(t["data-thread"])
        assert int(t["data-index"]) == index and t["data-active"] == str(int(index < n))
    assert sorted(int(e["data-index"]) for e in marks(html, "map", "line")) == list(range(n))
    assert len(marks(html, "block")) == math.ceil(n / block)


# ---------------------------------------------------------------------------------- coalescing

@pytest.mark.parametrize("stride", [1, 2, 3, 4, 8, 16])
def test_the_sectors_shaded_are_the_sectors_a_warp_touches(stride):
    from snippets.part2.coalescing import SECTOR, sectors_touched

    html = dg.draw_coalescing([stride])
    touched = {int(s["data-sector"]) for s in marks(html, "sector") if s["data-touched"] == "1"}
    reads = {int(r["data-lane"]): int(r["data-byte"]) for r in marks(html, "read", "line")}
    assert reads == {k: 4 * k * stride for k in range(32)}
    assert touched == {b // SECTOR for b in reads.values()}
    assert len(touched) == sectors_touched(32, stride=stride) == 4 * min(stride, 8)


# ---------------------------------------------------------------------------------------- banks

@pytest.mark.parametrize("col", [0, 1, 7, 31])
def test_each_lane_reads_the_bank_of_its_word(col):
    html = dg.draw_banks(col)
    lanes = marks(html, "lane")
    assert len(lanes) == 3 * 32
    panels = [lanes[i * 32:(i + 1) * 32] for i in range(3)]
    rules = {"plain": lambda r: (r * 32 + col) % 32, "padded": lambda r: (r * 33 + col) % 32,
             "swizzled": lambda r: (r * 32 + (col ^ r)) % 32}
    for (layout, bank_of), panel in zip(rules.items(), panels):
        for lane in panel:
            row = int(lane["data-lane"])
            assert int(lane["data-word"]) % 32 == int(lane["data-bank"]) == bank_of(row), layout
        banks = [int(lane["data-bank"]) for lane in panel]
        assert len(set(banks)) == (1 if layout == "plain" else 32), layout
    hits = [int(b["data-hits"]) for b in marks(html, "bank")]
    assert sum(hits) == 3 * 32 and max(hits[:32]) == 32 and set(hits[32:]) == {1}


# ---------------------------------------------------------------------------------------- SGEMM

@pytest.mark.parametrize("version", ["v3", "v4", "v5", "v6", "v7", "v8"])
def test_every_element_of_a_block_tile_has_one_owner(version):
    from snippets.part3.sgemm import CONFIGS

    t = dg.sgemm_tiles(version)
    cfg = CONFIGS[version]
    assert (t.bm, t.bn, t.bk, t.threads) == (*cfg.tile, cfg.bk, math.prod(cfg.threads))
    owner = np.full((t.bm, t.bn), -1)
    for tid in range(t.threads):
        for r0, c0, h, w in t.pieces(tid):
            assert (owner[r0:r0 + h, c0:c0 + w] == -1).all(), f"{version}: thread {tid} overlaps"
            owner[r0:r0 + h, c0:c0 + w] = tid
    assert (owner >= 0).all()
    assert (np.bincount(owner.ravel()) == cfg.results_per_thread).all()


def test_the_tiles_are_the_chapters():
    v3, v4, v5, v7 = (dg.sgemm_tiles(v) for v in ("v3", "v4", "v5", "v7"))
    assert (v3.bm, v3.bk, v3.tm, v3.tn) == (32, 32, 1, 1)
    assert (v4.bm, v4.bn, v4.tm, v4.tn, v4.threads) == (64, 64, 8, 1, 512)
    assert (v5.bm, v5.tm, v5.tn, v5.threads) == (128, 8, 8, 256)
    assert (v7.wm, v7.wn, v7.tm, v7.tn) == (64, 32, 8, 8)
    # v7's lane 0 owns four 4 x 4 pieces at rows {0, WM/2}, columns {0, WN/2} of warp tile 0
    assert sorted(v7.pieces(0)) == [(0, 0, 4, 4), (0, 16, 4, 4), (32, 0, 4, 4), (32, 16, 4, 4)]
    # and lane 5 = (lm 1, ln 1) of warp 1 (the second warp tile of the first row)
    assert (4, 32 + 4, 4, 4) in v7.pieces(32 + 5)


@pytest.mark.parametrize("version", ["v3", "v4", "v5", "v7"])
def test_the_sgemm_picture_shows_the_tiles(version):
    t = dg.sgemm_tiles(version)
    html = dg.draw_sgemm(version)
    area = lambda rs: sum(int(r["data-rows"]) * int(r["data-cols"]) for r in rs)  # noqa: E731
    assert area(marks(html, "thread0")) == t.tm * t.tn
    assert area(marks(html, "warp0")) == 32 * t.tm * t.tn
    assert marks(html, "block")[0]["data-rows"] == str(t.bm)
    assert len(marks(html, "warptile")) == (t.threads // 32 if t.wm else 0)
    assert len(marks(html, "sA-read")) == len(t.pieces(0))


def test_the_template_arguments_are_read_from_the_cuda_files():
    with pytest.raises(ValueError, match="WM"):
        dg._literal("part3/sgemm/v5_blocktile_2d.cu", "WM")


# ------------------------------------------------------------------------------- online softmax

@pytest.mark.parametrize("x,block", [([1, 2, 0.5, 7, 3, 9], 2), ([3, 1, 4, 1, 5, 9, 2, 6], 4),
                                     ([5, 4, 3, 2], 1)])
def test_the_states_drawn_are_the_recurrences(x, block):
    from snippets.part4.softmax import online_softmax_numpy

    _, trace = online_softmax_numpy(np.array(x, dtype=np.float64), block)
    html = dg.draw_online_softmax([float(v) for v in x], block)
    states = [s for s in marks(html, "state") if s["data-step"] != "0"]
    assert [float(s["data-m"]) for s in states] == [m for m, _ in trace]
    assert [float(s["data-s"]) for s in states] == pytest.approx([v for _, v in trace])
    factors = [float(a["data-factor"]) for a in marks(html, "rescale", "line")]
    ms = [-math.inf] + [m for m, _ in trace]
    assert factors == pytest.approx([0.0] + [math.exp(a - b) for a, b in zip(ms[1:], ms[2:])])
    assert float(states[-1]["data-s"]) == pytest.approx(np.exp(np.array(x) - max(x)).sum())


# ------------------------------------------------------------------------------ FlashAttention

def geometric_class(s, r0, rows, c0, cols, causal, owns_rows: bool) -> str:
    """What a block needs, from the mask itself: never loaded when no score in it is visible, else
    a mask when it holds a hidden score (j > i) or a padded position the kernel must not read, else
    none. A program that owns query rows (fwd, dq) never stores its padded rows, so only padded
    keys count; one that owns key columns (dkdv) never stores its padded keys, so only padded
    queries count."""
    i = torch.arange(r0, r0 + rows)[:, None]
    j = torch.arange(c0, c0 + cols)[None, :]
    visible = (i < s) & (j < s) & ((j <= i) if causal else True)
    if not visible.any():
        return "skipped"
    padded = (j >= s) if owns_rows else (i >= s)
    hidden = (j > i) & (i < s) & (j < s) if causal else torch.zeros((), dtype=torch.bool)
    return "masked" if (padded.any() or hidden.any()) else "full"


CASES = [(s, kernel, bm, bn, causal) for kernel, sizes in
         (("fwd", [(64, 32), (128, 64), (128, 128), (32, 16)]),
          ("dq", [(128, 32), (64, 64), (32, 16)]),
          ("dkdv", [(32, 64), (64, 128), (16, 64), (16, 32)]))
         for bm, bn in sizes for s in (128, 256, 80, 200) for causal in (True, False)]


@pytest.mark.parametrize("s,kernel,bm,bn,causal", CASES)
def test_the_block_classes_follow_the_mask(s, kernel, bm, bn, causal):
    classes = dg.attention_blocks(kernel, s, bm, bn, causal)
    for qi, row in enumerate(classes):
        for kj, kind in enumerate(row):
            want = geometric_class(s, qi * bm, bm, kj * bn, bn, causal, kernel != "dkdv")
            assert kind == want, (qi, kj)


def test_the_kernels_block_sizes_are_drawn():
    from snippets.part5.flash_attention import FIXED_LAUNCH

    bm, bn = FIXED_LAUNCH["fwd"][:2]
    html = draw("causal_blocks")
    assert f"BLOCK_M = {bm}" in html and f"BLOCK_N = {bn}" in html
    assert html == dg.draw_causal_blocks(384, bm, bn)


@pytest.mark.parametrize("s,bm,bn", [(384, 64, 32), (512, 128, 64), (256, 64, 64),
                                     (1024, 128, 32)])
def test_the_causal_picture_counts_its_blocks(s, bm, bn):
    html = dg.draw_causal_blocks(s, bm, bn)
    kinds = [b["data-kind"] for b in marks(html, "block")]
    nq, r = s // bm, bm // bn
    want = {"full": r * nq * (nq - 1) // 2, "masked": r * nq}
    want["skipped"] = nq * (s // bn) - want["full"] - want["masked"]
    assert {k: kinds.count(k) for k in want} == want
    legend = {t.get("data-kind"): int(t.get("data-count")) for t in svg_of(html).iter(f"{NS}text")
              if t.get("data-role") == "count"}
    assert legend == want


def test_the_backward_picture_follows_one_program_per_pass():
    from snippets.part5.flash_attention import FIXED_LAUNCH

    s = 256
    html = dg.draw_flash_backward(s, {"col": "1", "row": "2"})
    blocks = marks(html, "block")
    kv = [b for b in blocks if b["data-kernel"] == "dkdv"]
    q = [b for b in blocks if b["data-kernel"] == "dq"]
    (bm_kv, bn_kv), (bm_q, bn_q) = FIXED_LAUNCH["dkdv"][:2], FIXED_LAUNCH["dq"][:2]
    assert len(kv) == (s // bm_kv) * (s // bn_kv) and len(q) == (s // bm_q) * (s // bn_q)
    col = [b for b in kv if b["data-focus"] == "1"]
    assert {b["data-kb"] for b in col} == {"1"} and len(col) == s // bm_kv
    # key block 1 (keys 64..127): queries 0..63 skip it, 64..127 are masked, the rest are full
    by_row = {int(b["data-qb"]): b["data-kind"] for b in col}
    for qb, kind in by_row.items():
        q0 = qb * bm_kv
        assert kind == ("skipped" if q0 + bm_kv <= 1 * bn_kv else
                        "masked" if q0 < 2 * bn_kv else "full")
    row = [b for b in q if b["data-focus"] == "1"]
    assert {b["data-qb"] for b in row} == {"2"} and len(row) == s // bn_q
    programs = marks(html, "program")
    assert [(p["data-kernel"], p["data-index"]) for p in programs] == [("dkdv", "1"), ("dq", "2")]


# ---------------------------------------------------------------------------- Part 6's layouts

@pytest.mark.parametrize("shape,stride", [((4, 8), (1, 4)), ((4, 8), (8, 1)), (((4, 2), (4, 2)), ((1, 16), (4, 32))),
                                          (8, 32), ((3, (2, 2)), (0, (1, 6)))])
def test_a_layout_cell_holds_the_index_the_layout_gives_its_coordinate(shape, stride):
    from snippets.part6.layout import make_layout

    layout = make_layout(shape, stride)
    compact = lambda t: str(t).replace(" ", "")  # noqa: E731
    html = draw(f"layout shape={compact(shape)} stride={compact(stride)}")
    cells = marks(html, "cell")
    assert len(cells) == layout.size
    for c in cells:
        i, j, idx = int(c["data-row"]), int(c["data-col"]), int(c["data-index"])
        assert idx == (layout(j) if isinstance(shape, int) else layout((i, j)))


def test_a_tv_cell_names_the_thread_and_value_that_own_it():
    from snippets.part6.layout import make_layout

    tv = make_layout(((4, 8), (2, 2)), ((32, 1), (16, 8)))
    cells = marks(draw("tv shape=((4,8),(2,2)) stride=((32,1),(16,8)) tile=(16,8)"), "cell")
    assert len(cells) == 128
    for c in cells:
        t, v = int(c["data-thread"]), int(c["data-value"])
        assert tv((t, v)) == int(c["data-row"]) + 16 * int(c["data-col"])
        # the PTX ISA's accumulator fragment of mma.m16n8: row lane/4 (+8), column 2 (lane % 4) (+1)
        assert int(c["data-row"]) == t // 4 + 8 * (v // 2) and int(c["data-col"]) == 2 * (t % 4) + v % 2


def test_a_tv_layout_that_claims_an_element_twice_is_refused():
    with pytest.raises(ValueError, match="owned twice"):
        draw("tv shape=(4,2) stride=(1,1) tile=(4,2)")
    with pytest.raises(ValueError, match="outside"):
        draw("tv shape=(4,2) stride=(1,8) tile=(4,2)")


def test_the_swizzle_picture_puts_a_column_in_eight_positions():
    from snippets.part6.layout import Swizzle

    html = draw("swizzle bits=3 base=4 shift=3")
    after = marks(html, "after")
    assert len(after) == 64
    sw = Swizzle(3, 4, 3)
    for c in after:
        r, chunk, lands = int(c["data-row"]), int(c["data-chunk"]), int(c["data-lands"])
        assert lands == (sw(r * 128 + chunk * 16) % 128) // 16 == chunk ^ r
    for chunk in range(8):
        assert len({c["data-lands"] for c in after if c["data-chunk"] == str(chunk)}) == 8


@pytest.mark.parametrize("spec,match", [("layout shape=(4,8 stride=(1,4)", "nested tuple"),
                                        ("layout shape=(2,2,2) stride=(1,2,4)", "rank-1 or rank-2"),
                                        ("layout shape=(32,32) stride=(1,32)", "at most 512")])
def test_bad_layout_pictures_say_why(spec, match):
    with pytest.raises(ValueError, match=match):
        draw(spec)
