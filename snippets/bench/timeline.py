"""Draw a GPU timeline captured on the GPU runner: ``<!-- bench:timeline NAME -->`` in a chapter.

A capture (for example ``python -m snippets.part3.streams OUTDIR``) writes ``NAME.json`` holding

    {"gpu": ..., "torch": ..., "captured": ISO date,
     "runs": {run label: [{"name", "kind": "h2d" | "d2h" | "kernel", "stream", "start_us", "dur_us"}, ...]}}

and it is committed as ``benchmarks/results/outputs/<gpu>/NAME.json``. Each file becomes one figure: one lane
per (run, stream), a bar per copy or kernel coloured by its kind, every run's time counted from its own first
GPU event so that the runs line up on one axis.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from snippets.bench.harness import RESULTS_DIR

KINDS = {"h2d": ("host to device copy", "#1f77b4"), "kernel": ("kernel", "#ff7f0e"),
         "d2h": ("device to host copy", "#2ca02c")}
EVENT_KEYS = ("name", "kind", "stream", "start_us", "dur_us")


def _missing(name: str) -> str:
    return (f'!!! warning "Not captured yet"\n    No GPU timeline `{name}` is committed; the GPU runner writes it '
            f"to `benchmarks/results/outputs/<gpu>/{name}.json`.\n")


def load_timeline(path: Path) -> dict:
    """A timeline file, checked: a non-empty ``runs`` mapping of run label to a list of well-formed events."""
    data = json.loads(path.read_text())
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, dict) or not runs:
        raise ValueError(f"{path}: a timeline needs a non-empty 'runs' mapping of run label to events")
    for label, events in runs.items():
        if not isinstance(events, list):
            raise ValueError(f"{path}: run {label!r} must be a list of events")
        for e in events:
            missing = [k for k in EVENT_KEYS if not isinstance(e, dict) or k not in e]
            if missing:
                raise ValueError(f"{path}: run {label!r} has an event without {', '.join(missing)}: {e!r}")
            if e["kind"] not in KINDS:
                raise ValueError(f"{path}: run {label!r} has an event of kind {e['kind']!r}; kinds are "
                                 f"{', '.join(KINDS)}")
            if not (e["dur_us"] >= 0 and e["start_us"] >= 0):
                raise ValueError(f"{path}: run {label!r} has an event with a negative start or duration: {e!r}")
    return data


def lanes(runs: dict[str, list[dict]]) -> list[tuple[str, object, list[dict]]]:
    """(run label, stream, events) for every stream of every run: runs in their order in the file, streams in
    the order of their first event."""
    out = []
    for label, events in runs.items():
        order: dict[object, list[dict]] = {}
        for e in sorted(events, key=lambda e: e["start_us"]):
            order.setdefault(e["stream"], []).append(e)
        out += [(label, stream, evs) for stream, evs in order.items()]
    return out


def _figure(path: Path, name: str) -> str:
    from matplotlib.patches import Patch

    from snippets.site.figures import _pyplot, figure_svg, style_axes

    data = load_timeline(path)
    rows = lanes(data["runs"])
    ends = [e["start_us"] + e["dur_us"] for evs in data["runs"].values() for e in evs] or [0.0]
    scale, unit = (1e-3, "ms") if max(ends) >= 2000 else (1.0, "µs")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 1.4 + 0.42 * len(rows)))
    for y, (_, _, evs) in enumerate(rows):
        for kind, (_, colour) in KINDS.items():
            bars = [(e["start_us"] * scale, e["dur_us"] * scale) for e in evs if e["kind"] == kind]
            if bars:
                ax.broken_barh(bars, (y - 0.38, 0.76), facecolors=colour, edgecolors="white", linewidth=0.4)
    for y in range(1, len(rows)):
        if rows[y][0] != rows[y - 1][0]:
            ax.axhline(y - 0.5, color="#888888", lw=0.8, ls="--")  # between two runs
    ax.set_yticks(range(len(rows)), [f"{label}: stream {stream}" for label, stream, _ in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first lane on top
    ax.set_xlim(0, max(ends) * scale * 1.02 or 1)
    ax.set_xlabel(f"time since the run's first GPU event ({unit})")
    style_axes(ax)
    ax.legend(handles=[Patch(facecolor=c, label=lbl) for lbl, c in KINDS.values()], fontsize=7, frameon=False,
              loc="upper center", bbox_to_anchor=(0.5, -0.28 if len(rows) < 4 else -0.16), ncol=3)
    gpu = data.get("gpu", path.parent.name)
    ax.set_title(f"{name}: {gpu}", fontsize=10)
    svg = figure_svg(fig)
    spans = "; ".join(f"{label}: {max((e['start_us'] + e['dur_us'] for e in evs), default=0) * scale:,.2f} {unit}"
                      for label, evs in data["runs"].items())
    engines = f" ({data['copy_engines']} copy engines)" if data.get("copy_engines") is not None else ""
    cap = (f"Captured on {gpu}{engines} with torch {data.get('torch', '?')}, {data.get('captured', '?')} "
           f"(<code>benchmarks/results/outputs/{path.parent.name}/{name}.json</code>). From the first GPU event to "
           f"the end of the last: {spans}.")
    return f'<figure class="bench-plot">\n{svg}\n<figcaption>{cap}</figcaption>\n</figure>'


def render_timeline(name: str, results_dir: Path = RESULTS_DIR) -> str:
    """One figure per ``results_dir/outputs/<gpu>/<name>.json``, or a "Not captured yet" admonition."""
    if not re.fullmatch(r"[\w-]+", name):
        raise ValueError(f"bench:timeline name must be a plain file stem, got {name!r}")
    paths = sorted((Path(results_dir) / "outputs").glob(f"*/{name}.json"))
    if not paths:
        return _missing(name)
    return "\n\n".join(_figure(path, name) for path in paths)


__all__ = ["load_timeline", "lanes", "render_timeline"]
