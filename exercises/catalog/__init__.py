"""Every auto-checked exercise, by id (``partN.<chapter>.<number>``), in book order."""

from __future__ import annotations

from exercises.catalog import part1, part2, part3, part4, part5
from exercises.engine import Exercise

EXERCISES: dict[str, Exercise] = {ex.id: ex for mod in (part1, part2, part3, part4, part5)
                                  for ex in mod.EXERCISES}
if len(EXERCISES) != sum(len(m.EXERCISES) for m in (part1, part2, part3, part4, part5)):
    raise ValueError("two exercises share an id")


def get(ex_id: str) -> Exercise:
    if ex_id not in EXERCISES:
        close = [i for i in EXERCISES if ex_id.split(".")[0] in i and ex_id.split(".")[-1] in i.split(".")[-1]]
        raise KeyError(f"no exercise {ex_id!r}" + (f"; did you mean {', '.join(close[:5])}?" if close else "")
                       + " (python -m snippets exercise list shows them all)")
    return EXERCISES[ex_id]
