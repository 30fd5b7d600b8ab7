"""``bench:roofline``: every op's best result on the roofline of each GPU, drawn from the model in
snippets.bench.roofline (intensities, roofs, points), with the table of its points and the intensity
of every registered op.

Each point carries a number, placed by a small search (around the point, farther out with a leader
line when it is crowded) so that no number covers another number, a marker or a roof's label; the
legend and the table below the figure say which op each number is, and hovering a point shows its
values.
"""

from __future__ import annotations

import math

from snippets.bench.roofline import ROOF_LABEL, ridge_point, roofline_points
from snippets.registry import dtype_name
from snippets.op_index import load_all
from snippets.site.figures import (GREY, Drawn, figure_html, figure_key, legend_below, new_figure,
                                   num, plain_log_ticks, series_styles, size_label, style_axes)
from snippets.site.tables import gpu_short

LABEL_PT = 9  # the points' numbers
# Where a number may go, in points from its marker: the eight directions at growing distances.
# Beyond the second ring a leader line joins the number to its marker.
DIRECTIONS = ((1, 0), (1, 1), (0, 1), (-1, 1), (-1, 0), (-1, -1), (0, -1), (1, -1))
RINGS = (6, 10, 16, 24, 34)


def _link(op_name: str, chapter: str, prefix: str) -> str:
    return f"[`{op_name}`]({prefix}{chapter})"


def _fmt_ai(ai: float) -> str:
    return f"{ai:.3g}"


def _fmt_rate(flops_per_s: float | None = None, bytes_per_s: float | None = None) -> str:
    parts = []
    if flops_per_s is not None:
        parts.append(f"{flops_per_s / 1e12:,.3g} TFLOP/s")
    if bytes_per_s is not None:
        parts.append(f"{bytes_per_s / 1e9:,.0f} GB/s")
    return ", ".join(parts)


def render_intensity_table(link_prefix: str = "../") -> str:
    """Every registered op's arithmetic intensity at its headline size, from the cost models alone
    (no GPU). ``link_prefix`` turns a chapter path relative to docs/ into a link from the page
    (``../`` from a page one level down, such as docs/part3/roofline.md)."""
    from snippets.site.fmt import short_size

    lines = ["| op | headline size | dtype | FLOPs | bytes | FLOP/byte |",
             "|:--|:--|:--|--:|--:|--:|"]
    for name, op in sorted(load_all().items(), key=lambda kv: (kv[1].part, kv[0])):
        dtype = op.timed_dtypes()[0]
        flops, nbytes = op.flops(op.headline, dtype), op.bytes_moved(op.headline, dtype)
        ai = _fmt_ai(flops / nbytes) if flops else "0"
        lines.append(f"| {_link(name, op.chapter, link_prefix)} | {short_size(op.headline)} | "
                     f"{dtype_name(dtype)} | {_count(flops)} | {_count(nbytes)} | {ai} |")
    return "\n".join(lines) + "\n"


def _count(n: float) -> str:
    """A count with an SI prefix and three significant digits: 16.8 M, 201 M, 1.10 T."""
    if n < 1000:
        return f"{n:,.0f}"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}&nbsp;{prefix}"
    return f"{n:,.0f}"


def _overlaps(box, others, pad: float = 1.0) -> bool:
    return any(box.x0 < o.x1 + pad and o.x0 < box.x1 + pad
               and box.y0 < o.y1 + pad and o.y0 < box.y1 + pad for o in others)


def place_labels(fig, ax, points: list[tuple[float, float, str]], marker_pt: float,
                 obstacles: list) -> list:
    """Put each text of ``points`` (x, y, text in data coordinates) next to its point where it
    overlaps no marker, no text placed before it and none of ``obstacles`` (display boxes), inside
    the axes: the first free place of :data:`DIRECTIONS` x :data:`RINGS`, with a leader line from
    the third ring on; where none is free, the place that overlaps least. The figure's layout is
    frozen first (the places are in display coordinates). Returns the annotations."""
    from matplotlib.transforms import Bbox

    fig.canvas.draw()  # the layout engine places the axes; then it must not move them again
    fig.set_layout_engine("none")
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    half = marker_pt / 2 * fig.dpi / 72
    taken = list(obstacles)
    for x, y in ((x, y) for x, y, _ in points):
        px, py = ax.transData.transform((x, y))
        taken.append(Bbox([[px - half, py - half], [px + half, py + half]]))
    out = []
    for x, y, text in points:
        best = None
        for ring, r in enumerate(RINGS):
            for dx, dy in DIRECTIONS:
                scale = r / math.hypot(dx, dy)
                ann = ax.annotate(text, (x, y), xytext=(dx * scale, dy * scale),
                                  textcoords="offset points", fontsize=LABEL_PT,
                                  ha={1: "left", 0: "center", -1: "right"}[dx],
                                  va={1: "bottom", 0: "center", -1: "top"}[dy])
                box = ann.get_window_extent(renderer)
                inside = (frame.x0 <= box.x0 and box.x1 <= frame.x1
                          and frame.y0 <= box.y0 and box.y1 <= frame.y1)
                clash = sum(_overlaps(box, [o]) for o in taken) + (0 if inside else 100)
                ann.remove()
                if best is None or clash < best[0]:
                    best = (clash, ring, (dx * scale, dy * scale), ann.get_ha(), ann.get_va(), box)
                if clash == 0:
                    break
            if best[0] == 0:
                break
        _, ring, offset, ha, va, box = best
        leader = {"arrowprops": {"arrowstyle": "-", "color": GREY, "lw": 0.6, "shrinkA": 0,
                                 "shrinkB": half * 72 / fig.dpi + 1}} if ring >= 2 else {}
        ann = ax.annotate(text, (x, y), xytext=offset, textcoords="offset points",
                          fontsize=LABEL_PT, ha=ha, va=va, **leader)
        taken.append(box)
        out.append(ann)
    return out


