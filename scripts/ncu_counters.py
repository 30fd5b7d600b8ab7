"""The Nsight Compute counters that explain measured puzzles of Parts 2, 3 and 6, for
scripts/capture_ncu_counters.sh (GPU runner):

- transpose at its headline size, v1 to v7 except the swizzle: why the naive v2 beats the tiled v3
  and the padded v4, and why v7 (float4) is not faster than v6;
- reduce_sum v1 to v4 (and v7, the copy-speed reference): why v1 to v3 sit together far below copy,
  why v2 is slower than v1, and why v4 gains so much (bytes in flight, or divergence?);
- strided_copy v1 at strides 4 to 32: what changes in the memory system past stride 8;
- hopper_gemm v1 to v7 (Part 6): why four stages (v2) lose to one (v1), and what the clusters
  (v5, v7) and the TMA-store epilogue (v6, v7) change;
- hopper_attention_fwd steps 1 to 4 beside cuDNN at head dimensions 128 and 64 (Part 6): how busy
  the tensor pipe is, and what the warp schedulers wait for;
- int4_gemm v6 and v7 beside cuBLAS at M = 128 and v5 and v7 at M = 64 (Part 8): whether v7's
  SMs hold two programs, and what the int4 kernels wait for.

    python scripts/ncu_counters.py --targets              # group, target, kernel regex
    python scripts/ncu_counters.py --impls GROUP          # op:version pairs the group runs
    python scripts/ncu_counters.py --kernel TARGET        # warm-up, then the profiled call
    python scripts/ncu_counters.py --text GROUP DIR CMD   # DIR/<target>.csv -> the readable table

The profiled call runs between cudaProfilerStart and cudaProfilerStop
(ncu --profile-from-start off), so ``--launch-count 1`` takes the first matching launch of that
call: for v1 to v4 of reduce_sum, which relaunch themselves on their partial sums, that is the pass
over the whole input.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from snippets import registry  # noqa: E402
from snippets.part3.profiling import (  # noqa: E402
    in_base_units,
    parse_ncu_csv,
    short_name,
    stalls,
)
from snippets.registry import dtype_name, size_key  # noqa: E402


def get_op(name: str):
    """The op ``name``, every op loaded. ``snippets.op_index`` is imported by name: a capture's
    hash covers this script's imports, and op_index changes whenever an op is added, which would
    mark every capture of this script stale; the kernels a capture profiled are hashed through
    their impls (the capture's ``impls`` parameter) instead."""
    importlib.import_module("snippets.op_index").load_all()
    return registry.get_op(name)


@dataclass(frozen=True)
class Counted:
    """One profiled launch: ``label`` heads its column; ``size`` None means the op's headline."""

    label: str
    op: str
    version: str
    kernel: str  # regex for ncu --kernel-name (the CUDA kernels are extern "C": plain names)
    size: tuple[tuple[str, int], ...] | None = None


def _strided(stride: int) -> Counted:
    return Counted(f"stride {stride}", "strided_copy", "v1", "^strided_copy_v1$",
                   (("n", 1 << 25), ("offset", 0), ("stride", stride)))


def _attention(d: int) -> tuple[Counted, ...]:
    """cuDNN's SDPA (the first kernel of its call) and steps 1 to 4 at the headline's B, H and S."""
    size = (("b", 4), ("causal", False), ("d", d), ("h", 32), ("s", 4096))
    names = {"v0": ".", "v1": f"^hopper_flash_fwd_d{d}$", "v2": f"^hopper_flash_fwd_pingpong_d{d}$",
             "v3": f"^hopper_flash_fwd_overlap_d{d}$", "v4": f"^hopper_flash_fwd_lean_d{d}$"}
    return tuple(Counted("cuDNN" if v == "v0" else v, "hopper_attention_fwd", v, k, size)
                 for v, k in names.items())


_INT4_128 = (("g", 128), ("k", 8192), ("m", 128), ("n", 8192))
_INT4_64 = (("g", 128), ("k", 8192), ("m", 64), ("n", 8192))

GROUPS: dict[str, tuple[str, tuple[Counted, ...]]] = {
    "transpose": (
        "Why does the naive v2 beat the tiled v3 and the padded v4, and v6 beat v7?",
        tuple(Counted(v, "transpose", v, f"^transpose_{v}$")
              for v in ("v1", "v2", "v3", "v4", "v6", "v7"))),
    "reduce": (
        "Why do v1 to v3 sit together below copy, v2 below v1, and v4 so far above them?",
        tuple(Counted(v, "reduce_sum", v, f"^reduce_{v}$")
              for v in ("v1", "v2", "v3", "v4", "v7"))),
    "strided": (
        "What changes in the memory system past stride 8?",
        tuple(_strided(s) for s in (4, 8, 16, 32))),
    "hopper": (
        "Why is v2 (four stages) slower than v1 (one), and what do v5-v7 change?",
        tuple(Counted(v, "hopper_gemm", v, f"^hopper_gemm_{v}$")
              for v in ("v1", "v2", "v3", "v4", "v5", "v6", "v7"))),
    # issue 17's missed goals: each book version beside the library one it is judged against
    # (a library call's first kernel: "." matches any name)
    "gemms": (
        "Where do the book's SGEMM, TF32 and fp16 GEMMs lose to cuBLAS?",
        (Counted("sgemm v0", "sgemm", "v0", "."),
         Counted("sgemm v12", "sgemm", "v12", "^sgemm_t_"),
         Counted("sgemm v13", "sgemm", "v13", "^sgemm_a_"),
         Counted("tf32 v0", "tf32_gemm", "v0", "."),
         Counted("tf32 v2", "tf32_gemm", "v2", "matmul_kernel"),
         Counted("tf32 v3", "tf32_gemm", "v3", "matmul_kmajor_kernel"),
         Counted("wmma v0", "wmma_gemm", "v0", "."),
         Counted("wmma v4", "wmma_gemm", "v4", "matmul_kernel"))),
    "rows": (
        "Where do the book's scan, LayerNorm and fused epilogue lose to the library versions?",
        (Counted("scan v0", "scan", "v0", "DeviceScanKernel"),
         Counted("scan v5", "scan", "v5", "^scan_lookback_f32$"),
         Counted("scan v6", "scan", "v6", "^scan_lookback_warp_f32$"),
         Counted("scan v7", "scan", "v7", "^scan_lookback_v7_f32$"),
         Counted("layernorm v0", "layernorm", "v0", "layer_norm"),
         Counted("layernorm v3", "layernorm", "v3", "_layernorm_fwd_kernel"),
         Counted("layernorm v4", "layernorm", "v4", "^layernorm_fwd_"),
         Counted("fused v1", "bias_gelu_dropout_residual", "v1", "^triton_"),
         Counted("fused v3", "bias_gelu_dropout_residual", "v3",
                 "_bias_gelu_dropout_residual_kernel"),
         Counted("fused v4", "bias_gelu_dropout_residual", "v4",
                 "_bias_gelu_dropout_residual4x_kernel"))),
    # issue 19: the Hopper attention steps beside cuDNN, one group per head dimension
    # issue 22: the W4A16 GEMM's tensor-core versions beside cuBLAS
    "int4": (
        "Does v7 run two programs an SM, and where do v6 and v7 spend what cuBLAS does not?",
        (Counted("cuBLAS m128", "int4_gemm", "v0", ".", _INT4_128),
         Counted("v6 m128", "int4_gemm", "v6", "^_int4_tc_wide_kernel$", _INT4_128),
         Counted("v7 m128", "int4_gemm", "v7", "^_int4_tc_wide_kernel$", _INT4_128),
         Counted("v5 m64", "int4_gemm", "v5", "^_int4_tc_kernel$", _INT4_64),
         Counted("v7 m64", "int4_gemm", "v7", "^_int4_tc_wide_kernel$", _INT4_64))),
    "attention": (
        "Where does the Hopper attention forward lose to cuDNN, and what do steps 2 to 4 change?",
        _attention(128)),
    "attention64": (
        "And at head dimension 64, where the model of step 3 promises the most?",
        _attention(64)),
}


def _target(group: str, c: Counted) -> str:
    return f"{group}_{c.label.replace(' ', '')}"


def targets() -> dict[str, tuple[str, Counted]]:
    """target name -> (group, what it profiles)."""
    return {_target(g, c): (g, c) for g, (_, cs) in GROUPS.items() for c in cs}


def _size(c: Counted) -> dict:
    return dict(c.size) if c.size is not None else dict(get_op(c.op).headline)


def run(name: str) -> str:
    """One warm-up call, then the profiled call between cudaProfilerStart and cudaProfilerStop."""
    all_targets = targets()
    if name not in all_targets:
        raise ValueError(f"run: unknown target {name!r}; known: {', '.join(all_targets)}")
    if not torch.cuda.is_available():
        raise RuntimeError("run: Nsight Compute needs a CUDA GPU, and torch sees none")
    _, c = all_targets[name]
    op = get_op(c.op)
    impl = op.impls[c.version]
    dtype = op.timed_dtypes()[0]
    args = op.make_inputs(_size(c), dtype, "cuda", torch.Generator().manual_seed(0))
    impl.fn(*args)  # compilation, module loading
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    impl.fn(*args)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return f"{name}: {c.op} {c.version} at {size_key(_size(c))}, {dtype_name(dtype)}"


# (row label, metric names: a ratio when two, formatting). The ncu metric names are printed in the
# capture under the table, so a reader can look each one up.
RATIO = "ratio"
ROWS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("time (us)", ("gpu__time_duration.sum",), "us"),
    ("DRAM throughput, % of peak", ("dram__throughput.avg.pct_of_peak_sustained_elapsed",), "f1"),
    ("DRAM bytes read (MB)", ("dram__bytes_read.sum",), "MB"),
    ("DRAM bytes written (MB)", ("dram__bytes_write.sum",), "MB"),
    ("global load sectors / request", ("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
                                       "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"), RATIO),
    ("global store sectors / request", ("l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
                                        "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"), RATIO),
    ("L1 hit rate, global loads %",
     ("l1tex__t_sector_pipe_lsu_mem_global_op_ld_hit_rate.pct",), "f1"),
    ("L2 hit rate %", ("lts__t_sector_hit_rate.pct",), "f1"),
    ("L1 -> L2 read sectors (M)", ("lts__t_sectors_srcunit_tex_op_read.sum",), "M"),
    ("L1 -> L2 write sectors (M)", ("lts__t_sectors_srcunit_tex_op_write.sum",), "M"),
    ("shared load bank conflicts (M)",
     ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",), "M"),
    ("shared store bank conflicts (M)",
     ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",), "M"),
    ("shared load wavefronts (M)", ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",), "M"),
    ("instructions executed (M)", ("smsp__inst_executed.sum",), "M"),
    ("active threads per instruction", ("smsp__thread_inst_executed_per_inst_executed.ratio",),
     "f1"),
    ("achieved occupancy %", ("sm__warps_active.avg.pct_of_peak_sustained_active",), "f1"),
    ("eligible warps per cycle", ("smsp__warps_eligible.avg.per_cycle_active",), "f2"),
    ("issued instructions per cycle", ("smsp__issue_active.avg.per_cycle_active",), "f2"),
    ("registers per thread", ("launch__registers_per_thread",), "f0"),
    ("threads per block", ("launch__block_size",), "f0"),
    ("blocks", ("launch__grid_size",), "f0"),
)
# What the shell script passes to ncu --metrics (the sections add the warp stall reasons).
METRICS = tuple(dict.fromkeys(m for _, ms, _ in ROWS for m in ms))
# Rows found by name in what the sections collected (ComputeWorkloadAnalysis: the pipes' use): the
# largest value among the metrics that match, so no exact name has to be known in advance (they
# differ between Nsight Compute versions), and the names that matched are listed under the table.
PATTERN_ROWS: tuple[tuple[str, str, str], ...] = (
    ("tensor pipe, % of peak", r"^sm__(inst_executed_)?pipe_tensor\w*\.avg\.pct_of_peak_sustained_"
     r"active$", "f1"),
)


def _matching(metrics: dict, pattern: str) -> list[str]:
    return sorted(n for n in metrics if re.match(pattern, n) and _value(metrics, n) is not None)


def _pattern_cell(metrics: dict, pattern: str, fmt: str) -> str:
    names = _matching(metrics, pattern)
    return _cell(metrics, (max(names, key=lambda n: _value(metrics, n)),), fmt) if names else "-"
STALL_ROWS = 6


def _value(metrics: dict, name: str) -> float | None:
    v = metrics.get(name)
    return None if v is None or v[0] is None else in_base_units(*v)


def _cell(metrics: dict, names: tuple[str, ...], fmt: str) -> str:
    vals = [_value(metrics, n) for n in names]
    if any(v is None for v in vals):
        return "-"
    v = vals[0]
    if fmt == RATIO:
        return "-" if not vals[1] else f"{vals[0] / vals[1]:.2f}"
    if fmt == "us":
        return f"{v * 1e6:,.1f}"
    if fmt == "MB":
        return f"{v / 1e6:,.0f}"
    if fmt == "M":
        return f"{v / 1e6:,.2f}"
    return f"{v:,.{int(fmt[1])}f}"


def text(group: str, folder: Path, command: str) -> str:
    """The readable capture of one group: a counter x launch table, then each launch's largest warp
    stall reasons. A launch whose CSV is missing or empty shows as a column of dashes."""
    if group not in GROUPS:
        raise ValueError(f"text: unknown group {group!r}; known: {', '.join(GROUPS)}")
    question, counted = GROUPS[group]
    by_label: dict[str, dict] = {}
    kernels: dict[str, str] = {}
    for c in counted:
        path = folder / f"{_target(group, c)}.csv"
        reports = parse_ncu_csv(path.read_text()) if path.is_file() else []
        by_label[c.label] = reports[0]["metrics"] if reports else {}
        kernels[c.label] = short_name(reports[0]["kernel"]) if reports else "(not profiled)"
    first = counted[0]
    head = [f"ncu_counters_{group}: {first.op}"
            + (f" at {size_key(_size(first))}" if first.size is None else ", sizes below"),
            f"question: {question}", f"$ {command}", ""]
    if first.size is not None:
        head += [f"  {c.label}: {c.op} {c.version} at {size_key(_size(c))}" for c in counted] + [""]
    header = ["counter", *[c.label for c in counted]]
    rows = [[label, *[_cell(by_label[c.label], names, fmt) for c in counted]]
            for label, names, fmt in ROWS]
    rows += [[label, *[_pattern_cell(by_label[c.label], pattern, fmt) for c in counted]]
             for label, pattern, fmt in PATTERN_ROWS]
    rows.insert(0, ["kernel", *[kernels[c.label] for c in counted]])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                         for i, (cell, w) in enumerate(zip(cells, widths))).rstrip()

    out = [*head, line(header), line(["-" * w for w in widths]), *(line(r) for r in rows), ""]
    out.append("Largest warp stall reasons, cycles per issued instruction "
               "(smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio):")
    for c in counted:
        top = stalls(by_label[c.label])[:STALL_ROWS]
        out.append(f"  {c.label:<10} " + (", ".join(f"{r} {v:.2f}" for r, v in top) or "-"))
    out += ["", "Metrics, in table order:"]
    out += [f"  {label}: {' / '.join(names)}" for label, names, _ in ROWS]
    for label, pattern, _ in PATTERN_ROWS:
        found = sorted({n for c in counted for n in _matching(by_label[c.label], pattern)})
        out.append(f"  {label}: the largest of {', '.join(found) or '(none collected)'}")
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/ncu_counters.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--targets", action="store_true", help="group, target, kernel regex")
    group.add_argument("--metrics", action="store_true", help="the --metrics list, comma separated")
    group.add_argument("--impls", metavar="GROUP", help="op:version pairs of GROUP")
    group.add_argument("--kernel", metavar="TARGET", help="run TARGET for the profiler")
    group.add_argument("--text", nargs=3, metavar=("GROUP", "DIR", "COMMAND"))
    args = parser.parse_args(argv)
    if args.targets:
        for name, (g, c) in targets().items():
            print(f"{g}\t{name}\t{c.kernel}")
    elif args.metrics:
        print(",".join(METRICS))
    elif args.impls:
        if args.impls not in GROUPS:
            parser.error(f"unknown group {args.impls!r}; known: {', '.join(GROUPS)}")
        print(" ".join(dict.fromkeys(f"{c.op}:{c.version}" for c in GROUPS[args.impls][1])))
    elif args.kernel:
        print(run(args.kernel))
    else:
        g, folder, command = args.text
        sys.stdout.write(text(g, Path(folder), command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
