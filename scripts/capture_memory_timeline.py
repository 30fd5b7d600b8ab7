"""One training step, allocation by allocation: the caching allocator's recorded history.

    python scripts/capture_memory_timeline.py OUT.txt [--config 125m] [--batch 4] [--dump F]

Commit the file as ``benchmarks/results/outputs/<gpu>/memory_timeline.txt``; the memory chapter
(Part 2) shows it with ``<!-- bench:output memory_timeline -->``.

The model is the book's ``TinyTransformer`` at the ``125m`` size of ``snippets.part7.scaling``
(fp32 weights, SDPA attention), trained with AdamW under bf16 autocast. Three steps run, each a
forward, a backward, an optimizer step and ``zero_grad``. Steps 1 and 2 warm up (step 1 creates
AdamW's state and the libraries' workspaces); ``torch.cuda.memory._record_memory_history``
records step 3 only. The script reports:

- at each phase boundary, ``memory_allocated`` and ``memory_reserved``; within each phase, its
  peak (``max_memory_allocated``, ``max_memory_reserved``, reset at every boundary);
- a sparkline of allocated memory over the step's allocator events, replayed from the trace;
- the trace phase by phase: allocations, frees, their bytes, the segments the allocator added or
  released, and the time between boundaries where the events carry ``time_us``;
- checks: the replay against ``memory_allocated`` at the boundaries, and the snapshot's segments
  against ``memory_reserved``.

The phases are found in the trace by markers: at boundary ``k`` the script allocates and frees a
tensor of ``MARK_BASE + k`` bytes, a size no tensor of the model has. Everything that reads the
trace takes plain Python data (lists of event dicts), so that tests/test_memory_timeline.py checks
it on a CPU. ``--dump F`` also writes the snapshot to ``F`` as a pickle, for PyTorch's viewer
(pytorch.org/memory_viz).
"""

from __future__ import annotations

import argparse
import sys
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from snippets.bench.captures import record  # noqa: E402
from snippets.part7.scaling import CONFIGS, build  # noqa: E402

MIB = 2**20
MARK_BASE = 7919  # bytes of the first boundary marker (a prime: no tensor of the model has it)
MAX_ENTRIES = 1_000_000  # the trace is a ring buffer of this many events; a step needs far fewer
BARS = "▁▂▃▄▅▆▇█"
PHASES = ("forward", "backward", "optimizer step", "zero_grad")
LABELS = "FBOZ"  # one letter per phase, under the sparkline
# what each row of the table should show, in a training step's terms
NOTES = {
    "step start": "weights + AdamW state, no grads",
    "peak in forward": "+activations, bf16 weight copies",
    "after forward": "activations held for the backward",
    "peak in backward": "+grads, activations not yet freed",
    "after backward": "-activations, +grads",
    "peak in optimizer step": "+foreach update temporaries",
    "after optimizer step": "-temporaries, weights updated",
    "peak in zero_grad": "nothing new",
    "after zero_grad": "-grads: back to the step's start",
}


class Sample(NamedTuple):
    """The allocator's counters at a phase boundary; the peaks are since the previous one."""

    allocated: int
    reserved: int
    peak_allocated: int
    peak_reserved: int


@dataclass
class Split:
    """A device trace without its boundary markers: ``bounds[k]`` is the index in ``events`` where
    marker ``k`` was (the events before it happened before boundary ``k``), ``times[k]`` its
    ``time_us``, or None where the events carry no time."""

    events: list[dict]
    bounds: list[int]
    times: list[int | None]


@dataclass
class Replay:
    """Allocated bytes after each event of a trace, and the frees of blocks allocated before the
    trace began."""

    series: list[int]
    untracked_frees: int
    untracked_bytes: int


def split_at_markers(events: list[dict], count: int, base: int = MARK_BASE) -> Split:
    """Find the ``count`` boundary markers in order (marker ``k``: an alloc of ``base + k`` bytes)
    and drop them and their frees from the trace. ValueError if one is missing (a trace cut short:
    it keeps only the last ``max_entries`` events)."""
    out: list[dict] = []
    bounds: list[int] = []
    times: list[int | None] = []
    markers: set[int] = set()
    for e in events:
        action, addr = e.get("action"), e.get("addr")
        if action == "alloc" and len(bounds) < count and e.get("size") == base + len(bounds):
            bounds.append(len(out))
            times.append(e.get("time_us"))
            markers.add(addr)
            continue
        if action in ("free_requested", "free_completed") and addr in markers:
            if action == "free_completed":
                markers.discard(addr)  # a tensor may get the address later
            continue
        out.append(e)
    if len(bounds) < count:
        raise ValueError(f"found {len(bounds)} of the {count} phase markers in the trace "
                         "(cut short? it keeps only the last max_entries events)")
    return Split(out, bounds, times)


