"""Render benchmark tables and plots into the chapters, from the committed results (used by the MkDocs hook).

A chapter asks for them with HTML comments on a line of their own, so the raw Markdown stays readable:

    <!-- bench:table vector_add -->              headline size, one table per GPU with results
    <!-- bench:table warp_divergence sizes=all -->  every measured size
    <!-- bench:table softmax dtype=bfloat16 -->  another timed dtype than the first (any table or plot)
    <!-- bench:plot vector_add -->               the sweep: rate against size, one line per implementation
    <!-- bench:plot cpu_vs_gpu y=ms -->          time instead of rate (log scale)
    <!-- bench:summary -->                       every op of the book, one row per op and GPU
    <!-- bench:ceilings -->                      the ceilings measured on each GPU
    <!-- bench:output device_query -->           a program's output captured on each GPU (outputs/<gpu>/NAME.txt)
    <!-- bench:ladder sgemm -->                  each version's % of the ceiling, one bar per version and size
    <!-- bench:roofline -->                      every op's best result on the roofline of each GPU
    <!-- bench:timeline stream_overlap -->       a timeline drawn from a trace captured on each GPU
                                                 (outputs/<gpu>/NAME.json)
    <!-- bench:sweep autotune_matmul -->         a sweep of launch configurations captured on each GPU
                                                 (outputs/<gpu>/NAME.json, written by scripts/capture_autotune.py):
                                                 a heatmap over BLOCK_M x BLOCK_N and a table of every config
    <!-- bench:versus vector_add:v5,vector_add:v4 reduce_sum:v7,reduce_sum:v8 -->
                                                 versions of different languages side by side: lines of code
                                                 (snippets.bench.loc) and the headline rate, one row per
                                                 OP:VERSION (commas or spaces between them), each from the
                                                 latest GPU that measured the op. OP:VERSION@k1+k2 names the
                                                 __global__ kernels a CUDA version launches when its name and
                                                 its launcher do not tell them (see loc.launched_kernels)
    <!-- bench:goal rmsnorm_fwd_bwd v3 v1:1 v2:1 -->
                                                 a chapter's goal checked against the results, one row per term
                                                 and GPU: vK:R (at least R times as fast as version vK at the
                                                 headline), ceiling:F (at least F of the op's ceiling),
                                                 memory-vK:F (at most F times vK's peak memory beyond the
                                                 inputs); dtype=D for another timed dtype, size=KEY for a
                                                 sweep size (its size key, e.g. size=k=4096,m=4096,n=4096).
                                                 Each row says met, not met, stale or not measured

Every table carries its provenance in a footnote; a result whose source has changed since it was measured is
marked stale, and an op with no results says so instead of showing numbers.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

from snippets.bench.report import RESULTS_DIR, headline_records, load_results, report, stale_impls
from snippets.registry import Op, load_all, size_key

DIRECTIVE = re.compile(r"^<!--\s*bench:(\w+)(.*?)-->\s*$", re.MULTILINE)
CEILING_SHORT = {"copy": "copy", "gemm_fp32": "cuBLAS fp32", "gemm_tf32": "cuBLAS tf32",
                 "gemm_fp16": "cuBLAS fp16", "gemm_bf16": "cuBLAS bf16"}


def _cname(name: str | None) -> str:
    return CEILING_SHORT.get(name, str(name).replace("_", " "))


def _args(text: str) -> tuple[list[str], dict[str, str]]:
    pos, kw = [], {}
    for tok in text.split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            kw[k] = v
        else:
            pos.append(tok)
    return pos, kw


def _fmt_size(size: dict) -> str:
    parts = []
    for k in sorted(size):
        v = size[k]
        if isinstance(v, bool):  # before int: a flag such as causal=False is not the number 0
            parts.append(f"{k} = {v}")
        elif isinstance(v, int) and v >= 1024 and (v & (v - 1)) == 0:
            parts.append(f"{k} = 2<sup>{v.bit_length() - 1}</sup>")
        elif isinstance(v, int):
            parts.append(f"{k} = {v:,}")
        else:
            parts.append(f"{k} = {v}")
    return ", ".join(parts)


def _fmt_ms(ms: float) -> str:
    return f"{ms * 1e3:.1f} µs" if ms < 1 else f"{ms:.3f} ms"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _footnote(op: Op, gpu: str, entry: dict) -> tuple[str, str]:
    p = entry["provenance"]
    label = f"bench-{_slug(op.name)}-{_slug(gpu)}"
    c = entry["ceiling"]
    ceiling = (f"Ceiling {_cname(c['name'])}: {c['value']:,.0f} {c['unit']} ({c['how']}), measured in the same run. "
               if c else "")
    text = (f"[^{label}]: Measured by `python -m snippets bench {op.name}` on {p['gpu']} ({p['sm_count']} SMs, "
            f"compute capability {p['compute_capability']}), driver {p['driver']}, CUDA {p['cuda_runtime']}, "
            f"torch {p['torch']}, triton {p['triton']}, cupy {p['cupy']}; host CPU {p.get('cpu')} "
            f"({p.get('cpu_threads')} torch threads); commit `{str(p['commit'])[:10]}`"
            f"{' (uncommitted changes)' if p.get('dirty') else ''}, {p['date']}. {ceiling}"
            f"Times are medians of event-timed calls with inputs rotated or L2 flushed.")
    return label, text


def _footnote_as(op: Op, gpu: str, entry: dict, label: str) -> str:
    """The provenance footnote of :func:`_footnote` under another label (a page may cite one op's results from
    several directives, and footnote labels must be unique)."""
    old, note = _footnote(op, gpu, entry)
    return note.replace(f"[^{old}]", f"[^{label}]", 1)


def _missing(op: Op) -> str:
    return (f'!!! warning "Not measured yet"\n    `{op.name}` has no committed GPU results. '
            f"Run `python -m snippets bench {op.name}` on a CUDA GPU and commit `benchmarks/results/`.\n")


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**28 else f"{nbytes / 2**20:.1f} MiB"


def render_table(op: Op, results: dict[str, dict], sizes: str = "headline", dtype: str | None = None) -> str:
    blocks = []
    for gpu, data in results.items():
        entry = data["ops"].get(op.name)
        if entry is None:
            continue
        stale = set(stale_impls(op, entry))
        if sizes == "all":
            order: dict[str, int] = {}
            for i, sz in enumerate([*op.sweep, op.headline]):  # a headline inside the sweep keeps its place
                order.setdefault(size_key(sz), i)
            want = dtype or _headline_dtype(op, entry)
            rows = sorted((r for r in entry["records"] if r["dtype"] == want),
                          key=lambda r: (order.get(r["size_key"], len(order)), int(r["impl"][1:])))
        else:
            rows = headline_records(op, entry, dtype)
        if not rows:
            continue
        label, note = _footnote(op, gpu, entry)
        c = entry["ceiling"]
        head = (f"**{gpu}**, {rows[0]['dtype'] if rows else ''}"
                + (f", {_fmt_size(op.headline)}" if sizes != "all" else "")
                + (f"; ceiling: {_cname(c['name'])} {c['value']:,.0f} {c['unit']}" if c else "") + f"[^{label}]")
        size_col = sizes == "all"
        cols = (["size"] if size_col else []) + ["version", "language", "what it does", "time", op.metric,
                                                 f"% of {_cname(c['name'])}" if c else "-", "vs v0"]
        memory = any("peak_extra_bytes" in r for r in rows)
        if memory:
            cols.append("peak memory beyond inputs")
        lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "|".join(
            ":--" if i < (4 if size_col else 3) else "--:" for i in range(len(cols))) + "|"]
        for r in rows:
            mark = ' <span class="bench-stale">stale</span>' if r["impl"] in stale else ""
            sp = f"{r['speedup_vs_v0']:.3g}x" if r["speedup_vs_v0"] else "-"
            cells = ([_fmt_size(r["size"])] if size_col else []) + [
                f"{r['impl']}{mark}", r["lang"], r["desc"], _fmt_ms(r["ms"]), f"{r['value']:,.1f}",
                f"{100 * r['fraction_of_ceiling']:.1f}%" if r["fraction_of_ceiling"] is not None else "-", sp]
            if memory:
                cells.append(_gib(r["peak_extra_bytes"]) if "peak_extra_bytes" in r else "-")
            lines.append("| " + " | ".join(cells) + " |")
        if stale:
            lines += ["", f'!!! warning "Stale"\n    The source of {", ".join(sorted(stale))} changed since '
                      "this measurement (or it was never measured); the numbers above are from the old code."]
        blocks.append('<div class="bench-table" markdown>\n\n' + "\n".join(lines) + "\n\n</div>\n\n" + note)
    return "\n\n".join(blocks) if blocks else _missing(op)


def _headline_dtype(op: Op, entry: dict) -> str | None:
    """The dtype of an op's headline records (the one its plots show), or None without any."""
    records = headline_records(op, entry)
    return records[0]["dtype"] if records else None


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


