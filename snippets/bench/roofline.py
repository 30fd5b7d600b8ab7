"""The roofline of each GPU with results, and every op of the book placed on it (``<!-- bench:roofline -->``).

The model: a kernel that performs ``F`` FLOPs and must move ``Q`` bytes to or from device memory has an
*arithmetic intensity* ``I = F / Q`` (FLOP/byte). On a GPU that sustains at most ``P`` FLOP/s and ``B`` bytes/s
it cannot run faster than ``min(P, I * B)`` FLOP/s: the memory roof ``I * B`` below the *ridge point*
``I* = P / B``, the compute roof ``P`` above it. Both roofs here are measured, not taken from a datasheet:
``B`` is the harness's device-to-device copy ceiling and ``P`` a cuBLAS GEMM ceiling (IEEE fp32, TF32, fp16,
bf16), all from the GPU's results file. ``F`` and ``Q`` come from each op's registered cost model at its
headline size, so a point's height is ``F / time``.

Ops whose cost model counts no FLOPs (a copy, a transpose, a histogram of integers) have an intensity of 0 and
no place on a logarithmic intensity axis; they are listed apart, with their bandwidth.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from snippets.bench.report import headline_records, stale_impls
from snippets.registry import Op, Size, dtype_name, get_op, load_all

# The compute roof that applies to an op's arithmetic: by the op's own ceiling when it is a GEMM rate (a
# tensor-core op knows which one it competes with), else by the dtype it is timed in.
GEMM_CEILINGS = ("gemm_fp32", "gemm_tf32", "gemm_fp16", "gemm_bf16")
DTYPE_ROOF = {"float32": "gemm_fp32", "float16": "gemm_fp16", "bfloat16": "gemm_bf16"}
ROOF_LABEL = {"copy": "copy", "gemm_fp32": "cuBLAS fp32", "gemm_tf32": "cuBLAS TF32", "gemm_fp16": "cuBLAS fp16",
              "gemm_bf16": "cuBLAS bf16"}
RATE_METRICS = ("GB/s", "TFLOP/s")  # latencies (ns/access, ns/launch) have no place on a roofline


# --8<-- [start:intensity]
def arithmetic_intensity(op: Op | str, size: Size | None = None, dtype: torch.dtype | None = None) -> float:
    """FLOPs per byte of the op's cost model: ``op.flops(size, dtype) / op.bytes_moved(size, dtype)``, at the
    headline size and the timed dtype unless given. The bytes are the fewest the op must move through device
    memory, so this is the highest intensity any implementation can have; a kernel that reads its input twice
    sits at half of it."""
    op = get_op(op) if isinstance(op, str) else op
    size = op.headline if size is None else size
    dtype = op.timed_dtypes()[0] if dtype is None else dtype
    return op.flops(size, dtype) / op.bytes_moved(size, dtype)


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """The intensity (FLOP/byte) where the memory roof meets the compute roof: below it a kernel at full
    bandwidth still leaves arithmetic idle (memory-bound); above it, the reverse (compute-bound)."""
    return peak_flops / bandwidth


def attainable(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """The roof at ``intensity``: min(peak FLOP/s, intensity x bytes/s)."""
    return min(peak_flops, intensity * bandwidth)
# --8<-- [end:intensity]


def _ceiling_rate(ceilings: dict, name: str) -> float | None:
    """A ceiling in base units: bytes/s for GB/s, FLOP/s for TFLOP/s; None if it was not measured."""
    c = ceilings.get(name)
    if not c:
        return None
    scale = {"GB/s": 1e9, "TFLOP/s": 1e12}.get(c["unit"])
    return c["value"] * scale if scale else None


def compute_roof(op: Op, dtype: str) -> str | None:
    """The name of the GEMM ceiling that bounds this op's arithmetic (None for integer-only work)."""
    if op.ceiling in GEMM_CEILINGS:
        return op.ceiling
    return DTYPE_ROOF.get(dtype)


