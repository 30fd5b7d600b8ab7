"""The streams chapter's overlap example under Nsight Systems (scripts/capture_nsys.sh runs it):

    python scripts/nsys_streams.py --run VERSION     # stream_overlap VERSION at its headline size:
                                                     # two warm-up calls, then the profiled call
    python scripts/nsys_streams.py --summary VERSION TRACE.csv COMMAND
                                                     # nsys stats' cuda_gpu_trace (CSV) -> text

The profiled call runs between cudaProfilerStart and cudaProfilerStop, so
``nsys profile --capture-range=cudaProfilerApi`` records that call alone (no compilation, no
warm-up). The summary gives, per stream, the copies and kernels and their busy time, the time two
or three operations were in flight at once (the overlap the chapter is about), then every
operation in start order: the same timeline as the torch.profiler one, from another tool.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from snippets.registry import get_op, size_key  # noqa: E402

OP = "stream_overlap"
VERSIONS = ("v0", "v3")  # one stream against four, as the torch.profiler timeline shows them
MAX_ROWS = 80  # operations listed per version (v3 at the headline has 3 per chunk)


def run(version: str) -> str:
    """Two warm-up calls (Triton compiles, pools fill), then the profiled call, checked."""
    if version not in VERSIONS:
        raise ValueError(f"run: version must be one of {VERSIONS}, got {version!r}")
    if not torch.cuda.is_available():
        raise RuntimeError("run: Nsight Systems traces a CUDA GPU, and torch sees none")
    op = get_op(OP)
    impl = op.impls[version]
    x, out, fmas, chunks = op.make_inputs(op.headline, torch.float32, "cpu",
                                          torch.Generator().manual_seed(0))
    for _ in range(2):
        impl.fn(x, out, fmas, chunks)
    torch.cuda.synchronize()
    out.fill_(float("nan"))
    torch.cuda.profiler.start()
    impl.fn(x, out, fmas, chunks)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    if torch.isnan(out).any():
        raise RuntimeError(f"run: {OP} {version} left elements of out unwritten")
    return f"{OP} {version} ({impl.desc}) at {size_key(op.headline)}: profiled call done"


def column(header: list[str], *names: str) -> int:
    for i, h in enumerate(header):
        if any(h.startswith(n) for n in names):
            return i
    raise ValueError(f"nsys stats: none of the columns {names} in {header}")


def csv_rows(text: str, first: str) -> list[list[str]]:
    """The CSV table of an ``nsys stats --format csv`` report, header first: the lines before the header
    (nsys's own messages) skipped, the header being the line whose first column starts with ``first``.
    Empty if there is none (a report with no data says so in a message instead)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith((f'"{first}', first))), None)
    return [] if start is None else list(csv.reader(lines[start:]))


def kind(name: str) -> str:
    """'HtoD', 'DtoH', 'memset', 'copy' (other copies) or 'kernel', from an operation's name."""
    if "HtoD" in name or "Host-to-Device" in name:
        return "HtoD"
    if "DtoH" in name or "Device-to-Host" in name:
        return "DtoH"
    if "memset" in name.lower():
        return "memset"
    return "copy" if "memcpy" in name.lower() else "kernel"


def parse_trace(text: str) -> list[dict]:
    """The rows of ``nsys stats --report cuda_gpu_trace --format csv``: start and duration in ns,
    stream, name, kind. Lines before the CSV header (nsys's own messages) are skipped."""
    rows = csv_rows(text, "Start")
    if not rows:
        return []
    header = rows[0]
    c_start, c_dur = column(header, "Start"), column(header, "Duration")
    c_strm, c_name = column(header, "Strm", "Stream"), column(header, "Name")
    ops = []
    for r in rows[1:]:
        if len(r) != len(header) or not r[c_start].strip():
            continue
        ops.append({"start": float(r[c_start]), "dur": float(r[c_dur]), "stream": r[c_strm],
                    "name": r[c_name], "kind": kind(r[c_name])})
    return sorted(ops, key=lambda o: o["start"])


def in_flight(ops: list[dict]) -> dict[int, float]:
    """ns during which exactly k operations ran at once, for every k seen (a sweep over the start
    and end events)."""
    events = sorted([(o["start"], 1) for o in ops] + [(o["start"] + o["dur"], -1) for o in ops])
    out: dict[int, float] = {}
    depth, last = 0, None
    for t, d in events:
        if last is not None and depth > 0:
            out[depth] = out.get(depth, 0.0) + (t - last)
        depth, last = depth + d, t
    return out


def summary(version: str, trace_csv: str, command: str) -> str:
    ops = parse_trace(trace_csv)
    lines = [f"$ {command}", ""]
    if not ops:
        return "\n".join([*lines, "(no GPU operation in the trace)"]) + "\n"
    t0 = ops[0]["start"]
    wall = max(o["start"] + o["dur"] for o in ops) - t0
    lines.append(f"stream_overlap {version}: {len(ops)} GPU operations, first start to last end "
                 f"{wall / 1e6:.3f} ms")
    lines.append(f"{'stream':>6}  {'HtoD':>5}  {'kernels':>7}  {'DtoH':>5}  {'other':>5}  "
                 f"{'busy (ms)':>9}")
    for stream in sorted({o["stream"] for o in ops}, key=lambda s: (len(s), s)):
        mine = [o for o in ops if o["stream"] == stream]
        n = {k: sum(o["kind"] == k for o in mine) for k in ("HtoD", "kernel", "DtoH")}
        other = len(mine) - sum(n.values())
        busy = sum(o["dur"] for o in mine)
        lines.append(f"{stream:>6}  {n['HtoD']:>5}  {n['kernel']:>7}  {n['DtoH']:>5}  {other:>5}  "
                     f"{busy / 1e6:>9.3f}")
    flight = in_flight(ops)
    lines.append("time with k operations in flight: " + ", ".join(
        f"k={k}: {ns / 1e6:.3f} ms" for k, ns in sorted(flight.items())))
    lines += ["", f"{'start (ms)':>10}  {'dur (ms)':>8}  {'stream':>6}  {'kind':<6}  name"]
    for o in ops[:MAX_ROWS]:
        lines.append(f"{(o['start'] - t0) / 1e6:>10.3f}  {o['dur'] / 1e6:>8.3f}  {o['stream']:>6}  "
                     f"{o['kind']:<6}  {o['name'][:60]}")
    if len(ops) > MAX_ROWS:
        lines.append(f"[... {len(ops) - MAX_ROWS} more operations]")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/nsys_streams.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--run", metavar="VERSION", choices=VERSIONS)
    group.add_argument("--summary", nargs=3, metavar=("VERSION", "TRACE_CSV", "COMMAND"))
    args = parser.parse_args(argv)
    if args.run:
        print(run(args.run))
    else:
        version, path, command = args.summary
        sys.stdout.write(summary(version, Path(path).read_text(), command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
