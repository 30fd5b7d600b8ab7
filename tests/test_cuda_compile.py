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
import os
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


def _cuda_roots() -> list[Path]:
    """Where a CUDA library's headers and libraries may live: the toolkit (CUDA_HOME, CUDA_PATH, the
    usual install folders) and, for a toolkit installed without its libraries, the NVIDIA wheels
    that torch pulls in (site-packages/nvidia/cu13, nvidia/cublas, ...)."""
    import importlib.util

    roots = [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    roots += [Path("/usr/local/cuda"), *sorted(Path("/usr/local").glob("cuda-*"), reverse=True)]
    roots += [r / "targets" / "x86_64-linux" for r in list(roots)]
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        roots += sorted(p for p in Path(base).iterdir() if p.is_dir())
    return roots


@functools.lru_cache(maxsize=None)
def _cublas() -> tuple[Path, Path | None] | None:
    """(folder of cublas_v2.h, libcublas.so* or None), or None where no cuBLAS header is found."""
    for root in _cuda_roots():
        if (root / "include" / "cublas_v2.h").is_file():
            libs = sorted((root / d / f) for d in ("lib64", "lib") if (root / d).is_dir()
                          for f in os.listdir(root / d) if f.startswith("libcublas.so"))
            return root / "include", (libs[0] if libs else None)
    return None


def _library_options(src: Path) -> list[str]:
    """nvcc options for the libraries a standalone program includes (only cuBLAS so far); skips the
    test, with the reason, where the library's headers are not installed."""
    if "<cublas_v2.h>" not in src.read_text():
        return []
    found = _cublas()
    if found is None:
        pytest.skip(f"{src.relative_to(REPO_ROOT)} includes cublas_v2.h, and no cuBLAS header was "
                    "found (the toolkit's include/ or a pip nvidia wheel)")
    return ["-I", str(found[0])]


@requires_nvcc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("src", _sources(), ids=lambda p: p.relative_to(CSRC).as_posix())
def test_compiles_without_spills(src: Path, arch: str, tmp_path: Path):
    cmd = [NVCC, "-std=c++17", "-c", f"-arch={arch}", "-Xptxas", "-v", "-I", "csrc/common",
           *_library_options(src), str(src.relative_to(REPO_ROOT)), "-o", str(tmp_path / f"{src.stem}.o")]
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
    assert cuda.cupy_stream(fake_cupy) == ("wrapped", 1234)
    assert cuda.cupy_stream(fake_cupy) == ("wrapped", 1234) and made == [1234]  # cached
    current["s"] = SimpleNamespace(device_index=0, cuda_stream=5678)  # another stream: wrapped anew
    assert cuda.cupy_stream(fake_cupy) == ("wrapped", 5678) and made == [1234, 5678]


# ---------------------------------------------------------------- numbers written once: -D options
#
# A number that a kernel and its Python launcher must agree on (a block size, a tile, values per
# thread) is written once, in Python, and reaches the compiler as a -D option (snippets.cuda.defines,
# passed to cuda.kernel). The .cu file keeps a default for each name, inside `#ifndef NAME` ...
# `#endif`, so that it still compiles alone (the compile test above, nvcc -Xptxas -v by hand). The
# tests below hold the two together: every default is the value Python passes, every name Python
# passes is one the file defaults and uses, and every launcher passes the options.

# A list of macro calls, one kernel each: the file alone instantiates the first entries (its
# default), Python passes the whole list. test_python_lists_compile compiles the whole list.
LIST_DEFINES = {"SGEMM_TUNED_CONFIGS": "v11_tuned.cu alone instantiates v11's configuration only",
                "SGEMM_STREAMK_CONFIGS": "v14_streamk.cu alone instantiates its first configuration only",
                "SGEMM_INTERIOR_CONFIGS": "v15_interior.cu alone instantiates one configuration only"}
_LIST_ITEM = re.compile(r"\w+\([^()]*\)")
_GUARD = re.compile(r"^[ \t]*#[ \t]*ifndef[ \t]+(\w+)[ \t]*\n(.*?)^[ \t]*#[ \t]*endif", re.M | re.S)
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)(?![\w(])[ \t]*(.*)$", re.M)


def guarded_defaults(text: str) -> dict[str, str]:
    """{NAME: default} of the ``#ifndef NAME`` / ``#define NAME value`` ... / ``#endif`` blocks of a
    CUDA source (a block may define several names; the first is the one it tests). Values have
    their white space and comments removed, lines joined at backslashes."""
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    out: dict[str, str] = {}
    for m in _GUARD.finditer(text):
        found = _DEFINE.findall(m.group(2))
        if found and found[0][0] == m.group(1):  # a default block, not another #ifndef
            out.update((name, "".join(value.split())) for name, value in found if value.strip())
    return out


def _guarded_sources() -> list[Path]:
    return [p for p in _sources() if guarded_defaults(p.read_text())]


def _defining_modules() -> list[Path]:
    """The snippets modules that give a CUDA file its numbers (they call cuda.defines)."""
    return sorted(p for p in (REPO_ROOT / "snippets").rglob("part*/*.py")
                  if "cuda.defines(" in p.read_text())


@functools.lru_cache(maxsize=None)
def python_defines() -> dict[str, dict[str, str]]:
    """csrc path -> {NAME: value} as the launchers compile each file: every module that calls
    cuda.defines imported, then snippets.cuda.DEFINES."""
    import importlib

    from snippets import cuda

    for path in _defining_modules():
        importlib.import_module(".".join(path.relative_to(REPO_ROOT).with_suffix("").parts))
    return {path: dict(values) for path, values in cuda.DEFINES.items()}


def test_guarded_defaults_parse():
    text = ("#ifndef A\n#define A 32  // one\n#define B (A * 2)\n#endif\n#ifndef __X__\n#include <y>\n"
            "#endif\n#ifndef L\n#define L F(1, 2) /* first */ \\\n    F(3, 4)\n#endif\n#define C 7\n")
    assert guarded_defaults(text) == {"A": "32", "B": "(A*2)", "L": "F(1,2)F(3,4)"}


def test_defines_are_checked_values(monkeypatch):
    from snippets import cuda

    monkeypatch.setattr(cuda, "DEFINES", {})
    assert cuda.defines("x.cu", N=32, LIST="F(1,2)") == ("-DN=32", "-DLIST=F(1,2)")
    assert cuda.defines("x.cu", N=32, LIST="F(1,2)") == ("-DN=32", "-DLIST=F(1,2)")  # again: same
    with pytest.raises(ValueError, match="already"):
        cuda.defines("x.cu", N=64, LIST="F(1,2)")  # one file, one set of numbers
    with pytest.raises(ValueError, match="white space"):
        cuda.defines("y.cu", LIST="F(1, 2)")
    with pytest.raises(TypeError):
        cuda.defines("z.cu", FLAG=True)


def test_every_default_is_the_number_python_passes():
    """Each ``#ifndef`` default in csrc/ equals the value the Python launcher passes for it, and
    the names agree both ways: no default that Python does not set, no -D without a default."""
    py = python_defines()
    files = {p.relative_to(CSRC).as_posix() for p in _guarded_sources()} | set(py)
    assert files, "no CUDA file takes its numbers from Python"
    problems = []
    for rel in sorted(files):
        defaults = guarded_defaults((CSRC / rel).read_text()) if (CSRC / rel).is_file() else {}
        passed = py.get(rel, {})
        if not (CSRC / rel).is_file():
            problems.append(f"cuda.defines names csrc/{rel}, which does not exist")
        for name in sorted(defaults.keys() - passed.keys()):
            problems.append(f"csrc/{rel}: #ifndef {name} has a default ({defaults[name]}) that no "
                            "launcher passes (snippets.cuda.defines)")
        for name in sorted(passed.keys() - defaults.keys()):
            problems.append(f"csrc/{rel}: Python passes -D{name}, but the file has no #ifndef "
                            f"{name} default")
        for name in sorted(defaults.keys() & passed.keys()):
            default, value = defaults[name], passed[name]
            if name in LIST_DEFINES:
                items, py_items = _LIST_ITEM.findall(default), _LIST_ITEM.findall(value)
                ok = "".join(items) == default and "".join(py_items) == value and items \
                    and items == py_items[:len(items)]
            else:
                ok = default == value
            if not ok:
                problems.append(f"csrc/{rel}: {name} defaults to {default}, Python passes {value}")
    assert not problems, "\n".join(problems)


def calls_without_options(source: str) -> list[int]:
    """Lines of the ``cuda.kernel(path, name)`` and ``cuda.module(path)`` calls in ``source`` that
    pass no compile options."""
    import ast

    lines = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "cuda"
                and node.func.attr in ("kernel", "module")):
            positional = 3 if node.func.attr == "kernel" else 2  # options come after path (, name)
            if len(node.args) < positional and not any(k.arg == "options" for k in node.keywords):
                lines.append(node.lineno)
    return lines