def render_summary(results_dir: Path = RESULTS_DIR) -> str:
    ops = load_all()
    lines = ["| part | op | GPU | best version | rate | % of ceiling | vs v0 | fresh |",
             "|--:|:--|:--|:--|--:|--:|--:|:--|"]
    for r in report(results_dir):
        op = ops[r["op"]]
        link = f"[`{r['op']}`]({op.chapter})"
        if r["device"] is None:
            lines.append(f"| {r['part']} | {link} | not measured | | | | | no |")
            continue
        rate = f"{r['value']:,.1f} {r['unit']}" if r["value"] is not None else "-"
        frac = (f"{100 * r['fraction_of_ceiling']:.1f}% of {_cname(r['ceiling'])}"
                if r["fraction_of_ceiling"] is not None else "-")
        sp = f"{r['speedup_vs_baseline']:.3g}x" if r["speedup_vs_baseline"] else "-"
        fresh = "yes" if r["fresh"] else f'<span class="bench-stale">stale: {", ".join(r["stale_impls"])}</span>'
        lines.append(f"| {r['part']} | {link} | {r['device']} | {r['best_impl']} ({r['best_lang']}) | {rate} | "
                     f"{frac} | {sp} | {fresh} |")
    return "\n".join(lines) + "\n"


def render_ceilings(results: dict[str, dict]) -> str:
    if not results:
        return '!!! warning "Not measured yet"\n    No GPU results are committed.\n'
    lines = ["| GPU | ceiling | measured | how |", "|:--|:--|--:|:--|"]
    for gpu, data in results.items():
        for name, c in data.get("ceilings", {}).items():
            lines.append(f"| {gpu} | {_cname(name)} | {c['value']:,.1f} {c['unit']} | {c['how']} |")
    return "\n".join(lines) + "\n"


