"""Load CUDA C kernels from ``csrc/`` and launch them on torch tensors, through CuPy (NVRTC).

Each ``.cu`` file is compiled once per (file, device architecture, options) and cached for the
process; CuPy also keeps a compiled-kernel cache on disk (``~/.cupy/kernel_cache``), so a second
process starts fast. Kernels run on torch's current stream, so they order correctly with torch work
around them.

Without CuPy or without a GPU, :func:`kernel` raises a ``RuntimeError`` that says what is missing,
instead of an ImportError or a driver error from deep inside CuPy.
"""

# --8<-- [start:loader]
from __future__ import annotations

import functools
import os
import re
import shutil
from pathlib import Path

import torch

from snippets.registry import REPO_ROOT

CSRC = REPO_ROOT / "csrc"


def cupy_module():
    try:
        import cupy
    # the wheel name depends on the CUDA major version: cupy-cuda12x / cupy-cuda13x
    except ImportError as exc:
        raise RuntimeError(
            "the CUDA C versions of this book's kernels are loaded through CuPy, which is not "
            "installed: pip install cupy-cuda13x (or cupy-cuda12x for a CUDA 12 driver), or use "
            "the Triton/PyTorch versions"
        ) from exc
    return cupy


def require_gpu() -> None:
    if not torch.cuda.is_available():
        raise RuntimeError("this CUDA C kernel needs an NVIDIA GPU, and torch sees none "
                           "(torch.cuda.is_available() is False); use the Triton version under "
                           "TRITON_INTERPRET=1 to run on the CPU")


@functools.lru_cache(maxsize=None)
def toolkit_include() -> tuple[str, ...]:
    """``-I<CUDA toolkit>/include`` when a full toolkit is installed, else nothing. NVRTC has the
    basic CUDA headers built in and CuPy adds those of the pip CUDA packages, which lack some that a
    header includes in turn (``mma.h`` needs ``crt/mma.h``); the toolkit next to ``nvcc`` has
    them all."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(str(Path(nvcc).resolve().parent.parent))
    roots.append("/usr/local/cuda")
    for root in roots:
        if root and (Path(root) / "include" / "crt" / "mma.h").is_file():
            return (f"-I{Path(root) / 'include'}",)
    return ()


@functools.lru_cache(maxsize=None)
def _module(path: str, arch: str, options: tuple[str, ...]):
    cupy = cupy_module()
    source = (CSRC / path).read_text()
    # CuPy adds the target architecture of the current device itself; ``arch`` keys this cache per
    # device type. Quoted includes resolve next to the file (a step's shared header) and
    # in csrc/common.
    opts = ("-std=c++17", f"-I{(CSRC / path).parent}", f"-I{CSRC / 'common'}", *toolkit_include(),
            *options)
    return cupy.RawModule(code=source, options=opts)


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def module(path: str, options: tuple[str, ...] = ()):
    """The compiled module of ``csrc/<path>`` for this GPU (a ``cupy.RawModule``), the one
    ``kernel`` takes its functions from: for module-level state such as ``__constant__``
    arrays (``module(path).get_global(name)``)."""
    require_gpu()
    return _module(path, _arch(), tuple(options))


@functools.lru_cache(maxsize=None)
def _function(path: str, arch: str, options: tuple[str, ...], name: str):
    return _module(path, arch, options).get_function(name)


def kernel(path: str, name: str, options: tuple[str, ...] = ()):
    """The ``__global__`` function ``name`` (declared ``extern "C"``) of ``csrc/<path>``, compiled
    for this GPU. The same object comes back on every call, so per-kernel facts
    (``resident_blocks``) are cached with it."""
    require_gpu()
    return _function(path, _arch(), tuple(options), name)


@functools.lru_cache(maxsize=None)
def resident_blocks(fn, threads: int, shared_mem: int = 0) -> int:
    """How many blocks of ``threads`` threads fit on one SM at once (registers, shared memory,
    thread slots), from the driver's occupancy calculator: a grid-stride launch of SMs x this many
    blocks fills the GPU exactly once, with no second, partial wave. Cached: the answer never
    changes for a compiled kernel."""
    cupy = cupy_module()
    try:
        return int(cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, threads,
                                                                              shared_mem))
    # older CuPy: estimate from the register count (registers allocated per warp)
    except AttributeError:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        # rounded up to the 256-register allocation unit
        regs_per_warp = -(-fn.num_regs * 32 // 256) * 256
        warps = -(-threads // 32)  # a block of 1 thread still takes a whole warp
        by_regs = props.regs_per_multiprocessor // (regs_per_warp * warps)
        by_threads = props.max_threads_per_multi_processor // (warps * 32)
        # 32: the most resident blocks per SM (Volta to Hopper)
        return max(1, min(by_regs, by_threads, 32))


def launch(fn, grid: int | tuple, block: int | tuple, args: tuple, shared_mem: int = 0) -> None:
    """Launch ``fn`` on torch's current stream. Tensors become device pointers; keep scalars typed
    (``numpy.int64(n)``, ``numpy.float32(a)``) so they match the kernel's parameter types."""
    cupy = cupy_module()
    grid = grid if isinstance(grid, tuple) else (grid,)
    block = block if isinstance(block, tuple) else (block,)
    ptr_args = tuple(cupy.uint64(a.data_ptr()) if isinstance(a, torch.Tensor) else a for a in args)
    with cupy_stream(cupy):
        fn(grid, block, ptr_args, shared_mem=shared_mem)