def test_calls_without_options_are_found():
    source = ("a = cuda.kernel(F, 'k')\nb = cuda.kernel(F, 'k', OPTS)\nc = cuda.module(F)\n"
              "d = cuda.module(F, options=OPTS)\ne = cuda.launch(f, 1, 1, ())\n")
    assert calls_without_options(source) == [1, 3]


def test_launchers_pass_their_defines():
    """In a module that gives a file its numbers, every cuda.kernel and cuda.module call passes
    compile options (a call without them would compile the file's defaults instead)."""
    problems = [f"{path.relative_to(REPO_ROOT)}:{line}: a cuda.kernel/cuda.module call without "
                "the file's options" for path in _defining_modules()
                for line in calls_without_options(path.read_text())]
    assert not problems, "\n".join(problems)


def test_options_reach_nvrtc(monkeypatch):
    """snippets.cuda hands a kernel's options to the compiler (CuPy's RawModule, NVRTC) as given."""
    from types import SimpleNamespace

    from snippets import cuda

    seen = []
    fake = SimpleNamespace(RawModule=lambda code, options: seen.append(options) or "module")
    monkeypatch.setattr(cuda, "cupy_module", lambda: fake)
    assert cuda._module.__wrapped__("part4/softmax.cu", "sm_90", ("-DMAX_THREADS=512",)) == "module"
    assert seen[0][-1] == "-DMAX_THREADS=512" and "-std=c++17" in seen[0]


