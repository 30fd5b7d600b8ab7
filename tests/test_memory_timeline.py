"""scripts/capture_memory_timeline.py reads the caching allocator's trace with plain Python: the
replay of alloc and free events into allocated bytes, the phase markers, the sparkline and its
ruler, and the tables. These run on a CPU, on synthetic traces in the snapshot's format (the
events of ``torch.cuda.memory._snapshot()["device_traces"]``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import load_script

from snippets.bench import captures
from snippets.registry import REPO_ROOT

tl = load_script("capture_memory_timeline")
MIB = 2**20


def ev(action: str, addr: int | None, size: int, **extra) -> dict:
    e = {"action": action, "size": size, "stream": 0, "frames": [], **extra}
    if addr is not None:
        e["addr"] = addr
    return e


def levels(line: str) -> list[int]:
    return [tl.BARS.index(c) for c in line]


# ------------------------------------------------------------------------------ replay

def test_replay_counts_each_free_once_and_frees_from_before_recording():
    events = [
        ev("alloc", 0x1000, 300),                 # A
        ev("alloc", 0x2000, 500),                 # B
        ev("segment_alloc", 0x9000, 2 * MIB),     # reserved grows: allocated does not
        ev("free_requested", 0x1000, 300),        # A freed: off the total now...
        ev("free_completed", 0x1000, 300),        # ...not a second time
        ev("free_requested", 0x500, 200),         # a block allocated before recording began
        ev("free_completed", 0x500, 200),
        ev("free_completed", 0x600, 64),          # its request came before recording: no change
        ev("alloc", 0x1000, 100),                 # A's address handed out again
        ev("free_completed", 0x1000, 100),        # its request was not recorded: counts here
        {"action": "oom", "size": 10, "device_free": 5, "stream": 0, "frames": []},
        ev("snapshot", 0, 0),
    ]
    rep = tl.replay(events, start=1000)
    assert rep.series == [1300, 1800, 1800, 1500, 1500, 1300, 1300, 1300, 1400, 1300, 1300, 1300]
    assert (rep.untracked_frees, rep.untracked_bytes) == (1, 200)


def test_replay_starts_from_what_was_allocated_and_tolerates_no_time():
    events = [ev("alloc", 1, 64), ev("free_requested", 1, 64)]
    assert tl.replay(events).series == [64, 0]
    assert tl.replay(events, start=4096).series == [4160, 4096]
    assert tl.replay([]).series == []


# ------------------------------------------------------------------------------ markers

def test_split_finds_the_markers_in_order_and_drops_them_with_their_frees():
    base = tl.MARK_BASE
    events = [
        ev("alloc", 0x10, base + 1, time_us=5),    # marker 1's size before marker 0: a tensor
        ev("alloc", 0x20, base, time_us=10),       # marker 0
        ev("free_requested", 0x20, base, time_us=11),
        ev("free_completed", 0x20, base, time_us=11),
        ev("alloc", 0x30, 256, time_us=12),
        ev("alloc", 0x20, 128, time_us=13),        # a tensor at the marker's old address
        ev("alloc", 0x40, base + 1, time_us=30),   # marker 1
        ev("free_requested", 0x40, base + 1, time_us=31),
        ev("free_completed", 0x40, base + 1, time_us=31),
        ev("free_requested", 0x20, 128, time_us=32),  # the tensor's free is kept
    ]
    split = tl.split_at_markers(events, 2)
    kept = [(e["action"], e["addr"], e["size"]) for e in split.events]
    assert kept == [("alloc", 0x10, base + 1), ("alloc", 0x30, 256), ("alloc", 0x20, 128),
                    ("free_requested", 0x20, 128)]
    assert split.bounds == [1, 3]
    assert split.times == [10, 30]
    assert tl.durations_ms(split.times) == [pytest.approx(0.02)]


def test_split_without_time_us_and_with_a_missing_marker():
    base = tl.MARK_BASE
    events = [ev("alloc", 1, base), ev("free_requested", 1, base), ev("alloc", 2, 64),
              ev("alloc", 3, base + 1)]
    split = tl.split_at_markers(events, 2)
    assert split.times == [None, None]
    assert tl.durations_ms(split.times) == [None]
    with pytest.raises(ValueError, match="2 of the 3 phase markers"):
        tl.split_at_markers(events, 3)


def test_the_replay_of_a_split_trace_meets_the_counters_at_every_boundary():
    """A fake step: what the script does with a real trace. At each boundary the counter is
    sampled, then the marker is allocated and freed; the replay must agree with every sample."""
    base = tl.MARK_BASE
    script = [[("alloc", 1, 700), ("alloc", 2, 300)],    # forward
              [("free", 1), ("alloc", 3, 400)],           # backward
              [("alloc", 4, 900), ("free", 4)],           # optimizer step
              [("free", 3), ("free", 99)]]                # zero_grad; 99: from before recording
    live = {99: 50}                                       # allocated when recording began
    allocated = 10_000 + 50
    events, sampled = [], []
    for k in range(len(script) + 1):
        sampled.append(allocated)                         # memory_allocated(), then the marker
        events += [ev("alloc", 1000 + k, base + k), ev("free_requested", 1000 + k, base + k),
                   ev("free_completed", 1000 + k, base + k)]
        for op in script[k] if k < len(script) else []:
            if op[0] == "alloc":
                live[op[1]] = op[2]
                allocated += op[2]
                events.append(ev("alloc", op[1], op[2]))
            else:
                size = live.pop(op[1])
                allocated -= size
                events += [ev("free_requested", op[1], size), ev("free_completed", op[1], size)]
    split = tl.split_at_markers(events, len(script) + 1)
    rep = tl.replay(split.events, start=sampled[0])
    assert tl.replay_gaps(rep.series, split.bounds, sampled[0], sampled) == [0] * 5
    assert sampled == [10_050, 11_050, 10_750, 10_750, 10_300]  # the fake is what it says
    assert (rep.untracked_frees, rep.untracked_bytes) == (1, 50)
    summary = tl.phase_summary(split.events, split.bounds)
    assert [d["allocs"] for d in summary] == [2, 1, 1, 0]
    assert [d["frees"] for d in summary] == [0, 1, 1, 2]
    assert summary[1]["alloc_bytes"] == 400 and summary[3]["free_bytes"] == 400 + 50


# ------------------------------------------------------------------------------ sparkline

def test_sparkline_of_a_monotone_series_is_monotone_from_bottom_to_top():
    line = tl.sparkline(list(range(1000)), width=60)
    assert len(line) == 60
    lv = levels(line)
    assert lv == sorted(lv)
    assert lv[0] == 0 and lv[-1] == len(tl.BARS) - 1
    assert len(set(lv)) == len(tl.BARS)  # every level is used on a ramp


def test_sparkline_maps_the_maximum_to_the_top_and_keeps_a_short_peak():
    assert tl.sparkline([1, 5, 3]) == "▂█▅"                # fewer values than columns: one each
    spike = [0] * 1000
    spike[537] = 10
    line = tl.sparkline(spike, width=50)
    assert len(line) == 50 and line.count("█") == 1 and line.count("▁") == 49  # max, not mean
    assert line.index("█") == 537 * 50 // 1000
    assert tl.sparkline([2], hi=8) == "▃"                  # an explicit top
    assert tl.sparkline([160, 200], lo=100) == "▅█"        # and bottom


def test_sparkline_of_zeros_and_of_nothing():
    assert tl.sparkline([0, 0, 0]) == "▁▁▁"
    assert tl.sparkline([0] * 500, width=40) == "▁" * 40
    assert tl.sparkline([]) == ""


def test_columns_cover_every_value_once():
    for n, width in ((7, 60), (60, 60), (61, 60), (1000, 60), (12345, 37)):
        spans = tl.columns(n, width)
        assert len(spans) == min(n, width)
        assert spans[0][0] == 0 and spans[-1][1] == n
        assert all(s < e for s, e in spans)
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_ruler_labels_each_column_with_its_phase():
    assert tl.ruler(10, [0, 3, 7, 9, 10], "FBOZ") == "FFFBBBBOOZ"
    assert tl.ruler(10, [0, 3, 7, 9, 10], "FBOZ", width=5) == "FFBBO"
    assert tl.ruler(6, [2, 4, 5], "FBOZ") == "  FFB "  # before the first bound, after the last
    # a column straddling the forward and the backward is labelled where its bar's peak is
    peak_in_b = [1, 2, 9, 3, 4, 5]                  # two columns of three; the first peaks at 2
    assert tl.ruler(6, [0, 2, 4, 6], "FBO", width=2) == "FB"
    assert tl.ruler(6, [0, 2, 4, 6], "FBO", width=2, values=peak_in_b) == "BO"


# ------------------------------------------------------------------------------ tables

SAMPLES = [tl.Sample(100 * MIB, 120 * MIB, 100 * MIB, 120 * MIB),     # step start
           tl.Sample(150 * MIB, 200 * MIB, 180 * MIB, 200 * MIB),     # after forward
           tl.Sample(130 * MIB, 200 * MIB, 190 * MIB, 220 * MIB),     # after backward
           tl.Sample(131 * MIB, 220 * MIB, 160 * MIB, 220 * MIB),     # after optimizer step
           tl.Sample(100 * MIB, 220 * MIB, 131 * MIB, 220 * MIB)]     # after zero_grad


def test_timeline_rows_measure_peaks_from_the_phase_start_and_ends_from_the_last_boundary():
    rows = tl.timeline_rows(SAMPLES)
    assert [r[0] for r in rows] == ["step start", "peak in forward", "after forward",
                                    "peak in backward", "after backward",
                                    "peak in optimizer step", "after optimizer step",
                                    "peak in zero_grad", "after zero_grad"]
    change = {r[0]: r[3] for r in rows}
    assert change["step start"] is None
    assert change["peak in forward"] == 80 * MIB       # 180 - 100
    assert change["after forward"] == 50 * MIB
    assert change["peak in backward"] == 40 * MIB      # 190 - 150, not 190 - 180
    assert change["after backward"] == -20 * MIB
    assert change["after zero_grad"] == -31 * MIB
    assert rows[3][1:3] == (190 * MIB, 220 * MIB)      # a peak row shows the peaks
    assert all(r[4] for r in rows), "every row has a note (NOTES' keys match the points)"
    with pytest.raises(ValueError):
        tl.timeline_rows(SAMPLES[:4])


def test_format_table_prints_mib_aligned_within_the_page():
    lines = tl.format_table(tl.timeline_rows(SAMPLES))
    assert len(lines) == 1 + 9
    assert "allocated MiB" in lines[0] and "reserved MiB" in lines[0]
    assert all(len(line) <= 100 for line in lines)
    end = lines[0].index("allocated MiB") + len("allocated MiB")
    fwd = next(line for line in lines if line.strip().startswith("peak in forward"))
    assert fwd[:end].split()[-1] == "180"              # allocated column, in MiB
    assert fwd.split()[4:6] == ["200", "+80"]          # reserved, change with its sign
    zero = next(line for line in lines if line.strip().startswith("after zero_grad"))
    assert "-31" in zero.split()
    start = next(line for line in lines if line.strip().startswith("step start"))
    assert start.split()[2:4] == ["100", "120"]
    c_end = lines[0].index("change MiB") + len("change MiB")
    assert start[c_end - 11:c_end].strip() == ""       # no change on the first row
    assert fwd[c_end - 11:c_end].strip() == "+80"      # the change column lines up


def test_format_phases_and_a_trace_without_times():
    summary = tl.phase_summary(
        [ev("alloc", 1, 3 * MIB), ev("segment_alloc", 9, 20 * MIB), ev("segment_map", 8, MIB),
         ev("free_requested", 1, 3 * MIB), ev("segment_free", 9, 20 * MIB)], [0, 3, 5])
    assert summary[0] == {"allocs": 1, "alloc_bytes": 3 * MIB, "frees": 0, "free_bytes": 0,
                          "new_segments": 2, "freed_segments": 0}
    assert summary[1]["freed_segments"] == 1 and summary[1]["free_bytes"] == 3 * MIB
    lines = tl.format_phases(("forward", "backward"), summary, [12.345, None])
    assert len(lines) == 3 and all(len(line) <= 100 for line in lines)
    assert lines[1].split() == ["forward", "1", "0", "3", "0", "2", "0", "12.3"]
    assert lines[2].split()[-1] == "-"


def test_segment_totals():
    segs = [{"total_size": 20 * MIB, "allocated_size": 3 * MIB, "blocks": []},
            {"total_size": 2 * MIB, "allocated_size": 0, "blocks": []}]
    assert tl.segment_totals(segs) == (2, 22 * MIB, 3 * MIB)
    assert tl.segment_totals([]) == (0, 0, 0)


def fake_step(n: int = 200, timed: bool = True) -> tl.Run:
    """A step as the script records it: activations in the forward, traded for gradients in the
    backward, temporaries in the optimizer step, the gradients freed by zero_grad; the counters
    sampled at each boundary before its marker."""
    base, clock = tl.MARK_BASE, [0]
    live = {1: 500 * MIB, 2: MIB}            # weights and state; block 2 dies in the forward
    events: list[dict] = []
    samples: list[tl.Sample] = []
    peak = [0]

    def emit(action, addr, size):
        clock[0] += 7
        events.append(ev(action, addr, size, **({"time_us": clock[0]} if timed else {})))

    def alloc(addr, size):
        live[addr] = size
        peak[0] = max(peak[0], sum(live.values()))
        emit("alloc", addr, size)

    def free(addr):
        size = live.pop(addr)
        emit("free_requested", addr, size)
        emit("free_completed", addr, size)

    def boundary():
        now = sum(live.values())
        samples.append(tl.Sample(now, 2048 * MIB, max(peak[0], now), 2048 * MIB))
        k = len(samples) - 1
        emit("alloc", 10**6 + k, base + k)
        emit("free_requested", 10**6 + k, base + k)
        emit("free_completed", 10**6 + k, base + k)
        peak[0] = now

    start = sum(live.values())
    boundary()
    free(2)
    for i in range(n):                        # forward: activations
        alloc(100 + i, 3 * MIB)
    boundary()
    emit("segment_alloc", 5, 20 * MIB)
    for i in reversed(range(n)):              # backward: activations out, gradients in
        if i % 2 == 0:
            alloc(10_000 + i, 2 * MIB)
        free(100 + i)
    boundary()
    for i in range(n // 4):                   # optimizer step: temporaries
        alloc(20_000 + i, MIB)
    for i in range(n // 4):
        free(20_000 + i)
    boundary()
    for i in range(0, n, 2):                  # zero_grad
        free(10_000 + i)
    boundary()
    emit("snapshot", 0, 0)
    return tl.Run("125m", 125_000_000, 500 * MIB, "4 x 1024", 1000 * MIB, 1000 * MIB, samples,
                  start, events, [{"total_size": 2048 * MIB, "allocated_size": 500 * MIB}],
                  2048 * MIB)


def test_the_report_fits_the_page_unfolded_and_its_replay_meets_the_counters():
    from snippets.site.tables import OUTPUT_FOLD_LINES

    run = fake_step()
    lines = tl.report(run)
    assert len(lines) + 1 <= OUTPUT_FOLD_LINES      # + the GPU line main() puts first
    assert all(len(line) <= 100 for line in lines), max(lines, key=len)
    spark = next(i for i, line in enumerate(lines) if set(line.strip()) <= set(tl.BARS)
                 and line.strip())
    bars, rule = lines[spark].strip(), lines[spark + 1].strip()
    assert len(bars) == 60 and len(rule) == 60
    assert "".join(dict.fromkeys(rule)) == "FBOZ"   # the phases in order, each visible
    top = max(range(60), key=lambda j: tl.BARS.index(bars[j]))
    assert rule[top] == "F" and bars[top] == "█"    # the peak: the end of this fake forward
    assert "largest gap 0.00 MiB" in "\n".join(lines)
    assert "frees of earlier blocks: 1" in "\n".join(lines)      # block 2
    assert "(steps 1 and 2 warmed up)" in "\n".join(lines)
    phase = next(line for line in lines if line.strip().startswith("backward"))
    assert phase.split()[5:7] == ["1", "0"]           # the segment it added
    assert phase.split()[-1] != "-"


def test_the_report_without_time_us():
    lines = tl.report(fake_step(timed=False))
    assert any("not in this torch" in line for line in lines)
    rows = [line.split() for line in lines if line.strip().startswith(("forward", "zero_grad"))]
    assert rows and all(r[-1] == "-" for r in rows)


# ------------------------------------------------------------------------------ the script itself

def test_the_capture_has_a_producer_and_the_script_refuses_a_machine_without_cuda(tmp_path):
    prod = captures.producer("memory_timeline")
    assert prod is not None and "scripts/capture_memory_timeline.py" in prod.scripts
    out = tmp_path / "memory_timeline.txt"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    script = REPO_ROOT / "scripts" / "capture_memory_timeline.py"
    proc = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode != 0 and "needs a CUDA GPU" in proc.stderr
    assert not out.exists()
