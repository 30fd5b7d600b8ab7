"""Profiling the book's kernels: torch.profiler for a timeline of a workload, Nsight Compute for
one kernel.

Not an op module (it registers nothing): it runs ops that other modules registered.

- ``profile_workload(device, trace_path)`` profiles a few calls of the reduction, scan and SGEMM
  versions with ``torch.profiler`` and returns the ``key_averages()`` table (a Chrome trace is
  written if a path is given). It runs on the CPU too: the Triton versions then run in Triton's
  interpreter, on tiny inputs.
- ``run_target(name)`` runs ONE version of one op once at its headline size, after one warm-up call,
  so that Nsight Compute can profile exactly that call (``scripts/capture_profiles.sh`` does it for
  every target).
- ``parse_ncu_csv(text)`` reads ``ncu --csv`` output (the details page, one row per metric, or the
  raw page, one row per kernel); ``ncu_summary`` and ``ncu_text`` turn it into the plain-text
  reports the chapter shows.

The command line that drives them is ``scripts/profile_kernels.py``.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from snippets._checks import check_int
from snippets.registry import dtype_name, get_op, size_key

# --------------------------------------------------------------------------------------------------
# torch.profiler
# --------------------------------------------------------------------------------------------------

# The versions profiled together, by device: the library baseline next to the book's best and a
# Triton version. On the CPU only what runs there: Triton through the interpreter, and the
# CPU versions.
WORKLOAD = {
    "cuda": {"reduce_sum": ("v0", "v7", "v8"), "scan": ("v0", "v3", "v5"), "sgemm": ("v0", "v8")},
    "cpu": {"reduce_sum": ("v8", "v10"), "scan": ("v4",), "sgemm": ("v10",)},
}
# Sizes: on a GPU, large enough that each call is a real kernel (tens of microseconds or more); on
# the CPU, small enough for the Triton interpreter, which runs every program of the grid in Python.
SIZES = {"cuda": (2**24, 2048), "cpu": (4096, 64)}


def workload(device: str, n: int, m: int) -> list[tuple[str, object, tuple]]:
    """(label, function, arguments) for every version of ``WORKLOAD[device]``, inputs built by the
    op's own ``make_inputs`` (n elements for the vector ops, m x m x m for SGEMM)."""
    steps = []
    gen = torch.Generator().manual_seed(0)
    for op_name, versions in WORKLOAD[device].items():
        op = get_op(op_name)
        size = {"m": m, "n": m, "k": m} if op_name == "sgemm" else {"n": n}
        args = op.make_inputs(size, op.timed_dtypes()[0], device, gen)
        for v in versions:
            impl = op.impls[v]
            steps.append((f"{op_name} {v} ({impl.lang})", impl.fn, args))
    return steps


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# --8<-- [start:torch_profiler]
def run_profiler(device: str, n: int, m: int, calls: int = 3) -> torch.profiler.profile:
    """Profile ``calls`` rounds of the workload; each call sits in a ``record_function`` range named
    after the op and version, so the table and the trace show which kernels each one launched."""
    from torch.profiler import ProfilerActivity, profile, record_function

    steps = workload(device, n, m)
    # warm-up outside the profile: compilation (Triton, NVRTC), cuBLAS handles
    for _, fn, args in steps:
        fn(*args)
    _sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(calls):
            for label, fn, args in steps:
                with record_function(label):
                    fn(*args)
        _sync(device)  # inside the profile: the kernels' ends are part of the trace
    return prof


def profile_table(prof: torch.profiler.profile, device: str, rows: int = 60) -> str:
    """The aggregated table: one row per op or kernel name, sorted by GPU time (CPU time on the
    CPU). 60 rows hold every range, kernel and operator that has GPU time in this workload; the rest
    have none."""
    sort_by = "device_time_total" if device == "cuda" else "cpu_time_total"
    return prof.key_averages().table(sort_by=sort_by, row_limit=rows, max_name_column_width=48)
# --8<-- [end:torch_profiler]


