"""``python -m snippets export``: every op's best book version, exported outside the repository, runs its own
tests there with the repository not importable.

Every op with a version of the book's own is exported once into one folder outside the repository (as a reader
would, ``-o mykernels``); each file is checked with ``ast`` (no import of ``snippets``, no registration), and the
exported tests of all of them run in one subprocess with ``python -S`` (no ``.pth`` file, so not the editable
install's finder either), the site-packages on the path, ``PYTHONPATH`` unset, the folder as its working
directory and ``TRITON_INTERPRET=1``; that process first checks that ``import snippets`` fails. The closure's
clash and shadowing rules are checked on a small stand-in package.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import site
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from snippets import export as E
from snippets.bench.report import load_results
from snippets.op_index import load_all
from snippets.registry import REPO_ROOT

OPS = load_all()
NAMED = ["rmsnorm", "softmax", "layernorm", "cross_entropy", "matmul", "swiglu", "rope", "flash_attention_fwd"]
NO_BOOK_VERSION = {name for name, op in OPS.items() if not any(i.origin == "book" for i in op.impls.values())}
EXPORTABLE = sorted(set(OPS) - NO_BOOK_VERSION)

# Runs pytest in the export folder with the repository out of reach: no site processing (the editable install
# adds the repository through a .pth file), the site-packages directories added by hand, and `import snippets`
# checked to fail before anything else runs.
RUNNER = textwrap.dedent("""
    import sys
    sys.path[:] = [p for p in sys.path if p not in ("", ".")] + {site}
    sys.path.insert(0, ".")
    try:
        import snippets
    except ImportError:
        pass
    else:
        raise SystemExit("the repository is importable: " + snippets.__file__)
    import pytest
    sys.exit(pytest.main(sys.argv[1:]))
""")


def _site_dirs() -> list[str]:
    dirs = list(site.getsitepackages())
    user = site.getusersitepackages()
    if isinstance(user, str) and Path(user).is_dir():
        dirs.append(user)
    return dirs


def run_isolated(folder: Path, *pytest_args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "TRITON_INTERPRET")}
    if not torch.cuda.is_available():  # as a reader's machine would: the GPU where there is one
        env["TRITON_INTERPRET"] = "1"
    code = RUNNER.format(site=repr(_site_dirs()))
    return subprocess.run([sys.executable, "-S", "-c", code, "-p", "no:cacheprovider", *pytest_args],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)


def imports_of(path: Path) -> set[str]:
    """Every module an exported file imports, at any depth (function-local imports too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add("." * node.level + (node.module or ""))
    return out


EXPORT_ALL = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from snippets.export import export
    out = Path(sys.argv[1])
    done = {name: export(name, None, out) for name in sys.argv[2:]}
    print(json.dumps({name: dict(op=ex.op, version=ex.version, why=ex.why, module_path=str(ex.module_path),
                                 test_path=str(ex.test_path), cuda_files=[str(p) for p in ex.cuda_files],
                                 names=ex.names) for name, ex in done.items()}))
""")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Every exportable op, exported into one folder outside the repository: {op: Export}. The export runs in
    a process that sees no GPU, with the interpreter on, as a CPU machine's would: the refusal test's argument
    is found there by trying wrong dtypes, which must never reach a GPU this session uses."""
    out = tmp_path_factory.mktemp("mykernels")
    assert not out.resolve().is_relative_to(REPO_ROOT.resolve())
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", EXPORT_ALL, str(out), *EXPORTABLE], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    raw = json.loads(proc.stdout.strip().splitlines()[-1])
    done = {name: E.Export(**{**r, "module_path": Path(r["module_path"]), "test_path": Path(r["test_path"]),
                              "cuda_files": [Path(p) for p in r["cuda_files"]]}) for name, r in raw.items()}
    return out, done


@pytest.fixture(scope="module")
def run(exported):
    """The exported tests of every op, isolated from the repository: (process with every file's output and the
    worst exit code, {file: outcomes}). On a GPU each file runs in its own process, several at once (each
    compiles and autotunes its kernels: one process for all of them took minutes); on a CPU all of them run in
    one process, which pays for Python, torch and Triton's start once instead of once per op."""
    import concurrent.futures as cf

    out, _ = exported
    files = sorted(p.name for p in out.glob("test_*.py"))

    def one(*names: str) -> subprocess.CompletedProcess:
        tag = names[0] if len(names) == 1 else "all"
        return run_isolated(out, "-q", f"--junitxml=report.{tag}.xml", "-W", "ignore", *names)

    if not torch.cuda.is_available():
        procs = [one(*files)]
    else:
        with cf.ThreadPoolExecutor(max(1, min(8, (os.cpu_count() or 2)))) as pool:
            procs = list(pool.map(one, files))
    proc = subprocess.CompletedProcess(
        "exported tests", max(p.returncode for p in procs),
        "".join(p.stdout for p in procs), "".join(p.stderr for p in procs))
    outcomes: dict[str, list[str]] = {}
    for report in sorted(out.glob("report.*.xml")):
        for case in ET.parse(report).getroot().iter("testcase"):
            kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
            file = case.get("classname", "").split(".")[0]
            outcomes.setdefault(file, []).append(kinds[0] if kinds else "passed")
    return proc, outcomes


def test_the_named_ops_are_exportable_and_the_others_say_why_not():
    assert set(NAMED) <= set(EXPORTABLE)
    for name in NO_BOOK_VERSION:
        with pytest.raises(E.ExportError, match="no version of the book's own"):
            E.plan(name)


@pytest.mark.parametrize("name", EXPORTABLE)
def test_export_imports_nothing_of_the_repository(exported, name):
    out, done = exported
    ex = done[name]
    for path in (ex.module_path, ex.test_path):
        assert path.parent == out
        mods = imports_of(path) - {"."}  # the test's `from . import <op>`, for a folder that is a package
        assert not {m for m in mods if m == "snippets" or m.startswith(("snippets.", "."))}, (path, mods)
        calls = {n.func.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Name)}
        assert not calls & {"register", "Op", "Impl", "register_ceiling"}, f"{path.name}: a registration"
    tree = ast.parse(ex.module_path.read_text())
    public = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "__all__")
    assert ast.literal_eval(public.value) == ex.names
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert set(ex.names) <= defined


