"""part3.measuring.4: Project: a new metric for the benchmarking harness

A PLANTED WRONG SOLUTION ('intensity_inverted'): the solution with a bug put in on purpose, for the
checker's tests (--planted intensity_inverted checks it).

Chapter: docs/part3/measuring.md, exercise 4. Difficulty 2 of 4 (write a few lines).

Extend the harness with the metrics a roofline needs: from an op's cost model (bytes moved,
FLOPs) and a measured median time in milliseconds, compute the achieved GB/s and TFLOP/s, the
arithmetic intensity, the attainable rate under the roofline of a GPU with given peaks, the
fraction of that roof, and which roof applies. Then apply it to a registered op (Op.bytes_moved,
Op.flops).

Check it:  python -m snippets exercise check part3.measuring.4
"""


def achieved(bytes_moved: int, flops: int, ms: float) -> dict:
    """{"gb_per_s", "tflop_per_s", "intensity"} of a run that moved ``bytes_moved`` bytes and did ``flops``
    FLOPs in ``ms`` milliseconds (intensity in FLOP/byte)."""
    seconds = ms * 1e-3
    return {"gb_per_s": bytes_moved / seconds / 1e9, "tflop_per_s": flops / seconds / 1e12,
            "intensity": bytes_moved / max(flops, 1)}


def roofline(bytes_moved: int, flops: int, ms: float, peak_gb_per_s: float, peak_tflop_per_s: float) -> dict:
    """achieved() plus "attainable_tflop_per_s" (the roof at this intensity), "fraction_of_roof" (achieved
    TFLOP/s over the attainable) and "bound" ("memory" or "compute": which roof is the lower here)."""
    out = achieved(bytes_moved, flops, ms)
    memory_roof = out["intensity"] * peak_gb_per_s / 1000  # TFLOP/s the bandwidth allows
    out["attainable_tflop_per_s"] = min(peak_tflop_per_s, memory_roof)
    out["fraction_of_roof"] = out["tflop_per_s"] / out["attainable_tflop_per_s"]
    out["bound"] = "memory" if memory_roof < peak_tflop_per_s else "compute"
    return out


def for_op(op, size: dict, dtype, ms: float) -> dict:
    """achieved() for an op of the registry (snippets.registry.Op) at ``size`` and ``dtype``, from its cost
    model (op.bytes_moved(size, dtype), op.flops(size, dtype))."""
    return achieved(op.bytes_moved(size, dtype), op.flops(size, dtype), ms)
