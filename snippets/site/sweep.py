"""``bench:sweep``: a sweep of launch configurations captured on each GPU, as heatmaps and a folded table."""

from __future__ import annotations

import re
from pathlib import Path

from snippets.bench.report import RESULTS_DIR
from snippets.site.figures import (GREY, LEGEND_PT, Drawn, figure_html, figure_key, legend_below,
                                   new_figure)
from snippets.site.fmt import _fmt_ms, _slug
from snippets.site.tables import _machine, capture_mark, gpu_short


def _resolve_hash(ref: str) -> str | None:
    """The current source hash (as ``Impl.source_hash``) of ``module:qualname``, or None if it is gone."""
    import importlib

    from snippets.registry import Impl

    module, _, name = ref.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return Impl("x", obj, "Triton", "").source_hash()


SWEEP_KNOBS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")


def _heatmap(ax, rows: list[dict], y: str, x: str, norm, cmap, titles: dict[str, str]) -> bool:
    """The best rate over every other knob for each (y, x) cell, its value written in the cell;
    cells with no working config are hatched. Each cell is a rectangle of its own with a hover
    title. Returns whether a cell is hatched."""
    from matplotlib import patheffects
    from matplotlib.patches import Rectangle

    ys = sorted({r[y] for r in rows})
    xs = sorted({r[x] for r in rows})
    best: dict[tuple, float] = {}
    for r in rows:
        if r["status"] == "ok":
            cell = (r[y], r[x])
            best[cell] = max(best.get(cell, r["tflops"]), r["tflops"])
    hatched = False
    for i, vy in enumerate(ys):
        for j, vx in enumerate(xs):
            v = best.get((vy, vx))
            if v is None:
                hatched = True
                rect = Rectangle((j - 0.5, i - 0.5), 1, 1, hatch="xx", fill=False, ec=GREY, lw=0)
                text = f"{y} {vy}, {x} {vx}: no configuration compiled and passed the check"
            else:
                rect = Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=cmap(norm(v)), lw=0)
                text = f"{y} {vy}, {x} {vx}: {v:,.1f} TFLOP/s (the best configuration of the cell)"
                r, g, b, _ = cmap(norm(v))
                ink = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
                # as a path, not text: the page's stylesheet recolours SVG text for its light or
                # dark theme, and this ink must follow the cell's colour instead
                ax.text(j, i, f"{v:,.0f}", ha="center", va="center", fontsize=9, color=ink,
                        path_effects=[patheffects.Normal()])
            gid = f"cell{len(titles)}"
            rect.set_gid(gid)
            titles[gid] = text
            ax.add_patch(rect)
    ax.set_xlim(-0.5, len(xs) - 0.5)
    ax.set_ylim(-0.5, len(ys) - 0.5)
    ax.set_xticks(range(len(xs)), [str(v) for v in xs])
    ax.set_yticks(range(len(ys)), [str(v) for v in ys])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    for spine in ax.spines.values():
        spine.set_color(GREY)
    ax.tick_params(colors=GREY, labelcolor=GREY)
    return hatched


