"""CUDA exercises: a compile check with nvcc (syntax, the kernel's name and signature, its shared memory and
barriers from ptxas), a run on the CPU emulator (exercises/emu/cuda_emu.h, compiled with g++), and a run on the
GPU through CuPy when there is one.

Compiled files are kept under build/exercises/, named by a hash of what went into them, so a second check of an
unchanged file compiles nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from exercises.engine import BUILD, ROOT, Failure, Run, Skip, rel

EMU_HEADER = ROOT / "emu" / "cuda_emu.h"
ARCH = "sm_80"
PAD = 64  # at least this many guard elements on each side of every buffer the emulator gets
NP_OF = {"float": np.float32, "double": np.float64, "int": np.int32, "unsigned": np.uint32,
         "long long": np.int64}


@dataclasses.dataclass(frozen=True)
class Param:
    ctype: str  # "const float*", "float*", "int", ...
    name: str

    @property
    def pointer(self) -> bool:
        return self.ctype.endswith("*")

    @property
    def base(self) -> str:
        """The element type of a pointer, the type of a scalar."""
        return self.ctype.replace("const", "").replace("*", "").replace("__restrict__", "").strip()


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A kernel the exercise asks for: ``Kernel("vector_add", "const float* x, const float* y, float* out,
    int n")``."""

    name: str
    signature: str

    @property
    def params(self) -> list[Param]:
        out = []
        for piece in self.signature.split(","):
            piece = " ".join(piece.replace("*", "* ").split())
            ctype, name = piece.rsplit(" ", 1)
            out.append(Param(ctype.replace(" *", "*").strip(), name))
        return out

    @property
    def types(self) -> str:
        return ", ".join(p.ctype for p in self.params)

    @property
    def declaration(self) -> str:
        return f'extern "C" __global__ void {self.name}({self.signature})'


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:20]


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _tidy(text: str, src: Path, tu: Path) -> str:
    """nvcc/g++ errors with the build paths replaced by the learner's file, first few errors only."""
    text = text.replace(str(src), rel(src)).replace(str(tu), "check.cu")
    lines = [ln for ln in text.splitlines() if "error" in ln or "static assertion" in ln]
    return "\n           ".join((lines or text.splitlines())[:4])[:1200]


# ---------------------------------------------------------------------------------------------- compile check

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")


def nvcc() -> str | None:
    return shutil.which("nvcc")


