"""The Hopper GEMM written with CuTe's C++: the same C = A @ B^T as ``snippets/part6/gemm.py``.

A is M x K and B is N x K bf16, both row-major (K-major), C is M x N bf16 with fp32 sums: the
contract of ``hopper_gemm``, checked by the same :func:`check_hopper_gemm`. The kernel and its
host launcher are ``csrc/cute/hopper_gemm_cute.cu``: CuTe builds the TMA descriptors on the host
(``make_tma_atom``), so the launch is C++ and the file is compiled, once, into a shared library
(``nvcc -shared``) that this module loads with ctypes and calls on torch's current stream.

The kernel has the structure of the hand-written v4: a producer warpgroup of TMA loads, two
consumer warpgroups of GMMA (``wgmma``) m64n256k16 over a 128 x 256 tile, a 4-stage ring of shared
memory guarded by ``cutlass::PipelineTmaAsync``, persistent over the tiles in grouped order.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

from snippets import cuda
from snippets._checks import refuse_grad
from snippets.part6.gemm import HopperConfig, check_hopper_gemm, needs_sm90
from snippets.registry import REPO_ROOT

CU_FILE = "cute/hopper_gemm_cute.cu"
BUILD_DIR = REPO_ROOT / "build" / "cute"
CUTLASS_VERSION = "4.2.0.0"
CUTLASS_WHEEL = f"nvidia_cutlass-{CUTLASS_VERSION}-py3-none-any.whl"

# --8<-- [start:config]
# The kernel's tile, stages and threads (constants of hopper_gemm_cute.cu; the tests compare).
# As a HopperConfig, check_hopper_gemm refuses what it cannot take with hopper_gemm's messages.
CUTE_CONFIG = HopperConfig("km_cute_gemm", 128, 256, stages=4, threads=384, persistent=True)
NVCC_FLAGS = ("-std=c++17", "-O3", "-arch=sm_90a", "--expt-relaxed-constexpr", "-shared",
              "-Xcompiler", "-fPIC")
# --8<-- [end:config]


def cutlass_include() -> Path:
    """CuTe's and CUTLASS's headers, unpacked from the nvidia-cutlass wheel into build/ (a wheel
    already in build/, or one $KM_CUTLASS_WHEEL names, or one pip downloads there). Raises
    RuntimeError where none can be had."""
    build = REPO_ROOT / "build"
    root = build / f"cutlass-{CUTLASS_VERSION}"
    include = root / "cutlass_library" / "source" / "include"
    if (include / "cute" / "tensor.hpp").is_file() and (include / "cutlass").is_dir():
        return include
    wheel = Path(os.environ.get("KM_CUTLASS_WHEEL", build / CUTLASS_WHEEL))
    if not wheel.is_file():
        build.mkdir(exist_ok=True)
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--retries",
                               "0", "--timeout", "20", "-d", str(build),
                               f"nvidia-cutlass=={CUTLASS_VERSION}"],
                              capture_output=True, text=True)
        wheel = build / CUTLASS_WHEEL
        if proc.returncode != 0 or not wheel.is_file():
            raise RuntimeError(f"CuTe's headers are not available: no {CUTLASS_WHEEL} in build/ "
                               f"(or at $KM_CUTLASS_WHEEL), and pip could not download "
                               f"nvidia-cutlass=={CUTLASS_VERSION}: "
                               f"{proc.stderr.strip().splitlines()[-1:]}")
    # Unpack into a folder of this process's own and rename it into place: several processes (one
    # benchmark per GPU) may get here at once, and extracting into one shared folder races on its
    # subfolders. The first rename wins; a later one finds the headers there and keeps those.
    tmp = Path(tempfile.mkdtemp(prefix=f"{root.name}.", dir=build))
    try:
        with zipfile.ZipFile(wheel) as z:
            members = [m for m in z.namelist()
                       if m.startswith(("cutlass_library/source/include/cute/",
                                        "cutlass_library/source/include/cutlass/"))]
            z.extractall(tmp, members)
        for attempt in (1, 2):
            try:
                os.rename(tmp, root)
                break
            except OSError:
                if (include / "cute" / "tensor.hpp").is_file():
                    break  # another process's copy is complete
                if attempt == 2:
                    raise
                shutil.rmtree(root, ignore_errors=True)  # an incomplete copy: replace it
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return include


# --8<-- [start:build]
def nvcc_command(out: Path) -> list[str]:
    """The command that compiles hopper_gemm_cute.cu into a shared library for sm_90a."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise RuntimeError("hopper_gemm_cute needs nvcc (the CUDA toolkit) on PATH to compile its "
                           "sm_90a kernel")
    return [nvcc, *NVCC_FLAGS, f"-I{cutlass_include()}", str(cuda.source_path(CU_FILE)),
            "-o", str(out)]


