"""Write the table of docs/exercises.md from the exercise catalogue (``--check``: only compare).

The table sits between the markers ``<!-- exercises:start -->`` and ``<!-- exercises:end -->``. It is made from
the same records that ``python -m snippets exercise list --json`` prints (``exercises.cli.rows``), and the test
suite fails when the committed page differs from them (tests/test_exercises.py), so the page cannot drift from
the exercises. A sample report, the output of one planted wrong solution's check, is regenerated with it.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exercises.cli import rows  # noqa: E402
from exercises.engine import DIFFICULTY, check  # noqa: E402

PAGE = ROOT / "docs" / "exercises.md"
START, END = "<!-- exercises:start -->", "<!-- exercises:end -->"
SAMPLE_START, SAMPLE_END = "<!-- exercises:sample:start -->", "<!-- exercises:sample:end -->"
SAMPLE = ("part1.execution-model.1", "no_rounding")  # a model exercise: the same report on any machine
PART_TITLES = {1: "Part 1: GPUs and first kernels", 2: "Part 2: the memory hierarchy",
               3: "Part 3: performance engineering", 4: "Part 4: Triton", 5: "Part 5: fusion and FlashAttention",
               6: "Part 6: CuTe-style tiling"}


def chapter_title(chapter: str) -> str:
    for line in (ROOT / "docs" / chapter).read_text().splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return chapter


def table() -> str:
    records = rows()
    out = []
    for part in sorted({r["part"] for r in records}):
        out += [f"### {PART_TITLES.get(part, f'Part {part}')}", "",
                "| Exercise | Chapter | Difficulty | Kind | Check it |", "|:--|:--|:--|:--|:--|"]
        for r in (r for r in records if r["part"] == part):
            gpu = " (GPU part: see below)" if r["gpu"] else ""
            title = r["title"].replace("|", "\\|")
            out.append(f"| {title}{gpu} | [{chapter_title(r['chapter'])}, exercise {r['number']}]"
                       f"({r['chapter']}#exercises) | {r['difficulty']}: {r['difficulty_name']} | {r['kind']} | "
                       f"`{r['check']}` |")
        out.append("")
    out += ["### What only a GPU checks", "",
            "Everything else runs on any machine. These parts of a check run when a GPU is present, and are "
            "reported as skipped otherwise:", ""]
    out += [f"- `{r['id']}` ({r['title']}): {r['gpu']}." for r in records if r["gpu"]]
    counts = ", ".join(f"{sum(r['difficulty'] == d for r in records)} of difficulty {d}" for d in DIFFICULTY)
    out += ["", f"{len(records)} exercises: {counts}."]
    return "\n".join(out)


def sample() -> str:
    from exercises.catalog import get

    ex_id, planted = SAMPLE
    result = check(get(ex_id), "planted", planted)
    return (f"```text\n$ python -m snippets exercise check {ex_id} --planted {planted}\n{result.report()}\n```")


def _between(text: str, start: str, end: str, body: str) -> str:
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def render(text: str) -> str:
    text = _between(text, START, END, table())
    return _between(text, SAMPLE_START, SAMPLE_END, sample())


def main() -> int:
    text = PAGE.read_text()
    new = render(text)
    if "--check" in sys.argv:
        if new != text:
            print("docs/exercises.md is out of date: run python scripts/exercise_table.py")
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
