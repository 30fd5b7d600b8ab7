"""Print the measuring chapter's table: the same work timed the wrong ways and the right way
(``snippets.part3.measuring.timing_pitfalls``; GPU only). scripts/capture_outputs.sh captures it
as timing_pitfalls.txt.

    python scripts/capture_timing_pitfalls.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from snippets.part3.measuring import format_rows, timing_pitfalls  # noqa: E402

if __name__ == "__main__":
    print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    print(format_rows(timing_pitfalls()))
