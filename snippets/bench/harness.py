"""``python -m snippets bench``: check every implementation against its reference, then time it, on
this GPU.

The ceilings the results are compared against (copy bandwidth, cuBLAS GEMM rates) are measured in
the same run, on the same GPU. Results are merged into ``benchmarks/results/<gpu>.json`` one op at a
time: an op's entry is replaced whole, so every number of one op comes from one run, next to the
ceiling measured in that run.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import re
import subprocess
import time
from pathlib import Path
from typing import Any, Iterable

import torch

from snippets.bench.timing import Timing, rotation, time_device, time_host
from snippets.registry import CEILING_MEASURES, REPO_ROOT, Impl, Op, dtype_name, load_all, size_key

RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
SCHEMA = 1


def slug(gpu_name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3': the results file's name."""
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # not installed, or no version attribute
        return None


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
    except Exception:  # no git, or not a checkout
        return None


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True, timeout=20).stdout
        return out.strip().splitlines()[0]
    except Exception:  # nvidia-smi missing
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance() -> dict[str, Any]:
    """Where and with what a measurement was taken."""
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "compute_capability": f"{props.major}.{props.minor}",
        "memory_bytes": props.total_memory,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "driver": _driver_version(),
        "cuda_runtime": torch.version.cuda,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "cupy": _version("cupy"),
        "numpy": _version("numpy"),
        "python": platform.python_version(),
        "cpu": _cpu_model(),  # the host side of CPU-vs-GPU comparisons
        "cpu_threads": torch.get_num_threads(),
        # A copy of the tree on a GPU runner passes the commit in KM_COMMIT (and KM_DIRTY=0|1); it
        # wins over git, because such a copy may carry a .git that is not the tree's own.
        "commit": os.environ.get("KM_COMMIT") or _git("rev-parse", "HEAD"),
        "dirty": os.environ.get("KM_DIRTY") == "1" if os.environ.get("KM_COMMIT")
        else bool(_git("status", "--porcelain", "--untracked-files=no")),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        # The timers' own source: a change of method (not of any kernel) shows up here.
        "timing_source": hashlib.sha256(
            (REPO_ROOT / "snippets/bench/timing.py").read_bytes()).hexdigest()[:16],
    }