def _nvcc_defines(options: tuple[str, ...]) -> list[str]:
    # nvcc splits an option's value at commas (NVRTC does not): escape them
    return [o.replace(",", "\\,") for o in options]


def _preprocess(src: Path, options: list[str]) -> str:
    cmd = [NVCC, "-std=c++17", "-E", "-arch=sm_90a", "-I", "csrc/common", *options,
           str(src.relative_to(REPO_ROOT))]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}"
    return "\n".join(line for line in proc.stdout.splitlines() if not line.startswith("#"))


@requires_nvcc
@pytest.mark.parametrize("src", _guarded_sources(), ids=lambda p: p.relative_to(CSRC).as_posix())
def test_defines_reach_the_code(src: Path):
    """With every name Python passes set to a marker, each marker shows up in the preprocessed
    source: the -D option replaces the default and the code uses it. With Python's own values the
    file preprocesses to exactly what it is alone (lists aside: see LIST_DEFINES)."""
    passed = python_defines().get(src.relative_to(CSRC).as_posix(), {})
    assert passed, f"{src.relative_to(REPO_ROOT)} has #ifndef defaults but no launcher passes them"
    markers = {name: f"KM_DEFINE_MARKER_{name}" for name in passed}
    text = _preprocess(src, [f"-D{name}={marker}" for name, marker in markers.items()])
    unused = sorted(name for name, marker in markers.items() if marker not in text)
    assert not unused, f"{src.relative_to(REPO_ROOT)}: -D{unused} never reaches the code"
    if not LIST_DEFINES.keys() & passed.keys():
        options = _nvcc_defines(tuple(f"-D{k}={v}" for k, v in passed.items()))
        alone, given = _preprocess(src, []).splitlines(), _preprocess(src, options).splitlines()
        differ = next((i for i, (x, y) in enumerate(zip(alone, given)) if x != y),
                      None if len(alone) == len(given) else min(len(alone), len(given)))
        assert differ is None, (f"{src.relative_to(REPO_ROOT)} with {' '.join(options)} is not the "
                                f"file alone: {alone[differ:differ + 1]} != {given[differ:differ + 1]}")


