"""The site's plots, on fake results (CPU, no GPU): a style per series that no other series of the
figure has, a library's versions drawn apart from the book's, legends inside their figures and below
the axes, a hover title on every data point, an accessible name on every figure, ids unique on a
page, no TeX in a label; the roofline's numbers never overlap; and snippets.bench imports nothing of
the site.

The numbers in the fixtures are test data for the code paths only; nothing here is published."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

import pytest
from matplotlib.colors import to_hex
from matplotlib.lines import Line2D
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from snippets.bench import harness
from snippets.op_index import load_all
from snippets.registry import REPO_ROOT, dtype_name, size_key
from snippets.site import render_page
from snippets.site.figures import (
    MARKERS,
    PALETTE,
    axis_ticks,
    ladder_figure,
    plot_figures,
    series_styles,
    size_label,
    sup,
)
from snippets.site.roofline import roofline_figure
from snippets.site.sweep import sweep_figure
from snippets.site.tables import origin_of
from snippets.site.timeline import timeline_figure

OPS = load_all()
GPU = "NVIDIA H100 80GB HBM3"
PROV = {"gpu": GPU, "sm_count": 1, "compute_capability": "9.0", "driver": "0", "cuda_runtime": "0",
        "torch": "0", "triton": "0", "cupy": None, "date": "2026-01-01T00:00:00+00:00",
        "commit": "0" * 40, "dirty": False}
LONG = "a description long enough to be wrapped in a narrow column of the legend, twice over"


def fake_entry(op, impls: dict[str, tuple[str, str]] | None = None) -> dict:
    """Records of ``impls`` (name: (lang, desc); the op's own versions unless given) at the headline
    and every sweep size, in the op's first timed dtype, derived as the harness derives them."""
    dtype = dtype_name(op.timed_dtypes()[0])
    impls = impls or {name: (impl.lang, impl.desc) for name, impl in op.impls.items()}
    sizes = list({size_key(s): s for s in [op.headline, *op.sweep]}.values())
    records = []
    for j, size in enumerate(sizes):
        for k, (name, (lang, desc)) in enumerate(impls.items()):
            records.append({"impl": name, "lang": lang, "desc": desc, "dtype": dtype,
                            "size": dict(size), "size_key": size_key(size),
                            "headline": size_key(size) == size_key(op.headline),
                            "ms": (1 + j % 3) / (k + 1), "timer": "device", "source_hash": "x"})
    harness.derive(op, records, None)
    top = max(r["value"] for r in records)
    ceiling = {"name": op.ceiling, "value": 1.1 * top, "unit": op.metric, "how": "test"}
    harness.derive(op, records, ceiling["value"])
    return {"part": op.part, "title": op.title, "metric": op.metric, "ceiling": ceiling,
            "provenance": PROV, "records": records}


def results(op_name: str, gpu: str = GPU, **kw) -> dict:
    return {gpu: {"schema": 1, "gpu": gpu, "ceilings": {},
                  "ops": {op_name: fake_entry(OPS[op_name], **kw)}}}


def only_figure(op_name: str, **kw):
    ((drawn, _),) = plot_figures(OPS[op_name], results(op_name, **kw))
    return drawn


def series_of(drawn) -> dict[str, list]:
    """Each drawn series, named by its version and its place, with its artists: the line that joins
    its points (drawn first), then its points, in drawing order."""
    out: dict[str, list] = {}
    current: list = []
    for artist in drawn.fig.axes[0].get_children():
        gid = artist.get_gid() or ""
        if gid.startswith("pt"):
            if len(current) == 1:  # the series' first point names it
                out[f"{drawn.titles[gid].split(',')[0]} #{len(out)}"] = current
            current.append(artist)
        elif isinstance(artist, Line2D) and artist.get_marker() in ("None", None, ""):
            current = [artist]
    return out


def point_style(artist) -> tuple:
    return (to_hex(artist.get_color()), artist.get_marker(), artist.get_fillstyle())


def legend_texts(svg: str) -> list[str]:
    start = svg.index('<g id="legend--')
    return re.findall(r"<text[^>]*>([^<]*)</text>", svg[start:])


# ------------------------------------------------------------------------------------------ styles

def test_thirteen_versions_share_no_style():
    """SGEMM's figure: at least thirteen measured versions (more once v13 and later are measured),
    every one with a style of its own."""
    drawn = only_figure("sgemm")
    by_series = series_of(drawn)
    assert 13 <= len(by_series) <= len(OPS["sgemm"].impls)
    styles = {}
    for name, artists in by_series.items():
        line, points = artists[0], artists[1:]
        assert len({point_style(p) for p in points}) == 1, name  # one style along a series
        styles[name] = (point_style(points[0]), line.get_linestyle())
    assert len(set(styles.values())) == len(by_series), styles
    assert len({s[0][0] for s in styles.values()}) == len(PALETTE)  # all ten colours in use


def test_library_versions_are_dashed_and_hollow_and_say_so():
    drawn = only_figure("sgemm")
    op = OPS["sgemm"]
    for name, artists in series_of(drawn).items():
        version = name.split()[0]
        line, point = artists[0], artists[1]
        if origin_of(op, version) == "library":
            assert line.get_linestyle() == "--" and point.get_fillstyle() == "none", name
        else:
            assert line.get_linestyle() == "-" and point.get_fillstyle() == "full", name
    labels = [t.get_text().replace("\n", " ") for t in drawn.legend.get_texts()]
    for version, impl in op.impls.items():
        entry = next(t for t in labels if t.startswith(f"{version} "))
        assert ("(library)" in entry) == (impl.origin == "library"), entry


def test_library_bars_are_hatched_and_hollow():
    drawn = only_figure("warp_divergence")  # its sweep axis is a pattern: bars
    op = OPS["warp_divergence"]
    bars = [a for a in drawn.fig.axes[0].patches if (a.get_gid() or "").startswith("pt")]
    assert bars
    for bar in bars:
        version = drawn.titles[bar.get_gid()].split()[0]
        if origin_of(op, version) == "library":
            assert bar.get_hatch() and bar.get_facecolor()[3] == 0, version
        else:
            assert not bar.get_hatch() and bar.get_facecolor()[3] == 1, version


@pytest.mark.parametrize("n_versions, n_combos", [(1, 1), (13, 1), (40, 1), (150, 1), (3, 4),
                                                  (12, 4), (30, 3)])
def test_any_number_of_series_gets_distinct_styles(n_versions, n_combos):
    keys = [(f"v{i}", (c,)) for i in range(n_versions) for c in range(n_combos)]
    styles, split = series_styles(keys, lambda v: "library" if int(v[1:]) % 4 == 0 else "book")
    assert len({s.key() for s in styles.values()}) == len(keys)  # colour, marker, fill, dashes
    assert len({(s.color, s.hatch, s.library) for s in styles.values()}) == len(keys)  # bars
    for (v, _), s in styles.items():  # a library: hollow and dashed; the book: filled and solid
        assert s.library == (int(v[1:]) % 4 == 0)
        assert (s.fill == "none") == s.library
        first, dash = ("--", 3) if s.library else ("-", 8)
        assert s.dashes == first or s.dashes[1][0] == dash, s
    if split:  # the marker names the combo, the colour the version
        for (_v, c), s in styles.items():
            assert s.marker == MARKERS[c[0]]
        assert len({(v, s.color) for (v, _), s in styles.items()}) == n_versions


# ------------------------------------------------------------------------------------------ legends

def legend_box_checks(drawn) -> None:
    """The legend inside the figure, under everything the axes draw, in text of at least 9 pt."""
    fig = drawn.fig
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box, frame = drawn.legend.get_window_extent(renderer), fig.bbox
    assert frame.x0 - 0.5 <= box.x0 and box.x1 <= frame.x1 + 0.5, (box, frame)
    assert frame.y0 - 0.5 <= box.y0 and box.y1 <= frame.y1 + 0.5, (box, frame)
    for ax in fig.axes:
        assert box.y1 <= ax.get_tightbbox(renderer).y0 + 1, "the legend covers the axes"
    assert all(t.get_fontsize() >= 9 for t in drawn.legend.get_texts())
    assert 7 <= fig.get_figwidth() <= 8


def test_flash_attention_legend_fits_and_names_the_books_kernel():
    drawn = only_figure("flash_attention_fwd")
    legend_box_checks(drawn)
    labels = [t.get_text().replace("\n", " ") for t in drawn.legend.get_texts()]
    op = OPS["flash_attention_fwd"]
    book = [v for v, impl in op.impls.items() if impl.origin == "book"]
    assert book and all(any(t.startswith(f"{v} ") and "(library)" not in t for t in labels)
                        for v in book)
    # versions and the combinations of causal and head dim apart: one entry each
    assert sum(t.startswith("marker: ") for t in labels) == 4
    assert "marker: causal D128" in labels and "marker: D64" in labels


def test_legend_of_many_long_series_fits_inside_the_figure():
    impls = {f"v{i}": ("Triton" if i % 2 else "CUDA", f"{LONG} {i}") for i in range(14)}
    drawn = only_figure("flash_attention_fwd", impls=impls)  # 14 versions x 4 combos: 56 entries
    assert len(drawn.legend.get_texts()) == 56 + 1  # and the ceiling
    legend_box_checks(drawn)


@pytest.mark.parametrize("op_name", ["sgemm", "vector_add", "cpu_vs_gpu", "pointer_chase",
                                     "warp_divergence", "matrix_add"])
def test_every_plot_legend_fits(op_name):
    legend_box_checks(only_figure(op_name))


def test_ladder_legend_below_the_bars_with_superscript_sizes():
    op = OPS["sgemm"]
    drawn = ladder_figure(op, GPU, fake_entry(op))
    legend_box_checks(drawn)
    texts = legend_texts(drawn.svg())
    assert "1024³" in texts and "8192³" in texts
    assert not any("^" in t or "$" in t or "2^10" in t for t in texts), texts
    assert any("library" in t for t in texts)
    bars = [b for b in drawn.fig.axes[0].patches if (b.get_gid() or "").startswith("bar")]
    for bar in bars:
        version = drawn.titles[bar.get_gid()].split()[0]
        assert bool(bar.get_hatch()) == (origin_of(op, version) == "library"), version


def test_no_tex_in_any_label():
    svgs = [only_figure(name).svg() for name in ("sgemm", "cpu_vs_gpu", "pointer_chase",
                                                 "flash_attention_fwd")]
    for svg in svgs:
        for text in re.findall(r"<text[^>]*>([^<]*)</text>", svg):
            assert "$" not in text and "^" not in text and "mathdefault" not in text, text
    assert sup("2^28") == "2²⁸" and size_label({"m": 8192, "n": 8192, "k": 8192}) == "8192³"
    assert axis_ticks("n", [1024, 2**20, 2**28]) == ["2¹⁰", "2²⁰", "2²⁸"]
    assert axis_ticks("s", [1024, 16384]) == ["1024", "16384"]
    assert axis_ticks("bytes", [4096, 2**20, 3 * 2**30]) == ["4 KiB", "1 MiB", "3 GiB"]


# ------------------------------------------------------------------------------------------ the SVG

def titled_groups(svg: str) -> list[tuple[str, str]]:
    return re.findall(r'<g id="([^"]+)">\n<title>([^<]*)</title>', svg)


def test_every_point_has_a_hover_title():
    for op_name in ("sgemm", "flash_attention_fwd", "warp_divergence"):
        op = OPS[op_name]
        drawn = only_figure(op_name)
        svg = drawn.svg()
        groups = titled_groups(svg)
        axis = op.sweep_axis
        order = {s[axis] for s in op.sweep}
        entry = fake_entry(op)
        points = [r for r in entry["records"] if r["size"][axis] in order]
        assert len(groups) == len(points) == len(drawn.titles), op_name
        for gid, title in groups:
            assert gid.startswith("pt") and gid.endswith(f"--{drawn.key}"), gid
            assert re.fullmatch(r"v\d+ \S+, [^:]+: [\d.,e+-]+ \S+", title), title
    sample = dict(titled_groups(only_figure("flash_attention_fwd").svg()))
    assert any(t.startswith("v2 Triton, B4 H32 S4096 D128 causal: ") and t.endswith(" TFLOP/s")
               for t in sample.values())


def test_svg_has_a_role_and_an_accessible_name():
    drawn = only_figure("flash_attention_fwd")
    svg = drawn.svg()
    head = svg[:svg.index(">")]
    assert 'role="img"' in head
    label = re.search(r'aria-label="([^"]+)"', head).group(1)
    assert "FlashAttention forward" in label and "H100" in label and "TFLOP/s" in label
    assert "v0, v1, v2" in label and "from a library" in label
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    assert any(t.startswith("FlashAttention forward: ") for t in texts)  # the figure's title


def test_ids_are_unique_on_a_page_and_references_resolve(tmp_path):
    for gpu in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
        harness.merge(tmp_path / f"{harness.slug(gpu)}.json", gpu,
                      {"sgemm": fake_entry(OPS["sgemm"])}, {})
    page = render_page("<!-- bench:plot sgemm -->\n\n<!-- bench:ladder sgemm -->\n", "p.md",
                       tmp_path)
    assert page.count("<svg") == 4
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1][:5]
    for svg in re.findall(r"<svg.*?</svg>", page, re.S):
        own = set(re.findall(r'\bid="([^"]+)"', svg))
        refs = re.findall(r'href="#([^"]+)"', svg) + re.findall(r"url\(#([^)]+)\)", svg)
        assert refs and set(refs) <= own
        assert len(re.findall(r'<g id="legend--', svg)) == 1  # the browser audit finds it so
    assert render_page("<!-- bench:plot sgemm -->\n", "p.md", tmp_path) == render_page(
        "<!-- bench:plot sgemm -->\n", "p.md", tmp_path)  # deterministic