def sweep_figure(name: str, gpu: str, data: dict) -> Drawn:
    """Two heatmaps, one above the other (each as wide as the page): the best rate per BLOCK_M x
    BLOCK_N, and per num_stages x num_warps for the tile the sweep explored most (ties: the faster
    tile), on one colour scale."""
    import matplotlib
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.patches import Patch

    rows = data["configs"]
    ok = [r["tflops"] for r in rows if r["status"] == "ok"]
    tiles: dict[tuple, list[dict]] = {}
    for r in rows:
        tile = tuple(r[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"))
        tiles.setdefault(tile, []).append(r)
    tile, same_tile = max(tiles.items(), key=lambda t: (len(t[1]), max(
        (r["tflops"] for r in t[1] if r["status"] == "ok"), default=0.0)))
    cmap, norm = matplotlib.colormaps["viridis"], Normalize(min(ok), max(ok))
    fig, axes = new_figure(6.4, nrows=2)
    titles: dict[str, str] = {}
    hatched = _heatmap(axes[0], rows, "BLOCK_M", "BLOCK_N", norm, cmap, titles)
    axes[0].set_title("best over BLOCK_K, warps and stages", fontsize=LEGEND_PT)
    hatched |= _heatmap(axes[1], same_tile, "num_stages", "num_warps", norm, cmap, titles)
    axes[1].set_title(f"{tile[0]} x {tile[1]} x {tile[2]} tile, GROUP_M = {tile[3]}",
                      fontsize=LEGEND_PT)
    cb = fig.colorbar(ScalarMappable(norm, cmap), ax=list(axes), fraction=0.05, pad=0.02, aspect=30)
    cb.set_label("TFLOP/s (best configuration of the cell)")
    cb.ax.tick_params(colors=GREY, labelcolor=GREY)
    cb.outline.set_edgecolor(GREY)
    prob = data["problem"]
    fig.suptitle(f"Autotuning sweep: {gpu}, M = {prob['m']:,}, N = {prob['n']:,}, "
                 f"K = {prob['k']:,}, {prob['dtype']}")
    leg = None
    if hatched:
        leg = legend_below(fig, [Patch(fill=False, hatch="xx", edgecolor=GREY)],
                           ["hatched: no configuration of the cell compiled and passed the check"])
    label = (f"Autotuning sweep {name} on the {gpu_short(gpu)}: two heatmaps of the best TFLOP/s, "
             f"per BLOCK_M and BLOCK_N, and per num_stages and num_warps for the {tile[0]} x "
             f"{tile[1]} x {tile[2]} tile; every cell's value is written in it")
    return Drawn(fig, figure_key("sweep", name, gpu), label, titles, leg)


def render_sweep(name: str, results_dir: Path = RESULTS_DIR) -> str:
    """A sweep of launch configurations captured on each GPU (``outputs/<gpu>/<name>.json``, written by
    scripts/capture_autotune.py): a heatmap of the best rate per BLOCK_M x BLOCK_N (and per num_stages x
    num_warps for the best tile), the autotuner's own cost, and a table of every configuration."""
    import json

    if not re.fullmatch(r"[\w-]+", name):
        raise ValueError(f"bench:sweep name must be a plain file stem, got {name!r}")
    blocks = []
    for path in sorted((results_dir / "outputs").glob(f"*/{name}.json")):
        gpu = path.parent.name
        data = json.loads(path.read_text())
        if "configs" not in data or "problem" not in data:
            raise ValueError(f"{path}: not a sweep (no 'configs' or 'problem')")
        rows = data["configs"]
        ok = [r for r in rows if r["status"] == "ok"]
        prob, p = data["problem"], data["provenance"]
        label = f"sweep-{_slug(name)}-{_slug(gpu)}"
        size = f"M = {prob['m']:,}, N = {prob['n']:,}, K = {prob['k']:,}, {prob['dtype']}"
        cublas = data.get("cublas")
        best = max(ok, key=lambda r: r["tflops"]) if ok else None
        mark = capture_mark(path)  # stale, or no record of the code that produced it
        parts = [f"**{p['gpu']}**, `{data.get('kernel', '?')}`, {size}[^{label}]"
                 + (f"; capture: {mark}" if mark else ""), ""]
        if data.get("source_hash") and _resolve_hash(data.get("kernel", "")) != data["source_hash"]:
            parts += ['!!! warning "Stale"\n    The kernel changed since this sweep was captured (or is gone); the '
                      "numbers below are from the old code.", ""]
        if best:
            cap = (f"Measured on {p['gpu']}, commit {str(p['commit'])[:10]}, {p['date'][:10]}: the "
                   "best rate of the configurations in each cell (medians of event-timed calls; "
                   "hover a cell for its value).")
            parts += [figure_html(sweep_figure(name, p["gpu"], data).svg(), cap), ""]
            knobs = ", ".join(f"{k} = {best[k]}" for k in SWEEP_KNOBS)
            parts.append(f"Best: {knobs}: {best['tflops']:,.1f} TFLOP/s"
                         + (f", {100 * best['tflops'] / cublas['tflops']:.1f}% of cuBLAS (`torch.matmul`, "
                            f"{cublas['tflops']:,.1f} TFLOP/s in the same run)." if cublas else "."))
        else:
            parts.append("No configuration of this sweep compiled and passed the check.")
        cost = data.get("tuning_cost")
        if cost:
            parts += ["", f"The autotuner's own cost over {cost['space']} configurations ({cost['pruned']} left "
                      "after pruning), host clock:", "",
                      "| call | seconds |", "|:--|--:|",
                      f"| first call (compile and time every config) | {cost['first_call_s']:.2f} |",
                      f"| same key again (in-memory cache) | {cost['second_call_s']:.4f} |",
                      f"| new key, configs already compiled (time every config) | {cost['new_key_s']:.2f} |",
                      f"| new autotuner, first key (on-disk cache: {'on' if cost.get('cache_results') else 'off'}) "
                      f"| {cost['fresh_autotuner_s']:.4f} |"]
        order = sorted(rows, key=lambda r: (r["status"] != "ok", -r.get("tflops", 0.0)))
        table = ["| BLOCK_M | BLOCK_N | BLOCK_K | GROUP_M | warps | stages | smem est. | time | TFLOP/s | "
                 "% of best | status |", "|" + "--:|" * 10 + ":--|"]
        for r in order:
            cells = [str(r[k]) for k in SWEEP_KNOBS] + [f"{r['smem_bytes'] / 1024:.0f} KiB"]
            if r["status"] == "ok":
                cells += [_fmt_ms(r["ms"]), f"{r['tflops']:,.1f}", f"{100 * r['tflops'] / best['tflops']:.1f}%", "ok"]
            else:
                err = str(r.get("error", "")).replace("|", "/")
                cells += ["-", "-", "-", f'<span class="bench-stale">{r["status"]}</span>: {err}']
            table.append("| " + " | ".join(cells) + " |")
        parts += ["", f'??? note "All {len(rows)} configurations, {len(ok)} ran ({gpu})"', ""]
        parts += ["    " + line for line in table]
        note = (f"[^{label}]: Captured by `python scripts/capture_autotune.py` on {_machine(p)}. Each configuration "
                "is checked against an fp32 torch.matmul, then timed with the book's time_device: median of "
                "event-timed calls, inputs rotated through enough copies to span 4x L2. Configurations that "
                "failed to compile or to match are listed with their error.")
        blocks.append('<div class="bench-table" markdown>\n\n' + "\n".join(parts) + "\n\n</div>\n\n" + note)
    if not blocks:
        return (f'!!! warning "Not measured yet"\n    No sweep `{name}` is committed; '
                f"`python scripts/capture_autotune.py OUT.json` on a CUDA GPU writes it, to be committed as "
                f"`benchmarks/results/outputs/<gpu>/{name}.json`.\n")
    return "\n\n".join(blocks)
