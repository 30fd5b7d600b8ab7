"""Every auto-checked exercise, by id (``partN.<chapter>.<number>``), in book order."""

from __future__ import annotations

import re

from exercises.catalog import part1, part2, part3, part4, part5, part6, part7, part8
from exercises.engine import REPO_ROOT, Exercise


def _nav_order() -> dict[str, int]:
    """Chapter page -> its position in mkdocs.yml's nav (the book's reading order)."""
    nav = (REPO_ROOT / "mkdocs.yml").read_text() if (REPO_ROOT / "mkdocs.yml").is_file() else ""
    pages = re.findall(r"(part\d/[\w-]+\.md)", nav)
    return {p: i for i, p in reversed(list(enumerate(pages)))}


_ORDER = _nav_order()
_PARTS = (part1, part2, part3, part4, part5, part6, part7, part8)
EXERCISES: dict[str, Exercise] = {ex.id: ex for ex in sorted(
    (ex for mod in _PARTS for ex in mod.EXERCISES),
    key=lambda ex: (ex.part, _ORDER.get(ex.chapter, 999), ex.number))}
if len(EXERCISES) != sum(len(m.EXERCISES) for m in _PARTS):
    raise ValueError("two exercises share an id")


def get(ex_id: str) -> Exercise:
    if ex_id not in EXERCISES:
        close = [i for i in EXERCISES if ex_id.split(".")[0] in i and ex_id.split(".")[-1] in i.split(".")[-1]]
        raise KeyError(f"no exercise {ex_id!r}" + (f"; did you mean {', '.join(close[:5])}?" if close else "")
                       + " (python -m snippets exercise list shows them all)")
    return EXERCISES[ex_id]