def _best_record(op: Op, entry: dict) -> dict | None:
    """The fastest headline record among the book's own GPU versions (not v0, unless the op has nothing else;
    never a CPU version)."""
    rows = [r for r in headline_records(op, entry)
            if r["impl"] in op.impls and op.impls[r["impl"]].device != "cpu" and r.get("ms")]
    ours = [r for r in rows if r["impl"] != "v0"] or rows
    return min(ours, key=lambda r: r["ms"]) if ours else None


def roofline_points(results: dict[str, dict]) -> dict[str, dict[str, Any]]:
    """For every GPU in ``results``: its roofs and one point per op with rate results.

    Returns ``{gpu: {"bandwidth": bytes/s or None, "roofs": {ceiling: FLOP/s}, "points": [...],
    "bandwidth_only": [...]}}``. A point is the best own version's headline record with ``ai`` (FLOP/byte),
    ``flops_per_s`` (cost-model FLOPs / time), ``bytes_per_s``, the applicable ``roof`` and its ``ridge``,
    ``bound`` ("memory" or "compute", by the ridge point; None without both roofs) and ``fraction_of_roof``
    (achieved FLOP/s over the roof at that intensity). Ops with zero FLOPs, and ops whose bytes cross another link
than device memory (a ceiling such as ``host_link``), go to ``bandwidth_only``.
    """
    ops = load_all()
    out: dict[str, dict[str, Any]] = {}
    for gpu, data in results.items():
        ceilings = data.get("ceilings", {})
        bandwidth = _ceiling_rate(ceilings, "copy")
        roofs = {name: rate for name in GEMM_CEILINGS if (rate := _ceiling_rate(ceilings, name))}
        points, bw_only = [], []
        for name in sorted(data.get("ops", {}), key=lambda n: (ops[n].part, n) if n in ops else (99, n)):
            op = ops.get(name)
            if op is None or op.metric not in RATE_METRICS:
                continue
            entry = data["ops"][name]
            best = _best_record(op, entry)
            if best is None:
                continue
            dtype = getattr(torch, best["dtype"])
            flops, nbytes = op.flops(best["size"], dtype), op.bytes_moved(best["size"], dtype)
            seconds = best["ms"] * 1e-3
            p = {"op": name, "title": op.title, "chapter": op.chapter, "impl": best["impl"], "lang": best["lang"],
                 "desc": best["desc"], "dtype": best["dtype"], "size": best["size"], "ms": best["ms"],
                 "flops": flops, "bytes": nbytes, "ai": flops / nbytes, "flops_per_s": flops / seconds,
                 "bytes_per_s": nbytes / seconds, "value": best["value"], "unit": best["unit"],
                 "fraction_of_ceiling": best.get("fraction_of_ceiling"),
                 "ceiling": (entry.get("ceiling") or {}).get("name"),
                 "stale": best["impl"] in stale_impls(op, entry)}
            if flops == 0 or p["ceiling"] not in (None, "copy", *GEMM_CEILINGS):
                # no arithmetic, or bytes that cross another link than device memory (the host link): the
                # device-memory roofline does not apply, so the op is listed with its own ceiling instead
                bw_only.append(p)
                continue
            roof = compute_roof(op, best["dtype"])
            peak = roofs.get(roof) if roof else None
            p.update(roof=roof, peak=peak, ridge=None, bound=None, fraction_of_roof=None)
            if peak and bandwidth:
                p["ridge"] = ridge_point(peak, bandwidth)
                p["bound"] = "memory" if p["ai"] < p["ridge"] else "compute"
                p["fraction_of_roof"] = p["flops_per_s"] / attainable(p["ai"], peak, bandwidth)
            points.append(p)
        out[gpu] = {"bandwidth": bandwidth, "roofs": roofs, "points": points, "bandwidth_only": bw_only}
    return out