@functools.lru_cache(maxsize=None)
def build_library() -> Path:
    """Compile hopper_gemm_cute.cu once per source text, flags and nvcc (the file name holds a
    hash of the three) and return the library's path. CuTe's templates take nvcc tens of seconds."""
    src = cuda.source_path(CU_FILE)
    cmd = nvcc_command(Path(os.devnull))
    version = subprocess.run([cmd[0], "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256((src.read_text() + version + " ".join(NVCC_FLAGS)).encode())
    out = BUILD_DIR / f"libkm_cute_gemm-{key.hexdigest()[:16]}.so"
    if not out.is_file():
        BUILD_DIR.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        proc = subprocess.run(nvcc_command(tmp), capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"nvcc failed on {src}:\n{proc.stderr}{proc.stdout}")
        tmp.replace(out)  # atomic: a concurrent process sees the whole file or none
    return out


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build_library()))
    lib.km_cute_gemm.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    lib.km_cute_gemm.restype = ctypes.c_int
    lib.km_cute_error_string.argtypes = [ctypes.c_int]
    lib.km_cute_error_string.restype = ctypes.c_char_p
    return lib
# --8<-- [end:build]


def needs_cute() -> str | None:
    """Why the CuTe kernel cannot run here (no sm_90a GPU, no nvcc, no CuTe headers), or None."""
    reason = needs_sm90()
    if reason:
        return reason
    if shutil.which("nvcc") is None:
        return "needs nvcc on PATH to compile the CuTe kernel"
    try:
        cutlass_include()
    except RuntimeError as exc:
        return str(exc)
    return None


# --8<-- [start:call]
def hopper_gemm_cute(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C = A @ B^T by the CuTe kernel: checked like every hopper_gemm version, then one call into
    the library on torch's current stream of A's device."""
    name = "hopper_gemm_cute"
    m, n, k, _ = check_hopper_gemm(name, a, b, CUTE_CONFIG)
    refuse_grad(name, a, b, instead="a @ b.T")
    reason = needs_cute()
    if reason:
        raise RuntimeError(f"{name}: {reason}")
    if a.device.type != "cuda":
        raise ValueError(f"{name}: a and b must be CUDA tensors, got {a.device}")
    lib = _library()
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    with torch.cuda.device(a.device):  # the library's runtime launches on the current device
        stream = torch.cuda.current_stream(a.device).cuda_stream
        err = lib.km_cute_gemm(a.data_ptr(), b.data_ptr(), c.data_ptr(), m, n, k, stream)
    if err:
        raise RuntimeError(f"{name}: km_cute_gemm failed with cudaError {err}: "
                           f"{lib.km_cute_error_string(err).decode()}")
    return c
# --8<-- [end:call]


# v8 of hopper_gemm: registered here, since this module imports gemm (snippets.op_index loads it)
from snippets.part6.gemm import hopper_gemm  # noqa: E402
from snippets.registry import Impl  # noqa: E402

hopper_gemm.add(Impl("v8", hopper_gemm_cute, "CUDA", "CuTe C++: TMA + GMMA atoms, like v4",
                     (cuda.source_path(CU_FILE), hopper_gemm_cute, build_library, nvcc_command,
                      check_hopper_gemm), requires=needs_cute))
