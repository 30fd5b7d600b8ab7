"""``python -m snippets export OP [VERSION] [-o DIR]``: one op's kernel as a self-contained, copy-ready module.

The export is assembled from the code itself, never by hand. It starts from the callable the registry names for
the version (``Impl.fn``) and, for an op that trains, from its forward + backward twin's callable and the
``torch.autograd.Function`` classes that uses (``rmsnorm`` -> ``rmsnorm_fwd_bwd_triton``, ``RMSNormFunction`` and
its backward kernels), or, with no such twin, the module's own autograd.Function that trains with the version's
kernels (``flash_attention_fwd`` -> ``FlashAttention``); and it takes the transitive closure of the module-level
definitions they reference:

- every module of ``snippets`` is read with :mod:`ast`; a reference is a free name of a definition (scopes are
  followed: parameters and locals of a function shadow module names, a method does not see its class body),
  or an attribute chain through a module alias (``layernorm.check_rows`` with ``from snippets.part4 import
  layernorm``, ``cuda.kernel``), resolved through ``from snippets.x import y``, ``import snippets.x as m``,
  re-exports and function-local imports, into the module that defines it;
- what a name resolves to is a top-level statement of some module (a function, a ``@triton.jit`` kernel, a
  class, a constant, an autotune config list), a third-party import (torch, triton, numpy, math, dataclasses,
  functools, ...), or a builtin; statements are copied verbatim (``ast`` positions, decorators and the comment
  lines right above them included, the docs' ``--8<--`` region markers left out), in dependency order (a
  name used while the module loads, by a decorator, a default or an assignment, is defined before it);
- names are checked for clashes across modules: two different definitions (two ``Config`` classes, two
  ``EPS``), or a definition and an import or a builtin, never share a name: all but one are renamed with a
  module prefix (``layernorm_config_for``, ``LAYERNORM_EPS``, ``LayernormConfig``) and every reference to
  them is rewritten; a rename that a local variable would shadow is refused with an error;
- registrations (``Op(...)``, ``.add(Impl(...))``), imports of ``snippets`` and the tooling that the chosen
  version does not call never enter the output: only what the roots reach does.

The CUDA C versions load ``csrc/<path>`` through the loader of ``snippets/cuda.py``, which the closure brings
along; its ``.cu`` files and the headers they include are copied beside the module, under ``csrc/``, and the
repository root the loader starts from (``REPO_ROOT``) becomes the exported file's folder.

Beside ``<op>.py`` the export writes ``test_<op>.py``: the op's reference, its input generator and, where a
version's dtypes depend on where it runs, that expression of its registration (exported by the same closure;
the sizes, dtypes and tolerances as literals from the registry), checking each exported function (the version's
and its twin's) on the op's smallest test sizes, on the GPU when torch sees one and else on the CPU under
Triton's interpreter; and one input of a wrong dtype it must refuse (the argument found by trying them here, on
CPU tensors: the first that the book's own checks refuse with a TypeError or ValueError).

Which version: the one named, or the book's own (``origin == "book"``) version with the best headline result
in ``benchmarks/results`` (the H200's file first, else any GPU's); with no result, the highest-numbered book
version that runs on the CPU. The module's docstring names the op, the version, its chapter and the result it
came with, read from the results file. :func:`plan` works all of this out without writing anything; the docs'
``bench:export`` box (``snippets/site/export_box.py``) shows it.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

PACKAGE = "snippets"
PACKAGE_DIR = Path(__file__).resolve().parent
REPO = PACKAGE_DIR.parent
# A top-level definition whose value the export replaces: the repository root the CUDA loader finds csrc/ under
# becomes the folder of the exported file, where csrc/ is copied.
OVERRIDES = {"REPO_ROOT": "REPO_ROOT = Path(__file__).resolve().parent  # the export's folder: csrc/ is copied "
                          "beside this file"}
PREFERRED_GPU = "NVIDIA H200"
_MARKER = re.compile(r"^\s*#\s*--8<--")
_DEF_NAME = re.compile(rb"(?:async\s+)?(?:def|class)\s+(\w+)")
_CU_NAME = re.compile(r"""["']([\w./-]+\.(?:cu|cuh|h))["']""")
_CU_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


class ExportError(Exception):
    """The op, version or code cannot be exported; the message says why."""


# ---------------------------------------------------------------------------------------------- module index

@dataclass
class Ref:
    """A free name (or an attribute chain starting at one) in a top-level statement."""

    chain: tuple[str, ...]
    spans: list[tuple[int, int]]  # byte spans of chain[:1], chain[:2], ... in the statement's source buffer
    soft: bool = False  # in an annotation: never a dependency, renamed only if its target is exported anyway
    runtime: bool = False  # read only when a function runs (not while the module loads)
    shadows: set[str] = field(default_factory=set)  # locals of the scopes around it (a rename must avoid them)


@dataclass(eq=False)  # compared and hashed by identity
class Stmt:
    """One top-level statement of a module (or a synthetic one, analysed in a module's context)."""

    module: str
    buf: bytes  # the source it lives in, as UTF-8 bytes (ast offsets are byte offsets)
    node: ast.stmt
    start: int  # byte span to copy: leading comment lines and decorators to the end of the last line
    end: int
    binds: set[str]
    refs: list[Ref]
    defname_span: tuple[int, int] | None  # the name after def/class (renamed with the definition)
    kills: list[tuple[int, int, str]]  # spans replaced (function-local imports of snippets)
    overlay: dict[str, tuple]  # names those local imports bound
    locals: set[str]  # every local name of every function in it
    ext_local: set[str] = field(default_factory=set)  # top-level modules imported inside functions

    @property
    def synthetic(self) -> bool:
        return self.buf is not _source(self.module).buf


@dataclass
class Module:
    name: str
    path: Path
    text: str
    buf: bytes
    lines: list[int]  # byte offset of each line start
    tree: ast.Module
    binds: dict[str, list[int]]  # name -> indices of top-level statements binding it
    imports: dict[str, tuple]  # name -> binding of a module-level import
    stars: list[str]


def _module_file(name: str) -> Path | None:
    if name != PACKAGE and not name.startswith(PACKAGE + "."):
        return None
    base = REPO.joinpath(*name.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _is_package_module(name: str) -> bool:
    return _module_file(name) is not None


def _absolute(module: str, level: int, target: str | None) -> str:
    """The absolute module of a (possibly relative) import in ``module``."""
    if not level:
        return target or ""
    path = _module_file(module)
    parts = module.split(".")
    base = parts if path is not None and path.name == "__init__.py" else parts[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def _import_bindings(module: str, node: ast.Import | ast.ImportFrom) -> dict[str, tuple]:
    """name -> binding for one import statement. Bindings: ("pkgmod", module) a module of this package,
    ("pkgfrom", module, attr) a name from one, ("ext", module, submodule) a third-party module (``import a.b``
    binds ``a`` and loads ``a.b``), ("extfrom", module, attr) a name from one."""
    out: dict[str, tuple] = {}
    if isinstance(node, ast.Import):
        for a in node.names:
            ours = a.name == PACKAGE or a.name.startswith(PACKAGE + ".")
            if a.asname:
                out[a.asname] = ("pkgmod", a.name) if ours else ("ext", a.name, a.name)
            else:
                root = a.name.split(".")[0]
                out[root] = ("pkgmod", root) if ours else ("ext", root, a.name)
        return out
    src = _absolute(module, node.level, node.module)
    if src == "__future__":
        return out
    ours = src == PACKAGE or src.startswith(PACKAGE + ".")
    for a in node.names:
        if a.name == "*":
            continue
        out[a.asname or a.name] = ("pkgfrom", src, a.name) if ours else ("extfrom", src, a.name)
    return out


@lru_cache(maxsize=None)
def _source(name: str) -> Module:
    path = _module_file(name)
    if path is None:
        raise ExportError(f"no module {name!r} in {PACKAGE}/")
    text = path.read_text()
    buf = text.encode()
    lines = [0]
    for i, b in enumerate(buf):
        if b == 10:
            lines.append(i + 1)
    tree = ast.parse(text, str(path))
    binds: dict[str, list[int]] = {}
    imports: dict[str, tuple] = {}
    stars: list[str] = []
    for i, node in enumerate(tree.body):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.update(_import_bindings(name, node))
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                stars.append(_absolute(name, node.level, node.module))
            continue
        for n in _top_binds(node):
            binds.setdefault(n, []).append(i)
    for i, node in enumerate(tree.body):  # X[k] = v, X.update(...): with X, when X is a definition here
        for n in _top_mutates(node):
            if n in binds and i not in binds[n]:
                binds[n].append(i)
    for n in binds:
        binds[n].sort()
    return Module(name, path, text, buf, lines, tree, binds, imports, stars)


def _target_names(t: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(t) if isinstance(n, ast.Name)]


def _bound_names(target: ast.AST) -> list[str]:
    """Names an assignment target binds: ``x``, ``a, (b, *c)``; not ``x[k]`` or ``x.attr`` (a mutation)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for t in target.elts for n in _bound_names(t)]
    if isinstance(target, ast.Starred):
        return _bound_names(target.value)
    return []


def _top_binds(node: ast.stmt) -> list[str]:
    """The names a top-level statement defines (statements under if/for/try/with define nothing exportable)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [n for t in node.targets for n in _bound_names(t)]
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return _bound_names(node.target)
    return []


_MUTATORS = {"append", "extend", "update", "add", "insert", "setdefault", "__setitem__"}


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _top_mutates(node: ast.stmt) -> list[str]:
    """Names a top-level statement changes without binding (``X[k] = v``, ``X.attr += 1``, ``X.update(...)``):
    the statement comes with X's definition, after it."""
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
            and isinstance(node.value.func, ast.Attribute) and node.value.func.attr in _MUTATORS:
        targets = [node.value.func.value]
    names = []
    for t in targets:
        for part in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]):
            if isinstance(part, (ast.Subscript, ast.Attribute)) or isinstance(node, ast.Expr):
                root = _root_name(part)
                if root is not None:
                    names.append(root)
    return names


# ------------------------------------------------------------------------------------------- scope analysis

class _Scope:
    def __init__(self, kind: str):
        self.kind = kind  # module, function, class, comp
        self.bound: set[str] = set()
        self.globals: set[str] = set()
        self.direct: list[tuple[str, Ref]] = []  # refs in this scope's own code
        self.nested: list[tuple[str, Ref]] = []  # free refs coming out of scopes inside it


class _Analyzer:
    """Free names of one top-level statement, scope by scope (a small ``symtable`` over ``ast``)."""

    def __init__(self, module: str, buf: bytes, lines: list[int]):
        self.module, self.buf, self.lines = module, buf, lines
        self.kills: list[tuple[int, int, str]] = []
        self.overlay: dict[str, tuple] = {}
        self.locals: set[str] = set()
        self.ext_local: set[str] = set()

    def pos(self, lineno: int, col: int) -> int:
        return self.lines[lineno - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.pos(node.lineno, node.col_offset), self.pos(node.end_lineno, node.end_col_offset)

    # -- refs
    def ref(self, scope: _Scope, node: ast.AST, soft: bool) -> None:
        chain, nodes = [], []
        cur = node
        while isinstance(cur, ast.Attribute):
            nodes.append(cur)
            chain.append(cur.attr)
            cur = cur.value
        if not isinstance(cur, ast.Name):
            self.visit(cur, scope, soft)
            return
        nodes.append(cur)
        chain.append(cur.id)
        chain.reverse()
        nodes.reverse()
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            scope.bound.add(node.id)
        scope.direct.append((cur.id, Ref(tuple(chain), [self.span(n) for n in nodes], soft=soft)))

    # -- scopes
    def function(self, scope: _Scope, args: ast.arguments, body: list[ast.AST], soft: bool) -> None:
        for d in [*args.defaults, *[k for k in args.kw_defaults if k is not None]]:
            self.visit(d, scope, soft)
        all_args = [*args.posonlyargs, *args.args, *args.kwonlyargs,
                    *[a for a in (args.vararg, args.kwarg) if a is not None]]
        for a in all_args:
            if a.annotation is not None:
                self.visit(a.annotation, scope, True)
        inner = _Scope("function")
        inner.bound |= {a.arg for a in all_args}
        for stmt in body:
            self.visit(stmt, inner, soft)
        self.close(inner, scope)

    def close(self, inner: _Scope, outer: _Scope) -> None:
        """Free refs of ``inner`` move out to ``outer``."""
        if inner.kind == "function":
            self.locals |= inner.bound - inner.globals
            for name, r in inner.direct + inner.nested:
                if name in inner.globals or name not in inner.bound:
                    r.runtime = True
                    r.shadows |= inner.bound - inner.globals
                    outer.nested.append((name, r))
        elif inner.kind == "class":
            for name, r in inner.direct:
                if name not in inner.bound:
                    outer.nested.append((name, r))
            outer.nested.extend(inner.nested)
        else:  # a comprehension
            for name, r in inner.direct + inner.nested:
                if name not in inner.bound:
                    r.shadows |= inner.bound
                    outer.nested.append((name, r))

    def visit(self, node: ast.AST, scope: _Scope, soft: bool = False) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            scope.bound.add(node.name)
            for d in node.decorator_list:
                self.visit(d, scope, soft)
            if node.returns is not None:
                self.visit(node.returns, scope, True)
            self.function(scope, node.args, node.body, soft)
        elif isinstance(node, ast.Lambda):
            self.function(scope, node.args, [node.body], soft)
        elif isinstance(node, ast.ClassDef):
            scope.bound.add(node.name)
            for d in [*node.decorator_list, *node.bases, *[k.value for k in node.keywords]]:
                self.visit(d, scope, soft)
            inner = _Scope("class")
            for stmt in node.body:
                self.visit(stmt, inner, soft)
            self.close(inner, scope)
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            self.visit(node.generators[0].iter, scope, soft)
            inner = _Scope("comp")
            for i, gen in enumerate(node.generators):
                inner.bound |= set(_target_names(gen.target))
                if i:
                    self.visit(gen.iter, inner, soft)
                for cond in gen.ifs:
                    self.visit(cond, inner, soft)
            for part in ((node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,)):
                self.visit(part, inner, soft)
            self.close(inner, scope)
        elif isinstance(node, (ast.Name, ast.Attribute)):
            self.ref(scope, node, soft)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if scope.kind == "module":
                raise ExportError("an import inside a top-level statement")  # not reached: imports are indexed
            bindings = _import_bindings(self.module, node)
            ours = {k: v for k, v in bindings.items() if v[0] in ("pkgmod", "pkgfrom")}
            if ours and len(ours) != len(bindings):
                raise ExportError(f"{self.module}: line {node.lineno} imports from {PACKAGE} and elsewhere at once")
            if ours:  # a function-local import of this package: the names resolve like module-level ones
                self.overlay.update(ours)
                self.kills.append((*self.span(node), "pass"))
            else:
                scope.bound |= set(bindings)
                for v in bindings.values():
                    self.ext_local.add(v[1].split(".")[0])
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            if isinstance(node, ast.Global):
                scope.globals |= set(node.names)
                for n in node.names:
                    scope.direct.append((n, Ref((n,), [(-1, -1)])))
        elif isinstance(node, ast.ExceptHandler):
            if node.name:
                scope.bound.add(node.name)
            for child in ast.iter_child_nodes(node):
                self.visit(child, scope, soft)
        elif isinstance(node, ast.AnnAssign):
            self.visit(node.annotation, scope, True)
            self.visit(node.target, scope, soft)
            if node.value is not None:
                self.visit(node.value, scope, soft)
        elif isinstance(node, ast.NamedExpr):
            scope.bound.add(node.target.id)
            self.visit(node.value, scope, soft)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            scope.bound.add(node.name)
            for child in ast.iter_child_nodes(node):
                self.visit(child, scope, soft)
        elif isinstance(node, ast.arg):
            if node.annotation is not None:
                self.visit(node.annotation, scope, True)
        else:
            for child in ast.iter_child_nodes(node):
                self.visit(child, scope, soft)


def _statement(module: str, buf: bytes, lines: list[int], node: ast.stmt, text_lines: list[str]) -> Stmt:
    an = _Analyzer(module, buf, lines)
    top = _Scope("module")
    an.visit(node, top)
    refs = [r for _, r in top.direct + top.nested]
    defname = None
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        m = _DEF_NAME.match(buf, an.pos(node.lineno, node.col_offset))
        defname = m.span(1)
    first = min([node.lineno, *[d.lineno for d in getattr(node, "decorator_list", [])]])
    while first > 1 and text_lines[first - 2].lstrip().startswith("#") \
            and not _MARKER.match(text_lines[first - 2]):
        first -= 1  # the comment lines right above a definition explain it: they come along
    start = lines[first - 1]
    end_line = text_lines[node.end_lineno - 1] if node.end_lineno <= len(text_lines) else ""
    tail = end_line.encode()[node.end_col_offset:].strip()
    end = an.pos(node.end_lineno, node.end_col_offset)
    if tail.startswith(b"#"):  # a comment after the statement on its last line
        end = lines[node.end_lineno - 1] + len(end_line.encode())
    return Stmt(module, buf, node, start, end, set(_top_binds(node)), refs, defname, an.kills, an.overlay,
                an.locals, ext_local=an.ext_local)


@lru_cache(maxsize=None)
def _stmt(module: str, index: int) -> Stmt:
    src = _source(module)
    return _statement(module, src.buf, src.lines, src.tree.body[index], src.text.splitlines())


def _synthetic(module: str, text: str) -> Stmt:
    """A statement that is not in the module's file (an override, an expression of a registration), analysed
    as if it were one of its top-level statements."""
    tree = ast.parse(text)
    if len(tree.body) != 1:
        raise ExportError(f"a synthetic statement must be one statement: {text!r}")
    buf = text.encode()
    lines = [0] + [i + 1 for i, b in enumerate(buf) if b == 10]
    return _statement(module, buf, lines, tree.body[0], text.splitlines())


# ------------------------------------------------------------------------------------------------ resolution

@dataclass(frozen=True)
class Def:
    module: str
    name: str


@dataclass(frozen=True)
class Ext:
    module: str
    attr: str | None  # None: the module object itself


@dataclass(frozen=True)
class Builtin:
    name: str


@dataclass(frozen=True)
class PkgModule:
    module: str


Entity = Def | Ext | Builtin | PkgModule


def _resolve_binding(binding: tuple, seen: frozenset = frozenset()):
    kind = binding[0]
    if kind == "pkgmod":
        return PkgModule(binding[1])
    if kind == "pkgfrom":
        return _resolve_attr(binding[1], binding[2], seen)
    if kind == "ext":
        return Ext(binding[1], None)
    return Ext(binding[1], binding[2])


def _resolve_attr(module: str, attr: str, seen: frozenset = frozenset()):
    if _is_package_module(f"{module}.{attr}"):
        return PkgModule(f"{module}.{attr}")
    return _resolve(module, attr, {}, seen)


def _resolve(module: str, name: str, overlay: dict, seen: frozenset = frozenset()):
    if (module, name) in seen:
        raise ExportError(f"{module}: circular import of {name!r}")
    seen = seen | {(module, name)}
    if name in overlay:
        return _resolve_binding(overlay[name], seen)
    src = _source(module)
    if name in src.binds:
        return Def(module, name)
    if name in src.imports:
        return _resolve_binding(src.imports[name], seen)
    for star in src.stars:
        if star.startswith(PACKAGE + ".") or star == PACKAGE:
            try:
                return _resolve(star, name, {}, seen)
            except ExportError:
                continue
    if name in ("__file__", "__name__") or hasattr(builtins, name):
        return Builtin(name)
    raise ExportError(f"{module}: {name!r} is not defined at module level (a name bound under an if, for or "
                      "try, or a typo); the export follows only top-level definitions")


def _resolve_ref(stmt: Stmt, ref: Ref) -> tuple[Entity, int]:
    """What a reference names, and how many links of its chain that used (``layernorm.check_rows``: 2)."""
    ent = _resolve(stmt.module, ref.chain[0], stmt.overlay)
    used = 1
    while isinstance(ent, PkgModule) and used < len(ref.chain):
        ent = _resolve_attr(ent.module, ref.chain[used])
        used += 1
    return ent, used


# ---------------------------------------------------------------------------------------------------- closure

@dataclass
class Closure:
    stmts: list[Stmt]  # in emission order
    names: dict[Entity, str]  # output name of every exported definition and import
    edits: dict[int, list[tuple[int, int, str]]]  # id(stmt) -> replacements in its buffer
    exts: dict[Ext, set[str]]  # third-party imports -> submodules to load
    shared: set[Ext]  # imports the caller writes itself (reserved)
    ext_local: set[str]  # top-level packages imported inside functions (optional dependencies)
    roots: list[str]  # output names of the roots


def _def_stmts(d: Def) -> list[Stmt]:
    if d.name in OVERRIDES:
        return [_synthetic(d.module, OVERRIDES[d.name])]
    src = _source(d.module)
    return [_stmt(d.module, i) for i in src.binds[d.name]]


def _prefixed(module: str, name: str) -> str:
    short = module.rsplit(".", 1)[-1].strip("_")
    if name.isupper() or (name.upper() == name and any(c.isalpha() for c in name)):
        return f"{short.upper()}_{name}"
    if name[:1].isupper():
        return "".join(p.capitalize() for p in short.split("_")) + name
    if name.startswith("_"):
        return f"_{short}{name}"
    return f"{short}_{name}"


def closure(roots: list[Def | Stmt], reserved: dict[str, Entity | None] | None = None,
            priority: str | None = None) -> Closure:
    """The definitions ``roots`` reach, in an order that loads, with clash-free names.

    A root is a top-level definition (``Def``) or a synthetic statement (whose names count as definitions of
    its module). ``reserved`` maps names the caller writes itself to what they are: an import the caller makes
    (``Ext``, which the closure then shares) or None (a name no definition may take). Definitions of the
    ``priority`` module keep their names when another module's clash with them."""
    reserved = reserved or {}
    order: list[Stmt] = []
    state: dict[int, int] = {}  # id(stmt) -> 1 in progress, 2 done
    by_id: dict[int, Stmt] = {}
    resolved: dict[int, list[tuple[Ref, Entity, int]]] = {}
    load_deps: dict[int, set[int]] = {}
    all_deps: dict[int, set[int]] = {}
    def_stmt_ids: dict[Def, list[int]] = {}
    exts: dict[Ext, set[str]] = {}
    first_name: dict[Entity, str] = {}
    builtins_used: set[str] = set()

    def stmts_of(d: Def) -> list[Stmt]:
        if d not in def_stmt_ids:
            ss = _def_stmts(d)
            for s in ss:
                by_id.setdefault(id(s), s)
            def_stmt_ids[d] = [id(s) for s in ss]
        return [by_id[i] for i in def_stmt_ids[d]]

    def visit(stmt: Stmt) -> None:
        sid = id(stmt)
        if state.get(sid):
            return
        state[sid] = 1
        by_id[sid] = stmt
        out = []
        deps: set[int] = set()
        every: set[int] = set()
        for ref in stmt.refs:
            if ref.spans[0] == (-1, -1):  # a `global` declaration: its name must never be renamed
                ent = _resolve(stmt.module, ref.chain[0], stmt.overlay)
                out.append((ref, ent, 1))
                continue
            try:
                if stmt.synthetic and ref.chain[0] in stmt.binds:
                    ent, used = Def(stmt.module, ref.chain[0]), 1  # a synthetic statement's own name
                else:
                    ent, used = _resolve_ref(stmt, ref)
            except ExportError:
                if ref.soft:
                    continue
                raise
            if isinstance(ent, PkgModule):
                if ref.soft:
                    continue
                raise ExportError(f"{stmt.module}: uses the module {ent.module} itself as a value "
                                  f"({'.'.join(ref.chain)}); only its definitions can be exported")
            out.append((ref, ent, used))
            if ref.soft and not isinstance(ent, Ext):
                continue
            if isinstance(ent, Def):
                if ent.module == stmt.module and ent.name in stmt.binds:
                    continue  # the statement's own name (an augmented assignment, a recursive function)
                for dep in stmts_of(ent):
                    visit(dep)
                    every.add(id(dep))
                    if not ref.runtime:
                        deps.add(id(dep))
            elif isinstance(ent, Ext):
                exts.setdefault(ent, set())
                binding = _source(stmt.module).imports.get(ref.chain[0])
                if binding and binding[0] == "ext" and binding[2] != binding[1]:
                    exts[ent].add(binding[2])
                first_name.setdefault(ent, ref.chain[0] if used == 1 else (ent.attr or ent.module))
            else:
                if ent.name == "__file__" and not (stmt.synthetic and set(stmt.binds) & set(OVERRIDES)):
                    raise ExportError(f"{stmt.module}: {', '.join(sorted(stmt.binds)) or 'a statement'} reads "
                                      "__file__, which in the export is another file: refused")
                builtins_used.add(ent.name)
        resolved[sid] = out
        load_deps[sid] = deps
        all_deps[sid] = every
        state[sid] = 2
        order.append(stmt)

    for root in roots:
        if isinstance(root, Def):
            for s in stmts_of(root):
                visit(s)
        else:
            by_id[id(root)] = root
            for n in root.binds:
                def_stmt_ids.setdefault(Def(root.module, n), []).append(id(root))
            visit(root)

    # Emission order: module by module, the modules a module uses before it, each module's definitions in
    # their order in its file; a statement that needs another while loading always comes after it.
    first_seen: dict[str, int] = {}
    for i, st in enumerate(order):
        first_seen.setdefault(st.module, i)
    needs: dict[str, set[str]] = {m: set() for m in first_seen}
    for sid, deps in all_deps.items():
        for d in deps:
            if by_id[d].module != by_id[sid].module:
                needs[by_id[sid].module].add(by_id[d].module)
    module_rank: dict[str, int] = {}
    while len(module_rank) < len(needs):
        left = sorted((m for m in needs if m not in module_rank), key=first_seen.get)
        ready = [m for m in left if needs[m] <= set(module_rank)]
        module_rank[(ready or left)[0]] = len(module_rank)  # a cycle (a function-local import): first seen

    def position(st: Stmt) -> tuple[int, int, int]:
        if not st.synthetic:
            return module_rank[st.module], 0, st.start
        src = _source(st.module)
        at = [_stmt(st.module, i).start for n in st.binds for i in src.binds.get(n, [])]
        return (module_rank[st.module], 0, min(at)) if at else (module_rank[st.module], 1, rank[id(st)])

    rank = {id(st): i for i, st in enumerate(order)}
    emitted: list[Stmt] = []
    done: set[int] = set()
    pending = sorted(rank, key=lambda i: position(by_id[i]))
    while pending:
        for sid in pending:
            if load_deps[sid] - {sid} <= done:
                break
        else:
            names = ", ".join(sorted(n for s in pending for n in by_id[s].binds))
            raise ExportError(f"definitions that need each other while loading: {names}")
        pending.remove(sid)
        done.add(sid)
        emitted.append(by_id[sid])

    # Names: builtins and reserved names first, then imports, then the priority module's definitions, then the
    # rest in emission order. A clash renames the later one with its module as a prefix.
    all_locals = set().union(*(s.locals for s in emitted)) if emitted else set()
    taken: dict[str, Entity | str] = {n: ("reserved" if e is None else e) for n, e in reserved.items()}
    for b in builtins_used:
        taken.setdefault(b, Builtin(b))
    names: dict[Entity, str] = {Builtin(b): b for b in builtins_used}

    def claim(ent: Entity, want: str, module: str) -> None:
        if taken.get(want, ent) == ent:
            taken[want] = ent
            names[ent] = want
            return
        new = _prefixed(module, want)
        n = 2
        while new in taken or new in all_locals or keyword.iskeyword(new):
            new = f"{_prefixed(module, want)}_{n}"
            n += 1
        taken[new] = ent
        names[ent] = new

    for ent in sorted(exts, key=lambda e: (e.module, e.attr or "")):
        claim(ent, first_name[ent], ent.module.replace(".", "_"))
    defs = [d for d in def_stmt_ids if any(i in done for i in def_stmt_ids[d])]
    defs.sort(key=lambda d: (d.module != priority, min(emitted.index(by_id[i]) for i in def_stmt_ids[d])))
    for d in defs:
        claim(d, d.name, d.module)

    edits: dict[int, list[tuple[int, int, str]]] = {}
    for stmt in emitted:
        sid = id(stmt)
        ed = [(a, b, t) for a, b, t in stmt.kills]
        for ref, ent, used in resolved[sid]:
            if ent not in names:
                continue  # a soft reference to something not exported: left as written
            new = names[ent]
            if ref.spans[0] == (-1, -1):
                if new != ref.chain[0]:
                    raise ExportError(f"{stmt.module}: `global {ref.chain[0]}` names a definition the export "
                                      f"has to rename to {new}; rename it in the source")
                continue
            a, b = ref.spans[used - 1]
            old = stmt.buf[a:b].decode()
            if new != old:
                if new in ref.shadows:
                    raise ExportError(f"{stmt.module}: {old} becomes {new} in the export, which a local "
                                      f"variable of the same name would shadow; rename one of them")
                ed.append((a, b, new))
        for d in (Def(stmt.module, n) for n in stmt.binds):
            if d in names and stmt.defname_span and names[d] != d.name:
                ed.append((*stmt.defname_span, names[d]))
        edits[sid] = ed

    root_names = []
    for root in roots:
        if isinstance(root, Def):
            root_names.append(names[root])
    ext_local = set().union(*(s.ext_local for s in emitted)) if emitted else set()
    shared = {e for e in reserved.values() if isinstance(e, Ext)}
    return Closure(emitted, names, edits, exts, shared, ext_local, root_names)


def _text(stmt: Stmt, edits: list[tuple[int, int, str]]) -> str:
    """The statement's source with ``edits`` (byte spans of its buffer -> new text) made. A continuation line
    aligned with a bracket that an edit moved moves with it, so a renamed call keeps its arguments lined up."""
    seg = stmt.buf[stmt.start:stmt.end]
    text = seg.decode()
    lines = text.split("\n")
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line.encode()) + 1)

    def where(offset: int) -> tuple[int, int]:  # byte offset in the buffer -> (line, character column)
        rel = offset - stmt.start
        i = max(j for j, st in enumerate(starts) if st <= rel)
        return i, len(seg[starts[i]:rel].decode())

    per_line: dict[int, list[tuple[int, int, str]]] = {}
    dropped: set[int] = set()
    for a, b, new in edits:
        (la, ca), (lb, cb) = where(a), where(b)
        if lb != la:  # a multi-line span (a function-local import): its first line takes the replacement
            cb = len(lines[la])
            dropped |= set(range(la + 1, lb + 1))
        per_line.setdefault(la, []).append((ca, cb, new))
    shift = [0] * len(lines)
    if any(len(new) != cb - ca for es in per_line.values() for ca, cb, new in es):
        import io
        import tokenize

        opens: list[tuple[int, int]] = []  # unclosed brackets of the current logical line: (line, col)
        seen: list[tuple[int, int]] = []  # every bracket opened in the current logical line
        try:
            for tok in tokenize.generate_tokens(io.StringIO(text).readline):
                if tok.type == tokenize.OP and tok.string in "([{":
                    opens.append((tok.start[0] - 1, tok.start[1]))
                    seen.append(opens[-1])
                elif tok.type == tokenize.OP and tok.string in ")]}" and opens:
                    opens.pop()
                elif tok.type == tokenize.NEWLINE:
                    opens, seen = [], []
                elif tok.type == tokenize.NL and opens:
                    nxt = tok.start[0]  # index of the next physical line
                    if nxt < len(lines):
                        indent = len(lines[nxt]) - len(lines[nxt].lstrip(" "))
                        for l0, c0 in reversed(seen):
                            if c0 + 1 == indent and l0 < nxt:
                                moved = sum(len(new) - (cb - ca) for ca, cb, new in per_line.get(l0, [])
                                            if ca < c0)
                                shift[nxt] = shift[l0] + moved
                                break
        except (tokenize.TokenError, IndentationError, SyntaxError):
            shift = [0] * len(lines)
    out = []
    for i, line in enumerate(lines):
        if i in dropped:
            continue
        for ca, cb, new in sorted(per_line.get(i, []), reverse=True):
            line = line[:ca] + new + line[cb:]
        if shift[i] > 0:
            line = " " * shift[i] + line
        elif shift[i] < 0:
            cut = min(-shift[i], len(line) - len(line.lstrip(" ")))
            line = line[cut:]
        if not _MARKER.match(line):
            out.append(line)
    return "\n".join(out).rstrip()