# ----------------------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------------------

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
    """Every registered op's arithmetic intensity at its headline size, from the cost models alone (no GPU).
    ``link_prefix`` turns a chapter path relative to docs/ into a link from the page (``../`` from a page one
    level down, such as docs/part3/roofline.md)."""
    from snippets.site.fmt import _fmt_size

    lines = ["| op | headline size | dtype | FLOPs | bytes | FLOP/byte | metric |",
             "|:--|:--|:--|--:|--:|--:|:--|"]
    for name, op in sorted(load_all().items(), key=lambda kv: (kv[1].part, kv[0])):
        dtype = op.timed_dtypes()[0]
        flops, nbytes = op.flops(op.headline, dtype), op.bytes_moved(op.headline, dtype)
        ai = _fmt_ai(flops / nbytes) if flops else "0 (no arithmetic)"
        lines.append(f"| {_link(name, op.chapter, link_prefix)} | {_fmt_size(op.headline)} | {dtype_name(dtype)} | "
                     f"{flops:,} | {nbytes:,} | {ai} | {op.metric} |")
    return "\n".join(lines) + "\n"


def _figure(gpu: str, g: dict) -> str:
    from snippets.site.figures import _pyplot, figure_svg, style_axes

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 5.6))
    pts, bw, roofs = g["points"], g["bandwidth"], g["roofs"]
    ridges = [ridge_point(peak, bw) for peak in roofs.values()] if bw else []
    ais = [p["ai"] for p in pts] + ridges
    x_lo = 10 ** math.floor(math.log10(min(ais + [0.05]) / 2))
    x_hi = 10 ** math.ceil(math.log10(max(ais + [10.0]) * 4))
    if bw:  # the memory roof, up to the highest ridge (beyond it every compute roof is lower)
        x_top = max(ridges) if ridges else x_hi
        ax.plot([x_lo, x_top], [x_lo * bw / 1e12, x_top * bw / 1e12], ls="--", lw=1.2, color="#888888")
        ax.annotate(f"copy {bw / 1e9:,.0f} GB/s", (x_lo * 1.3, x_lo * 1.3 * bw / 1e12), fontsize=7,
                    rotation=0, va="bottom", color="#888888")
    groups: list[list[tuple[str, float]]] = []  # roofs within 15% of each other share one label
    for name, peak in sorted(roofs.items(), key=lambda kv: kv[1]):
        if groups and peak < groups[-1][0][1] * 1.15:
            groups[-1].append((name, peak))
        else:
            groups.append([(name, peak)])
    for group in groups:
        for name, peak in group:
            start = ridge_point(peak, bw) if bw else x_lo
            ax.plot([start, x_hi], [peak / 1e12, peak / 1e12], ls="--", lw=1.2, color="#888888")
        label = " / ".join(f"{ROOF_LABEL.get(name, name)} {peak / 1e12:,.0f}" for name, peak in group)
        ax.annotate(f"{label} TFLOP/s", (x_hi / 1.2, group[-1][1] / 1e12 * 1.1), ha="right", fontsize=7,
                    color="#888888")
    markers = "osD^vP*Xh<>p"
    placed: list[tuple[float, float]] = []
    for i, p in enumerate(pts, 1):
        y = p["flops_per_s"] / 1e12
        ax.plot([p["ai"]], [y], marker=markers[(i - 1) % len(markers)], ms=6, ls="none",
                label=f"{i}  {p['op']} {p['impl']}")
        # Points of equal intensity (every fp32 element-wise op sits at 1/12 or 1/8) would print their numbers
        # on top of each other: each number moves right past those already placed nearby.
        lx, ly = math.log10(p["ai"]), math.log10(y)
        k = sum(abs(lx - a) < 0.1 and abs(ly - b) < 0.2 for a, b in placed)
        placed.append((lx, ly))
        ax.annotate(str(i), (p["ai"], y), xytext=(5 + 9 * k, 3), textcoords="offset points", fontsize=7)
    ys = [p["flops_per_s"] / 1e12 for p in pts] + [r / 1e12 for r in roofs.values()]
    if bw:
        ys.append(x_lo * bw / 1e12)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(min(ys) / 3, max(ys) * 3)
    ax.set_xlabel("arithmetic intensity (FLOP/byte, cost model at the headline size)")
    ax.set_ylabel("TFLOP/s (cost-model FLOPs / time)")
    style_axes(ax)
    ax.legend(fontsize=7, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3)
    ax.set_title(f"Roofline: {gpu}", fontsize=10)
    return figure_svg(fig)