# ------------------------------------------------------------------------ roofline, timeline, sweep

def crowded_roofline() -> dict:
    """Twenty ops at two intensities (every fp32 element-wise op sits at 1/12 or 1/8) and a few
    GEMMs near the roof: the numbers must find room."""
    points = []
    for i in range(20):
        ai = 1 / 12 if i % 2 else 1 / 8
        points.append({"op": f"op{i}", "impl": "v1", "lang": "CUDA", "dtype": "float32",
                       "size": {"n": 2**28}, "ai": ai, "flops_per_s": ai * 3e12 * (0.9 + i / 200),
                       "fraction_of_roof": 0.9})
    for i in range(4):
        points.append({"op": f"gemm{i}", "impl": "v2", "lang": "Triton", "dtype": "bfloat16",
                       "size": {"m": 4096, "n": 4096, "k": 4096}, "ai": 1365.0,
                       "flops_per_s": (600 + 10 * i) * 1e12, "fraction_of_roof": None})
    return {"points": points, "bandwidth": 3.0e12,
            "roofs": {"gemm_fp32": 50e12, "gemm_tf32": 400e12, "gemm_bf16": 700e12}}


def test_roofline_numbers_do_not_collide():
    g = crowded_roofline()
    drawn = roofline_figure(GPU, g)
    fig, ax = drawn.fig, drawn.fig.axes[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    numbers = [t for t in ax.texts if t.get_text().isdigit()]
    assert sorted(int(t.get_text()) for t in numbers) == list(range(1, len(g["points"]) + 1))
    boxes = [Text.get_window_extent(t, renderer) for t in numbers]  # the text, not its leader line
    roofs = [t.get_window_extent(renderer) for t in ax.texts if not t.get_text().isdigit()]
    half = 7 / 2 * fig.dpi / 72  # the markers: 7 pt
    markers = [Bbox.from_bounds(x - half, y - half, 2 * half, 2 * half) for x, y in
               ax.transData.transform([(p["ai"], p["flops_per_s"] / 1e12) for p in g["points"]])]
    frame = ax.get_window_extent(renderer)
    for i, a in enumerate(boxes):
        assert frame.x0 <= a.x0 and a.x1 <= frame.x1 and frame.y0 <= a.y0 and a.y1 <= frame.y1
        for b in boxes[i + 1:] + roofs + markers:
            assert not a.overlaps(b), (numbers[i].get_text(), a, b)
    legend_box_checks(drawn)
    svg = drawn.svg()
    groups = titled_groups(svg)
    assert len(groups) == len(g["points"])
    assert any(t.startswith("3. op2 v1 (CUDA), float32, 2²⁸: ") for _, t in groups)
    assert 'role="img"' in svg and "Roofline of the H100" in svg


def test_timeline_bars_have_titles_and_the_legend_fits(tmp_path):
    events = [{"name": "k", "kind": kind, "stream": 7, "start_us": 10.0 * i, "dur_us": 9.0}
              for i, kind in enumerate(["h2d", "kernel", "d2h"])]
    path = tmp_path / "outputs" / "gpu-a" / "trace.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"gpu": GPU, "runs": {"serial": events}}))
    drawn, *_ = timeline_figure(path, "trace")
    legend_box_checks(drawn)
    svg = drawn.svg()
    titles = [t for _, t in titled_groups(svg)]
    assert titles[1] == "serial, stream 7: kernel k, 10 to 19 µs (9 µs)"
    assert len(titles) == 3 and 'role="img"' in svg and "Timeline of trace on the H100" in svg


def test_sweep_cells_have_titles_and_written_values():
    configs = [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": w,
                "num_stages": 3, "status": "ok" if (bm, bn) != (64, 64) else "failed",
                "tflops": bm + bn + w, "ms": 1.0}
               for bm in (64, 128) for bn in (64, 128) for w in (4, 8)]
    data = {"configs": configs, "problem": {"m": 1024, "n": 1024, "k": 1024, "dtype": "bfloat16"}}
    drawn = sweep_figure("autotune_test", GPU, data)
    legend_box_checks(drawn)  # the hatched cell is explained below the heatmaps
    svg = drawn.svg()
    titles = dict(titled_groups(svg))
    assert len(titles) == 4 + 2  # BLOCK_M x BLOCK_N, then stages x warps of the chosen tile
    assert any(t.startswith("BLOCK_M 64, BLOCK_N 64: no configuration") for t in titles.values())
    assert "BLOCK_M 128, BLOCK_N 128: 264.0 TFLOP/s (the best configuration of the cell)" in \
        titles.values()
    assert 'role="img"' in svg and "Autotuning sweep autotune_test on the H100" in svg
    values = [t for t in drawn.fig.axes[0].texts]
    assert sorted(t.get_text() for t in values) == ["200", "200", "264"]  # the failed cell: none
    assert all(t.get_path_effects() for t in values)  # drawn as paths: the page CSS cannot recolour


# ------------------------------------------------------------------------------------ import cycle

def test_bench_modules_import_nothing_of_the_site():
    code = ("import sys; import snippets.bench.roofline, snippets.bench.timeline; "
            "print(sorted(m for m in sys.modules if m.startswith('snippets.site')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "[]"
    for name in ("roofline", "timeline"):  # not even lazily, inside a function
        tree = ast.parse((REPO_ROOT / "snippets" / "bench" / f"{name}.py").read_text())
        imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m and m.startswith("snippets.site")], name
