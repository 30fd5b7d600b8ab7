"""Listings fit the page: no line the book shows from a source file is wider than 100 characters.

The chapters include code with pymdownx.snippets (``--8<-- "path"``, ``--8<-- "path:region"``,
``--8<-- "path:10:20"``, or a block of paths between two ``--8<--`` lines). A line longer than the
code block makes the listing scroll sideways, so every line an include shows must fit in
``MAX_WIDTH`` characters, counted after the common indentation is removed (``dedent_subsections``
in mkdocs.yml). The includes are resolved here the way the extension resolves them, without a site
build. A second test holds every source file of the book's parts to the same width, so that new
code stays within it wherever it is later included.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
MAX_WIDTH = 100
PAGES = sorted((REPO_ROOT / "docs").rglob("*.md")) + [REPO_ROOT / "README.md",
                                                       REPO_ROOT / "CONTRIBUTING.md"]
SOURCES = sorted([*(p for d in [*REPO_ROOT.glob("snippets/part*"), REPO_ROOT / "snippets" / "common"]
                    for p in d.rglob("*.py")),
                  *(p for p in (REPO_ROOT / "csrc").rglob("*")
                    if p.suffix in (".cu", ".cuh", ".h"))])

# pymdownx.snippets' notation: a snippet line is the marker and one quoted path, alone on its line
# (a leading ';' escapes it); a marker alone opens or closes a block of paths, one per line.
INLINE = re.compile(r"""^[ \t]*(?P<escape>;*)-+8<-+[ \t]+(?P<q>["'])(?P<path>.+?)(?P=q)\r?$""")
BLOCK = re.compile(r"^[ \t]*(?P<escape>;*)-+8<-+\r?$")
# A region marker, in any comment style: `# --8<-- [start:name]`, `// --8<-- [end:name]`, ...
MARKER = re.compile(r"(?<!;)-+8<-+[ \t]+\[[ \t]*(?P<kind>start|end)[ \t]*:"
                    r"[ \t]*(?P<name>[a-z][-_0-9a-z]*)[ \t]*\]", re.IGNORECASE)
LINES = re.compile(r"^(?P<path>.+?)(?P<ranges>(?::-?\d*){1,2}(?:,-?\d*(?::-?\d*)?)*)$")
SECTION = re.compile(r"^(?P<path>.+):(?P<name>[a-z][-_0-9a-z]*)$", re.IGNORECASE)


@dataclass(frozen=True)
class Include:
    page: Path  # the page (or included Markdown file) that holds the include
    line: int  # its line there, 1-based
    target: str  # the quoted text: path, path:region or path:ranges


def includes_in(page: Path) -> list[Include]:
    """Every snippet include of a Markdown file, in order (inline and block notation)."""
    out: list[Include] = []
    in_block = False
    for n, line in enumerate(page.read_text().split("\n"), 1):
        m = INLINE.match(line)
        if m and not in_block:
            if not m["escape"]:
                out.append(Include(page, n, m["path"].strip()))
            continue
        b = BLOCK.match(line)
        if b and not b["escape"]:
            in_block = not in_block
            continue
        if in_block and line.strip() and not line.strip().startswith(";"):
            out.append(Include(page, n, line.strip()))
    return out


def split_target(target: str) -> tuple[str, str | None, str | None]:
    """(path, line ranges, region) of an include's target."""
    m = LINES.match(target)
    if m and (REPO_ROOT / m["path"]).is_file():
        return m["path"], m["ranges"], None
    m = SECTION.match(target)
    if m and not (REPO_ROOT / target).exists():
        return m["path"], None, m["name"]
    return target, None, None


def region_lines(lines: list[str], name: str) -> list[int] | None:
    """Indices of the lines between the first [start:name] and the next [end:name] marker, other
    regions' markers left out (they are not shown); None if the region is not there."""
    shown: list[int] = []
    inside = found = False
    for i, line in enumerate(lines):
        m = MARKER.search(line)
        if m and m["name"] == name:
            if m["kind"].lower() == "start":
                inside = found = True
                continue
            if inside:
                break
        elif m:
            continue
        if inside:
            shown.append(i)
    return shown if found else None


def range_lines(lines: list[str], ranges: str) -> list[int]:
    """Indices selected by ``:start:end`` ranges (1-based, inclusive; negative counts from the
    end)."""
    shown: list[int] = []
    total = len(lines)
    for part in ranges[1:].split(","):
        bounds = part.split(":")
        start = int(bounds[0]) if bounds[0] else None
        end = int(bounds[1]) if len(bounds) > 1 and bounds[1] else None
        first = 0 if start is None else (max(0, total + start) if start < 0 else max(0, start - 1))
        last = total if end is None else (max(0, total + 1 + end) if end < 0 else min(end, total))
        shown.extend(range(first, last))
    return shown


def shown_widths(lines: list[str], idx: list[int], dedent: bool) -> list[tuple[int, int]]:
    """(1-based line number, width on the page) of each shown line; a region or a line range is
    dedented by the indentation its non-blank lines share."""
    margin = 0
    if dedent:
        indents = [len(lines[i]) - len(lines[i].lstrip()) for i in idx if lines[i].strip()]
        margin = min(indents, default=0)
    return [(i + 1, len(lines[i].rstrip()) - (margin if lines[i].strip() else 0)) for i in idx]


def resolve(inc: Include) -> tuple[Path, list[tuple[int, int]]] | str:
    """The file an include shows and the widths of the lines it shows, or why it does not
    resolve."""
    path, ranges, region = split_target(inc.target)
    file = REPO_ROOT / path
    where = f"{inc.page.relative_to(REPO_ROOT)}:{inc.line}: --8<-- \"{inc.target}\""
    if not file.is_file():
        return f"{where}: no such file"
    lines = file.read_text().split("\n")
    if lines and lines[-1] == "":
        lines = lines[:-1]  # the newline that ends the file is not a line of its own
    if region is not None:
        idx = region_lines(lines, region)
        if idx is None:
            return f"{where}: no region '{region}' in {path}"
        return file, shown_widths(lines, idx, dedent=True)
    if ranges is not None:
        return file, shown_widths(lines, range_lines(lines, ranges), dedent=True)
    # a whole file: its region markers are not shown
    idx = [i for i, line in enumerate(lines) if not MARKER.search(line)]
    return file, shown_widths(lines, idx, dedent=False)


def all_includes() -> list[Include]:
    """The includes of every page, and of the Markdown files those include (recursively)."""
    todo, seen, out = list(PAGES), set(), []
    while todo:
        page = todo.pop(0)
        if page in seen or not page.is_file():
            continue
        seen.add(page)
        for inc in includes_in(page):
            out.append(inc)
            path = REPO_ROOT / split_target(inc.target)[0]
            if path.suffix == ".md":
                todo.append(path)
    return out


INCLUDES = all_includes()
# Markdown files included whole are prose, which the browser wraps: only source listings are held
# to the width.
LISTED = sorted({r[0] for inc in INCLUDES if not isinstance(r := resolve(inc), str)
                 and r[0].suffix != ".md"})


def test_the_pages_include_listings():
    assert len(INCLUDES) > 100 and any(p.suffix == ".cu" for p in LISTED), \
        "the include scan found too little: is the notation parsed?"


def test_every_include_resolves():
    broken = [r for inc in INCLUDES if isinstance(r := resolve(inc), str)]
    assert not broken, "includes that name a missing file or region:\n" + "\n".join(broken)


@pytest.mark.parametrize("source", LISTED, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_included_lines_fit(source: Path):
    wide: dict[int, int] = {}
    users: set[str] = set()
    for inc in INCLUDES:
        r = resolve(inc)
        if isinstance(r, str) or r[0] != source:
            continue
        for n, width in r[1]:
            if width > MAX_WIDTH:
                wide[n] = width
                users.add(f"{inc.page.relative_to(REPO_ROOT)}:{inc.line}")
    rel = source.relative_to(REPO_ROOT)
    assert not wide, (f"{len(wide)} line(s) of {rel} that the book shows are wider than "
                      f"{MAX_WIDTH} characters (included at {', '.join(sorted(users))}):\n"
                      + "\n".join(f"{rel}:{n} ({w})" for n, w in sorted(wide.items())))


def test_source_lines_fit():
    """Every line of the parts' Python and CUDA sources, included today or not."""
    assert SOURCES, "no sources found"
    wide = [f"{p.relative_to(REPO_ROOT)}:{n} ({len(line)})" for p in SOURCES
            for n, line in enumerate(p.read_text().split("\n"), 1) if len(line) > MAX_WIDTH]
    assert not wide, f"lines wider than {MAX_WIDTH} characters:\n" + "\n".join(wide)


def test_resolver_follows_the_extension(tmp_path):
    """The resolver against pymdownx.snippets itself on a small page: the same lines, dedented."""
    markdown = pytest.importorskip("markdown")
    pytest.importorskip("pymdownx", reason="pymdown-extensions is not installed (the GPU image lacks it)")
    src = tmp_path / "src.py"
    src.write_text("x = 0\n# --8<-- [start:body]\ndef f():\n    # --8<-- [start:inner]\n"
                   "    return 1\n    # --8<-- [end:inner]\n# --8<-- [end:body]\n")
    page = '```\n--8<-- "src.py:inner"\n```\n\n```\n--8<-- "src.py:body"\n```\n'
    config = {"pymdownx.snippets": {"base_path": [str(tmp_path)], "check_paths": True,
                                    "dedent_subsections": True}}
    html = markdown.markdown(page, extensions=["pymdownx.snippets", "fenced_code"],
                             extension_configs=config)
    assert "<code>return 1\n</code>" in html and "def f():\n    return 1\n</code>" in html
    lines = src.read_text().split("\n")[:-1]
    assert shown_widths(lines, region_lines(lines, "inner"), dedent=True) == [(5, 8)]
    assert shown_widths(lines, region_lines(lines, "body"), dedent=True) == [(3, 8), (5, 12)]
    assert range_lines(lines, ":3:5") == [2, 3, 4] and range_lines(lines, ":-2") == [5, 6]


# A fenced code block in a page: ``` or ~~~ (three or more), possibly indented inside an admonition,
# a tab or a list; it closes on a fence of the same character, at least as long, with no info string.
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


def fence_language(info: str) -> str:
    """The language an info string names: ``python``, ``{.python notest}`` and ``{ .mermaid }`` all
    give the first word without the braces and the dot."""
    words = info.strip().strip("{}").split()
    return words[0].lstrip(".").lower() if words else ""


def wide_fence_lines(page: Path, width: int = MAX_WIDTH) -> list[tuple[int, int, str]]:
    """(1-based line, width, language) of each line of a fenced code block in ``page`` that is
    wider than ``width``, counted from the fence's own indentation; mermaid diagrams are left out
    (they are drawn, not shown as text)."""
    out: list[tuple[int, int, str]] = []
    lines = page.read_text().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or (m["fence"][0] == "`" and "`" in m["info"]):
            i += 1
            continue
        indent = len(m["indent"].expandtabs(4))
        char, size, lang = m["fence"][0], len(m["fence"]), fence_language(m["info"])
        i += 1
        while i < len(lines):
            line = lines[i].expandtabs(4)
            body = line.lstrip()
            lead = len(line) - len(body)
            if body and lead < indent:
                break  # the container (admonition, tab, list item) ended, and the block with it
            close = re.fullmatch(r"(`{3,}|~{3,})[ \t]*", body)
            if close and close[1][0] == char and len(close[1]) >= size and lead - indent < 4:
                i += 1
                break
            shown = len(line.rstrip()) - indent if body else 0
            if lang != "mermaid" and shown > width:
                out.append((i + 1, shown, lang or "text"))
            i += 1
    return out


def test_fence_scan_reads_the_notation(tmp_path):
    page = tmp_path / "p.md"
    long = "x" * 101
    page.write_text(f"```python\n{long}\n```\n\n~~~~{{.python notest}}\n```\n{long}\n~~~~\n\n"
                    f"!!! note\n\n    ```bash\n    {'y' * 100}\n    {long}\n    ```\n\n"
                    f"```mermaid\n{long}\n```\n\n~~~\n{'z' * 100}\n~~~\n")
    assert wide_fence_lines(page) == [(2, 101, "python"), (7, 101, "python"), (14, 101, "bash")]


def test_docs_code_fences_fit():
    """Code blocks written into the pages (not included from a file) fit the column too."""
    pages = sorted((REPO_ROOT / "docs").rglob("*.md"))
    assert pages, "no pages found"
    wide = [f"{p.relative_to(REPO_ROOT)}:{n} ({w}) {lang}" for p in pages
            for n, w, lang in wide_fence_lines(p)]
    assert not wide, (f"lines of fenced code blocks wider than {MAX_WIDTH} characters "
                      f"(from the fence's indentation):\n" + "\n".join(wide))


def test_fence_info_strings_are_ones_superfences_reads():
    """A fence opens with a bare language (```python) or an attribute list (```{.python notest}). Anything else
    after the language (```python notest) is not a fence to pymdownx.superfences: the block and every fence after
    it render as prose."""
    opener = re.compile(r"^\s*```(?P<info>[^`]*)$")
    bad = []
    for page in [*sorted((REPO_ROOT / "docs").rglob("*.md")), REPO_ROOT / "README.md", REPO_ROOT / "CONTRIBUTING.md"]:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            m = opener.match(line)
            if m and not re.fullmatch(r"\w*|\{[^}]*\}", m.group("info").strip()):
                bad.append(f"{page.relative_to(REPO_ROOT)}:{n}: {line.strip()}")
    assert not bad, bad