def _import_lines(cl: Closure, suffix: str = "") -> list[str]:
    std, third = [], []
    froms: dict[str, list[str]] = {}
    for ent, subs in sorted(cl.exts.items(), key=lambda kv: (kv[0].module, kv[0].attr or "")):
        if ent in cl.shared:
            continue
        name = cl.names[ent]
        if ent.attr is None:
            loads = sorted(s for s in subs if s != ent.module)
            line = [f"import {s}" for s in loads]
            line.append(f"import {ent.module}" if name == ent.module else f"import {ent.module} as {name}")
            (std if ent.module.split(".")[0] in sys.stdlib_module_names else third).extend(line)
        else:
            froms.setdefault(ent.module, []).append(ent.attr if name == ent.attr else f"{ent.attr} as {name}")
    for mod, attrs in froms.items():
        line = f"from {mod} import {', '.join(sorted(set(attrs)))}"
        if len(line) > 100:
            line = f"from {mod} import (\n" + "".join(f"    {a},\n" for a in sorted(set(attrs))) + ")"
        (std if mod.split(".")[0] in sys.stdlib_module_names else third).append(line)

    def order(lines):  # `import x` lines before `from x import y`, as isort does
        out = sorted(dict.fromkeys(lines), key=lambda s: (s.startswith("from "), s.lower()))
        return [s.replace(" import (", f" import ({suffix}", 1) if s.endswith("(") or "\n" in s
                else s + suffix for s in out]

    blocks = [b for b in (order(std), order(third)) if b]
    return ["\n".join(b) for b in blocks]


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def render(cl: Closure, header: str, extra_top: str = "", tail: str = "", all_names: list[str] | None = None,
           provenance: bool = True, import_suffix: str = "") -> str:
    parts = [header.rstrip(), "from __future__ import annotations"]
    if extra_top:
        parts.append(extra_top.rstrip())
    parts += _import_lines(cl, import_suffix)
    if all_names:
        parts.append("__all__ = [" + ", ".join(repr(n) for n in all_names) + "]")
    out = "\n\n".join(parts)
    last = None
    for stmt in cl.stmts:
        text = _text(stmt, cl.edits[id(stmt)])
        if provenance and (last is None or stmt.module != last.module):
            rel = _module_file(stmt.module).relative_to(REPO).as_posix()
            text = f"# {'-' * (96 - len(rel))} {rel}\n{text}"
            sep = "\n\n\n"
        elif isinstance(stmt.node, _DEFS) or isinstance(last.node, _DEFS):
            sep = "\n\n\n"
        elif stmt.buf is last.buf and stmt.buf[last.end:stmt.start].count(b"\n") <= 1:
            sep = "\n"  # assignments on consecutive lines of one file stay together
        else:
            sep = "\n\n"
        out += sep + text
        last = stmt
    if tail:
        out += "\n\n\n" + tail.strip("\n")
    return out.rstrip() + "\n"


