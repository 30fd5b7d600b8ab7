"""scripts/capture_nsys.sh and scripts/nsys_streams.py without a GPU: the trace CSV of either Nsight Systems report
(`cuda_gpu_trace` since 2023, `gputrace` in Debian 12's 2022.4, the one scripts/nsys_bundle.sh packs) becomes the
per-stream summary, the capstone's per-step summary reads the CUDA API summary too, and the capture script asks
nsys for the reports its version has (nsys replaced by a stand-in that writes a trace; the profiled programs are
not run)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import load_script

REPO_ROOT = Path(__file__).resolve().parent.parent
ns = load_script("nsys_streams")
nc = load_script("nsys_capstone")

# two streams: a copy in, a kernel and a copy out on stream 13, a kernel on stream 14 overlapping the first kernel
TRACE = """Generating SQLite file t.sqlite from t.nsys-rep
Processing [t.sqlite] with [reports/gputrace.py]...
"Start (ns)","Duration (ns)","CorrId","GrdX","GrdY","GrdZ","BlkX","BlkY","BlkZ","Reg/Trd","StcSMem (MB)",\
"DymSMem (MB)","Bytes (MB)","Throughput (MBps)","SrcMemKd","DstMemKd","Device","Ctx","Strm","Name"
1000,500,1,,,,,,,,,,4.194,8388.608,Pageable,Device,NVIDIA H100 80GB HBM3 (0),1,13,"[CUDA memcpy HtoD]"
1500,1000,2,128,1,1,256,1,1,16,0.000,0.000,,,,,NVIDIA H100 80GB HBM3 (0),1,13,"fma_kernel"
2000,1000,3,128,1,1,256,1,1,16,0.000,0.000,,,,,NVIDIA H100 80GB HBM3 (0),1,14,"fma_kernel"
2500,500,4,,,,,,,,,,4.194,8388.608,Device,Pageable,NVIDIA H100 80GB HBM3 (0),1,13,"[CUDA memcpy DtoH]"
"""


def test_the_trace_becomes_streams_and_overlap():
    ops = ns.parse_trace(TRACE)
    assert [o["kind"] for o in ops] == ["HtoD", "kernel", "kernel", "DtoH"]
    assert ns.in_flight(ops) == {1: 1000.0, 2: 1000.0}  # 1000-1500 and 2500-3000 alone, 1500-2500 two at once
    text = ns.summary("v3", TRACE, "nsys ...")
    assert "stream_overlap v3: 4 GPU operations, first start to last end 0.002 ms" in text
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.strip()[:2] in ("13", "14")}
    assert rows["13"][:4] == ["1", "1", "1", "0"] and rows["14"][:4] == ["0", "1", "0", "0"]


def test_a_trace_without_gpu_operations_says_so():
    assert "(no GPU operation in the trace)" in ns.summary("v0", "SKIPPED: t.sqlite does not contain GPU trace data.",
                                                           "nsys ...")


API = """Processing [t.sqlite] with [reports/cudaapisum.py]...
"Time (%)","Total Time (ns)","Num Calls","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"
80.0,6000,3,2000.0,2000.0,1900,2100,100.0,"cudaLaunchKernel_v7000"
20.0,1500,3,500.0,500.0,400,600,100.0,"cudaMemcpyAsync_v3020"
"""

STUB = r"""#!/usr/bin/env bash
# nsys as capture_nsys.sh calls it: --version, stats --help-reports (listing $STUB_TRACE_REPORT and
# $STUB_API_REPORT), profile (writes the --output .nsys-rep), stats --report NAME (the GPU trace or the API
# summary, for the listed names only)
echo "nsys $*" >> "$STUB_LOG"
case "$1" in
  --version) echo "NVIDIA Nsight Systems version 2022.4.2.1-stub" ;;
  profile) while [ $# -gt 0 ]; do [ "$1" = --output ] && touch "$2.nsys-rep"; shift; done ;;
  stats)
    if [ "$2" = --help-reports ]; then echo "The following built-in reports are available:"; echo
      echo "  $STUB_TRACE_REPORT -- CUDA GPU Trace"; echo "  $STUB_API_REPORT -- CUDA API Summary"; exit 0; fi
    case "$3" in
      "$STUB_TRACE_REPORT") cat "$STUB_TRACE" ;;
      "$STUB_API_REPORT") cat "$STUB_API" ;;
      *) echo "ERROR: Report '$3' could not be found." >&2; exit 1 ;;
    esac ;;
