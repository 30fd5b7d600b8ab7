"""The import rule: a chapter stands on the foundation and on its own part, never on another chapter.

- A chapter module (``snippets/partN/*.py``) imports, of the book's own code, only the foundation
  (``snippets.registry``, ``snippets._checks``, ``snippets.cuda``), the shared support layer
  (``snippets.common.*``), modules of its own part, and ``snippets.bench.timing``: the book's timer,
  which a chapter may call for a ceiling it registers (``register_ceiling``) or for a timing it
  shows (Part 3's measuring chapter). Nothing else of ``snippets.bench`` (the harness, reports), and
  never the site, the exporter, the hashing or another part: what two chapters share moves to
  ``snippets.common``.
- One exception, ``CAPSTONE``: ``snippets.part8.capstone``, the book's last chapter, builds a model
  from the kernels of Part 5 and Part 8 and may import those two parts, and so may
  ``snippets.part8.capstone_train``, the same model trained (Part 5's backward passes and fused
  cross-entropy). They are the modules meant to stand on the whole book; no other part-wide grant
  exists.
- One narrower exception, ``BORROWS``: ``snippets.part3.wmma``'s ``tf32_gemm`` v4 calls two named public
  functions of later chapters (Part 2's Triton transpose, Part 4's persistent TMA matmul), to show what
  Part 3's TF32 kernel gains from them; and ``snippets.part8.capstone_block`` (the capstone's v6) takes
  Part 5's RMSNorm epsilon, the constant of the norm it folds into its GEMV. The grant names the modules
  and the names, nothing else.
- ``snippets.common`` imports only the foundation, other ``snippets.common`` modules and the timer
  (a shared ceiling measures with it), never a chapter.
- No module of ``snippets`` imports an underscore name from another module (``from snippets.x import
  _y``), or reaches one through a module it imported (``x._y``): a name that crosses a module
  boundary is public. A private module itself (``snippets._checks``) may be imported; it is
  the foundation. ``KNOWN_PRIVATE`` lists uses allowed for a while (none today); the last test fails
  once one of them is gone, so that the list only shrinks. ``PRIVATE_WITHIN``: the site builder's modules
  share formatting helpers inside ``snippets.site``, and with nothing outside it.
- Importing a module only defines things and registers its ops and ceilings: torch's and
  Inductor's configuration, torch's global flags, NumPy's error handling, the environment and
  ``sys.path`` are as they were.

Every ``import`` counts, at the top of a module or inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SNIPPETS = REPO_ROOT / "snippets"
FOUNDATION = ("snippets", "snippets.registry", "snippets._checks", "snippets.cuda")
CHAPTER_TOOLING = ("snippets.bench.timing",)  # the timer: ceilings and the measuring chapters
# the one module allowed to import other parts (see the module docstring): module -> parts
CAPSTONE = {"snippets.part8.capstone": ("snippets.part5", "snippets.part8"),
            "snippets.part8.capstone_train": ("snippets.part5", "snippets.part8")}
# a module allowed a few named public functions of another chapter: module -> {module: names}
BORROWS = {"snippets.part3.wmma": {"snippets.part2.transpose": {"transpose_triton"},
                                   "snippets.part4.matmul": {"autotuned", "TMA_SOURCES"}},
           "snippets.part8.capstone_block": {"snippets.part5.rmsnorm": {"EPS"}}}
# (module, private name of another module) still used; see the module docstring
KNOWN_PRIVATE: set[tuple[str, str]] = set()
# packages whose modules share underscore helpers among themselves (not with other packages)
PRIVATE_WITHIN = ("snippets.site",)
CHAPTERS = sorted(p for p in SNIPPETS.glob("part*/*.py"))
COMMON = sorted((SNIPPETS / "common").glob("*.py"))
ALL = sorted(SNIPPETS.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    base = REPO_ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name) of every import of a ``snippets`` module in ``path``: ``name`` is the
    name taken from the module (``from m import name``), None for ``import m``. ``from snippets.part4
    import layernorm`` is an import of the module ``snippets.part4.layernorm``."""
    out = []
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for a in node.names:
                if is_module(f"{base}.{a.name}"):
                    out.append((node.lineno, f"{base}.{a.name}", None))
                else:
                    out.append((node.lineno, base, a.name))
    return [(line, m, n) for line, m, n in out if m == "snippets" or m.startswith("snippets.")]


def allowed(importer: str, imported: str, name: str | None = None) -> bool:
    if imported in FOUNDATION or imported.startswith("snippets.common"):
        return True
    if name is not None and name in BORROWS.get(importer, {}).get(imported, ()):
        return True
    if any(imported == p or imported.startswith(f"{p}.") for p in CAPSTONE.get(importer, ())):
        return True
    part = importer.split(".")[1]
    if part.startswith("part"):
        return imported.startswith(f"snippets.{part}.") or imported == f"snippets.{part}" \
            or imported in CHAPTER_TOOLING
    return imported in CHAPTER_TOOLING  # snippets.common: the foundation, itself and the timer