# ---------------------------------------------------------------------------------- the op, version, result

def _version_number(name: str) -> int:
    return int(name[1:]) if re.fullmatch(r"v\d+", name) else -1


def _results(results: dict | None = None) -> dict[str, dict]:
    if results is not None:
        return results
    from snippets.bench.report import load_results

    return load_results()


def _gpu_order(results: dict[str, dict]) -> list[str]:
    return sorted(results, key=lambda g: (g != PREFERRED_GPU, g))


def headline_record(op, impl_name: str, results: dict[str, dict], gpu: str) -> dict | None:
    from snippets.registry import dtype_name, size_key

    entry = results.get(gpu, {}).get("ops", {}).get(op.name)
    if not entry:
        return None
    dtype, key = dtype_name(op.timed_dtypes()[0]), size_key(op.headline)
    for r in entry["records"]:
        if r["impl"] == impl_name and r["size_key"] == key and r["dtype"] == dtype:
            return r
    return None


def best_version(op, results: dict | None = None) -> tuple[str, str, str | None]:
    """(version, why, gpu): the book's version with the best headline result (the H200's results first, else
    any GPU's); with none measured, the highest-numbered book version that runs on the CPU (else the highest)."""
    results = _results(results)
    book = [n for n, i in op.impls.items() if i.origin == "book"]
    if not book:
        raise ExportError(f"{op.name} has no version of the book's own (every version is a library's: "
                          f"{', '.join(sorted(op.impls, key=_version_number))}); nothing to export")
    for gpu in _gpu_order(results):
        recs = [r for n in book if (r := headline_record(op, n, results, gpu)) is not None]
        if recs:
            pick = min if op.lower_is_better else max
            best = pick(recs, key=lambda r: r["value"])
            return best["impl"], f"the book's fastest version at the headline size on the {gpu}", gpu
    cpu = [n for n in book if op.impls[n].runs_on("cpu")]
    name = max(cpu or book, key=_version_number)
    why = ("no measured result: the highest-numbered book version that runs on the CPU" if cpu
           else "no measured result: the highest-numbered book version")
    return name, why, None