def render_output(name: str, results_dir: Path = RESULTS_DIR) -> str:
    """Program output captured on the GPU runner: ``benchmarks/results/outputs/<gpu>/<name>.txt``."""
    if not re.fullmatch(r"[\w-]+", name):
        raise ValueError(f"bench:output name must be a plain file stem, got {name!r}")
    blocks = []
    for path in sorted((results_dir / "outputs").glob(f"*/{name}.txt")):
        blocks.append(f"Captured on `{path.parent.name}` (`benchmarks/results/outputs/{path.parent.name}/"
                      f"{name}.txt`):\n\n```text\n{path.read_text().rstrip()}\n```\n")
    if not blocks:
        return (f'!!! warning "Not captured yet"\n    No GPU output of `{name}` is committed; the GPU runner '
                f"writes it to `benchmarks/results/outputs/<gpu>/{name}.txt`.\n")
    return "\n".join(blocks)


def _machine(p: dict) -> str:
    """The GPU and software of a provenance record, for a footnote."""
    return (f"{p['gpu']} ({p['sm_count']} SMs, compute capability {p['compute_capability']}), driver {p['driver']}, "
            f"CUDA {p['cuda_runtime']}, torch {p['torch']}, triton {p['triton']}; commit `{str(p['commit'])[:10]}`"
            f"{' (uncommitted changes)' if p.get('dirty') else ''}, {p['date']}")


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


