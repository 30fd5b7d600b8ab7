"""The roofline model of each GPU with results, and every op of the book placed on it. The figure
and the tables of ``<!-- bench:roofline -->`` are drawn from these points by snippets.site.roofline.

The model: a kernel that performs ``F`` FLOPs and must move ``Q`` bytes to or from device memory has an
*arithmetic intensity* ``I = F / Q`` (FLOP/byte). On a GPU that sustains at most ``P`` FLOP/s and ``B`` bytes/s
it cannot run faster than ``min(P, I * B)`` FLOP/s: the memory roof ``I * B`` below the *ridge point*
``I* = P / B``, the compute roof ``P`` above it. Both roofs here are measured, not taken from a datasheet:
``B`` is the harness's device-to-device copy ceiling and ``P`` a cuBLAS GEMM ceiling (IEEE fp32, TF32, fp16,
bf16), all from the GPU's results file. ``F`` and ``Q`` come from each op's registered cost model at its
headline size, so a point's height is ``F / time``.

Ops whose cost model counts no FLOPs (a copy, a transpose, a histogram of integers) have an intensity of 0 and
no place on a logarithmic intensity axis; they are listed apart, with their bandwidth.
"""

from __future__ import annotations

from typing import Any

import torch

from snippets.bench.report import headline_records, stale_impls
from snippets.op_index import get_op, load_all
from snippets.registry import Op, Size

# The compute roof that applies to an op's arithmetic: by the op's own ceiling when it is a GEMM rate (a
# tensor-core op knows which one it competes with), else by the dtype it is timed in.
GEMM_CEILINGS = ("gemm_fp32", "gemm_tf32", "gemm_fp16", "gemm_bf16")
DTYPE_ROOF = {"float32": "gemm_fp32", "float16": "gemm_fp16", "bfloat16": "gemm_bf16"}
ROOF_LABEL = {"copy": "copy", "gemm_fp32": "cuBLAS fp32", "gemm_tf32": "cuBLAS TF32", "gemm_fp16": "cuBLAS fp16",
              "gemm_bf16": "cuBLAS bf16"}
RATE_METRICS = ("GB/s", "TFLOP/s")  # latencies (ns/access, ns/launch) have no place on a roofline


# --8<-- [start:intensity]
def arithmetic_intensity(op: Op | str, size: Size | None = None,
                         dtype: torch.dtype | None = None) -> float:
    """FLOPs per byte of the op's cost model:
    ``op.flops(size, dtype) / op.bytes_moved(size, dtype)``, at the headline size and the timed
    dtype unless given. The bytes are the fewest the op must move through device memory, so this is
    the highest intensity any implementation can have; a kernel that reads its input twice sits at
    half of it."""
    op = get_op(op) if isinstance(op, str) else op
    size = op.headline if size is None else size
    dtype = op.timed_dtypes()[0] if dtype is None else dtype
    return op.flops(size, dtype) / op.bytes_moved(size, dtype)


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """The intensity (FLOP/byte) where the memory roof meets the compute roof: below it a kernel at
    full bandwidth still leaves arithmetic idle (memory-bound); above it, the reverse
    (compute-bound)."""
    return peak_flops / bandwidth


