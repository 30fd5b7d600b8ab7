"""``python -m snippets report``: summarise the committed results, with no GPU needed.

One record per (op, GPU with results), plus one record with ``device: null`` for an op never measured. Each
record names the fastest of the book's own versions (``best_*``) and, apart, the fastest library version
(``library_*``: torch, torch.compile, cuBLAS/cuDNN, Liger-Kernel), so a library's result is never credited to
the book. A
measurement is *fresh* when every implementation the registry declares has a headline result whose source hash
equals the hash of its current source; otherwise the docs show it as stale. Captured outputs (program outputs,
profiler and Nsight Compute reports, traces, sweeps) are listed apart when they are stale or have no record of
the code that produced them (snippets.bench.captures).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from snippets.registry import Op, dtype_name, load_all, size_key

from .harness import RESULTS_DIR


def load_results(results_dir: Path = RESULTS_DIR) -> dict[str, dict]:
    """{gpu name: results file contents} for every ``*.json`` in ``results_dir``."""
    out = {}
    for path in sorted(results_dir.glob("*.json")):
        data = json.loads(path.read_text())
        out[data["gpu"]] = data
    return out


def stale_impls(op: Op, entry: dict) -> list[str]:
    """Implementations whose headline measurement is missing or was taken on different source."""
    dtype = dtype_name(op.timed_dtypes()[0])
    measured = {r["impl"]: r["source_hash"] for r in entry["records"]
                if r["headline"] and r["dtype"] == dtype}
    return [name for name, impl in op.impls.items() if measured.get(name) != impl.source_hash()]


def headline_records(op: Op, entry: dict, dtype: str | None = None) -> list[dict]:
    """The records at the headline size, in ``dtype`` (default: the first timed dtype)."""
    dtype = dtype or dtype_name(op.timed_dtypes()[0])
    key = size_key(op.headline)
    return [r for r in entry["records"] if r["size_key"] == key and r["dtype"] == dtype]


def summarise(op: Op, gpu: str | None, entry: dict | None) -> dict[str, Any]:
    rec: dict[str, Any] = {"op": op.name, "part": op.part, "title": op.title, "device": gpu,
                           "headline_size": dict(op.headline), "dtype": dtype_name(op.timed_dtypes()[0]),
                           "best_impl": None, "best_lang": None, "value": None, "unit": op.metric,
                           "fraction_of_ceiling": None, "ceiling": op.ceiling, "baseline_impl": "v0",
                           "speedup_vs_baseline": None, "library_impl": None, "library_lang": None,
                           "library_value": None, "book_vs_library": None, "fresh": False,
                           "stale_impls": sorted(op.impls), "measured_at": None, "commit": None}
    if entry is None:
        return rec
    rows = headline_records(op, entry)
    pick = min if op.lower_is_better else max

    def origin(r: dict) -> str:
        return op.impls[r["impl"]].origin if r["impl"] in op.impls else "library" if r["impl"] == "v0" else "book"

    ours = [r for r in rows if origin(r) == "book"]
    theirs = [r for r in rows if origin(r) == "library"]
    if ours:
        best = pick(ours, key=lambda r: r["value"])
        rec.update(best_impl=best["impl"], best_lang=best["lang"], value=best["value"],
                   fraction_of_ceiling=best["fraction_of_ceiling"], speedup_vs_baseline=best["speedup_vs_v0"])
    if theirs:
        lib = pick(theirs, key=lambda r: r["value"])
        rec.update(library_impl=lib["impl"], library_lang=lib["lang"], library_value=lib["value"])
        if ours:
            rec["book_vs_library"] = lib["ms"] / best["ms"]  # > 1: the book's version is faster
    stale = stale_impls(op, entry)
    rec.update(fresh=not stale, stale_impls=stale, measured_at=entry["provenance"]["date"],
               commit=entry["provenance"]["commit"])
    return rec


def report(results_dir: Path = RESULTS_DIR) -> list[dict[str, Any]]:
    results = load_results(results_dir)
    records = []
    for name, op in sorted(load_all().items(), key=lambda kv: (kv[1].part, kv[0])):
        found = [(gpu, data["ops"][name]) for gpu, data in results.items() if name in data["ops"]]
        for gpu, entry in found or [(None, None)]:
            records.append(summarise(op, gpu, entry))
    return records


def print_report(records: list[dict], as_json: bool, captures: list[dict] | None = None) -> None:
    """The records as a table, or as JSON: ``{"results": records, "stale_captures": captures}``. ``captures``
    are the captured outputs that are stale or have no provenance (snippets.bench.captures.stale_captures)."""
    captures = captures or []
    if as_json:
        print(json.dumps({"results": records, "stale_captures": captures}, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Kernels, Measured: committed results")
    for col in ("part", "op", "device", "best", "rate", "% ceiling", "vs v0", "fresh"):
        table.add_column(col)
    for r in records:
        rate = f"{r['value']:.1f} {r['unit']}" if r["value"] is not None else "-"
        frac = f"{100 * r['fraction_of_ceiling']:.1f}% of {r['ceiling']}" if r["fraction_of_ceiling"] else "-"
        sp = f"{r['speedup_vs_baseline']:.3g}x" if r["speedup_vs_baseline"] else "-"
        best = f"{r['best_impl']} ({r['best_lang']})" if r["best_impl"] else "-"
        table.add_row(str(r["part"]), r["op"], r["device"] or "not measured", best, rate, frac, sp,
                      "yes" if r["fresh"] else "[red]stale[/]")
    Console().print(table)
    if captures:
        stale = Table(title="Captured outputs that are stale or have no provenance")
        for col in ("GPU", "file", "state", "why"):
            stale.add_column(col)
        for c in captures:
            stale.add_row(c["gpu"], c["file"], f"[red]{c['state']}[/]", c["why"])
        Console().print(stale)
