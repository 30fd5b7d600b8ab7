"""``bench:goal``: a chapter's goal checked against the results, one row per term and GPU."""

from __future__ import annotations

import re

from snippets.bench.report import headline_records, stale_impls
from snippets.registry import Op, size_key
from snippets.site.fmt import _cname, _fmt_ms, _gib, _slug, short_size
from snippets.site.tables import _footnote_as, _headline_dtype, gpu_short


# one named group per kind of term (speed's and memory's hold the other version, versus's another op's
# version as OP.vK or OP.best), then the threshold
GOAL_TERM = re.compile(r"^(?:(?P<speed>v\d+)|(?P<ceiling>ceiling)|memory-(?P<memory>v\d+)|(?P<rate>rate)"
                       r"|(?P<versus>[a-z][a-z0-9_]*\.(?:v\d+|best))):(?P<x>\d+(?:\.\d+)?)$")
GOAL_KINDS = ("speed", "ceiling", "memory", "rate", "versus")
TERM_FORMS = "vK:R, ceiling:F, memory-vK:F, rate:X or OP.vK:R"


def parse_goal(pos: list[str], ops: dict[str, Op]) -> tuple[Op, str, list[tuple[str, str | None, float]]]:
    """``OP VER TERM...`` -> (op, version, [(kind, other version or None, threshold)]), kind one of
    ``GOAL_KINDS``; a ``versus`` term's other version is ``"OP.vK"`` or ``"OP.best"``. Unknown ops, versions and
    malformed terms raise ``ValueError``."""
    if len(pos) < 3:
        raise ValueError(f"bench:goal needs OP VERSION and at least one term ({TERM_FORMS})")
    op_name, ver, *terms = pos
    if op_name not in ops:
        raise ValueError(f"bench:goal names unknown op {op_name!r}; known: {sorted(ops)}")
    op = ops[op_name]
    parsed = []
    for tok in terms:
        m = GOAL_TERM.match(tok)
        if not m:
            raise ValueError(f"bench:goal term {tok!r} is not {TERM_FORMS}")
        kind = next(k for k in GOAL_KINDS if m.group(k))
        other = m.group("speed") or m.group("memory") or m.group("versus")
        if kind == "ceiling" and not op.ceiling:
            raise ValueError(f"bench:goal: {op_name} has no ceiling to be a fraction of")
        if kind == "versus":
            _check_versus(op, other, ops)
        parsed.append((kind, other, float(m.group("x"))))
    for v in [*([] if ver == "best" else [ver]), *(o for k, o, _ in parsed if o and k != "versus")]:
        if v not in op.impls:
            raise ValueError(f"bench:goal: {op_name} has no version {v}; it has {sorted(op.impls)}")
    return op, ver, parsed


def _check_versus(op: Op, other: str, ops: dict[str, Op]) -> None:
    """A ``versus`` term compares two ops' rates: the other op must exist, have the version, and share the
    metric (a rate, higher is better)."""
    name, ver = other.split(".")
    if name not in ops:
        raise ValueError(f"bench:goal names unknown op {name!r}; known: {sorted(ops)}")
    if ver != "best" and ver not in ops[name].impls:
        raise ValueError(f"bench:goal: {name} has no version {ver}; it has {sorted(ops[name].impls)}")
    if ops[name].metric != op.metric or op.lower_is_better or ops[name].lower_is_better:
        raise ValueError(f"bench:goal: {op.name} and {name} are not both rates in one metric "
                         f"({op.metric}, {ops[name].metric}); a versus term compares rates")


def _versus_record(other_op: Op, ver: str, entry: dict | None, size: dict, dtype: str | None) -> dict | None:
    """The other op's record on the same GPU at the same size (every key of ``size`` equal), in its headline
    dtype unless it was measured in ``dtype``; ``best``: its book's fastest there. None when not measured."""
    if entry is None:
        return None
    rows = [r for r in entry["records"] if all(r["size"].get(k) == v for k, v in size.items())]
    dtypes = {r["dtype"] for r in rows}
    want = dtype if dtype in dtypes else _headline_dtype(other_op, entry)
    recs = {r["impl"]: r for r in rows if r["dtype"] == want}
    if ver == "best":
        ver = best_book_version(other_op, recs) or ""
    return recs.get(ver)


def best_book_version(op: Op, recs: dict[str, dict]) -> str | None:
    """The book's fastest version among ``recs`` (one GPU's headline records), or None."""
    mine = [(r["ms"], name) for name, r in recs.items()
            if name in op.impls and op.impls[name].origin == "book" and r.get("ms")]
    return min(mine)[1] if mine else None