@pytest.mark.parametrize("path", CHAPTERS + COMMON, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_a_chapter_imports_the_foundation_common_and_its_own_part(path):
    me = module_name(path)
    bad = [f"line {line}: {m}" + (f".{n}" if n else "") for line, m, n in imports(path)
           if m != me and not allowed(me, m, n)]
    assert not bad, f"{me} imports outside the rule (move what is shared to snippets.common): {bad}"


def private_uses(path: Path) -> list[str]:
    """Underscore names that ``path`` takes from another ``snippets`` module."""
    me = module_name(path)
    tree = ast.parse(path.read_text())
    found = [(line, f"{m}.{n}") for line, m, n in imports(path)
             if n and n.startswith("_") and not n.startswith("__") and m != me]
    # names bound to snippets modules: `import snippets.x as x`, `from snippets.part4 import x`
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("snippets"):
                    bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else "snippets"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("snippets"):
            for a in node.names:
                if is_module(f"{node.module}.{a.name}"):
                    bound[a.asname or a.name] = f"{node.module}.{a.name}"

    def dotted(node) -> str | None:
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        if isinstance(node, ast.Attribute):
            base = dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                and not node.attr.startswith("__"):
            owner = dotted(node.value)
            if owner and is_module(owner) and owner != me and not is_module(f"{owner}.{node.attr}"):
                found.append((node.lineno, f"{owner}.{node.attr}"))
    return found


@pytest.mark.parametrize("path", ALL, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_no_module_uses_another_modules_private_names(path):
    me = module_name(path)
    bad = [f"line {line}: {name}" for line, name in private_uses(path)
           if (me, name) not in KNOWN_PRIVATE
           and not any(me.startswith(p) and name.startswith(f"{p}.") for p in PRIVATE_WITHIN)]
    assert not bad, f"{me} uses private names of other modules (make them public): {bad}"


def test_known_private_uses_are_still_there():
    used = {(module_name(p), name) for p in ALL for _, name in private_uses(p)}
    gone = KNOWN_PRIVATE - used
    assert not gone, f"no longer used: remove them from KNOWN_PRIVATE: {sorted(gone)}"


def test_the_rule_can_fail(tmp_path, monkeypatch):
    """The checks see a cross-part import, an imported underscore name and one reached through an
    attribute, at the top of a module or inside a function."""
    pkg = tmp_path / "snippets" / "part9"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "snippets", pkg):
        (d / "__init__.py").write_text("")
    (tmp_path / "snippets" / "part8").mkdir()
    (tmp_path / "snippets" / "part8" / "__init__.py").write_text("")
    (tmp_path / "snippets" / "part8" / "other.py").write_text("def _f(): pass\n")
    (pkg / "m.py").write_text("from snippets.part8.other import _f\n"
                              "def g():\n    from snippets.part8 import other\n    return other._f\n")
    monkeypatch.setitem(globals(), "REPO_ROOT", tmp_path)
    path = pkg / "m.py"
    me = module_name(path)
    assert [m for _, m, _ in imports(path) if not allowed(me, m)] == ["snippets.part8.other",
                                                                      "snippets.part8.other"]
    assert len(private_uses(path)) == 2


def test_the_capstone_exception_is_narrow():
    """CAPSTONE lets the capstone, and only it, import Parts 5 and 8; no other part, no other
    module."""
    assert allowed("snippets.part8.capstone", "snippets.part5.rmsnorm")
    assert allowed("snippets.part8.capstone", "snippets.part8.decode_attention")
    assert not allowed("snippets.part8.capstone", "snippets.part7.launch")
    assert not allowed("snippets.part8.decode_model", "snippets.part5.rmsnorm")
    assert not allowed("snippets.part7.capstone", "snippets.part5.rmsnorm")


def test_the_borrowed_names_are_narrow():
    """BORROWS lets Part 3's tensor-core module take the named functions, not the modules or other names."""
    assert allowed("snippets.part3.wmma", "snippets.part2.transpose", "transpose_triton")
    assert not allowed("snippets.part3.wmma", "snippets.part2.transpose")
    assert not allowed("snippets.part3.wmma", "snippets.part2.transpose", "transpose_smem")
    assert not allowed("snippets.part3.sgemm", "snippets.part4.matmul", "autotuned")
    assert allowed("snippets.part8.capstone_block", "snippets.part5.rmsnorm", "EPS")
    assert not allowed("snippets.part8.capstone_block", "snippets.part5.rmsnorm", "rmsnorm_triton")
    assert not allowed("snippets.part8.capstone_block", "snippets.part5.swiglu", "EPS")


STATE_SCRIPT = r"""
import importlib, json, os, pkgutil, sys
import numpy as np
import torch
import torch._dynamo
import torch._inductor.config


def state():
    return {
        "environment": dict(os.environ),
        "torch._dynamo.config": {k: repr(v) for k, v in torch._dynamo.config.get_config_copy().items()},
        "torch._inductor.config": {k: repr(v)
                                   for k, v in torch._inductor.config.get_config_copy().items()},
        "torch": repr((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                       torch.get_float32_matmul_precision(), torch.get_default_dtype(),
                       torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
                       torch.is_grad_enabled(), int(torch.random.get_rng_state().sum()))),
        "numpy": repr(np.geterr()),
        "sys.path": list(sys.path),
    }


before = state()
import snippets
for sub in ("common", "part1", "part2", "part3", "part4", "part5", "part6", "part7", "part8"):
    pkg = importlib.import_module(f"snippets.{sub}")
    for m in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"snippets.{sub}.{m.name}")
after = state()
changed = {}
for key in before:
    if before[key] != after[key]:
        if isinstance(before[key], dict):
            changed[key] = sorted(k for k in set(before[key]) | set(after[key])
                                  if before[key].get(k) != after[key].get(k))
        else:
            changed[key] = [before[key], after[key]]
print(json.dumps(changed))
"""


def test_importing_changes_no_global_state():
    """Importing every module of snippets.common and of the parts (in a fresh process) leaves torch's
    and Inductor's configuration, torch's global flags and random state, NumPy's error handling,
    the environment and sys.path as they were: a module only defines things and registers its ops
    (torch.compile's recompile limit is raised on the first call of a compiled function)."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", STATE_SCRIPT], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    changed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not changed, f"importing the chapters changed global state: {changed}"
