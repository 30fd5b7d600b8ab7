"""Measuring GPU code: the same work timed the wrong ways and the right way, side by side.

``timing_pitfalls()`` runs on a GPU and returns one row per method;
``python scripts/capture_timing_pitfalls.py`` prints them (the GPU runner captures that output for
the chapter). Every row times real work on random data:

1. host clock, no synchronize: measures only the launch, since kernels run asynchronously;
2. host clock around one call with a synchronize before and after: right for one call, but includes
   launch overhead and host noise;
3. CUDA events, the median of many calls on the same small input: the input stays in L2, so this is
   a cache measurement;
4. CUDA events, inputs rotated over more than L2 (what the book's harness does): DRAM bandwidth;
5. a bf16 matrix product on zeros against the same product on random data: the hardware does less
   work (fewer bit toggles, lower power, higher clocks) on zeros, so zeros flatter the result.
"""

from __future__ import annotations

import time

import torch

from snippets.bench.timing import rotation, time_device


def _add_rate(n: int, ms: float) -> float:
    return 3 * n * 4 / (ms * 1e-3) / 1e9  # GB/s: read x and y, write out, fp32


# --8<-- [start:pitfalls]
def timing_pitfalls(n_large: int = 2**28, n_small: int = 2**20, m: int = 8192) -> list[dict]:
    """Time vector add and a bf16 matmul in five ways; rows of {method, what, ms, rate, unit}."""
    if not torch.cuda.is_available():
        raise RuntimeError("timing_pitfalls times GPU work, and torch sees no CUDA GPU")
    rows = []
    x, y = torch.randn(n_large, device="cuda"), torch.randn(n_large, device="cuda")
    torch.add(x, y)  # warm-up: the first call pays for loading the kernel
    torch.cuda.synchronize()

    # 1. WRONG: the add is only queued when the clock stops
    t0 = time.perf_counter()
    torch.add(x, y)
    ms = (time.perf_counter() - t0) * 1e3
    rows.append(dict(method="host clock, no synchronize",
                     what=f"add, n=2^{n_large.bit_length() - 1}", ms=ms,
                     rate=_add_rate(n_large, ms), unit="GB/s"))
    torch.cuda.synchronize()

    # 2. one call, synchronized: includes launch latency and host jitter
    t0 = time.perf_counter()
    torch.add(x, y)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    rows.append(dict(method="host clock, synchronized, one call",
                     what=f"add, n=2^{n_large.bit_length() - 1}", ms=ms,
                     rate=_add_rate(n_large, ms), unit="GB/s"))

    xs, ys = torch.randn(n_small, device="cuda"), torch.randn(n_small, device="cuda")
    # 3. WRONG for DRAM: the same 12 MB every call stays in L2
    t = time_device(torch.add, [(xs, ys)])
    rows.append(dict(method="CUDA events, same small input (warm L2)",
                     what=f"add, n=2^{n_small.bit_length() - 1}", ms=t.median,
                     rate=_add_rate(n_small, t.median), unit="GB/s"))

    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 64 * 2**20
    # 4. RIGHT: rotate inputs (and flush) as the harness does
    sets, flush = rotation(3 * n_small * 4, l2)
    arg_sets = [(torch.randn(n_small, device="cuda"), torch.randn(n_small, device="cuda"))
                for _ in range(sets)]
    buf = torch.empty(2 * l2 // 4, device="cuda") if flush else None
    t = time_device(torch.add, arg_sets, flush=buf)
    rows.append(dict(method="CUDA events, inputs rotated past L2",
                     what=f"add, n=2^{n_small.bit_length() - 1}", ms=t.median,
                     rate=_add_rate(n_small, t.median), unit="GB/s"))

    # 5. zeros flatter a matmul
    for label, make in (("zeros", torch.zeros), ("random", torch.randn)):
        a = make(m, m, device="cuda", dtype=torch.bfloat16)
        b = make(m, m, device="cuda", dtype=torch.bfloat16)
        t = time_device(torch.matmul, [(a, b)], budget_ms=400)
        rows.append(dict(method=f"CUDA events, matmul on {label}", what=f"bf16 matmul {m}^3",
                         ms=t.median, rate=2 * m**3 / (t.median * 1e-3) / 1e12, unit="TFLOP/s"))
    return rows
# --8<-- [end:pitfalls]


def format_rows(rows: list[dict]) -> str:
    width = max(len(r["method"]) for r in rows)
    lines = [f"{'method':<{width}}  {'work':<22} {'time':>12}  rate"]
    for r in rows:
        lines.append(f"{r['method']:<{width}}  {r['what']:<22} {r['ms'] * 1e3:>9.1f} us  "
                     f"{r['rate']:,.1f} {r['unit']}")
    return "\n".join(lines)
