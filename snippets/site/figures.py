"""Plots rendered from the committed results as inline SVG: ``bench:plot`` and ``bench:ladder``, and
what every figure of the site shares.

- The style of a series (:func:`series_styles`): a colour, a marker and a line that no other series
  of the figure has; the book's versions solid with filled markers (solid bars), a library's dashed
  with hollow markers (hatched bars), and the legend says "(library)".
- The legend (:func:`legend_below`): under the axes, inside the figure, in as many columns as its
  entries leave room for (long entries wrapped); the figure grows by its height, so it is never
  clipped.
- The SVG (:func:`figure_svg`): ``role="img"`` and an ``aria-label`` naming the op, the GPU and what
  is plotted; a ``<title>`` in every data point's group (``artist.set_gid``), shown on hover without
  JavaScript; every id of the figure suffixed with the figure's key, so figures on one page share
  none.

The legend stays in the SVG rather than an HTML list under it: it is part of the image a reader
saves, and the browser audit (tests/site_audit.py) measures it there. Its text is at least 9 pt on a
figure 7.2 in wide, about 7 px on a 420 px screen and sharp when zoomed (the SVG is vector).
"""

from __future__ import annotations

import io
import math
import re
import textwrap
from dataclasses import dataclass
from html import escape
from typing import Any, Callable

from snippets.registry import Op
from snippets.site.fmt import _cname, _slug, short_size
from snippets.site.tables import _headline_dtype, _missing, gpu_short, origin_of

FIG_WIDTH = 7.2  # inches: scaled with the page, never wider than the text column
LEGEND_PT = 9.5  # the smallest text of a figure (ticks and legend), in points
GREY = "#888888"  # frames, ticks, reference lines (ceilings, roofs): read on light and dark pages
# Ten colours that read on a light and on a dark page (tab10 without the grey of reference lines).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
           "#17becf", "#e6a817")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h", "p")  # 11, coprime with the 10 colours
BOOK_FILLS = ("full", "left", "bottom", "right", "top")
BOOK_HATCHES = ("", "..", "oo", "**", "++")
LIB_HATCHES = ("///", "\\\\\\", "xxx", "---", "|||")
SUPERSCRIPTS = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


# ------------------------------------------------------------------------------------------- labels

def sup(text: str) -> str:
    """Exponents written ``^N`` (``short_size(..., html=False)``) as Unicode superscripts:
    ``2^28`` -> ``2²⁸``, ``8192^3`` -> ``8192³``."""
    return re.sub(r"\^(-?\d+)", lambda m: m.group(1).translate(SUPERSCRIPTS), text)


def size_label(size: dict) -> str:
    """A size as a legend or a hover title writes it: ``8192³``, ``B4 H32 S4096 D128 causal``."""
    return sup(short_size(size, html=False)) or "default"


def version_label(op: Op, impl: str, lang: str, desc: str = "") -> str:
    """``v3 CUDA: shared-memory tiles``; a library's says so: ``v0 PyTorch (library): cuBLAS``."""
    lib = " (library)" if origin_of(op, impl) == "library" else ""
    return f"{impl} {lang}{lib}" + (f": {desc}" if desc else "")


