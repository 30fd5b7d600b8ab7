"""Every CUDA source in ``csrc/`` compiles with nvcc for Ampere and Hopper, and no kernel spills registers.

Needs ``nvcc`` but no GPU: the compile tests are skipped (with the reason) where nvcc is not on PATH. For each
(file, arch) the ptxas resource report (registers, stack frame, spills, shared memory per function) is written
to ``build/ptxas/<path with / as __>.<arch>.json``, so chapters and benchmarks can quote the numbers that the
current compiler produces instead of numbers copied by hand.

A spill (ptxas moving registers to local memory, which lives in DRAM) is almost always an accident that costs
a large factor in speed, so it fails the test. A file that spills on purpose, to show what spilling costs,
opts out with the comment ``// ptxas: allow-spills``.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
CSRC = REPO_ROOT / "csrc"
REPORT_DIR = REPO_ROOT / "build" / "ptxas"
ARCHS = ("sm_80", "sm_90a")  # A100; H100 with its arch-specific instructions (wgmma, setmaxnreg)
ALLOW_SPILLS_MARKER = "// ptxas: allow-spills"

NVCC = shutil.which("nvcc")
requires_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (install the CUDA toolkit, or add "
                                                        "its bin/ directory to PATH), so csrc/ cannot be compiled")

# ptxas -v prints, per function (entry functions are kernels; the others are __noinline__ device functions):
#   ptxas info    : Compiling entry function '_Z1kPfi' for 'sm_80'
#   ptxas info    : Function properties for _Z1kPfi
#       848 bytes stack frame, 736 bytes spill stores, 820 bytes spill loads
#   ptxas info    : Used 24 registers, used 1 barriers, 848 bytes cumulative stack size, 1024 bytes smem, ...
_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_FRAME_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED_RE = re.compile(r"Used (\d+) registers")
_BARRIERS_RE = re.compile(r"used (\d+) barriers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")


def parse_ptxas(output: str) -> dict[str, dict]:
    """Per-function resource usage from ``nvcc -Xptxas -v`` output (stderr), keyed by (mangled) name.

    Each value has ``entry`` (a kernel, as opposed to a device function), ``stack_frame_bytes``,
    ``spill_store_bytes``, ``spill_load_bytes`` and, for kernels, ``registers``, ``barriers`` and ``smem_bytes``
    (static shared memory; 0 when ptxas does not mention it).
    """
    functions: dict[str, dict] = {}
    entry = None  # the "Used N registers" line belongs to the kernel being compiled ...
    props = None  # ... while the stack/spill line belongs to the function named just above it
    for line in output.splitlines():
        if m := _ENTRY_RE.search(line):
            entry = m.group(1)
            functions.setdefault(entry, {})["entry"] = True
        elif m := _PROPS_RE.search(line):
            props = m.group(1)
            functions.setdefault(props, {}).setdefault("entry", False)
        elif (m := _FRAME_RE.search(line)) and props is not None:
            stack, stores, loads = map(int, m.groups())
            functions[props].update(stack_frame_bytes=stack, spill_store_bytes=stores, spill_load_bytes=loads)
        elif (m := _USED_RE.search(line)) and entry is not None:
            barriers = _BARRIERS_RE.search(line)
            smem = _SMEM_RE.search(line)
            functions[entry].update(registers=int(m.group(1)),
                                    barriers=int(barriers.group(1)) if barriers else 0,
                                    smem_bytes=int(smem.group(1)) if smem else 0)
    return functions


def spilling_functions(functions: dict[str, dict]) -> list[str]:
    """Names of the functions that spill registers to local memory (stores or loads)."""
    return sorted(name for name, f in functions.items()
                  if f.get("spill_store_bytes", 0) > 0 or f.get("spill_load_bytes", 0) > 0)


# Captured from nvcc 13.0 (-arch=sm_80 -Xptxas -v -maxrregcount=16) on a kernel that keeps a 64-float array
# live and calls a __noinline__ device function: the kernel spills, the device function does not.
SPILLING_SAMPLE = """\
ptxas warning : For profile sm_80 adjusting per thread register count of 16 to lower bound of 24
ptxas info    : Overriding maximum register limit 256 for '_Z1kPfi' with  24 of maxrregcount option
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z1kPfi' for 'sm_80'
ptxas info    : Function properties for _Z1kPfi
    848 bytes stack frame, 736 bytes spill stores, 820 bytes spill loads