def _gpu_block(gpu: str, g: dict, data: dict, link_prefix: str) -> str:
    parts = []
    dates = sorted(e["provenance"]["date"][:10] for e in data.get("ops", {}).values() if e.get("provenance"))
    when = f"{dates[0]} to {dates[-1]}" if dates and dates[0] != dates[-1] else (dates[0] if dates else "?")
    if g["points"]:
        cap = (f"Measured on {gpu} ({when}). Roofs: the copy and cuBLAS ceilings in this GPU's results file. Each "
               "point is the fastest of an op's own GPU versions at its headline size; its intensity and FLOPs come "
               "from the op's cost model.")
        parts.append(f'<figure class="bench-plot">\n{_figure(gpu, g)}\n<figcaption>{cap}</figcaption>\n</figure>')
        lines = [f"**{gpu}**: every op on the roofline (the number is its marker)", "",
                 "| # | op | best version | dtype | FLOP/byte | roof | ridge (FLOP/byte) | bound | achieved | "
                 "% of roof at its intensity |",
                 "|--:|:--|:--|:--|--:|:--|--:|:--|--:|--:|"]
        for i, p in enumerate(g["points"], 1):
            stale = ' <span class="bench-stale">stale</span>' if p["stale"] else ""
            label = ROOF_LABEL.get(p["roof"], p["roof"])
            roof = label if p["peak"] else f"{label} (not measured)" if p["roof"] else "-"
            ridge = _fmt_ai(p["ridge"]) if p["ridge"] else "-"
            frac = "-" if p["fraction_of_roof"] is None else f"{100 * p['fraction_of_roof']:.1f}%"
            lines.append(f"| {i} | {_link(p['op'], p['chapter'], link_prefix)} | {p['impl']}{stale} ({p['lang']}) | "
                         f"{p['dtype']} | {_fmt_ai(p['ai'])} | {roof} | {ridge} | {p['bound'] or '-'} | "
                         f"{_fmt_rate(p['flops_per_s'], p['bytes_per_s'])} | {frac} |")
        parts.append("\n".join(lines))
    if g["bandwidth_only"]:
        lines = [f"**{gpu}**: off the device-memory roofline (no FLOPs in the cost model, or bytes that cross the "
                 "host link), each against its own ceiling", "",
                 "| op | best version | dtype | achieved | % of its ceiling |", "|:--|:--|:--|--:|--:|"]
        for p in g["bandwidth_only"]:
            stale = ' <span class="bench-stale">stale</span>' if p["stale"] else ""
            frac = "-" if p["fraction_of_ceiling"] is None else f"{100 * p['fraction_of_ceiling']:.1f}%"
            lines.append(f"| {_link(p['op'], p['chapter'], link_prefix)} | {p['impl']}{stale} ({p['lang']}) | "
                         f"{p['dtype']} | {_fmt_rate(bytes_per_s=p['bytes_per_s'])} | "
                         f"{frac} of {ROOF_LABEL.get(p['ceiling'], p['ceiling'] or '-')} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def render_roofline(results: dict[str, dict], link_prefix: str = "../") -> str:
    """Markdown/HTML for ``<!-- bench:roofline -->``: per GPU with results, an inline SVG roofline and the table
    of its points, then the ops that have no FLOPs; always followed by the intensity of every registered op
    (from the cost models, so it is there before anything is measured)."""
    blocks = []
    points = roofline_points(results)
    for gpu, g in points.items():
        if g["points"] or g["bandwidth_only"]:
            blocks.append(_gpu_block(gpu, g, results[gpu], link_prefix))
    if not blocks:
        blocks.append('!!! warning "Not measured yet"\n    No GPU results are committed, so there is no roofline to '
                      "draw. Run `python -m snippets bench` on a CUDA GPU and commit `benchmarks/results/`; the "
                      "intensities below need no GPU.\n")
    blocks.append("**Arithmetic intensity of every op at its headline size** (cost model: the fewest bytes that "
                  "must cross device memory, and the arithmetic the op must do):\n\n"
                  + render_intensity_table(link_prefix))
    return "\n\n".join(blocks) + "\n"


__all__ = ["arithmetic_intensity", "attainable", "compute_roof", "render_intensity_table", "render_roofline",
           "ridge_point", "roofline_points"]
