"""A sweep of torch.distributed's collectives over message sizes: time, algorithm bandwidth and bus
bandwidth per size (NCCL's conventions, snippets.part7.cost), and the alpha-beta model fitted to it.

On GPUs (NCCL) this is what the multi-GPU measurements of Part 7 run; on a CPU (gloo) it is a dry
run of the same code. Run it on every rank:

    torchrun --nproc-per-node 4 -m snippets.part7.sweep --out sweep.json      # GPUs, NCCL
    python -m snippets.part7.sweep --world 2 --max-bytes 1048576 --out s.json  # CPU, gloo

Each size is timed over ``iters`` calls after ``warmup`` calls; every rank times the same calls
between barriers, and the slowest rank's time counts (a collective ends when its last rank does).
Each size is timed ``repeats`` times (separate runs of the same calls) and the median counts; the
record keeps every run, so a single noisy point shows as a spread.

Two timings (``--timing``), each a record of its own:

- ``eager``: the calls are issued back to back from Python. A call then also costs the host's work
  of issuing it (the Python call, the process group's bookkeeping, the launch); when that is longer
  than the transfer, the loop measures the host.
- ``graph``: the ``iters`` calls are captured once in a CUDA graph and the graph is replayed: the
  GPUs run the collectives back to back with no host in between, so the time is NCCL's own
  latency and bandwidth. GPUs only; a collective that cannot be captured is timed eagerly, and its
  record says why.

The alpha-beta model is fitted to the graph records where there are any: one line over the whole
sweep, and one line per range of sizes (``cost.fit_piecewise``, as NCCL models each protocol).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from snippets.part7.collectives import all_gather_tensor, reduce_scatter_tensor
from snippets.part7.cost import (
    algorithm_bandwidth,
    bus_bandwidth,
    fit_alpha_beta,
    fit_piecewise,
)

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
TIMINGS = ("eager", "graph")


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


# --8<-- [start:graph]
def capture(fn, iters: int) -> torch.cuda.CUDAGraph:
    """``iters`` calls of ``fn`` recorded in one CUDA graph. Nothing runs and no rank talks to
    another during the capture: the collectives' kernels are recorded, to run at each replay."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    return g


def replay_time(g: torch.cuda.CUDAGraph, device: torch.device, iters: int) -> float:
    """Seconds per captured call on this rank: one replay between barriers, divided by ``iters``.
    The GPUs run the calls back to back; the host only launches the graph."""
    if _grouped():
        dist.barrier()
    t0 = time.perf_counter()
    g.replay()
    _sync(device)
    return (time.perf_counter() - t0) / iters
# --8<-- [end:graph]


def slowest_time(fn, device: torch.device, iters: int, warmup: int, group=None) -> float:
    """``time_op`` on every rank, and the slowest rank's time: a collective, or a step of
    several ranks, ends when its last rank does. On one process without a group, its own."""
    return slowest(time_op(fn, device, iters, warmup, group), device, group)


def slowest(seconds: float, device: torch.device, group=None) -> float:
    """The largest of every rank's ``seconds`` (its own on one process without a group)."""
    if not _grouped():
        return seconds
    t = torch.tensor([seconds], dtype=torch.float64, device=device)   # NCCL: on the GPU
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def timed(fn, device: torch.device, iters: int, warmup: int, timing: str,
          repeats: int = 1) -> dict[str, Any]:
    """``repeats`` timed runs of ``fn`` (the slowest rank's time in each) with one timing:
    ``{"timing", "seconds" (the median run), "runs"}``.

    ``graph``: after ``warmup`` eager calls every rank captures ``iters`` calls, the ranks agree
    that every capture succeeded (before any replay, so no rank waits in a captured collective
    for a rank that has none), and each run is one replay. If a capture failed anywhere, the
    calls are timed eagerly and the record says why (``"timing": "eager"``, ``"graph_error"``)."""
    if timing not in TIMINGS:
        raise ValueError(f"timed: timing must be one of {TIMINGS}, got {timing!r}")
    out: dict[str, Any] = {"timing": timing}
    if timing == "graph":
        if device.type != "cuda":
            raise ValueError(f"timed: graph timing needs a CUDA device, got {device}")
        for _ in range(warmup):
            fn()   # eager first: NCCL sets up its communicator and buffers outside the capture
        _sync(device)
        try:
            g, error = capture(fn, iters), None
        except Exception as exc:  # noqa: BLE001 - not every collective can be captured
            g, error = None, f"{type(exc).__name__}: {exc}"[:300]
            torch.cuda.synchronize(device)
        ok = torch.tensor([0.0 if g is None else 1.0], device=device)
        if _grouped():
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if ok.item() == 1.0:
            g.replay()   # untimed: the first replay uploads the graph
            _sync(device)
            runs = [slowest(replay_time(g, device, iters), device) for _ in range(repeats)]
            return {**out, "seconds": float(np.median(runs)), "runs": runs}
        out.update(timing="eager", graph_error=error or "the capture failed on another rank")
    runs = [slowest_time(fn, device, iters, warmup) for _ in range(repeats)]
    return {**out, "seconds": float(np.median(runs)), "runs": runs}


