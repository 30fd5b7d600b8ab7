"""Profiling: torch.profiler on the book's kernels (CPU and GPU), the ncu CSV parser and its reports, the capture
script's plumbing, and the planted bugs that compute-sanitizer must find (and must not find once fixed)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import load_script

from snippets.bench import captures
from snippets.op_index import get_op
from snippets.part3 import profiling as pf

REPO_ROOT = Path(__file__).resolve().parents[1]
NVCC = shutil.which("nvcc")
SANITIZER = shutil.which("compute-sanitizer")
PLANTED = REPO_ROOT / "csrc" / "part3" / "planted_bugs.cu"
HAS_GPU = torch.cuda.is_available()


# ---------------------------------------------------------------- torch.profiler

@pytest.mark.op("reduce_sum")
@pytest.mark.op("scan")
@pytest.mark.op("sgemm")
def test_profile_workload_table_and_trace(device, tmp_path):
    trace = tmp_path / "trace.json"
    n, m = (4096, 64) if device == "cpu" else (2**20, 256)
    table = pf.profile_workload(device, trace, n=n, m=m, calls=2)
    labels = [label for label, _, _ in pf.workload_labels(device)]
    assert len(labels) >= 4
    for label in labels:  # every record_function range is a row, called once per round
        row = next((line for line in table.splitlines() if line.strip().startswith(label)), None)
        assert row is not None, f"{label} missing from:\n{table}"
        assert row.split()[-1] == "2", row  # the "# of Calls" column
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert set(labels) <= names
    if device == "cuda":  # the GPU kernels of the book's versions are in the trace
        assert {"reduce_v7", "scan_lookback_f32", "sgemm_v8"} <= names, sorted(n for n in names if n)[:50]


def test_profile_workload_refuses_bad_arguments():
    with pytest.raises(ValueError, match="device"):
        pf.profile_workload("tpu")
    with pytest.raises(ValueError, match="calls"):
        pf.profile_workload("cpu", calls=0)
    with pytest.raises(TypeError, match="n must be"):
        pf.profile_workload("cpu", n=4096.0)
    if not HAS_GPU:
        with pytest.raises(RuntimeError, match="no CUDA GPU"):
            pf.profile_workload("cuda")


def test_workload_uses_registered_versions_that_run_there():
    for device, ops in pf.WORKLOAD.items():
        for op_name, versions in ops.items():
            op = get_op(op_name)
            for v in versions:
                assert op.impls[v].runs_on(device), (device, op_name, v)


def test_write_torch_profile(tmp_path):
    if HAS_GPU:
        pytest.skip("the GPU variant is what the capture script runs; this checks the CPU one")
    path = pf.write_torch_profile(tmp_path / "out", trace_path=tmp_path / "out" / "trace.json")
    text = path.read_text()
    assert path.name == "torch_profiler.txt"
    assert "Top operators by self CPU time:" in text
    assert "scan v4 (Triton)" in text and "sgemm v10 (PyTorch)" in text
    top = text.split("Top operators by self CPU time:")[1].strip().splitlines()
    assert 1 <= len(top) <= 10
    assert all(re.match(r"\s*[\d,.]+ us\s+\d+ calls\s+\S", line) for line in top), top
    assert not any(pf.LABEL.search(line) for line in top)  # our ranges are not operators
    assert (tmp_path / "out" / "trace.json").stat().st_size > 1000


# ---------------------------------------------------------------- ncu CSV: the parser

# ncu --csv (details page, the default): one row per metric, sections named, thousands separators, n/a.
# Columns as NVIDIA's CLI prints them; the first lines are the profiler's and the program's own output.
DETAILS_CSV = """\
==PROF== Connected to process 4242 (/usr/bin/python3.12)
scan_v5: scan v5 (single pass, decoupled look-back) at n=268435456, float32: one warm-up call, then the profiled call
==PROF== Profiling "scan_lookback_f32" - 0: 0%....50%....100% - 12 passes
==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3.12","127.0.0.1","scan_lookback_f32","1","7","(256, 1, 1)","(65536, 1, 1)","0","9.0","GPU Speed Of Light Throughput","DRAM Frequency","Ghz","3.20"
"0","4242","python3.12","127.0.0.1","scan_lookback_f32","1","7","(256, 1, 1)","(65536, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Duration","ms","1.65"
"0","4242","python3.12","127.0.0.1","scan_lookback_f32","1","7","(256, 1, 1)","(65536, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes.sum.per_second","Tbyte/second","1.31"
"0","4242","python3.12","127.0.0.1","scan_lookback_f32","1","7","(256, 1, 1)","(65536, 1, 1)","0","9.0","Command line profiler metrics","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","27.43"
"0","4242","python3.12","127.0.0.1","scan_lookback_f32","1","7","(256, 1, 1)","(65536, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","1,653.22"
"0","4242","python3.12","127.0.0.1","scan_lookback_f32","1","7","(256, 1, 1)","(65536, 1, 1)","0","9.0","Command line profiler metrics","launch__registers_per_thread","register/thread","40"
"0","4242","python3.12","127.0.0.1","scan_lookback_f32","1","7","(256, 1, 1)","(65536, 1, 1)","0","9.0","Command line profiler metrics","sm__warps_active.avg.pct_of_peak_sustained_active","%","61.20"
"0","4242","python3.12","127.0.0.1","scan_lookback_f32","1","7","(256, 1, 1)","(65536, 1, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","","52.30"
"0","4242","python3.12","127.0.0.1","scan_lookback_f32","1","7","(256, 1, 1)","(65536, 1, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","","30.20"
"0","4242","python3.12","127.0.0.1","scan_lookback_f32","1","7","(256, 1, 1)","(65536, 1, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_selected_per_issue_active.ratio","","1.00"
"0","4242","python3.12","127.0.0.1","scan_lookback_f32","1","7","(256, 1, 1)","(65536, 1, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio","","n/a"
"1","4242","python3.12","127.0.0.1","void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(cutlass_80_simt_sgemm_256x128_8x4_nn_align1::Params)","1","7","(256, 1, 1)","(16, 32, 1)","0","9.0","Command line profiler metrics","dram__bytes.sum.per_second","Gbyte/second","212.50"
"1","4242","python3.12","127.0.0.1","void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(cutlass_80_simt_sgemm_256x128_8x4_nn_align1::Params)","1","7","(256, 1, 1)","(16, 32, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","msecond","2.68"
"""

# ncu --csv --page raw --print-units base: one row per kernel, a column per metric, the units in the second row.
RAW_CSV = """\
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__bytes.sum.per_second","dram__throughput.avg.pct_of_peak_sustained_elapsed","gpu__time_duration.sum","launch__registers_per_thread","sm__warps_active.avg.pct_of_peak_sustained_active","smsp__average_warp_latency_per_inst_issued.ratio","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_selected_per_issue_active.ratio","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"
"","","","","","","","","","","","byte/second","%","nsecond","register/thread","%","cycle","","","",""
"0","4242","python3.12","127.0.0.1","reduce_tiles_f32","1","7","(256, 1, 1)","(65536, 1, 1)","0","9.0","4,102,345,678,901","93.10","262,144","32","88.50","21.0","0.80","17.50","1.00","1.20"
"1","4242","python3.12","127.0.0.1","scan_sums_f32","1","7","(1024, 1, 1)","(1, 1, 1)","0","9.0","3,210,000,000","0.20","9,500","40","1.50","35.0","12.00","18.00","1.00","2.00"
"2","4242","python3.12","127.0.0.1","scan_tiles_rts_f32","1","7","(256, 1, 1)","(65536, 1, 1)","0","9.0","3,950,000,000,000","89.70","545,000","48","60.10","24.5","3.10","15.20","1.00","4.40"
"""


def test_parse_details_csv():
    kernels = pf.parse_ncu_csv(DETAILS_CSV)
    assert [k["id"] for k in kernels] == ["0", "1"]
    k = kernels[0]
    assert k["kernel"] == "scan_lookback_f32" and k["block"] == "(256, 1, 1)" and k["grid"] == "(65536, 1, 1)"
    m = k["metrics"]
    assert m["gpu__time_duration.sum"] == (1653.22, "usecond")  # thousands separator removed
    assert m["dram__bytes.sum.per_second"] == (1.31, "Tbyte/second")
    assert m["Duration"] == (1.65, "ms")  # a section's metric keeps its display name
    assert m["smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio"][0] is None  # n/a
    assert len(m) == 11
    assert kernels[1]["kernel"].startswith("void cutlass::Kernel2<")


def test_parse_raw_csv():
    kernels = pf.parse_ncu_csv(RAW_CSV)
    assert [k["kernel"] for k in kernels] == ["reduce_tiles_f32", "scan_sums_f32", "scan_tiles_rts_f32"]
    m = kernels[0]["metrics"]
    assert m["dram__bytes.sum.per_second"] == (4102345678901.0, "byte/second")
    assert m["gpu__time_duration.sum"] == (262144.0, "nsecond")
    assert "Kernel Name" not in m and "CC" not in m  # identity columns are not metrics
    assert kernels[1]["block"] == "(1024, 1, 1)"


def test_parse_without_a_table():
    assert pf.parse_ncu_csv("==PROF== Connected to process 1\n==WARNING== No kernels were profiled.\n") == []


def test_units_to_base():
    assert pf.in_base_units(1.31, "Tbyte/second") == pytest.approx(1.31e12)
    assert pf.in_base_units(212.5, "Gbyte/second") == pytest.approx(212.5e9)
    assert pf.in_base_units(5.0, "byte/second") == 5.0
    assert pf.in_base_units(1653.22, "usecond") == pytest.approx(1.65322e-3)
    assert pf.in_base_units(262144, "nsecond") == pytest.approx(2.62144e-4)
    assert pf.in_base_units(27.43, "%") == 27.43
    assert pf.in_base_units(None, "%") is None


def test_stalls_largest_first():
    reasons = pf.stalls(pf.parse_ncu_csv(DETAILS_CSV)[0]["metrics"])
    assert reasons == [("barrier", 52.3), ("long_scoreboard", 30.2), ("selected", 1.0)]  # n/a dropped


def test_short_name():
    long = ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>"
            "(cutlass_80_simt_sgemm_256x128_8x4_nn_align1::Params)")
    assert pf.short_name(long, 200) == "cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>"
    assert pf.short_name(long, 20) == "cutlass::Kernel2<..."
    assert pf.short_name("scan_lookback_f32") == "scan_lookback_f32"


def test_summary_table():
    text = pf.ncu_summary([("scan_v5", pf.parse_ncu_csv(DETAILS_CSV)), ("scan_v3", pf.parse_ncu_csv(RAW_CSV))])
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["target", "kernel", "time"]
    assert len(lines) == 2 + 5  # header, rule, 2 + 3 kernels
    v5 = lines[2]
    assert v5.startswith("scan_v5") and "scan_lookback_f32" in v5
    assert "1,653.2" in v5          # us
    assert " 1,310 " in v5          # 1.31 Tbyte/s in GB/s
    assert "27.4" in v5 and "61.2" in v5 and " 40 " in v5
    assert "barrier 52.3, long_scoreboard 30.2" in v5 and "selected" not in v5
    sums = next(line for line in lines if "scan_sums_f32" in line)
    assert "9.5" in sums and " 3 " in sums  # 9,500 ns; 3.21 GB/s
    assert "long_scoreboard 18.0, barrier 12.0, wait 2.0" in sums
    gemm = lines[3]
    assert "2,680.0" in gemm and " 212 " in gemm and gemm.rstrip().endswith("-")  # no stalls collected
    assert all(line == line.rstrip() for line in lines)


def test_trim_ncu_text():
    details = ("==PROF== Connected to process 1\n==WARNING== Note: Running with unmodified GPU clocks.\n"
               "  k (1, 1, 1)x(32, 1, 1)\n    Warning: Data collection happened without fixed GPU frequencies. "
               "Profiling results may be inconsistent.\n    Section: GPU Speed Of Light Throughput\n\n\n\n"
               "    Duration  us  1.00\n")
    out = pf.trim_ncu_text(details)
    assert "==PROF==" not in out and "==WARNING==" not in out and "fixed GPU frequencies" not in out
    assert "Section: GPU Speed Of Light Throughput\n\n    Duration" in out  # runs of blank lines -> one
    long = "x" * 100 + "\n"
    cut = pf.trim_ncu_text(long * 1000, limit=5000)
    assert len(cut) < 5100 and "more characters trimmed" in cut


def test_ncu_text_report():
    details = "==PROF== Connected\n  scan_lookback_f32 (65536, 1, 1)x(256, 1, 1)\n    Section: Occupancy\n"
    text = pf.ncu_text("scan_v5", details, DETAILS_CSV, "ncu --section WarpStateStats python -m x --kernel scan_v5")
    lines = text.splitlines()
    assert lines[0].startswith("scan_v5: scan v5 (")
    assert lines[1].startswith("question: ")
    assert lines[2] == "$ ncu --section WarpStateStats python -m x --kernel scan_v5"
    assert "Section: Occupancy" in text and "==PROF==" not in text
    stall_block = text.split("Warp stall reasons of scan_lookback_f32")[1]
    assert re.search(r"barrier\s+52\.30\n\s+long_scoreboard\s+30\.20", stall_block)
    assert len(text) <= pf.MAX_REPORT_CHARS


def test_trim_sanitizer_collapses_repeats():
    log = "$ cmd\n" + "========= Invalid __global__ write of size 4 bytes\n" * 5 + "========= ERROR SUMMARY: 5 errors\n"
    out = pf.trim_sanitizer(log)
    assert out.splitlines() == ["$ cmd", "========= Invalid __global__ write of size 4 bytes",
                                "    [the line above 4 more times]", "========= ERROR SUMMARY: 5 errors"]
    noisy = "".join(f"========= Host Frame: {i}\n" for i in range(500)) + "========= ERROR SUMMARY: 1 error\n"
    out = pf.trim_sanitizer(noisy, max_lines=50)
    assert "ERROR SUMMARY: 1 error" in out and "Host Frame" not in out


# ---------------------------------------------------------------- ncu targets and the command line

def test_targets_name_registered_versions():
    assert {"reduce_v7", "scan_v3", "scan_v5", "sgemm_v0", "sgemm_v8"} <= set(pf.available_targets())
    for name in pf.available_targets():
        t = pf.NCU_TARGETS[name]
        assert t.launches >= 1 and t.question.endswith(("?", "."))
        re.compile(t.kernels)
        assert name.startswith(t.op.split("_")[0]) and name.endswith(t.version)


def test_cli_lists_targets(capsys):
    assert load_script("profile_kernels").main(["--targets"]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [r[0] for r in rows] == pf.available_targets()
    assert all(len(r) == 3 and int(r[2]) >= 1 for r in rows)


def test_cli_needs_an_action():
    with pytest.raises(SystemExit):
        load_script("profile_kernels").main([])


def test_run_target_refuses_unknown_names():
    with pytest.raises(ValueError, match="unknown target"):
        pf.run_target("nope")


@pytest.mark.gpu
@pytest.mark.parametrize("name", pf.available_targets())
def test_target_launches_what_ncu_expects(name):
    """The capture script skips ``launches`` matching kernels (the warm-up) and profiles the next ``launches``:
    the warm-up and the profiled call must each launch exactly that many kernels that match the regex."""
    from torch.profiler import ProfilerActivity, profile

    t = pf.NCU_TARGETS[name]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        pf.run_target(name)
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and re.search(t.kernels, e.name.removeprefix("void "))]
    assert len(kernels) == 2 * t.launches, kernels


# ---------------------------------------------------------------- the capture script's plumbing

FAKE_NCU = r"""#!/usr/bin/env bash
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  if [[ ${args[i]} == --export ]]; then touch "${args[i+1]}.ncu-rep"; echo "==PROF== profiled"; exit 0; fi
done
if [[ " $* " == *" --csv "* ]]; then cat "$FAKE_CSV"; else
  printf '==PROF== x\n  scan_lookback_f32 (65536, 1, 1)x(256, 1, 1)\n    Section: Occupancy\n'; fi
