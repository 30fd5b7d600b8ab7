"""Command line: ``python -m snippets {bench,report,list,export,exercise}``."""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["exercise"]:  # its own parser (exercises/cli.py), options and --help included
        return exercise_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m snippets", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", help="check and time ops on this GPU; merge into benchmarks/results/<gpu>.json")
    b.add_argument("ops", nargs="*", help="op names (default: all)")
    b.add_argument("--quick", action="store_true", help="headline sizes only, smaller GEMM ceilings")
    b.add_argument("--out", type=Path, help="results file to merge into (default: benchmarks/results/<gpu>.json)")
    b.add_argument("--stale-only", action="store_true",
                   help="only the ops the results file lacks or holds stale (python -m snippets report)")
    b.add_argument("--claim", type=Path, metavar="DIR",
                   help="split the ops between several bench processes (one per GPU, each with its own --out) "
                        "that share the folder DIR: each takes the next op no other has claimed")
    r = sub.add_parser("report", help="summarise committed results (no GPU needed)")
    r.add_argument("--json", action="store_true", help="one JSON record per op and GPU (results), and one per "
                                                       "stale captured output (stale_captures)")
    r.add_argument("--results", type=Path, help="results folder (default: benchmarks/results)")
    sub.add_parser("list", help="list the registered ops and their implementations")
    e = sub.add_parser("export", help="write one op's kernel as a self-contained module and its test, "
                                      "to copy into a project")
    e.add_argument("op", help="op name (python -m snippets list shows them)")
    e.add_argument("version", nargs="?", help="version (default: the book's best measured one)")
    e.add_argument("-o", "--out", type=Path, default=Path("."), help="folder to write into (default: .)")
    sub.add_parser("exercise", help="the book's self-checking exercises (exercises/): list | show ID | "
                                    "check ID [--solution | --planted NAME]")
    args = parser.parse_args(argv)
    if args.cmd in ("bench", "report"):
        from snippets.op_index import load_all
        load_all()  # the harness and the report list what is registered: every op, first

    if args.cmd == "bench":
        from snippets.bench.harness import run
        run(args.ops, quick=args.quick, out=args.out, stale_only=args.stale_only, claim_dir=args.claim)
    elif args.cmd == "export":
        import os

        import torch

        if not torch.cuda.is_available():  # the export tries the kernel on wrong dtypes: on the CPU, interpreted
            os.environ.setdefault("TRITON_INTERPRET", "1")
        from snippets.export import main as export_main
        return export_main(args.op, args.version, args.out)
    elif args.cmd == "report":
        from snippets.bench.captures import stale_captures
        from snippets.bench.report import RESULTS_DIR, print_report, report
        results = args.results or RESULTS_DIR
        print_report(report(results), args.json, stale_captures(results))
        if not args.json:  # the multi-GPU runs of Part 7 (world size, bus bandwidth): their own files
            from snippets.bench.distributed import main as distributed_main
            print("\nMulti-GPU runs (python -m snippets.bench.distributed list):")
            distributed_main(["list"])
    else:
        from snippets.op_index import load_all
        for name, op in load_all().items():
            impls = ", ".join(f"{i.name}={i.lang}" for i in op.impls.values())
            print(f"part {op.part}  {name:18s} {op.metric:8s} {impls}")
    return 0


def exercise_main(argv: list[str]) -> int:
    """``python -m snippets exercise ...``: the exercises live in exercises/, next to this package in the
    repository (the files a learner edits are there)."""
    import sys

    from snippets.registry import REPO_ROOT

    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from exercises.cli import main as cli_main

    return cli_main(argv or ["--help"])


if __name__ == "__main__":
    raise SystemExit(main())
