"""How the GPU suite runs, checked without a GPU: REQUIRE_GPU=1 fails a version that cannot run for a reason other
than the GPU's compute capability (a missing Liger-Kernel), KM_SPLIT_PART splits a file into shares that cover
every test once with each version's cases together, and scripts/gpu_tests.sh deals its jobs out to KM_SHARD shards and
writes the summary with the commit (pytest itself replaced by a stand-in that reports a result); the files it leaves
to the CPU suite exist and use no GPU."""

from __future__ import annotations

import ast
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import conftest
from snippets.bench import captures

REPO_ROOT = Path(__file__).resolve().parent.parent


def _outcome(reason: str, require_gpu: bool, monkeypatch) -> str:
    monkeypatch.setattr(conftest, "REQUIRE_GPU", require_gpu)
    try:
        conftest.skip_unavailable(reason)
    except pytest.skip.Exception:
        return "skipped"
    except pytest.fail.Exception:
        return "failed"
    return "ran"


def test_require_gpu_fails_a_missing_baseline_but_not_a_missing_capability(monkeypatch):
    from snippets.common.baselines import liger_missing  # noqa: F401 (the reason below is its wording)

    missing = "rmsnorm v2: Liger-Kernel is not installed (pip install liger-kernel)"
    hardware = "matmul v4: TMA needs compute capability 9.0 (Hopper), this GPU has (8, 0)"
    assert _outcome(missing, False, monkeypatch) == "skipped"
    assert _outcome(missing, True, monkeypatch) == "failed"
    assert _outcome(hardware, True, monkeypatch) == "skipped"
    assert _outcome("needs a CUDA GPU", True, monkeypatch) == "failed"


def _collected(path: str, part: str | None) -> list[str]:
    env = {**os.environ, "KM_SPLIT_PART": part or ""}
    out = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider",
                          "--collect-only", "-q", path], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return [line for line in out.stdout.splitlines() if "::" in line]


@pytest.mark.parametrize("path, n", [("tests/test_ops.py", 3), ("tests/test_part5_lora.py", 3)])
def test_split_shares_cover_every_test_once(path, n):
    whole = _collected(path, None)
    shares = [_collected(path, f"{k}/{n}") for k in range(1, n + 1)]
    assert sorted(t for s in shares for t in s) == sorted(whole)
    assert all(shares), "every share has tests"
    if path.endswith("test_ops.py"):  # a version's cases stay in one process (its compiled kernels are reused)
        op_of = re.compile(r"\[([a-z0-9_]+-v\d+)-")
        where = {}
        for k, share in enumerate(shares):
            for t in share:
                m = op_of.search(t)
                if m:
                    assert where.setdefault(m[1], k) == k, f"{m[1]} is split across shares (one version of an op)"


STUB = r"""#!/usr/bin/env bash
# python3 as gpu_tests.sh calls it: pytest reports a result (and fails for a file named in STUB_FAIL); the rest is
# the real interpreter.
if [ "$1" = -m ] && [ "$2" = pytest ]; then
  echo "pytest $3 KM_SPLIT_PART=$KM_SPLIT_PART" >> "$STUB_LOG"
  [ -z "$STUB_ARGS" ] || printf '%s\n' "$@" "OMP_NUM_THREADS=$OMP_NUM_THREADS" > "$STUB_ARGS"
  if [ -n "$STUB_FAIL" ] && [[ $3 == *"$STUB_FAIL"* ]]; then
    echo "FAILED $3::test_x - AssertionError"; echo "1 failed, 2 passed in 0.01s"; exit 1
  fi
  echo "3 passed in 0.01s"; exit 0
fi
if [ "$1" = -c ] && [[ $2 == *"import liger_kernel"* ]]; then exit 0; fi
exec "$REAL_PY" "$@"
"""