ptxas info    : Used 24 registers, used 1 barriers, 848 bytes cumulative stack size, 1024 bytes smem, 364 bytes cmem[0]
ptxas info    : Compile time = 39.617 ms
ptxas info    : Function properties for _Z3fooPfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'vector_add_v1' for 'sm_80'
ptxas info    : Function properties for vector_add_v1
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers, 384 bytes cmem[0]
ptxas info    : Compile time = 1.082 ms
"""


def test_parse_ptxas_detects_spills():
    functions = parse_ptxas(SPILLING_SAMPLE)
    assert set(functions) == {"_Z1kPfi", "_Z3fooPfi", "vector_add_v1"}
    k = functions["_Z1kPfi"]
    assert k == {"entry": True, "stack_frame_bytes": 848, "spill_store_bytes": 736, "spill_load_bytes": 820,
                 "registers": 24, "barriers": 1, "smem_bytes": 1024}
    assert functions["_Z3fooPfi"] == {"entry": False, "stack_frame_bytes": 0, "spill_store_bytes": 0,
                                      "spill_load_bytes": 0}
    # The device function's properties come after the kernel's "Used" line and must not steal its registers.
    assert functions["vector_add_v1"]["registers"] == 12
    assert functions["vector_add_v1"]["smem_bytes"] == 0
    assert spilling_functions(functions) == ["_Z1kPfi"]


def test_spilling_functions_counts_loads_alone():
    # Loads without stores happen (a value spilled once, reloaded in a loop); either one is a spill.
    assert spilling_functions({"f": {"spill_store_bytes": 0, "spill_load_bytes": 4},
                               "g": {"spill_store_bytes": 0, "spill_load_bytes": 0}}) == ["f"]


def _sources() -> list[Path]:
    return sorted(CSRC.rglob("*.cu"))


def _report_path(src: Path, arch: str) -> Path:
    rel = src.relative_to(REPO_ROOT).as_posix().replace("/", "__")
    return REPORT_DIR / f"{rel}.{arch}.json"


@functools.lru_cache(maxsize=None)
def _nvcc_version() -> str:
    out = subprocess.run([NVCC, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    return out[-1] if out else "unknown"  # e.g. "Build cuda_13.0.r13.0/compiler.36424714_0"


@requires_nvcc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("src", _sources(), ids=lambda p: p.relative_to(CSRC).as_posix())
def test_compiles_without_spills(src: Path, arch: str, tmp_path: Path):
    cmd = [NVCC, "-std=c++17", "-c", f"-arch={arch}", "-Xptxas", "-v", "-I", "csrc/common",
           str(src.relative_to(REPO_ROOT)), "-o", str(tmp_path / f"{src.stem}.o")]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}{proc.stdout}"

    # ptxas writes its report to stderr; nvcc passes it through (stdout too, to be safe across versions).
    functions = parse_ptxas(proc.stderr + proc.stdout)
    REPORT_DIR.mkdir(parents=True, exist_ok=True)
    report = {"source": src.relative_to(REPO_ROOT).as_posix(), "arch": arch, "nvcc": _nvcc_version(),
              "functions": functions}
    _report_path(src, arch).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")

    # Every kernel must have had both of its lines parsed; otherwise ptxas changed its format and the spill
    # check below would pass without having looked at anything.
    for name, f in functions.items():
        missing = {"stack_frame_bytes", "spill_store_bytes", "spill_load_bytes"} - f.keys()
        if f["entry"]:
            missing |= {"registers"} - f.keys()
        assert not missing, f"could not parse {sorted(missing)} for {name} from ptxas output:\n{proc.stderr}"

    spills = spilling_functions(functions)
    if spills and ALLOW_SPILLS_MARKER not in src.read_text():
        details = "\n".join(f"  {n}: {functions[n]['spill_store_bytes']} bytes spill stores, "
                            f"{functions[n]['spill_load_bytes']} bytes spill loads" for n in spills)
        pytest.fail(f"{src.relative_to(REPO_ROOT)} spills registers for {arch}:\n{details}\n"
                    f"(if that is the point of the file, add the comment '{ALLOW_SPILLS_MARKER}')")


def test_cupy_stream_wraps_each_torch_stream_once(monkeypatch):
    """snippets.cuda wraps torch's current stream for CuPy once per stream (wrapping costs more than a launch)."""
    from types import SimpleNamespace

    from snippets import cuda

    made = []

    class FakeStream:
        @staticmethod
        def from_external(stream):
            made.append(stream.cuda_stream)
            return ("wrapped", stream.cuda_stream)

    fake_cupy = SimpleNamespace(cuda=SimpleNamespace(Stream=FakeStream, ExternalStream=None))
    current = {"s": SimpleNamespace(device_index=0, cuda_stream=1234)}
    monkeypatch.setattr(cuda.torch.cuda, "current_stream", lambda: current["s"])
    monkeypatch.setattr(cuda, "_STREAMS", {})
    assert cuda._cupy_stream(fake_cupy) == ("wrapped", 1234)
    assert cuda._cupy_stream(fake_cupy) == ("wrapped", 1234) and made == [1234]  # cached
    current["s"] = SimpleNamespace(device_index=0, cuda_stream=5678)  # another stream: wrapped anew
    assert cuda._cupy_stream(fake_cupy) == ("wrapped", 5678) and made == [1234, 5678]
