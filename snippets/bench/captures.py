"""What produced each captured output, and whether the current code still would: the staleness of captures.

A capture is a file the GPU runner writes and the book shows: a program's output, a compiler report, an Nsight
Compute report, a profiler table, generated Inductor code, a trace, a sweep, the GPU test summary. It is committed
as ``benchmarks/results/outputs/<gpu>/NAME.EXT`` next to a sidecar, ``NAME.meta.json``, that records the hash of
the code that produced it (``snippets.hashing.derived_hash``):

- the capture scripts (shell or Python: what a step runs is in them), and for a Python script the import closure
  of the ``snippets`` modules it imports;
- the ``snippets`` modules it runs without importing them by name (``PRODUCERS``);
- the CUDA files it compiles itself, with their headers;
- the source hash of every registered version it runs through the registry (Nsight Compute targets, the
  profiler's workload), as ``Impl.source_hash`` computes it.

A capture is *fresh* while that hash is unchanged, *stale* once it differs (or when the record says the capture
was taken before captures were hashed: ``"source_hash": null``), and has *no provenance* without a sidecar. The
site marks the last two as it marks a stale result, and ``python -m snippets report`` lists them.

The capture scripts write the sidecar after each file (``record``); from a shell::

    python -m snippets.bench.captures record OUTDIR/ptxas_spill.txt [--param targets="a b"]
    python -m snippets.bench.captures status [RESULTS_DIR]              # every capture and its state
    python -m snippets.bench.captures merge-tests OUT1/outputs/gpu_tests.txt OUT2/... -o FILE
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from snippets.hashing import REPO_ROOT, derived_hash, imports_of

RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
META_SUFFIX = ".meta.json"
SCHEMA = 1
# What a record of a capture taken before captures were hashed says (its "source_hash" is null).
UNHASHED = "produced before captures were hashed"


@dataclass(frozen=True)
class Producer:
    """The code that writes one capture. ``scripts`` and ``files`` are paths relative to the repository; ``impls``
    gives the (op, version) pairs it runs through the registry, from the record's ``params``."""

    scripts: tuple[str, ...]
    modules: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    impls: Callable[[dict], list[tuple[str, str]]] | None = None


def _mma_power_impls(params: dict) -> list[tuple[str, str]]:
    """The kernels scripts/capture_mma_power.py runs (its KERNELS)."""
    return [("mma_rate", "v1"), ("mma_rate", "v2"), ("wmma_gemm", "v0"), ("wmma_gemm", "v7")]


def _ncu_target(name: str) -> Callable[[dict], list[tuple[str, str]]]:
    def impls(params: dict) -> list[tuple[str, str]]:
        from snippets.part3.profiling import NCU_TARGETS

        t = NCU_TARGETS[name]
        return [(t.op, t.version)]
    return impls


def _ncu_summary(params: dict) -> list[tuple[str, str]]:
    """The targets whose reports the summary was built from (``params["targets"]``, default all of them)."""
    from snippets.part3.profiling import NCU_TARGETS

    names = str(params.get("targets") or " ".join(NCU_TARGETS)).split()
    return [(NCU_TARGETS[n].op, NCU_TARGETS[n].version) for n in names if n in NCU_TARGETS]


def _profiler_workload(params: dict) -> list[tuple[str, str]]:
    from snippets.part3.profiling import workload_labels

    return [(op, v) for _, op, v in workload_labels("cuda")]


def _param_impls(params: dict) -> list[tuple[str, str]]:
    """The (op, version) pairs a capture ran, as its script recorded them: ``params["impls"]``,
    ``"op:version op:version ..."`` (scripts/capture_ncu_counters.sh)."""
    pairs = [item.split(":", 1) for item in str(params.get("impls") or "").split()]
    return [(op, version) for op, version in pairs]


def _stream_overlap(params: dict) -> list[tuple[str, str]]:
    return [("stream_overlap", "v0"), ("stream_overlap", "v3")]


