"""Autotuning the Part 3 Triton GEMM: the space of launch configurations, pruning it,
``triton.autotune``, and a measured sweep over the space.

There is no new op here: everything tunes ``matmul_kernel`` of ``snippets/common/gemm.py`` (the
Part 3 tensor-core chapter's ``wmma_gemm`` v4), imported, not copied. A configuration is the
kernel's five tile constexprs (``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K``, ``GROUP_M``) plus the two
compiler options ``num_warps`` and ``num_stages``.

- ``matmul_space`` builds a space as the product of the choices for each knob;
- ``smem_bytes`` estimates a configuration's shared memory, ``prune`` drops what cannot run on the
  device or makes no sense for the problem, and ``early_config_prune`` is the same rule in the form
  ``triton.autotune(prune_configs_by=...)`` calls;
- ``matmul_tuned`` is the GEMM behind ``triton.autotune`` (key: M, N, K), ``matmul_with`` the same
  kernel with one fixed configuration;
- ``sweep`` checks and times every configuration of a list on the GPU with the book's timer
  (``scripts/capture_autotune.py`` runs it and writes the JSON the autotuning chapter renders).

Under the CPU interpreter nothing can be timed (the autotuner needs a GPU driver to benchmark), so
the CPU tests cover the space, the pruning, fixed configurations and an autotuner whose pruning
leaves one configuration.
"""

from __future__ import annotations

import inspect
import itertools
import math
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

import torch
import triton

from snippets._checks import check_int, refuse_grad, triton_device, triton_interpreting
from snippets.common.gemm import (
    HALF_TYPES,
    SMEM_LIMIT_SM90,
    check_operands,
    device_smem_limit,
    matmul_kernel,
    tolerance_for,
)


# --8<-- [start:space]
@dataclass(frozen=True)
class MatmulConfig:
    """One point of the search space: the kernel's tile constexprs and the two compiler options."""

    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int = 8
    num_warps: int = 4
    num_stages: int = 3

    def constexprs(self) -> dict[str, int]:
        return {"BLOCK_M": self.BLOCK_M, "BLOCK_N": self.BLOCK_N, "BLOCK_K": self.BLOCK_K,
                "GROUP_M": self.GROUP_M}

    def to_triton(self) -> triton.Config:
        return triton.Config(self.constexprs(), num_warps=self.num_warps,
                             num_stages=self.num_stages)

    @classmethod
    def from_triton(cls, cfg: triton.Config) -> "MatmulConfig":
        return cls(**cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def matmul_space(block_m: Sequence[int] = (64, 128, 256), block_n: Sequence[int] = (64, 128, 256),
                 block_k: Sequence[int] = (32, 64, 128), group_m: Sequence[int] = (8,),
                 num_warps: Sequence[int] = (4, 8),
                 num_stages: Sequence[int] = (2, 3, 4, 5)) -> list[MatmulConfig]:
    """Every combination of the choices: the space is the product of the knobs, so its size is the
    product of their counts (3 x 3 x 3 x 1 x 2 x 4 = 216 with the defaults). Tile sizes are powers
    of two because tl.arange needs them; BLOCK_K >= 16 because one tensor-core MMA is 16 deep
    for fp16/bf16."""
    for name, values in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        for v in values:
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name} values must be powers of two >= 16, got {v}")
    return [MatmulConfig(bm, bn, bk, g, w, s) for bm, bn, bk, g, w, s
            in itertools.product(block_m, block_n, block_k, group_m, num_warps, num_stages)]
# --8<-- [end:space]


# --8<-- [start:prune]
def smem_bytes(cfg: MatmulConfig, itemsize: int) -> int:
    """Shared memory the pipeline needs: each of ``num_stages`` buffers holds a BLOCK_M x BLOCK_K
    tile of A and a BLOCK_K x BLOCK_N tile of B. An estimate: the compiler may also stage the output
    tile or pad for layouts."""
    return cfg.num_stages * (cfg.BLOCK_M + cfg.BLOCK_N) * cfg.BLOCK_K * itemsize


def smem_limit(device: torch.device | str | None = None) -> int:
    """The shared memory one block may use on ``device`` (a CUDA device), as Triton's driver reports
    it; the sm_90 limit when there is no GPU."""
    if device is not None and torch.device(device).type == "cuda" and not triton_interpreting():
        idx = torch.device(device).index
        return int(device_smem_limit(torch.cuda.current_device() if idx is None else idx))
    return SMEM_LIMIT_SM90


def _cap(extent: int) -> int:
    """The largest block worth using along a dimension of ``extent``: the extent rounded up to a
    power of two (tl.arange's rule), at least 16 (one MMA)."""
    return max(16, triton.next_power_of_2(extent))