@pytest.mark.parametrize("name", EXPORTABLE)
def test_export_header_comes_from_the_results(exported, name):
    """The docstring names the op, the version and the chapter, and quotes the result from the results file."""
    _, done = exported
    ex = done[name]
    op = OPS[name]
    doc = " ".join(ast.get_docstring(ast.parse(ex.module_path.read_text())).split())
    assert f"{name} {ex.version}" in doc and f"docs/{op.chapter}" in doc
    results = load_results()
    measured = [(gpu, r) for gpu in results if (r := E.headline_record(op, ex.version, results, gpu))]
    if not measured:
        assert "no result for this version" in doc
    for gpu, r in measured:
        assert f"{r['value']:.4g} {r['unit']}" in doc and gpu in doc
        assert results[gpu]["ops"][name]["provenance"]["commit"][:7] in doc
        if r.get("fraction_of_ceiling") is not None:
            assert f"{100 * r['fraction_of_ceiling']:.1f}%" in doc


def test_best_version_is_the_books_fastest_on_the_h200():
    results = load_results()
    for name in EXPORTABLE:
        op = OPS[name]
        version, why, gpu = E.best_version(op, results)
        assert op.impls[version].origin == "book"
        if gpu is None:
            continue
        entry = results[gpu]["ops"][name]
        rows = [r for r in entry["records"] if r["headline"] and r["dtype"] == E.headline_record(
            op, version, results, gpu)["dtype"] and op.impls.get(r["impl"]) and
            op.impls[r["impl"]].origin == "book"]
        pick = min if op.lower_is_better else max
        assert pick(rows, key=lambda r: r["value"])["impl"] == version
        assert gpu == "NVIDIA H200" or "NVIDIA H200" not in results or name not in results["NVIDIA H200"]["ops"]


def test_training_path_comes_along(exported):
    """An op that trains exports its autograd.Function and the twin's forward + backward function."""
    _, done = exported
    assert {"rmsnorm_fwd_bwd_triton", "RMSNormFunction"} <= set(done["rmsnorm"].names)
    assert "LayerNormFunction" in done["layernorm"].names
    assert "FlashAttention" in done["flash_attention_fwd"].names
    text = done["rmsnorm"].module_path.read_text()
    assert "def _rmsnorm_bwd_kernel(" in text and "def _column_sum_kernel(" in text


