"""One declaration per op: the registry that drives tests, benchmarks and the docs.

Every op of the book registers an :class:`Op` here. The test suite reads the registry to know which references
and implementations to compare, the benchmark harness reads it to know what to time and how to turn a time into
GB/s or TFLOP/s, and the documentation hook reads it to render tables and to tell fresh measurements from stale
ones (an implementation's *source hash* changes whenever its code does).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent

LANGUAGES = ("PyTorch", "Triton", "CUDA", "NumPy")
ORIGINS = ("book", "library")
# What a rate is compared against. Each ceiling is measured by the harness in the same run as the kernels:
# the built-in ones in snippets/bench/harness.py, others by the function an op module registers with
# register_ceiling (a ceiling that needs a kernel of its own, such as shared-memory bandwidth).
CEILINGS = {
    "copy": "device-to-device copy bandwidth (bytes read + written)",
    "gemm_fp32": "cuBLAS fp32 GEMM rate (IEEE, no TF32)",
    "gemm_tf32": "cuBLAS TF32 GEMM rate",
    "gemm_fp16": "cuBLAS fp16 GEMM rate",
    "gemm_bf16": "cuBLAS bf16 GEMM rate",
}
# Ceilings registered by op modules: name -> function(quick) returning {"value", "unit", "how"}.
CEILING_MEASURES: dict[str, Callable[[bool], dict]] = {}
# metric -> what it divides by the time. "ns/access" and "ns/launch" are latencies (lower is better): the time
# divided by the count of dependent accesses or of kernel launches that ``Op.accesses`` returns.
UNITS = {"GB/s": "bytes", "TFLOP/s": "flops", "ns/access": "accesses", "ns/launch": "launches"}
LOWER_IS_BETTER = {"ns/access", "ns/launch"}


def register_ceiling(name: str, description: str, measure: Callable[[bool], dict]) -> None:
    """Declare a ceiling that the harness measures with ``measure(quick)`` whenever an op that uses it runs."""
    if name in CEILINGS and name not in CEILING_MEASURES:
        raise ValueError(f"ceiling {name!r} is built in")
    CEILINGS[name] = description
    CEILING_MEASURES[name] = measure

Size = Mapping[str, Any]


@dataclass(frozen=True)
class Impl:
    """One implementation of an op.

    ``name`` is ``v0`` for the library baseline and ``v1``, ``v2``, ... for later versions (never renumbered).
    ``origin`` says whose code it is: ``"book"`` (written here) or ``"library"`` (torch, torch.compile,
    cuBLAS/cuDNN, Liger-Kernel, NumPy: compared against, never credited as the book's); ``v0`` is always a
    library. ``sources`` lists what the implementation's speed depends on: Python functions, Triton
    ``JITFunction`` objects and CUDA files (paths relative to the repository root); its hash marks results stale.
    ``timer`` is ``"device"`` (CUDA events around the call) or ``"host"`` (a host clock after a synchronize, for
    CPU code and for anything that includes host transfers).
    """

    name: str
    fn: Callable[..., Any]
    lang: str
    desc: str
    sources: tuple[Any, ...] = ()
    device: str = "cuda"  # where it runs: "cuda", "cpu", or "any" (Triton: CUDA, or the CPU interpreter)
    timer: str = "device"
    inputs_on: str | None = None  # where its inputs live, if not where it runs (host-to-device copies timed)
    dtypes: tuple[torch.dtype, ...] | None = None  # None: every dtype the op declares
    # Sizes the harness times it at (None: all of the op's sizes); the headline size is always timed. For a
    # step too slow to time at the largest sizes of a sweep (a naive GEMM at 8192^3 takes seconds a call).
    bench_if: Callable[[Mapping[str, Any]], bool] | None = None
    # Why it cannot run in this environment (None when it can): for a version that needs an optional package
    # (Liger-Kernel) or a GPU feature (fp8 tensor cores). Tests skip it with that reason; the harness leaves it out.
    requires: Callable[[], str | None] | None = None
    origin: str = "book"
    home: str = ""  # the module that registers this version's op (set by Op.add): its inputs and cost model

    def __post_init__(self) -> None:
        if self.name == "v0" and self.origin != "library":
            object.__setattr__(self, "origin", "library")  # the baseline is a library by definition
        if self.origin not in ORIGINS:
            raise ValueError(f"{self.name}: origin must be one of {ORIGINS}, got {self.origin!r}")
        if self.lang not in LANGUAGES:
            raise ValueError(f"{self.name}: lang must be one of {LANGUAGES}, got {self.lang!r}")
        if self.device not in ("cuda", "cpu", "any"):
            raise ValueError(f"{self.name}: device must be 'cuda', 'cpu' or 'any', got {self.device!r}")
        if self.timer not in ("device", "host"):
            raise ValueError(f"{self.name}: timer must be 'device' or 'host', got {self.timer!r}")

    def runs_on(self, device: str) -> bool:
        return self.device == device or (self.device == "any" and device in ("cuda", "cpu"))

    def input_device(self, device: str) -> str:
        return self.inputs_on or device

    def unavailable(self) -> str | None:
        """The reason this version cannot run here, or None."""
        return self.requires() if self.requires is not None else None

    def supports(self, dtype: torch.dtype) -> bool:
        return self.dtypes is None or dtype in self.dtypes

    def benched_at(self, size: Mapping[str, Any], headline: Mapping[str, Any]) -> bool:
        return self.bench_if is None or size_key(size) == size_key(headline) or bool(self.bench_if(size))

    def source_hash(self, root: Path = REPO_ROOT) -> str:
        """The derived hash of everything this version's measurement depends on (snippets.hashing): the import
        closure of the modules that define ``fn``, the callables of ``sources`` and the op's registration, the
        timer, and the CUDA files and headers they can load. ``sources`` still names what a version depends on
        beyond its own module; it can add to the hash, never narrow it."""
        from snippets.hashing import derived_hash

        modules, paths, names = set(), [], []
        if self.home:
            modules.add(self.home)
        for obj in (self.fn, *self.sources):
            if isinstance(obj, (str, Path)):  # a file: relative to the repository (a copy of it, under root)
                rel = Path(obj).relative_to(REPO_ROOT) if Path(obj).is_absolute() else Path(obj)
                paths.append(root / rel)
                continue
            target = getattr(obj, "fn", obj)  # a Triton JITFunction (or InterpretedFunction) wraps .fn
            module = getattr(target, "__module__", "") or ""
            if module == "snippets" or module.startswith("snippets."):
                modules.add(module)
            else:  # a library's callable (torch.add): its name stands for it, its version is provenance
                names.append(f"{module}.{getattr(target, '__qualname__', repr(target))}")
        return derived_hash(sorted(modules), paths, names, root)


@dataclass
class Op:
    """An op of the book: its reference, implementations, inputs, cost model and benchmark sizes.

    ``make_inputs(size, dtype, device, generator)`` returns the positional arguments of every implementation.
    ``bytes_moved(size, dtype)`` and ``flops(size, dtype)`` are the cost model: the fewest bytes that must cross
    device memory and the arithmetic the op must do. ``metric`` picks which of the two the harness turns into a
    rate, and ``ceiling`` which measured ceiling it is compared against.
    """

    name: str
    part: int
    chapter: str  # docs path of the chapter that includes this op, relative to docs/
    title: str
    reference: Callable[..., Any]
    make_inputs: Callable[[Size, torch.dtype, str, torch.Generator], tuple]
    bytes_moved: Callable[[Size, torch.dtype], int]
    flops: Callable[[Size, torch.dtype], int]
    metric: str
    ceiling: str | None  # None only for a latency ("ns/access", "ns/launch"): nothing to be a fraction of
    headline: Size
    sweep: Sequence[Size]
    dtypes: tuple[torch.dtype, ...]
    test_sizes: Sequence[Size]
    impls: dict[str, Impl] = field(default_factory=dict)
    sweep_axis: str = "n"
    tolerances: Mapping[torch.dtype, tuple[float, float]] = field(default_factory=dict)
    # (rtol, atol) at one size, for an op whose error grows with the size (a GEMM's sum over K): the
    # tests hold each test size to its own tolerance, which ``tolerances`` (the loosest, sized for
    # the largest benchmark size, used by the harness) would leave far too wide at small sizes.
    tolerance_at: Callable[[Size, torch.dtype], tuple[float, float]] | None = None
    bench_dtypes: tuple[torch.dtype, ...] | None = None  # dtypes the harness times; None: the first of dtypes
    accesses: Callable[[Size, torch.dtype], int] | None = None  # for a latency: accesses or launches timed
    kind: str = "kernel"  # "kernel": a library baseline v0 is required; "micro": a micro-benchmark, v0 optional
    # For an op whose output is random (dropout): check(out, args, dtype) raises AssertionError if ``out`` is
    # not a valid output for ``args`` (every element either dropped or scaled, the kept fraction plausible).
    # When set it replaces the comparison with the reference; the reference still states what is computed.
    check: Callable[[Any, tuple, torch.dtype], None] | None = None
    # Fusion about memory: the harness also records the peak memory one call allocates beyond its inputs.
    measure_memory: bool = False
    # The dtype of the output per input dtype where they differ (fp8 inputs -> bf16 C, int8 -> int32 C).
    output_dtypes: Mapping[torch.dtype, torch.dtype] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.metric not in UNITS:
            raise ValueError(f"{self.name}: metric must be one of {tuple(UNITS)}, got {self.metric!r}")
        if self.ceiling is None and self.metric not in LOWER_IS_BETTER:
            raise ValueError(f"{self.name}: only a latency ({', '.join(sorted(LOWER_IS_BETTER))}) may have no "
                             "ceiling")
        if self.ceiling is not None and self.ceiling not in CEILINGS:
            raise ValueError(f"{self.name}: ceiling must be one of {tuple(CEILINGS)}, got {self.ceiling!r}")
        if self.metric in LOWER_IS_BETTER and self.accesses is None:
            raise ValueError(f"{self.name}: a latency metric needs accesses(size, dtype) (the count it divides by)")
        if self.kind not in ("kernel", "micro"):
            raise ValueError(f"{self.name}: kind must be 'kernel' or 'micro', got {self.kind!r}")

    def add(self, impl: Impl) -> Impl:
        if impl.name in self.impls:
            raise ValueError(f"{self.name}: implementation {impl.name} registered twice")
        if not impl.home:
            object.__setattr__(impl, "home", getattr(self.reference, "__module__", "") or "")
        self.impls[impl.name] = impl
        return impl

    @property
    def baseline(self) -> Impl | None:
        return self.impls.get("v0")

    def output_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return self.output_dtypes.get(dtype, dtype)

    def timed_dtypes(self) -> tuple[torch.dtype, ...]:
        return self.bench_dtypes or self.dtypes[:1]

    def work(self, size: Size, dtype: torch.dtype) -> int:
        """The amount the metric is about: bytes for GB/s, FLOPs for TFLOP/s, accesses (or launches) for a
        latency."""
        if self.metric == "GB/s":
            return self.bytes_moved(size, dtype)
        if self.metric == "TFLOP/s":
            return self.flops(size, dtype)
        return self.accesses(size, dtype)

    def rate(self, size: Size, dtype: torch.dtype, ms: float) -> float:
        """GB/s = bytes / time / 1e9; TFLOP/s = FLOPs / time / 1e12; ns/access (ns/launch) = time in ns /
        accesses (launches)."""
        if self.metric in LOWER_IS_BETTER:
            return ms * 1e6 / self.work(size, dtype)
        scale = 1e9 if self.metric == "GB/s" else 1e12
        return self.work(size, dtype) / (ms * 1e-3) / scale

    @property
    def lower_is_better(self) -> bool:
        return self.metric in LOWER_IS_BETTER

    def reference_fp64(self, args: tuple) -> torch.Tensor:
        """The reference on ``args`` with every floating-point tensor upcast to float64."""
        return self.reference(*(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                                for a in args))

    def tolerance(self, dtype: torch.dtype, size: Size | None = None) -> tuple[float, float]:
        """(rtol, atol) against the float64 reference: at ``size`` when the op sizes its tolerance
        (``tolerance_at``), else the op's table for the dtype (or the element-wise default)."""
        if size is not None and self.tolerance_at is not None:
            return self.tolerance_at(size, dtype)
        return self.tolerances.get(dtype, DEFAULT_TOLERANCES.get(dtype, (1e-5, 1e-5)))


# (rtol, atol) per dtype against a float64 reference, for element-wise ops. Reductions scale atol with length.
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-12, 1e-12),
    torch.float32: (1e-6, 1e-6),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (8e-3, 8e-3),
}

