"""Multi-GPU results of Part 7, kept like every other measurement: with their provenance (GPU model,
world size, topology, torch and NCCL versions, commit, date) and the derived hash of the code that
produced them, so that they go stale when that code changes.

One file per GPU model and world size, ``benchmarks/results/distributed/<gpu>-x<world>.json``::

    {"schema": 1, "gpu": "NVIDIA H200", "world_size": 2, "topology": "nvidia-smi topo -m ...",
     "runs": {"sweep": {"module", "commit", "source_hash", "provenance", "records", "fits"},
              "fast_allreduce": {...}}}

A run's records are what its module wrote (``snippets.part7.sweep``: NCCL's collectives over sizes;
``snippets.part7.fast_allreduce``: the book's ring and one-shot all-reduces against NCCL's;
``snippets.part7.pipeline``: the measured bubble of GPipe and 1F1B, one record per schedule;
``snippets.part7.p2p_patterns``: one ring step's point-to-point traffic against a pair's exchange;
``snippets.part7.fast_halving``: halving-doubling against NCCL's all-reduce and the book's ring).
``scripts/part7_gpus.sh OUTDIR`` produces them on a GPU machine;

    python -m snippets.bench.distributed record OUTDIR --commit C [--root CHECKOUT]

files them here (``--root``: a checkout of commit C, whose code the hash is taken of; ``--dest``,
for ``record`` and ``list``: another folder than this one).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from snippets.hashing import derived_hash
from snippets.registry import REPO_ROOT

SCHEMA = 1
DIST_DIR = REPO_ROOT / "benchmarks" / "results" / "distributed"
RUNS = {"sweep": "snippets.part7.sweep", "fast_allreduce": "snippets.part7.fast_allreduce",
        "scaling": "snippets.part7.scaling", "tp_overlap": "snippets.part7.tp_overlap",
        "pipeline": "snippets.part7.pipeline", "p2p_patterns": "snippets.part7.p2p_patterns",
        "halving": "snippets.part7.fast_halving"}
# the world sizes Part 7's chapters report; a size with no file renders as not measured yet
WORLD_SIZES = (2, 4)


def slug(gpu: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")


def source_hash(run: str, root: Path = REPO_ROOT) -> str:
    """The derived hash of the code a run depends on: its module's import closure and the timer."""
    if run not in RUNS:
        raise ValueError(f"source_hash: run must be one of {sorted(RUNS)}, got {run!r}")
    return derived_hash([RUNS[run]], root=root)


def record(outdir: Path, commit: str, root: Path = REPO_ROOT, dest: Path = DIST_DIR) -> Path:
    """File the runs found in ``outdir`` (``<run>.json`` and ``topology.txt``) into ``dest``."""
    found = {run: Path(outdir) / f"{run}.json" for run in RUNS}
    found = {run: p for run, p in found.items() if p.is_file()}
    scaling = sorted(Path(outdir).glob("scaling_*.json"))
    if not found and not scaling:
        raise FileNotFoundError(f"record: no {', '.join(f'{r}.json' for r in RUNS)} and no "
                                f"scaling_*.json in {outdir}")
    entries = {}
    datas = {run: json.loads(path.read_text()) for run, path in found.items()}
    if scaling:
        records = [json.loads(p.read_text()) for p in scaling]
        many = max(records, key=lambda r: r["world_size"])
        nccl = next((d["provenance"].get("nccl") for d in datas.values()), None)
        datas["scaling"] = {"records": records, "provenance": {
            "backend": "nccl", "world_size": many["world_size"], "gpu": many.get("gpu"),
            "torch": many["torch"], "nccl": nccl, "date": many["date"]}}
    for run, data in datas.items():
        prov = data["provenance"]
        if not prov.get("gpu"):
            raise ValueError(f"record: {run} in {outdir} was not measured on GPUs (backend "
                             f"{prov.get('backend')}): a CPU dry run is not a result")
        entries[run] = {"module": RUNS[run], "commit": commit,
                        "source_hash": source_hash(run, root), **data}
    gpus = {(e["provenance"]["gpu"], e["provenance"]["world_size"]) for e in entries.values()}
    if len(gpus) != 1:
        raise ValueError(f"record: the runs in {outdir} come from different machines: {gpus}")
    ((gpu, world),) = gpus
    topo = Path(outdir) / "topology.txt"
    topology = topo.read_text() if topo.is_file() else entries[next(iter(entries))][
        "provenance"].get("topology")
    target = Path(dest) / f"{slug(gpu)}-x{world}.json"
    data = (json.loads(target.read_text()) if target.is_file()
            else {"schema": SCHEMA, "gpu": gpu, "world_size": world, "runs": {}})
    data["topology"] = _plain(topology or "")
    data["runs"].update(entries)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(data, indent=1) + "\n")
    return target


def _plain(text: str) -> str:
    """Terminal text without its escape sequences (nvidia-smi underlines its header)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def load(dest: Path = DIST_DIR) -> list[dict[str, Any]]:
    """Every filed machine, by GPU then world size."""
    files = sorted(Path(dest).glob("*.json")) if Path(dest).is_dir() else []
    data = [json.loads(p.read_text()) for p in files]
    return sorted(data, key=lambda d: (d["gpu"], d["world_size"]))


def fresh(run: str, entry: dict[str, Any], root: Path = REPO_ROOT) -> bool:
    return entry.get("source_hash") == source_hash(run, root)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="file the runs of OUTDIR into benchmarks/results/distributed")
    r.add_argument("outdir", type=Path)
    r.add_argument("--commit", required=True)
    r.add_argument("--root", type=Path, default=REPO_ROOT,
                   help="a checkout of the commit measured (default: this tree)")
    ls = sub.add_parser("list", help="what is filed, and whether it is fresh")
    for cmd in (r, ls):
        cmd.add_argument("--dest", type=Path, default=DIST_DIR,
                       help="the folder of the filed results (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.cmd == "record":
        print(record(args.outdir, args.commit, args.root, args.dest))
        return 0
    for data in load(args.dest):
        for run, entry in data["runs"].items():
            state = "fresh" if fresh(run, entry) else "stale"
            when = f"commit {entry['commit'][:7]}, {entry['provenance']['date']}"
            print(f"{data['gpu']} x{data['world_size']} {run}: {state} ({when})"
                  f"{_headline(entry)}")
    return 0


def _headline(entry: dict[str, Any]) -> str:
    """The largest message's bus bandwidth per collective, or the pipeline's bubble per schedule,
    for the list."""
    bubbles = [r for r in entry.get("records", []) if "bubble_median" in r]
    if bubbles:
        return "; measured bubble (formula): " + ", ".join(
            f"{r['schedule']} p={r['p']} m={r['m']} {r['bubble_median']:.3f} "
            f"({r['formula']:.3f})" for r in bubbles)
    best: dict[str, dict[str, Any]] = {}
    for r in entry.get("records", []):
        key = r.get("op") or r.get("impl")
        if key and "busbw" in r and r["bytes"] >= best.get(key, {}).get("bytes", -1):
            best[key] = r
    if not best:
        return ""
    return "; busbw at the largest size: " + ", ".join(
        f"{k} {r['busbw'] / 1e9:.0f} GB/s" for k, r in sorted(best.items()))


if __name__ == "__main__":
    raise SystemExit(main())