def _twin(op, ops: dict):
    for name in (f"{op.name}_fwd_bwd", op.name[:-4] + "_bwd" if op.name.endswith("_fwd") else None):
        if name and name in ops and name != op.name:
            return ops[name]
    return None


def _def_of(obj, what: str) -> Def | None:
    """The top-level definition of a function (or Triton kernel) of this package, or None."""
    target = getattr(obj, "fn", obj)
    module = getattr(target, "__module__", "") or ""
    qual = getattr(target, "__qualname__", "") or ""
    if not (module == PACKAGE or module.startswith(PACKAGE + ".")):
        return None
    if "." in qual or "<" in qual:
        return None
    if qual not in _source(module).binds:
        raise ExportError(f"{what}: {module}.{qual} is not a top-level definition of its module")
    return Def(module, qual)


def _registration_expr(op, field_name: str) -> str | None:
    """The source of ``field_name=...`` in the ``Op(name="<op>", ...)`` call that registers the op, when the
    value is not a top-level function (a factory's result such as ``_inputs(2)``)."""
    module = getattr(op.reference, "__module__", None)
    if not module:
        return None
    src = _source(module)
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Op":
            kws = {k.arg: k.value for k in node.keywords if k.arg}
            name = kws.get("name")
            if isinstance(name, ast.Constant) and name.value == op.name and field_name in kws:
                return ast.get_source_segment(src.text, kws[field_name])
    return None


