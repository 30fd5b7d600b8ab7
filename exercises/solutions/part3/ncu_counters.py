"""part3.profiling.7: Read a kernel's counters as Nsight Compute prints them

The reference solution.

Chapter: docs/part3/profiling.md, exercise 7. Difficulty 2 of 4 (write a few lines).

From the metrics of one profiled launch, as parse_ncu_csv returns them ({name: (value, unit)}):
the bytes the kernel moved through DRAM (a bandwidth times the duration, each in the unit ncu
printed it in), to be compared with the op's cost model; the largest warp stall reasons, which
are the hypothesis to test; and, from the chapter's note, the share of cycles in which one
scheduler holding W warps, each issuing once every C cycles, issues an instruction.

Check it:  python -m snippets exercise check part3.profiling.7
"""

import re

PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}  # ncu's prefixes are decimal
SECONDS = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0}
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio")


def dram_bytes(metrics: dict) -> float:
    """The bytes read from and written to DRAM during the launch: ``dram__bytes.sum.per_second``
    times ``gpu__time_duration.sum``. The bandwidth's unit is byte/second with an optional prefix
    (Kbyte/second, Mbyte/second, Gbyte/second, Tbyte/second), the duration's one of nsecond,
    usecond, msecond and second."""
    rate, rate_unit = metrics["dram__bytes.sum.per_second"]
    duration, time_unit = metrics["gpu__time_duration.sum"]
    prefix = rate_unit.removesuffix("byte/second")
    return rate * PREFIX[prefix] * duration * SECONDS[time_unit]


def top_stalls(metrics: dict, k: int = 2) -> list[tuple[str, float]]:
    """The ``k`` largest warp stall reasons, as (reason, cycles per issued instruction), largest
    first. Each stall reason is a metric named
    ``smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio``; one whose value is None
    (ncu printed n/a) was not measured, and ``selected`` is left out: it is the cycle in which the
    warp issues, not a wait."""
    found = [(m.group(1), value) for name, (value, _) in metrics.items()
             if (m := STALL.fullmatch(name)) and value is not None and m.group(1) != "selected"]
    return sorted(found, key=lambda rv: -rv[1])[:k]


def issue_fraction(warps: float, cycles_per_issue: float) -> float:
    """The share of cycles in which a scheduler issues an instruction, when it holds ``warps``
    warps and each of them issues once every ``cycles_per_issue`` cycles (the chapter's note: W / C
    instructions per cycle, and a scheduler issues at most one per cycle)."""
    return min(1.0, warps / cycles_per_issue)
