"""What a measured result depends on, derived from the code rather than listed by hand.

A result is fresh while the hash of everything that produced it is unchanged. That hash covers, for one
implementation:

- every ``snippets`` module in the import closure of the module that defines it, of the modules that define
  the callables it lists, and of the module that registers its op (the inputs and the cost model): their
  syntax trees without docstrings, so a comment, a docstring or a re-wrapped line changes nothing, while any
  change to code, a constant, a launch config or a compile option does;
- the timing and harness code (``snippets.bench.timing`` and ``snippets.bench.harness`` and their closure);
- the CUDA sources those modules can load: every file under ``csrc/<part>/`` of a module of that part that
  uses the CUDA loader, every ``csrc`` file a module names in a string, the files an implementation lists,
  and every header they include, recursively; comments and blank space removed.

This is coarser than the code a version runs (an edit anywhere in a module stales every version registered
there, an edit to the registry stales everything) and that is deliberate: a hash that misses a change would
show a number as fresh that the current code never produced.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ALWAYS = ("snippets.bench.timing", "snippets.bench.harness")  # the timer and the harness that measures
_CUDA_NAME = re.compile(r"""["']([\w./-]+\.(?:cu|cuh|h))["']""")
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
# C/C++ tokens after line splicing: what the compiler reads, so layout (wrapping, indentation, comments,
# a string literal split in two) changes nothing and any change of a token does
_C_TOKEN = re.compile(r"""
    (?P<space>[ \t\r\f\v]+) | (?P<nl>\n) | (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<str>(?:u8|[uUL])?"(?:\\.|[^"\\\n])*") | (?P<chr>(?:u8|[uUL])?'(?:\\.|[^'\\\n])*')
  | (?P<num>\.?\d(?:[eEpP][+-]|[\w.])*) | (?P<id>[A-Za-z_]\w*)
  | (?P<op>\.\.\.|<<=|>>=|->\*?|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%&|^]=|::|\#\#|.)
""", re.VERBOSE | re.DOTALL)


def module_path(name: str, root: Path = REPO_ROOT) -> Path | None:
    """The file of a ``snippets`` module under ``root`` (a package's ``__init__.py``), or None."""
    base = root.joinpath(*name.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None),
                                                                     ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def _merged_parts(values: list) -> list:
    """An f-string's parts with adjacent string constants joined and empty ones dropped: Python 3.12
    parses ``f"{x:<{w}}"``'s format spec with a trailing ``Constant('')`` that 3.11 leaves out."""
    out: list = []
    for v in values:
        if isinstance(v, ast.Constant) and isinstance(v.value, str):
            if not v.value:
                continue
            if out and isinstance(out[-1], ast.Constant) and isinstance(out[-1].value, str):
                out[-1] = ast.Constant(value=out[-1].value + v.value)
                continue
        out.append(v)
    return out


def _dump(node) -> str:
    """A syntax tree as text, the same on every Python version: fields that are empty (None, []) are left out,
    since newer versions add fields (3.12's ``type_params``) that ``ast.dump`` prints even when empty."""
    if isinstance(node, ast.JoinedStr):  # 3.12 keeps empty and split string parts that 3.11 merges
        node = ast.JoinedStr(values=_merged_parts(node.values))
    if isinstance(node, ast.AST):
        fields = [f"{k}={_dump(v)}" for k, v in ast.iter_fields(node) if v not in (None, [])]
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return "[" + ", ".join(_dump(x) for x in node) + "]"
    return repr(node)


def _is_main_block(node: ast.stmt) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in node.test.comparators))