def _capstone_decode(params: dict) -> list[tuple[str, str]]:
    return [("capstone_decode", "v2"), ("capstone_decode", "v3")]


PROGRAMS = "tests/test_cuda_programs.py"  # builds and runs Part 1's programs, saves their output (KM_OUTPUT_DIR)
OUTPUTS = "scripts/capture_outputs.sh"
PROFILES = ("scripts/capture_profiles.sh", "scripts/profile_kernels.py")
STREAMS = ("scripts/capture_streams.sh", "scripts/capture_streams.py")
NCU_COUNTERS = ("scripts/capture_ncu_counters.sh", "scripts/ncu_counters.py")
NSYS_STREAMS = ("scripts/capture_nsys.sh", "scripts/nsys_streams.py")
NSYS_CAPSTONE = (*NSYS_STREAMS, "scripts/nsys_capstone.py")  # nsys_capstone.py imports nsys_streams.py
# scripts/capture_triton.py imports these by name (importlib), not with an import statement
TRITON_METADATA_MODULES = ("snippets.part1.elementwise", "snippets.part3.reduce", "snippets.part3.wmma",
                           "snippets.part4.softmax", "snippets.part4.layernorm", "snippets.part4.matmul",
                           "snippets.part4.dropout", "snippets.common.introspect", "snippets.part4.debugging",
                           "snippets.common.gemm")

PRODUCERS: dict[str, Producer] = {
    "device_query": Producer((PROGRAMS,), files=("csrc/part1/device_query.cu",)),
    "hello": Producer((PROGRAMS,), files=("csrc/part1/hello.cu",)),
    "vector_add": Producer((PROGRAMS,), files=("csrc/part1/vector_add_main.cu",)),
    "ptxas_spill": Producer((OUTPUTS,), files=("csrc/part2/spill.cu",)),
    "ncu_banks": Producer((OUTPUTS, "scripts/profile_banks.py")),
    "unified_memory": Producer((OUTPUTS,), modules=("snippets.part2.host_transfer",)),
    "timing_pitfalls": Producer((OUTPUTS, "scripts/capture_timing_pitfalls.py")),
    "torch_profiler": Producer(PROFILES, impls=_profiler_workload),
    "sanitizer_memcheck": Producer(PROFILES, files=("csrc/part3/planted_bugs.cu",)),
    "sanitizer_racecheck": Producer(PROFILES, files=("csrc/part3/planted_bugs.cu",)),
    # its own script: adding it to capture_profiles.sh would have staled every capture that script wrote
    "cuda_gdb_oob": Producer(("scripts/capture_cuda_gdb.sh", "scripts/cuda_gdb_oob.gdb"),
                             files=("csrc/part3/planted_bugs.cu",)),
    "stream_overlap": Producer(STREAMS),
    "launch_latency": Producer(STREAMS),
    "triton_metadata": Producer(("scripts/capture_triton.py",), modules=TRITON_METADATA_MODULES),
    "dropout_memory": Producer(("scripts/capture_dropout_memory.py",)),
    # one training step, allocation by allocation (Part 2: torch.cuda.memory._record_memory_history)
    "memory_timeline": Producer(("scripts/capture_memory_timeline.py",)),
    "autotune_matmul": Producer(("scripts/capture_autotune.py",)),
    "matmul_shapes": Producer(("scripts/capture_matmul_shapes.py",)),
    "linear_ce_chunks": Producer(("scripts/capture_linear_ce_chunks.py",)),
    "mma_power": Producer(("scripts/capture_mma_power.py",), impls=_mma_power_impls),
    # Nsight Compute counters behind measured puzzles, one table per group (its own script: adding
    # them to capture_profiles.sh would have staled every capture that script wrote)
    "ncu_counters_transpose": Producer(NCU_COUNTERS, impls=_param_impls),
    "ncu_counters_reduce": Producer(NCU_COUNTERS, impls=_param_impls),
    "ncu_counters_strided": Producer(NCU_COUNTERS, impls=_param_impls),
    "ncu_counters_hopper": Producer(NCU_COUNTERS, impls=_param_impls),
    "ncu_counters_gemms": Producer(NCU_COUNTERS, impls=_param_impls),
    "ncu_counters_rows": Producer(NCU_COUNTERS, impls=_param_impls),
    "ncu_counters_attention": Producer(NCU_COUNTERS, impls=_param_impls),
    "ncu_counters_attention64": Producer(NCU_COUNTERS, impls=_param_impls),
    "ncu_counters_int4": Producer(NCU_COUNTERS, impls=_param_impls),
    "cublas_sgemm": Producer(("scripts/capture_cublas.sh",), files=("csrc/standalone/cublas_sgemm.cu",)),
    "nsys_stream_overlap": Producer(NSYS_STREAMS, impls=_stream_overlap),
    "nsys_capstone_decode": Producer(NSYS_CAPSTONE, impls=_capstone_decode),
}
GPU_TESTS = "gpu_tests"  # the GPU test suite's summary (scripts/gpu_tests.sh): it ran everything