def _gpu_tests(tmp_path: Path, shard: str, fail: str = "",
               files: tuple[str, ...] = ("tests/test_part2_memory.py", "tests/test_part1.py", "tests/test_ops.py"),
               **env_extra: str) -> tuple[int, Path, list[str]]:
    """gpu_tests.sh on ``files`` (none: its default, every file) with the stand-in pytest; ``env_extra``
    overrides its environment (KM_SPLIT, KM_ALONE, KM_CPU_ONLY)."""
    stub = tmp_path / "python3"
    stub.write_text(STUB)
    stub.chmod(stat.S_IRWXU)
    out, log = tmp_path / f"out{shard.replace('/', 'of')}", tmp_path / f"calls{shard.replace('/', 'of')}.log"
    env = {**os.environ, "PYTHON": str(stub), "REAL_PY": sys.executable, "STUB_LOG": str(log), "STUB_FAIL": fail,
           "STUB_ARGS": "", "KM_SHARD": shard, "KM_SPLIT": "tests/test_ops.py:3", "KM_ALONE": "tests/test_part2_memory.py",
           "KM_COMMIT": "0123456789abcdef0123456789abcdef01234567", "KM_DIRTY": "0", **env_extra}
    proc = subprocess.run(["bash", "scripts/gpu_tests.sh", str(out), *files], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, out, log.read_text().splitlines() if log.exists() else []


def test_gpu_tests_shards_split_files_and_write_the_summary(tmp_path):
    rc1, out1, calls1 = _gpu_tests(tmp_path, "1/2")
    rc2, out2, calls2 = _gpu_tests(tmp_path, "2/2")
    assert rc1 == 0 and rc2 == 0
    # jobs: test_ops in 3 shares (longest first), test_part1, then test_part2_memory alone; dealt in turn
    assert sorted(calls1[:2]) == ["pytest tests/test_ops.py KM_SPLIT_PART=1/3",
                                  "pytest tests/test_ops.py KM_SPLIT_PART=3/3"]  # at once, in either order
    assert calls1[2:] == ["pytest tests/test_part2_memory.py KM_SPLIT_PART="], "the file run alone comes last"
    assert sorted(calls2) == ["pytest tests/test_ops.py KM_SPLIT_PART=2/3", "pytest tests/test_part1.py KM_SPLIT_PART="]
    summary = (out1 / "outputs" / "gpu_tests.txt").read_text()
    assert "shard 1/2 of 5 jobs; commit 0123456789abcdef0123456789abcdef01234567" in summary
    assert "test_ops[1/3]: 3 passed" in summary and "test_part2_memory: 3 passed" in summary
    assert summary.rstrip().endswith("result: passed (2 + 1 jobs)")
    meta = json.loads((out1 / "outputs" / "gpu_tests.meta.json").read_text())
    assert meta["commit"] == "0123456789abcdef0123456789abcdef01234567"
    assert meta["source_hash"] == captures.capture_hash("gpu_tests")
    merged = captures.merge_tests([out1 / "outputs" / "gpu_tests.txt", out2 / "outputs" / "gpu_tests.txt"],
                                  tmp_path / "gpu_tests.txt")
    assert "shard 2/2" in merged.read_text() and captures.status(merged).fresh
    alone = captures.status(out1 / "outputs" / "gpu_tests.txt")  # shard 1/2 is not the whole suite
    assert alone.state == "partial" and "2/2" in alone.why


@pytest.mark.parametrize("headers, missing", [
    (["1/2 of 97", "2/2 of 97", "6/12 of 12"], []),  # a single job re-run after the whole run
    (["1/2 of 98"], [(2, 2)]), (["2/3 of 9"], [(1, 3), (3, 3)]), ([], [])])
def test_missing_shards(headers, missing):
    text = "\n".join(f"GPU tests (bash scripts/gpu_tests.sh, REQUIRE_GPU=1), shard {h} jobs; commit abc\nresult: passed"
                     for h in headers)
    assert captures.missing_shards(text) == missing


def test_gpu_tests_reports_a_failure(tmp_path):
    rc, out, _ = _gpu_tests(tmp_path, "2/2", fail="test_part1")
    summary = (out / "outputs" / "gpu_tests.txt").read_text()
    assert rc == 1 and "test_part1: 1 failed, 2 passed" in summary
    assert "    FAILED tests/test_part1.py::test_x" in summary and "result: FAILED: test_part1" in summary


def test_gpu_tests_refuses_a_bad_shard(tmp_path):
    rc, _, calls = _gpu_tests(tmp_path, "3/2")
    assert rc == 2 and calls == []


def _cpu_only() -> list[str]:
    """gpu_tests.sh's default KM_CPU_ONLY list."""
    text = (REPO_ROOT / "scripts" / "gpu_tests.sh").read_text()
    m = re.search(r'CPU_ONLY=" \$\{KM_CPU_ONLY-([^}]*)\} "', text)
    assert m, "gpu_tests.sh has no default KM_CPU_ONLY list"
    return m[1].split()


# What a test file that uses the GPU says: the gpu marker, torch's cuda module, a CUDA device or tensor, the session's
# device (conftest's constants or its `device` fixture), or NCCL as a process group's backend
GPU_USE = re.compile(r"pytest\.mark\.gpu|torch\.cuda\b|\.cuda\(|device\s*=\s*[\"']cuda|\bDEVICE\b|\bHAS_GPU\b"
                     r"|backend\s*=\s*[\"']nccl|def test_\w+\([^)]*\bdevice\b")


def test_the_files_left_to_the_cpu_suite_use_no_gpu():
    files = _cpu_only()
    assert "tests/test_part7_pipeline.py" in files and "tests/test_ops.py" not in files
    for f in files:
        text = (REPO_ROOT / f).read_text()
        assert not GPU_USE.search(text), f"{f} uses the GPU ({GPU_USE.search(text)[0]!r}): the GPU suite must run it"
        for call in re.findall(r"run_world\([^)]*\)", text):  # Part 7: ranks on the CPU
            assert 'backend="gloo"' in call, f"{f}: {call}"


# (the examples are cut in two so that this file, which is on the list, does not match its own pattern)
@pytest.mark.parametrize("text, uses", [
    ("@pytest.mark" ".gpu\ndef test_x(): ...", True), ("x = torch" ".cuda.is_available()", True),
    ("t = torch.ones(3, device=" "'cuda')", True), ("def test_" "y(device): ...", True),
    ("run_" "world(f, 2, backend=" "'nccl')", True), ("from conftest import DEV" "ICE", True),
    ('mesh = init_device_mesh("cpu", (world,))', False), ('{"backend": "nccl", "gpu": "NVIDIA H200"}', False),
    ('env = {"CUDA_VISIBLE_DEVICES": ""}', False)])
def test_the_gpu_use_pattern(text, uses):
    assert bool(GPU_USE.search(text)) == uses


def test_gpu_tests_leaves_the_cpu_only_files_out_and_says_so(tmp_path):
    rc, out, calls = _gpu_tests(tmp_path, "1/1", files=(), KM_SPLIT="", KM_ALONE="",
                                KM_CPU_ONLY="tests/test_part1.py tests/test_hashing.py")
    assert rc == 0
    ran = {line.split()[1] for line in calls}
    every = {str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "tests").glob("test_*.py")}
    assert ran == every - {"tests/test_part1.py", "tests/test_hashing.py"}
    summary = (out / "outputs" / "gpu_tests.txt").read_text()
    assert "left to the CPU suite (no GPU code path), 2 files: test_hashing test_part1" in summary
    assert "test_part1:" not in summary and summary.rstrip().endswith(f"result: passed ({len(ran)} + 0 jobs)")


