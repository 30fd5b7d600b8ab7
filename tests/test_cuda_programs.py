"""The standalone CUDA programs of Part 1 build with the command the chapter gives, run, and print what it says.

Needs a GPU (the ``gpu`` marker) and ``nvcc``. Each program is built once per test session with
``nvcc -std=c++17 -O3 -arch=native -I csrc/common -o <out> <file>.cu``, the reader's command plus the include
path. With ``KM_OUTPUT_DIR`` set, the output of device_query, hello and vector_add_main is also saved there (with
its record, NAME.meta.json), so a GPU run leaves the real numbers behind for the book to quote.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
PART1 = REPO_ROOT / "csrc" / "part1"
NVCC = shutil.which("nvcc")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH, so the CUDA programs cannot be built"),
]

RUN_TIMEOUT_S = 120  # a hung kernel should fail the test, not the whole CI job


def build_program(src: Path, out_dir: Path) -> Path:
    """Compile the standalone program ``src`` into ``out_dir`` and return the executable's path."""
    exe = out_dir / src.stem
    cmd = [NVCC, "-std=c++17", "-O3", "-arch=native", "-I", "csrc/common", "-o", str(exe),
           str(src.relative_to(REPO_ROOT))]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}{proc.stdout}"
    return exe


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """``program("hello")`` builds csrc/part1/hello.cu on first use and returns the executable."""
    out_dir = tmp_path_factory.mktemp("cuda_programs")
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            built[name] = build_program(PART1 / f"{name}.cu", out_dir)
        return built[name]

    return get


def run(exe: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def save_output(name: str, text: str) -> None:
    """With KM_OUTPUT_DIR set, write the program's output there, with its record (NAME.meta.json: the hash of
    the code that produced it, this file and the program's source; snippets.bench.captures)."""
    out_dir = os.environ.get("KM_OUTPUT_DIR")
    if out_dir:
        from snippets.bench.captures import record

        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / name).write_text(text)
        record(Path(out_dir) / name)


HELLO_RE = re.compile(r"Hello from block (\d+), thread (\d+)")


@pytest.mark.parametrize("args, blocks, threads", [((), 2, 4), (("3", "5"), 3, 5)], ids=["default", "3x5"])
def test_hello_every_thread_prints_once(program, args, blocks, threads):
    proc = run(program("hello"), *args)
    assert proc.returncode == 0, proc.stderr
    hello_lines = [line for line in proc.stdout.splitlines() if line.startswith("Hello from block")]
    assert len(hello_lines) == blocks * threads, proc.stdout
    pairs = Counter(tuple(map(int, HELLO_RE.fullmatch(line).groups())) for line in hello_lines)
    expected = Counter((b, t) for b in range(blocks) for t in range(threads))
    assert pairs == expected
    # The host's line comes after cudaDeviceSynchronize, so after every line that the GPU printed.
    assert proc.stdout.splitlines()[-1] == f"launched {blocks} blocks x {threads} threads = {blocks * threads} threads"


@pytest.mark.parametrize("args", [("0",), ("-1",), ("two",), ("2", "0"), ("2", "1025"), ("2", "4x"),
                                  ("2", "4", "extra")], ids=lambda args: "_".join(args))
def test_hello_rejects_bad_arguments(program, args):
    proc = run(program("hello"), *args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "usage" in proc.stderr
    assert "Hello from block" not in proc.stdout  # nothing was launched


@pytest.mark.parametrize("n", [1, 1_000_003, None], ids=["n=1", "n=1000003", "default"])
def test_vector_add_main_passes(program, n):
    proc = run(program("vector_add_main"), *([] if n is None else [str(n)]))
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    expected_n = 1 << 24 if n is None else n
    assert f"PASSED n={expected_n}" in proc.stdout.splitlines()
    assert "max abs error: 0" in proc.stdout.splitlines()
    assert re.search(r"^kernel: [\d.]+ ms, [\d.]+ GB/s \(3\*n\*4 bytes\)$", proc.stdout, re.M), proc.stdout
    if n is None:
        save_output("vector_add.txt", proc.stdout)


def test_vector_add_main_rejects_bad_n(program):
    for arg in ("0", "-5", "lots"):
        proc = run(program("vector_add_main"), arg)
        assert proc.returncode == 2, (arg, proc.stdout, proc.stderr)
        assert "usage" in proc.stderr


def parse_key_values(block: str) -> dict[str, str]:
    """``key: value`` lines into a dict; the value may itself contain ':' (a GPU name could)."""
    pairs = {}
    for line in block.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            pairs[key.strip()] = value.strip()
    return pairs


DEVICE_QUERY_KEYS = [
    "name", "compute_capability", "sm_count", "max_threads_per_sm", "max_threads_per_block", "warp_size",
    "regs_per_sm", "regs_per_block", "smem_per_sm_bytes", "smem_per_block_bytes", "smem_per_block_optin_bytes",
    "l2_bytes", "global_mem_bytes", "free_mem_bytes", "sm_clock_mhz", "mem_clock_mhz", "mem_bus_width_bits",
    "peak_dram_gbps",
]


def test_device_query_matches_torch(program):
    proc = run(program("device_query"))
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    save_output("device_query.txt", proc.stdout)
    # hello's output is kept alongside, for the chapter that shows what a launch prints on a real GPU.
    hello = run(program("hello"))
    assert hello.returncode == 0, hello.stderr
    save_output("hello.txt", hello.stdout)

    blocks = [b for b in proc.stdout.split("\n\n") if b.strip()]
    assert len(blocks) == torch.cuda.device_count(), proc.stdout
    info = parse_key_values(blocks[0])
    assert info.get("device") == "0"
    missing = [k for k in DEVICE_QUERY_KEYS if k not in info]
    assert not missing, f"device_query printed no {missing}:\n{proc.stdout}"

    props = torch.cuda.get_device_properties(0)
    assert info["name"] == props.name
    assert int(info["sm_count"]) == props.multi_processor_count
    assert int(info["global_mem_bytes"]) == props.total_memory
    assert info["compute_capability"] == f"{props.major}.{props.minor}"
    assert int(info["warp_size"]) == 32
    assert 0 < int(info["free_mem_bytes"]) <= int(info["global_mem_bytes"])
    # Theoretical peak is computed from the memory clock and bus width; check the arithmetic, not the GPU.
    if info["peak_dram_gbps"] != "n/a":
        peak = 2 * int(info["mem_clock_mhz"]) * 1e6 * int(info["mem_bus_width_bits"]) / 8 / 1e9
        assert float(info["peak_dram_gbps"]) == pytest.approx(peak, rel=1e-2)  # mhz is rounded down from khz

    # One device by index prints the same facts as the first block of the full listing (free memory aside).
    one = run(program("device_query"), "0")
    assert one.returncode == 0, one.stderr
    only = parse_key_values(one.stdout)
    assert {k: v for k, v in only.items() if k != "free_mem_bytes"} == \
        {k: v for k, v in info.items() if k != "free_mem_bytes"}
    bad = run(program("device_query"), str(torch.cuda.device_count()))
    assert bad.returncode == 2 and "usage" in bad.stderr
