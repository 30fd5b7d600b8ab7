"""Lines of code of a version: what the "Triton or CUDA?" chapter compares next to the
measured rates.

A line counts when it holds code: blank lines, comments and docstrings do not. For an implementation
(``registry.Impl``) the count is split in two:

- ``kernel``: its Triton kernels (``@triton.jit`` functions among ``Impl.sources``), or for CUDA the
  ``__global__`` kernels it launches in its ``.cu`` source plus every function, type, constant and
  macro of that file they use, followed transitively (``#include`` lines and code of other files are
  not counted);
- ``host``: the Python functions it runs on the host (``Impl.fn`` and the other functions of
  ``Impl.sources``: checks, launchers). A whole Python file listed in ``Impl.sources`` (for the
  source hash) is not counted.

Which kernels of a ``.cu`` file a CUDA version launches is not visible to a static reading of the
launcher (the kernel name is often built at run time), so it is guessed from the version's name:
kernels whose name holds it as a word (``reduce_v7``, ``wmma_v3_f16`` for ``v7`` and ``v3``), or
given explicitly. With neither, the whole file is counted and the result says so.
"""

from __future__ import annotations

import ast
import inspect
import io
import re
import textwrap
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from snippets.registry import REPO_ROOT, Impl

C_SUFFIXES = (".cu", ".cuh", ".c", ".cc", ".cpp", ".h", ".hpp")
_SKIP_TOKENS = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                tokenize.ENCODING, tokenize.ENDMARKER}


# --8<-- [start:count]
def python_code_lines(source: str) -> int:
    """Lines of ``source`` that hold Python code: not blank, not only a comment, not part of
    a docstring."""
    source = textwrap.dedent(source)
    docstring_lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                docstring_lines.update(range(first.lineno, first.end_lineno + 1))
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _SKIP_TOKENS:
            code.update(range(tok.start[0], tok.end[0] + 1))
    return len(code - docstring_lines)


