"""``bench:timeline``: a GPU timeline captured on the runner, drawn from the files
snippets.bench.timeline loads: one lane per (run, stream), a bar per copy or kernel (colour and
hatch by its kind; hover a bar for its name, start and duration), every run's time counted from its
own first GPU event."""

from __future__ import annotations

import re
from pathlib import Path

from snippets.bench.harness import RESULTS_DIR
from snippets.bench.timeline import KINDS, lanes, load_timeline
from snippets.site.figures import (GREY, Drawn, figure_html, figure_key, legend_below, new_figure,
                                   num, style_axes)
from snippets.site.tables import capture_mark, gpu_short

# Colour and hatch of each kind of event: two copies and a kernel told apart without colour too.
LOOKS = {"h2d": ("#1f77b4", ""), "kernel": ("#ff7f0e", "///"), "d2h": ("#2ca02c", "...")}


def _missing(name: str) -> str:
    return (f'!!! warning "Not captured yet"\n    No GPU timeline `{name}` is committed; the GPU '
            f"runner writes it to `benchmarks/results/outputs/<gpu>/{name}.json`.\n")


def timeline_figure(path: Path, name: str) -> tuple[Drawn, dict, float, str]:
    """The figure of one timeline file, with its data and the time unit it is drawn in."""
    from matplotlib.patches import Patch

    data = load_timeline(path)
    rows = lanes(data["runs"])
    ends = [e["start_us"] + e["dur_us"] for evs in data["runs"].values() for e in evs] or [0.0]
    scale, unit = (1e-3, "ms") if max(ends) >= 2000 else (1.0, "µs")
    fig, ax = new_figure(1.4 + 0.42 * len(rows))
    titles: dict[str, str] = {}
    for y, (label, stream, evs) in enumerate(rows):
        for e in evs:
            colour, hatch = LOOKS[e["kind"]]
            start, dur = e["start_us"] * scale, e["dur_us"] * scale
            (bar,) = ax.barh([y], [dur], 0.76, left=[start], color=colour, edgecolor="white",
                             lw=0.4, hatch=hatch or None, hatchcolor="white").patches
            gid = f"ev{len(titles)}"
            bar.set_gid(gid)
            titles[gid] = (f"{label}, stream {stream}: {KINDS[e['kind']]} {e['name']}, "
                           f"{num(start)} to {num(start + dur)} {unit} ({num(dur)} {unit})")
    for y in range(1, len(rows)):
        if rows[y][0] != rows[y - 1][0]:
            ax.axhline(y - 0.5, color=GREY, lw=0.8, ls="--")  # between two runs
    ax.set_yticks(range(len(rows)), [f"{label}: stream {stream}" for label, stream, _ in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first lane on top
    ax.set_xlim(0, max(ends) * scale * 1.02 or 1)
    ax.set_xlabel(f"time since the run's first GPU event ({unit})")
    style_axes(ax)
    ax.grid(axis="y", visible=False)
    gpu = data.get("gpu", path.parent.name)
    ax.set_title(f"Timeline of {name}: {gpu}")
    handles = [Patch(facecolor=LOOKS[k][0], edgecolor="white", hatch=LOOKS[k][1] or None,
                     hatchcolor="white") for k in KINDS]
    leg = legend_below(fig, handles, list(KINDS.values()))
    label = (f"Timeline of {name} on the {gpu_short(gpu)}: host to device copies, kernels and "
             f"device to host copies as bars over time ({unit}), one lane per stream of each run "
             f"({', '.join(data['runs'])})")
    drawn = Drawn(fig, figure_key("timeline", name, path.parent.name), label, titles, leg)
    return drawn, data, scale, unit


def _figure(path: Path, name: str) -> str:
    drawn, data, scale, unit = timeline_figure(path, name)
    gpu = data.get("gpu", path.parent.name)
    ends = {label: max((e["start_us"] + e["dur_us"] for e in evs), default=0) * scale
            for label, evs in data["runs"].items()}
    spans = "; ".join(f"{label}: {end:,.2f} {unit}" for label, end in ends.items())
    engines = (f" ({data['copy_engines']} copy engines)" if data.get("copy_engines") is not None
               else "")
    cap = (f"Captured on {gpu}{engines} with torch {data.get('torch', '?')}, "
           f"{data.get('captured', '?')} (<code>benchmarks/results/outputs/{path.parent.name}/"
           f"{name}.json</code>). From the first GPU event to the end of the last: {spans}. "
           "Hover a bar for its name and times.")
    mark = capture_mark(path)  # stale, or no record of the code that produced it
    if mark:
        cap += f" Capture: {mark}."
    return figure_html(drawn.svg(), cap)


def render_timeline(name: str, results_dir: Path = RESULTS_DIR) -> str:
    """A figure per ``results_dir/outputs/<gpu>/<name>.json``, or a "Not captured yet" warning."""
    if not re.fullmatch(r"[\w-]+", name):
        raise ValueError(f"bench:timeline name must be a plain file stem, got {name!r}")
    paths = sorted((Path(results_dir) / "outputs").glob(f"*/{name}.json"))
    if not paths:
        return _missing(name)
    return "\n\n".join(_figure(path, name) for path in paths)


__all__ = ["render_timeline", "timeline_figure"]
