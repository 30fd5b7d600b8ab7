"""``python -m snippets exercise {list,show,check}``."""

from __future__ import annotations

import argparse
import json
import sys

from exercises.engine import DIFFICULTY, KINDS, check, planted_names, rel, resolve, wrap


def rows() -> list[dict]:
    """One record per exercise: what ``list`` prints and docs/exercises.md shows."""
    from exercises.catalog import EXERCISES

    return [{"id": ex.id, "part": ex.part, "chapter": ex.chapter, "number": ex.number, "title": ex.title,
             "difficulty": ex.difficulty, "difficulty_name": DIFFICULTY[ex.difficulty], "kind": ex.kind,
             "files": list(ex.files), "check": ex.command, "gpu": ex.gpu, "planted": sorted(ex.planted)}
            for ex in EXERCISES.values()]


def print_list(records: list[dict]) -> None:
    head = f"{'id':27s} {'part':4s} {'chapter':31s} {'difficulty':20s} {'kind':7s} check"
    print(head)
    for r in records:
        print(f"{r['id']:27s} {r['part']:<4d} {r['chapter'] + ' #' + str(r['number']):31s} "
              f"{str(r['difficulty']) + ' ' + r['difficulty_name']:20s} {r['kind']:7s} {r['check']}")
    print(f"\n{len(records)} exercises. Difficulty: " + "; ".join(f"{k} {v}" for k, v in DIFFICULTY.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m snippets exercise",
                                     description="The book's self-checking exercises (exercises/).")
    sub = parser.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list", help="every exercise: id, part, chapter, difficulty, kind, check command")
    ls.add_argument("--part", type=int, help="only this part")
    ls.add_argument("--json", action="store_true", help="one JSON record per exercise")
    sh = sub.add_parser("show", help="an exercise's task, files and hint")
    sh.add_argument("id")
    ck = sub.add_parser("check", help="run an exercise's checks on your file (exercises/partN/...)")
    ck.add_argument("id")
    which = ck.add_mutually_exclusive_group()
    which.add_argument("--solution", action="store_true", help="check the reference solution instead")
    which.add_argument("--planted", metavar="NAME", help="check a planted wrong solution instead")
    args = parser.parse_args(argv)

    from exercises.catalog import get

    if args.cmd == "list":
        records = [r for r in rows() if args.part is None or r["part"] == args.part]
        if args.json:
            for r in records:
                print(json.dumps(r))
        else:
            print_list(records)
        return 0
    try:
        ex = get(args.id)
    except KeyError as exc:
        print(exc.args[0], file=sys.stderr)
        return 2
    if args.cmd == "show":
        print(f"{ex.id}: {ex.title}")
        for label, text in (("chapter", f"docs/{ex.chapter}, exercise {ex.number}"),
                            ("difficulty", f"{ex.difficulty} ({DIFFICULTY[ex.difficulty]})"),
                            ("kind", f"{ex.kind}: {KINDS[ex.kind]}"), ("task", ex.task),
                            ("edit", ", ".join(rel(p) for p in resolve(ex).values())), ("check", ex.command),
                            ("hint", ex.hint),
                            ("solution", ", ".join(rel(p) for p in resolve(ex, "solution").values())),
                            ("planted", f"{', '.join(planted_names(ex))} (--planted NAME checks one)"),
                            ("GPU only", ex.gpu)):
            if text:
                print(wrap(f"  {label + ':':12s}", text))
        return 0
    variant = "solution" if args.solution else "planted" if args.planted else "learner"
    try:
        result = check(ex, variant, args.planted)
    except KeyError as exc:
        print(exc.args[0], file=sys.stderr)
        return 2
    print(result.report())
    return 1 if not result.passed else 3 if result.incomplete else 0


if __name__ == "__main__":
    raise SystemExit(main())