def attainable(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """The roof at ``intensity``: min(peak FLOP/s, intensity x bytes/s)."""
    return min(peak_flops, intensity * bandwidth)
# --8<-- [end:intensity]


def _ceiling_rate(ceilings: dict, name: str) -> float | None:
    """A ceiling in base units: bytes/s for GB/s, FLOP/s for TFLOP/s; None if it was not measured."""
    c = ceilings.get(name)
    if not c:
        return None
    scale = {"GB/s": 1e9, "TFLOP/s": 1e12}.get(c["unit"])
    return c["value"] * scale if scale else None


def compute_roof(op: Op, dtype: str) -> str | None:
    """The name of the GEMM ceiling that bounds this op's arithmetic (None for integer-only work)."""
    if op.ceiling in GEMM_CEILINGS:
        return op.ceiling
    return DTYPE_ROOF.get(dtype)


def _best_record(op: Op, entry: dict) -> dict | None:
    """The fastest headline record among the book's own GPU versions (not v0, unless the op has nothing else;
    never a CPU version)."""
    rows = [r for r in headline_records(op, entry)
            if r["impl"] in op.impls and op.impls[r["impl"]].device != "cpu" and r.get("ms")]
    ours = [r for r in rows if r["impl"] != "v0"] or rows
    return min(ours, key=lambda r: r["ms"]) if ours else None


def roofline_points(results: dict[str, dict]) -> dict[str, dict[str, Any]]:
    """For every GPU in ``results``: its roofs and one point per op with rate results.

    Returns ``{gpu: {"bandwidth": bytes/s or None, "roofs": {ceiling: FLOP/s}, "points": [...],
    "bandwidth_only": [...]}}``. A point is the best own version's headline record with ``ai`` (FLOP/byte),
    ``flops_per_s`` (cost-model FLOPs / time), ``bytes_per_s``, the applicable ``roof`` and its ``ridge``,
    ``bound`` ("memory" or "compute", by the ridge point; None without both roofs) and ``fraction_of_roof``
    (achieved FLOP/s over the roof at that intensity). Ops with zero FLOPs, and ops whose bytes cross another link
than device memory (a ceiling such as ``host_link``), go to ``bandwidth_only``.
    """
    ops = load_all()
    out: dict[str, dict[str, Any]] = {}
    for gpu, data in results.items():
        ceilings = data.get("ceilings", {})
        bandwidth = _ceiling_rate(ceilings, "copy")
        roofs = {name: rate for name in GEMM_CEILINGS if (rate := _ceiling_rate(ceilings, name))}
        points, bw_only = [], []
        for name in sorted(data.get("ops", {}), key=lambda n: (ops[n].part, n) if n in ops else (99, n)):
            op = ops.get(name)
            if op is None or op.metric not in RATE_METRICS:
                continue
            entry = data["ops"][name]
            best = _best_record(op, entry)
            if best is None:
                continue
            dtype = getattr(torch, best["dtype"])
            flops, nbytes = op.flops(best["size"], dtype), op.bytes_moved(best["size"], dtype)
            seconds = best["ms"] * 1e-3
            p = {"op": name, "title": op.title, "chapter": op.chapter, "impl": best["impl"], "lang": best["lang"],
                 "desc": best["desc"], "dtype": best["dtype"], "size": best["size"], "ms": best["ms"],
                 "flops": flops, "bytes": nbytes, "ai": flops / nbytes, "flops_per_s": flops / seconds,
                 "bytes_per_s": nbytes / seconds, "value": best["value"], "unit": best["unit"],
                 "fraction_of_ceiling": best.get("fraction_of_ceiling"),
                 "ceiling": (entry.get("ceiling") or {}).get("name"),
                 "stale": best["impl"] in stale_impls(op, entry)}
            if flops == 0 or p["ceiling"] not in (None, "copy", *GEMM_CEILINGS):
                # no arithmetic, or bytes that cross another link than device memory (the host link): the
                # device-memory roofline does not apply, so the op is listed with its own ceiling instead
                bw_only.append(p)
                continue
            roof = compute_roof(op, best["dtype"])
            peak = roofs.get(roof) if roof else None
            p.update(roof=roof, peak=peak, ridge=None, bound=None, fraction_of_roof=None)
            if peak and bandwidth:
                p["ridge"] = ridge_point(peak, bandwidth)
                p["bound"] = "memory" if p["ai"] < p["ridge"] else "compute"
                p["fraction_of_roof"] = p["flops_per_s"] / attainable(p["ai"], peak, bandwidth)
            points.append(p)
        out[gpu] = {"bandwidth": bandwidth, "roofs": roofs, "points": points, "bandwidth_only": bw_only}
    return out


__all__ = ["ROOF_LABEL", "arithmetic_intensity", "attainable", "compute_roof", "ridge_point",
           "roofline_points"]