@lru_cache(maxsize=None)
def _module_facts(path: Path) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(normalised code, snippets modules it imports, csrc file names it mentions) of one Python file."""
    text = path.read_text()
    tree = ast.parse(text)
    # a script block (`if __name__ == "__main__":`) never runs while a result is measured
    tree.body = [n for n in tree.body if not _is_main_block(n)]
    try:
        package = ".".join(path.relative_to(_root_of(path)).with_suffix("").parts)
    except ValueError:  # a file outside the package (a capture script, a test): no relative imports to resolve
        package = path.stem
    if path.name == "__init__.py":
        package = package.rsplit(".", 1)[0] + ".__init__"
    imports: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                parts = package.split(".")[:-node.level]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            imports.append(base)
            imports += [f"{base}.{a.name}" for a in node.names]  # `from snippets.part4 import layernorm`
    mods = tuple(sorted({m for m in imports if m == "snippets" or m.startswith("snippets.")}))
    code = _dump(_strip_docstrings(tree))
    return code, mods, tuple(sorted(set(_CUDA_NAME.findall(text))))


def imports_of(path: Path) -> tuple[str, ...]:
    """The ``snippets`` modules a Python file imports (a name imported from a module is listed as ``module.name``
    too; :func:`closure` drops what is not a module). For a file outside the package, such as a capture script,
    whose captures depend on the closure of what it imports."""
    return _module_facts(Path(path).resolve())[1]


def _root_of(path: Path) -> Path:
    for parent in path.parents:
        if parent.name == "snippets":
            return parent.parent
    raise ValueError(f"{path} is not inside a snippets package")


def closure(modules: Iterable[str], root: Path = REPO_ROOT) -> list[str]:
    """Every ``snippets`` module reachable by imports from ``modules`` (those included), sorted."""
    seen: set[str] = set()
    todo = [m for m in modules if m == "snippets" or m.startswith("snippets.")]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = module_path(name, root)
        if path is None:  # `from snippets.x import name`: the name of a function, not a module
            continue
        seen.add(name)
        parent = name.rsplit(".", 1)[0]
        todo.extend([*_module_facts(path)[1], *([parent] if parent != name else [])])
    return sorted(seen)


def cuda_text(path: Path) -> str:
    """A CUDA file as the compiler's tokens, one space apart: lines joined where they end in a backslash,
    comments dropped, adjacent string literals merged, and a line break kept only where it ends a
    preprocessor directive (the one place a line break means something)."""
    text = path.read_text().replace("\\\r\n", "").replace("\\\n", "")
    tokens: list[str] = []
    line_start, directive = True, False
    for m in _C_TOKEN.finditer(text):
        kind, tok = m.lastgroup, m.group()
        if kind == "nl":
            if directive:
                tokens.append("\\n")
            line_start, directive = True, False
            continue
        if kind in ("space", "comment"):  # a comment is a space, even one that spans lines
            continue
        if line_start:
            directive = tok == "#"
            line_start = False
        if kind == "str" and tok.startswith('"') and tokens and tokens[-1].startswith('"'):
            tokens[-1] = tokens[-1][:-1] + tok[1:]  # "ab" "cd" is "abcd"
            continue
        tokens.append(tok)
    return " ".join(tokens)


def cuda_files(modules: Iterable[str], paths: Iterable[Path], root: Path = REPO_ROOT) -> list[Path]:
    """The CUDA sources the modules can load (see the module docstring), with their headers."""
    csrc = root / "csrc"
    files: set[Path] = {Path(p) if Path(p).is_absolute() else root / p for p in paths}
    for name in modules:
        path = module_path(name, root)
        if path is None:
            continue
        _, imports, named = _module_facts(path)
        for ref in named:
            files.update(p for p in csrc.rglob(Path(ref).name) if p.as_posix().endswith(ref))
        part = next((p for p in name.split(".") if re.fullmatch(r"part\d+", p)), None)
        if part and "snippets.cuda" in imports and (csrc / part).is_dir():
            files.update(p for p in (csrc / part).rglob("*") if p.suffix in (".cu", ".cuh", ".h"))
    seen: set[Path] = set()
    todo = [f.resolve() for f in files if f.is_file()]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        for inc in _INCLUDE.findall(f.read_text()):
            for cand in (f.parent / inc, csrc / "common" / inc):
                if cand.is_file():
                    todo.append(cand.resolve())
                    break
    return sorted(seen)


def derived_hash(modules: Iterable[str], paths: Iterable[Path] = (), names: Iterable[str] = (),
                 root: Path = REPO_ROOT) -> str:
    """sha256 (16 hex digits) over the closure of ``modules`` plus the timer, their CUDA sources and ``paths``,
    and ``names`` (library callables, which stand for themselves: their versions are provenance)."""
    # the hash function itself is not what runs while a result is measured: leave it out of what it hashes
    mods = [m for m in closure([*modules, *ALWAYS], root) if m != "snippets.hashing"]
    h = hashlib.sha256()
    for name in mods:
        h.update(f"py {name}\n".encode())
        h.update(_module_facts(module_path(name, root))[0].encode())
    paths = [Path(p) for p in paths]
    for f in sorted(p.resolve() for p in paths if p.suffix == ".py" and p.is_file()):  # a listed Python file
        h.update(f"py {f.relative_to(root.resolve()).as_posix()}\n".encode())
        h.update(_module_facts(f)[0].encode())
    for f in cuda_files(mods, [p for p in paths if p.suffix != ".py"], root):
        h.update(f"cu {f.relative_to(root.resolve()).as_posix()}\n".encode())
        h.update(cuda_text(f).encode())
    for n in sorted(names):
        h.update(f"name {n}\n".encode())
    return h.hexdigest()[:16]


def clear_cache() -> None:
    """Forget parsed files (tests that edit a copy of the repository in place call this)."""
    _module_facts.cache_clear()
