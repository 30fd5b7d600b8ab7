"""``<!-- bench:dist WHAT [ARG] -->``: Part 7's multi-GPU results (snippets/bench/distributed.py).

- ``bench:dist topology``: ``nvidia-smi topo -m`` of every machine measured;
- ``bench:dist sweep OP``: NCCL's OP over message sizes, per machine: time, algorithm and bus
  bandwidth, and the error of the alpha-beta model fitted to the whole sweep;
- ``bench:dist ring``: the book's ring all-reduce against NCCL's, bus bandwidth per size, and its
  goal at 256 MiB (``RING_GOAL``, a fraction of NCCL's per world size);
- ``bench:dist scaling``: a transformer of about a billion parameters trained on one GPU and on all
  of the machine's, with the book's DDP, torch's DDP and FSDP2: step time, tokens per second,
  weak-scaling efficiency and model-FLOPs utilisation, with their goals;
- ``bench:dist tp_overlap``: a tensor-parallel MLP block with and without chunked overlap of its
  collectives, against compute alone and communication alone: the hidden fraction, and its goal;
- ``bench:dist one_shot``: the book's one-shot all-reduce against NCCL's and PyTorch's one-shot
  kernel, latency per size, and its goal at 256 KiB on 2 GPUs (``ONE_SHOT_GOAL``, a ratio to NCCL);
- ``bench:dist halving``: the book's halving-doubling all-reduce against NCCL's and the book's
  ring in one run, bus bandwidth per size, and where it stands at 256 MiB against the bar the
  ring's goal sets for the machine's world size;
- ``bench:dist p2p_patterns``: one ring step's point-to-point traffic timed alone (send to one
  peer and receive from another) against exchanging with one peer and sending one way;
- ``bench:dist pipeline``: GPipe's and 1F1B's bubble measured on every GPU of the machine against
  (p - 1) / (m + p - 1), and 1F1B's goal: within ``PIPELINE_GOAL`` of its formula.

Every table says which world sizes have no measurement yet, and marks a stale run as stale.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from snippets.bench.distributed import WORLD_SIZES, fresh, load, slug
from snippets.site.tables import DIST_TIMES_NOTE

# the goals Part 7 sets (specifications, not measurements): the ring's bus bandwidth as a
# fraction of NCCL's at 256 MiB per world size; the one-shot's latency as a ratio to NCCL's at
# 256 KiB on 2 GPUs; the alpha-beta model's worst relative error over the whole sweep
RING_GOAL = {2: 0.90, 4: 0.85}
ONE_SHOT_GOAL = 0.7
MODEL_GOAL = 0.15
WEAK_SCALING_GOAL = 0.9   # data parallelism, 1 to 4 GPUs, the same batch per GPU
MFU_GOAL = 0.4            # FSDP2 with prefetching on 4 GPUs
SCALING_GOAL_GPUS = 4     # the world size both scaling goals are set for
TP_OVERLAP_GOAL = 0.5     # the share of tensor parallelism's communication the overlap hides
PIPELINE_GOAL = 0.10      # 1F1B's measured bubble within this fraction of (p - 1) / (m + p - 1)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def _machines(results_dir: Path) -> list[dict[str, Any]]:
    return load(Path(results_dir) / "distributed")


def _heading(m: dict[str, Any], run: str, what: str, stale: bool) -> tuple[str, str]:
    """The line above a machine's table (directive ``what``) and its provenance footnote."""
    e = m["runs"][run]
    p = e["provenance"]
    label = f"dist-{what}-{slug(m['gpu'])}-x{m['world_size']}"
    state = (" **Stale**: the code that produced it has changed since; re-run "
             "`scripts/part7_gpus.sh`." if stale else "")
    note = (f"[^{label}]: Measured by `python -m {e['module']}` under `scripts/part7_gpus.sh` on "
            f"{m['world_size']} x {p['gpu']}, torch {p['torch']}, NCCL {p['nccl']}, NVLink "
            f"multicast off; commit `{e['commit'][:10]}`, {p['date']}.{state} {DIST_TIMES_NOTE}")
    return f"**{m['world_size']} x {p['gpu']}**{' (stale)' if stale else ''}[^{label}]", note