def test_gpu_tests_leaves_the_cpu_only_tests_out_and_says_so(tmp_path):
    args = tmp_path / "args.txt"
    rc, out, _ = _gpu_tests(tmp_path, "1/1", files=("tests/test_part1.py",), STUB_ARGS=str(args))
    assert rc == 0
    argv = args.read_text().splitlines()
    assert argv[argv.index("-m", 1) + 1] == "not cpu_only", argv  # the second -m: pytest's marker filter
    threads = max(1, len(os.sched_getaffinity(0)) // 16)  # the cores (nproc) shared out among 16 jobs
    assert f"OMP_NUM_THREADS={threads}" in argv
    summary = (out / "outputs" / "gpu_tests.txt").read_text()
    assert "the tests marked cpu_only" in summary


def _cpu_only_tests() -> list[tuple[str, str, str]]:
    """(file, test name, source) of every test function marked cpu_only."""
    found = []
    for path in sorted((REPO_ROOT / "tests").glob("test_*.py")):
        text = path.read_text()
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and any(
                    "cpu_only" in ast.unparse(d) for d in node.decorator_list):
                found.append((path.name, node.name, ast.get_source_segment(text, node)))
    return found


def test_the_tests_marked_cpu_only_use_no_gpu():
    """What the GPU suite leaves out must not need the GPU: no gpu marker, no CUDA device, no device fixture."""
    found = _cpu_only_tests()
    assert any(name == "test_overlap_order_is_v1s_arithmetic" for _, name, _ in found)
    for file, name, source in found:
        assert not GPU_USE.search(source), f"{file}::{name} uses the GPU ({GPU_USE.search(source)[0]!r})"


def test_the_cpu_only_marker_deselects_exactly_those_tests():
    path = "tests/test_part6_hopper_attention_bwd.py"
    out = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider",
                          "--collect-only", "-q", "-m", "not cpu_only", path], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    kept = [line for line in out.stdout.splitlines() if "::" in line]
    marked = {name for file, name, _ in _cpu_only_tests() if file == Path(path).name}
    assert marked and kept
    assert not any(t.split("::")[1].split("[")[0] in marked for t in kept)
    assert set(_collected(path, None)) - set(kept), "the marker deselected nothing"