def _impl_keyword(impl, keyword_name: str) -> tuple[str, str] | None:
    """(module, source) of ``keyword_name=...`` in the ``Impl(...)`` call that registers ``impl``: the
    ``Impl("<version>", <its function>, ...)`` call of its op's module, when there is exactly one."""
    fn_name = getattr(getattr(impl.fn, "fn", impl.fn), "__name__", None)
    found = []
    for module in dict.fromkeys(m for m in (impl.home, getattr(impl.fn, "__module__", None)) if m):
        if _module_file(module) is None:
            continue
        src = _source(module)
        for node in ast.walk(src.tree):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Impl"
                    and len(node.args) >= 2):
                continue
            version, fn = node.args[0], node.args[1]
            if not (isinstance(version, ast.Constant) and version.value == impl.name):
                continue
            if getattr(fn, "id", getattr(fn, "attr", None)) != fn_name:
                continue
            kws = {k.arg: k.value for k in node.keywords if k.arg}
            found.append((module, ast.get_source_segment(src.text, kws[keyword_name]) if keyword_name in kws
                          else None))
    if len(found) != 1 or found[0][1] is None:
        return None
    return found[0]


def _callable_root(op, obj, field_name: str, alias: str) -> tuple[Def | Stmt, str]:
    """A root for one of the op's callables and the name the test calls it by."""
    d = _def_of(obj, f"{op.name}.{field_name}")
    if d is not None:
        return d, d.name
    expr = _registration_expr(op, field_name)
    if expr is None:
        raise ExportError(f"{op.name}.{field_name} is neither a top-level function of {PACKAGE} nor written "
                          "in the op's Op(...) registration")
    module = op.reference.__module__
    return _synthetic(module, f"{alias} = {expr}"), alias


# ------------------------------------------------------------------------------------------------ the export

@dataclass
class Export:
    op: str
    version: str
    why: str
    module_path: Path
    test_path: Path
    cuda_files: list[Path]
    names: list[str]


def _chapter(op, impl) -> tuple[str, str]:
    """(docs path, title) of the chapter that includes the op's code: the registered chapter when it includes
    the version's module, else the first page that does."""
    from snippets.contract import INCLUDE

    docs = REPO / "docs"
    target = getattr(impl.fn, "fn", impl.fn)
    mod_file = _module_file(target.__module__).relative_to(REPO).as_posix()
    pages = [op.chapter] + sorted(p.relative_to(docs).as_posix() for p in docs.glob("**/*.md"))
    chapter = op.chapter
    for page in pages:
        path = docs / page
        if path.is_file() and mod_file in {f for f, _ in INCLUDE.findall(path.read_text())}:
            chapter = page
            break
    title = chapter
    path = docs / chapter
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.startswith("# "):
                title = line[2:].strip()
                break
    return chapter, title


def _docs_url(chapter: str) -> str | None:
    py = REPO / "pyproject.toml"
    m = re.search(r'^Documentation\s*=\s*"([^"]+)"', py.read_text(), re.MULTILINE) if py.is_file() else None
    return m.group(1).rstrip("/") + "/" + chapter.removesuffix(".md") + "/" if m else None


def _git_commit() -> str | None:
    """The repository's commit (short), with a note when the code exported differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", PACKAGE, "csrc"],
                               cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + (" with uncommitted changes" if dirty else "")) if head else None


def _fmt_size(size: dict) -> str:
    return ", ".join(f"{k}={size[k]}" for k in sorted(size))


def result_lines(op, version: str, results: dict[str, dict]) -> list[str]:
    """One sentence per GPU with a headline result for ``version``, from the results files."""
    from snippets.registry import CEILINGS

    lines = []
    impl = op.impls[version]
    try:
        current = impl.source_hash()
    except Exception:  # noqa: BLE001 (a hash that cannot be computed: freshness unknown)
        current = None
    for gpu in _gpu_order(results):
        r = headline_record(op, version, results, gpu)
        if r is None:
            continue
        entry = results[gpu]["ops"][op.name]
        prov = entry.get("provenance", {})
        s = (f"{r['value']:.4g} {r['unit']} at {_fmt_size(r['size'])} {r['dtype']} on the {gpu}")
        ceiling = entry.get("ceiling")
        if ceiling and r.get("fraction_of_ceiling") is not None:
            s += (f", {100 * r['fraction_of_ceiling']:.1f}% of its {ceiling['name']} ceiling "
                  f"({ceiling['value']:.4g} {ceiling['unit']}, {CEILINGS.get(ceiling['name'], ceiling['name'])})")
        if r.get("speedup_vs_v0") and "v0" in op.impls:
            s += f", {r['speedup_vs_v0']:.3g}x v0 ({op.impls['v0'].desc})"
        s += f"; {r['ms'] * 1e3:.4g} us a call"
        date = (prov.get("date") or "")[:10]
        commit = (prov.get("commit") or "")[:7]
        versions = ", ".join(f"{k} {prov[k]}" for k in ("torch", "triton", "cupy") if prov.get(k))
        s += f"; measured {date} at commit {commit}" + (f" ({versions})" if versions else "") + "."
        if current is not None and r.get("source_hash") != current:
            s += " The code has changed since (the result is stale): re-measure with python -m snippets bench."
        lines.append(s)
    return lines


def _signature(stmt: Stmt, name: str) -> str:
    node = stmt.node
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = ast.unparse(node.args)
        return f"{name}({args})"
    return name


def _first_doc_line(node: ast.AST) -> str:
    doc = ast.get_docstring(node) if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else None
    return re.sub(r"^v\d+:\s*", "", " ".join(doc.split("\n\n")[0].split())) if doc else ""


@dataclass
class Target:
    """A function the export makes public and tests: the version asked for, or its training twin's."""

    op: Any
    version: str
    impl: Any
    root: Def