def ptx(src: Path, arch: str = ARCH) -> Path | None:
    """nvcc's PTX for ``src`` compiled for ``arch``, cached under BUILD/ptx by the source and the target;
    None without nvcc."""
    exe = nvcc()
    if exe is None:
        return None
    out = BUILD / "ptx" / _digest(src.read_text(), arch) / "kernel.ptx"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp.ptx")
        r = subprocess.run([exe, "-ptx", f"-arch={arch}", "-std=c++17", str(src), "-o", str(tmp)],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise Failure(f"nvcc could not compile {rel(src)} to PTX for {arch}:\n"
                          f"{(r.stderr or r.stdout).strip()[:600]}")
        os.replace(tmp, out)
    return out


def compile_check(run: Run, src: Path, kernel: Kernel, *, shared: bool = False, barrier: bool = False) -> dict:
    """nvcc compiles ``src`` for sm_80 with a static assertion on the kernel's signature; returns ptxas's
    report for the kernel (registers, barriers, smem bytes). ``shared``/``barrier``: the kernel must use
    shared memory / __syncthreads. Without nvcc the check is skipped (reported)."""
    info = None
    with run.case(f"nvcc compiles {rel(src)}; {kernel.name}({kernel.types}) exists"):
        exe = nvcc()
        if exe is None:
            raise Skip("nvcc is not on PATH: the compile check was skipped")
        text = src.read_text()
        tu_text = (f'#include "{src.resolve()}"\n#include <type_traits>\n'
                   f"static_assert(std::is_same<decltype(&{kernel.name}), void (*)({kernel.types})>::value,\n"
                   f'              "EXERCISE_SIGNATURE: the kernel has the wrong parameters");\n')
        key = _digest(text, tu_text, ARCH)
        out = BUILD / "nvcc" / key
        report = out / "ptxas.txt"
        if not report.exists():
            out.mkdir(parents=True, exist_ok=True)
            tu = out / "check.cu"
            _write_atomic(tu, tu_text)
            r = subprocess.run([exe, "-cubin", f"-arch={ARCH}", "-std=c++17", "-Xptxas", "-v", str(tu), "-o",
                                str(out / "check.cubin")], capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                err = r.stderr + r.stdout
                if "static assertion failed" in err and "EXERCISE_SIGNATURE" in err:
                    raise Failure(f"{kernel.name} has the wrong signature: it must be {kernel.declaration}",
                                  hint="keep the kernel's parameters as the stub declares them")
                if re.search(rf'identifier "{re.escape(kernel.name)}" is undefined', err):
                    raise Failure(f"no kernel named {kernel.name} in {rel(src)}",
                                  hint=f"declare it as {kernel.declaration}")
                raise Failure(f"nvcc could not compile {rel(src)}:\n           {_tidy(err, src, tu)}")
            _write_atomic(report, r.stderr)
        ptxas = report.read_text()
        entries = _ENTRY.findall(ptxas)
        if kernel.name not in entries:
            raise Failure(f"the compiled kernel is named {entries[0] if entries else '?'}, not {kernel.name}: "
                          f"declare it extern \"C\" (C++ mangles the name otherwise, and the GPU run looks "
                          f"it up by name)")
        # the "Used ..." line after the kernel's "Compiling entry function" line
        tail = ptxas.split(f"Compiling entry function '{kernel.name}'", 1)[1]
        m = _USED.search(tail)
        info = {"registers": int(m.group(1)) if m else 0, "barriers": int(m.group(2) or 0) if m else 0,
                "smem_bytes": int(m.group(3) or 0) if m else 0}
        if shared and info["smem_bytes"] == 0:
            raise Failure(f"{kernel.name} uses no shared memory (ptxas reports 0 bytes smem)",
                          hint="declare a __shared__ array in the kernel and stage the data through it")
        if barrier and info["barriers"] == 0:
            raise Failure(f"{kernel.name} has no __syncthreads() (ptxas reports no barrier)",
                          hint="threads read what other threads wrote to shared memory: a __syncthreads() "
                               "must separate the writes from the reads")
    if info is None:  # skipped: no nvcc
        return {}
    run.note(f"ptxas ({ARCH}): {info['registers']} registers, {info['smem_bytes']} bytes of shared memory, "
             f"{info['barriers']} barrier(s)")
    return info


# ---------------------------------------------------------------------------------------------- CPU emulator

def gxx() -> str | None:
    return shutil.which("g++") or shutil.which("c++")


EMU_TIMEOUT = 60  # seconds: a kernel that loops forever is stopped


def _emulator_exe(src: Path, kernel: Kernel) -> Path:
    """The emulator program for ``kernel`` of ``src``: it reads each pointer argument's buffer from a file named
    on its command line (the scalars are given there too), runs the grid, and writes the buffers back. A separate
    process, so that a wild store or an endless loop in the kernel stops it, not the checker."""
    exe = gxx()
    if exe is None:
        raise Skip("no C++ compiler (g++) on PATH: the CPU emulator run was skipped")
    parse = {"int": "(int)std::strtol", "unsigned": "(unsigned)std::strtoul", "long long": "std::strtoll",
             "float": "std::strtof", "double": "std::strtod"}
    decls, names = [], []
    for i, p in enumerate(kernel.params):
        arg = f"argv[{8 + i}]"
        if p.pointer:
            # the file: the number of guard elements on each side (int64), then the guarded buffer
            decls.append(f"    std::vector<char> b{i} = slurp({arg});\n"
                         f"    {p.base}* p{i} = reinterpret_cast<{p.base}*>(b{i}.data() + 8) + "
                         f"*reinterpret_cast<const long long*>(b{i}.data());")
        else:
            base = " ".join(p.base.split())
            if base not in parse:
                raise ValueError(f"unsupported scalar type {p.ctype}")
            tail = "(arg, nullptr)" if base in ("float", "double") else "(arg, nullptr, 0)"
            decls.append(f"    {base} p{i} = {parse[base]}{tail.replace('arg', arg)};")
        names.append(f"p{i}")
    writes = "\n".join(f"    spill(argv[{8 + i}], b{i});" for i, p in enumerate(kernel.params) if p.pointer)
    tu_text = (f'#include "{EMU_HEADER}"\n#include "{src.resolve()}"\n'
               "#include <fstream>\n#include <iterator>\n"
               "static std::vector<char> slurp(const char* path) {\n"
               "    std::ifstream f(path, std::ios::binary);\n"
               "    return std::vector<char>(std::istreambuf_iterator<char>(f), {});\n}\n"
               "static void spill(const char* path, const std::vector<char>& b) {\n"
               "    std::ofstream(path, std::ios::binary).write(b.data(), (std::streamsize)b.size());\n}\n"
               "int main(int argc, char** argv) {\n"
               f"    if (argc != {8 + len(kernel.params)}) return 2;\n"
               "    int order = std::atoi(argv[1]);\n"
               "    dim3 grid(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]));\n"
               "    dim3 block(std::atoi(argv[5]), std::atoi(argv[6]), std::atoi(argv[7]));\n"
               + "\n".join(decls) + "\n"
               f"    int rc = emu::launch(grid, block, order, [&] {{ {kernel.name}({', '.join(names)}); }});\n"
               + writes + "\n"
               '    if (rc) { std::fprintf(stderr, "%s\\n", emu::error.c_str()); return 3; }\n'
               "    return 0;\n}\n")
    key = _digest(src.read_text(), tu_text, EMU_HEADER.read_text())
    out = BUILD / "emu" / key
    binary = out / "kernel"
    if not binary.exists():
        out.mkdir(parents=True, exist_ok=True)
        tu = out / "emu.cpp"
        _write_atomic(tu, tu_text)
        tmp = out / f"kernel.{os.getpid()}"
        r = subprocess.run([exe, "-std=c++17", "-O1", "-w", "-o", str(tmp), str(tu)], capture_output=True,
                           text=True, timeout=300)
        if r.returncode != 0:
            err = r.stderr + r.stdout
            if "invalid conversion" in err or "cannot convert" in err or "too few arguments" in err \
                    or "too many arguments" in err:
                raise Failure(f"{kernel.name} does not take ({kernel.types}): it must be {kernel.declaration}")
            raise Failure(f"the CPU emulator could not compile {rel(src)} (it covers the CUDA the exercises "
                          f"need; nvcc's verdict is the one above):\n{_tidy(err, src, tu)}")
        os.replace(tmp, binary)
    return binary


@dataclasses.dataclass
class Out:
    """An output buffer of ``shape`` elements, filled with NaN (or -1 for integers) before the launch, so that
    an element the kernel never writes shows up."""

    shape: tuple[int, ...] | int
    dtype: torch.dtype = torch.float32

    def make(self) -> torch.Tensor:
        fill = float("nan") if self.dtype.is_floating_point else -1
        return torch.full(self.shape if isinstance(self.shape, tuple) else (self.shape,), fill, dtype=self.dtype)


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _canary(k: int, dtype: np.dtype) -> int:
    """The bit pattern of buffer k's guard elements: a quiet NaN with payload k for floats."""
    if dtype == np.float32:
        return 0x7FC0A000 + k
    if dtype == np.float64:
        return 0x7FF8_0000_0000_A000 + k
    return (0x5A5A5A5A5A5A5A5A + k) & ((1 << (8 * dtype.itemsize)) - 1)


def emulate(src: Path, kernel: Kernel, grid, block, args: Sequence[Any], order: int) -> list[torch.Tensor]:
    exe = _emulator_exe(src, kernel)
    params = kernel.params
    if len(args) != len(params):
        raise ValueError(f"{kernel.name} takes {len(params)} arguments, the check passes {len(args)}")
    g = tuple(grid) + (1,) * (3 - len(grid))
    b = tuple(block) + (1,) * (3 - len(block))
    with tempfile.TemporaryDirectory(prefix="emu-") as tmp:
        argv, buffers = [str(exe), str(order), *map(str, g), *map(str, b)], []
        for i, (p, a) in enumerate(zip(params, args)):
            if not p.pointer:
                argv.append(float(a).hex() if p.base in ("float", "double") else str(int(a)))
                continue
            t = a.make() if isinstance(a, Out) else a
            flat = t.detach().cpu().contiguous().reshape(-1).numpy()
            if flat.dtype != NP_OF[p.base]:
                raise ValueError(f"{p.name}: the check passes {flat.dtype}, the kernel takes {p.ctype}")
            pad = max(PAD, flat.size)  # a store up to a whole buffer's length away still lands in a guard
            buf = np.empty(flat.size + 2 * pad, dtype=flat.dtype)
            # a NaN with a payload of this buffer's own (an integer pattern for integers): a value copied from
            # another buffer's guard elements (x[n] + y[n] stored into out[n]) does not look like this one's
            canary = _canary(len(buffers), buf.dtype)
            buf.view(_UINT[buf.itemsize])[:] = canary
            buf[pad:pad + flat.size] = flat
            path = Path(tmp) / f"arg{i}.bin"
            with open(path, "wb") as f:
                f.write(np.int64(pad).tobytes())
                f.write(buf.tobytes())
            argv.append(str(path))
            buffers.append((p, path, buf.dtype, tuple(t.shape), flat.size, canary, pad))
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=EMU_TIMEOUT)
        except subprocess.TimeoutExpired as exc:
            raise Failure(f"the kernel did not finish within {EMU_TIMEOUT} s on the CPU emulator (a loop that "
                          f"never ends, or threads waiting for each other)") from exc
        if r.returncode < 0:
            raise Failure(f"the kernel crashed the CPU emulator (signal {-r.returncode}): it accessed memory far "
                          f"outside its buffers", hint="check every index against the size of its array: a "
                                                       "wrong bounds check, a wrong stride or swapped dimensions")
        if r.returncode != 0:
            raise Failure(f"the run stopped: {r.stderr.strip() or f'exit code {r.returncode}'}")
        if r.stdout.strip():
            print(r.stdout, end="")  # the kernel's printf
        outs = []
        for p, path, dtype, shape, size, canary, pad in buffers:
            buf = np.fromfile(path, dtype=dtype, offset=8)
            bits = buf.view(_UINT[buf.itemsize])
            for side, guard in (("before the start", bits[:pad][::-1]), ("past the end", bits[pad + size:])):
                changed = guard != canary
                if changed.any():
                    k = int(np.argmax(changed))
                    where = f"{p.name}[{size + k}]" if side == "past the end" else f"{p.name}[{-1 - k}]"
                    raise Failure(f"the kernel wrote {int(changed.sum())} element(s) {side} of {p.name} (first: "
                                  f"{where}, counting {p.name} as flat): a thread outside the data stored "
                                  f"without a bounds check",
                                  hint="guard every store (and load) with a bounds check such as if (i < n)")
            outs.append(torch.from_numpy(buf[pad:pad + size].copy()).reshape(shape))
    return outs


# ---------------------------------------------------------------------------------------------- GPU (CuPy)

def gpu_unavailable() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "CuPy is not installed (pip install cupy-cuda13x)"
    return None


@functools.lru_cache(maxsize=64)
def gpu_function(text: str, name: str):
    import cupy

    return cupy.RawModule(code=text, options=("-std=c++17",)).get_function(name)


def _gpu(src: Path, kernel: Kernel, grid, block, args: Sequence[Any]) -> tuple[list[torch.Tensor], Callable]:
    import cupy

    fn = gpu_function(src.read_text(), kernel.name)
    tensors, call = [], []
    for p, a in zip(kernel.params, args):
        if p.pointer:
            t = (a.make() if isinstance(a, Out) else a).contiguous().cuda()
            tensors.append(t)
            call.append(cupy.uint64(t.data_ptr()))
        else:
            call.append(NP_OF[p.base](a))
    g, b = tuple(grid), tuple(block)

    def launch():
        fn(g, b, tuple(call))

    launch()
    torch.cuda.synchronize()
    return [t.cpu() for t in tensors], launch


def run_everywhere(run: Run, src: Path, kernel: Kernel, grid, block, args: Sequence[Any],
                   check: Callable[[list[torch.Tensor]], None], label: str = "") -> Callable | None:
    """Launch ``kernel`` on the CPU emulator (threads in order, then in reverse order) and on the GPU when there
    is one; ``check(buffers)`` gets the pointer arguments' contents after each run. Returns the GPU launcher
    (for timing) or None."""
    launcher = None
    for order, name in ((0, "CPU emulator"), (1, "CPU emulator, threads in reverse order")):
        with run.case(f"{label} [{name}]" if label else name):
            outs = emulate(src, kernel, grid, block, args, order)
            run.kernel_runs += 1
            check(outs)
    why = gpu_unavailable()
    if why:
        run.skip(f"the run on the GPU: {why}")
        return None
    with run.case(f"{label} [GPU]" if label else "GPU"):
        outs, launcher = _gpu(src, kernel, grid, block, args)
        run.kernel_runs += 1
        check(outs)
    return launcher