# --8<-- [start:ceilings]
def measure_ceilings(quick: bool = False, extra: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """The ceilings of this GPU, measured now: copy bandwidth and cuBLAS GEMM rates, plus any
    ``extra`` ceilings registered by op modules (``register_ceiling``)."""
    out: dict[str, dict[str, Any]] = {}
    n = 2**28  # 1 GiB of fp32 each way: far beyond L2
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    t = time_device(lambda: dst.copy_(src), [()], budget_ms=300)  # noqa: F821
    out["copy"] = {"value": 2 * src.nbytes / (t.median * 1e-3) / 1e9, "unit": "GB/s",
                   "how": f"dst.copy_(src), {src.nbytes >> 20} MiB fp32, bytes read + written"}
    del src, dst

    m = 4096 if quick else 8192
    for name, dtype, tf32 in (("gemm_fp32", torch.float32, False),
                              ("gemm_tf32", torch.float32, True),
                              ("gemm_fp16", torch.float16, False),
                              ("gemm_bf16", torch.bfloat16, False)):
        a = torch.randn(m, m, device="cuda", dtype=dtype)
        b = torch.randn(m, m, device="cuda", dtype=dtype)
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            t = time_device(torch.matmul, [(a, b)], budget_ms=400)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
        out[name] = {"value": 2 * m**3 / (t.median * 1e-3) / 1e12, "unit": "TFLOP/s",
                     "how": (f"torch.matmul {m}x{m}x{m} {dtype_name(dtype)}"
                             + (" (TF32)" if tf32 else ""))}
    for name in extra:
        out[name] = CEILING_MEASURES[name](quick)
    return out
# --8<-- [end:ceilings]


# --8<-- [start:check]
def check_impl(op: Op, impl: Impl, args: tuple, dtype: torch.dtype,
               size: dict | None = None) -> float:
    """Run ``impl`` once and compare it with the reference computed in float64; raise if they
    differ (``compare_outputs``, the comparison the tests use too). An op with its own ``check``
    (random outputs) is checked by it instead, and reports an error of 0. ``size``: the size
    ``args`` were made for (a GEMM's tolerance grows with K). Returns the largest absolute
    error."""
    if op.check is not None:
        op.check(impl.fn(*args), args, dtype)
        return 0.0
    # first: some versions (Liger) write results over their inputs
    refs = op.reference_fp64(args)
    return compare_outputs(op, impl.name, impl.fn(*args), refs, dtype, size)


def compare_outputs(op: Op, name: str, out, ref, dtype: torch.dtype, size: dict | None = None,
                    check_dtype: bool = False) -> float:
    """An implementation's output against the float64 reference: the one comparison of the
    harness and the tests. A tuple (a backward pass: dx, dw, db) is compared part by part: the
    number of parts, then each part's dtype (``check_dtype``: the op's output dtype), shape, no
    NaN where the reference has none (outputs are poisoned with NaN in the tests, so a NaN is an
    element never written), and the values within the op's tolerance at ``size``. Raises
    ``AssertionError`` naming the first element off; returns the largest absolute error."""
    outs, refs = as_tuple(out), as_tuple(ref)
    if len(outs) != len(refs):
        raise AssertionError(f"{op.name} {name}: {len(outs)} outputs, reference has {len(refs)}")
    rtol, atol = op.tolerance(dtype, size)
    worst = 0.0
    for i, (o, r) in enumerate(zip(outs, refs)):
        r = r.to(torch.float64)  # integer results (indices, checksums) compare exactly
        part = f" output {i}" if len(refs) > 1 else ""
        what = f"{op.name} {name} {dtype_name(dtype)}{part}"
        if check_dtype and o.dtype != op.output_dtype(dtype):
            want = op.output_dtype(dtype)
            raise AssertionError(f"{what}: output dtype {o.dtype}, expected {want}")
        o64 = o.to(device=r.device, dtype=torch.float64)
        if o64.shape != r.shape:
            raise AssertionError(f"{what}: shape {tuple(o64.shape)}, "
                                 f"reference {tuple(r.shape)}")
        if o64.isnan().any() and not r.isnan().any():
            first = tuple(o64.isnan().nonzero()[0].tolist())
            raise AssertionError(f"{what}: NaN outputs, the first at {first} (unwritten elements?)")
        if not torch.allclose(o64, r, rtol=rtol, atol=atol, equal_nan=True):
            diff = (o64 - r).abs().nan_to_num(float("inf"))
            off = (diff > atol + rtol * r.abs()).nonzero()
            at = tuple(off[0].tolist()) if len(off) else ()
            raise AssertionError(
                f"{what}: max abs error {diff.max().item():.3g} exceeds rtol={rtol}, atol={atol}; "
                f"{len(off)} of {r.numel()} elements off, the first at index {at}: "
                f"got {o64[at].item():.6g}, expected {r[at].item():.6g}")
        if r.numel():
            worst = max(worst, (o64 - r).abs().max().item())
    return worst


def as_tuple(x) -> tuple:
    """An op's output as a tuple of tensors (most ops return one tensor)."""
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)
# --8<-- [end:check]


def _sizes(op: Op, quick: bool) -> list[dict]:
    sizes = [dict(op.headline)]
    if not quick:
        sizes += [dict(s) for s in op.sweep if size_key(s) != size_key(op.headline)]
    return sizes


def plan(ops: Iterable[Op], quick: bool) -> list[tuple[Op, torch.dtype, dict, Impl]]:
    """Every (op, dtype, size, implementation) the run will time, in order."""
    jobs = []
    for op in ops:
        for dtype in op.timed_dtypes():
            for size in _sizes(op, quick):
                for impl in op.impls.values():
                    if (impl.supports(dtype) and (impl.runs_on("cuda") or impl.runs_on("cpu"))
                            and impl.benched_at(size, op.headline) and impl.unavailable() is None):
                        jobs.append((op, dtype, size, impl))
    return jobs