def _is_autograd(module: str, name: str) -> bool:
    import importlib

    import torch

    obj = getattr(importlib.import_module(module), name, None)
    return isinstance(obj, type) and issubclass(obj, torch.autograd.Function)


def _autograd(roots: list[Def]) -> list[Def]:
    """The torch.autograd.Function classes in the closure of ``roots``."""
    return [Def(st.module, st.node.name) for st in closure(roots).stmts
            if isinstance(st.node, ast.ClassDef) and not st.synthetic and _is_autograd(st.module, st.node.name)]


def _kernels(cl: Closure) -> set[tuple[str, str]]:
    """The Triton kernels (``@triton.jit``, ``@triton.autotune``) of a closure."""
    return {(st.module, st.node.name) for st in cl.stmts if isinstance(st.node, ast.FunctionDef)
            and any("triton" in ast.unparse(d) for d in st.node.decorator_list)}


def _family(op, ops: dict) -> set[str]:
    """The op and its forward + backward twins, either way round."""
    twin = _twin(op, ops)
    return {op.name} | ({twin.name} if twin else set()) | {o.name for o in ops.values() if _twin(o, ops) is op}


def _module_autograd(op, root: Def, ops: dict, results: dict) -> list[Def]:
    """The autograd.Function classes of the version's module that train with its kernels (their closure
    shares a Triton kernel with the version's), less those that another op's book versions use: the
    training path of an op whose registered versions time the kernels directly (flash attention)."""
    mine = _kernels(closure([root]))
    if not mine:
        return []
    others: set[Def] = set()
    family = _family(op, ops)
    for other in ops.values():
        if other.name in family:
            continue
        for impl in other.impls.values():
            d = _def_of(impl.fn, other.name) if impl.origin == "book" else None
            if d is not None and d.module == root.module:
                others |= set(_autograd([d]))
    found = []
    for node in _source(root.module).tree.body:
        if isinstance(node, ast.ClassDef) and _is_autograd(root.module, node.name):
            d = Def(root.module, node.name)
            if d not in others and _kernels(closure([d])) & mine:
                found.append(d)
    return found


def _training_twin(op, version: str, ops: dict, results: dict) -> tuple[Target | None, list[Def]]:
    """For an op that trains: its forward + backward twin's version (the same number when it is the book's,
    else the twin's best) and the autograd.Function classes that version uses; (None, []) when there is none."""
    twin = _twin(op, ops)
    if twin is None:
        return None, []
    if version in twin.impls and twin.impls[version].origin == "book":
        tv = version
    else:
        try:
            tv = best_version(twin, results)[0]
        except ExportError:
            return None, []
    root = _def_of(twin.impls[tv].fn, f"{twin.name} {tv}")
    if root is None:
        return None, []
    classes = _autograd([root])
    if not classes:
        return None, []
    return Target(twin, tv, twin.impls[tv], root), classes


def _cuda_files(op, impl, cl: Closure) -> list[Path]:
    """csrc files the exported code can load: those the version lists and those its code names in a string,
    with every header they include, recursively."""
    csrc = REPO / "csrc"
    names = set()
    for obj in impl.sources:
        if isinstance(obj, (str, Path)):
            p = Path(obj) if Path(obj).is_absolute() else REPO / obj
            if p.resolve().is_relative_to(csrc.resolve()):
                names.add(p.resolve())
    for stmt in cl.stmts:
        for s in _CU_NAME.findall(stmt.buf[stmt.start:stmt.end].decode()):
            if (csrc / s).is_file():
                names.add((csrc / s).resolve())
    seen: list[Path] = []

    def visit(f: Path) -> None:
        if f in seen:
            return
        seen.append(f)
        for inc in _CU_INCLUDE.findall(f.read_text()):
            for cand in (f.parent / inc, csrc / "common" / inc):
                if cand.is_file():
                    visit(cand.resolve())
                    break

    for f in sorted(names):
        visit(f)
    return seen


def _literal(value: Any) -> str:
    """Python source for a registry value (sizes, dtypes, tolerances)."""
    import torch

    if isinstance(value, torch.dtype):
        return str(value)  # torch.float32
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_literal(v) for v in value)
        return f"({inner},)" if isinstance(value, tuple) and len(value) == 1 else \
            (f"({inner})" if isinstance(value, tuple) else f"[{inner}]")
    if isinstance(value, str) and '"' not in value and "\\" not in value:
        return f'"{value}"'
    if isinstance(value, (bool, int, float, str)) or value is None:
        return repr(value)
    raise ExportError(f"cannot write {value!r} ({type(value).__name__}) as a literal")


def _volume(size: dict) -> int:
    v = 1
    for x in size.values():
        if isinstance(x, int) and not isinstance(x, bool):
            v *= max(1, x)
    return v


def _docstring(lines: list[str]) -> str:
    text = "\n".join(lines).replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    return f'"""{text}\n"""'


def _wrap(text: str, indent: str = "") -> list[str]:
    return textwrap.wrap(text, 100, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False,
                         break_long_words=False) or [""]


@dataclass
class Plan:
    """What ``export`` writes for an op, worked out without writing anything (the docs' box shows it)."""

    op: Any
    version: str
    why: str
    targets: list[Target]  # the version asked for, then its training twin's function (tested too)
    roots: list[Def]  # targets and autograd.Function classes: the module's public names
    closure: Closure
    cuda_files: list[Path]  # csrc files to copy (absolute)
    needs: list[str]  # third-party packages of its imports
    optional: list[str]  # packages imported only inside functions (cupy for CUDA C)

    @property
    def names(self) -> list[str]:
        return [self.closure.names[d] for d in self.roots]

    @property
    def function(self) -> str:
        return self.closure.names[self.targets[0].root]


def plan(op_name: str, version: str | None = None, results: dict | None = None) -> Plan:
    """The version to export (named, or the book's best), its roots and their closure."""
    from snippets.op_index import load_all

    ops = load_all()
    if op_name not in ops:
        raise ExportError(f"unknown op {op_name!r}; known ops: {', '.join(sorted(ops))}")
    op = ops[op_name]
    results = _results(results)
    if version is None:
        version, why, _ = best_version(op, results)
    else:
        if version not in op.impls:
            raise ExportError(f"{op.name} has no version {version!r}; it has "
                              f"{', '.join(sorted(op.impls, key=_version_number))}")
        why = "the version named on the command line"
        if op.impls[version].origin != "book":
            why += f" (a library's version: {op.impls[version].desc})"
    impl = op.impls[version]
    root = _def_of(impl.fn, f"{op.name} {version}")
    if root is None:
        raise ExportError(f"{op.name} {version} is {impl.desc}, a library callable ({impl.fn!r}), not code of "
                          "this book: nothing to copy")
    if not re.fullmatch(r"[A-Za-z_]\w*", op.name) or keyword.iskeyword(op.name):
        raise ExportError(f"{op.name!r} is not a valid module name")
    targets = [Target(op, version, impl, root)]
    twin, classes = _training_twin(op, version, ops, results)
    if twin is not None and twin.root != root:
        targets.append(twin)
    if not classes:  # no training path through a twin: the version's own, else its module's
        classes = _autograd([root]) or _module_autograd(op, root, ops, results)
    roots: list[Def] = list(dict.fromkeys([t.root for t in targets] + classes))
    cl = closure(roots, reserved={"__all__": None}, priority=root.module)
    stdlib = set(sys.stdlib_module_names)
    needs = sorted({e.module.split(".")[0] for e in cl.exts} - stdlib)
    if op.name in {e.module.split(".")[0] for e in cl.exts} | cl.ext_local:
        raise ExportError(f"the module would be named {op.name}.py, like a package it imports")
    cuda_files = _cuda_files(op, impl, cl)
    if any(d.name == "REPO_ROOT" for d in cl.names if isinstance(d, Def)) and not cuda_files:
        raise ExportError(f"{op.name} {version} reads files under the repository root, but no csrc file was "
                          "found to copy")
    return Plan(op, version, why, targets, roots, cl, cuda_files, needs, sorted(cl.ext_local - stdlib - set(needs)))


