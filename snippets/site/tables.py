"""Tables rendered from the committed results: ``bench:table``, ``bench:summary``, ``bench:ceilings``,
``bench:output`` and ``bench:versus``, with the provenance footnotes every table carries."""

from __future__ import annotations

import re
from pathlib import Path

from snippets.bench.report import RESULTS_DIR, headline_records, report, stale_impls
from snippets.registry import Op, size_key
from snippets.op_index import load_all
from snippets.site.fmt import _cname, _fmt_ms, _fmt_size, _gib, _slug, short_size


TIMES_NOTE = "Times are medians of event-timed calls with inputs rotated or L2 flushed."
# How every provenance footnote of the site ends (tables and goals; the autotuning sweep): a footnote that ends
# otherwise has swallowed text that belonged to the page, which the browser test counts.
# the multi-GPU runs of Part 7 (snippets/site/distributed.py)
DIST_TIMES_NOTE = "Times are the slowest rank's, per call, between barriers."
PROVENANCE_ENDINGS = (TIMES_NOTE, "listed with their error.", DIST_TIMES_NOTE)


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
            f"{TIMES_NOTE}")
    return label, text


def _footnote_as(op: Op, gpu: str, entry: dict, label: str) -> str:
    """The provenance footnote of :func:`_footnote` under another label (a page may cite one op's results from
    several directives, and footnote labels must be unique)."""
    old, note = _footnote(op, gpu, entry)
    return note.replace(f"[^{old}]", f"[^{label}]", 1)


def _missing(op: Op) -> str:
    return (f'!!! warning "Not measured yet"\n    `{op.name}` has no committed GPU results. '
            f"Run `python -m snippets bench {op.name}` on a CUDA GPU and commit `benchmarks/results/`.\n")


def gpu_short(gpu: str) -> str:
    """A GPU's name as a tab label: "NVIDIA H100 80GB HBM3" -> "H100", "NVIDIA H200" -> "H200"."""
    m = re.search(r"([A-Za-z]+\d+)", re.sub("nvidia", "", gpu, flags=re.IGNORECASE))
    return m.group(1).upper() if m else gpu


def origin_of(op: Op, impl: str) -> str:
    """``"book"`` or ``"library"`` for a version of ``op`` (a version gone from the registry: v0 is a library)."""
    if impl in op.impls:
        return op.impls[impl].origin
    return "library" if impl == "v0" else "book"


def version_cell(op: Op, r: dict, stale: set[str]) -> str:
    """``v3 Triton``, with a "library" badge for a library's version and a "stale" badge for changed code."""
    lib = ' <span class="bench-lib">library</span>' if origin_of(op, r["impl"]) == "library" else ""
    mark = ' <span class="bench-stale">stale</span>' if r["impl"] in stale else ""
    return f"**{r['impl']}**&nbsp;{r['lang']}{lib}{mark}"


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:,.1f}" if value >= 10 else f"{value:.3g}"


def gpu_tabs(blocks: list[tuple[str, str]]) -> str:
    """One block per GPU: as it is when there is one, as content tabs (one per GPU, linked across the page, so a
    reader who picks the H100 once sees the H100 everywhere) when there are several."""
    if len(blocks) == 1:
        return blocks[0][1]
    out = []
    for gpu, body in blocks:
        out.append(f'=== "{gpu_short(gpu)}"\n\n' + "\n".join(("    " + line) if line else "" for line in
                                                           body.splitlines()))
    return "\n\n".join(out)