def _missing(machines: list[dict[str, Any]], run: str) -> str:
    have = {m["world_size"] for m in machines if run in m["runs"]}
    lacking = [w for w in WORLD_SIZES if w not in have]
    if not lacking:
        return ""
    names = " and ".join(f"{w} GPUs" for w in lacking)
    return (f"Not measured yet on {names}: `bash scripts/part7_gpus.sh OUT` on a machine with "
            "that many GPUs measures it.")


def render_topology(results_dir: Path) -> str:
    machines = [m for m in _machines(results_dir) if m.get("topology")]
    if not machines:
        return "*No multi-GPU machine measured yet.*"
    out = []
    for m in machines:
        out.append(f"`nvidia-smi topo -m` on the {m['world_size']} x {m['gpu']} machine:\n")
        out.append("```text\n" + m["topology"].rstrip() + "\n```")
    return "\n\n".join(out)


# a goal's verdict in a table's text: **met**, **not met**, **met on 2 GPUs**, ...
STALE_VERDICT = re.compile(r"\*\*((?:not )?met(?: on \d+ GPUs)?)\*\*")


def _render(results_dir: Path, run: str, what: str, body) -> str:
    """One table per machine that has ``run``: ``body(machine, entry)`` gives its lines (none when
    the machine has nothing for this directive), under the machine's heading; then the world sizes
    not measured yet and the provenance footnotes."""
    machines = [m for m in _machines(results_dir) if run in m["runs"]]
    out, notes = [], []
    for m in machines:
        lines = body(m, m["runs"][run])
        if not lines:
            continue
        stale = not fresh(run, m["runs"][run])
        if stale:   # a stale run's numbers show, but judge nothing
            lines = [STALE_VERDICT.sub(r"**stale** (\1 when measured)", line) for line in lines]
        head, note = _heading(m, run, what, stale)
        notes.append(note)
        out.append("\n".join([head, "", *lines]))
    missing = _missing(machines, run)
    if missing:
        out.append(missing)
    return "\n\n".join(out + notes) if out else "*Not measured yet.*"


