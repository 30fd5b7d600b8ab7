"""Write the "What is measured" table of README.md from the committed results (``--check``: only compare).

The table sits between the markers ``<!-- measured:start -->`` and ``<!-- measured:end -->``; the test suite
fails when it differs from what the results say, so the README cannot drift from the measurements.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from snippets.bench.report import report  # noqa: E402
from snippets.site import _cname  # noqa: E402

START, END = "<!-- measured:start -->", "<!-- measured:end -->"


def table() -> str:
    lines = ["| part | op | GPU | best version | rate | % of ceiling | vs library |",
             "|--:|:--|:--|:--|--:|--:|--:|"]
    for r in report():
        if r["device"] is None or r["value"] is None:
            lines.append(f"| {r['part']} | `{r['op']}` | not measured yet | | | | |")
            continue
        stale = "" if r["fresh"] else " (stale)"
        sp = f"{r['speedup_vs_baseline']:.3g}x" if r["speedup_vs_baseline"] else "-"
        frac = (f"{100 * r['fraction_of_ceiling']:.1f}% of {_cname(r['ceiling'])}"
                if r["fraction_of_ceiling"] is not None else "-")
        lines.append(f"| {r['part']} | `{r['op']}` | {r['device']} | {r['best_impl']} {r['best_lang']}{stale} | "
                     f"{r['value']:,.1f} {r['unit']} | {frac} | {sp} |")
    return "\n".join(lines)


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
