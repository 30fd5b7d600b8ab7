"""The C++ appendix (docs/appendix/cpp-for-cuda.md) stays true to the book's code and compiles.

- Every fenced block whose first line is ``// compile-check`` (optionally followed by compiler
  options, ``// compile-check -DTILE=64``) is a complete CUDA translation unit: it compiles with
  ``nvcc -std=c++17 -c`` for sm_80, without a GPU (skipped where nvcc is missing).
- Every block whose first line is ``// excerpt: PATH`` (or ``# excerpt: PATH``) is copied from that
  file: split at its ``// ...`` lines, each piece appears in the file as consecutive lines (compared
  without surrounding white space), the pieces in order.
- The mangled names the page quotes are the ones nvcc produces.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
PAGE = REPO_ROOT / "docs" / "appendix" / "cpp-for-cuda.md"
NVCC = shutil.which("nvcc")
requires_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def fences() -> list[tuple[str, str]]:
    return [(m["info"].strip(), m["body"]) for m in FENCE.finditer(PAGE.read_text())]


def compile_checks() -> list[tuple[str, list[str]]]:
    out = []
    for _, body in fences():
        first = body.split("\n", 1)[0]
        if first.startswith("// compile-check"):
            out.append((body, first[len("// compile-check"):].split()))
    return out


def excerpts() -> list[tuple[str, list[str]]]:
    out = []
    for _, body in fences():
        lines = body.rstrip("\n").split("\n")
        m = re.fullmatch(r"(?://|#) excerpt: (\S+)", lines[0])
        if m:
            out.append((m.group(1), lines[1:]))
    return out


CHECKS = compile_checks()
EXCERPTS = excerpts()


def test_the_page_has_programs_and_excerpts():
    assert len(CHECKS) >= 10 and len(EXCERPTS) >= 12
    headings = re.findall(r"^## (.+)$", PAGE.read_text(), re.MULTILINE)
    for topic in ("Templates", "constexpr and static_assert", "if constexpr", "Lambdas",
                  "reinterpret_cast", "__restrict__", "__launch_bounds__", "#pragma unroll",
                  'extern "C"', "-D and #ifndef"):
        assert any(topic in h for h in headings), topic


@requires_nvcc
@pytest.mark.parametrize("program,options", CHECKS,
                         ids=[f"program{i}" for i in range(len(CHECKS))])
def test_each_program_compiles(program, options, tmp_path):
    src = tmp_path / "check.cu"
    src.write_text(program)
    cmd = [NVCC, "-std=c++17", "-c", "-arch=sm_80", *options, str(src), "-o",
           str(tmp_path / "check.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr[-3000:]}"


def pieces(lines: list[str]) -> list[list[str]]:
    out: list[list[str]] = [[]]
    for line in lines:
        if line.strip() in ("// ...", "# ..."):
            out.append([])
        else:
            out[-1].append(line.strip())
    return [p for p in out if p]


@pytest.mark.parametrize("path,lines", EXCERPTS, ids=[p for p, _ in EXCERPTS])
def test_each_excerpt_is_in_its_file(path, lines):
    source = [line.strip() for line in (REPO_ROOT / path).read_text().split("\n")]
    at = 0
    for piece in pieces(lines):
        found = next((i for i in range(at, len(source) - len(piece) + 1)
                      if source[i:i + len(piece)] == piece), None)
        assert found is not None, f"not in {path} (after line {at}):\n" + "\n".join(piece)
        at = found + len(piece)


def ptx_entries(source: str, tmp_path: Path) -> set[str]:
    src = tmp_path / "names.cu"
    src.write_text(source)
    out = tmp_path / "names.ptx"
    proc = subprocess.run([NVCC, "-std=c++17", "-ptx", "-arch=sm_80", str(src), "-o", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return set(re.findall(r"\.entry\s+(\w+)\(", out.read_text()))


@requires_nvcc
def test_the_mangled_names_quoted_are_nvccs(tmp_path):
    page = PAGE.read_text()
    naive = (REPO_ROOT / "csrc" / "part1" / "elementwise.cu").read_text()
    kernel = re.search(r"\[start:naive\]\n(.*?)// --8<-- \[end:naive\]", naive, re.DOTALL).group(1)
    assert 'extern "C"' in kernel
    entries = ptx_entries(kernel.replace('extern "C" ', ""), tmp_path)
    assert entries == {"_Z13vector_add_v1PKfS0_Pfx"} and "_Z13vector_add_v1PKfS0_Pfx" in page
    program = next(p for p, _ in CHECKS if "scale_c" in p)
    assert ptx_entries(program, tmp_path) == {"_Z6scale1PKfPffi", "scale_c", "scale_items4"}
    assert "_Z6scale1PKfPffi" in program
