"""SM clock and board power while a tensor-core kernel runs back to back: the tensor-cores chapter's
evidence for what a clock does under load.

    python scripts/capture_mma_power.py OUT.txt [--seconds 3]

Commit the file as ``benchmarks/results/outputs/<gpu>/mma_power.txt``; the chapter shows it with
``<!-- bench:output mma_power -->``.

Each kernel (``mma_rate`` v1 and v2 at their headline, ``wmma_gemm`` v0 (cuBLAS) and v7 at 4096^3)
runs in batches of calls for ``--seconds`` while ``nvidia-smi`` samples the SM clock, the power draw
and the active clock-event reasons every 100 ms. The table gives, per kernel, the sustained rate
(the batches' work over their CUDA-event time), the median clock and power over the second half of
the samples (after the clock has settled), the reasons seen there, and two ratios the chapter
reads: work per SM per clock cycle (the rate with the clock divided out) and work per joule.
The harness's own timings (``python -m snippets bench``) run shorter bursts; their rates can be
higher than these, at a clock that had not settled yet.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import snippets.part3.wmma_v7  # noqa: E402,F401  (registers wmma_gemm v7)
from snippets.bench.captures import record  # noqa: E402
from snippets.part3.mma_rate import mma_rate  # noqa: E402
from snippets.part3.wmma import wmma_gemm  # noqa: E402

# the ops by name, imported directly (not through snippets.op_index, whose every new op would mark
# this capture stale: a capture's hash covers the modules its script imports)
OPS = {"mma_rate": mma_rate, "wmma_gemm": wmma_gemm}

# (label, op, version, size): what runs; None takes the op's headline
KERNELS = (("mma_rate v1 (registers)", "mma_rate", "v1", None),
           ("mma_rate v2 (ldmatrix)", "mma_rate", "v2", None),
           ("wmma_gemm v0 (cuBLAS)", "wmma_gemm", "v0", {"m": 4096, "n": 4096, "k": 4096}),
           ("wmma_gemm v7", "wmma_gemm", "v7", {"m": 4096, "n": 4096, "k": 4096}))
QUERY = "clocks.sm,power.draw,clocks_event_reasons.active"
# bits of clocks_event_reasons (nvidia-smi --help-query-gpu; NVML's nvmlClocksEventReasons)
REASONS = {0x1: "idle", 0x2: "application clocks", 0x4: "software power cap", 0x8: "hardware slowdown",
           0x20: "software thermal", 0x40: "hardware thermal", 0x80: "power brake"}


def parse_samples(text: str) -> list[tuple[float, float, int]]:
    """``nvidia-smi --format=csv,noheader,nounits`` lines of QUERY -> [(MHz, W, reason bits)]; lines
    that do not parse (a header, an [N/A]) are skipped."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            out.append((float(parts[0]), float(parts[1]), int(parts[2], 16)))
        except (ValueError, IndexError):
            continue
    return out


def settled(samples: list[tuple[float, float, int]]) -> tuple[float, float, str]:
    """Median clock and power over the second half of the samples, and the reasons seen there."""
    if not samples:
        raise ValueError("no nvidia-smi samples: is nvidia-smi on PATH and the GPU visible?")
    tail = samples[len(samples) // 2:]
    bits = 0
    for _, _, b in tail:
        bits |= b
    names = [name for bit, name in REASONS.items() if bits & bit] or ["none"]
    return statistics.median(s[0] for s in tail), statistics.median(s[1] for s in tail), ", ".join(names)


def sustained(fn, args, flops: int, seconds: float, gpu: int) -> tuple[float, list]:
    """Run fn(*args) in batches of 10 for ``seconds``; TFLOP/s over the batches, and the samples."""
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", "-i", str(gpu), f"--query-gpu={QUERY}",
                            "--format=csv,noheader,nounits", "-lms", "100"],
                           stdout=subprocess.PIPE, text=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls, t0 = 0, time.monotonic()
    start.record()
    while time.monotonic() - t0 < seconds:
        for _ in range(10):
            fn(*args)
        calls += 10
        torch.cuda.synchronize()
    end.record()
    end.synchronize()
    smi.terminate()
    text = smi.communicate()[0]
    return flops * calls / (start.elapsed_time(end) * 1e-3) / 1e12, parse_samples(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    lines = [f"GPU: {props.name}, {props.multi_processor_count} SMs; each kernel run back to back for "
             f"{args.seconds:g} s, nvidia-smi sampling every 100 ms; clock and power: medians over the "
             "second half of the samples", "",
             f"{'kernel':26} {'TFLOP/s':>8} {'SM MHz':>7} {'power W':>8} {'FLOP/SM/cycle':>14} "
             f"{'TFLOP/J':>8}  clock-event reasons"]
    for label, op_name, version, size in KERNELS:
        op = OPS[op_name]
        size = size or op.headline
        gen = torch.Generator().manual_seed(0)
        inputs = op.make_inputs(size, torch.float16, dev, gen)
        rate, samples = sustained(op.impls[version].fn, inputs, op.flops(size, torch.float16),
                                  args.seconds, dev.index or 0)
        mhz, watts, why = settled(samples)
        per_cycle = rate * 1e12 / (props.multi_processor_count * mhz * 1e6)
        lines.append(f"{label:26} {rate:8.1f} {mhz:7.0f} {watts:8.1f} {per_cycle:14.0f} "
                     f"{rate / watts:8.3f}  {why}")
        print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    record(args.out)


if __name__ == "__main__":
    main()