def _goal_row(op: Op, ver: str, term: tuple[str, str | None, float], recs: dict[str, dict],
              stale: set[str], ceiling: dict | None, shown: str | None = None) -> tuple[str, str, str]:
    """One term of a goal on one GPU; ``shown`` names the version in the goal's text (``the book's best``
    for ``best``, whose version, resolved per GPU, then leads the measured cell)."""
    kind, other, x = term
    who = shown or ver
    if kind == "speed":
        goal = (f"{who} at least {x:g}x as fast as {other} ({op.impls[other].desc})" if x != 1
                else f"{who} at least as fast as {other} ({op.impls[other].desc})")
    elif kind == "ceiling":
        goal = f"{who} at least {100 * x:g}% of the {_cname(ceiling['name'] if ceiling else op.ceiling)} ceiling"
    elif kind == "rate":
        goal = f"{who} at least {x:,g} {op.metric}"
    elif kind == "versus":
        name, v = other.split(".")
        of = f"the book's best `{name}`" if v == "best" else f"`{name}` {v}"
        goal = f"{who} at least {x:g}x the {op.metric} of {of}"
    else:
        goal = f"{who} holds at most {x:g}x the peak memory of {other} ({op.impls[other].desc})"
    needed = [ver] + ([other] if other else [])
    missing = [v for v in needed if v not in recs or (kind == "memory" and "peak_extra_bytes" not in recs[v])]
    if missing:
        return goal, "-", f"not measured ({', '.join(missing)})"
    r = recs[ver]
    if kind == "speed":
        value = recs[other]["ms"] / r["ms"]
        measured, met = f"{value:.3g}x ({_fmt_ms(r['ms'])} against {_fmt_ms(recs[other]['ms'])})", value >= x
    elif kind == "ceiling":
        value = r["fraction_of_ceiling"]
        measured, met = f"{100 * value:.1f}% ({r['value']:,.1f} {op.metric})", value >= x
    elif kind == "rate":
        measured, met = f"{r['value']:,.1f} {op.metric}", r["value"] >= x
    elif kind == "versus":
        o = recs[other]
        value = r["value"] / o["value"]
        measured = f"{value:.3g}x ({r['value']:,.1f} against {o['impl']}'s {o['value']:,.1f} {op.metric})"
        met = value >= x
    else:
        mine, theirs = r["peak_extra_bytes"], recs[other]["peak_extra_bytes"]
        value = mine / theirs if theirs else float("inf") if mine else 0.0
        ratio = "< 0.001x" if value < 1e-3 else f"{value:.3g}x"
        measured, met = f"{ratio} ({_gib(mine)} against {_gib(theirs)})", value <= x
    if shown:
        measured = f"{ver}: {measured}"
    old = [v for v in needed if v in stale]
    verdict = (f"stale ({', '.join(old)} changed since)" if old else "**met**" if met else "**not met**")
    # a ratio of two timings (versus: of two rates, each its work over its time, so the median ratio
    # times a ratio of times): where the 10th-90th percentile ranges say otherwise than the medians
    per_ms = 1.0 if kind == "speed" else value * r["ms"] / recs[other]["ms"] if kind == "versus" else None
    if not old and per_ms and not met and "ms_p10" in r and "ms_p90" in recs[other]:
        # the two timings' ranges reach the goal: a difference inside the run's noise
        if per_ms * recs[other]["ms_p90"] / r["ms_p10"] >= x:
            verdict += " (within the timings' 10th-90th percentile spread)"
    if not old and per_ms and met and "ms_p90" in r and "ms_p10" in recs[other]:
        # and the other way: a goal met by the medians that the spreads do not carry (a noisy or
        # bimodal baseline whose fast runs would miss it)
        if per_ms * recs[other]["ms_p10"] / r["ms_p90"] < x:
            verdict += " (but not across the timings' 10th-90th percentile spread)"
    return goal, measured, verdict


def render_goal(op: Op, ver: str, terms: list[tuple[str, str | None, float]], results: dict[str, dict],
                dtype: str | None = None, size: str | None = None, ops: dict[str, Op] | None = None) -> str:
    """A chapter's goal for one version, each term checked against the headline records of every GPU that
    measured the op (see the module docstring for the terms); ``ops`` resolves versus terms' other ops."""
    import hashlib

    tag = hashlib.sha256(repr((op.name, ver, terms, dtype, size)).encode()).hexdigest()[:6]
    sizes = {size_key(sz) for sz in [op.headline, *op.sweep]}
    if size is not None and size not in sizes:
        raise ValueError(f"bench:goal: {op.name} has no size {size!r}; its sizes are {sorted(sizes)}")
    rows_out, notes, head = [], [], None
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
        notes.append(_footnote_as(op, gpu, entry, label))
        head = head or f"**Goal check**: `{op.name}` · {rows[0]['dtype']} · {short_size(rows[0]['size'])}"
        here, shown = ver, None
        if ver == "best":  # the book's fastest version on this GPU, whichever it is
            here, shown = best_book_version(op, recs) or "best", "the book's best version"
        for t in terms:
            if t[0] == "versus":  # the other op's record at this size on this GPU, and its freshness
                name, v = t[1].split(".")
                if not ops or name not in ops:
                    raise ValueError(f"bench:goal: a versus term needs the ops to find {name!r} (pass ops)")
                other_op = ops[name]
                o_entry = data["ops"].get(name)
                o = _versus_record(other_op, v, o_entry, rows[0]["size"], rows[0]["dtype"])
                recs = {**recs, t[1]: o} if o else {k: r for k, r in recs.items() if k != t[1]}
                if o and o["impl"] in stale_impls(other_op, o_entry):
                    stale = stale | {t[1]}
            goal, measured, verdict = _goal_row(op, here, t, recs, stale, entry["ceiling"], shown)
            rows_out.append(f"| {goal} | {gpu_short(gpu)}[^{label}] | {measured} | {verdict} |")
    if not rows_out:
        return (f'!!! warning "Goal not checked yet"\n    `{op.name}` has no committed GPU results to check the '
                "goal against.\n")
    # one table for every GPU, each term's rows together, so a reader compares the GPUs' verdicts at a glance
    order = {t: i for i, t in enumerate(dict.fromkeys(r.split(" | ")[0] for r in rows_out))}
    rows_out.sort(key=lambda r: order[r.split(" | ")[0]])
    lines = [head, "", "| goal | GPU | measured | verdict |", "|:--|:--|:--|:--|", *rows_out]
    return '<div class="bench-table bench-goal" markdown>\n\n' + "\n".join(lines) + "\n\n</div>\n\n" + "\n\n".join(notes)
