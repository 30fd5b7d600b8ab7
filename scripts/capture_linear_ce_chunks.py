"""The chunk-size sweep of the cross-entropy chapter (GPU only): ``linear_cross_entropy_grads`` in
bf16 at each chunk size, time and peak memory (``snippets.part5.cross_entropy.sweep_chunks``).

    python scripts/capture_linear_ce_chunks.py [OUT.txt]

scripts/capture_part5.sh writes it as linear_ce_chunks.txt.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from snippets.bench.captures import record  # noqa: E402
from snippets.part5.cross_entropy import format_sweep, sweep_chunks  # noqa: E402

if __name__ == "__main__":
    started = time.time()
    text = format_sweep(sweep_chunks())
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text)
        record(Path(sys.argv[1]))  # NAME.meta.json: the hash of the code that produced it
    print(text, end="")
    print(f"({time.time() - started:.0f} s)", file=sys.stderr)