def strip_c_comments(text: str) -> str:
    """C/C++/CUDA source with ``//`` and ``/* */`` comments blanked out (newlines kept, so line
    numbers stay); string and character literals are left alone."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def c_code_lines(text: str) -> int:
    """Lines of C/C++/CUDA ``text`` that hold code: not blank and not only a comment."""
    return sum(1 for line in strip_c_comments(text).splitlines() if line.strip())
# --8<-- [end:count]


# --------------------------------------------------------------------------------------------------
# The parts of a .cu file a kernel uses
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CDefinition:
    """A top-level definition of a C/CUDA file: a function, a type, a constant or a macro."""

    name: str
    lines: frozenset[int]  # 0-based line numbers it spans
    text: str
    is_kernel: bool


_IDENT = re.compile(r"[A-Za-z_]\w*")
_NOT_NAMES = {"if", "for", "while", "switch", "return", "sizeof", "__launch_bounds__", "__align__",
              "alignas", "decltype", "static_assert", "const", "noexcept", "template", "typename",
              "struct", "class"}


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos)


def _drop_template_prefix(header: str) -> str:
    """``header`` without a leading ``template <...>`` (angle brackets balanced)."""
    h = header.lstrip()
    while h.startswith("template"):
        i, depth = h.find("<"), 0
        if i < 0:
            return h
        for j in range(i, len(h)):
            depth += {"<": 1, ">": -1}.get(h[j], 0)
            if depth == 0:
                h = h[j + 1:].lstrip()
                break
        else:
            return h
    return h


def _definition_name(header: str) -> str | None:
    """The name a top-level header defines: ``f`` of ``... f(args) {``, ``S`` of
    ``struct S<...> {``, ``X`` of ``constexpr int X = 3;``, ``using X = ...;`` or
    ``__device__ float X[4];``; None for anything else (``static_assert(...);``)."""
    h = _drop_template_prefix(header).rstrip().removesuffix(";").rstrip()
    # struct alignas(16) S {
    h = re.sub(r"\b(?:alignas|__align__)\s*\((?:[^()]|\([^()]*\))*\)", " ", h)
    m = re.match(r"(?:struct|class|union)\s+([A-Za-z_]\w*)", h)
    if m:
        return m.group(1)
    eq = h.find("=")
    # a constant, a variable or an alias: the name before the first =
    if eq >= 0 and "(" not in h[:eq]:
        names = _IDENT.findall(h[:eq])
        return names[-1] if names else None
    while h.endswith(("const", "noexcept")):
        h = h.rsplit(None, 1)[0].rstrip() if " " in h else ""
    if h.endswith(")"):  # a function: the name before its parameter list
        depth, i = 0, len(h) - 1
        while i >= 0:
            depth += {")": 1, "(": -1}.get(h[i], 0)
            if depth == 0:
                break
            i -= 1
        before = h[:i]
        # from_float<float>(...): the name, not its template argument
        while re.search(r"<[^<>]*>", before):
            before = re.sub(r"<[^<>]*>", " ", before)
        names = _IDENT.findall(before)
        return names[-1] if names and names[-1] not in _NOT_NAMES else None
    m = re.search(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*$", h)
    return m.group(1) if m and m.group(1) not in _NOT_NAMES else None


def c_definitions(text: str) -> list[CDefinition]:
    """The top-level definitions of a C/CUDA source (comments ignored): functions and types (up to
    their closing brace), declarations ending in ``;``, ``#define`` macros (with their continuation
    lines), and invocations of those macros at file scope (which define whatever the macro expands
    to, named by their first argument)."""
    code = strip_c_comments(text)
    defs: list[CDefinition] = []
    macros: set[str] = set()
    lines = code.split("\n")
    # Preprocessor lines first: #define (with continuations) defines a macro; other directives
    # are skipped.
    pre: set[int] = set()
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith("#"):
            start = i
            while lines[i].rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
            span = range(start, i + 1)
            pre.update(span)
            m = re.match(r"\s*#\s*define\s+([A-Za-z_]\w*)", lines[start])
            if m:
                macros.add(m.group(1))
                defs.append(CDefinition(m.group(1), frozenset(span),
                                        "\n".join(lines[s] for s in span),
                                        "__global__" in "\n".join(lines[s] for s in span)))
        i += 1
    body = "\n".join("" if k in pre else line for k, line in enumerate(lines))
    depth, start, pos = 0, None, 0
    while pos < len(body):
        c = body[pos]
        if depth == 0 and start is None and not c.isspace():
            start = pos
        if c == "{":
            if depth == 0:
                open_pos = pos
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                end = pos + 1
                rest = re.match(r"\s*;", body[end:])  # struct S { ... };
                end += rest.end() if rest else 0
                header = body[start:open_pos]
                name = _definition_name(header)
                if name:
                    span = frozenset(range(_line_of(body, start), _line_of(body, end - 1) + 1))
                    defs.append(CDefinition(name, span, body[start:end], "__global__" in header))
                start, pos = None, end
                continue
        elif c == ";" and depth == 0 and start is not None:
            header = body[start:pos]
            name = _definition_name(header)
            if name:
                defs.append(CDefinition(name, frozenset(range(_line_of(body, start),
                                                              _line_of(body, pos) + 1)),
                                        body[start:pos + 1], False))
            start = None
        elif c == "\n" and depth == 0 and start is not None:
            # A macro invocation at file scope ends at its line: NAME(args) with NAME a #define of
            # this file.
            stmt = body[start:pos].strip()
            m = re.fullmatch(r"([A-Za-z_]\w*)\s*\((.*)\)", stmt, re.S)
            if m and m.group(1) in macros:
                args = _IDENT.findall(m.group(2))
                macro = next(d for d in defs if d.name == m.group(1))
                defs.append(CDefinition(args[0] if args else m.group(1),
                                        frozenset(range(_line_of(body, start),
                                                        _line_of(body, pos) + 1)),
                                        stmt, macro.is_kernel))
                start = None
        pos += 1
    return defs


def kernel_closure(text: str, kernels: Iterable[str]) -> list[CDefinition]:
    """The definitions of ``kernels`` and of everything in the same source they use, transitively
    (by name: an identifier in a definition's text that another definition defines)."""
    defs = c_definitions(text)
    by_name: dict[str, list[CDefinition]] = {}
    for d in defs:
        by_name.setdefault(d.name, []).append(d)
    missing = [k for k in kernels if k not in by_name]
    if missing:
        raise ValueError(f"no definition of {missing} in the source; kernels there: "
                         f"{sorted(d.name for d in defs if d.is_kernel)}")
    todo, seen = list(kernels), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for d in by_name.get(name, []):
            todo.extend(n for n in set(_IDENT.findall(d.text)) if n in by_name and n not in seen)
    return [d for d in defs if d.name in seen]


def kernels_of_version(text: str, version: str) -> list[str]:
    """The ``__global__`` kernels of a source whose name holds ``version`` as a word: ``reduce_v7``,
    ``wmma_v3_f16`` and ``wmma_v3_bf16`` for ``v3``/``v7``, but not ``wmma_v31``."""
    word = re.compile(rf"(?:^|_){re.escape(version)}(?:_|$)")
    return sorted({d.name for d in c_definitions(text) if d.is_kernel and word.search(d.name)})


def cuda_kernel_lines(text: str, kernels: Iterable[str]) -> int:
    """Code lines of ``kernels`` and everything of the same source they use (each line
    counted once)."""
    code_lines = strip_c_comments(text).split("\n")
    spans: set[int] = set()
    for d in kernel_closure(text, list(kernels)):
        spans |= d.lines
    return sum(1 for k in spans if code_lines[k].strip())


# --------------------------------------------------------------------------------------------------
# An implementation's count
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LineCount:
    kernel: int
    host: int
    what: str  # how the kernel lines were counted, for a table's footnote or a tooltip


def _is_triton_kernel(obj: Any) -> bool:
    # A JITFunction (GPU), an InterpretedFunction (TRITON_INTERPRET=1) or an Autotuner/Heuristics
    # around one: each wraps the Python function in .fn.
    return not inspect.isfunction(obj) and hasattr(obj, "fn")


def _python_source(obj: Any) -> str | None:
    inner = obj
    while not inspect.isfunction(inner) and hasattr(inner, "fn"):
        inner = inner.fn
    try:
        return inspect.getsource(inner)
    # a builtin such as torch.add: a library, no code of the book's own
    except (TypeError, OSError):
        return None


def launched_kernels(text: str, version: str, host_sources: Iterable[str]) -> list[str]:
    """The ``__global__`` kernels of a ``.cu`` source a CUDA version launches, as far as a static
    reading can tell: kernel names quoted in its host functions (``"vector_add_v5"``), keeping those
    that hold the version as a word if any do (a fallback launch for unaligned views is not the
    version); else the kernels whose name holds the version (``kernels_of_version``); else the
    macros of the file that define ``__global__`` kernels (a file that stamps out one kernel per
    dtype with a macro). Empty when none of these finds any."""
    kernels = {d.name for d in c_definitions(text)
               if d.is_kernel and not d.text.lstrip().startswith("#")}
    quoted = sorted({s for src in host_sources
                     for s in re.findall(r"[\"']([A-Za-z_]\w*)[\"']", src)} & kernels)
    word = re.compile(rf"(?:^|_){re.escape(version)}(?:_|$)")
    found = [k for k in quoted if word.search(k)] or quoted or kernels_of_version(text, version)
    # kernels stamped out by a macro (one per dtype): count the macro and what it uses
    if not found:
        found = sorted({d.name for d in c_definitions(text)
                        if d.is_kernel and "#" in d.text.lstrip()[:1]})
    return found


def impl_lines(impl: Impl, kernels: Iterable[str] | None = None) -> LineCount:
    """The code lines of a version: its kernels and its host functions (see the module docstring).
    ``kernels`` names the ``__global__`` kernels of a CUDA version when ``launched_kernels`` cannot
    tell them."""
    kernel = host = 0
    what, files, host_sources = [], [], []
    seen: set[int] = set()
    for obj in (impl.fn, *impl.sources):
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (str, Path)):
            # a .py file listed for the source hash is not counted
            if Path(obj).suffix in C_SUFFIXES:
                files.append(Path(obj) if Path(obj).is_absolute() else REPO_ROOT / obj)
            continue
        src = _python_source(obj)
        if src is None:
            continue
        if _is_triton_kernel(obj):
            kernel += python_code_lines(src)
            what.append(f"{_unwrap(obj).__name__} (Triton)")
        else:
            host += python_code_lines(src)
            host_sources.append(src)
    for path in files:
        text = path.read_text()
        if kernels:  # named kernels: counted in the file that defines them; a file that defines
            # none of them (a header the kernels' file includes) adds what they use from it
            defined = {d.name for d in c_definitions(text)}
            names = [k for k in kernels if k in defined]
            if not names:
                continue
        else:
            names = launched_kernels(text, impl.name, host_sources)
        rel = (path.resolve().relative_to(REPO_ROOT)
               if path.resolve().is_relative_to(REPO_ROOT) else path)
        if names:
            kernel += cuda_kernel_lines(text, names)
            what.append(f"{', '.join(names)} in {rel} with what they use there")
        else:
            kernel += c_code_lines(text)
            what.append(f"all of {rel}")
    return LineCount(kernel, host, "; ".join(what))


def _unwrap(obj: Any) -> Any:
    while not inspect.isfunction(obj) and hasattr(obj, "fn"):
        obj = obj.fn
    return obj


__all__ = ["LineCount", "c_code_lines", "c_definitions", "cuda_kernel_lines", "impl_lines",
           "kernel_closure", "kernels_of_version", "launched_kernels", "python_code_lines",
           "strip_c_comments"]