_STREAMS: dict[tuple[int, int], object] = {}  # (device, torch stream handle) -> its CuPy stream


def cupy_stream(cupy):
    """torch's current stream as a CuPy stream (``Stream.from_external`` in CuPy 14+, else
    ``ExternalStream``). Wrapping a stream costs tens of microseconds of host time, more than a
    launch, so each torch stream is wrapped once and the wrapper kept."""
    current = torch.cuda.current_stream()
    key = (current.device_index, current.cuda_stream)
    cached = _STREAMS.get(key)
    if cached is not None:
        return cached
    wrapped = None
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        try:
            wrapped = from_external(current)
        except Exception:  # noqa: BLE001
            # a torch stream without the CUDA stream protocol: use the raw handle
            wrapped = None
    if wrapped is None:
        wrapped = cupy.cuda.ExternalStream(current.cuda_stream)
    # streams come and go (one per torch.cuda.Stream()): keep the cache small
    if len(_STREAMS) > 64:
        _STREAMS.clear()
    _STREAMS[key] = wrapped
    return wrapped

# --8<-- [end:loader]


# csrc path -> {NAME: value}: the -D options its Python launcher compiles it with (see defines)
DEFINES: dict[str, dict[str, str]] = {}


def defines(path: str, **values: int | str) -> tuple[str, ...]:
    """The ``-DNAME=value`` options that give ``csrc/<path>`` the numbers its Python launcher sizes
    grids, blocks and shared memory with, for :func:`kernel`'s ``options``: each such number is
    written once, in Python. The file keeps a default for each name (``#ifndef NAME``, ``#define
    NAME value``, ``#endif``), so that it still compiles alone with nvcc; tests/test_cuda_compile.py
    checks that every default is the value given here and that every name reaches the code. The
    values are recorded in ``DEFINES`` for those tests; a file has one set of them. A value may be a
    list of macro calls (``F(1,2)F(3,4)``): NVRTC takes each option whole, while nvcc splits an
    option at commas, so a command line must escape them (``\\,``)."""
    text = {}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise TypeError(f"-D{name}: an int or a str, got {type(value).__name__}")
        text[name] = str(value)
        if not text[name] or re.search(r"\s", text[name]):
            raise ValueError(f"-D{name}={text[name]!r}: one compiler argument, no white space")
    if DEFINES.setdefault(path, text) != text:
        raise ValueError(f"{path} is compiled with {DEFINES[path]} already, not with {text}")
    return tuple(f"-D{name}={value}" for name, value in text.items())


def source_path(path: str) -> Path:
    return CSRC / path


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def source_files(path: str) -> tuple[Path, ...]:
    """``csrc/<path>`` and every local header it includes (``#include "x.cuh"``, found next to the
    including file or in csrc/common), recursively: what a kernel's source hash must cover, since a
    change to a shared header changes the compiled kernel."""
    seen: list[Path] = []

    def visit(file: Path) -> None:
        if file in seen:
            return
        seen.append(file)
        for name in _INCLUDE.findall(file.read_text()):
            for candidate in (file.parent / name, CSRC / "common" / name):
                if candidate.is_file():
                    visit(candidate.resolve())
                    break
            else:
                raise FileNotFoundError(f"{file.relative_to(CSRC.parent)} includes {name!r}, which "
                                        "is neither next to it nor in csrc/common")

    visit((CSRC / path).resolve())
    return tuple(seen)
