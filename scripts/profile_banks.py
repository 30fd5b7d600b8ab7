"""Launch the shared-memory bank micro-benchmark once for every pattern of its sweep, for a profiler
(GPU only; scripts/capture_outputs.sh runs it under Nsight Compute):

    ncu --clock-control none --kernel-name regex:smem_read --metrics ... \\
        python scripts/profile_banks.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from snippets.part2.banks import BLOCKS, SWEEP, smem_bank_read  # noqa: E402

# --8<-- [start:profile]
# python scripts/profile_banks.py: each benchmark pattern once, for a profiler
if __name__ == "__main__":
    seed = torch.zeros(BLOCKS, dtype=torch.int32, device="cuda")
    for size in SWEEP:
        smem_bank_read(seed, size["stride"], size["layout"])
    torch.cuda.synchronize()
# --8<-- [end:profile]