VERSUS_ITEM = re.compile(r"^(\w+):(v\d+)(?:@([\w+]+))?$")


def parse_versus(text: str) -> list[tuple[str, str, list[str] | None]]:
    """``OP:VER[@kernel+kernel]`` items separated by commas or spaces -> [(op, version, kernels or None)]."""
    items = []
    for tok in re.split(r"[,\s]+", text.strip()):
        if not tok:
            continue
        m = VERSUS_ITEM.match(tok)
        if not m:
            raise ValueError(f"bench:versus item {tok!r} is not OP:VERSION or OP:VERSION@kernel+kernel")
        items.append((m.group(1), m.group(2), m.group(3).split("+") if m.group(3) else None))
    if not items:
        raise ValueError("bench:versus needs at least one OP:VERSION")
    return items


def render_versus(items: list[tuple[str, str, list[str] | None]], results: dict[str, dict],
                  ops: dict[str, Op] | None = None) -> str:
    """One row per (op, version): its language, its lines of code (kernel and host, snippets.bench.loc) and its
    headline rate and % of ceiling from the latest GPU that measured the op, marked stale like the tables."""
    import hashlib

    from snippets.bench.loc import impl_lines

    ops = ops if ops is not None else load_all()
    tag = hashlib.sha256(repr(items).encode()).hexdigest()[:6]
    lines = ["| op | version | language | what it does | kernel lines | host lines | GPU | rate | % of ceiling |",
             "|:--|:--|:--|:--|--:|--:|:--|--:|--:|"]
    notes: dict[str, str] = {}
    counted = []
    for op_name, ver, kernels in items:
        if op_name not in ops:
            raise ValueError(f"bench:versus names unknown op {op_name!r}; known: {sorted(ops)}")
        op = ops[op_name]
        if ver not in op.impls:
            raise ValueError(f"bench:versus: {op_name} has no version {ver}; it has {sorted(op.impls)}")
        impl = op.impls[ver]
        count = impl_lines(impl, kernels)
        counted.append(f"`{op_name}` {ver}: {count.what or 'no code of its own (a library call)'}")
        found = [(gpu, data["ops"][op_name]) for gpu, data in results.items() if op_name in data["ops"]]
        gpu_cell, rate, frac = "not measured", "-", "-"
        mark = ""
        if found:
            gpu, entry = max(found, key=lambda t: t[1]["provenance"]["date"])
            label = f"versus-{tag}-{_slug(op_name)}-{_slug(gpu)}"
            notes[label] = _footnote_as(op, gpu, entry, label)
            rec = next((r for r in headline_records(op, entry) if r["impl"] == ver), None)
            gpu_cell = f"{gpu}[^{label}]"
            if ver in stale_impls(op, entry):
                mark = ' <span class="bench-stale">stale</span>'
            if rec is not None:
                rate = f"{rec['value']:,.1f} {op.metric}"
                c = entry["ceiling"]
                frac = (f"{100 * rec['fraction_of_ceiling']:.1f}% of {_cname(c['name'])}"
                        if rec["fraction_of_ceiling"] is not None and c else "-")
        lines.append(f"| `{op_name}` | {ver}{mark} | {impl.lang} | {impl.desc} | {count.kernel} | {count.host} | "
                     f"{gpu_cell} | {rate} | {frac} |")
    details = ['??? info "What the line counts include"', "",
               "    Lines that hold code (no blank lines, comments or docstrings), counted by "
               "`snippets.bench.loc`. Kernel lines:", ""]
    details += [f"    - {c}" for c in counted]
    return ('<div class="bench-table" markdown>\n\n' + "\n".join(lines) + "\n\n" + "\n".join(details)
            + "\n\n</div>\n\n" + "\n\n".join(notes.values()) + "\n")


GOAL_TERM = re.compile(r"^(?:(v\d+)|ceiling|memory-(v\d+)):(\d+(?:\.\d+)?)$")