def replay(events: list[dict], start: int = 0) -> Replay:
    """Allocated bytes after each event, from ``start`` (``memory_allocated()`` when recording
    began).

    An ``alloc`` adds its size and a ``free_requested`` takes it off: the allocator's counter drops
    when the free is requested, and ``free_completed`` follows once the streams that used the block
    are done with it. A ``free_completed`` counts only when its alloc is in the trace and its
    request is not. A free of a block allocated before recording began still takes its size off
    (the event carries it), and is counted in ``untracked_frees``. Segment events and the rest
    change nothing. The sizes are the requested bytes; the allocator rounds blocks up."""
    live: dict[int, int] = {}
    requested: set[int] = set()
    total = start
    series: list[int] = []
    untracked = untracked_bytes = 0
    for e in events:
        action, addr = e.get("action"), e.get("addr")
        if action == "alloc":
            live[addr] = e["size"]
            total += e["size"]
        elif action == "free_requested":
            if addr in live:
                total -= live.pop(addr)
            else:  # allocated before recording began
                total -= e["size"]
                untracked += 1
                untracked_bytes += e["size"]
            requested.add(addr)
        elif action == "free_completed":
            if addr in requested:
                requested.discard(addr)
            elif addr in live:  # its request was not recorded (skip_actions)
                total -= live.pop(addr)
            # else: requested before recording began, so already off the total
        series.append(total)
    return Replay(series, untracked, untracked_bytes)