"""
FAKE_SANITIZER = r"""#!/usr/bin/env bash
echo "========= COMPUTE-SANITIZER"
"${@: -2:1}" "${@: -1}"
echo "========= ERROR SUMMARY: 0 errors"
"""
FAKE_NVCC = r"""#!/usr/bin/env bash
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  if [[ ${args[i]} == -o ]]; then
    printf '#!/usr/bin/env bash\necho "ran $1"\n' > "${args[i+1]}"
    chmod +x "${args[i+1]}"
  fi
done
"""


def _run_capture_script(tmp_path, tools, **env_extra) -> Path:
    """scripts/capture_profiles.sh with the stand-in ``tools`` ({name: script}) first on PATH and the raw CSV
    of this module as every profile's output; returns the output folder, after asserting a clean exit."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in tools.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    (tmp_path / "raw.csv").write_text(RAW_CSV)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable,
           "FAKE_CSV": str(tmp_path / "raw.csv"), **env_extra}
    out = tmp_path / "out"
    proc = subprocess.run(["bash", "scripts/capture_profiles.sh", str(out)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_capture_script_plumbing(tmp_path):
    """scripts/capture_profiles.sh with stand-ins for ncu, compute-sanitizer and nvcc: every file it promises
    is written, the command line is recorded, and the summary is built from the CSVs."""
    out = _run_capture_script(tmp_path, {"ncu": FAKE_NCU, "compute-sanitizer": FAKE_SANITIZER, "nvcc": FAKE_NVCC})
    names = pf.available_targets()
    expected = {"torch_profiler.txt", "ncu_summary.txt", "sanitizer_memcheck.txt", "sanitizer_racecheck.txt",
                *(f"ncu_{n}.txt" for n in names)}
    # each with its record: the hash of the code that produced it (snippets.bench.captures)
    assert {p.name for p in out.iterdir()} == expected | {f"{n[:-4]}.meta.json" for n in expected}
    for name in expected:
        meta = json.loads((out / f"{name[:-4]}.meta.json").read_text())
        assert meta["file"] == name and meta["source_hash"] == captures.capture_hash(name[:-4], meta["params"])
        assert captures.status(out / name).fresh
    report = (out / "ncu_scan_v5.txt").read_text()
    assert "$ ncu --clock-control none --kernel-name-base demangled --kernel-name 'regex:^scan_lookback_f32'" in report
    assert "--launch-skip 1 --launch-count 1" in report and "--section WarpStateStats" in report
    assert "--kernel scan_v5" in report and "$TMP/scan_v5" in report and "==PROF==" not in report
    summary = (out / "ncu_summary.txt").read_text().splitlines()
    assert len(summary) == 2 + 3 * len(names)  # three kernels in the stand-in CSV, per target
    memcheck = (out / "sanitizer_memcheck.txt").read_text()
    assert "$ compute-sanitizer --tool memcheck --show-backtrace no ./planted_bugs oob" in memcheck
    assert "ran oob-fixed" in memcheck
    assert "./planted_bugs race-fixed" in (out / "sanitizer_racecheck.txt").read_text()


def test_capture_script_takes_some_steps_and_targets(tmp_path):
    """KM_PROFILE_STEPS, KM_NCU_TARGETS and KM_NCU_SUMMARY: only the named targets, under the named summary."""
    out = _run_capture_script(tmp_path, {"ncu": FAKE_NCU}, KM_PROFILE_STEPS="ncu",
                              KM_NCU_TARGETS="scan_v5 rope_v3", KM_NCU_SUMMARY="ncu_summary_some")
    files = {"ncu_scan_v5.txt", "ncu_rope_v3.txt", "ncu_summary_some.txt"}
    assert {p.name for p in out.iterdir()} == files | {f"{n[:-4]}.meta.json" for n in files}
    assert len((out / "ncu_summary_some.txt").read_text().splitlines()) == 2 + 3 * 2
    # the summary's record names its targets: its hash covers those two versions, not every target's
    meta = json.loads((out / "ncu_summary_some.meta.json").read_text())
    assert meta["params"] == {"targets": "scan_v5 rope_v3"}
    assert meta["source_hash"] != captures.capture_hash("ncu_summary")


# ---------------------------------------------------------------- the planted bugs

def _build(out_dir: Path, arch: str) -> Path:
    exe = out_dir / "planted_bugs"
    cmd = [NVCC, "-std=c++17", "-O2", "-lineinfo", f"-arch={arch}", "-I", "csrc/common", "-o", str(exe),
           str(PLANTED.relative_to(REPO_ROOT))]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}"
    return exe


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
def test_planted_bugs_builds_and_checks_its_arguments(tmp_path):
    exe = _build(tmp_path, "sm_80")
    for args in ([], ["bogus"], ["oob", "race"]):
        proc = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)  # before any CUDA call: no GPU needed
        assert "usage" in proc.stderr and proc.stdout == ""


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    return _build(tmp_path_factory.mktemp("planted"), "native")


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=300)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["oob", "oob-fixed"])
def test_oob_looks_fine_without_the_tool(planted, mode):
    """One float past the end lands in the allocation's rounding: no fault, every element right."""
    proc = _run(str(planted), mode)
    assert proc.returncode == 0, proc.stderr
    assert f"{mode}: n = 1000, 4 blocks x 256 threads" in proc.stdout
    assert proc.stdout.rstrip().endswith("elements not equal to their index: 0"), proc.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["race", "race-fixed"])