@requires_nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_python_lists_compile(arch: str, tmp_path: Path):
    """v11_tuned.cu with the whole list of TUNED configurations Python passes: one kernel per entry,
    named as the launcher names it, and none spills."""
    from snippets.part3 import sgemm

    path = sgemm.CONFIGS["v11"].path
    src = CSRC / path
    cmd = [NVCC, "-std=c++17", "-c", f"-arch={arch}", "-Xptxas", "-v", "-I", "csrc/common",
           *_nvcc_defines(sgemm.CU_OPTIONS[path]), str(src.relative_to(REPO_ROOT)),
           "-o", str(tmp_path / "tuned.o")]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}{proc.stdout}"
    functions = parse_ptxas(proc.stderr + proc.stdout)
    kernels = {name for name, f in functions.items() if f["entry"]}
    assert kernels == {cfg.kernel for cfg in sgemm.TUNED_CONFIGS}
    assert not spilling_functions(functions)


def _build_cublas(tmp_path: Path, arch: str) -> tuple[Path, Path]:
    """Build csrc/standalone/cublas_sgemm.cu; (executable, folder of libcublas). Skips without cuBLAS."""
    src = CSRC / "standalone" / "cublas_sgemm.cu"
    found = _cublas()
    if found is None or found[1] is None:
        pytest.skip("no cuBLAS header and library found (the toolkit's or a pip nvidia wheel's)")
    include, lib = found
    exe = tmp_path / "cublas_sgemm"
    cmd = [NVCC, "-std=c++17", "-O2", f"-arch={arch}", "-I", "csrc/common", "-I", str(include),
           str(src.relative_to(REPO_ROOT)), "-o", str(exe), "-L", str(lib.parent), f"-l:{lib.name}"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}{proc.stdout}"
    return exe, lib.parent


@requires_nvcc
def test_cublas_program_links(tmp_path: Path):
    """csrc/standalone/cublas_sgemm.cu (the SGEMM chapter's cuBLAS baseline from C) links against
    libcublas into an executable (scripts/capture_cublas.sh runs it on the GPU runner)."""
    exe, _ = _build_cublas(tmp_path, "sm_90a")
    assert exe.stat().st_size > 0


@requires_nvcc
@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 127, 1000])
def test_cublas_program_checks_its_result(tmp_path: Path, n: int):
    """On a GPU the program's own check passes at odd sizes (the row-major trick and the leading
    dimensions are right), and it refuses a bad size before touching the GPU."""
    exe, libdir = _build_cublas(tmp_path, "native")
    env = {**os.environ, "LD_LIBRARY_PATH": f"{libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    proc = subprocess.run([str(exe), str(n), "1", "3"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "against a double-precision dot product" in proc.stdout and proc.stdout.rstrip().endswith("ok")
    assert "TFLOP/s" in proc.stdout
    bad = subprocess.run([str(exe), "0"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "N must be an integer" in bad.stderr