def producer(name: str, root: Path = REPO_ROOT) -> Producer | None:
    """The code that writes capture ``name`` (a file stem), or None for a name no capture script writes."""
    if name in PRODUCERS:
        return PRODUCERS[name]
    if name.startswith("inductor_"):
        return Producer(("scripts/capture_inductor.py",))
    if name.startswith("capstone_"):  # Part 8's decode-step profiles
        return Producer(("scripts/capture_part8.sh",), modules=("snippets.part8.capstone",))
    if name.startswith("ncu_summary"):  # KM_NCU_SUMMARY may name it ncu_summary_part5
        return Producer(PROFILES, impls=_ncu_summary)
    if name.startswith("ncu_"):
        from snippets.part3.profiling import NCU_TARGETS

        if name[4:] in NCU_TARGETS:
            return Producer(PROFILES, impls=_ncu_target(name[4:]))
    if name == GPU_TESTS:
        tests = sorted(p.relative_to(root).as_posix() for p in (root / "tests").glob("*.py"))
        mods = sorted(".".join(p.relative_to(root).with_suffix("").parts)
                      for p in (root / "snippets").rglob("*.py") if p.name != "__init__.py")
        csrc = sorted(p.relative_to(root).as_posix() for p in (root / "csrc").rglob("*")
                      if p.suffix in (".cu", ".cuh", ".h"))
        # what the tests read or run without importing it: the exercises' stubs, solutions, planted
        # variants and CUDA files (test_exercises checks them all), the scripts tests run as
        # subprocesses (capture scripts, mutate.py, exercise_table.py), and pytest's configuration
        data = sorted(p.relative_to(root).as_posix() for d in ("exercises", "scripts")
                      for p in (root / d).rglob("*")
                      if p.is_file() and p.suffix in (".py", ".sh", ".cu", ".cuh", ".h", ".json"))
        return Producer(("scripts/gpu_tests.sh", "conftest.py", *tests), modules=tuple(mods),
                        files=(*csrc, *data, "pyproject.toml"))
    return None


def capture_hash(name: str, params: dict | None = None, root: Path = REPO_ROOT) -> str | None:
    """The hash of the code that writes capture ``name`` in the tree at ``root``; None without a producer."""
    prod = producer(name, root)
    if prod is None:
        return None
    paths = [root / p for p in (*prod.scripts, *prod.files)]
    modules = set(prod.modules)
    for p in paths:
        if p.suffix == ".py" and p.is_file():
            modules.update(imports_of(p))
    # this module writes the record after the capture; it produces nothing the capture shows (as the hash
    # function leaves itself out of what it hashes)
    modules = {m for m in modules if m != "snippets.bench.captures" and not m.startswith("snippets.bench.captures.")}
    names = []
    if prod.impls is not None:
        from snippets.op_index import load_all

        ops = load_all()
        for op, version in prod.impls(params or {}):
            impl = ops[op].impls.get(version) if op in ops else None
            names.append(f"impl {op}:{version} " + (impl.source_hash(root) if impl else "gone"))
    return derived_hash(sorted(modules), paths, names, root)


