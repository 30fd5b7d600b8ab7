"""scripts/capture_nsys.sh and scripts/nsys_streams.py without a GPU: the trace CSV of either Nsight Systems report
(`cuda_gpu_trace` since 2023, `gputrace` in Debian 12's 2022.4, the one scripts/nsys_bundle.sh packs) becomes the
per-stream summary, and the capture script asks nsys for the report its version has (nsys replaced by a stand-in
that writes a trace; the profiled program is not run)."""

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


STUB = r"""#!/usr/bin/env bash
# nsys as capture_nsys.sh calls it: --version, stats --help-reports (listing $STUB_REPORT), profile (writes the
# --output .nsys-rep), stats --report NAME (the trace, for the listed report only)
echo "nsys $*" >> "$STUB_LOG"
case "$1" in
  --version) echo "NVIDIA Nsight Systems version 2022.4.2.1-stub" ;;
  profile) while [ $# -gt 0 ]; do [ "$1" = --output ] && touch "$2.nsys-rep"; shift; done ;;
  stats)
    if [ "$2" = --help-reports ]; then echo "The following built-in reports are available:"; echo
      echo "  $STUB_REPORT -- CUDA GPU Trace"; exit 0; fi
    [ "$3" = "$STUB_REPORT" ] || { echo "ERROR: Report '$3' could not be found." >&2; exit 1; }
    cat "$STUB_TRACE" ;;
esac
"""


@pytest.mark.parametrize("report", ["gputrace", "cuda_gpu_trace"])
def test_capture_asks_for_the_report_its_nsys_has(tmp_path, report):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nsys").write_text(STUB)
    (bin_dir / "nsys").chmod(stat.S_IRWXU)
    (tmp_path / "trace.csv").write_text(TRACE)
    log = tmp_path / "calls.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_LOG": str(log), "STUB_REPORT": report,
           "STUB_TRACE": str(tmp_path / "trace.csv"), "PYTHON": sys.executable,
           "KM_COMMIT": "0123456789abcdef0123456789abcdef01234567", "KM_DIRTY": "0"}
    proc = subprocess.run(["bash", "scripts/capture_nsys.sh", str(tmp_path / "out")], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (tmp_path / "out" / "nsys_stream_overlap.txt").read_text()
    assert text.startswith("NVIDIA Nsight Systems version 2022.4.2.1-stub")
    assert text.count("stream_overlap v0: 4 GPU operations") == 1 and "stream_overlap v3: 4 GPU operations" in text
    assert f"nsys stats --report {report} --format csv v3.nsys-rep" in text
    assert (tmp_path / "out" / "nsys_stream_overlap.meta.json").is_file()
    calls = log.read_text()
    assert calls.count(f"stats --report {report} ") == 2
