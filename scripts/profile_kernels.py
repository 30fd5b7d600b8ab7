"""The command line of the profiling chapter (``snippets.part3.profiling``);
scripts/capture_profiles.sh drives it on the GPU runner.

    python scripts/profile_kernels.py OUTDIR [--trace PATH]  # torch.profiler -> OUTDIR/torch_profiler.txt
    python scripts/profile_kernels.py --targets              # name, kernel regex, launches per call
    python scripts/profile_kernels.py --kernel scan_v5       # one warm-up call, then the profiled call
    python scripts/profile_kernels.py --ncu-text NAME DETAILS.txt RAW.csv COMMAND
    python scripts/profile_kernels.py --ncu-summary DIR      # DIR/<name>.csv for every target
    python scripts/profile_kernels.py --trim-sanitizer < LOG
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from snippets.part3.profiling import (  # noqa: E402
    NCU_TARGETS,
    available_targets,
    ncu_summary,
    ncu_text,
    parse_ncu_csv,
    run_target,
    trim_sanitizer,
    write_torch_profile,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/profile_kernels.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outdir", nargs="?", type=Path, help="write OUTDIR/torch_profiler.txt")
    parser.add_argument("--trace", type=Path, help="also write the Chrome trace here (megabytes)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--targets", action="store_true", help="list the Nsight Compute targets")
    group.add_argument("--kernel", metavar="NAME", help="run one target once after a warm-up")
    group.add_argument("--ncu-text", nargs=4, metavar=("NAME", "DETAILS", "RAW_CSV", "COMMAND"))
    group.add_argument("--ncu-summary", metavar="DIR", type=Path)
    group.add_argument("--trim-sanitizer", action="store_true", help="stdin to stdout")
    args = parser.parse_args(argv)
    if args.targets:
        for name in available_targets():
            t = NCU_TARGETS[name]
            print(f"{name}\t{t.kernels}\t{t.launches}")
    elif args.kernel:
        print(run_target(args.kernel))
    elif args.ncu_text:
        name, details, raw, command = args.ncu_text
        sys.stdout.write(ncu_text(name, Path(details).read_text(), Path(raw).read_text(), command))
    elif args.ncu_summary:
        reports = [(name, parse_ncu_csv((args.ncu_summary / f"{name}.csv").read_text()))
                   for name in NCU_TARGETS if (args.ncu_summary / f"{name}.csv").is_file()]
        sys.stdout.write(ncu_summary(reports))
    elif args.trim_sanitizer:
        sys.stdout.write(trim_sanitizer(sys.stdin.read()))
    elif args.outdir:
        print(write_torch_profile(args.outdir, args.trace))
    else:
        parser.error("give OUTDIR or one of the options")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