def roofline_figure(gpu: str, g: dict) -> Drawn:
    """The roofline of one GPU: the measured roofs, a numbered point per op (its best version)."""
    from matplotlib.lines import Line2D

    fig, ax = new_figure(5.0)
    pts, bw, roofs = g["points"], g["bandwidth"], g["roofs"]
    ridges = [ridge_point(peak, bw) for peak in roofs.values()] if bw else []
    ais = [p["ai"] for p in pts] + ridges
    x_lo = 10 ** math.floor(math.log10(min(ais + [0.05]) / 2))
    x_hi = 10 ** math.ceil(math.log10(max(ais + [10.0]) * 4))
    roof_texts = []
    if bw:  # the memory roof, up to the highest ridge (beyond it every compute roof is lower)
        x_top = max(ridges) if ridges else x_hi
        ax.plot([x_lo, x_top], [x_lo * bw / 1e12, x_top * bw / 1e12], ls="--", lw=1.2, color=GREY)
        roof_texts.append(ax.annotate(f"copy {bw / 1e9:,.0f} GB/s",
                                      (x_lo * 1.3, x_lo * 1.3 * bw / 1e12), fontsize=LABEL_PT,
                                      va="bottom", color=GREY))
    groups: list[list[tuple[str, float]]] = []  # roofs within 15% of each other share one label
    for name, peak in sorted(roofs.items(), key=lambda kv: kv[1]):
        if groups and peak < groups[-1][0][1] * 1.15:
            groups[-1].append((name, peak))
        else:
            groups.append([(name, peak)])
    for group in groups:
        for name, peak in group:
            start = ridge_point(peak, bw) if bw else x_lo
            ax.plot([start, x_hi], [peak / 1e12, peak / 1e12], ls="--", lw=1.2, color=GREY)
        label = " / ".join(f"{ROOF_LABEL.get(name, name)} {peak / 1e12:,.0f}"
                           for name, peak in group)
        roof_texts.append(ax.annotate(f"{label} TFLOP/s", (x_hi / 1.2, group[-1][1] / 1e12 * 1.1),
                                      ha="right", fontsize=LABEL_PT, color=GREY))
    styles, _ = series_styles([(str(i), ()) for i in range(1, len(pts) + 1)], lambda _: "book")
    titles: dict[str, str] = {}
    handles, labels = [], []
    for i, p in enumerate(pts, 1):
        st = styles[(str(i), ())]
        y = p["flops_per_s"] / 1e12
        (dot,) = ax.plot([p["ai"]], [y], zorder=3, **st.points())
        gid = f"pt{i}"
        dot.set_gid(gid)
        frac = ("" if p.get("fraction_of_roof") is None
                else f", {100 * p['fraction_of_roof']:.1f}% of the roof at its intensity")
        titles[gid] = (f"{i}. {p['op']} {p['impl']} ({p['lang']}), {p['dtype']}, "
                       f"{size_label(p['size'])}: {num(p['ai'])} FLOP/byte, "
                       f"{num(y)} TFLOP/s{frac}")
        handles.append(Line2D([], [], **st.points()))
        labels.append(f"{i}  {p['op']} {p['impl']}")
    ys = [p["flops_per_s"] / 1e12 for p in pts] + [r / 1e12 for r in roofs.values()]
    if bw:
        ys.append(x_lo * bw / 1e12)
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_ticks(ax.xaxis)
    plain_log_ticks(ax.yaxis)
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(min(ys) / 3, max(ys) * 3)
    ax.set_xlabel("arithmetic intensity (FLOP/byte, cost model at the headline size)")
    ax.set_ylabel("TFLOP/s (cost-model FLOPs / time)")
    style_axes(ax)
    ax.set_title(f"Roofline: {gpu}")
    leg = legend_below(fig, handles, labels)
    renderer = fig.canvas.get_renderer()
    fig.canvas.draw()
    obstacles = [t.get_window_extent(renderer) for t in roof_texts]
    numbers = [(p["ai"], p["flops_per_s"] / 1e12, str(i)) for i, p in enumerate(pts, 1)]
    place_labels(fig, ax, numbers, 7.0, obstacles)
    roofs_text = [f"copy {bw / 1e9:,.0f} GB/s"] if bw else []
    roofs_text += [f"{ROOF_LABEL.get(n, n)} {v / 1e12:,.0f} TFLOP/s" for n, v in roofs.items()]
    label = (f"Roofline of the {gpu_short(gpu)}: {len(pts)} ops, numbered as in the table below, "
             "at the arithmetic intensity of their cost model (FLOP/byte) against the TFLOP/s of "
             "their fastest own version, under the measured roofs: " + ", ".join(roofs_text))
    return Drawn(fig, figure_key("roofline", gpu), label, titles, leg)