def profile_workload(device: str | None = None, trace_path: str | Path | None = None, *,
                     n: int | None = None, m: int | None = None, calls: int = 3) -> str:
    """Profile the workload on ``device`` (default: the GPU if there is one), write a Chrome trace
    to ``trace_path`` if given (open it in chrome://tracing or https://ui.perfetto.dev), return
    the table."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in WORKLOAD:
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' but torch sees no CUDA GPU; profile device='cpu' instead")
    default_n, default_m = SIZES[device]
    n = default_n if n is None else check_int("n", n, 1)
    m = default_m if m is None else check_int("m", m, 1)
    prof = run_profiler(device, n, m, check_int("calls", calls, 1))
    if trace_path is not None:
        prof.export_chrome_trace(str(trace_path))
    return profile_table(prof, device)


# "scan v4 (Triton)": the record_function ranges of the workload
LABEL = re.compile(r"\w+ v\d+ \(\w+\)")


def top_kernels(prof: torch.profiler.profile, k: int = 10) -> list[tuple[str, int, float]]:
    """(name, calls, total microseconds) of the ``k`` GPU kernels with the most time in the profile;
    on a CPU-only profile, of the ``k`` operators with the most self CPU time."""
    totals: dict[str, list] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t = totals.setdefault(e.name, [0, 0.0])
            t[0] += 1
            t[1] += e.time_range.elapsed_us()
    if not totals:
        for e in prof.key_averages():
            if LABEL.fullmatch(e.key):
                # our own record_function ranges: they contain the operators, they are not one
                continue
            totals[e.key] = [e.count, e.self_cpu_time_total]
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][1])[:k]
    return [(name, int(c), float(us)) for name, (c, us) in ranked]


def write_torch_profile(outdir: Path, trace_path: Path | None = None) -> Path:
    """``OUTDIR/torch_profiler.txt``: the table and the top kernels (the trace itself is megabytes:
    it is written only where ``trace_path`` says)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n, m = SIZES[device]
    prof = run_profiler(device, n, m)
    outdir.mkdir(parents=True, exist_ok=True)
    if trace_path is not None:
        prof.export_chrome_trace(str(trace_path))
    where = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (Triton interpreter)"
    lines = [f"torch.profiler on {where}; torch {torch.__version__}; 3 rounds of: "
             + ", ".join(label for label, _, _ in workload_labels(device)),
             f"sizes: n = {n:,} (reduce_sum, scan), m = n = k = {m} (sgemm), float32", "",
             profile_table(prof, device).rstrip(), "",
             ("Top kernels by total GPU time:" if device == "cuda"
              else "Top operators by self CPU time:")]
    for name, count, us in top_kernels(prof):
        lines.append(f"  {us:>12,.1f} us  {count:>4} calls  {name[:100]}")
    path = outdir / "torch_profiler.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def workload_labels(device: str) -> list[tuple[str, str, str]]:
    """(label, op, version) of the workload, without building inputs."""
    out = []
    for op_name, versions in WORKLOAD[device].items():
        op = get_op(op_name)
        out += [(f"{op_name} {v} ({op.impls[v].lang})", op_name, v) for v in versions]
    return out


# --------------------------------------------------------------------------------------------------
# Nsight Compute: one version, one call
# --------------------------------------------------------------------------------------------------

# --8<-- [start:targets]
@dataclass(frozen=True)
class NcuTarget:
    """One version that Nsight Compute profiles: ``kernels`` is a regular expression for
    ``ncu --kernel-name regex:...`` (matched against demangled names), ``launches`` the number of
    matching launches per call (the warm-up call launches as many, and ncu skips them)."""

    op: str
    version: str
    kernels: str
    launches: int
    question: str


