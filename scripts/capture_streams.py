"""Capture the streams chapter's outputs on a GPU (scripts/capture_streams.sh runs it):

    python scripts/capture_streams.py OUTDIR

writes OUTDIR/stream_overlap.json (v0 and v3 of ``stream_overlap`` under torch.profiler: every copy
and kernel with its stream; ``<!-- bench:timeline stream_overlap -->`` draws it) and
OUTDIR/launch_latency.txt (one launch round trip per launcher, every ``launch_overhead`` version at
10,000 launches; ``<!-- bench:output launch_latency -->``), each with its record, NAME.meta.json
(snippets.bench.captures).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from snippets import cuda  # noqa: E402
from snippets.bench.captures import record  # noqa: E402
from snippets.part3.streams import launch_summary, trace_pipelines  # noqa: E402


def capture(outdir: Path) -> None:
    """Write ``stream_overlap.json`` (the timeline) and ``launch_latency.txt`` into ``outdir``."""
    cuda.require_gpu()
    outdir.mkdir(parents=True, exist_ok=True)
    trace = trace_pipelines()
    (outdir / "stream_overlap.json").write_text(json.dumps(trace, indent=1) + "\n")
    (outdir / "launch_latency.txt").write_text(launch_summary())
    for name in ("stream_overlap.json", "launch_latency.txt"):
        record(outdir / name)  # NAME.meta.json: the hash of the code that produced it


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python scripts/capture_streams.py OUTDIR")
    capture(Path(sys.argv[1]))
