"""``bench:sweep``: a sweep of launch configurations captured on each GPU, as heatmaps and a folded table."""

from __future__ import annotations

import re
from pathlib import Path

from snippets.bench.report import RESULTS_DIR
from snippets.site.figures import _pyplot, figure_svg
from snippets.site.fmt import _fmt_ms, _slug
from snippets.site.tables import _machine


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


def _heatmap(ax, rows: list[dict], y: str, x: str, fig, plt) -> None:
    """The best rate over every other knob for each (y, x) cell; cells with no working config are hatched."""
    import numpy as np

    ys = sorted({r[y] for r in rows})
    xs = sorted({r[x] for r in rows})
    grid = np.full((len(ys), len(xs)), np.nan)
    for r in rows:
        if r["status"] == "ok":
            i, j = ys.index(r[y]), xs.index(r[x])
            grid[i, j] = r["tflops"] if np.isnan(grid[i, j]) else max(grid[i, j], r["tflops"])
    ax.add_patch(plt.Rectangle((-0.5, -0.5), len(xs), len(ys), hatch="xx", fill=False, ec="#888888", lw=0,
                               zorder=0))  # seen only where the image is masked
    im = ax.imshow(np.ma.masked_invalid(grid), origin="lower", cmap="viridis", aspect="auto", zorder=1)
    ax.set_xticks(range(len(xs)), [str(v) for v in xs])
    ax.set_yticks(range(len(ys)), [str(v) for v in ys])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    for spine in ax.spines.values():
        spine.set_color("#888888")
    ax.tick_params(colors="#888888")
    cb = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    cb.set_label("TFLOP/s (best config of the cell)", fontsize=8)
    cb.ax.tick_params(colors="#888888", labelsize=7)


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
        parts = [f"**{p['gpu']}**, `{data.get('kernel', '?')}`, {size}[^{label}]", ""]
        if data.get("source_hash") and _resolve_hash(data.get("kernel", "")) != data["source_hash"]:
            parts += ['!!! warning "Stale"\n    The kernel changed since this sweep was captured (or is gone); the '
                      "numbers below are from the old code.", ""]
        if best:
            plt = _pyplot()
            fig, axes = plt.subplots(1, 2, figsize=(8.6, 3.6))
            _heatmap(axes[0], rows, "BLOCK_M", "BLOCK_N", fig, plt)
            axes[0].set_title("best over BLOCK_K, warps, stages", fontsize=9)
            # The second panel: stages x warps for the tile the sweep explored most (ties: the faster tile).
            tiles: dict[tuple, list[dict]] = {}
            for r in rows:
                tiles.setdefault(tuple(r[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")), []).append(r)
            tile, same_tile = max(tiles.items(), key=lambda t: (len(t[1]), max(
                (r["tflops"] for r in t[1] if r["status"] == "ok"), default=0.0)))
            _heatmap(axes[1], same_tile, "num_stages", "num_warps", fig, plt)
            axes[1].set_title(f"{tile[0]} x {tile[1]} x {tile[2]} tile, GROUP_M = {tile[3]}", fontsize=9)
            cap = (f"Measured on {p['gpu']}, commit {str(p['commit'])[:10]}, {p['date'][:10]}: the best rate of the "
                   "configurations in each cell (medians of event-timed calls); hatched cells: no configuration "
                   "of the cell compiled and passed the check.")
            parts += [f'<figure class="bench-plot">\n{figure_svg(fig)}\n<figcaption>{cap}</figcaption>\n</figure>', ""]
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
