"""CUDA exercises: a compile check with nvcc (syntax, the kernel's name and signature, its shared memory and
barriers from ptxas), a run on the CPU emulator (exercises/emu/cuda_emu.h, compiled with g++), and a run on the
GPU through CuPy when there is one.

Compiled files are kept under build/exercises/, named by a hash of what went into them, so a second check of an
unchanged file compiles nothing.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from exercises.engine import BUILD, ROOT, Failure, Run, Skip, rel

EMU_HEADER = ROOT / "emu" / "cuda_emu.h"
ARCH = "sm_80"
PAD = 64  # canary elements on each side of every buffer the emulator gets
C_TYPES = {"int": (ctypes.c_int, np.int32), "unsigned": (ctypes.c_uint, np.uint32),
           "long long": (ctypes.c_longlong, np.int64), "float": (ctypes.c_float, np.float32),
           "double": (ctypes.c_double, np.float64)}
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


def compile_check(run: Run, src: Path, kernel: Kernel, *, shared: bool = False, barrier: bool = False) -> dict:
    """nvcc compiles ``src`` for sm_80 with a static assertion on the kernel's signature; returns ptxas's
    report for the kernel (registers, barriers, smem bytes). ``shared``/``barrier``: the kernel must use
    shared memory / __syncthreads. Without nvcc the check is skipped (reported)."""
    with run.case(f"nvcc compiles {rel(src)}; {kernel.name}({kernel.types}) exists"):
        exe = nvcc()
        if exe is None:
            raise Skip("nvcc is not on PATH: the compile check was skipped")
        text = src.read_text()
        tu_text = (f'#include "{src.resolve()}"\n#include <type_traits>\n'
                   f"static_assert(std::is_same<decltype(&{kernel.name}), void (*)({kernel.types})>::value,\n"
                   f'              "EXERCISE: the kernel must be {kernel.declaration}");\n')
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
                if "EXERCISE: the kernel must be" in err:
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
    run.note(f"ptxas ({ARCH}): {info['registers']} registers, {info['smem_bytes']} bytes of shared memory, "
             f"{info['barriers']} barrier(s)")
    return info


# ---------------------------------------------------------------------------------------------- CPU emulator

def gxx() -> str | None:
    return shutil.which("g++") or shutil.which("c++")


def _emulator_lib(src: Path, kernel: Kernel) -> ctypes.CDLL:
    exe = gxx()
    if exe is None:
        raise Skip("no C++ compiler (g++) on PATH: the CPU emulator run was skipped")
    args = ", ".join(f"*({p.ctype}*)a[{i}]" for i, p in enumerate(kernel.params))
    tu_text = (f'#include "{EMU_HEADER}"\n#include "{src.resolve()}"\n'
               f'extern "C" int emu_run(void** a, unsigned gx, unsigned gy, unsigned gz, unsigned bx, '
               f"unsigned by, unsigned bz, int order, const char** err) {{\n"
               f"  int rc = emu::launch(dim3(gx, gy, gz), dim3(bx, by, bz), order, [&] {{ {kernel.name}({args}); }});\n"
               f"  *err = emu::error.c_str();\n  return rc;\n}}\n")
    key = _digest(src.read_text(), tu_text, EMU_HEADER.read_text())
    out = BUILD / "emu" / key
    lib = out / "kernel.so"
    if not lib.exists():
        out.mkdir(parents=True, exist_ok=True)
        tu = out / "emu.cpp"
        _write_atomic(tu, tu_text)
        tmp = out / f"kernel.{os.getpid()}.so"
        r = subprocess.run([exe, "-std=c++17", "-O1", "-shared", "-fPIC", "-w", "-o", str(tmp), str(tu)],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            err = r.stderr + r.stdout
            if "invalid conversion" in err or "cannot convert" in err or "too few arguments" in err \
                    or "too many arguments" in err:
                raise Failure(f"{kernel.name} does not take ({kernel.types}): it must be {kernel.declaration}")
            raise Failure(f"the CPU emulator could not compile {rel(src)} (it covers the CUDA the exercises "
                          f"need; nvcc's verdict is the one above):\n           {_tidy(err, src, tu)}")
        os.replace(tmp, lib)
    return ctypes.CDLL(str(lib))


@dataclasses.dataclass
class Out:
    """An output buffer of ``shape`` elements, filled with NaN (or -1 for integers) before the launch, so that
    an element the kernel never writes shows up."""

    shape: tuple[int, ...] | int
    dtype: torch.dtype = torch.float32

    def make(self) -> torch.Tensor:
        fill = float("nan") if self.dtype.is_floating_point else -1
        return torch.full(self.shape if isinstance(self.shape, tuple) else (self.shape,), fill, dtype=self.dtype)


def _emulate(src: Path, kernel: Kernel, grid, block, args: Sequence[Any], order: int) -> list[torch.Tensor]:
    lib = _emulator_lib(src, kernel)
    params = kernel.params
    if len(args) != len(params):
        raise ValueError(f"{kernel.name} takes {len(params)} arguments, the check passes {len(args)}")
    keep, ptrs, buffers = [], [], []
    for p, a in zip(params, args):
        if p.pointer:
            t = a.make() if isinstance(a, Out) else a
            flat = t.detach().cpu().contiguous().reshape(-1).numpy()
            canary = np.nan if flat.dtype.kind == "f" else -7777777
            buf = np.full(flat.size + 2 * PAD, canary, dtype=flat.dtype)
            buf[PAD:PAD + flat.size] = flat
            buffers.append((p, buf, tuple(t.shape), flat.size))
            ptr = ctypes.c_void_p(buf.ctypes.data + PAD * buf.itemsize)
            keep.append(ptr)
        else:
            ctype = C_TYPES[p.base][0]
            v = ctype(a)
            keep.append(v)
            ptr = v
        ptrs.append(ctypes.cast(ctypes.pointer(ptr), ctypes.c_void_p))
    arr = (ctypes.c_void_p * len(ptrs))(*ptrs)
    g = tuple(grid) + (1,) * (3 - len(grid))
    b = tuple(block) + (1,) * (3 - len(block))
    err = ctypes.c_char_p()
    lib.emu_run.restype = ctypes.c_int
    rc = lib.emu_run(arr, *map(ctypes.c_uint, g), *map(ctypes.c_uint, b), ctypes.c_int(order), ctypes.byref(err))
    if rc != 0:
        raise Failure(f"the run stopped: {(err.value or b'').decode()}")
    outs = []
    for p, buf, shape, size in buffers:
        for side, pad in (("before the start", buf[:PAD][::-1]), ("past the end", buf[PAD + size:])):
            changed = ~np.isnan(pad) if pad.dtype.kind == "f" else pad != -7777777
            if changed.any():
                k = int(np.argmax(changed))
                where = f"{p.name}[{size + k}]" if side == "past the end" else f"{p.name}[{-1 - k}]"
                raise Failure(f"the kernel wrote {int(changed.sum())} element(s) {side} of {p.name} (first: "
                              f"{where}): a thread outside the data stored without a bounds check",
                              hint="guard every store (and load) with a bounds check such as if (i < n)")
        outs.append(torch.from_numpy(buf[PAD:PAD + size].copy()).reshape(shape))
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
            call.append(C_TYPES[p.base][1](a))
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
            check(_emulate(src, kernel, grid, block, args, order))
    why = gpu_unavailable()
    if why:
        run.skip(f"{label} [GPU]: {why}: the GPU run was skipped" if label else
                 f"GPU run skipped: {why}")
        return None
    with run.case(f"{label} [GPU]" if label else "GPU"):
        outs, launcher = _gpu(src, kernel, grid, block, args)
        check(outs)
    return launcher
