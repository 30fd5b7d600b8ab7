"""Run the book's CUDA code under compute-sanitizer (memcheck): the standalone programs, and every CUDA C and
Triton implementation in the registry at awkward sizes (1, odd, unaligned views). Exit 1 on any finding.

    python scripts/sanitize.py             # driver: builds the programs, runs everything under the sanitizer
    python scripts/sanitize.py --workload  # the Python workload the driver runs under the sanitizer
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = {"hello.cu": ["3", "5"], "vector_add_main.cu": ["4099"], "device_query.cu": []}
SANITIZER = ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "1", "--leak-check", "full"]


def workload() -> None:
    import torch

    sys.path.insert(0, str(ROOT))
    from snippets.op_index import load_all

    gen = torch.Generator().manual_seed(0)
    for op in load_all().values():
        for impl in op.impls.values():
            if impl.name == "v0" or not impl.runs_on("cuda") or impl.timer == "host":
                continue
            for size in op.test_sizes:
                args = op.make_inputs(size, op.dtypes[0], "cuda", gen)
                impl.fn(*args)
                # an unaligned view of every tensor argument: the vectorized paths must not overrun
                if "n" in size and size["n"] > 1 and "pattern" not in size:
                    bigger = op.make_inputs({**size, "n": size["n"] + 1}, op.dtypes[0], "cuda", gen)
                    try:
                        impl.fn(*(a[1:] if isinstance(a, torch.Tensor) else a for a in bigger))
                    except (TypeError, ValueError):
                        pass  # refused with a clear error: what bad input should get; memory stays safe
        torch.cuda.synchronize()
        print(f"ran {op.name}", flush=True)


def main() -> int:
    if "--workload" in sys.argv:
        workload()
        return 0
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for src, args in PROGRAMS.items():
            exe = Path(tmp) / Path(src).stem
            subprocess.run(["nvcc", "-std=c++17", "-O3", "-arch=native", "-I", str(ROOT / "csrc/common"),
                            "-o", str(exe), str(ROOT / "csrc/part1" / src)], check=True)
            r = subprocess.run([*SANITIZER, str(exe), *args], capture_output=True, text=True)
            print(f"--- {src} {' '.join(args)}: exit {r.returncode}\n{r.stdout[-1500:]}{r.stderr[-1500:]}")
            if r.returncode:
                failed.append(src)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(SANITIZER[:5] + [sys.executable, __file__, "--workload"],  # no leak check: torch caches
                       capture_output=True, text=True, env=env)
    print(f"--- registry workload: exit {r.returncode}\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    if r.returncode:
        failed.append("registry workload")
    print("sanitizer findings in: " + ", ".join(failed) if failed else "compute-sanitizer: no errors")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