def columns(n: int, width: int) -> list[tuple[int, int]]:
    """The [start, end) spans of ``n`` values covered by each of at most ``width`` columns."""
    if n <= width:
        return [(i, i + 1) for i in range(n)]
    return [(j * n // width, (j + 1) * n // width) for j in range(width)]


def sparkline(values: list[int] | list[float], width: int = 60, lo: float = 0.0,
              hi: float | None = None) -> str:
    """One character of ``BARS`` per column, at most ``width`` columns: the largest value of the
    column's span (a short peak stays visible), from ``lo`` (the lowest bar) to ``hi`` (the full
    bar; by default the largest value)."""
    if not values:
        return ""
    top = max(values) if hi is None else hi
    out = []
    for s, e in columns(len(values), width):
        v = max(values[s:e])
        level = 0 if top <= lo else round((v - lo) / (top - lo) * (len(BARS) - 1))
        out.append(BARS[min(max(level, 0), len(BARS) - 1)])
    return "".join(out)


def ruler(n: int, bounds: list[int], labels: str, width: int = 60,
          values: list[int] | list[float] | None = None) -> str:
    """Under each column of ``sparkline`` (of ``n`` values), the label of a phase: phase ``i`` spans
    ``[bounds[i], bounds[i + 1])``; a blank outside every phase. The value labelled is the column's
    first, or with ``values`` its largest, the one the bar above shows, so that a column which
    straddles two phases is labelled with the phase of its peak."""
    out = []
    for s, e in columns(n, width):
        at = s if values is None else max(range(s, e), key=lambda k: values[k])
        i = bisect_right(bounds, at) - 1
        out.append(labels[i] if 0 <= i < min(len(labels), len(bounds) - 1) else " ")
    return "".join(out)


def phase_summary(events: list[dict], bounds: list[int]) -> list[dict]:
    """Per phase (``events[bounds[i]:bounds[i + 1]]``): the allocations and free requests with
    their bytes, and the segments the allocator added (cudaMalloc, or a mapping in an expandable
    segment) or gave back."""
    out = []
    for s, e in zip(bounds, bounds[1:]):
        d = {"allocs": 0, "alloc_bytes": 0, "frees": 0, "free_bytes": 0, "new_segments": 0,
             "freed_segments": 0}
        for ev in events[s:e]:
            action = ev.get("action")
            if action == "alloc":
                d["allocs"] += 1
                d["alloc_bytes"] += ev["size"]
            elif action == "free_requested":
                d["frees"] += 1
                d["free_bytes"] += ev["size"]
            elif action in ("segment_alloc", "segment_map"):
                d["new_segments"] += 1
            elif action in ("segment_free", "segment_unmap"):
                d["freed_segments"] += 1
        out.append(d)
    return out


def durations_ms(times: list[int | None]) -> list[float | None]:
    """Milliseconds between consecutive markers; None where a ``time_us`` is missing."""
    return [(b - a) / 1000 if a is not None and b is not None else None
            for a, b in zip(times, times[1:])]


def replay_gaps(series: list[int], bounds: list[int], start: int,
                sampled: list[int]) -> list[int]:
    """At each boundary, the replayed allocated bytes minus ``memory_allocated()`` sampled there."""
    return [(series[b - 1] if b > 0 else start) - s for b, s in zip(bounds, sampled)]


def segment_totals(segments: list[dict]) -> tuple[int, int, int]:
    """(segments, reserved bytes, allocated bytes) of a snapshot's ``segments``."""
    return (len(segments), sum(s["total_size"] for s in segments),
            sum(s.get("allocated_size", 0) for s in segments))


Row = tuple[str, int, int, int | None, str]


def timeline_rows(samples: list[Sample], phases: tuple[str, ...] = PHASES,
                  notes: dict[str, str] = NOTES) -> list[Row]:
    """The table's rows, from the samples at the ``len(phases) + 1`` boundaries: (point,
    allocated, reserved, change, note). Each phase gives its peak (the change from the phase's
    start) and its end (the change from the previous boundary)."""
    if len(samples) != len(phases) + 1:
        raise ValueError(f"need {len(phases) + 1} boundary samples, got {len(samples)}")
    first = samples[0]
    rows: list[Row] = [("step start", first.allocated, first.reserved, None,
                        notes.get("step start", ""))]
    for phase, before, after in zip(phases, samples, samples[1:]):
        peak, end = f"peak in {phase}", f"after {phase}"
        rows.append((peak, after.peak_allocated, after.peak_reserved,
                     after.peak_allocated - before.allocated, notes.get(peak, "")))
        rows.append((end, after.allocated, after.reserved, after.allocated - before.allocated,
                     notes.get(end, "")))
    return rows


def format_table(rows: list[Row]) -> list[str]:
    """Rows of (point, allocated bytes, reserved bytes, change in bytes or None, note), in MiB."""
    lines = [f"  {'point':<24}{'allocated MiB':>14}{'reserved MiB':>13}{'change MiB':>11}"
             "  what changed"]
    for point, allocated, reserved, change, note in rows:
        delta = "" if change is None else f"{change / MIB:+.0f}"
        line = f"  {point:<24}{allocated / MIB:>14.0f}{reserved / MIB:>13.0f}{delta:>11}  {note}"
        lines.append(line.rstrip())
    return lines


def format_phases(names: tuple[str, ...], summary: list[dict],
                  ms: list[float | None]) -> list[str]:
    """The trace phase by phase, one row each; ``-`` for a time the trace does not carry."""
    lines = [f"  {'phase':<16}{'allocs':>8}{'frees':>8}{'MiB alloc':>11}{'MiB freed':>11}"
             f"{'new segs':>10}{'freed segs':>12}{'ms':>9}"]
    for name, d, t in zip(names, summary, ms):
        when = "-" if t is None else f"{t:.1f}"
        lines.append(f"  {name:<16}{d['allocs']:>8}{d['frees']:>8}"
                     f"{d['alloc_bytes'] / MIB:>11.0f}{d['free_bytes'] / MIB:>11.0f}"
                     f"{d['new_segments']:>10}{d['freed_segments']:>12}{when:>9}")
    return lines


@dataclass
class Run:
    """What the GPU part measured, as plain data."""

    config: str
    params: int
    param_bytes: int
    tokens: str                # "batch x seq"
    kept: int                  # bytes step 1 left allocated
    state_bytes: int           # of them, AdamW's moments
    samples: list[Sample]      # step 3, at its boundaries
    start: int                 # memory_allocated() when recording began
    trace: list[dict]          # step 3's events, markers included
    segments: list[dict]       # the snapshot's segments after step 3
    reserved: int              # memory_reserved() after step 3


def report(run: Run, width: int = 60) -> list[str]:
    """The capture's text, without its GPU line: short enough not to be folded on the page."""
    split = split_at_markers(run.trace, len(PHASES) + 1)
    rep = replay(split.events, run.start)
    first, last = split.bounds[0], split.bounds[-1]
    series = rep.series[first:last]
    gaps = replay_gaps(rep.series, split.bounds, run.start, [s.allocated for s in run.samples])
    n_seg, seg_bytes, seg_allocated = segment_totals(run.segments)
    top = max(series, default=0)
    timed = any(t is not None for t in split.times)
    return [
        f"model: TinyTransformer '{run.config}', {run.params / 1e6:.1f} M parameters, fp32 weights "
        f"{run.param_bytes / MIB:.0f} MiB, AdamW, bf16 autocast",
        f"  {run.tokens} tokens; step 1 kept {run.kept / MIB:.0f} MiB: AdamW's moments "
        f"{run.state_bytes / MIB:.0f} MiB ({run.state_bytes / run.param_bytes:.2f} x weights) + "
        f"{(run.kept - run.state_bytes) / MIB:.0f} MiB other",
        "",
        "Step 3 (steps 1 and 2 warmed up): counters at each phase boundary, peaks within each "
        "phase:",
        *format_table(timeline_rows(run.samples)),
        "",
        f"Allocated over step 3's {len(series)} trace events, replayed (▁ = 0 to █ = "
        f"{top / MIB:.0f} MiB, a column's max):",
        "  " + sparkline(series, width, 0, top),
        "  " + ruler(len(series), [b - first for b in split.bounds], LABELS, width,
                      series),
        "  " + "  ".join(f"{c} {p}" for c, p in zip(LABELS, PHASES)),
        "",
        "The trace phase by phase (ms: between boundaries, from the events' time_us"
        + ("):" if timed else "; not in this torch):"),
        *format_phases(PHASES, phase_summary(split.events, split.bounds),
                       durations_ms(split.times)),
        "",
        f"replay vs memory_allocated(): largest gap {max(map(abs, gaps)) / MIB:.2f} MiB (sizes as "
        f"requested); frees of earlier blocks: {rep.untracked_frees}",
        f"snapshot's segments: {n_seg}, {seg_bytes / MIB:.0f} MiB (memory_reserved(): "
        f"{run.reserved / MIB:.0f} MiB), {seg_allocated / MIB:.0f} MiB of it allocated",
    ]


class Boundaries:
    """Called at each phase boundary: samples the allocator's counters, leaves marker ``k`` in the
    trace (allocated and freed at once) and resets the peaks for the next phase."""

    def __init__(self) -> None:
        self.samples: list[Sample] = []

    def __call__(self) -> None:
        torch.cuda.synchronize()
        self.samples.append(Sample(torch.cuda.memory_allocated(), torch.cuda.memory_reserved(),
                                   torch.cuda.max_memory_allocated(),
                                   torch.cuda.max_memory_reserved()))
        size = MARK_BASE + len(self.samples) - 1
        mark = torch.empty(size, dtype=torch.uint8, device="cuda")
        del mark
        torch.cuda.reset_peak_memory_stats()  # after the marker: it is in no phase's peak


def train_step(model, opt, tokens, targets, vocab: int, boundary) -> None:
    """Forward, backward, optimizer step, zero_grad; ``boundary()`` before, between and after."""
    boundary()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, vocab).float(), targets.reshape(-1))
    del logits
    boundary()
    loss.backward()
    boundary()
    opt.step()
    boundary()
    opt.zero_grad(set_to_none=True)
    boundary()


