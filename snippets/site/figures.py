"""Plots rendered from the committed results as inline SVG: ``bench:plot`` and ``bench:ladder``, and the
matplotlib setup every figure of the site shares."""

from __future__ import annotations

import io

from snippets.registry import Op
from snippets.site.fmt import _cname, _fmt_size
from snippets.site.tables import _headline_dtype, _missing


def figure_svg(fig) -> str:
    """A matplotlib figure as inline SVG for a Markdown page (reproducible ids, no date, no blank lines)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", transparent=True, metadata={"Date": None})
    plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    return "\n".join(line for line in svg.splitlines() if line.strip())  # no blank lines inside raw HTML


def style_axes(ax) -> None:
    """The book's plot style: grey frame and ticks, a light grid (readable on light and dark pages)."""
    for spine in ax.spines.values():
        spine.set_color("#888888")
    ax.tick_params(colors="#888888")
    ax.grid(alpha=0.25)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "kernels-measured", "font.size": 10})
    return plt


def render_ladder(op: Op, results: dict[str, dict]) -> str:
    """Every GPU version's rate as a percentage of the op's ceiling: one group of bars per version, one bar per
    measured size (the sizes of the sweep, in order), so a ladder of optimisation steps reads left to right."""
    if op.ceiling is None:
        raise ValueError(f"bench:ladder {op.name}: a ladder needs a ceiling to be a percentage of")
    figs = []
    for gpu, data in results.items():
        entry = data["ops"].get(op.name)
        if entry is None:
            continue
        dtype = _headline_dtype(op, entry)
        rows = [r for r in entry["records"] if r["dtype"] == dtype and r.get("fraction_of_ceiling") is not None
                and r["timer"] == "device"]
        impls = list(dict.fromkeys(r["impl"] for r in rows))
        by_axis = sorted(rows, key=lambda r: r["size"][op.sweep_axis])
        sizes = list(dict.fromkeys(r["size_key"] for r in by_axis))
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(7.2, 4.2))
        width = 0.8 / max(1, len(sizes))
        for k, sk in enumerate(sizes):
            pts = [(impls.index(r["impl"]), 100 * r["fraction_of_ceiling"]) for r in rows if r["size_key"] == sk]
            label = _fmt_size(next(r["size"] for r in rows if r["size_key"] == sk)).replace("<sup>", "^").replace(
                "</sup>", "")
            ax.bar([i + (k - (len(sizes) - 1) / 2) * width for i, _ in pts], [v for _, v in pts], width,
                   label=label)
        ax.set_xticks(range(len(impls)), impls)
        ax.axhline(100, ls="--", lw=1, color="#888888")
        c = entry["ceiling"]
        ax.set_ylabel(f"% of {_cname(c['name'])} ({c['value']:,.0f} {c['unit']})")
        ax.set_xlabel("version")
        style_axes(ax)
        ax.legend(fontsize=7, frameon=False, loc="upper left")
        ax.set_title(f"{op.title}: {gpu}, {dtype}", fontsize=10)
        p = entry["provenance"]
        cap = (f"Measured on {p['gpu']}, commit {str(p['commit'])[:10]}, {p['date'][:10]}; each bar is a median "
               "of event-timed calls divided by the ceiling measured in the same run.")
        figs.append(f'<figure class="bench-plot">\n{figure_svg(fig)}\n<figcaption>{cap}</figcaption>\n</figure>')
    return "\n\n".join(figs) if figs else _missing(op)


def _series_keys(op: Op) -> list[str]:
    """Size keys other than the sweep axis that differ between sweep points (FlashAttention's causal and d):
    each combination of their values is a line of its own, so points of one line share everything but the axis."""
    axis = op.sweep_axis
    keys = sorted({k for sz in op.sweep for k in sz if k != axis})
    by_axis: dict = {}
    for sz in op.sweep:
        by_axis.setdefault(sz[axis], []).append(sz)
    return [k for k in keys if any(len({str(sz.get(k)) for sz in group}) > 1 for group in by_axis.values())]


def render_plot(op: Op, results: dict[str, dict], y: str = "value", dtype: str | None = None) -> str:
    figs = []
    for gpu, data in results.items():
        entry = data["ops"].get(op.name)
        if entry is None:
            continue
        dtype = dtype or _headline_dtype(op, entry)
        rows = [r for r in entry["records"] if r["dtype"] == dtype]
        if not rows:
            continue
        axis = op.sweep_axis
        order = list(dict.fromkeys(s[axis] for s in op.sweep))
        categorical = not all(isinstance(v, (int, float)) for v in order)
        series = _series_keys(op)
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(7.2, 4.6))
        lines = []  # (version, values of the series keys): one line each
        for r in rows:
            key = (r["impl"], tuple(r["size"].get(c) for c in series))
            if key not in lines:
                lines.append(key)
        width = 0.8 / max(1, len(lines))
        for k, (name, combo) in enumerate(lines):
            pts = sorted(((order.index(r["size"][axis]), r) for r in rows
                          if r["impl"] == name and tuple(r["size"].get(c) for c in series) == combo
                          and r["size"][axis] in order), key=lambda t: t[0])
            if not pts:
                continue
            label = (f"{name} {pts[0][1]['lang']}: {pts[0][1]['desc']}"
                     + "".join(f", {c}={v}" for c, v in zip(series, combo)))
            vals = [r["ms"] if y == "ms" else r["value"] for _, r in pts]
            if categorical:
                ax.bar([i + (k - (len(lines) - 1) / 2) * width for i, _ in pts], vals, width, label=label)
            else:
                ax.plot([order[i] for i, _ in pts], vals, marker="o", ms=3, label=label)
        if categorical:
            ax.set_xticks(range(len(order)), [str(v) for v in order])
        else:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(axis)
        c = entry["ceiling"]
        if y == "ms":
            ax.set_yscale("log")
            ax.set_ylabel("time per call (ms)")
        elif c is None:  # a latency: steps of several x (L1, L2, DRAM) read best on a log axis
            ax.set_yscale("log")
            ax.set_ylabel(op.metric)
        else:
            ax.set_ylabel(op.metric)
            ax.axhline(c["value"], ls="--", lw=1, color="#888888")
            ax.annotate(f"ceiling: {_cname(c['name'])} {c['value']:,.0f} {c['unit']}", (0.01, 0.97),
                        xycoords="axes fraction", va="top", fontsize=8)
        style_axes(ax)
        ax.legend(fontsize=7, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
        ax.set_title(f"{op.title}: {gpu}, {dtype}", fontsize=10)
        svg = figure_svg(fig)
        p = entry["provenance"]
        cap = (f"Measured on {p['gpu']}, commit {str(p['commit'])[:10]}, {p['date'][:10]}; "
               f"medians of event-timed calls.")
        figs.append(f'<figure class="bench-plot">\n{svg}\n<figcaption>{cap}</figcaption>\n</figure>')
    return "\n\n".join(figs) if figs else _missing(op)
