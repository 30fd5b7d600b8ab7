"""The timeline renderer: one SVG figure per captured trace, lanes per (run, stream), a clear message when nothing
is captured, and refusals for bad names and malformed files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from snippets.bench.timeline import lanes, load_timeline
from snippets.site import render_page
from snippets.site.timeline import render_timeline


def _event(kind: str, stream: int, start: float, dur: float, name: str | None = None) -> dict:
    names = {"h2d": "Memcpy HtoD (Pinned -> Device)", "kernel": "_fma_chain_kernel",
             "d2h": "Memcpy DtoH (Device -> Pinned)"}
    return {"name": name or names[kind], "kind": kind, "stream": stream, "start_us": start, "dur_us": dur}


def _trace(gpu: str = "NVIDIA Test GPU", scale: float = 1000.0) -> dict:
    serial = [_event("h2d", 7, 0, 5 * scale), _event("kernel", 7, 5 * scale, 5 * scale),
              _event("d2h", 7, 10 * scale, 5 * scale)]
    four = []
    for k in range(8):
        s = 13 + k % 4
        four += [_event("h2d", s, k * scale, scale), _event("kernel", s, (k + 1) * scale, scale),
                 _event("d2h", s, (k + 2) * scale, scale)]
    return {"gpu": gpu, "torch": "2.11.0", "captured": "2030-01-02T03:04:05+00:00", "copy_engines": 3,
            "runs": {"serial": serial, "4 streams": four}}


def _write(root: Path, slug: str, data: dict, name: str = "stream_overlap") -> Path:
    path = root / "outputs" / slug / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_one_figure_with_a_lane_per_run_and_stream(tmp_path):
    _write(tmp_path, "nvidia-test-gpu", _trace())
    html = render_timeline("stream_overlap", tmp_path)
    assert html.count("<figure") == 1 and html.count("<svg") == 1 and "</figcaption>" in html
    labels = re.findall(r"(serial|4 streams): stream (\d+)", html)
    assert sorted(set(labels)) == [("4 streams", "13"), ("4 streams", "14"), ("4 streams", "15"),
                                   ("4 streams", "16"), ("serial", "7")]
    assert "stream 8" not in html and "stream 12" not in html, "no lane for a stream without events"
    for legend in ("host to device copy", "kernel", "device to host copy"):
        assert legend in html
    assert "(ms)" in html, "a 15 ms trace is drawn in milliseconds"
    caption = html[html.index("<figcaption>"):]
    assert "NVIDIA Test GPU" in caption and "3 copy engines" in caption and "2030-01-02" in caption
    assert "outputs/nvidia-test-gpu/stream_overlap.json" in caption
    assert "serial: 15.00 ms" in caption and "4 streams: 10.00 ms" in caption
    assert "\n\n" not in html[html.index("<svg"):html.index("</svg>")], "no blank line inside raw HTML"


def test_short_traces_in_microseconds(tmp_path):
    _write(tmp_path, "gpu-a", _trace(scale=10.0))
    html = render_timeline("stream_overlap", tmp_path)
    assert "(µs)" in html and "(ms)" not in html


def test_one_figure_per_gpu_in_order(tmp_path):
    _write(tmp_path, "gpu-b", _trace("GPU B"))
    _write(tmp_path, "gpu-a", _trace("GPU A"))
    _write(tmp_path, "gpu-a", _trace("other"), name="another_trace")
    html = render_timeline("stream_overlap", tmp_path)
    assert html.count("<figure") == 2
    assert html.index("GPU A") < html.index("GPU B") and "other" not in html


def test_missing_capture_says_so(tmp_path):
    out = render_timeline("stream_overlap", tmp_path)
    assert "Not captured yet" in out and "stream_overlap" in out and "<svg" not in out
    _write(tmp_path, "gpu-a", _trace(), name="something_else")
    assert "Not captured yet" in render_timeline("stream_overlap", tmp_path)


@pytest.mark.parametrize("name", ["", "../secrets", "a b", "x.json", "*", "a/b"])
def test_bad_names_are_refused(tmp_path, name):
    with pytest.raises(ValueError, match="plain file stem"):
        render_timeline(name, tmp_path)


@pytest.mark.parametrize("change, words", [
    (lambda d: d.pop("runs"), "runs"),
    (lambda d: d.update(runs={}), "runs"),
    (lambda d: d["runs"].update(serial="not a list"), "list of events"),
    (lambda d: d["runs"]["serial"][0].pop("stream"), "stream"),
    (lambda d: d["runs"]["serial"][0].update(kind="memset"), "kind"),
    (lambda d: d["runs"]["serial"][0].update(dur_us=-1.0), "negative"),
])
def test_malformed_files_are_refused(tmp_path, change, words):
    data = _trace()
    change(data)
    _write(tmp_path, "gpu-a", data)
    with pytest.raises(ValueError, match=words):
        render_timeline("stream_overlap", tmp_path)


def test_lanes_follow_file_order_then_first_event():
    runs = {"b": [_event("kernel", 5, 10, 1), _event("h2d", 9, 0, 1), _event("d2h", 5, 11, 1)],
            "a": [_event("kernel", 1, 0, 1)]}
    got = [(label, stream, [e["kind"] for e in evs]) for label, stream, evs in lanes(runs)]
    assert got == [("b", 9, ["h2d"]), ("b", 5, ["kernel", "d2h"]), ("a", 1, ["kernel"])]


def test_load_timeline_returns_the_data(tmp_path):
    path = _write(tmp_path, "gpu-a", _trace())
    assert load_timeline(path)["runs"]["serial"][1]["kind"] == "kernel"


def test_page_directive_renders_the_timeline(tmp_path):
    _write(tmp_path, "gpu-a", _trace())
    page = render_page("# Title\n\n<!-- bench:timeline stream_overlap -->\n", "part3/streams.md", tmp_path)
    assert "<svg" in page and "<!-- bench:" not in page
    missing = render_page("<!-- bench:timeline no_such_trace -->\n", "x.md", tmp_path)
    assert "Not captured yet" in missing