def prune(configs: Iterable[MatmulConfig], m: int, n: int, k: int, itemsize: int,
          limit: int = SMEM_LIMIT_SM90) -> list[MatmulConfig]:
    """The configurations worth timing for an (m, n, k) problem, in their original order:

    1. resources: the shared-memory estimate fits in ``limit`` (a config over it fails to compile
       with OutOfResources, after the compile time is spent);
    2. shape: no block larger than its dimension needs (a 256-row block for M = 40 computes 216 rows
       of zeros), and no more stages than the K loop has iterations (a pipeline deeper than the loop
       has nothing to prefetch). The smallest block and stage count of the space always survive this
       rule, so a tiny problem keeps its smallest configurations rather than none.
    """
    configs = list(configs)
    for name, v in (("m", m), ("n", n), ("k", k), ("itemsize", itemsize)):
        check_int(name, v, 1)
    fits = [c for c in configs if smem_bytes(c, itemsize) <= limit]
    if not fits:
        return []
    min_m, min_n = min(c.BLOCK_M for c in fits), min(c.BLOCK_N for c in fits)
    min_k, min_s = min(c.BLOCK_K for c in fits), min(c.num_stages for c in fits)
    return [c for c in fits
            if (c.BLOCK_M <= _cap(m) or c.BLOCK_M == min_m)
            and (c.BLOCK_N <= _cap(n) or c.BLOCK_N == min_n)
            and (c.BLOCK_K <= _cap(k) or c.BLOCK_K == min_k)
            and (c.num_stages <= triton.cdiv(k, c.BLOCK_K) or c.num_stages == min_s)]


def early_config_prune(configs: list[triton.Config], named_args: dict,
                       **kwargs) -> list[triton.Config]:
    """``prune`` in the form triton.autotune calls it: the configs, the kernel's arguments by name,
    and the call's keyword arguments. It must return at least one config."""
    a = named_args["a_ptr"]
    kept = prune([MatmulConfig.from_triton(c) for c in configs], named_args["M"], named_args["N"],
                 named_args["K"], a.element_size(), smem_limit(a.device))
    if not kept:
        raise ValueError(f"no configuration fits in {smem_limit(a.device)} bytes of shared memory")
    keep = set(kept)
    return [c for c in configs if MatmulConfig.from_triton(c) in keep]
# --8<-- [end:prune]


# A space small enough to tune in tens of seconds: 2 x 3 block shapes, BLOCK_K = 64, two warp
# counts, two stage counts (24 configs, fewer after pruning).
TUNE_SPACE = matmul_space(block_m=(64, 128), block_n=(64, 128, 256), block_k=(64,),
                          num_warps=(4, 8), num_stages=(3, 4))


# --8<-- [start:autotune]
def _autotune_options() -> dict:
    """Keep the tuning results on disk where this Triton can (``cache_results``, Triton 3.3 and
    later): the next process that tunes the same kernel for the same key and configs reads the
    winner instead of re-timing."""
    params = inspect.signature(triton.autotune).parameters
    return {"cache_results": True} if "cache_results" in params else {}


def make_autotuned(configs: Sequence[MatmulConfig]):
    """``matmul_kernel`` behind triton.autotune over ``configs``. The key names the arguments whose
    values pick the tuning: a new (M, N, K) is tuned again, a repeated one reuses the winner.
    (Triton also adds the dtype of every tensor argument to the key, so fp16 and bf16 are
    tuned apart.)"""
    return triton.autotune(configs=[c.to_triton() for c in configs], key=["M", "N", "K"],
                           prune_configs_by={"early_config_prune": early_config_prune},
                           **_autotune_options())(matmul_kernel)


_tuned_kernel = make_autotuned(TUNE_SPACE)


def _grid(m: int, n: int):
    # The grid depends on the config the autotuner picks, so it is a function of
    # the meta-parameters.
    return lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)


def matmul_tuned(a: torch.Tensor, b: torch.Tensor, kernel=None) -> torch.Tensor:
    """C = A @ B with the configuration the autotuner picks for this (M, N, K) and dtype: the first
    call with a new key times every configuration left after pruning; later calls reuse
    the winner."""
    refuse_grad("matmul_tuned", a, b, instead="a @ b")
    m, n, k = check_operands(a, b, _dtypes(), device=triton_device())
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    (kernel or _tuned_kernel)[_grid(m, n)](a, b, c, m, n, k, a.stride(0), b.stride(0), c.stride(0),
                                           INPUT_PRECISION="tf32")
    return c
# --8<-- [end:autotune]


def _dtypes() -> tuple[torch.dtype, ...]:
    # The interpreter has no bf16 arithmetic; it takes fp16 and fp32 (fp32 runs as TF32 on a GPU).
    return (torch.float16, torch.float32) if triton_interpreting() else (*HALF_TYPES, torch.float32)


def matmul_with(a: torch.Tensor, b: torch.Tensor, cfg: MatmulConfig) -> torch.Tensor:
    """C = A @ B with one fixed configuration: what the autotuner launches for each candidate."""
    refuse_grad("matmul_with", a, b, instead="a @ b")
    m, n, k = check_operands(a, b, _dtypes(), device=triton_device())
    if not isinstance(cfg, MatmulConfig):
        raise TypeError(f"cfg must be a MatmulConfig, got {type(cfg).__name__}")
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(m, cfg.BLOCK_M) * triton.cdiv(n, cfg.BLOCK_N),)
    matmul_kernel[grid](a, b, c, m, n, k, a.stride(0), b.stride(0), c.stride(0),
                        INPUT_PRECISION="tf32", num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                        **cfg.constexprs())
    return c