def export(op_name: str, version: str | None = None, out: Path = Path("."), results: dict | None = None,
           ) -> Export:
    """Write ``<out>/<op>.py`` (and ``csrc/`` for a CUDA version) and ``<out>/test_<op>.py``."""
    results = _results(results)
    pl = plan(op_name, version, results)
    op, version, why, cl, roots, targets = pl.op, pl.version, pl.why, pl.closure, pl.roots, pl.targets
    impl = targets[0].impl
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    copied = []
    for f in pl.cuda_files:  # CUDA sources beside the module, where the loader looks (REPO_ROOT/csrc)
        rel = f.relative_to((REPO / "csrc").resolve())
        dest = out / "csrc" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dest)
        copied.append(Path("csrc") / rel)

    chapter, title = _chapter(op, impl)
    url = _docs_url(chapter)
    stmt_of = {(s.module, n): s for s in cl.stmts for n in s.binds}
    api = []
    for d in roots:
        name = cl.names[d]
        s = stmt_of[(d.module, d.name)]
        sig = _signature(s, name)
        if isinstance(s.node, ast.ClassDef):
            fwd = [f for f in s.node.body if isinstance(f, ast.FunctionDef) and f.name == "forward"]
            sig = f"{name}.apply({ast.unparse(fwd[0].args).split(', ', 1)[-1]})" if fwd else f"{name}.apply(...)"
        what = next((f"{t.op.name} {t.version}: " for t in targets if t.root == d), "")
        api.append((sig, what + _first_doc_line(s.node)))
    commit = _git_commit()
    head = [f"{op.title}: {op.name} {version} ({impl.lang}), {impl.desc}."]
    doc: list[str] = []
    doc += _wrap(f"Exported from Kernels, Measured (chapter \"{title}\", docs/{chapter}"
                 + (f", {url}" if url else "") + f") by `python -m snippets export {op.name}"
                 + (f" {version}" if why.startswith("the version named") else "") + "`"
                 + (f" at commit {commit}" if commit else "") + f": {why}. One file, no dependency on the book's "
                 "repository: every definition below is copied verbatim from the module named in the comment "
                 "line above it, with names that clashed between modules renamed.")
    doc.append("")
    rl = result_lines(op, version, results)
    if rl:
        doc.append("Measured (benchmarks/results):")
        for line in rl:
            doc += textwrap.wrap(line, 100, initial_indent="  - ", subsequent_indent="    ",
                                 break_on_hyphens=False, break_long_words=False)
    else:
        doc.append("Measured: no result for this version in benchmarks/results.")
    doc.append("")
    doc.append("Use:")
    for sig, line in api:
        doc += _wrap(sig, "    ")
        if line:
            doc += _wrap(line, "        ")
    doc.append("")
    needs = ", ".join(pl.needs) + (f" (and, where used, {', '.join(pl.optional)})" if pl.optional else "")
    doc += _wrap(f"Needs: {needs}." + (f" Loads the CUDA C sources {', '.join(p.as_posix() for p in copied)} "
                                       "(copied beside this file) through CuPy (NVRTC)." if copied else ""))
    doc += _wrap(f"Tests: test_{op.name}.py beside this file (python -m pytest test_{op.name}.py).")
    header = _docstring(head + [""] + doc)
    module_text = render(cl, header, all_names=pl.names)
    compile(module_text, f"{op.name}.py", "exec")
    module_path = out / f"{op.name}.py"
    module_path.write_text(module_text)

    test_text = _test_file(targets, [cl.names[t.root] for t in targets])
    compile(test_text, f"test_{op.name}.py", "exec")
    test_path = out / f"test_{op.name}.py"
    test_path.write_text(test_text)
    return Export(op.name, version, why, module_path, test_path, [out / p for p in copied], pl.names)


# ------------------------------------------------------------------------------------------------- the test

_TEST_TOP = """\
import os

import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: Triton runs on the CPU

import pytest  # noqa: E402
"""

_TEST_TAIL = """\
try:  # beside the module in a package, or in a plain folder
    from . import {module} as exported  # noqa: E402
except ImportError:
    import {module} as exported  # noqa: E402

SEED = 1234
# One case per exported function: what it is checked against, on which inputs and how closely. From the book's
# registry: device is where it runs ("any": a GPU, or the CPU under Triton's interpreter; "cuda"; "cpu"),
# supports the dtypes the function takes where it runs (None: all of the op's), tolerances are (rtol, atol)
# against the float64 reference, bad is (the argument the refusal test spoils, the dtype it gives it).
CASES = {cases}


def case_dtypes(case: dict) -> list:
    return [d for d in case["dtypes"] if case["supports"] is None or d in case["supports"]]


def run_on(case: dict) -> str:
    \"\"\"Where the case's function runs here, or a skip that says why it cannot.\"\"\"
    reason = case["requires"]() if case["requires"] else None
    if reason:
        pytest.skip(reason)
    if case["device"] == "cpu":
        return "cpu"
    if case["device"] == "cuda" and not HAS_GPU:
        pytest.skip("runs on an NVIDIA GPU only, and torch sees none (torch.cuda.is_available() is False)")
    if case["cuda_c"]:
        pytest.importorskip("cupy", reason="the CUDA C kernel is compiled and launched through CuPy: "
                            "pip install cupy-cuda13x (or cupy-cuda12x)")
    if case["device"] == "cuda":
        return "cuda"
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    return "cuda" if HAS_GPU and not interpreted else "cpu"


def inputs(case: dict, size: dict, dtype: torch.dtype, device: str) -> tuple:
    return case["make_inputs"](size, dtype, case["inputs_on"] or device, torch.Generator().manual_seed(SEED))


def as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def float64(a):
    return a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a


def size_id(size: dict) -> str:
    return ",".join(f"{{k}}={{v}}" for k, v in sorted(size.items()))


@pytest.mark.parametrize("name, dtype, size", [
    pytest.param(name, dtype, size, id=f"{{name}}-{{str(dtype)[6:]}}-{{size_id(size)}}")
    for name, case in CASES.items() for dtype in case_dtypes(case) for size in case["sizes"]])
def test_matches_reference(name, dtype, size):
    case = CASES[name]
    args = inputs(case, size, dtype, run_on(case))
    if case["check"] is not None:  # a random output (dropout): the op's own check of what is a valid one
        case["check"](case["function"](*args), args, dtype)
        return
    refs = as_tuple(case["reference"](*(float64(a) for a in args)))  # first: a function may write over args
    outs = as_tuple(case["function"](*args))
    assert len(outs) == len(refs), f"{{len(outs)}} outputs, the reference has {{len(refs)}}"
    rtol, atol = case["tolerances"][dtype]
    for i, (out, ref) in enumerate(zip(outs, refs)):
        assert out.dtype == case["output_dtypes"].get(dtype, dtype), f"output {{i}}: dtype {{out.dtype}}"
        assert out.shape == ref.shape, f"output {{i}}: shape {{tuple(out.shape)}}, not {{tuple(ref.shape)}}"
        assert not out.isnan().any() or ref.isnan().any(), f"output {{i}}: NaN"
        torch.testing.assert_close(out.double().cpu(), ref.double().cpu(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", list(CASES))
def test_refuses_a_wrong_dtype(name):
    \"\"\"One argument of a dtype the function does not take: refused with a TypeError or ValueError.\"\"\"
    case = CASES[name]
    args = list(inputs(case, case["sizes"][0], case_dtypes(case)[0], run_on(case)))
    index, dtype = case["bad"]
    args[index] = args[index].to(dtype)
    with pytest.raises((TypeError, ValueError)):
        case["function"](*args)
"""


def _is_literal(text: str) -> bool:
    try:
        ast.literal_eval(text)
    except ValueError:
        return False
    return True


def _pretty(value: Any, indent: int, width: int = 116) -> str:
    """``_literal(value)``, over several lines when it does not fit in ``width`` columns at ``indent``."""
    flat = _literal(value)
    if indent + len(flat) <= width or not isinstance(value, (list, tuple, dict)):
        return flat
    pad = " " * (indent + 4)
    if isinstance(value, dict):
        items = [f"{pad}{_literal(k)}: {_pretty(v, indent + 4 + len(_literal(k)) + 2, width)}," for k, v in
                 value.items()]
        return "{\n" + "\n".join(items) + "\n" + " " * indent + "}"
    items = [f"{pad}{_pretty(v, indent + 4, width)}," for v in value]
    return ("[" if isinstance(value, list) else "(") + "\n" + "\n".join(items) + "\n" + " " * indent + \
        ("]" if isinstance(value, list) else ")")


