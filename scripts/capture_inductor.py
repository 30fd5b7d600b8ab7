#!/usr/bin/env python3
"""What torch.compile generates for the book's blocks on this GPU: one text file per block, for the
torch.compile chapter (``<!-- bench:output inductor_NAME -->``).

For every block in ``snippets.part5.inductor.BLOCKS`` (bias+GELU+dropout+residual, softmax, LayerNorm, RMSNorm,
SwiGLU, linear+GELU with the default GEMM backend and with max-autotune Triton templates, and the LoRA layer),
compiled with static shapes on bf16 inputs of 4096 x 4096: the steps of the generated wrapper (kernels,
cuBLAS calls, ops called as they are) and the source of each generated Triton kernel. Softmax is captured a
second time with rows of 32768, to compare the reduction Inductor picks at the two widths. A summary
of all blocks goes to inductor_summary.txt. Run on the GPU runner:

    python scripts/capture_inductor.py benchmarks/results/outputs/<gpu>/

(``--device cpu --rows 64 --width 128`` runs the same on a CPU, C++ in place of Triton, as a check of the
script.) A block that fails to compile is reported in its file and in the summary, and the others still run.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from snippets.bench.captures import record  # noqa: E402
from snippets.part5 import inductor as ind  # noqa: E402

WIDE_SOFTMAX = 32768  # a row too long for one program's registers: Inductor loops over it


def _header(device: str) -> str:
    import triton

    where = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    return f"{where}; torch {torch.__version__}; triton {triton.__version__}"


def capture_block(name: str, device: str, dtype: torch.dtype, rows: int, width: int,
                  label: str | None = None) -> tuple[str, str]:
    """(report text, one summary line) for one block."""
    fn, kwargs = ind.BLOCKS[name]
    args = ind.block_inputs(name, device, dtype, rows=rows, width=width)
    cap = ind.capture(fn, *args, **kwargs)
    want = fn(*args)
    err = (cap.output.float() - want.float()).abs().max().item() if name != "bias_gelu_dropout_residual" else None
    text = ind.report(name, cap)
    if err is not None:
        text = text.replace("\n", f"; max |compiled - eager| = {err:.3g}\n", 1)
    scheds = cap.schedules
    line = (f"{label or name:<28} {len(cap.code):>6} {sum(len(s.kernels) for s in scheds):>8} "
            f"{sum(len(s.externs()) for s in scheds):>7}  "
            + ", ".join(f"{k.name} [{k.kind or k.backend}]" for s in scheds for k in s.kernels.values())
            + "".join(f", extern {e}" for s in scheds for e in s.externs()))
    return text, line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--width", type=int, default=4096)
    opts = parser.parse_args()
    dtype = torch.bfloat16 if opts.device == "cuda" else torch.float32
    opts.outdir.mkdir(parents=True, exist_ok=True)
    header = (f"{_header(opts.device)}; {str(dtype)[6:]}, {opts.rows} x {opts.width} inputs, "
              "torch.compile(dynamic=False)")
    summary = [header, "", f"{'block':<28} {'graphs':>6} {'kernels':>8} {'externs':>7}  "
               "kernels (kind), external calls"]
    status = 0
    for name in ind.BLOCKS:
        path = opts.outdir / f"inductor_{name}.txt"
        try:
            text, line = capture_block(name, opts.device, dtype, opts.rows, opts.width)
            if name == "softmax":  # the same function on rows too long for registers
                wide_rows = max(1, opts.rows // 8)  # 512 x 32768: as many elements as 4096 x 4096
                wide, wide_line = capture_block(name, opts.device, dtype, wide_rows, WIDE_SOFTMAX,
                                                label=f"softmax ({WIDE_SOFTMAX} wide)")
                text += f"\n\n=== the same block on {wide_rows} x {WIDE_SOFTMAX} inputs ===\n\n" + wide
                summary.append(line)
                line = wide_line
            summary.append(line)
            path.write_text(f"{header}\n\n{text}")
            record(path)  # NAME.meta.json: the hash of the code that produced it
        except Exception as exc:  # noqa: BLE001 (report and go on: one block must not lose the others)
            status = 1
            path.write_text(f"{header}\n\nblock {name} failed:\n{traceback.format_exc()}")
            summary.append(f"{name:<28} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
        print(summary[-1], flush=True)
    (opts.outdir / "inductor_summary.txt").write_text("\n".join(summary) + "\n")
    record(opts.outdir / "inductor_summary.txt")
    return status


if __name__ == "__main__":
    sys.exit(main())