def num(v: float) -> str:
    """A value for a hover title: three significant digits, thousands separated."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def plain(v: float) -> str:
    """A tick of a log axis as a number, never ``10^k`` in TeX: ``300``, ``0.02``."""
    return f"{v:,.0f}" if v >= 1 else f"{v:.3g}"


def plain_log_ticks(axis) -> None:
    """Label a log axis with plain numbers (the major ticks, and the minor ones where matplotlib
    would label them)."""
    from matplotlib.ticker import LogFormatter

    class PlainLog(LogFormatter):
        def __call__(self, x, pos=None):
            return plain(x) if super().__call__(x, pos) else ""

    axis.set_major_formatter(PlainLog())
    axis.set_minor_formatter(PlainLog(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def _pow2(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0


def axis_ticks(axis: str, values: list) -> list[str]:
    """Tick labels of a sweep axis: ``4 KiB`` for bytes; powers of two as ``2²⁸`` on an axis that
    reaches 2^16 (then all of them from 2^10, so the labels read alike); other numbers as such."""
    values = [int(v) if isinstance(v, float) and v.is_integer() else v for v in values]
    as_power = any(_pow2(v) and v >= 1 << 16 for v in values)
    out = []
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            out.append(f"{v:g}" if isinstance(v, float) else str(v))
        elif "bytes" in axis:
            unit = next(((u, s) for u, s in (("GiB", 30), ("MiB", 20), ("KiB", 10))
                         if v >= 1 << s and v % (1 << s) == 0), None)
            out.append(f"{v >> unit[1]} {unit[0]}" if unit else f"{v} B")
        elif as_power and _pow2(v) and v >= 1 << 10:
            out.append(sup(f"2^{v.bit_length() - 1}"))
        else:
            out.append(str(v))
    return out


def _vnum(impl: str) -> tuple[int, str]:
    m = re.fullmatch(r"v(\d+)", impl)
    return (int(m.group(1)), "") if m else (10**9, impl)


# ------------------------------------------------------------------------------------------- styles

@dataclass(frozen=True)
class Style:
    """How one series is drawn. ``library``: dashed line, hollow markers, hatched bars."""

    color: str
    marker: str
    fill: str  # a Line2D fillstyle; "none" (hollow) for a library
    dashes: Any  # "-" for the book, "--" for a library, a dash tuple for variants past the first
    hatch: str
    library: bool

    def key(self) -> tuple:
        return (self.color, self.marker, self.fill, str(self.dashes))

    def line(self) -> dict:
        return {"color": self.color, "ls": self.dashes, "lw": 1.5 if self.library else 2.0}

    def points(self) -> dict:
        return {"color": self.color, "marker": self.marker, "ls": "none",
                "ms": 7 if self.library else 6.5, "fillstyle": self.fill,
                "markerfacecoloralt": "none", "mew": 1.4}

    def handle(self, with_marker: bool = True):
        from matplotlib.lines import Line2D

        look = self.line()
        if with_marker:
            look.update((k, v) for k, v in self.points().items() if k != "ls")
        return Line2D([], [], **look)

    def bar(self) -> dict:
        if self.library:
            return {"facecolor": "none", "edgecolor": self.color, "hatch": self.hatch, "lw": 1.0}
        return {"facecolor": self.color, "edgecolor": self.color, "hatch": self.hatch or None,
                "lw": 0.6, "hatchcolor": "white"}

    def patch(self):
        from matplotlib.patches import Patch

        return Patch(**self.bar())


def _variant(colour: int, m: int, variant: int, h: int, library: bool) -> Style:
    """A style from the index of its colour, of its marker (``m``), of its variant (past the pairs
    of colour and marker: other fills and dashes) and of its hatch (``h``: bars have no marker, so
    the hatch tells apart what the marker does on a line)."""
    marker = MARKERS[m % len(MARKERS)]
    if library:
        dashes = "--" if variant == 0 else (0, (3, 1 + variant))
        hatch = LIB_HATCHES[h % len(LIB_HATCHES)] * (1 + h // len(LIB_HATCHES))
        return Style(PALETTE[colour], marker, "none", dashes, hatch, True)
    fill = BOOK_FILLS[variant % len(BOOK_FILLS)]
    dashes = "-" if variant < len(BOOK_FILLS) else (0, (8, 1 + variant // len(BOOK_FILLS)))
    hatch = "" if h == 0 else BOOK_HATCHES[1 + (h - 1) % 4] * (1 + (h - 1) // 4)
    return Style(PALETTE[colour], marker, fill, dashes, hatch, False)


def series_styles(series: list[tuple[str, Any]], origin: Callable[[str], str]) -> tuple[dict, bool]:
    """A style per ``(version, combo)`` of ``series`` (``combo``: the values of the size keys that
    make lines of their own, such as FlashAttention's causal and head dim; ``()`` when there are
    none), no two alike, and whether the legend can list versions and combos apart.

    Colours go to versions, the book's from the start of the palette and a library's after them: ten
    versions before a colour comes back, and then on a version of the other origin (other line,
    other marker fill), the book's first, usually far from a library's baseline. With several combos
    and at most ten versions of each origin, the marker names the combo (``split``); otherwise the
    marker goes on cycling with the version. Past what colours and markers tell apart, fill styles,
    dash patterns and hatch densities go on: any number of series get distinct styles."""
    versions = list(dict.fromkeys(v for v, _ in series))
    combos = list(dict.fromkeys(c for _, c in series))
    lib = [v for v in versions if origin(v) == "library"]
    book = [v for v in versions if origin(v) != "library"]
    n = len(PALETTE)
    split = len(combos) > 1 and max(len(lib), len(book)) <= n
    out = {}
    for v, c in series:
        is_lib = origin(v) == "library"
        k = (lib if is_lib else book).index(v)
        if len(combos) == 1:  # colour k % 10 and marker k % 11: 110 versions before a pair repeats
            m, variant, h = k, k // (n * len(MARKERS)), k // n
        else:  # the marker names the combo (and the round of colours)
            m = combos.index(c) + len(combos) * (k // n)
            variant, h = m // len(MARKERS), m
        out[(v, c)] = _variant(((len(book) + k) if is_lib else k) % n, m, variant, h, is_lib)
    return out, split


# ------------------------------------------------------------------------------------------ figures

def style_axes(ax) -> None:
    """The book's plot style: grey frame and ticks, a light grid (for light and dark pages)."""
    for spine in ax.spines.values():
        spine.set_color(GREY)
    ax.tick_params(colors=GREY, labelcolor=GREY)
    ax.grid(alpha=0.25)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "kernels-measured",
                         "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10,
                         "xtick.labelsize": LEGEND_PT, "ytick.labelsize": LEGEND_PT,
                         "legend.fontsize": LEGEND_PT, "figure.titlesize": 11})
    return plt