def _refusal(t: Target, size: dict, dtype) -> tuple[int, Any]:
    """(argument, dtype) for the refusal test: the first tensor argument and dtype, among those the op does
    not take, that the version refuses with a TypeError or ValueError raised by the book's own code. They are
    tried on CPU tensors with Triton's interpreter on (``triton_device()`` answers "cpu"), where no kernel can
    reach a GPU: in this process when torch sees no GPU or the interpreter is on already, else in a process
    that sees no GPU (a kernel created lazily under the interpreter must not be cached here). A launch that
    gets past the checks fails inside Triton or torch, which is not a refusal. A version that runs on a GPU
    only gets its first tensor in int16 untried."""
    import json
    import os

    import torch

    try:
        args = t.op.make_inputs(size, dtype, "cpu", torch.Generator().manual_seed(0))
    except Exception:  # noqa: BLE001 (inputs that only a GPU can make, such as pinned host memory)
        args = (torch.empty(0, dtype=dtype),)
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    if not tensors:
        raise ExportError(f"{t.op.name}: its input generator returns no tensor")
    used = {a.dtype for a in args if isinstance(a, torch.Tensor)} | set(t.op.dtypes)
    bad = [d for d in (torch.int16, torch.complex64, torch.float64) if d not in used]
    candidates = [(i, d) for i in tensors for d in bad]
    if not t.impl.runs_on("cpu"):
        return candidates[0]
    interpreting = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if interpreting or not torch.cuda.is_available():
        found = None if t.impl.unavailable() else _try_refusals(t.impl.fn, args, candidates)
    else:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1",
                   PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
        code = ("import json, sys; from snippets.export import _refusal_main; "
                "print(json.dumps(_refusal_main(*sys.argv[1:])))")
        proc = subprocess.run([sys.executable, "-c", code, t.op.name, t.version, json.dumps(size), str(dtype)],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise ExportError(f"trying wrong dtypes on {t.op.name} {t.version} failed:\n{proc.stderr[-2000:]}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        found = (out[0], getattr(torch, out[1].removeprefix("torch."))) if out else None
    if found is None:
        raise ExportError(f"{t.op.name} {t.version} refuses none of the wrong dtypes tried "
                          f"({', '.join(str(d) for d in bad)} for each tensor argument) with a TypeError or "
                          "ValueError: the export's refusal test has nothing to check")
    return found


def _try_refusals(fn, args: tuple, candidates: list) -> tuple[int, Any] | None:
    """The first (argument, dtype) that ``fn`` refuses from the book's own code, under the interpreter."""
    import os

    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        for i, d in candidates:
            spoiled = list(args)
            spoiled[i] = args[i].to(d)
            try:
                fn(*spoiled)
            except (TypeError, ValueError) as e:
                tb = e.__traceback__
                while tb.tb_next is not None:
                    tb = tb.tb_next
                if Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(PACKAGE_DIR):
                    return i, d
            except Exception:  # noqa: BLE001 (not a refusal: try the next argument)
                pass
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved
    return None


def _refusal_main(op_name: str, version: str, size: str, dtype: str) -> list | None:
    """``_refusal`` in a process that sees no GPU: [argument, dtype name], for the exporting process."""
    import json

    import torch

    from snippets.op_index import load_all

    op = load_all()[op_name]
    t = Target(op, version, op.impls[version], Def("", ""))
    i, d = _refusal(t, json.loads(size), getattr(torch, dtype.removeprefix("torch.")))
    return [i, str(d)]


def _where(impl) -> str:
    if impl.lang == "CUDA":
        return "on an NVIDIA GPU, with CuPy to compile the CUDA C; elsewhere the tests skip, saying why"
    if impl.device == "any":
        return "on the GPU when torch sees one, else on the CPU under Triton's interpreter"
    return "on the CPU" if impl.device == "cpu" else "on an NVIDIA GPU; elsewhere the tests skip, saying why"


def _test_file(targets: list[Target], functions: list[str]) -> str:
    """``test_<op>.py``: every target's function against its op's reference, with literal sizes and dtypes."""

    op = targets[0].op
    reserved: dict[str, Entity | None] = {n: Ext(n, None) for n in ("os", "torch", "pytest")}
    reserved.update(dict.fromkeys(("HAS_GPU", "exported", "SEED", "CASES", "case_dtypes", "run_on", "inputs",
                                   "as_tuple", "float64", "size_id", "test_matches_reference",
                                   "test_refuses_a_wrong_dtype", "__all__")))
    roots: list[Def | Stmt] = []
    fields: list[dict[str, tuple[Def | Stmt, str] | None]] = []
    for i, t in enumerate(targets):
        tag = "" if i == 0 else f"_{i}"
        f: dict[str, tuple[Def | Stmt, str] | None] = {
            "reference": _callable_root(t.op, t.op.reference, "reference", f"REFERENCE{tag}"),
            "make_inputs": _callable_root(t.op, t.op.make_inputs, "make_inputs", f"MAKE_INPUTS{tag}"),
            "check": _callable_root(t.op, t.op.check, "check", f"CHECK{tag}") if t.op.check else None,
            "requires": None,
        }
        if t.impl.requires is not None:
            req = _def_of(t.impl.requires, f"{t.op.name} {t.version} requires")
            f["requires"] = (req, req.name) if req is not None else None
        f["supports"] = None
        if t.impl.dtypes is not None:
            # The dtypes a version takes can depend on where it runs (no bf16 under Triton's interpreter):
            # the registration's expression, evaluated by the test where it runs; else the value here.
            kw = _impl_keyword(t.impl, "dtypes")
            if kw is not None and not _is_literal(kw[1]):
                alias = f"SUPPORTED{'' if i == 0 else f'_{i}'}"
                f["supports"] = (_synthetic(kw[0], f"{alias} = {kw[1]}"), alias)
        fields.append(f)
        roots += [v[0] for v in f.values() if v is not None]
    cl = closure(list(dict.fromkeys(roots)), reserved=reserved,
                 priority=getattr(op.reference, "__module__", None))

    def out_name(entry) -> str:
        root, name = entry
        return cl.names[root] if isinstance(root, Def) else cl.names.get(Def(root.module, name), name)

    cases = []
    for t, fn, f in zip(targets, functions, fields):
        dtypes = list(t.op.dtypes) if f["supports"] else [d for d in t.op.dtypes if t.impl.supports(d)]
        sizes = sorted(t.op.test_sizes, key=_volume)[:3]
        # the refusal test's argument: the first tensor of the inputs (their dtypes from the inputs themselves)
        bad = _refusal(t, sizes[0], next(d for d in dtypes if t.impl.supports(d)))
        entries = [
            ("function", f"exported.{fn}"),
            ("reference", out_name(f["reference"])),
            ("make_inputs", out_name(f["make_inputs"])),
            ("check", out_name(f["check"]) if f["check"] else "None"),
            ("requires", out_name(f["requires"]) if f["requires"] else "None"),
            ("supports", out_name(f["supports"]) if f["supports"] else "None"),
            ("device", _literal(t.impl.device)),
            ("cuda_c", _literal(t.impl.lang == "CUDA")),
            ("inputs_on", _literal(t.impl.inputs_on)),
            ("sizes", _pretty(list(sizes), 8 + len("sizes="))),
            ("dtypes", _pretty(dtypes, 8 + len("dtypes="))),
            ("tolerances", _pretty({d: tuple(t.op.tolerance(d)) for d in dtypes}, 8 + len("tolerances="))),
            ("output_dtypes", _literal({d: t.op.output_dtype(d) for d in dtypes if t.op.output_dtype(d) != d})),
            ("bad", f"({bad[0]}, {_literal(bad[1])})"),
        ]
        body = "".join(f"        {k}={v},\n" for k, v in entries)
        cases.append(f"    {_literal(f'{t.op.name} {t.version}')}: dict(\n{body}    ),\n")
    tail = _TEST_TAIL.format(module=op.name, cases="{\n" + "".join(cases) + "}")
    names = ", ".join(f"{fn} ({t.op.name} {t.version})" for t, fn in zip(targets, functions))
    header = _docstring(
        _wrap(f"Tests of {op.name}.py, written with it by `python -m snippets export {op.name}`: {names} against "
              "the op's float64 reference, exported from the book with its input generator (sizes, dtypes and "
              "tolerances are the registry's, on its smallest test sizes), and an input of a wrong dtype that "
              "it must refuse.")
        + [""] + _wrap(f"Run: python -m pytest test_{op.name}.py ({_where(targets[0].impl)})."))
    # imports after the TRITON_INTERPRET line are deliberate (E402)
    return render(cl, header, extra_top=_TEST_TOP, tail=tail, import_suffix="  # noqa: E402")


# ---------------------------------------------------------------------------------------------- command line

def main(op_name: str, version: str | None, out: Path) -> int:
    try:
        ex = export(op_name, version, out)
    except ExportError as e:
        print(f"python -m snippets export: {e}", file=sys.stderr)
        return 2
    print(f"{ex.op} {ex.version}: {ex.why}")
    print(f"  {ex.module_path}  ({', '.join(ex.names)})")
    print(f"  {ex.test_path}")
    for f in ex.cuda_files:
        print(f"  {f}")
    return 0