def meta_path(path: Path) -> Path:
    """The sidecar of a captured file: ``NAME.meta.json`` next to ``NAME.txt`` (or ``NAME.json``)."""
    return path.with_name(path.name.split(".", 1)[0] + META_SUFFIX)


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True,
                              timeout=10).stdout.strip()
    except Exception:  # no git, or not a checkout
        return None


def _commit() -> tuple[str | None, bool | None]:
    """(commit, uncommitted changes): KM_COMMIT and KM_DIRTY win, as for results (a copy of the tree on a GPU
    runner may carry a .git that is not its own)."""
    if os.environ.get("KM_COMMIT"):
        return os.environ["KM_COMMIT"], os.environ.get("KM_DIRTY") == "1"
    status = _git("status", "--porcelain", "--untracked-files=no")
    return _git("rev-parse", "HEAD"), (bool(status) if status is not None else None)


def record(path: Path, params: dict | None = None, root: Path = REPO_ROOT) -> Path:
    """Write the sidecar of the captured file ``path``: the hash of the code that produced it (computed now, from
    the tree at ``root``, which is the tree that just ran), the commit and the date. Returns the sidecar's path."""
    path = Path(path)
    name = path.name.split(".", 1)[0]
    prod = producer(name, root)
    if prod is None:
        raise ValueError(f"no producer is declared for capture {name!r}: add it to snippets.bench.captures")
    commit, dirty = _commit()
    meta = {"schema": SCHEMA, "name": name, "file": path.name,
            "source_hash": capture_hash(name, params, root), "producer": list(prod.scripts),
            "params": params or {}, "commit": commit, "dirty": dirty,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    out = meta_path(path)
    out.write_text(json.dumps(meta, indent=1) + "\n")
    return out


@dataclass(frozen=True)
class Status:
    """A captured file's state: ``"fresh"``, ``"stale"``, ``"no provenance"`` or (a GPU suite summary that lacks
    some of its run's shards) ``"partial"``, and why in words."""

    gpu: str
    name: str
    file: str
    state: str
    why: str
    recorded: str | None = None
    current: str | None = None
    commit: str | None = None
    date: str | None = None

    @property
    def fresh(self) -> bool:
        return self.state == "fresh"


def status(path: Path, root: Path = REPO_ROOT) -> Status:
    """Whether the captured file ``path`` (``.../outputs/<gpu>/NAME.EXT``) is what the current code produces."""
    path = Path(path)
    name = path.name.split(".", 1)[0]
    base = dict(gpu=path.parent.name, name=name, file=path.name)
    side = meta_path(path)
    if not side.is_file():
        return Status(**base, state="no provenance", why="no record of the code that produced it")
    meta = json.loads(side.read_text())
    base.update(commit=meta.get("commit"), date=meta.get("date"))
    recorded = meta.get("source_hash")
    if recorded is None:
        return Status(**base, state="stale", why=meta.get("note") or UNHASHED)
    current = capture_hash(name, meta.get("params"), root)
    if current is None:
        return Status(**base, state="stale", why="no capture script produces it any more", recorded=recorded)
    if current != recorded:
        return Status(**base, state="stale", recorded=recorded, current=current,
                      why="the code that produced it has changed since it was captured")
    if name == GPU_TESTS:
        missing = missing_shards(path.read_text())
        if missing:
            return Status(**base, state="partial", recorded=recorded, current=current,
                          why=f"shard {', '.join(f'{i}/{n}' for i, n in missing)} of the run did not run")
    return Status(**base, state="fresh", why="", recorded=recorded, current=current)


SHARD_LINE = re.compile(r"^GPU tests .*, shard (\d+)/(\d+) of (\d+) jobs", re.MULTILINE)


def missing_shards(summary: str) -> list[tuple[int, int]]:
    """The shards of a GPU suite summary's main run (its header with the most jobs) that it lacks: a summary of
    shard 1/2 alone is not the whole suite. Extra headers of fewer jobs are re-runs of single jobs."""
    runs: dict[tuple[int, int], set[int]] = {}
    for i, n, jobs in SHARD_LINE.findall(summary):
        runs.setdefault((int(jobs), int(n)), set()).add(int(i))
    if not runs:
        return []
    jobs, n = max(runs)
    return [(i, n) for i in range(1, n + 1) if i not in runs[(jobs, n)]]


def captured_files(results_dir: Path = RESULTS_DIR) -> list[Path]:
    """Every captured file under ``results_dir/outputs/<gpu>/`` (sidecars left out), sorted."""
    return sorted(p for p in (Path(results_dir) / "outputs").glob("*/*")
                  if p.is_file() and not p.name.endswith(META_SUFFIX))


def stale_captures(results_dir: Path = RESULTS_DIR, root: Path = REPO_ROOT) -> list[dict]:
    """One record per captured file that is not fresh (stale, or without provenance), for the report."""
    out = []
    for path in captured_files(results_dir):
        s = status(path, root)
        if not s.fresh:
            out.append({"gpu": s.gpu, "name": s.name, "file": s.file, "state": s.state, "why": s.why,
                        "recorded_hash": s.recorded, "current_hash": s.current, "commit": s.commit,
                        "date": s.date})
    return out


def merge_tests(parts: list[Path], out: Path) -> Path:
    """One ``gpu_tests.txt`` from the summaries of several shards of one run (scripts/gpu_tests.sh KM_SHARD=i/n,
    one device call each), with one sidecar: the shards' common hash, or null if they ran different code."""
    texts = [Path(p).read_text().rstrip("\n") for p in parts]
    metas = [json.loads(meta_path(Path(p)).read_text()) if meta_path(Path(p)).is_file() else {} for p in parts]
    hashes = {m.get("source_hash") for m in metas}
    commits = {m.get("commit") for m in metas}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n\n".join(texts) + "\n")
    common = hashes.pop() if len(hashes) == 1 else None
    # the summary's name, whatever the merged file is called until it is copied into place
    meta = {"schema": SCHEMA, "name": GPU_TESTS, "file": f"{GPU_TESTS}.txt", "source_hash": common,
            "producer": next((m["producer"] for m in metas if m.get("producer")), ["scripts/gpu_tests.sh"]),
            "params": {"shards": len(parts)},
            "commit": commits.pop() if len(commits) == 1 else None,
            "dirty": any(m.get("dirty") for m in metas),
            "date": max((m.get("date") or "" for m in metas), default="") or None}
    if common is None:
        meta["note"] = "the shards ran different code (or one has no record)"
    meta_path(out).write_text(json.dumps(meta, indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m snippets.bench.captures", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="write the sidecar of each captured file (an empty or missing one is "
                                      "skipped with a message)")
    r.add_argument("files", nargs="+", type=Path)
    r.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="what the capture was run with that its hash depends on (ncu summary: targets)")
    s = sub.add_parser("status", help="every captured file and its state")
    s.add_argument("results", nargs="?", type=Path, default=RESULTS_DIR)
    m = sub.add_parser("merge-tests", help="merge the gpu_tests.txt of several shards into one")
    m.add_argument("parts", nargs="+", type=Path)
    m.add_argument("-o", "--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "record":
        params = dict(p.split("=", 1) for p in args.param)
        for f in args.files:
            if not f.is_file() or f.stat().st_size == 0:
                print(f"captures: {f} was not written: no record", file=sys.stderr)
                continue
            record(f, params)
    elif args.cmd == "status":
        for path in captured_files(args.results):
            st = status(path)
            print(f"{st.gpu}/{st.file}: {st.state}" + (f" ({st.why})" if st.why else ""))
    else:
        print(merge_tests(args.parts, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
