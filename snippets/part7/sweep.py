"""A sweep of torch.distributed's collectives over message sizes: time, algorithm bandwidth and bus
bandwidth per size (NCCL's conventions, snippets.part7.cost), and the alpha-beta model fitted to it.

On GPUs (NCCL) this is what the multi-GPU measurements of Part 7 run; on a CPU (gloo) it is a dry
run of the same code. Run it on every rank:

    torchrun --nproc-per-node 4 -m snippets.part7.sweep --out sweep.json      # GPUs, NCCL
    python -m snippets.part7.sweep --world 2 --max-bytes 1048576 --out s.json  # CPU, gloo

Each size is timed over ``iters`` calls after ``warmup`` calls; every rank times the same calls
between barriers, and the slowest rank's time counts (a collective ends when its last rank does).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from typing import Any

import torch
import torch.distributed as dist

from snippets.part7.collectives import all_gather_tensor, reduce_scatter_tensor
from snippets.part7.cost import algorithm_bandwidth, bus_bandwidth, fit_alpha_beta

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def sizes_between(lo: int, hi: int) -> list[int]:
    """Powers of two from ``lo`` to ``hi`` bytes (both included, both powers of two)."""
    if lo < 1 or hi < lo or lo & (lo - 1) or hi & (hi - 1):
        raise ValueError("sizes_between: lo and hi must be powers of two with lo <= hi, got "
                         f"{lo}, {hi}")
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= 2
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --8<-- [start:call]
def collective(op: str, nbytes: int, p: int, device: torch.device, dtype: torch.dtype):
    """A callable running ``op`` on a message of ``nbytes`` (the size NCCL's tests report: the whole
    buffer for all_reduce and all_to_all, the gathered output for all_gather, the input for
    reduce_scatter), on tensors allocated once."""
    n = max(p, nbytes // torch.tensor([], dtype=dtype).element_size())
    n -= n % p  # divisible among ranks
    full = torch.ones(n, dtype=dtype, device=device)
    part = torch.ones(n // p, dtype=dtype, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full)
    if op == "all_gather":
        return lambda: all_gather_tensor(full, part)
    if op == "reduce_scatter":
        return lambda: reduce_scatter_tensor(part, full)
    if op == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full)
    raise ValueError(f"collective: op must be one of {OPS}, got {op!r}")
# --8<-- [end:call]


def _grouped() -> bool:
    return dist.is_available() and dist.is_initialized()


def time_op(fn, device: torch.device, iters: int, warmup: int, group=None) -> float:
    """Seconds per call on this rank: ``warmup`` untimed calls, then ``iters`` timed back to back,
    between barriers (none on one process without a group)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    if _grouped():
        dist.barrier(group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(device)
    return (time.perf_counter() - t0) / iters


def slowest_time(fn, device: torch.device, iters: int, warmup: int, group=None) -> float:
    """``time_op`` on every rank, and the slowest rank's time: a collective, or a step of
    several ranks, ends when its last rank does. On one process without a group, its own."""
    seconds = time_op(fn, device, iters, warmup, group)
    if not _grouped():
        return seconds
    t = torch.tensor([seconds], dtype=torch.float64, device=device)   # NCCL: on the GPU
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def sweep(ops: tuple[str, ...], sizes: list[int], iters: int = 20, warmup: int = 5,
          dtype: torch.dtype = torch.float32) -> list[dict[str, Any]]:
    """Every (op, size) on the initialised process group: one record each, the same on every rank
    (the slowest rank's time)."""
    if not dist.is_initialized():
        raise RuntimeError("sweep: initialise a process group first (run_world, or torchrun)")
    p = dist.get_world_size()
    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend() == "nccl" else torch.device("cpu"))
    records = []
    for op in ops:
        if op == "reduce_scatter" and dist.get_backend() == "gloo":
            continue  # gloo has no reduce-scatter of tensors
        for nbytes in sizes:
            fn = collective(op, nbytes, p, device, dtype)
            seconds = slowest_time(fn, device, iters, warmup)
            algbw = algorithm_bandwidth(nbytes, seconds)
            records.append({"op": op, "bytes": nbytes, "world_size": p, "seconds": seconds,
                            "algbw": algbw, "busbw": bus_bandwidth(algbw, op, p)})
    return records


def fit_records(records: list[dict[str, Any]], op: str) -> dict[str, Any]:
    """The alpha-beta fit of one op's sweep and its worst relative error over the whole range; a
    sweep too noisy to fit (times that do not grow with the size: a short CPU dry run) says so."""
    rows = [r for r in records if r["op"] == op]
    try:
        fit = fit_alpha_beta([r["bytes"] for r in rows], [r["seconds"] for r in rows])
    except ValueError as e:
        return {"op": op, "error": str(e)}
    return {"op": op, "alpha_s": fit.alpha_s, "beta_bytes_per_s": fit.beta_bytes_per_s,
            "max_rel_error": max(abs(e) for e in fit.rel_errors)}


def topology() -> str | None:
    """``nvidia-smi topo -m``, or None without nvidia-smi."""
    try:
        return subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                              check=True, timeout=30).stdout
    except Exception:  # no nvidia-smi (a CPU run)
        return None


def provenance(backend: str, p: int) -> dict[str, Any]:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() and backend == "nccl" else None
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if gpu else None
    return {"backend": backend, "world_size": p, "gpu": gpu, "torch": torch.__version__,
            "nccl": nccl,
            "python": platform.python_version(), "topology": topology() if gpu else None,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _rank_main(rank: int, world_size: int, ops, sizes, iters, warmup) -> dict[str, Any]:
    records = sweep(tuple(ops), sizes, iters, warmup)
    fits = [fit_records(records, op) for op in ops if any(r["op"] == op for r in records)]
    return {"provenance": provenance(dist.get_backend(), world_size), "records": records,
            "fits": fits}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, help="spawn this many processes here (without torchrun)")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--min-bytes", type=int, default=1024)
    ap.add_argument("--max-bytes", type=int, default=1 << 30)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    ops = [o for o in args.ops.split(",") if o]
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        raise SystemExit(f"unknown op(s) {unknown}; known: {', '.join(OPS)}")
    sizes = sizes_between(args.min_bytes, args.max_bytes)
    if args.world:
        from snippets.part7.launch import run_world

        result = run_world(_rank_main, args.world, ops, sizes, args.iters, args.warmup,
                           timeout_s=3600)[0]
    else:
        from snippets.part7.launch import init_from_env

        rank, world = init_from_env(timeout_s=3600)
        result = _rank_main(rank, world, ops, sizes, args.iters, args.warmup)
        dist.destroy_process_group()
        if rank != 0:
            return 0
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    for fit in result["fits"]:
        if "error" in fit:
            print(f"{fit['op']}: {fit['error']}")
            continue
        alpha_us, beta_gbs = fit["alpha_s"] * 1e6, fit["beta_bytes_per_s"] / 1e9
        print(f"{fit['op']}: alpha {alpha_us:.2f} us, beta {beta_gbs:.2f} GB/s, "
              f"worst relative error {100 * fit['max_rel_error']:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