def test_race_runs(planted, mode):
    proc = _run(str(planted), mode)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{mode}: 4 blocks x 256 threads")
    if mode == "race-fixed":
        assert proc.stdout.rstrip().endswith("differ from the host's: 0"), proc.stdout


requires_sanitizer = pytest.mark.skipif(SANITIZER is None, reason="compute-sanitizer is not on PATH")


@pytest.mark.gpu
@requires_sanitizer
def test_memcheck_finds_the_out_of_bounds_write(planted):
    bad = _run(SANITIZER, "--tool", "memcheck", "--show-backtrace", "no", str(planted), "oob")
    assert bad.returncode == 0, bad.stderr  # the program's exit code: the verdict is in the report
    report = bad.stdout + bad.stderr
    assert "Invalid __global__ write of size 4 bytes" in report, report
    errors = int(re.search(r"ERROR SUMMARY: (\d+) error", report).group(1))
    assert errors >= 1
    assert "iota" in report  # the kernel that did it

    good = _run(SANITIZER, "--tool", "memcheck", "--show-backtrace", "no", str(planted), "oob-fixed")
    report = good.stdout + good.stderr
    assert "ERROR SUMMARY: 0 errors" in report, report
    assert "elements not equal to their index: 0" in report


@pytest.mark.gpu
@requires_sanitizer
def test_racecheck_finds_the_missing_barrier(planted):
    bad = _run(SANITIZER, "--tool", "racecheck", "--show-backtrace", "no", str(planted), "race")
    assert bad.returncode == 0, bad.stderr
    report = bad.stdout + bad.stderr
    m = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", report)
    assert m, report
    assert int(m.group(1)) >= 1 and int(m.group(2)) >= 1, report
    assert "Race reported between" in report

    good = _run(SANITIZER, "--tool", "racecheck", "--show-backtrace", "no", str(planted), "race-fixed")
    report = good.stdout + good.stderr
    assert "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)" in report, report
    assert "differ from the host's: 0" in report