def _pivot(op: Op, entry: dict, dtype: str | None, stale: set[str]) -> list[str]:
    """Every measured size x every version: the rate, the fastest of each size in bold."""
    order: dict[str, int] = {}
    for i, sz in enumerate([*op.sweep, op.headline]):  # a headline inside the sweep keeps its place
        order.setdefault(size_key(sz), i)
    want = dtype or _headline_dtype(op, entry)
    recs = [r for r in entry["records"] if r["dtype"] == want]
    impls = sorted({r["impl"] for r in recs}, key=lambda v: int(v[1:]))
    sizes = sorted({r["size_key"] for r in recs}, key=lambda k: order.get(k, len(order)))
    cell = {(r["size_key"], r["impl"]): r for r in recs}
    head = ["size"] + [v + (" (stale)" if v in stale else "") for v in impls]
    lines = ["| " + " | ".join(head) + " |", "|:--|" + "--:|" * len(impls)]
    for sk in sizes:
        row = [cell[(sk, v)] for v in impls if (sk, v) in cell]
        best = (min if op.lower_is_better else max)((r["value"] for r in row), default=None)
        label = short_size(row[0]["size"]) if row else sk
        cells = []
        for v in impls:
            r = cell.get((sk, v))
            text = "-" if r is None else _rate(r["value"])
            cells.append(f"**{text}**" if r is not None and r["value"] == best and len(impls) > 1 else text)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def render_table(op: Op, results: dict[str, dict], sizes: str = "headline", dtype: str | None = None,
                 fold: bool = True, memory_apart: set[str] = frozenset()) -> str:
    """The headline table of each GPU (one row per version), in tabs when several GPUs measured the op. With
    ``sizes="all"``: every measured size as a pivot (sizes x versions), folded in a collapsible block unless
    ``fold`` is False (where the sweep itself is the lesson and no plot shows it). ``memory_apart``: versions
    whose peak-memory measure does not compare with the others' (memory held from before the call, as a CUDA
    graph's pool): their cell says so instead of a number, and a note under the table says why."""
    blocks = []
    for gpu, data in results.items():
        entry = data["ops"].get(op.name)
        if entry is None:
            continue
        stale = set(stale_impls(op, entry))
        rows = headline_records(op, entry, dtype)
        if not rows:
            continue
        label, note = _footnote(op, gpu, entry)
        c = entry["ceiling"]
        head = (f"**{gpu}**[^{label}] · {rows[0]['dtype']} · {short_size(op.headline)}"
                + (f" · ceiling: {_cname(c['name'])} {c['value']:,.0f} {c['unit']}" if c else ""))
        if sizes == "all":
            pivot = _pivot(op, entry, dtype, stale)
            title = f"Every size measured on the {gpu_short(gpu)}: {op.metric}, {len(pivot) - 2} sizes"
            if fold:
                lines = [f'??? note "{title}"', "", "    " + head, ""] + ["    " + line for line in pivot]
            else:
                lines = [head.replace(short_size(op.headline), f"{title} (headline {short_size(op.headline)})"),
                         "", *pivot]
        else:
            lines = [head, "", *_headline_lines(op, rows, stale, c, memory_apart)]
            shown = sorted(v for v in memory_apart if any(r["impl"] == v and "peak_extra_bytes" in r
                                                            for r in rows))
            if shown:
                who = "this version keeps" if len(shown) == 1 else "these versions keep"
                lines += ["", f"Extra memory of {', '.join(shown)}: not comparable. The column counts what one "
                          f"call allocates beyond what existed before it, and {who} memory from call to call "
                          "(a CUDA graph's pool, allocated when the graph was captured)."]
        if stale:
            lines += ["", f'!!! warning "Stale"\n    The source of {", ".join(sorted(stale))} changed since '
                      "this measurement (or it was never measured); the numbers above are from the old code."]
        blocks.append((gpu, '<div class="bench-table bench-op" markdown>\n\n' + "\n".join(lines)
                       + "\n\n</div>\n\n" + note))
    return gpu_tabs(blocks) if blocks else _missing(op)