def sweep(ops: tuple[str, ...], sizes: list[int], iters: int = 20, warmup: int = 5,
          dtype: torch.dtype = torch.float32, timings: tuple[str, ...] = ("eager",),
          repeats: int = 1) -> list[dict[str, Any]]:
    """Every (op, size, timing) on the initialised process group: one record each, the same on
    every rank (the slowest rank's time). Graph timing needs GPUs: on gloo it is left out."""
    if not dist.is_initialized():
        raise RuntimeError("sweep: initialise a process group first (run_world, or torchrun)")
    if not (isinstance(repeats, int) and repeats >= 1):
        raise ValueError(f"sweep: repeats must be an int >= 1, got {repeats!r}")
    bad = [t for t in timings if t not in TIMINGS]
    if bad or not timings:
        raise ValueError(f"sweep: timings must be some of {TIMINGS}, got {timings!r}")
    p = dist.get_world_size()
    nccl = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    timings = tuple(t for t in timings if nccl or t != "graph") or ("eager",)
    records = []
    for op in ops:
        if op == "reduce_scatter" and not nccl:
            continue  # gloo has no reduce-scatter of tensors
        for nbytes in sizes:
            fn = collective(op, nbytes, p, device, dtype)
            for timing in timings:
                t = timed(fn, device, iters, warmup, timing, repeats)
                algbw = algorithm_bandwidth(nbytes, t["seconds"])
                records.append({"op": op, "bytes": nbytes, "world_size": p, **t,
                                "algbw": algbw, "busbw": bus_bandwidth(algbw, op, p)})
    return records


def fitted_rows(records: list[dict[str, Any]], op: str) -> list[dict[str, Any]]:
    """The records of ``op`` the model is fitted to: the graph-timed ones where there are any
    (the GPUs' own cost), else the eager ones (records without a timing are eager)."""
    rows = [r for r in records if r["op"] == op]
    graph = [r for r in rows if r.get("timing") == "graph"]
    return graph or [r for r in rows if r.get("timing", "eager") == "eager"]


def fit_records(records: list[dict[str, Any]], op: str) -> dict[str, Any]:
    """The alpha-beta fits of one op's sweep and their worst relative errors over the whole range:
    one line, and one line per range of sizes (at most 3 ranges of at least 3 sizes); a sweep too
    noisy to fit (times that do not grow with the size: a short CPU dry run) says so."""
    rows = fitted_rows(records, op)
    timing = rows[0].get("timing", "eager") if rows else "eager"
    sizes, times = [r["bytes"] for r in rows], [r["seconds"] for r in rows]
    try:
        fit = fit_alpha_beta(sizes, times)
    except ValueError as e:
        return {"op": op, "timing": timing, "error": str(e)}
    out = {"op": op, "timing": timing, "alpha_s": fit.alpha_s,
           "beta_bytes_per_s": fit.beta_bytes_per_s,
           "max_rel_error": max(abs(e) for e in fit.rel_errors)}
    if len(rows) >= 3:
        pw = fit_piecewise(sizes, times, max_pieces=3, min_points=3)
        out["pieces"] = [p._asdict() for p in pw.pieces]
        out["pieces_max_rel_error"] = max(abs(e) for e in pw.rel_errors)
    return out


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


def _rank_main(rank: int, world_size: int, ops, sizes, iters, warmup, timings=("eager",),
               repeats=1) -> dict[str, Any]:
    records = sweep(tuple(ops), sizes, iters, warmup, timings=tuple(timings), repeats=repeats)
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
    ap.add_argument("--repeats", type=int, default=3, help="separate timed runs per size")
    ap.add_argument("--timing", default="eager,graph",
                    help="eager, graph or both (comma-separated); graph needs GPUs")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    ops = [o for o in args.ops.split(",") if o]
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        raise SystemExit(f"unknown op(s) {unknown}; known: {', '.join(OPS)}")
    timings = [t for t in args.timing.split(",") if t]
    if not timings or any(t not in TIMINGS for t in timings):
        raise SystemExit(f"unknown timing in {args.timing!r}; known: {', '.join(TIMINGS)}")
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be >= 1, got {args.repeats}")
    sizes = sizes_between(args.min_bytes, args.max_bytes)
    if args.world:
        from snippets.part7.launch import run_world

        result = run_world(_rank_main, args.world, ops, sizes, args.iters, args.warmup, timings,
                           args.repeats, timeout_s=3600)[0]
    else:
        from snippets.part7.launch import init_from_env

        rank, world = init_from_env(timeout_s=3600)
        result = _rank_main(rank, world, ops, sizes, args.iters, args.warmup, timings, args.repeats)
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
        ranges = (f"; per range {100 * fit['pieces_max_rel_error']:.1f}%" if "pieces" in fit
                  else "")
        print(f"{fit['op']} ({fit['timing']}): alpha {alpha_us:.2f} us, beta {beta_gbs:.2f} GB/s, "
              f"worst relative error {100 * fit['max_rel_error']:.1f}%{ranges}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