def run_job(op: Op, dtype: torch.dtype, size: dict, impl: Impl, l2_bytes: int,
            seed: int = 0) -> dict:
    """Check, then time, one implementation at one size; returns its record (without the
    derived rates)."""
    run_on = "cuda" if impl.runs_on("cuda") else "cpu"
    gen = torch.Generator().manual_seed(seed)
    ws = op.bytes_moved(size, dtype)
    sets, flush = rotation(ws, l2_bytes) if impl.timer == "device" else (1, False)
    arg_sets = [op.make_inputs(size, dtype, impl.input_device(run_on), gen) for _ in range(sets)]
    err = check_impl(op, impl, arg_sets[0], dtype, size)
    if impl.timer == "device":
        flush_buf = torch.empty(2 * l2_bytes // 4, device="cuda") if flush else None
        t = time_device(impl.fn, arg_sets, flush=flush_buf)
    else:
        t = time_host(impl.fn, arg_sets)
    rec = {"impl": impl.name, "lang": impl.lang, "desc": impl.desc, "dtype": dtype_name(dtype),
            "size": size, "size_key": size_key(size),
            "headline": size_key(size) == size_key(op.headline), "ms": t.median, "ms_p10": t.p10,
            "ms_p90": t.p90, "reps": t.reps, "input_sets": sets, "l2_flush": flush,
            "timer": impl.timer, "max_abs_err": err, "source_hash": impl.source_hash()}
    if op.measure_memory and run_on == "cuda":
        rec["peak_extra_bytes"] = peak_extra_bytes(impl.fn, arg_sets[0])
    return rec


# --8<-- [start:peak_memory]
def peak_extra_bytes(fn, args: tuple) -> int:
    """The most device memory one call of ``fn(*args)`` holds at once beyond what was allocated
    before it (its inputs): temporaries, saved activations and the outputs. From the caching
    allocator's statistics, so it counts tensors torch allocates, not the allocator's
    reserved slack."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn(*args)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return int(peak)
# --8<-- [end:peak_memory]


def derive(op: Op, records: list[dict], ceiling_value: float | None) -> None:
    """Add the rate, the fraction of the ceiling and the speed-up over v0 to each record, in place.
    For a latency (ns/access) there is no ceiling: the fraction is None."""
    base = {(r["dtype"], r["size_key"]): r["ms"] for r in records if r["impl"] == "v0"}
    for r in records:
        dtype = getattr(torch, r["dtype"])
        r["value"] = op.rate(r["size"], dtype, r["ms"])
        r["unit"] = op.metric
        r["fraction_of_ceiling"] = r["value"] / ceiling_value if ceiling_value else None
        b = base.get((r["dtype"], r["size_key"]))
        r["speedup_vs_v0"] = b / r["ms"] if b else None


def merge(path: Path, gpu: str, entries: dict[str, dict], ceilings: dict) -> dict:
    """Merge op entries into a results file (an op's entry is replaced whole)."""
    data = json.loads(path.read_text()) if path.exists() else {"schema": SCHEMA, "gpu": gpu,
                                                               "ops": {}}
    if data.get("gpu") != gpu:
        raise ValueError(f"{path} holds results for {data.get('gpu')!r}, not {gpu!r}")
    data["schema"] = SCHEMA
    # this run's, and any only older runs measured
    data["ceilings"] = {**data.get("ceilings", {}), **ceilings}
    data["ops"].update(entries)
    data["ops"] = dict(sorted(data["ops"].items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    return data


def claim(claim_dir: Path | None, op_name: str) -> bool:
    """Take ``op_name`` for this process: with ``claim_dir`` (a folder shared by the bench processes of one
    machine, one per GPU), the first process to create ``<op>.claimed`` there measures the op and the others
    skip it; without, always True."""
    if claim_dir is None:
        return True
    claim_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(claim_dir / f"{op_name}.claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, f"{os.getpid()} {os.environ.get('CUDA_VISIBLE_DEVICES', '')}\n".encode())
    os.close(fd)
    return True


def stale_ops(ops: list[Op], gpu: str, *paths: Path) -> list[Op]:
    """The ops of ``ops`` that none of the results files at ``paths`` holds fresh for ``gpu`` (each lacks
    the op, is another GPU's, or an implementation's headline result is missing or was measured on other
    source: snippets.bench.report.stale_impls)."""
    from snippets.bench.report import stale_impls

    files = [data["ops"] for data in (json.loads(p.read_text()) for p in paths if p.exists())
             if data.get("gpu") == gpu]
    return [op for op in ops
            if all(op.name not in ent or stale_impls(op, ent[op.name]) for ent in files)]


def run(op_names: list[str], quick: bool = False, out: Path | None = None, console=None,
        stale_only: bool = False, claim_dir: Path | None = None) -> Path:
    """The ``bench`` command: measure ceilings, then every requested op; merge into the
    results file, one op at a time.

    ``stale_only``: only the ops that no results file of this GPU holds fresh (``out``, the committed
    one, and any other beside ``out``: the files of the other processes of an earlier run). ``claim_dir``: several bench
    processes (one per GPU of a machine, each with its own ``out``) split the ops between them, the
    op with the most jobs first; each takes the next op no other process has claimed (``claim``)."""
    from rich.console import Console

    if not torch.cuda.is_available():
        raise SystemExit("bench needs a CUDA GPU (torch.cuda.is_available() is False). The "
                         "committed results are in benchmarks/results/; `python -m snippets "
                         "report` summarises them.")
    console = console or Console()
    registry = load_all()
    unknown = [n for n in op_names if n not in registry]
    if unknown:
        raise SystemExit(
            f"unknown op(s) {', '.join(unknown)}; known: {', '.join(sorted(registry))}")
    ops = [registry[n] for n in (op_names or sorted(registry))]
    prov = provenance()
    l2 = prov["l2_bytes"] or 64 * 2**20
    path = out or RESULTS_DIR / f"{slug(prov['gpu'])}.json"
    if stale_only:  # fresh in the committed results, or in a results file beside --out, is fresh
        beside = sorted(path.parent.glob("*.json")) if out else []
        ops = stale_ops(ops, prov["gpu"], path, RESULTS_DIR / f"{slug(prov['gpu'])}.json", *beside)
        console.print(f"stale or missing in {path.name}: {', '.join(op.name for op in ops) or 'none'}")
    jobs = {op.name: [j for j in plan([op], quick)] for op in ops}
    if claim_dir is not None:  # the longest ops first, so the processes finish together
        ops.sort(key=lambda op: -len(jobs[op.name]))
    console.print(f"[bold]{prov['gpu']}[/], {prov['sm_count']} SMs, torch {prov['torch']}, "
                  f"triton {prov['triton']}, commit {str(prov['commit'])[:10]}")
    extra = sorted({op.ceiling for op in ops if op.ceiling in CEILING_MEASURES})
    with console.status("measuring ceilings"):
        ceilings = measure_ceilings(quick, extra)
    for k, c in ceilings.items():
        console.print(f"  ceiling {k}: {c['value']:.1f} {c['unit']} ({c['how']})")
    for op in ops:
        for impl in op.impls.values():
            if impl.unavailable():
                console.print(f"  [yellow]left out[/] {op.name} {impl.name}: {impl.unavailable()}")

    entries: dict[str, dict] = {}
    failures: list[str] = []
    for op in ops:
        if not claim(claim_dir, op.name):
            continue
        t0 = time.perf_counter()
        records: list[dict] = []
        for _, dtype, size, impl in jobs[op.name]:
            try:
                records.append(run_job(op, dtype, size, impl, l2))
                r = records[-1]
                console.print(f"  {op.name} {impl.name} {dtype_name(dtype)} {size_key(size)}: "
                              f"{r['ms']:.4f} ms ({r['reps']} reps)")
            except Exception as e:  # one failing version must not lose the rest of the run
                msg = (f"{op.name} {impl.name} {dtype_name(dtype)} {size_key(size)}: "
                       f"{type(e).__name__}: {e}")
                failures.append(msg)
                console.print(f"  [red]failed[/] {msg}")
            torch.cuda.empty_cache()
        # An op is written as soon as its jobs are done, so a run cut short keeps what it finished.
        ceiling = ceilings[op.ceiling] if op.ceiling else None
        derive(op, records, ceiling["value"] if ceiling else None)
        entries[op.name] = {"part": op.part, "title": op.title, "metric": op.metric,
                            "ceiling": {"name": op.ceiling, **ceiling} if ceiling else None,
                            "provenance": prov, "records": records}
        merge(path, prov["gpu"], {op.name: entries[op.name]}, ceilings)
        console.print(f"[bold]{op.name}[/]: {len(records)} of {len(jobs[op.name])} jobs in "
                      f"{time.perf_counter() - t0:.0f} s")
    ops = [op for op in ops if op.name in entries]
    _print_table(console, ops, entries)
    console.print(f"wrote {path}")
    if failures:
        raise SystemExit(f"bench: {len(failures)} job(s) failed (the rest were written):\n  "
                         + "\n  ".join(failures))
    return path


def _print_table(console, ops: list[Op], entries: dict) -> None:
    from rich.table import Table

    table = Table(title="headline sizes")
    for col in ("op", "impl", "lang", "dtype", "size", "time (ms)", "rate", "% ceiling", "vs v0"):
        table.add_column(col, justify="right" if col in ("time (ms)", "rate", "% ceiling",
                                                         "vs v0") else "left")
    for op in ops:
        for r in entries[op.name]["records"]:
            if not r["headline"]:
                continue
            sp = f"{r['speedup_vs_v0']:.3g}x" if r["speedup_vs_v0"] else "-"
            frac = (f"{100 * r['fraction_of_ceiling']:.1f}%"
                    if r["fraction_of_ceiling"] is not None else "-")
            table.add_row(op.name, r["impl"], r["lang"], r["dtype"], r["size_key"],
                          f"{r['ms']:.4f}", f"{r['value']:.1f} {r['unit']}", frac, sp)
    console.print(table)


__all__ = ["Timing", "check_impl", "claim", "derive", "measure_ceilings", "merge", "plan", "provenance",
           "run", "slug", "stale_ops"]