# --------------------------------------------------------------------------------------------------
# The measured sweep (GPU only)
# --------------------------------------------------------------------------------------------------

def sweep_configs() -> list[MatmulConfig]:
    """What scripts/capture_autotune.py measures: every BLOCK_M x BLOCK_N in {64, 128, 256}^2 with
    BLOCK_K = 64 and each of 4 stage counts x 2 warp counts (the table keeps the best per cell for
    the heatmap), then the full num_stages x num_warps grid of the 128 x 128 x 64 tile.
    Configurations over the shared-memory limit stay in: the sweep records that they fail."""
    cells = matmul_space(block_m=(64, 128, 256), block_n=(64, 128, 256), block_k=(64,),
                         num_warps=(4, 8), num_stages=(2, 3, 4, 5))
    grid = matmul_space(block_m=(128,), block_n=(128,), block_k=(64,), num_warps=(2, 4, 8, 16),
                        num_stages=(1, 2, 3, 4, 5, 6))
    return list(dict.fromkeys([*cells, *grid]))


# --8<-- [start:sweep]
def sweep(configs: Sequence[MatmulConfig], m: int = 4096, n: int = 4096, k: int = 4096,
          dtype: torch.dtype = torch.bfloat16, seed: int = 0,
          budget_ms: float = 100.0) -> list[dict]:
    """Check, then time, ``matmul_kernel`` with each configuration on the GPU; one record
    per configuration.

    Each output is compared with an fp32 torch.matmul of the same inputs (tolerance_for of the GEMM
    chapter) before it is timed; a configuration that fails to compile (OutOfResources: too much
    shared memory or too many registers) or gives a wrong answer is recorded with its error, not
    dropped. Timing is the book's time_device, with the inputs rotated through enough copies to span
    4x L2 (no call finds its operands in L2 from the previous call)."""
    from snippets.bench.timing import rotation, time_device

    if not torch.cuda.is_available():
        raise RuntimeError("sweep times kernels and needs a CUDA GPU")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    itemsize = torch.empty((), dtype=dtype).element_size()
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 * 2**20)
    sets, flush = rotation((m * k + k * n + m * n) * itemsize, l2)
    arg_sets = [(torch.randn(m, k, device="cuda", generator=gen).to(dtype),
                 torch.randn(k, n, device="cuda", generator=gen).to(dtype)) for _ in range(sets)]
    flush_buf = torch.empty(2 * l2 // 4, device="cuda") if flush else None
    a0, b0 = arg_sets[0]
    ref = torch.matmul(a0.float(), b0.float())  # fp32 (TF32 is off by default for torch.matmul)
    rtol, atol = tolerance_for(k, dtype)
    limit = smem_limit("cuda")
    records = []
    for cfg in configs:
        rec = {**asdict(cfg), "smem_bytes": smem_bytes(cfg, itemsize),
               "fits": smem_bytes(cfg, itemsize) <= limit}
        try:
            out = matmul_with(a0, b0, cfg)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 (OutOfResources, a compile error: record which)
            rec.update(status="failed",
                       error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            records.append(rec)
            continue
        err = (out.float() - ref).abs().max().item()
        rec["max_abs_err"] = err
        if not torch.allclose(out.float(), ref, rtol=rtol, atol=atol):
            rec.update(status="wrong",
                       error=f"max abs error {err:.3g} exceeds rtol={rtol:.3g}, atol={atol:.3g}")
            records.append(rec)
            continue
        t = time_device(lambda a, b: matmul_with(a, b, cfg), arg_sets, budget_ms=budget_ms,
                        flush=flush_buf)
        rec.update(status="ok", ms=t.median, ms_p10=t.p10, ms_p90=t.p90, reps=t.reps,
                   tflops=2 * m * n * k / (t.median * 1e-3) / 1e12)  # 2*M*N*K FLOPs / time
        records.append(rec)
    return records
# --8<-- [end:sweep]


def tflops(m: int, n: int, k: int, ms: float) -> float:
    """The rate of an (m, n, k) GEMM that took ``ms`` milliseconds: 2 * M * N * K / time."""
    if ms <= 0 or not math.isfinite(ms):
        raise ValueError(f"time must be positive and finite, got {ms}")
    return 2 * m * n * k / (ms * 1e-3) / 1e12


__all__ = ["MatmulConfig", "SMEM_LIMIT_SM90", "TUNE_SPACE", "early_config_prune", "make_autotuned",
           "matmul_space", "matmul_tuned", "matmul_with", "prune", "smem_bytes", "smem_limit",
           "sweep", "sweep_configs", "tflops"]
