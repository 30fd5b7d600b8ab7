"""The directives of a page and their dispatch: ``render_page`` replaces every ``<!-- bench:KIND ... -->``.

Two rules keep what a directive renders from swallowing the prose around it:

- the directive pattern matches its own line and nothing after it (``[ \\t]*$``, never ``\\s*$``, which with
  ``re.MULTILINE`` eats the blank line below and glues the next paragraph to whatever the directive rendered);
- every provenance footnote a directive renders (``[^label]: ...`` lines) is moved to the end of the page, so no
  paragraph that follows a table can continue a footnote definition.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from snippets.bench.report import RESULTS_DIR, load_results
from snippets.op_index import load_all
from snippets.site.fmt import _args

DIRECTIVE = re.compile(r"^([ \t]*)<!--\s*bench:(\w+)(.*?)-->[ \t]*$", re.MULTILINE)
FOOTNOTE_DEF = re.compile(r"^[ \t]*(\[\^[\w-]+\]: .*)$", re.MULTILINE)


class Ctx:
    """What a directive's renderer may use: the results, the registry, the page and its arguments."""

    def __init__(self, results: dict, ops: dict, results_dir: Path, page_path: str, raw: str) -> None:
        self.results, self.ops, self.results_dir, self.page_path, self.raw = results, ops, results_dir, page_path, raw
        self.pos, self.kw = _args(raw)

    def name(self) -> str:
        return self.pos[0] if self.pos else ""

    def op(self):
        if not self.pos or self.pos[0] not in self.ops:
            raise ValueError(f"{self.page_path}: names unknown op {self.pos[:1]}; known: {sorted(self.ops)}")
        return self.ops[self.pos[0]]


def _summary(c: Ctx) -> str:
    from snippets.site.tables import render_summary

    return render_summary(c.results_dir)


def _ceilings(c: Ctx) -> str:
    from snippets.site.tables import render_ceilings

    return render_ceilings(c.results)


def _output(c: Ctx) -> str:
    from snippets.site.tables import render_output

    return render_output(c.name(), c.results_dir)


def _roofline(c: Ctx) -> str:
    from snippets.site.roofline import render_roofline

    return render_roofline(c.results)


def _sweep(c: Ctx) -> str:
    from snippets.site.sweep import render_sweep

    return render_sweep(c.name(), c.results_dir)


def _versus(c: Ctx) -> str:
    from snippets.site.tables import parse_versus, render_versus

    return render_versus(parse_versus(c.raw), c.results, c.ops)


def _goal(c: Ctx) -> str:
    from snippets.site.goals import parse_goal, render_goal

    return render_goal(*parse_goal(c.pos, c.ops), c.results, c.kw.get("dtype"), c.kw.get("size"), c.ops)


def _timeline(c: Ctx) -> str:
    from snippets.site.timeline import render_timeline

    return render_timeline(c.name(), c.results_dir)


def _table(c: Ctx) -> str:
    from snippets.site.tables import render_table

    fold = c.kw.get("fold", "yes")
    if fold not in ("yes", "no"):
        raise ValueError(f"fold= takes yes or no, got {fold!r}")
    op = c.op()
    apart = [v for v in c.kw.get("memory-apart", "").split(",") if v]
    unknown = [v for v in apart if v not in op.impls]
    if unknown:
        raise ValueError(f"memory-apart= names versions {op.name} does not have: {', '.join(unknown)}")
    return render_table(op, c.results, c.kw.get("sizes", "headline"), c.kw.get("dtype"), fold == "yes",
                        memory_apart=set(apart))


def _headline(c: Ctx) -> str:
    from snippets.site.tables import render_headline

    return render_headline(c.op(), c.results, c.kw.get("dtype"))


def _plot(c: Ctx) -> str:
    from snippets.site.figures import render_plot

    return render_plot(c.op(), c.results, c.kw.get("y", "value"), c.kw.get("dtype"))


def _ladder(c: Ctx) -> str:
    from snippets.site.figures import render_ladder

    return render_ladder(c.op(), c.results)


def _export(c: Ctx) -> str:
    from snippets.site.export_box import render

    return render(c)


def _diagram(c: Ctx) -> str:
    from snippets.site.diagrams import render_diagram

    return render_diagram(c.pos, c.kw)


def _dist(c: Ctx) -> str:
    from snippets.site.distributed import render_dist

    return render_dist(c.pos, c.results_dir)


RENDERERS: dict[str, Callable[[Ctx], str]] = {
    "summary": _summary, "ceilings": _ceilings, "output": _output, "roofline": _roofline, "sweep": _sweep,
    "versus": _versus, "goal": _goal, "timeline": _timeline, "table": _table, "headline": _headline,
    "plot": _plot, "ladder": _ladder, "export": _export, "diagram": _diagram, "dist": _dist,
}


def render_page(markdown: str, page_path: str = "", results_dir: Path = RESULTS_DIR) -> str:
    """Replace every bench directive in ``markdown``; an unknown op or directive raises ``ValueError``.
    Footnote definitions the directives render are gathered at the end of the page (see the module docstring)."""
    if "<!-- bench:" not in markdown:
        return markdown
    results = load_results(results_dir)
    ops = load_all()
    notes: list[str] = []

    def sub(m: re.Match) -> str:
        indent, kind, raw = m.group(1), m.group(2), m.group(3)
        if kind not in RENDERERS:
            raise ValueError(f"{page_path}: unknown directive bench:{kind}")
        try:
            out = RENDERERS[kind](Ctx(results, ops, results_dir, page_path, raw))
        except ValueError as e:
            msg = str(e)
            raise ValueError(msg if msg.startswith(page_path or "\0") else f"{page_path}: bench:{kind}: {msg}") from e
        notes.extend(FOOTNOTE_DEF.findall(out))
        body = re.sub(r"\n{3,}", "\n\n", FOOTNOTE_DEF.sub("", out)).strip("\n")
        if indent:  # a directive inside an admonition or a tab: its output takes the same indentation
            body = "\n".join(indent + line if line.strip() else "" for line in body.splitlines())
        return "\n" + body + "\n"  # a blank line on both sides: the directive's output is a block of its own

    page = DIRECTIVE.sub(sub, markdown)
    if notes:
        page = page.rstrip("\n") + "\n\n" + "\n\n".join(notes) + "\n"
    return page


def directives(markdown: str) -> list[tuple[str, list[str]]]:
    """The (kind, positional args) of every bench directive in a page: the contract test reads these."""
    return [(m.group(2), _args(m.group(3))[0]) for m in DIRECTIVE.finditer(markdown)]