esac
"""


def _capture(tmp_path: Path, targets: str, old: bool) -> tuple[Path, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nsys").write_text(STUB)
    (bin_dir / "nsys").chmod(stat.S_IRWXU)
    (tmp_path / "trace.csv").write_text(TRACE)
    (tmp_path / "api.csv").write_text(API)
    log = tmp_path / "calls.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_LOG": str(log),
           "STUB_TRACE_REPORT": "gputrace" if old else "cuda_gpu_trace",
           "STUB_API_REPORT": "cudaapisum" if old else "cuda_api_sum",
           "STUB_TRACE": str(tmp_path / "trace.csv"), "STUB_API": str(tmp_path / "api.csv"),
           "PYTHON": sys.executable, "KM_NSYS_TARGETS": targets,
           "KM_COMMIT": "0123456789abcdef0123456789abcdef01234567", "KM_DIRTY": "0"}
    proc = subprocess.run(["bash", "scripts/capture_nsys.sh", str(tmp_path / "out")], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp_path / "out", log.read_text()


@pytest.mark.parametrize("old", [True, False], ids=["2022", "2023+"])
def test_capture_asks_for_the_reports_its_nsys_has(tmp_path, old):
    report = "gputrace" if old else "cuda_gpu_trace"
    out, calls = _capture(tmp_path, "streams", old)
    text = (out / "nsys_stream_overlap.txt").read_text()
    assert text.startswith("NVIDIA Nsight Systems version 2022.4.2.1-stub")
    assert text.count("stream_overlap v0: 4 GPU operations") == 1 and "stream_overlap v3: 4 GPU operations" in text
    assert f"nsys stats --report {report} --format csv v3.nsys-rep" in text
    assert (out / "nsys_stream_overlap.meta.json").is_file()
    assert not (out / "nsys_capstone_decode.txt").exists(), "KM_NSYS_TARGETS=streams captures the streams only"
    assert calls.count(f"stats --report {report} ") == 2
    assert "cudaapisum" not in calls and "cuda_api_sum " not in calls, "the streams summary reads no API summary"


def test_capture_of_the_capstone_step(tmp_path):
    out, calls = _capture(tmp_path, "capstone", True)
    text = (out / "nsys_capstone_decode.txt").read_text()
    assert "--cuda-graph-trace=node" in text and "nsys_capstone.py --run v3" in text
    # the trace above read as 3 steps: 4 operations in a 2 us span, 3 us of them busy (two overlap)
    assert "capstone_decode v2, per step (the mean of 3 steps): 1 GPU operations\nGPU busy 1.0 us of a 0.7 us span" in text
    assert "cudaLaunchKernel 1 calls 2.0 us, cudaMemcpyAsync 1 calls 0.5 us" in text
    assert (out / "nsys_capstone_decode.meta.json").is_file()
    assert "profile --trace=cuda --cuda-graph-trace=node" in calls


def test_the_api_summary_of_either_version():
    api = nc.parse_api(API)
    assert api == {"cudaLaunchKernel": (3, 6000.0), "cudaMemcpyAsync": (3, 1500.0)}
    assert nc.parse_api("SKIPPED: t.sqlite does not contain CUDA trace data.") == {}


def test_the_capstone_step_is_found():
    """The script profiles capstone_decode, which Part 8 registers: the bare registry does not hold it."""
    assert {"v2", "v3"} <= set(nc.get_op("capstone_decode").impls)


def test_an_empty_capstone_trace_is_a_failed_analysis(tmp_path, capsys):
    """A decode step always runs kernels: a trace with none (an nsys too old for the driver gives one) says so and
    exits 1, and the text lacks the line capture_nsys.sh records on ("GPU operations")."""
    empty = tmp_path / "t.csv"
    empty.write_text("SKIPPED: t.sqlite does not contain GPU trace data.\n")
    assert nc.main(["--summary", "v2", str(empty), str(empty), "nsys ..."]) == 1
    out = capsys.readouterr().out
    assert "nsys recorded nothing it could analyse" in out and "GPU operations" not in out
    (tmp_path / "trace.csv").write_text(TRACE)
    (tmp_path / "api.csv").write_text(API)
    assert nc.main(["--summary", "v2", str(tmp_path / "trace.csv"), str(tmp_path / "api.csv"), "nsys ..."]) == 0