def _preferred(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """The records a table shows: the graph-timed ones where the run has any (the GPUs' own time),
    else the eager ones (records from before timings were kept are eager), and which they are."""
    graph = [r for r in records if r.get("timing") == "graph"]
    if graph:
        return graph, "graph"
    return [r for r in records if r.get("timing", "eager") == "eager"], "eager"


TIMING_NOTE = {"graph": "Times are CUDA-graph replays: the calls run back to back on the GPUs "
                        "with no host between them.",
               "eager": "Times are of calls issued back to back from Python: they include the "
                        "host's cost of issuing each call."}


def _piece_time(pieces: list[dict[str, Any]], n: int) -> float:
    """The time a per-range fit predicts at ``n`` bytes (as cost.predict_piecewise)."""
    piece = pieces[0]
    for q in pieces:
        if n >= q["lo_bytes"]:
            piece = q
    beta = piece["beta_bytes_per_s"]
    return piece["alpha_s"] + (n / beta if beta else 0.0)


def _ranges(pieces: list[dict[str, Any]]) -> str:
    def one(q: dict[str, Any]) -> str:
        beta = f"{q['beta_bytes_per_s'] / 1e9:.0f} GB/s" if q["beta_bytes_per_s"] else "none (flat)"
        return (f"{_size(int(q['lo_bytes']))} to {_size(int(q['hi_bytes']))}: \\(\\alpha\\) = "
                f"{q['alpha_s'] * 1e6:.1f} µs, \\(\\beta\\) = {beta}")
    return "; ".join(one(q) for q in pieces)


def render_sweep(op: str, results_dir: Path) -> str:
    def body(m: dict[str, Any], e: dict[str, Any]) -> list[str]:
        rows, timing = _preferred([r for r in e["records"] if r["op"] == op])
        if not rows:
            return []
        eager = {r["bytes"]: r for r in e["records"]
                 if r["op"] == op and r.get("timing", "eager") == "eager"}
        fit = next((f for f in e.get("fits", []) if f["op"] == op and "alpha_s" in f), None)
        pieces = fit.get("pieces") if fit else None
        cols = ["message", "time (µs)"] + (["eager (µs)"] if timing == "graph" else [])
        cols += ["algbw (GB/s)", "busbw (GB/s)", "model error, one line"]
        cols += ["per range"] if pieces else []
        lines = ["| " + " | ".join(cols) + " |", "|" + "--:|" * len(cols)]
        for r in rows:
            cells = [_size(r["bytes"]), f"{r['seconds'] * 1e6:.1f}"]
            if timing == "graph":
                ea = eager.get(r["bytes"])
                cells.append(f"{ea['seconds'] * 1e6:.1f}" if ea else "–")
            cells += [f"{r['algbw'] / 1e9:.1f}", f"{r['busbw'] / 1e9:.1f}"]
            preds = []
            if fit:
                preds.append(fit["alpha_s"] + r["bytes"] / fit["beta_bytes_per_s"])
            if pieces:
                preds.append(_piece_time(pieces, r["bytes"]))
            cells += [f"{100 * (q - r['seconds']) / r['seconds']:+.0f}%" for q in preds]
            cells += [""] * (len(cols) - len(cells))
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", TIMING_NOTE[timing]]
        if fit:
            worst = fit["max_rel_error"]
            lines += ["", f"One line fitted over the whole sweep: \\(\\alpha\\) = "
                      f"{fit['alpha_s'] * 1e6:.1f} µs, \\(\\beta\\) = "
                      f"{fit['beta_bytes_per_s'] / 1e9:.0f} GB/s; worst error {100 * worst:.0f}%."]
            if pieces:
                worst = fit["pieces_max_rel_error"]
                lines += ["", f"One line per range of sizes ({_ranges(pieces)}); worst error "
                          f"{100 * worst:.0f}%."]
            verdict = "met" if worst <= MODEL_GOAL else "not met"
            model = "one line per range of sizes" if pieces else "one line"
            lines += ["", f"Goal: the model ({model}) within {MODEL_GOAL:.0%} of every size of the "
                      f"sweep: **{verdict}**."]
        return lines

    return _render(results_dir, "sweep", f"sweep-{op}", body)


def _by(records: list[dict[str, Any]]) -> dict[int, dict[str, dict[str, Any]]]:
    """The timed records by size, then by implementation, of the preferred timing."""
    table: dict[int, dict[str, dict[str, Any]]] = {}
    for r in _preferred([r for r in records if "seconds" in r])[0]:
        if "seconds" in r:
            table.setdefault(r["bytes"], {})[r["impl"]] = r
    return table


def ring_goal(world_size: int) -> float:
    """The ring's bar at 256 MiB for a world size: its own, or the lowest set for a size without
    one. The ring's table and the halving table judge against it alike."""
    return RING_GOAL.get(world_size, min(RING_GOAL.values()))


def render_ring(results_dir: Path) -> str:
    def body(m: dict[str, Any], e: dict[str, Any]) -> list[str]:
        table = {n: v for n, v in _by(e["records"]).items()
                 if "nccl" in v and any(k.startswith("ring") for k in v)}
        if not table:
            return []
        rings = sorted({k for v in table.values() for k in v if k.startswith("ring")})
        cols = " | ".join(f"book {k} (GB/s)" for k in rings)
        lines = [f"| message | NCCL busbw (GB/s) | {cols} | best book / NCCL |",
                 "|--:|--:|" + "--:|" * len(rings) + "--:|"]
        for n in sorted(table):
            v = table[n]
            best = max(v[k]["busbw"] for k in rings if k in v)
            cells = " | ".join(f"{v[k]['busbw'] / 1e9:.0f}" if k in v else "" for k in rings)
            lines.append(f"| {_size(n)} | {v['nccl']['busbw'] / 1e9:.0f} | {cells} | "
                         f"{best / v['nccl']['busbw']:.2f} |")
        at = table.get(256 << 20)
        if at:
            best = max(at[k]["busbw"] for k in rings if k in at) / at["nccl"]["busbw"]
            goal = ring_goal(m["world_size"])
            verdict = "met" if best >= goal else "not met"
            lines += ["", TIMING_NOTE[_preferred([r for r in e["records"] if "seconds" in r])[1]]]
            lines += ["", f"Goal at 256 MiB on {m['world_size']} GPUs: the book's ring at "
                      f"\\(\\ge\\) {goal:.0%} of NCCL's bus bandwidth: {best:.1%}, **{verdict}**."]
        return lines

    return _render(results_dir, "fast_allreduce", "ring", body)


def render_one_shot(results_dir: Path) -> str:
    def body(m: dict[str, Any], e: dict[str, Any]) -> list[str]:
        table = {n: v for n, v in _by(e["records"]).items() if "one_shot" in v and "nccl" in v}
        if not table:
            return []
        fused = any("fused_one_shot" in v for v in table.values())
        head = ["message", "NCCL (µs)", "book one-shot (µs)"]
        head += ["book, one kernel (µs)"] if fused else []
        head += ["PyTorch one-shot, library (µs)", "best book / NCCL"]
        lines = ["| " + " | ".join(head) + " |", "|" + "--:|" * len(head)]

        def us(v: dict[str, Any], impl: str) -> str:
            return f"{v[impl]['seconds'] * 1e6:.1f}" if impl in v else "–"

        def best(v: dict[str, Any]) -> float:
            return min(v[k]["seconds"] for k in ("one_shot", "fused_one_shot") if k in v)

        for n in sorted(table):
            v = table[n]
            cells = [_size(n), us(v, "nccl"), us(v, "one_shot")]
            cells += [us(v, "fused_one_shot")] if fused else []
            cells += [us(v, "torch_one_shot"), f"{best(v) / v['nccl']['seconds']:.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", TIMING_NOTE[_preferred([r for r in e["records"] if "seconds" in r])[1]]]
        at = table.get(256 << 10)
        if at and m["world_size"] == 2:
            ratio = best(at) / at["nccl"]["seconds"]
            verdict = "met" if ratio <= ONE_SHOT_GOAL else "not met"
            lines += ["", "Goal at 256 KiB on 2 GPUs: the book's one-shot at \\(\\le\\) "
                      f"{ONE_SHOT_GOAL}x NCCL's latency: {ratio:.2f}x, **{verdict}**."]
        return lines

    return _render(results_dir, "fast_allreduce", "one-shot", body)


def _scaling_goal(goal: str, where: str, world: int, value: str, ok: bool) -> str:
    """A scaling goal's verdict line. The goals are set for ``SCALING_GOAL_GPUS``; measured on
    another world size, the line says where the value comes from and that the verdict is for that
    world size only."""
    verdict = "met" if ok else "not met"
    if world == SCALING_GOAL_GPUS:
        return f"Goal: {goal}: {value}, **{verdict}**."
    return (f"Goal: {goal}; {where}: {value}, **{verdict} on {world} GPUs**; "
            f"{SCALING_GOAL_GPUS} GPUs not measured yet.")


NAMES = {"single": "one GPU", "ddp_book": "BucketedDDP (book)",
         "ddp_torch": "DistributedDataParallel (library)", "fsdp2": "FSDP2 (library)"}


def render_scaling(results_dir: Path) -> str:
    def body(m: dict[str, Any], e: dict[str, Any]) -> list[str]:
        recs = e["records"]
        single = next((r for r in recs if r["mode"] == "single"), None)
        lines = ["| version | GPUs | step (ms) | tokens/s | weak scaling | MFU |",
                 "|:--|--:|--:|--:|--:|--:|"]
        for r in sorted(recs, key=lambda r: (r["world_size"], r["mode"])):
            weak = ""
            if single and r["mode"] in ("ddp_book", "ddp_torch"):
                weak = f"{r['tokens_per_s'] / (r['world_size'] * single['tokens_per_s']):.1%}"
            mfu = f"{r['mfu']:.1%}" if r.get("mfu") else "–"
            lines.append(f"| {NAMES.get(r['mode'], r['mode'])} | {r['world_size']} | "
                         f"{r['seconds_per_step'] * 1e3:.0f} | {r['tokens_per_s']:,.0f} | "
                         f"{weak} | {mfu} |")
        peak = next((r.get("peak_from") for r in recs if r.get("peak_from")), None)
        if peak:
            lines += ["", f"MFU is measured against the {peak} rate of one GPU."]
        book = max((r for r in recs if r["mode"] == "ddp_book"), default=None,
                   key=lambda r: r["world_size"])
        if single and book:
            eff = book["tokens_per_s"] / (book["world_size"] * single["tokens_per_s"])
            lines += ["", _scaling_goal(
                f"the book's DDP scales from 1 to {SCALING_GOAL_GPUS} GPUs at \\(\\ge\\) "
                f"{WEAK_SCALING_GOAL:.0%}", f"from 1 to {book['world_size']} GPUs",
                book["world_size"], f"{eff:.1%}", eff >= WEAK_SCALING_GOAL)]
        fsdp = max((r for r in recs if r["mode"] == "fsdp2" and r.get("mfu")), default=None,
                   key=lambda r: r["world_size"])
        if fsdp:
            lines += ["", _scaling_goal(
                f"FSDP2 on {SCALING_GOAL_GPUS} GPUs at \\(\\ge\\) {MFU_GOAL:.0%} MFU",
                f"on {fsdp['world_size']} GPUs", fsdp["world_size"], f"{fsdp['mfu']:.1%}",
                fsdp["mfu"] >= MFU_GOAL)]
        return lines

    return _render(results_dir, "scaling", "scaling", body)


TP_NAMES = {"compute": "compute only (a)", "comm": "communication only (b)",
            "tp": "TensorParallelMLP, no overlap", "overlap": "chunked overlap (book)",
            "ring": "ring of messages (book)", "async_tp": "async-TP (library)"}


def _p2p_chunk_note(e: dict[str, Any], users: str = "", after: str = "") -> str:
    """The line under a table whose run may set NCCL's point-to-point chunk (``nccl_p2p_chunk_bytes``
    in the filed entry; None: NCCL's default): ``users`` says what uses it, ``after`` what does not."""
    chunk = e.get("nccl_p2p_chunk_bytes")
    return (f"NCCL's point-to-point chunk over NVLink (`NCCL_P2P_NVL_CHUNKSIZE`){users}: "
            + (f"{_size(chunk)}, set by the run before NCCL starts{after}." if chunk
               else "NCCL's default."))


BOOK_TP = ("overlap", "ring")      # the book's overlapped versions, which the goal judges
# a best hidden fraction less than this above the unoverlapped block's (same layout, same run) is
# read as no better than no overlap: between runs on the same machine, the unoverlapped block's own
# "hidden fraction" moved by at least this much
TP_NOISE = 0.10


def render_tp_overlap(results_dir: Path) -> str:
    def body(m: dict[str, Any], e: dict[str, Any]) -> list[str]:
        cfg = e["config"]
        lines = [f"{cfg['tokens']} tokens, width {cfg['hidden']}, hidden layer {cfg['ffn']}, "
                 f"{cfg['dtype']}; one forward and backward of the MLP block.", "",
                 "| layout | version | chunks | time (ms) | hidden fraction |",
                 "|:--|:--|--:|--:|--:|"]
        hidden = {(h["sp"], h["variant"], h["chunks"]): h["hidden_fraction"] for h in e["hidden"]}
        for r in e["records"]:
            layout = "TP + SP" if r["sp"] else "TP"
            if "skipped" in r:
                lines.append(f"| {layout} | {TP_NAMES[r['variant']]} | | – | {r['skipped']} |")
                continue
            h = hidden.get((r["sp"], r["variant"], r["chunks"]))
            cell = f"{h:.0%}" if h is not None else ""
            lines.append(f"| {layout} | {TP_NAMES[r['variant']]} | {r['chunks']} | "
                         f"{r['seconds'] * 1e3:.2f} | {cell} |")
        if any(r["variant"] == "ring" for r in e["records"]):
            lines += ["", _p2p_chunk_note(e, users=", which only the ring's messages use")]
        book = [h for h in e["hidden"] if h["variant"] in BOOK_TP]
        if book:
            best = max(book, key=lambda h: h["hidden_fraction"])
            verdict = "met" if best["hidden_fraction"] >= TP_OVERLAP_GOAL else "not met"
            layout = "TP + SP" if best["sp"] else "TP"
            count = best["chunks"]
            chunks = (f", {count} chunk{'s' if count > 1 else ''}" if best["variant"] == "overlap"
                      else "")
            line = (f"Goal: the book's overlapped block hides \\(\\ge\\) {TP_OVERLAP_GOAL:.0%} "
                    f"of the communication: best {best['hidden_fraction']:.0%} "
                    f"({TP_NAMES[best['variant']]}, {layout}{chunks}), **{verdict}**.")
            plain = next((h["hidden_fraction"] for h in e["hidden"]
                          if h["variant"] == "tp" and h["sp"] == best["sp"]), None)
            if plain is not None and best["hidden_fraction"] - plain < TP_NOISE:
                # the measure's baseline problem: a block that overlaps nothing scores as well
                line += (f" TensorParallelMLP, which overlaps nothing, shows {plain:.0%} in the "
                         "same layout and run: the book's best is no better than no overlap "
                         "beyond the measure's noise.")
            lines += ["", line]
        return lines

    return _render(results_dir, "tp_overlap", "tp-overlap", body)


def pipeline_goal_met(bubble: float, formula: float) -> bool:
    """1F1B's goal: the measured bubble within ``PIPELINE_GOAL`` of its formula, either side."""
    return abs(bubble - formula) <= PIPELINE_GOAL * formula


def render_pipeline(results_dir: Path) -> str:
    def body(m: dict[str, Any], e: dict[str, Any]) -> list[str]:
        recs = [r for r in e["records"] if "bubble_median" in r]
        if not recs:
            return []
        c = recs[0]
        delay = (f"; a sleep of {c['delay_ms']:g} ms added to every action"
                 if c.get("delay_ms") else "")
        per = c["blocks"] // c["p"]
        per = f"{per} or {per + 1}" if c["blocks"] % c["p"] else f"{per}"
        lines = [f"{c['blocks']} transformer blocks of width {c['dim']}, "
                 f"{per} per stage; micro-batches of "
                 f"{c['micro_batch_size']} sequences of {c['seq_len']} tokens; {c['dtype']}"
                 f"{delay}. Medians over steps {c.get('warmup_steps', 1) + 1} to {c['steps']} "
                 "(the first is a warm-up).", "",
                 "| schedule | p | m | step (ms) | measured bubble | (p-1)/(m+p-1) "
                 "| measured / formula |", "|:--|--:|--:|--:|--:|--:|--:|"]
        for r in recs:
            lines.append(f"| {r['schedule']} | {r['p']} | {r['m']} | "
                         f"{r['seconds_per_step_median'] * 1e3:.1f} | {r['bubble_median']:.3f} | "
                         f"{r['formula']:.3f} | {r['bubble_median'] / r['formula']:.2f} |")
        for r in recs:
            if r["schedule"] != "1f1b":
                continue
            verdict = "met" if pipeline_goal_met(r["bubble_median"], r["formula"]) else "not met"
            lines += ["", f"Goal: 1F1B's bubble within {PIPELINE_GOAL:.0%} of its formula "
                      f"(p = {r['p']}, m = {r['m']}): {r['bubble_median']:.3f} against "
                      f"{r['formula']:.3f}, {r['bubble_median'] / r['formula'] - 1:+.1%}, "
                      f"**{verdict}**."]
        return lines

    return _render(results_dir, "pipeline", "pipeline", body)


def render_halving(results_dir: Path) -> str:
    def body(m: dict[str, Any], e: dict[str, Any]) -> list[str]:
        table = {n: v for n, v in _by(e["records"]).items()
                 if {"nccl", "halving_doubling"} <= set(v)}
        if not table:
            return []
        lines = ["| message | NCCL busbw (GB/s) | book ring (GB/s) | book halving-doubling (GB/s) "
                 "| halving-doubling / NCCL |", "|--:|--:|--:|--:|--:|"]
        for n in sorted(table):
            v = table[n]
            ring = f"{v['ring/pieces=1']['busbw'] / 1e9:.0f}" if "ring/pieces=1" in v else ""
            lines.append(f"| {_size(n)} | {v['nccl']['busbw'] / 1e9:.0f} | {ring} | "
                         f"{v['halving_doubling']['busbw'] / 1e9:.0f} | "
                         f"{v['halving_doubling']['busbw'] / v['nccl']['busbw']:.2f} |")
        lines += ["", _p2p_chunk_note(e, after="; NCCL's all-reduce does not use it"),
                  "", TIMING_NOTE[_preferred([r for r in e["records"] if "seconds" in r])[1]]]
        at = table.get(256 << 20)
        if at:
            goal = ring_goal(m["world_size"])
            bar = (f"At 256 MiB on {m['world_size']} GPUs, against the bar the ring's goal sets "
                   f"there (\\(\\ge\\) {goal:.0%} of NCCL's bus bandwidth): ")
            for impl, name in (("ring/pieces=1", "the book's ring"),
                               ("halving_doubling", "halving-doubling")):
                if impl in at:
                    frac = at[impl]["busbw"] / at["nccl"]["busbw"]
                    verdict = "met" if frac >= goal else "not met"
                    bar += f"{name} {frac:.1%}, **{verdict}**; "
            lines += ["", bar.removesuffix("; ") + "."]
        return lines

    return _render(results_dir, "halving", "halving", body)


# pattern -> (its column, its line of the legend under the table)
P2P_PATTERNS = {
    "ring_shift": ("ring step", "Ring step: every rank sends to the next and receives from the "
                                "previous."),
    "pair_exchange": ("pair exchange", "Pair exchange: ranks 2k and 2k + 1 send to each other."),
    "pair_exchange_2rank": ("pair, own communicator", "Pair, own communicator: the same on a "
                            "communicator of the two ranks alone."),
    "one_way": ("one way", "One way: rank 2k sends to 2k + 1 only."),
}


def render_p2p_patterns(results_dir: Path) -> str:
    def body(m: dict[str, Any], e: dict[str, Any]) -> list[str]:
        recs, timing = _preferred([r for r in e["records"] if "seconds" in r])
        if not recs:
            return []
        cells = {(r["bytes"], r["pattern"]): r for r in recs}
        names = [k for k in P2P_PATTERNS if any(k == pat for _, pat in cells)]
        lines = ["| message per rank | " + " | ".join(f"{P2P_PATTERNS[k][0]} (GB/s)" for k in names)
                 + " | ring step / pair |", "|--:|" + "--:|" * (len(names) + 1)]
        for n in sorted({b for b, _ in cells}):
            row = [f"{cells[n, k]['per_direction'] / 1e9:.0f}" if (n, k) in cells else ""
                   for k in names]
            ring, pair = cells.get((n, "ring_shift")), cells.get((n, "pair_exchange"))
            ratio = f"{ring['per_direction'] / pair['per_direction']:.2f}" if ring and pair else ""
            lines.append(f"| {_size(n)} | " + " | ".join(row) + f" | {ratio} |")
        return lines + ["", " ".join(P2P_PATTERNS[k][1] for k in names) + " Bandwidth per "
                        "direction: a rank's message over the slowest rank's time. "
                        + TIMING_NOTE[timing]]

    return _render(results_dir, "p2p_patterns", "p2p", body)


def render_dist(pos: list[str], results_dir: Path) -> str:
    what = pos[0] if pos else ""
    if what == "topology":
        return render_topology(results_dir)
    if what == "sweep":
        if len(pos) < 2:
            raise ValueError("bench:dist sweep needs an op (all_reduce, all_gather, ...)")
        return render_sweep(pos[1], results_dir)
    if what == "ring":
        return render_ring(results_dir)
    if what == "one_shot":
        return render_one_shot(results_dir)
    if what == "scaling":
        return render_scaling(results_dir)
    if what == "tp_overlap":
        return render_tp_overlap(results_dir)
    if what == "pipeline":
        return render_pipeline(results_dir)
    if what == "p2p_patterns":
        return render_p2p_patterns(results_dir)
    if what == "halving":
        return render_halving(results_dir)
    raise ValueError("bench:dist takes topology, sweep OP, ring, one_shot, scaling, tp_overlap, "
                     f"pipeline, p2p_patterns or halving; got {what!r}")