def new_figure(height: float, width: float = FIG_WIDTH, **kw):
    """A figure laid out by matplotlib's constrained layout (which keeps room for a legend below the
    axes) and its axes (``kw``: as for ``Figure.subplots``)."""
    plt = _pyplot()
    fig = plt.figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(**kw)


def _measure(fig, renderer, fontsize: float) -> Callable[[str], float]:
    """The width in inches of a text at ``fontsize``."""
    from matplotlib.text import Text

    probe = Text(0, 0, "", fontsize=fontsize)
    probe.set_figure(fig)

    def width(text: str) -> float:
        probe.set_text(text)
        return probe.get_window_extent(renderer).width / fig.dpi

    return width


def _wrap(text: str, room: float, width: Callable[[str], float]) -> str | None:
    """``text`` wrapped at spaces to lines at most ``room`` inches wide (None: a word is wider)."""
    if width(text) <= room:
        return text
    for n in range(max(4, int(len(text) * room / width(text)) + 2), 3, -1):
        lines = textwrap.wrap(text, n, break_long_words=False)
        if all(width(line) <= room for line in lines):
            return "\n".join(lines)
    return None


def legend_below(fig, handles: list, labels: list[str], fontsize: float = LEGEND_PT,
                 max_cols: int = 4, groups: list[int] | None = None):
    """A legend under the axes, inside the figure: the fewest columns whose height is within a
    quarter of the lowest (entries wrapped to fit their column), and the figure grown by the
    legend's height. ``groups``: sizes of consecutive groups of entries (versions, then markers),
    each in a column of its own when there are as many columns as groups. The legend's SVG group is
    ``legend…`` (the browser audit finds it by that id)."""
    from matplotlib.lines import Line2D

    renderer = fig.canvas.get_renderer()
    width = _measure(fig, renderer, fontsize)
    em = fontsize / 72
    room = fig.get_figwidth() - 0.35  # the legend's border and the figure's own padding
    n = len(labels)
    options = []
    for ncol in range(1, max(1, min(n, max_cols)) + 1):
        col = (room - (ncol - 1) * 2.0 * em) / ncol - 2.8 * em  # column spacing, handle, its pad
        wrapped = [_wrap(label, col, width) for label in labels]
        if any(w is None for w in wrapped):
            continue
        hs, ls = list(handles), list(wrapped)
        if groups and len(groups) == ncol > 1 and sum(groups) == n:  # each group a full column
            tall = max(groups)
            hs, ls, at = [], [], 0
            for g in groups:
                hs += handles[at:at + g] + [Line2D([], [], ls="none")] * (tall - g)
                ls += wrapped[at:at + g] + [""] * (tall - g)
                at += g
        k = len(ls)
        bounds = [i * (k // ncol) + min(i, k % ncol) for i in range(ncol + 1)]  # np.array_split
        height = max(sum(t.count("\n") + 1 for t in ls[a:b]) for a, b in zip(bounds, bounds[1:]))
        options.append((height, ncol, hs, ls))
    if not options:  # a word wider than the figure: one column, as it is
        options = [(n, 1, handles, labels)]
    least = min(o[0] for o in options)
    _, ncol, hs, ls = next(o for o in options if o[0] <= 1.25 * least)
    leg = fig.legend(hs, ls, loc="outside lower center", ncol=ncol, frameon=False,
                     fontsize=fontsize, columnspacing=2.0, handlelength=2.0, handletextpad=0.8)
    leg.set_gid("legend")
    grow = leg.get_window_extent(renderer).height / fig.dpi + 0.08
    fig.set_figheight(fig.get_figheight() + grow)
    return leg


@dataclass
class Drawn:
    """A figure before it becomes SVG (the tests look at it): its key (the suffix of its ids), its
    accessible name, the hover title of every data point's group id, and its legend."""

    fig: Any
    key: str
    label: str
    titles: dict[str, str]
    legend: Any = None

    def svg(self) -> str:
        return figure_svg(self.fig, self.key, self.label, self.titles)


def _unique_ids(svg: str, key: str) -> str:
    ids = set(re.findall(r'\bid="([^"]+)"', svg))

    def new(i: str) -> str:
        return f"{i}--{key}" if i in ids else i

    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{new(m.group(1))}"', svg)
    svg = re.sub(r'href="#([^"]+)"', lambda m: f'href="#{new(m.group(1))}"', svg)
    return re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{new(m.group(1))})", svg)


def figure_svg(fig, key: str = "", label: str = "", titles: dict[str, str] | None = None) -> str:
    """A matplotlib figure as inline SVG for a Markdown page: reproducible, no date, no blank lines;
    with ``titles``, a ``<title>`` first in the group of each id (a hover tooltip, no JavaScript);
    with ``key``, every id suffixed ``--key`` (figures on one page share none); with ``label``,
    ``role="img"`` and that ``aria-label``."""
    import matplotlib.pyplot as plt

    if fig.get_layout_engine() is None:
        fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", transparent=True, metadata={"Date": None})
    plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    for gid, text in (titles or {}).items():
        tag = f'<g id="{gid}">'
        if svg.count(tag) != 1:
            raise ValueError(f"figure {key!r}: {svg.count(tag)} groups {gid!r} to title, not one")
        svg = svg.replace(tag, f"{tag}\n<title>{escape(text, quote=False)}</title>", 1)
    if key:
        svg = _unique_ids(svg, key)
    if label:
        svg = svg.replace("<svg ", f'<svg role="img" aria-label="{escape(label)}" ', 1)
    return "\n".join(line for line in svg.splitlines() if line.strip())  # no blank line in raw HTML


def figure_html(svg: str, caption: str) -> str:
    return f'<figure class="bench-plot">\n{svg}\n<figcaption>{caption}</figcaption>\n</figure>'


def figure_key(*parts: str) -> str:
    """The suffix of a figure's ids: its kind, op, GPU and dtype, as a slug."""
    return "-".join(_slug(str(p)) for p in parts if p)


# ------------------------------------------------------------------------------------- bench:ladder

def ladder_figure(op: Op, gpu: str, entry: dict) -> Drawn | None:
    """Every GPU version's rate as a percentage of the op's ceiling: one group of bars per version,
    one bar per measured size (colour: the size; hatched: a library's version)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    dtype = _headline_dtype(op, entry)
    rows = [r for r in entry["records"] if r["dtype"] == dtype and r["timer"] == "device"
            and r.get("fraction_of_ceiling") is not None]
    if not rows:
        return None
    impls = sorted(dict.fromkeys(r["impl"] for r in rows), key=_vnum)
    sizes = list(dict.fromkeys(r["size_key"] for r in
                               sorted(rows, key=lambda r: r["size"][op.sweep_axis])))
    size_of = {r["size_key"]: r["size"] for r in rows}
    styles, _ = series_styles([(sk, ()) for sk in sizes], lambda _: "book")
    lib = [v for v in impls if origin_of(op, v) == "library"]
    fig, ax = new_figure(4.3)
    width = 0.8 / max(1, len(sizes))
    c = entry["ceiling"]
    titles: dict[str, str] = {}
    for k, sk in enumerate(sizes):
        st = styles[(sk, ())]
        for r in (r for r in rows if r["size_key"] == sk):
            look = st.bar()
            if r["impl"] in lib:
                look.update(facecolor="none", hatch=(st.hatch or "") + "///", lw=1.0)
            x = impls.index(r["impl"]) + (k - (len(sizes) - 1) / 2) * width
            (bar,) = ax.bar([x], [100 * r["fraction_of_ceiling"]], width, **look)
            gid = f"bar{len(titles)}"
            bar.set_gid(gid)
            titles[gid] = (f"{r['impl']} {r['lang']}, {size_label(r['size'])}: "
                           f"{100 * r['fraction_of_ceiling']:.1f}% of {_cname(c['name'])} "
                           f"({num(r['value'])} {r['unit']})")
    ax.set_xticks(range(len(impls)), [f"{v}\nlibrary" if v in lib else v for v in impls])
    ax.axhline(100, ls=":", lw=1.2, color=GREY)
    ax.set_ylim(0, max(105, max(100 * r["fraction_of_ceiling"] for r in rows) * 1.05))
    ax.set_ylabel(f"% of {_cname(c['name'])} ({c['value']:,.0f} {c['unit']})")
    ax.set_xlabel("version")
    style_axes(ax)
    ax.set_title(f"{op.title}: % of the ceiling per version, {gpu} ({dtype})")
    handles = [styles[(sk, ())].patch() for sk in sizes]
    labels = [size_label(size_of[sk]) for sk in sizes]
    if lib:
        handles.append(Patch(facecolor="none", edgecolor=GREY, hatch="///"))
        labels.append("hatched: a library's version")
    handles.append(Line2D([], [], ls=":", lw=1.2, color=GREY))
    labels.append(f"100% = {_cname(c['name'])}, {c['value']:,.0f} {c['unit']}")
    leg = legend_below(fig, handles, labels)
    label = (f"{op.title} on the {gpu_short(gpu)} ({dtype}): each version's rate as a percentage "
             f"of {_cname(c['name'])}, one bar per size ({', '.join(labels[:len(sizes)])}), for "
             f"{', '.join(impls)}" + (f"; {', '.join(lib)} from a library" if lib else ""))
    return Drawn(fig, figure_key("ladder", op.name, gpu, dtype), label, titles, leg)


def render_ladder(op: Op, results: dict[str, dict]) -> str:
    """Every GPU version's rate as a percentage of the op's ceiling: one group of bars per version,
    one bar per measured size (the sizes of the sweep, in order), so a ladder of optimisation steps
    reads left to right."""
    if op.ceiling is None:
        raise ValueError(f"bench:ladder {op.name}: a ladder needs a ceiling to be a percentage of")
    figs = []
    for gpu, data in results.items():
        entry = data["ops"].get(op.name)
        drawn = ladder_figure(op, gpu, entry) if entry is not None else None
        if drawn is None:
            continue
        p = entry["provenance"]
        cap = (f"Measured on {p['gpu']}, commit {str(p['commit'])[:10]}, {p['date'][:10]}; each "
               "bar is a median of event-timed calls divided by the ceiling measured in the same "
               "run (hover a bar for its value).")
        figs.append(figure_html(drawn.svg(), cap))
    return "\n\n".join(figs) if figs else _missing(op)


# --------------------------------------------------------------------------------------- bench:plot

def _series_keys(op: Op) -> list[str]:
    """Size keys other than the sweep axis that differ between sweep points (FlashAttention's causal
    and d): each combination of their values is a line of its own, so points of one line share
    everything but the axis."""
    axis = op.sweep_axis
    keys = sorted({k for sz in op.sweep for k in sz if k != axis})
    by_axis: dict = {}
    for sz in op.sweep:
        by_axis.setdefault(sz[axis], []).append(sz)
    return [k for k in keys
            if any(len({str(sz.get(k)) for sz in group}) > 1 for group in by_axis.values())]


def plot_figure(op: Op, gpu: str, entry: dict, rows: list[dict], y: str = "value",
                dtype: str = "") -> Drawn:
    """One GPU's sweep: rate (or time) against the sweep axis, a line per version and combination of
    the other size keys that vary (bars when the axis is not a number)."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator

    axis = op.sweep_axis
    order = list(dict.fromkeys(s[axis] for s in op.sweep))
    categorical = not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in order)
    series = _series_keys(op)
    combo_order = list(dict.fromkeys(tuple(s.get(c) for c in series) for s in op.sweep))

    def combo_of(r: dict) -> tuple:
        return tuple(r["size"].get(c) for c in series)

    def rank(kc: tuple) -> tuple:
        return _vnum(kc[0]), combo_order.index(kc[1]) if kc[1] in combo_order else len(combo_order)

    keys = sorted(dict.fromkeys((r["impl"], combo_of(r)) for r in rows
                                if r["size"].get(axis) in order), key=rank)
    styles, split = series_styles(keys, lambda v: origin_of(op, v))
    info = {r["impl"]: (r["lang"], r["desc"]) for r in rows}
    fig, ax = new_figure(4.3)
    width = 0.8 / max(1, len(keys))
    unit = "ms" if y == "ms" else op.metric
    titles: dict[str, str] = {}
    handles, labels = [], []
    for k, (name, combo) in enumerate(keys):
        st = styles[(name, combo)]
        pts = sorted(((order.index(r["size"][axis]), r) for r in rows if r["impl"] == name
                      and combo_of(r) == combo and r["size"].get(axis) in order),
                     key=lambda t: t[0])
        vals = [r["ms"] if y == "ms" else r["value"] for _, r in pts]
        if categorical:
            xs = [i + (k - (len(keys) - 1) / 2) * width for i, _ in pts]
            artists = list(ax.bar(xs, vals, width, **st.bar()).patches)
        else:
            xs = [order[i] for i, _ in pts]
            ax.plot(xs, vals, zorder=2, **st.line())
            artists = [ax.plot([x], [v], zorder=3, **st.points())[0] for x, v in zip(xs, vals)]
        for artist, (_, r), v in zip(artists, pts, vals):
            gid = f"pt{len(titles)}"
            artist.set_gid(gid)
            titles[gid] = f"{name} {r['lang']}, {size_label(r['size'])}: {num(v)} {unit}"
        if categorical or not split:  # an entry per series
            combo_text = f", {size_label(dict(zip(series, combo)))}" if series else ""
            handles.append(st.patch() if categorical else st.handle())
            labels.append(version_label(op, name, *info[name]) + combo_text)
    if split and not categorical:  # an entry per version (colour and line), then per combo (marker)
        for name in dict.fromkeys(v for v, _ in keys):
            handles.append(styles[next(kc for kc in keys if kc[0] == name)].handle(False))
            labels.append(version_label(op, name, *info[name]))
        for j, combo in enumerate(dict.fromkeys(c for _, c in keys)):
            handles.append(Line2D([], [], ls="none", marker=MARKERS[j % len(MARKERS)], color=GREY,
                                  ms=6.5))
            labels.append("marker: " + size_label(dict(zip(series, combo))))
    if categorical:
        ax.set_xticks(range(len(order)), [str(v) for v in order])
    else:
        ax.set_xscale("log", base=2)
        ticks = sorted(order)[::math.ceil(len(order) / 8)]
        ax.set_xticks(ticks, axis_ticks(axis, ticks))
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(axis)
    c = entry["ceiling"]
    if y == "ms" or c is None:  # times, and latencies (steps of several x): a log axis
        ax.set_yscale("log")
        plain_log_ticks(ax.yaxis)
        ax.set_ylabel("time per call (ms)" if y == "ms" else op.metric)
    else:
        ax.set_ylabel(op.metric)
        ax.axhline(c["value"], ls=":", lw=1.2, color=GREY)
        handles.append(Line2D([], [], ls=":", lw=1.2, color=GREY))
        labels.append(f"ceiling: {_cname(c['name'])}, {c['value']:,.0f} {c['unit']}")
    style_axes(ax)
    ax.set_title(f"{op.title}: {gpu}, {dtype}")
    versions = list(dict.fromkeys(v for v, _ in keys))
    groups = [len(versions), len(labels) - len(versions)] if split and not categorical else None
    leg = legend_below(fig, handles, labels, groups=groups)
    lib = [v for v in versions if origin_of(op, v) == "library"]
    shape = "bars" if categorical else "a line"
    label = (f"{op.title} on the {gpu_short(gpu)} ({dtype}): "
             f"{'time per call' if y == 'ms' else op.metric} against {axis}, {shape} per version: "
             f"{', '.join(versions)}" + (f" ({', '.join(lib)} from a library)" if lib else "")
             + (f"; one per {' and '.join(series)}" if series else ""))
    key = figure_key("plot", op.name, gpu, dtype, "ms" if y == "ms" else "")
    return Drawn(fig, key, label, titles, leg)


def plot_figures(op: Op, results: dict[str, dict], y: str = "value",
                 dtype: str | None = None) -> list[tuple[Drawn, dict]]:
    """The figure of each GPU that measured ``op`` in ``dtype`` (its headline dtype unless given),
    with the results entry it was drawn from."""
    out = []
    for gpu, data in results.items():
        entry = data["ops"].get(op.name)
        if entry is None:
            continue
        want = dtype or _headline_dtype(op, entry)
        rows = [r for r in entry["records"] if r["dtype"] == want]
        if rows:
            out.append((plot_figure(op, gpu, entry, rows, y, want), entry))
    return out


def render_plot(op: Op, results: dict[str, dict], y: str = "value",
                dtype: str | None = None) -> str:
    figs = []
    for drawn, entry in plot_figures(op, results, y, dtype):
        p = entry["provenance"]
        cap = (f"Measured on {p['gpu']}, commit {str(p['commit'])[:10]}, {p['date'][:10]}; "
               f"medians of event-timed calls (hover a point for its value).")
        figs.append(figure_html(drawn.svg(), cap))
    return "\n\n".join(figs) if figs else _missing(op)