NCU_TARGETS = {
    "reduce_v7": NcuTarget("reduce_sum", "v7", "^reduce_v7", 1,
                           "What does a kernel at the copy ceiling look like from the inside?"),
    "scan_v3": NcuTarget("scan", "v3", "^(reduce_tiles|scan_sums|scan_tiles_rts)_f32", 3,
                         "Reduce-then-scan: three kernels, x read twice. Where does its time go?"),
    "scan_v5": NcuTarget("scan", "v5", "^scan_lookback_f32", 1,
                         "Single pass, decoupled look-back: it moves the fewest bytes, so why is "
                         "it slower?"),
    "scan_v6": NcuTarget("scan", "v6", "^scan_lookback_warp_f32", 1,
                         "The look-back by a whole warp: which stall went away?"),
    "sgemm_v0": NcuTarget("sgemm", "v0", "gemm", 1,
                          "cuBLAS at 4096^3: the reference for the hand-written ladder."),
    "sgemm_v8": NcuTarget("sgemm", "v8", "^sgemm_v8", 1,
                          "Double buffering: how far from cuBLAS, and why?"),
    "transpose_v3": NcuTarget("transpose", "v3", "^transpose_v3", 1,
                              "A shared tile with 32-way bank conflicts: what does a conflict "
                              "stall look like?"),
    "transpose_v6": NcuTarget("transpose", "v6", "^transpose_v6", 1,
                              "Padded tile, 4 elements per thread: the same bytes, fewer stalls?"),
    # Part 5: a hand kernel next to Liger-Kernel's (v2) where the benchmark tables put them apart.
    "rmsnorm_v3": NcuTarget("rmsnorm", "v3", "^_rmsnorm_fwd_kernel", 1,
                            "RMSNorm forward, a row in registers: what separates it from "
                            "Liger-Kernel's?"),
    "rmsnorm_v2": NcuTarget("rmsnorm", "v2", "^_rms_norm_forward_kernel", 1,
                            "Liger-Kernel's RMSNorm forward at the same shape, for comparison."),
    "rope_v3": NcuTarget("rope", "v3", "^_rope_kernel", 1,
                         "RoPE, one program per token into new tensors: how close to the copy "
                         "ceiling?"),
    "rope_v2": NcuTarget("rope", "v2", "^_triton_rope", 1,
                         "Liger-Kernel's RoPE, in place, on the same grid, for comparison."),
    "bias_gelu_v3": NcuTarget("bias_gelu_dropout_residual", "v3", "^_bias_gelu_dropout_residual", 1,
                              "The fused chain at a third of the copy ceiling: bound by memory or "
                              "by arithmetic?"),
}


def available_targets() -> list[str]:
    """The targets whose op and version are registered (a version added later shows up
    by itself)."""
    out = []
    for name, t in NCU_TARGETS.items():
        try:
            if t.version in get_op(t.op).impls:
                out.append(name)
        except KeyError:
            continue
    return out


def run_target(name: str) -> str:
    """Run target ``name`` twice on its op's headline inputs: a warm-up call (compilation, cuBLAS
    heuristics, and the launches that ``ncu --launch-skip`` passes over), then the call that
    ncu profiles."""
    if name not in NCU_TARGETS:
        raise ValueError(f"unknown target {name!r}; known: {', '.join(NCU_TARGETS)}")
    if not torch.cuda.is_available():
        raise RuntimeError("run_target runs a GPU kernel for Nsight Compute, and torch sees no "
                           "CUDA GPU")
    t = NCU_TARGETS[name]
    op = get_op(t.op)
    impl = op.impls[t.version]
    dtype = op.timed_dtypes()[0]
    args = op.make_inputs(op.headline, dtype, "cuda", torch.Generator().manual_seed(0))
    impl.fn(*args)
    torch.cuda.synchronize()
    impl.fn(*args)  # the profiled call
    torch.cuda.synchronize()
    return (f"{name}: {t.op} {t.version} ({impl.desc}) at {size_key(op.headline)}, "
            f"{dtype_name(dtype)}: one warm-up call, then the profiled call")
# --8<-- [end:targets]


# --------------------------------------------------------------------------------------------------
# Reading ncu --csv output
# --------------------------------------------------------------------------------------------------

# --8<-- [start:parse]
IDENTITY = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Kernel Time",
            "Context", "Stream", "Block Size", "Grid Size", "Device", "CC")


def _number(text: str) -> float | None:
    """'1,234.5' -> 1234.5; 'n/a' or '' -> None (ncu prints thousands separators and n/a)."""
    try:
        return float(text.replace(",", "").strip())
    except ValueError:
        return None