def test_cuda_sources_are_copied_beside_the_module(exported):
    out, done = exported
    ex = done["matrix_add"]
    assert OPS["matrix_add"].impls[ex.version].lang == "CUDA"
    assert (out / "csrc" / "part2" / "matrix_add.cu").read_text() == \
        (REPO_ROOT / "csrc" / "part2" / "matrix_add.cu").read_text()
    text = ex.module_path.read_text()
    assert "REPO_ROOT = Path(__file__).resolve().parent" in text and 'CSRC = REPO_ROOT / "csrc"' in text
    assert "cupy" in (out / "test_matrix_add.py").read_text()  # the test skips without CuPy, saying so


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (install the CUDA toolkit)")
def test_copied_cuda_sources_compile_where_the_export_loads_them(exported):
    """Each copied .cu file compiles from the export's csrc/ with the include paths its loader passes (its own
    folder and csrc/common), and the exported module finds csrc/ beside itself."""
    out, done = exported
    cuda_ops = [name for name, ex in done.items() if ex.cuda_files]
    assert "matrix_add" in cuda_ops and "sgemm" in cuda_ops
    for name in cuda_ops:
        for cu in (f for f in done[name].cuda_files if f.suffix == ".cu"):
            includes = [f"-I{cu.parent}", f"-I{out / 'csrc' / 'common'}"]
            r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", *includes, "--ptx", "-o", os.devnull, str(cu)],
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, f"{name}: {cu.relative_to(out)}\n{r.stderr[-2000:]}"
    probe = ("import sys, matrix_add as m; from pathlib import Path; "
             "sys.exit(0 if Path(m.REPO_ROOT) == Path.cwd() and (m.CSRC / m.CU_FILE).is_file() else 1)")
    r = subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path += {_site_dirs()!r}; {probe}"],
                       cwd=out, capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert r.returncode == 0, r.stderr[-2000:]


def test_exported_tests_pass_with_the_repository_out_of_reach(run):
    proc, outcomes = run
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "the repository is importable" not in proc.stdout + proc.stderr
    for name in EXPORTABLE:
        assert outcomes.get(f"test_{name}"), f"no test of {name} ran"
    import torch

    for name in NAMED:
        got = outcomes[f"test_{name}"]
        assert "failure" not in got and "error" not in got, (name, got)
        op = OPS[name]
        lang = op.impls[E.best_version(op)[0]].lang
        # the exported version is the fastest measured one: a Triton version runs here (on the GPU, or
        # the CPU under the interpreter); a CUDA one (softmax's v5 since the H200's re-measurement)
        # needs a GPU, and without one its tests skip, saying so
        if lang == "Triton" or torch.cuda.is_available():
            assert got.count("passed") >= 2, (name, lang, got)


