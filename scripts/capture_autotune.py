"""Measure the autotuning chapter's sweep on this GPU and write it as JSON (rendered by ``<!-- bench:sweep -->``).

    python scripts/capture_autotune.py OUT.json [--quick]

Commit the file as ``benchmarks/results/outputs/<gpu>/autotune_matmul.json``. It holds:

- ``configs``: every configuration of ``snippets.part4.autotune.sweep_configs()`` at 4096^3 bf16, checked
  against torch.matmul and then timed with the book's ``time_device`` (or recorded as failed / wrong);
- ``cublas``: torch.matmul (cuBLAS) on the same inputs, timed the same way, for scale;
- ``tuning_cost``: what ``triton.autotune`` itself costs over ``TUNE_SPACE``: the first call (compile + time
  every pruned config), a second call with the same key (in-memory cache), a call with a new key (configs
  already compiled: timing only), and a fresh autotuner for the first key (the on-disk cache of Triton's
  ``cache_results``, where this Triton has it);
- ``provenance`` (snippets.bench.harness.provenance()) and the source hash of the kernel, so the page can mark
  the sweep stale when the kernel changes.

Triton's compile cache is pointed at a fresh directory (unless TRITON_CACHE_DIR is already set) so that the
first tuning call pays the compile time a new machine would.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

if "TRITON_CACHE_DIR" not in os.environ:  # before triton is imported
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="km-triton-cache-")

import torch  # noqa: E402

from snippets.bench.captures import record  # noqa: E402
from snippets.bench.harness import provenance  # noqa: E402
from snippets.bench.timing import rotation, time_device  # noqa: E402
from snippets.common.gemm import matmul_kernel  # noqa: E402
from snippets.part4 import autotune as at  # noqa: E402
from snippets.registry import Impl, dtype_name  # noqa: E402

KERNEL = "snippets.common.gemm:matmul_kernel"


def _seconds(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def tuning_cost(m: int, dtype: torch.dtype) -> dict:
    """Wall-clock seconds of autotuned calls, host clock around a synchronize: tuning is host work (compiles,
    launches, Triton's own do_bench per config), not one kernel."""
    a = torch.randn(m, m, device="cuda").to(dtype)
    b = torch.randn(m, m, device="cuda").to(dtype)
    a2 = torch.randn(m, m // 2, device="cuda").to(dtype)  # another K: a new key
    b2 = torch.randn(m // 2, m, device="cuda").to(dtype)
    kernel = at.make_autotuned(at.TUNE_SPACE)
    out = {"space": len(at.TUNE_SPACE),
           "pruned": len(at.prune(at.TUNE_SPACE, m, m, m, a.element_size(), at.smem_limit("cuda"))),
           "cache_results": bool(at._autotune_options()),
           "triton_cache_dir": "fresh" if os.environ["TRITON_CACHE_DIR"].startswith(tempfile.gettempdir()) else "given"}
    out["first_call_s"] = _seconds(lambda: at.matmul_tuned(a, b, kernel))
    out["best_config"] = str(kernel.best_config)
    out["second_call_s"] = _seconds(lambda: at.matmul_tuned(a, b, kernel))
    out["new_key_s"] = _seconds(lambda: at.matmul_tuned(a2, b2, kernel))
    fresh = at.make_autotuned(at.TUNE_SPACE)  # empty in-memory cache; kernels already compiled in this process
    out["fresh_autotuner_s"] = _seconds(lambda: at.matmul_tuned(a, b, fresh))
    out["fresh_best_config"] = str(fresh.best_config)
    return out


def _compile_one(args) -> str:
    """Worker: launch one configuration once at the sweep's shapes, which compiles it into Triton's on-disk
    cache (the same cache key as the sweep's own launch: same dtypes, same divisibility of sizes and strides)."""
    cfg, m, dtype_name_ = args
    a = torch.randn(m, m, device="cuda").to(getattr(torch, dtype_name_))
    try:
        at.matmul_with(a, a, cfg)
        torch.cuda.synchronize()
        return "ok"
    except Exception as exc:  # noqa: BLE001 (a config over the shared-memory limit: the sweep records it)
        return type(exc).__name__


def precompile(configs, m: int, dtype: torch.dtype, workers: int) -> float:
    """Compile every configuration in ``workers`` processes at once (Triton compiles one kernel at a time per
    process, on the host); returns the seconds taken. The sweep's timings do not depend on it."""
    import multiprocessing as mp

    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(workers) as pool:
        pool.map(_compile_one, [(c, m, dtype_name(dtype)) for c in configs], chunksize=1)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--quick", action="store_true", help="a few configs at 2048^3 (a smoke test)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("capture_autotune needs a CUDA GPU")
    m = 2048 if args.quick else 4096
    dtype = torch.bfloat16
    configs = at.sweep_configs()
    if args.quick:
        configs = configs[::12]

    cost = tuning_cost(m, dtype)  # first: the compile cache is still empty
    print(f"tuning cost: {cost}", flush=True)

    workers = min(16, os.cpu_count() or 1)
    compile_s = precompile(configs, m, dtype, workers) if workers > 1 else 0.0
    print(f"compiled {len(configs)} configs in {compile_s:.1f} s ({workers} processes)", flush=True)
    t0 = time.perf_counter()
    records = at.sweep(configs, m, m, m, dtype)
    for r in records:
        rate = f"{r['tflops']:.1f} TFLOP/s" if r["status"] == "ok" else r["status"] + ": " + r.get("error", "")
        print(f"{r['BLOCK_M']:>3} x {r['BLOCK_N']:>3} x {r['BLOCK_K']:>3} w{r['num_warps']:<2} s{r['num_stages']}: "
              f"{rate}", flush=True)

    # cuBLAS on the same problem, timed the same way, for scale.
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 * 2**20)
    sets, flush = rotation(3 * m * m * torch.empty((), dtype=dtype).element_size(), l2)
    arg_sets = [(torch.randn(m, m, device="cuda").to(dtype), torch.randn(m, m, device="cuda").to(dtype))
                for _ in range(sets)]
    t = time_device(torch.matmul, arg_sets, budget_ms=300, flush=torch.empty(2 * l2 // 4, device="cuda")
                    if flush else None)
    cublas = {"ms": t.median, "tflops": at.tflops(m, m, m, t.median), "how": f"torch.matmul {m}^3 {dtype_name(dtype)}"}

    data = {"schema": 1, "kind": "autotune_sweep", "kernel": KERNEL,
            "source_hash": Impl("sweep", matmul_kernel, "Triton", "", ()).source_hash(),
            "problem": {"m": m, "n": m, "k": m, "dtype": dtype_name(dtype)}, "metric": "TFLOP/s",
            "sweep_seconds": time.perf_counter() - t0,
            "precompile": {"seconds": compile_s, "processes": workers}, "cublas": cublas, "tuning_cost": cost,
            "provenance": provenance(), "configs": records}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    record(args.out)  # NAME.meta.json: the hash of the code that produced it
    ok = [r for r in records if r["status"] == "ok"]
    best = max(ok, key=lambda r: r["tflops"]) if ok else None
    best_rate = f"{best['tflops']:.1f} TFLOP/s" if best else "none"
    print(f"{len(ok)}/{len(records)} configs ran; best {best_rate}; cuBLAS {cublas['tflops']:.1f} TFLOP/s; "
          f"wrote {args.out}")


if __name__ == "__main__":
    main()
