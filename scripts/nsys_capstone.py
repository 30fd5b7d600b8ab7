"""The capstone's decode step under Nsight Systems (scripts/capture_nsys.sh runs it):

    python scripts/nsys_capstone.py --run VERSION    # capstone_decode VERSION (v2: the book's kernels
                                                     # eager; v3: the same step in a CUDA graph) at its
                                                     # headline size: warm-up calls, then STEPS profiled
    python scripts/nsys_capstone.py --summary VERSION GPU_TRACE.csv API_SUM.csv COMMAND
                                                     # nsys stats' GPU trace and CUDA API summary -> text

What the timeline says that CUDA events around each component (``profile_decode``) cannot: how much of a
step the GPU spends idle between kernels, how many launches a step makes and how long the host spends in
them. For each version the summary gives, per step, the GPU operations, the GPU's busy time against the span
from the first kernel's start to the last one's end (the rest is the GPU waiting for the host), the host time
in the launch calls, and the kernels that take the most time, grouped by name.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from nsys_streams import column, csv_rows, parse_trace  # noqa: E402

from snippets import registry  # noqa: E402
from snippets.registry import size_key  # noqa: E402

OP = "capstone_decode"
VERSIONS = ("v2", "v3")   # the book's step eager, and the same step replayed from a CUDA graph
STEPS = 3                 # profiled calls
TOP = 12                  # kernel names listed per version
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cudaGraphLaunch",
            "cudaMemcpyAsync", "cudaMemsetAsync")


def get_op(name: str):
    """The op ``name``, every op loaded (capstone_decode is registered by snippets.part8.capstone, which
    ``registry.load_all`` alone does not import). ``snippets.op_index`` is imported by name, as in
    scripts/ncu_counters.py: the capture's hash covers this script's imports, and op_index changes whenever an
    op is added; the versions profiled are hashed through their impls instead."""
    importlib.import_module("snippets.op_index").load_all()
    return registry.get_op(name)


def run(version: str) -> str:
    """Two warm-up calls (compilation, autotuning, the graph's capture), then STEPS profiled calls."""
    if version not in VERSIONS:
        raise ValueError(f"run: version must be one of {VERSIONS}, got {version!r}")
    if not torch.cuda.is_available():
        raise RuntimeError("run: Nsight Systems traces a CUDA GPU, and torch sees none")
    op = get_op(OP)
    impl = op.impls[version]
    args = op.make_inputs(op.headline, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
    for _ in range(2):
        impl.fn(*args)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _ in range(STEPS):
        out = impl.fn(*args)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    if not torch.isfinite(out.float()).all():
        raise RuntimeError(f"run: {OP} {version} returned non-finite logits")
    return f"{OP} {version} ({impl.desc}) at {size_key(op.headline)}: {STEPS} profiled steps done"


NO_TRACE = ("(no GPU operation in the trace. A decode step always runs kernels, so nsys recorded nothing it could "
            "analyse: an Nsight Systems older than the driver stops at driver functions it does not know, as "
            "2022.4 does on a CUDA 13 driver for the eager step; nothing is summarised for this version)")


def parse_api(text: str) -> dict[str, tuple[int, float]]:
    """``nsys stats --report cuda_api_sum`` (``cudaapisum`` before 2023) as CSV -> {name: (calls, total ns)}.
    Lines before the header (nsys's own messages) are skipped; names lose a version suffix (``_v7000``)."""
    rows = csv_rows(text, "Time")
    if not rows:
        return {}
    header = rows[0]
    c_total, c_calls, c_name = column(header, "Total Time"), column(header, "Num Calls"), column(header, "Name")
    out: dict[str, tuple[int, float]] = {}
    for r in rows[1:]:
        if len(r) != len(header) or not r[c_name]:
            continue
        name = r[c_name].split("_v")[0]
        calls, total = out.get(name, (0, 0.0))
        out[name] = (calls + int(r[c_calls]), total + float(r[c_total]))
    return out


def summary(version: str, trace_csv: str, api_csv: str, command: str, steps: int = STEPS) -> str:
    ops = parse_trace(trace_csv)
    lines = [f"$ {command}", ""]
    if not ops:  # a decode step always runs kernels: an empty trace is a failed analysis, not an idle step
        return "\n".join([*lines, NO_TRACE]) + "\n"
    span = max(o["start"] + o["dur"] for o in ops) - ops[0]["start"]
    busy = sum(o["dur"] for o in ops)   # the step's operations run one after another on one stream
    lines.append(f"{OP} {version}, per step (the mean of {steps} steps): {len(ops) / steps:.0f} GPU operations")
    lines.append(f"GPU busy {busy / steps / 1e3:.1f} us of a {span / steps / 1e3:.1f} us span from the first "
                 f"start to the last end ({busy / span:.0%}; in the rest the GPU waits for the host)")
    api = parse_api(api_csv)
    launch = [(n, api[n]) for n in LAUNCHES if n in api]
    if launch:
        lines.append("host, per step: " + ", ".join(f"{n} {c / steps:.0f} calls {t / steps / 1e3:.1f} us"
                                                    for n, (c, t) in launch))
    by_name: dict[str, list[float]] = {}
    for o in ops:
        by_name.setdefault(o["name"], []).append(o["dur"])
    lines += ["", f"{'us/step':>8}  {'share':>6}  {'calls':>5}  name"]
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
    for name, durs in ranked[:TOP]:
        lines.append(f"{sum(durs) / steps / 1e3:>8.1f}  {sum(durs) / busy:>6.1%}  {len(durs) / steps:>5.0f}  "
                     f"{name[:80]}")
    if len(ranked) > TOP:
        rest = sum(sum(d) for _, d in ranked[TOP:])
        lines.append(f"{rest / steps / 1e3:>8.1f}  {rest / busy:>6.1%}  {'':>5}  [{len(ranked) - TOP} more names]")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/nsys_capstone.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--run", metavar="VERSION", choices=VERSIONS)
    group.add_argument("--summary", nargs=4, metavar=("VERSION", "GPU_TRACE_CSV", "API_SUM_CSV", "COMMAND"))
    args = parser.parse_args(argv)
    if args.run:
        print(run(args.run))
    else:
        version, trace, api, command = args.summary
        text = summary(version, Path(trace).read_text(), Path(api).read_text(), command)
        sys.stdout.write(text)
        if NO_TRACE in text:
            return 1  # the capture is not recorded (scripts/capture_nsys.sh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
