"""The contract every op of the book keeps, as checks that return a list of problems (empty: kept).

An op must have a reference, a library baseline ``v0`` and at least one version of the book's own; a test in
``tests/`` marked ``@pytest.mark.op("<name>")``; a benchmark entry (headline size, sweep, a cost model that
gives positive bytes and FLOPs); and a chapter that includes the op's code by region and renders its measured
table. Every ``--8<--`` include in the docs must name an existing file and region.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from snippets.registry import REPO_ROOT, Op, size_key

INCLUDE = re.compile(r'--8<--\s+"([^":]+)(?::([\w-]+))?"')
REGION_START = re.compile(r"--8<--\s+\[start:([\w-]+)\]")
REGION_END = re.compile(r"--8<--\s+\[end:([\w-]+)\]")
OP_MARK = re.compile(r"""mark\.op\(\s*["'](\w+)["']\s*\)""")
BENCH = re.compile(r"<!--\s*bench:(table|plot)\s+(\w+)")


def regions(path: Path) -> set[str]:
    """Names of the complete (started and ended) snippet regions of a file."""
    text = path.read_text()
    return set(REGION_START.findall(text)) & set(REGION_END.findall(text))


def unbalanced_regions(path: Path) -> list[str]:
    text = path.read_text()
    starts, ends = REGION_START.findall(text), REGION_END.findall(text)
    out = [f"{path.relative_to(REPO_ROOT)}: region {r!r} is started but never ended" for r in set(starts) - set(ends)]
    out += [f"{path.relative_to(REPO_ROOT)}: region {r!r} is ended but never started" for r in set(ends) - set(starts)]
    out += [f"{path.relative_to(REPO_ROOT)}: region {r!r} is started twice" for r in set(starts) if starts.count(r) > 1]
    return out


def broken_includes(md_path: Path, root: Path = REPO_ROOT) -> list[str]:
    """Includes in a Markdown file whose file or region does not exist."""
    out = []
    for file, region in INCLUDE.findall(md_path.read_text()):
        target = root / file
        where = f"{md_path.relative_to(root)}: --8<-- \"{file}{':' + region if region else ''}\""
        if not target.is_file():
            out.append(f"{where}: no such file")
        elif region and region not in regions(target):
            out.append(f"{where}: no region {region!r} in {file}")
    return out


def op_source_files(op: Op) -> set[str]:
    """Repository-relative files that hold an op's code: its Python module(s) and CUDA sources."""
    files = set()
    for impl in op.impls.values():
        for obj in (impl.fn, *impl.sources):
            if isinstance(obj, (str, Path)):
                files.add(str(Path(REPO_ROOT / obj).resolve().relative_to(REPO_ROOT)))
                continue
            try:
                src = inspect.getsourcefile(getattr(obj, "fn", obj))
            except TypeError:
                continue  # a library builtin such as torch.add
            if src and Path(src).resolve().is_relative_to(REPO_ROOT):
                files.add(str(Path(src).resolve().relative_to(REPO_ROOT)))
    return files


def problems(op: Op, tests_dir: Path = REPO_ROOT / "tests", docs_dir: Path = REPO_ROOT / "docs") -> list[str]:
    p: list[str] = []
    # reference and versions
    if not callable(op.reference):
        p.append(f"{op.name}: no reference")
    if "v0" not in op.impls and op.kind != "micro":
        p.append(f"{op.name}: no library baseline v0")
    if not [n for n in op.impls if n != "v0"]:
        p.append(f"{op.name}: no implementation besides the baseline")
    bad = [n for n in op.impls if not re.fullmatch(r"v\d+", n)]
    if bad:
        p.append(f"{op.name}: versions must be named v0, v1, ...: {bad}")
    # a test
    marked = set()
    for f in tests_dir.glob("**/*.py"):
        marked |= set(OP_MARK.findall(f.read_text()))
    if op.name not in marked:
        p.append(f"{op.name}: no test in {tests_dir.name}/ is marked @pytest.mark.op({op.name!r})")
    if not op.test_sizes:
        p.append(f"{op.name}: no test sizes")
    # a benchmark entry
    if not op.headline:
        p.append(f"{op.name}: no headline benchmark size")
    if not op.sweep:
        p.append(f"{op.name}: no benchmark sweep")
    for size in [op.headline, *op.sweep]:
        for dtype in op.timed_dtypes():
            try:
                b, f = op.bytes_moved(size, dtype), op.flops(size, dtype)
                if op.lower_is_better and not op.accesses(size, dtype) > 0:
                    p.append(f"{op.name}: accesses must be positive at {size_key(size)}")
            except Exception as exc:  # noqa: BLE001 (report any failure of the cost model)
                p.append(f"{op.name}: cost model fails at {size_key(size)}: {exc!r}")
                continue
            if not (isinstance(b, int) and b > 0 and isinstance(f, int) and f >= 0):
                p.append(f"{op.name}: cost model must give int bytes > 0 and FLOPs >= 0 at {size_key(size)}")
    # a chapter that includes its code and shows its measurements
    chapter = docs_dir / op.chapter
    if not chapter.is_file():
        p.append(f"{op.name}: chapter {op.chapter} does not exist")
        return p
    text = chapter.read_text()
    included = {file for file, _ in INCLUDE.findall(text)}
    if not included & op_source_files(op):
        p.append(f"{op.name}: {op.chapter} includes none of {sorted(op_source_files(op))}")
    if op.name not in {name for _, name in BENCH.findall(text)}:
        p.append(f"{op.name}: {op.chapter} has no <!-- bench:table {op.name} --> or bench:plot directive")
    return p
