"""A GPU timeline captured on the GPU runner, loaded and checked: ``<!-- bench:timeline NAME -->``
in a chapter, drawn by snippets.site.timeline.

A capture (for example ``python -m snippets.part3.streams OUTDIR``) writes ``NAME.json`` holding

    {"gpu": ..., "torch": ..., "captured": ISO date,
     "runs": {run label: [{"name", "kind": "h2d" | "d2h" | "kernel", "stream", "start_us",
                           "dur_us"}, ...]}}

and it is committed as ``benchmarks/results/outputs/<gpu>/NAME.json``. Each file becomes one
figure: one lane per (run, stream) (:func:`lanes`), a bar per copy or kernel, every run's time
counted from its own first GPU event so that the runs line up on one axis.
"""

from __future__ import annotations

import json
from pathlib import Path

KINDS = {"h2d": "host to device copy", "kernel": "kernel", "d2h": "device to host copy"}
EVENT_KEYS = ("name", "kind", "stream", "start_us", "dur_us")


def load_timeline(path: Path) -> dict:
    """A timeline file, checked: a non-empty ``runs`` mapping of run label to a list of well-formed events."""
    data = json.loads(path.read_text())
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, dict) or not runs:
        raise ValueError(f"{path}: a timeline needs a non-empty 'runs' mapping of run label to events")
    for label, events in runs.items():
        if not isinstance(events, list):
            raise ValueError(f"{path}: run {label!r} must be a list of events")
        for e in events:
            missing = [k for k in EVENT_KEYS if not isinstance(e, dict) or k not in e]
            if missing:
                raise ValueError(f"{path}: run {label!r} has an event without {', '.join(missing)}: {e!r}")
            if e["kind"] not in KINDS:
                raise ValueError(f"{path}: run {label!r} has an event of kind {e['kind']!r}; kinds are "
                                 f"{', '.join(KINDS)}")
            if not (e["dur_us"] >= 0 and e["start_us"] >= 0):
                raise ValueError(f"{path}: run {label!r} has an event with a negative start or duration: {e!r}")
    return data


def lanes(runs: dict[str, list[dict]]) -> list[tuple[str, object, list[dict]]]:
    """(run label, stream, events) for every stream of every run: runs in their order in the file, streams in
    the order of their first event."""
    out = []
    for label, events in runs.items():
        order: dict[object, list[dict]] = {}
        for e in sorted(events, key=lambda e: e["start_us"]):
            order.setdefault(e["stream"], []).append(e)
        out += [(label, stream, evs) for stream, evs in order.items()]
    return out


__all__ = ["EVENT_KEYS", "KINDS", "lanes", "load_timeline"]