def parse_goal(pos: list[str], ops: dict[str, Op]) -> tuple[Op, str, list[tuple[str, str | None, float]]]:
    """``OP VER TERM...`` -> (op, version, [(kind, other version or None, threshold)]), kind one of "speed",
    "ceiling", "memory"; unknown ops, versions and malformed terms raise ``ValueError``."""
    if len(pos) < 3:
        raise ValueError("bench:goal needs OP VERSION and at least one term (vK:R, ceiling:F, memory-vK:F)")
    op_name, ver, *terms = pos
    if op_name not in ops:
        raise ValueError(f"bench:goal names unknown op {op_name!r}; known: {sorted(ops)}")
    op = ops[op_name]
    parsed = []
    for tok in terms:
        m = GOAL_TERM.match(tok)
        if not m:
            raise ValueError(f"bench:goal term {tok!r} is not vK:R, ceiling:F or memory-vK:F")
        other = m.group(1) or m.group(2)
        kind = "speed" if m.group(1) else "memory" if m.group(2) else "ceiling"
        if kind == "ceiling" and not op.ceiling:
            raise ValueError(f"bench:goal: {op_name} has no ceiling to be a fraction of")
        parsed.append((kind, other, float(m.group(3))))
    for v in [ver, *(o for _, o, _ in parsed if o)]:
        if v not in op.impls:
            raise ValueError(f"bench:goal: {op_name} has no version {v}; it has {sorted(op.impls)}")
    return op, ver, parsed


def _goal_row(op: Op, ver: str, term: tuple[str, str | None, float], recs: dict[str, dict],
              stale: set[str], ceiling: dict | None) -> str:
    kind, other, x = term
    if kind == "speed":
        goal = (f"{ver} at least {x:g}x as fast as {other} ({op.impls[other].desc})" if x != 1
                else f"{ver} at least as fast as {other} ({op.impls[other].desc})")
    elif kind == "ceiling":
        goal = f"{ver} at least {100 * x:g}% of the {_cname(ceiling['name'] if ceiling else op.ceiling)} ceiling"
    else:
        goal = f"{ver} holds at most {x:g}x the peak memory of {other} ({op.impls[other].desc})"
    needed = [ver] + ([other] if other else [])
    missing = [v for v in needed if v not in recs or (kind == "memory" and "peak_extra_bytes" not in recs[v])]
    if missing:
        return f"| {goal} | - | not measured ({', '.join(missing)}) |"
    r = recs[ver]
    if kind == "speed":
        value = recs[other]["ms"] / r["ms"]
        measured, met = f"{value:.3g}x ({_fmt_ms(r['ms'])} against {_fmt_ms(recs[other]['ms'])})", value >= x
    elif kind == "ceiling":
        value = r["fraction_of_ceiling"]
        measured, met = f"{100 * value:.1f}% ({r['value']:,.1f} {op.metric})", value >= x
    else:
        mine, theirs = r["peak_extra_bytes"], recs[other]["peak_extra_bytes"]
        value = mine / theirs if theirs else float("inf") if mine else 0.0
        ratio = "< 0.001x" if value < 1e-3 else f"{value:.3g}x"
        measured, met = f"{ratio} ({_gib(mine)} against {_gib(theirs)})", value <= x
    old = [v for v in needed if v in stale]
    verdict = (f"stale ({', '.join(old)} changed since)" if old else "**met**" if met else "**not met**")
    if not old and not met and kind == "speed" and "ms_p10" in r and "ms_p90" in recs[other]:
        # the two timings' 10th-90th percentile ranges reach the goal: a difference inside the run's noise
        if recs[other]["ms_p90"] / r["ms_p10"] >= x:
            verdict += " (within the timings' 10th-90th percentile spread)"
    return f"| {goal} | {measured} | {verdict} |"