def test_cli_writes_the_files_and_refuses_unknown_ops(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ok = subprocess.run([sys.executable, "-m", "snippets", "export", "rmsnorm", "-o", str(tmp_path)],
                        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "rmsnorm.py").is_file() and (tmp_path / "test_rmsnorm.py").is_file()
    assert "rmsnorm v" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "snippets", "export", "no_such_op", "-o", str(tmp_path)],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "unknown op 'no_such_op'" in bad.stderr
    lib = subprocess.run([sys.executable, "-m", "snippets", "export", "vector_add", "v0", "-o", str(tmp_path)],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert lib.returncode == 2 and "library callable" in lib.stderr


def test_refusal_is_found_in_a_process_without_a_gpu_where_one_is_present(monkeypatch):
    """On a GPU machine the wrong dtypes are tried in a process that sees no GPU, with the same answer."""
    import torch

    op = OPS["linear_cross_entropy"]
    version = E.best_version(op)[0]
    target = E.Target(op, version, op.impls[version], E.Def("", ""))
    size, dtype = sorted(op.test_sizes, key=E._volume)[0], torch.float32
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    here = E._refusal(target, size, dtype)
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert E._refusal(target, size, dtype) == here
    assert here[0] != 0 or here[1] != torch.int16  # h in int16 fails in torch (requires_grad), not a refusal


def test_export_box_renders():
    from snippets.site.page import render_page

    page = render_page("Text.\n\n<!-- bench:export rmsnorm rmsnorm_fwd_bwd -->\n\nMore.\n", "p.md")
    assert '!!! tip "Use it in your project"' in page
    assert "python -m snippets export rmsnorm -o mykernels" in page
    assert "export rmsnorm_fwd_bwd" not in page  # its function and class are in rmsnorm.py already
    assert "`mykernels/test_rmsnorm.py`" in page and "`RMSNormFunction`" in page
    with pytest.raises(ValueError, match="unknown ops"):
        render_page("<!-- bench:export no_such_op -->\n", "p.md")


# ------------------------------------------------------------------- the closure on a package of two modules

FAKE = {
    "snippets/__init__.py": "",
    "snippets/b.py": """
        import math
        from dataclasses import dataclass

        EPS = 1e-6  # b's


        @dataclass
        class Config:
            rows: int = 2


        def helper(x):
            return x * EPS + math.sqrt(4.0)
        """,
    "snippets/a.py": """
        from snippets import b
        from snippets.b import Config as BConfig
        from snippets.b import helper as b_helper
        from snippets.registry import register

        EPS = 1e-5
        # a's table
        TABLE = {1: 2}


        class Config:
            rows = 1


        def helper(x):
            return x + EPS


        def max(x):  # shadows the builtin in this module only
            return x


        def f(x):
            return helper(x) + b_helper(x) + b.EPS + Config.rows + BConfig().rows + b.Config.rows + min(x, 0)


        def g(x):
            helper = 3  # a local of the same name as a.helper: never rewritten
            return helper + f(x)


        OP = register(f)  # a registration: never reached from f
        """,
    "snippets/c.py": """
        from snippets.b import helper as bh


        def h(x):
            helper = 1
            return bh(x) + helper
        """,
    "snippets/registry.py": "def register(fn):\n    return fn\n",
}


@pytest.fixture
def fake(tmp_path, monkeypatch):
    for rel, text in FAKE.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    monkeypatch.setattr(E, "REPO", tmp_path)
    E._source.cache_clear()
    E._stmt.cache_clear()
    yield tmp_path
    E._source.cache_clear()
    E._stmt.cache_clear()


def _load(text: str, monkeypatch) -> dict:
    """Run an exported module's text as the module ``exported`` (dataclasses look their module up)."""
    import types

    module = types.ModuleType("exported")
    monkeypatch.setitem(sys.modules, "exported", module)
    exec(compile(text, "exported.py", "exec"), module.__dict__)
    return module.__dict__


def test_closure_renames_clashes_and_keeps_behaviour(fake, monkeypatch):
    cl = E.closure([E.Def("snippets.a", "g")], priority="snippets.a")
    text = E.render(cl, '"""Exported."""', all_names=[cl.names[E.Def("snippets.a", "g")]])
    assert "snippets" not in {m.split(".")[0] for m in imports_of_text(text)}
    assert "register" not in text and "OP =" not in text and "TABLE" not in text  # only what g reaches
    names = cl.names
    assert names[E.Def("snippets.a", "EPS")] == "EPS" and names[E.Def("snippets.b", "EPS")] == "B_EPS"
    assert names[E.Def("snippets.a", "Config")] == "Config" and names[E.Def("snippets.b", "Config")] == "BConfig"
    assert names[E.Def("snippets.a", "helper")] == "helper" and names[E.Def("snippets.b", "helper")] == "b_helper"
    assert E.Def("snippets.a", "max") not in names  # not reached; builtin min stays the builtin
    ns = _load(text, monkeypatch)
    want = (2.0 + 1e-5) + (2.0 * 1e-6 + 2.0) + 1e-6 + 1 + 2 + 2 + 0
    assert ns["g"](2.0) == pytest.approx(3 + want)
    assert "helper = 3" in text  # the local is left alone


def imports_of_text(text: str) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add(node.module or "")
    return out


def test_closure_refuses_a_rename_a_local_would_shadow(fake):
    # c.h calls b.helper through the alias bh; in the export it is plain `helper`, which h's local shadows
    with pytest.raises(E.ExportError, match="shadow"):
        E.closure([E.Def("snippets.c", "h")], priority="snippets.c")


def test_closure_renames_a_definition_that_shadows_a_used_builtin(fake, monkeypatch):
    (fake / "snippets" / "d.py").write_text("from snippets.a import max as amax\n\n\ndef k(x):\n"
                                            "    return amax(x) + max(x, 1)\n")
    E._source.cache_clear()
    cl = E.closure([E.Def("snippets.d", "k")])
    assert cl.names[E.Def("snippets.a", "max")] != "max"
    assert _load(E.render(cl, '"""x"""'), monkeypatch)["k"](3) == 6