def _headline_lines(op: Op, rows: list[dict], stale: set[str], c: dict | None,
                    memory_apart: set[str] = frozenset()) -> list[str]:
    cols = ["version", "what it does", "time", op.metric, f"% of {_cname(c['name'])}" if c else "% of ceiling",
            "vs v0"]
    memory = any("peak_extra_bytes" in r for r in rows)
    if memory:
        cols.append("extra memory")
    lines = ["| " + " | ".join(cols) + " |", "|:--|:--|" + "--:|" * (len(cols) - 2)]
    for r in rows:
        sp = f"{r['speedup_vs_v0']:.3g}x" if r["speedup_vs_v0"] else "-"
        cells = [version_cell(op, r, stale), r["desc"], _fmt_ms(r["ms"]), _rate(r["value"]),
                 f"{100 * r['fraction_of_ceiling']:.1f}%" if r["fraction_of_ceiling"] is not None else "-", sp]
        if memory:
            cells.append("not comparable" if r["impl"] in memory_apart and "peak_extra_bytes" in r
                         else _gib(r["peak_extra_bytes"]) if "peak_extra_bytes" in r else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render_headline(op: Op, results: dict[str, dict], dtype: str | None = None) -> str:
    """One line per GPU for a chapter's summary box: the fastest of the book's versions and the fastest library
    version at the headline size, with the ceiling fraction and the ratio between the two."""
    items = []
    for gpu, data in results.items():
        entry = data["ops"].get(op.name)
        if entry is None:
            continue
        rows = headline_records(op, entry, dtype)
        if not rows:
            continue
        stale = set(stale_impls(op, entry))
        label = f"headline-{_slug(op.name)}-{_slug(gpu)}"
        note = _footnote_as(op, gpu, entry, label)
        pick = min if op.lower_is_better else max
        book = [r for r in rows if origin_of(op, r["impl"]) == "book"]
        lib = [r for r in rows if origin_of(op, r["impl"]) == "library"]
        parts = []
        for who, group in (("book", book), ("library", lib)):
            if not group:
                continue
            r = pick(group, key=lambda r: r["value"])
            frac = (f", {100 * r['fraction_of_ceiling']:.1f}% of {_cname(entry['ceiling']['name'])}"
                    if r["fraction_of_ceiling"] is not None and entry["ceiling"] else "")
            mark = " (stale)" if r["impl"] in stale else ""
            parts.append((who, r, f"{who}'s best: **{r['impl']}** {r['lang']}{mark} ({r['desc']}), "
                          f"{_rate(r['value'])} {op.metric}{frac}"))
        text = "; ".join(p for _, _, p in parts)
        if len(parts) == 2:
            b, l_ = parts[0][1], parts[1][1]
            text += f"; book / library: {l_['ms'] / b['ms']:.2f}x"
        items.append(f"- **{gpu_short(gpu)}**[^{label}] · {rows[0]['dtype']} · {short_size(op.headline)}: "
                     f"{text}\n\n{note}")
    if not items:
        return f"`{op.name}` has no committed GPU results yet."
    return "\n".join(items)


def _headline_dtype(op: Op, entry: dict) -> str | None:
    """The dtype of an op's headline records (the one its plots show), or None without any."""
    records = headline_records(op, entry)
    return records[0]["dtype"] if records else None


SUMMARY_HEAD = ["| part | op | GPU | book's best | rate | % of ceiling | library's best | book vs library |",
                "|--:|:--|:--|:--|--:|--:|:--|--:|"]


def summary_row(r: dict, op_cell: str) -> str:
    """One row of the summary (site and README): the fastest of the book's versions and, apart, the fastest
    library version at the headline, so a library's result is never credited to the book."""
    if r["device"] is None:
        return f"| {r['part']} | {op_cell} | not measured yet | | | | | |"
    stale = "" if r["fresh"] else f' <span class="bench-stale">stale: {", ".join(r["stale_impls"])}</span>'
    book = f"{r['best_impl']} {r['best_lang']}" if r["best_impl"] else "none (a library study)"
    rate = f"{_rate(r['value'])} {r['unit']}" if r["value"] is not None else "-"
    frac = (f"{100 * r['fraction_of_ceiling']:.1f}% of {_cname(r['ceiling'])}"
            if r["fraction_of_ceiling"] is not None else "-")
    lib = f"{r['library_impl']} {r['library_lang']}" if r["library_impl"] else "-"
    ratio = f"{r['book_vs_library']:.3g}x" if r["book_vs_library"] else "-"
    return (f"| {r['part']} | {op_cell} | {gpu_short(r['device'])} | {book}{stale} | {rate} | {frac} | {lib} | "
            f"{ratio} |")


def render_summary(results_dir: Path = RESULTS_DIR) -> str:
    ops = load_all()
    lines = list(SUMMARY_HEAD)
    for r in report(results_dir):
        lines.append(summary_row(r, f"[`{r['op']}`]({ops[r['op']].chapter})"))
    return '<div class="bench-table bench-summary" markdown>\n\n' + "\n".join(lines) + "\n\n</div>\n"


def render_ceilings(results: dict[str, dict]) -> str:
    if not results:
        return '!!! warning "Not measured yet"\n    No GPU results are committed.\n'
    lines = ["| GPU | ceiling | measured | how |", "|:--|:--|--:|:--|"]
    for gpu, data in results.items():
        for name, c in data.get("ceilings", {}).items():
            lines.append(f"| {gpu_short(gpu)} | {_cname(name)} | {c['value']:,.1f} {c['unit']} | {c['how']} |")
    return '<div class="bench-table" markdown>\n\n' + "\n".join(lines) + "\n\n</div>\n"


OUTPUT_FOLD_LINES = 30  # a captured output longer than this is folded: the chapter's line reads on


def capture_mark(path: Path) -> str:
    """The mark of a captured file whose producing code changed since (or that has no record of it), as tables
    mark a stale result: ``<span class="bench-stale">stale</span> (why)``; empty for a fresh capture
    (snippets.bench.captures)."""
    from snippets.bench.captures import status

    s = status(path)
    return "" if s.fresh else f'<span class="bench-stale">{s.state}</span> ({s.why})'


OUTPUT_WIDTH = 110  # an aligned table in a capture wider than this is cut into column groups
_RULE = re.compile(r"^-+(?:  +-+)+$")


def _wrap_command(line: str, width: int) -> list[str]:
    """A long ``$ command`` line as shell continuation lines, broken before options (`` --x``)."""
    words = re.split(r" (?=--?\w)", line)
    out = [words[0]]
    for w in words[1:]:
        if len(out[-1]) + 1 + len(w) + 2 <= width:
            out[-1] += " " + w
        else:
            out[-1] += " \\"
            out.append("    " + w)
    return out


def split_wide_tables(text: str, width: int = OUTPUT_WIDTH) -> str:
    """A capture made readable at a page's width without changing a cell. An aligned table (a block of
    non-blank lines holding a rule of dash runs two or more spaces apart, like Nsight Compute's counters or
    torch.profiler's table) wider than ``width`` is cut into several tables of the same rows, each repeating
    the first column, the cells sliced by the rule's dash runs; a line of the block with nothing beyond the
    first column is kept once, in the first part, and the lines after a closing rule (torch.profiler's
    totals) once, whole, after the last part. A long ``$ command`` line is
    broken before its options into shell continuation lines. Everything else stays as it is."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ ") and len(line) > width:
            out += _wrap_command(line, width)
            i += 1
            continue
        if not (_RULE.match(line.rstrip()) and len(line.rstrip()) > width):
            out.append(line)
            i += 1
            continue
        start = i
        while start > 0 and lines[start - 1].strip() and out and out[-1] == lines[start - 1]:
            start -= 1
            out.pop()
        end = i + 1
        while end < len(lines) and lines[end].strip():
            end += 1
        table = lines[start:end]
        # torch.profiler's style closes the table with a rule: what follows it (the totals) is kept once, whole
        rules = [k for k, row in enumerate(table) if _RULE.match(row.rstrip())]
        trailer = table[rules[-1] + 1:] if len(rules) > 1 else []
        table = table[:len(table) - len(trailer)]
        spans = [(m.start(), m.end()) for m in re.finditer(r"-+", line)]
        first = spans[0][1] - spans[0][0]
        groups: list[list[int]] = []
        used = first
        for c in range(1, len(spans)):
            w = spans[c][1] - spans[c][0] + 2
            if groups and used + w <= width:
                groups[-1].append(c)
                used += w
            else:
                groups.append([c])
                used = first + w
        for g, cols in enumerate(groups):
            if g:
                out.append("")
            for row in table:
                if g and not row[spans[0][1]:].strip():
                    continue
                cells = [row[spans[0][0]:spans[0][1]].ljust(first)]
                cells += [row[spans[c][0]:spans[c][1]] for c in cols]
                out.append("  ".join(cells).rstrip())
        out += trailer
        i = end
    return "\n".join(out)


def render_output(name: str, results_dir: Path = RESULTS_DIR) -> str:
    """Program output captured on the GPU runner: ``benchmarks/results/outputs/<gpu>/<name>.txt``, one block per
    GPU (content tabs when there are several), a long one folded; a stale capture, or one without a record of
    the code that produced it, is marked."""
    if not re.fullmatch(r"[\w-]+", name):
        raise ValueError(f"bench:output name must be a plain file stem, got {name!r}")
    blocks = []
    for path in sorted((results_dir / "outputs").glob(f"*/{name}.txt")):
        text = split_wide_tables(path.read_text().rstrip())
        where = f"`benchmarks/results/outputs/{path.parent.name}/{name}.txt`"
        fence = ["```{.text .bench-output}", *text.splitlines(), "```"]
        n = len(text.splitlines())
        mark = capture_mark(path)
        if n > OUTPUT_FOLD_LINES:  # an admonition's title is plain text: the mark goes in its first line
            body = [f'??? note "Output captured on the {gpu_short(path.parent.name)} ({n} lines): {where}"', "",
                    *([f"    {mark}.", ""] if mark else []),
                    *("    " + line if line else "" for line in fence)]
        else:
            body = [f"Captured on the {gpu_short(path.parent.name)} ({where})" + (f", {mark}" if mark else "")
                    + ":", "", *fence]
        blocks.append((path.parent.name, "\n".join(body) + "\n"))
    if not blocks:
        return (f'!!! warning "Not captured yet"\n    No GPU output of `{name}` is committed; the GPU runner '
                f"writes it to `benchmarks/results/outputs/<gpu>/{name}.txt`.\n")
    return gpu_tabs(blocks)


def _machine(p: dict) -> str:
    """The GPU and software of a provenance record, for a footnote."""
    return (f"{p['gpu']} ({p['sm_count']} SMs, compute capability {p['compute_capability']}), driver {p['driver']}, "
            f"CUDA {p['cuda_runtime']}, torch {p['torch']}, triton {p['triton']}; commit `{str(p['commit'])[:10]}`"
            f"{' (uncommitted changes)' if p.get('dirty') else ''}, {p['date']}")


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
    headline rate and % of ceiling, marked stale like the tables. The rates come from one GPU for every row, the
    latest to have measured all of the table's ops, so the rows compare like with like; only when no GPU measured
    them all does each row take the latest GPU that measured its op."""
    import hashlib

    from snippets.bench.loc import impl_lines

    ops = ops if ops is not None else load_all()
    tag = hashlib.sha256(repr(items).encode()).hexdigest()[:6]
    lines = ["| op | version | language | what it does | kernel lines | host lines | GPU | rate | % of ceiling |",
             "|:--|:--|:--|:--|--:|--:|:--|--:|--:|"]
    notes: dict[str, str] = {}
    counted = []
    names = {op_name for op_name, _, _ in items}
    common = [gpu for gpu, data in results.items() if names <= set(data["ops"])]
    shared = max(common, key=lambda g: max(results[g]["ops"][n]["provenance"]["date"] for n in names),
                 default=None)
    for op_name, ver, kernels in items:
        if op_name not in ops:
            raise ValueError(f"bench:versus names unknown op {op_name!r}; known: {sorted(ops)}")
        op = ops[op_name]
        if ver not in op.impls:
            raise ValueError(f"bench:versus: {op_name} has no version {ver}; it has {sorted(op.impls)}")
        impl = op.impls[ver]
        count = impl_lines(impl, kernels)
        counted.append(f"`{op_name}` {ver}: {count.what or 'no code of its own (a library call)'}")
        found = [(gpu, data["ops"][op_name]) for gpu, data in results.items()
                 if op_name in data["ops"] and gpu in (shared or gpu,)]
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