REGISTRY: dict[str, Op] = {}

# Modules that register ops; importing one fills REGISTRY. New parts add their module here.
OP_MODULES = (
    "snippets.part1.elementwise",
    "snippets.part1.why_gpus",
    "snippets.part1.divergence",
    "snippets.part2.coalescing",
    "snippets.part2.latency",
    "snippets.part2.banks",
    "snippets.part2.matrix_add",
    "snippets.part2.transpose",
    "snippets.part2.conv1d",
    "snippets.part2.spills",
    "snippets.part2.host_transfer",
    "snippets.part3.reduce",
    "snippets.part3.histogram",
    "snippets.part3.scan",
    "snippets.part3.sgemm",
    "snippets.part3.wmma",
    "snippets.part3.streams",
    "snippets.part4.softmax",
    "snippets.part4.matmul",
    "snippets.part4.dropout",
    "snippets.part4.layernorm",
    "snippets.part5.fusion",
    "snippets.part5.epilogue",
    "snippets.part5.rmsnorm",
    "snippets.part5.swiglu",
    "snippets.part5.rope",
    "snippets.part5.cross_entropy",
    "snippets.part5.flash_attention",
    "snippets.part5.lora",
)


def register(op: Op) -> Op:
    if op.name in REGISTRY:
        raise ValueError(f"op {op.name!r} registered twice")
    REGISTRY[op.name] = op
    return op


def load_all() -> dict[str, Op]:
    for mod in OP_MODULES:
        importlib.import_module(mod)
    return REGISTRY


def get_op(name: str) -> Op:
    ops = load_all()
    if name not in ops:
        raise KeyError(f"unknown op {name!r}; known ops: {', '.join(sorted(ops))}")
    return ops[name]


def device_generator(gen: torch.Generator, device: str) -> torch.Generator:
    """A generator on ``device`` seeded from the host generator ``gen``: input generators draw large inputs
    where they will live (a 1 GiB input does not first cross from the host), still reproducible from ``gen``."""
    seed = int(torch.randint(0, 2**62, (1,), generator=gen))
    return torch.Generator(device=device).manual_seed(seed)


def size_key(size: Size) -> str:
    """A stable text key for a size, used in results files: ``n=268435456`` or ``n=16777216,pattern=alt``."""
    return ",".join(f"{k}={size[k]}" for k in sorted(size))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