def _gpu_block(gpu: str, g: dict, data: dict, link_prefix: str) -> str:
    parts = []
    dates = sorted(e["provenance"]["date"][:10] for e in data.get("ops", {}).values()
                   if e.get("provenance"))
    when = f"{dates[0]} to {dates[-1]}" if dates and dates[0] != dates[-1] else (
        dates[0] if dates else "?")
    if g["points"]:
        cap = (f"Measured on {gpu} ({when}). Roofs: the copy and cuBLAS ceilings in this GPU's "
               "results file. Each point is the fastest of an op's own GPU versions at its "
               "headline size; its intensity and FLOPs come from the op's cost model (hover a "
               "point for its values).")
        parts.append(figure_html(roofline_figure(gpu, g).svg(), cap))
        lines = [f"**{gpu}**: every op on the roofline (the number is its marker)", "",
                 "| # | op | best version | FLOP/byte | roof (its ridge) | bound | achieved | "
                 "% of roof |",
                 "|--:|:--|:--|--:|:--|:--|--:|--:|"]
        for i, p in enumerate(g["points"], 1):
            stale = ' <span class="bench-stale">stale</span>' if p["stale"] else ""
            label = ROOF_LABEL.get(p["roof"], p["roof"])
            roof = label if p["peak"] else f"{label} (not measured)" if p["roof"] else "-"
            if p["ridge"]:
                roof += f" ({_fmt_ai(p['ridge'])})"
            frac = "-" if p["fraction_of_roof"] is None else f"{100 * p['fraction_of_roof']:.1f}%"
            # the rate that the bound is about (the hover of the point gives both)
            rate = (_fmt_rate(bytes_per_s=p["bytes_per_s"]) if p["bound"] == "memory"
                    else _fmt_rate(flops_per_s=p["flops_per_s"]) if p["bound"] == "compute"
                    else _fmt_rate(p["flops_per_s"], p["bytes_per_s"]))
            lines.append(f"| {i} | {_link(p['op'], p['chapter'], link_prefix)} | "
                         f"{p['impl']}{stale} ({p['lang']}, {p['dtype']}) | {_fmt_ai(p['ai'])} | "
                         f"{roof} | {p['bound'] or '-'} | {rate} | {frac} |")
        parts.append("\n".join(lines))
    if g["bandwidth_only"]:
        lines = [f"**{gpu}**: off the device-memory roofline (no FLOPs in the cost model, or bytes "
                 "that cross the host link), each against its own ceiling", "",
                 "| op | best version | dtype | achieved | % of its ceiling |",
                 "|:--|:--|:--|--:|--:|"]
        for p in g["bandwidth_only"]:
            stale = ' <span class="bench-stale">stale</span>' if p["stale"] else ""
            frac = ("-" if p["fraction_of_ceiling"] is None
                    else f"{100 * p['fraction_of_ceiling']:.1f}%")
            lines.append(f"| {_link(p['op'], p['chapter'], link_prefix)} | {p['impl']}{stale} "
                         f"({p['lang']}) | {p['dtype']} | "
                         f"{_fmt_rate(bytes_per_s=p['bytes_per_s'])} | "
                         f"{frac} of {ROOF_LABEL.get(p['ceiling'], p['ceiling'] or '-')} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def render_roofline(results: dict[str, dict], link_prefix: str = "../") -> str:
    """Markdown/HTML for ``<!-- bench:roofline -->``: per GPU with results, an inline SVG roofline
    and the table of its points, then the ops that have no FLOPs; always followed by the intensity
    of every registered op (from the cost models, so it is there before anything is measured)."""
    blocks = []
    points = roofline_points(results)
    for gpu, g in points.items():
        if g["points"] or g["bandwidth_only"]:
            blocks.append(_gpu_block(gpu, g, results[gpu], link_prefix))
    if not blocks:
        blocks.append('!!! warning "Not measured yet"\n    No GPU results are committed, so there '
                      "is no roofline to draw. Run `python -m snippets bench` on a CUDA GPU and "
                      "commit `benchmarks/results/`; the intensities below need no GPU.\n")
    blocks.append("**Arithmetic intensity of every op at its headline size** (cost model: the "
                  "fewest bytes that must cross device memory, and the arithmetic the op must "
                  "do):\n\n"
                  + render_intensity_table(link_prefix))
    return "\n\n".join(blocks) + "\n"


__all__ = ["place_labels", "render_intensity_table", "render_roofline", "roofline_figure"]
