"""Compile a CUDA file once with nvcc to a cubin, load it per device with CuPy, fetch its kernels.

CuPy's NVRTC path (``snippets.cuda.kernel``) compiles for the device's plain architecture, which
has no arch-specific instructions: ``wgmma`` and ``setmaxnreg`` exist only for ``sm_90a``. Kernels
that need them are built here instead, with ``nvcc -cubin -arch=sm_90a`` (or whatever flags the
caller gives), and launched like every other kernel of the book through ``snippets.cuda.launch``.

- :class:`Cubin` names a file under ``csrc/`` and its nvcc flags. ``nvcc_command(out)`` is the
  exact command (tests run it with ``-Xptxas -v`` to check registers and spills on a CPU);
  ``build()`` runs it once per source text and toolkit: the cubin's name under ``build/<name>/``
  holds a hash of the file and every local header it includes (``snippets.cuda.source_files``),
  the flags and ``nvcc --version``, and is written to a temporary name first and renamed, so
  parallel test workers never read half a file; ``kernel(name, device_index)`` loads the cubin on
  that device (once) and returns the ``__global__`` function.
- Building needs only nvcc (no GPU); loading needs a GPU and CuPy.

snippets/part6/gemm.py, cute_gemm.py and hopper_attention.py each carry their own copy of this
pattern (``build_cubin`` and friends); they are measured as they are, so they were left alone. They
can switch to this class at their next re-measure: ``Cubin(CU_FILE, NVCC_FLAGS, name)`` gives the
same command, the same kind of cache key and the same atomic write.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from snippets import cuda
from snippets.registry import REPO_ROOT

BUILD_ROOT = REPO_ROOT / "build"
SM90A_FLAGS = ("-std=c++17", "-O3", "-cubin", "-arch=sm_90a")


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    """``nvcc --version``'s text: part of every cache key (a new toolkit builds anew)."""
    return subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout


@dataclass(frozen=True)
class Cubin:
    """``csrc/<cu_file>`` compiled by nvcc with ``flags`` into ``build/<name>/`` (``name``
    defaults to the file's stem)."""

    cu_file: str
    flags: tuple[str, ...] = SM90A_FLAGS
    name: str = ""

    @property
    def source(self) -> Path:
        return cuda.source_path(self.cu_file)

    @property
    def build_dir(self) -> Path:
        return BUILD_ROOT / (self.name or Path(self.cu_file).stem)

    def nvcc(self) -> str:
        found = shutil.which("nvcc")
        if found is None:
            raise RuntimeError(f"{self.cu_file} needs nvcc (the CUDA toolkit) on PATH: its "
                               f"flags {' '.join(self.flags)} ask for what NVRTC through CuPy "
                               "cannot (an arch-specific target such as sm_90a)")
        return found

    def nvcc_command(self, out: Path) -> list[str]:
        """The command that compiles the file into ``out``."""
        return [self.nvcc(), *self.flags, f"-I{REPO_ROOT / 'csrc' / 'common'}", str(self.source),
                "-o", str(out)]

    def key(self) -> str:
        """A hash of the sources (the file and its local headers), the flags and the toolkit,
        computed once per process (a launch in a timing loop reads no file)."""
        return _key(self)

    def path(self) -> Path:
        """Where the cubin of the current sources lives (built or not)."""
        return self.build_dir / f"{Path(self.cu_file).stem}.{self.key()}.cubin"

    def build(self) -> Path:
        """Compile unless a cubin of these exact sources, flags and toolkit exists; its path."""
        return _build(self, self.key())

    def kernel(self, name: str, device_index: int):
        """The ``__global__`` function ``name``, loaded by CuPy on device ``device_index``."""
        return _kernel(self, self.key(), name, device_index)


@functools.lru_cache(maxsize=None)
def _key(cubin: Cubin) -> str:
    h = hashlib.sha256()
    for path in cuda.source_files(cubin.cu_file):
        h.update(path.read_bytes())
    h.update(" ".join(cubin.flags).encode())
    h.update(nvcc_version(cubin.nvcc()).encode())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def _build(cubin: Cubin, key: str) -> Path:
    out = cubin.build_dir / f"{Path(cubin.cu_file).stem}.{key}.cubin"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
        proc = subprocess.run(cubin.nvcc_command(tmp), capture_output=True, text=True)
        if proc.returncode:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"nvcc failed on {cubin.source}:\n{proc.stderr}{proc.stdout}")
        tmp.replace(out)  # atomic: a concurrent process sees the whole file or none
    return out


@functools.lru_cache(maxsize=None)
def _module(cubin: Cubin, key: str, device_index: int):
    cupy = cuda.cupy_module()
    with cupy.cuda.Device(device_index):
        return cupy.RawModule(path=str(_build(cubin, key)))


@functools.lru_cache(maxsize=None)
def _kernel(cubin: Cubin, key: str, name: str, device_index: int):
    cupy = cuda.cupy_module()
    with cupy.cuda.Device(device_index):
        return _module(cubin, key, device_index).get_function(name)


__all__ = ["BUILD_ROOT", "SM90A_FLAGS", "Cubin", "nvcc_version"]