def render_goal(op: Op, ver: str, terms: list[tuple[str, str | None, float]], results: dict[str, dict],
                dtype: str | None = None, size: str | None = None) -> str:
    """A chapter's goal for one version, each term checked against the headline records of every GPU that
    measured the op (see the module docstring for the terms)."""
    import hashlib

    tag = hashlib.sha256(repr((op.name, ver, terms, dtype, size)).encode()).hexdigest()[:6]
    sizes = {size_key(sz) for sz in [op.headline, *op.sweep]}
    if size is not None and size not in sizes:
        raise ValueError(f"bench:goal: {op.name} has no size {size!r}; its sizes are {sorted(sizes)}")
    blocks = []
    for gpu, data in results.items():
        entry = data["ops"].get(op.name)
        if entry is None:
            continue
        if size is None:
            rows = headline_records(op, entry, dtype)
        else:
            want = dtype or _headline_dtype(op, entry)
            rows = [r for r in entry["records"] if r["size_key"] == size and r["dtype"] == want]
        if not rows:
            continue
        recs = {r["impl"]: r for r in rows}
        stale = set(stale_impls(op, entry))
        label = f"goal-{tag}-{_slug(op.name)}-{_slug(gpu)}"
        note = _footnote_as(op, gpu, entry, label)
        lines = [f"**Goal check**, `{op.name}` on {gpu}, {rows[0]['dtype']}, {_fmt_size(rows[0]['size'])}[^{label}]",
                 "", "| goal | measured | verdict |", "|:--|:--|:--|"]
        lines += [_goal_row(op, ver, t, recs, stale, entry["ceiling"]) for t in terms]
        blocks.append('<div class="bench-table" markdown>\n\n' + "\n".join(lines) + "\n\n</div>\n\n" + note)
    if not blocks:
        return (f'!!! warning "Goal not checked yet"\n    `{op.name}` has no committed GPU results to check the '
                "goal against.\n")
    return "\n\n".join(blocks)


def render_page(markdown: str, page_path: str = "", results_dir: Path = RESULTS_DIR) -> str:
    """Replace every bench directive in ``markdown``; an unknown op or directive raises ``ValueError``."""
    if "<!-- bench:" not in markdown:
        return markdown
    results = load_results(results_dir)
    ops = load_all()

    def sub(m: re.Match) -> str:
        kind, (pos, kw) = m.group(1), _args(m.group(2))
        if kind == "summary":
            return render_summary(results_dir)
        if kind == "ceilings":
            return render_ceilings(results)
        if kind == "output":
            return render_output(pos[0] if pos else "", results_dir)
        if kind == "roofline":
            from snippets.bench.roofline import render_roofline

            return render_roofline(results)
        if kind == "sweep":
            return render_sweep(pos[0] if pos else "", results_dir)
        if kind == "versus":
            return render_versus(parse_versus(m.group(2)), results, ops)
        if kind == "goal":
            return render_goal(*parse_goal(pos, ops), results, kw.get("dtype"), kw.get("size"))
        if kind == "timeline":
            from snippets.bench.timeline import render_timeline

            return render_timeline(pos[0] if pos else "", results_dir)
        if not pos or pos[0] not in ops:
            raise ValueError(f"{page_path}: bench:{kind} names unknown op {pos[:1]}; known: {sorted(ops)}")
        op = ops[pos[0]]
        if kind == "table":
            return render_table(op, results, kw.get("sizes", "headline"), kw.get("dtype"))
        if kind == "plot":
            return render_plot(op, results, kw.get("y", "value"), kw.get("dtype"))
        if kind == "ladder":
            return render_ladder(op, results)
        raise ValueError(f"{page_path}: unknown directive bench:{kind}")

    return DIRECTIVE.sub(sub, markdown)


def directives(markdown: str) -> list[tuple[str, list[str]]]:
    """The (kind, positional args) of every bench directive in a page: the contract test reads these."""
    return [(m.group(1), _args(m.group(2))[0]) for m in DIRECTIVE.finditer(markdown)]


__all__ = ["directives", "figure_svg", "parse_goal", "parse_versus", "render_goal", "render_ladder", "render_page",
           "render_plot", "render_summary", "render_sweep", "render_table", "render_versus", "size_key", "style_axes"]