def parse_ncu_csv(text: str) -> list[dict]:
    """One dict per profiled kernel launch, in order:
    ``{"id", "kernel", "block", "grid", "metrics": {name: (value, unit)}}``, value a float (None for
    n/a or text). Accepts both pages of ``ncu --csv``:

    - details (the default): a row per metric, with "Section Name", "Metric Name", "Metric Unit" and
      "Metric Value" columns (metrics named as the sections label them, raw names
      for ``--metrics``);
    - raw (``--page raw``): a row per kernel, a column per metric, and a row of units under
      the header.

    Lines before the header (``==PROF==`` lines, the program's own output) are skipped.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    rows = list(csv.reader(lines[start:]))
    header, body = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    col = {name: i for i, name in enumerate(header)}
    kernels: dict[str, dict] = {}

    def kernel(row: list[str]) -> dict:
        return kernels.setdefault(row[col["ID"]], {
            "id": row[col["ID"]], "kernel": row[col["Kernel Name"]],
            "block": row[col["Block Size"]] if "Block Size" in col else "",
            "grid": row[col["Grid Size"]] if "Grid Size" in col else "", "metrics": {}})

    if "Metric Name" in col:  # details page: long format
        for row in body:
            name = row[col["Metric Name"]]
            if name:
                kernel(row)["metrics"][name] = (_number(row[col["Metric Value"]]),
                                                row[col["Metric Unit"]])
        return list(kernels.values())
    # raw page: units row
    units = body[0] if body and body[0][col["ID"]] == "" else [""] * len(header)
    metric_cols = [i for i, name in enumerate(header) if name not in IDENTITY]
    for row in body:
        if row[col["ID"]] == "":
            continue
        k = kernel(row)
        for i in metric_cols:
            k["metrics"][header[i]] = (_number(row[i]), units[i])
    return list(kernels.values())
# --8<-- [end:parse]


_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_TIME = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3,
         "second": 1.0, "s": 1.0}


def in_base_units(value: float | None, unit: str) -> float | None:
    """A value in bytes/s for a bandwidth ('Gbyte/second' -> x 1e9) or seconds for a time ('usecond'
    -> x 1e-6); any other unit unchanged."""
    if value is None:
        return None
    if m := re.fullmatch(r"([KMGTP]?)(?:byte|B)/(?:second|s)", unit.strip()):
        return value * _SCALE[m.group(1)]
    if unit.strip() in _TIME:
        return value * _TIME[unit.strip()]
    return value


STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio")
# Cycles between two issued instructions of a warp: the first name is the WarpStateStats section's,
# the second the one its rules compute the same ratio from.
CYCLES_PER_ISSUE = ("smsp__average_warp_latency_per_inst_issued.ratio",
                    "smsp__average_warps_active_per_issue_active.ratio")


def stalls(metrics: dict) -> list[tuple[str, float]]:
    """(reason, cycles per issued instruction) for every warp stall reason measured, largest first.
    The values add up to about the average number of cycles between two instructions of a warp."""
    out = [(m.group(1), v) for name, (v, _) in metrics.items()
           if (m := STALL.fullmatch(name)) and v is not None]
    return sorted(out, key=lambda rv: -rv[1])


def _get(metrics: dict, *names: str) -> float | None:
    for name in names:
        if name in metrics and metrics[name][0] is not None:
            return in_base_units(*metrics[name])
    return None


def short_name(kernel: str, width: int = 36) -> str:
    """'void cutlass::Kernel2<cutlass_80_simt_sgemm_...>(Params)' -> the name without 'void' and
    parameters, cut to ``width`` characters."""
    name = kernel.removeprefix("void ").strip()
    depth = 0
    # cut at the parameter list: the first '(' outside template brackets
    for i, ch in enumerate(name):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0 and i > 0:
            name = name[:i]
            break
    return name if len(name) <= width else name[: width - 3] + "..."


# --8<-- [start:summary]
SUMMARY_COLUMNS = (  # header, metrics (the first one measured wins), format
    ("time (us)", ("gpu__time_duration.sum",), lambda v: f"{v * 1e6:,.1f}"),
    ("DRAM % of peak", ("dram__throughput.avg.pct_of_peak_sustained_elapsed",),
     lambda v: f"{v:.1f}"),
    ("DRAM GB/s", ("dram__bytes.sum.per_second",), lambda v: f"{v / 1e9:,.0f}"),
    ("occupancy %", ("sm__warps_active.avg.pct_of_peak_sustained_active",), lambda v: f"{v:.1f}"),
    ("regs/thread", ("launch__registers_per_thread",), lambda v: f"{v:.0f}"),
    ("cycles/issue", CYCLES_PER_ISSUE, lambda v: f"{v:.1f}"),
)


def ncu_summary(reports: list[tuple[str, list[dict]]]) -> str:
    """A kernel x metric table: one row per profiled kernel of every (target name, parsed report),
    with the three largest stall reasons (cycles per issued instruction; 'selected', the issue
    itself, left out)."""
    header = ["target", "kernel", *[c[0] for c in SUMMARY_COLUMNS],
              "top stalls (cycles per issued instruction)"]
    rows = []
    for target, kernels in reports:
        for k in kernels:
            cells = [target, short_name(k["kernel"])]
            for _, names, fmt in SUMMARY_COLUMNS:
                v = _get(k["metrics"], *names)
                cells.append("-" if v is None else fmt(v))
            top = [(r, v) for r, v in stalls(k["metrics"]) if r != "selected"][:3]
            cells.append(", ".join(f"{r} {v:.1f}" for r, v in top) or "-")
            rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    left = {0, 1, len(header) - 1}  # text columns; numbers align right

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]),
                      *(line(r) for r in rows)]).rstrip() + "\n"
# --8<-- [end:summary]


NOISE = re.compile(
    r"^(==PROF==|==WARNING==)|Data collection happened without fixed GPU frequencies")
MAX_REPORT_CHARS = 20_000


def trim_ncu_text(text: str, limit: int = MAX_REPORT_CHARS - 4_000) -> str:
    """ncu's printed report without its progress and clock-control noise, at most
    ``limit`` characters."""
    kept, blank = [], False
    for line in text.splitlines():
        if NOISE.search(line):
            continue
        if not line.strip():
            if blank:
                continue
            blank = True
        else:
            blank = False
        kept.append(line.rstrip())
    out = "\n".join(kept).strip() + "\n"
    if len(out) > limit:
        out = (out[:limit].rsplit("\n", 1)[0]
               + f"\n[... {len(out) - limit:,} more characters trimmed]\n")
    return out


def ncu_text(name: str, details: str, raw_csv: str, command: str) -> str:
    """The readable report of one target: what it asks, the exact command, ncu's sections (trimmed),
    then the warp stall reasons of each kernel, largest first (they are in the raw metrics, not in
    the printed sections)."""
    t = NCU_TARGETS[name]
    op = get_op(t.op)
    impl = op.impls.get(t.version)
    lines = [
        f"{name}: {t.op} {t.version} ({impl.desc if impl else '?'}) at {size_key(op.headline)}",
        f"question: {t.question}", f"$ {command}", "", trim_ncu_text(details).rstrip(), ""]
    for k in parse_ncu_csv(raw_csv):
        reasons = stalls(k["metrics"])
        lines.append(f"Warp stall reasons of {short_name(k['kernel'], 60)}, "
                     "cycles per issued instruction "
                     "(smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio), "
                     "largest first:")
        lines += [f"  {r:<22} {v:8.2f}" for r, v in reasons[:10]] or ["  (not collected)"]
        lines.append("")
    out = "\n".join(lines).rstrip() + "\n"
    return (out if len(out) <= MAX_REPORT_CHARS
            else out[: MAX_REPORT_CHARS - 40] + "\n[... trimmed]\n")


def trim_sanitizer(text: str, max_lines: int = 150) -> str:
    """compute-sanitizer output with runs of identical lines collapsed; past ``max_lines`` only the
    lines that carry a verdict (errors, hazards, summaries, the program's own output and the
    commands) are kept."""
    lines: list[str] = []
    repeat = 0
    for line in text.splitlines():
        if lines and line == lines[-1]:
            repeat += 1
            continue
        if repeat:
            lines.append(f"    [the line above {repeat} more times]")
            repeat = 0
        lines.append(line.rstrip())
    if repeat:
        lines.append(f"    [the line above {repeat} more times]")
    if len(lines) > max_lines:
        key = re.compile(
            r"SUMMARY|Invalid|Race reported|Error|error|Address|by thread|^\$|^[a-z-]+: ")
        lines = [line for line in lines if key.search(line)][:max_lines] + ["[... trimmed]"]
    return "\n".join(lines).rstrip() + "\n"