def capture(config: str, batch: int, width: int, dump: Path | None) -> list[str]:
    vocab, seq = CONFIGS[config][0], CONFIGS[config][4]
    model = build(config).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    text = torch.randint(0, vocab, (batch, seq + 1), generator=gen).cuda()
    tokens, targets = text[:, :-1], text[:, 1:]
    params = sum(p.numel() for p in model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

    torch.cuda.synchronize()
    before_step1 = torch.cuda.memory_allocated()
    train_step(model, opt, tokens, targets, vocab, Boundaries())  # AdamW state, workspaces
    kept = torch.cuda.memory_allocated() - before_step1
    state_bytes = sum(t.numel() * t.element_size() for st in opt.state.values()
                      for t in st.values() if torch.is_tensor(t) and t.is_cuda)
    train_step(model, opt, tokens, targets, vocab, Boundaries())  # step 2: as every later step

    marks = Boundaries()
    # --8<-- [start:record]
    start = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
    train_step(model, opt, tokens, targets, vocab, marks)  # step 3: every alloc and free
    snapshot = torch.cuda.memory._snapshot()  # {"segments": [...], "device_traces": [...]}
    if dump is not None:
        torch.cuda.memory._dump_snapshot(str(dump))  # pickled, for pytorch.org/memory_viz
    torch.cuda.memory._record_memory_history(enabled=None)  # stop recording
    trace = snapshot["device_traces"][torch.cuda.current_device()]  # this GPU's events
    # --8<-- [end:record]

    return report(Run(config, params, param_bytes, f"{batch} x {seq}", kept, state_bytes,
                      marks.samples, start, trace, snapshot.get("segments", []),
                      torch.cuda.memory_reserved()), width)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="text file to write")
    ap.add_argument("--config", choices=sorted(CONFIGS), default="125m")
    ap.add_argument("--batch", type=int, default=4, help="sequences per step")
    ap.add_argument("--width", type=int, default=60, help="columns of the sparkline")
    ap.add_argument("--dump", type=Path, help="also write the snapshot here (a pickle)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("capture_memory_timeline.py needs a CUDA GPU")
    props = torch.cuda.get_device_properties(0)
    lines = [f"GPU: {props.name}; torch {torch.__version__}",
             *capture(args.config, args.batch, args.width, args.dump)]
    text = "\n".join(lines).rstrip() + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    record(args.out)  # NAME.meta.json: the hash of the code that produced it
    print(text, end="")


if __name__ == "__main__":
    main()
