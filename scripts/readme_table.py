"""Write the "What is measured" table of README.md from the committed results (``--check``: only compare).

The table sits between the markers ``<!-- measured:start -->`` and ``<!-- measured:end -->``; the test suite
fails when it differs from what the results say, so the README cannot drift from the measurements.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from snippets.bench.report import report  # noqa: E402
from snippets.op_index import load_all  # noqa: E402
from snippets.site.tables import SUMMARY_HEAD, summary_row  # noqa: E402

START, END = "<!-- measured:start -->", "<!-- measured:end -->"


def table() -> str:
    load_all()  # every op registered, whatever was imported before: the report lists what is
    rows = [summary_row(r, f"`{r['op']}`") for r in report()]
    # the README is read on a code host, where HTML spans show as text: stale marks become plain words
    rows = [re.sub(r'<span class="bench-stale">(.*?)</span>', r"(\1)", row) for row in rows]
    return "\n".join(SUMMARY_HEAD + rows)


def render(readme: str) -> str:
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table()}\n{END}{tail}"


def main() -> int:
    path = ROOT / "README.md"
    text = path.read_text()
    new = render(text)
    if "--check" in sys.argv:
        if new != text:
            print("README.md's measured table is out of date: run python scripts/readme_table.py")
            return 1
        return 0
    path.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
