"""Derived source hashes (snippets.hashing): each edit below was once made in a clone and the report still
called the affected results fresh. Here each is made in a temporary copy of snippets/ and csrc/, and the hash
of the versions it affects must change; edits that change no code (a docstring, a comment, a re-wrapped line)
must change nothing."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from snippets import hashing
from snippets.op_index import load_all
from snippets.registry import REPO_ROOT

OPS = load_all()


@pytest.fixture
def tree(tmp_path) -> Path:
    for d in ("snippets", "csrc"):
        shutil.copytree(REPO_ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    hashing.clear_cache()
    yield tmp_path
    hashing.clear_cache()


def hashes(root: Path, targets) -> dict[tuple[str, str], str]:
    hashing.clear_cache()
    return {(op, v): OPS[op].impls[v].source_hash(root) for op, v in targets}


def edit(root: Path, rel: str, pattern: str, repl: str, count: int = 1) -> None:
    path = root / rel
    text = path.read_text()
    new, n = re.subn(pattern, repl, text, count=count, flags=re.M)
    assert n, f"{rel}: {pattern!r} not found (the test's edit no longer applies: update it)"
    path.write_text(new)


def test_the_copy_hashes_like_the_repository(tree):
    targets = [("layernorm", "v3"), ("sgemm", "v11"), ("rmsnorm", "v0")]
    assert hashes(tree, targets) == {t: OPS[t[0]].impls[t[1]].source_hash() for t in targets}


EDITS = [
    # (what, file, pattern, replacement, versions that must go stale)
    ("layernorm headline launch: fwd_warps 8 -> 4", "snippets/part4/layernorm.py",
     r"(4096: RowConfig\(rows=\d+, fwd_warps=)8", r"\g<1>4", [("layernorm", "v3"), ("layernorm_fwd_bwd", "v3")]),
    ("matmul FIXED config", "snippets/part4/matmul.py", r"^FIXED = dict\(BLOCK_M=128", "FIXED = dict(BLOCK_M=64",
     [("matmul", "v1"), ("matmul", "v3")]),
    ("GROUP_M of the GEMMs", "snippets/common/gemm.py", r"^GROUP_M = 8", "GROUP_M = 4",
     [("matmul", "v2"), ("matmul_epilogue", "v3")]),
    ("ONLINE_BLOCK_N (softmax and cross-entropy use it)", "snippets/common/rows.py", r"^ONLINE_BLOCK_N = 4096",
     "ONLINE_BLOCK_N = 2048", [("softmax", "v4"), ("cross_entropy", "v3")]),
    ("rows.config_for (layernorm and rmsnorm call it)", "snippets/common/rows.py",
     r"^def config_for\(n: int, configs: dict\[int, RowConfig\]\) -> tuple\[int, RowConfig\]:\n",
     "def config_for(n: int, configs: dict[int, RowConfig]) -> tuple[int, RowConfig]:\n    n = n + 0\n",
     [("rmsnorm", "v3"), ("rmsnorm_fwd_bwd", "v3"), ("layernorm", "v3")]),
    ("a check removed from _checks.py", "snippets/_checks.py",
     r"^(\s*)raise TypeError\(f\"\{name\} must be a torch.Tensor", r"\1pass  # raise TypeError(f\"{name} must be a torch.Tensor",  # noqa: E501
     [("vector_add", "v1"), ("rmsnorm", "v3"), ("sgemm", "v3")]),
    ("--use_fast_math in the NVRTC options", "snippets/cuda.py", r'opts = \("-std=c\+\+17", ',
     'opts = ("-std=c++17", "--use_fast_math", ', [("softmax", "v5"), ("sgemm", "v11"), ("transpose", "v6")]),
    ("torch.compile's mode switched to max-autotune", "snippets/common/baselines.py",
     r"= torch\.compile\(fn, dynamic=False\)", '= torch.compile(fn, dynamic=False, mode="max-autotune")',
     [("rmsnorm", "v1"), ("layernorm", "v1"), ("swiglu", "v1")]),
    ("the timer", "snippets/bench/timing.py", r"^import ", "import os as _os\nimport ",
     [("vector_add", "v0"), ("flash_attention_fwd", "v1")]),
]


@pytest.mark.parametrize("what,rel,pattern,repl,targets", EDITS, ids=[e[0] for e in EDITS])
def test_an_edit_stales_what_depends_on_it(tree, what, rel, pattern, repl, targets):
    before = hashes(tree, targets)
    edit(tree, rel, pattern, repl)
    after = hashes(tree, targets)
    same = [t for t in targets if before[t] == after[t]]
    assert not same, f"{what}: still fresh: {same}"


@pytest.mark.parametrize("op", ["swiglu", "rmsnorm", "rope"])
def test_a_launch_config_edit_stales_the_op(tree, op):
    rel = f"snippets/part5/{op}.py"
    text = (tree / rel).read_text()
    m = re.search(r"""["']?num_warps["']?\s*[=:]\s*(\d+)""", text)
    assert m, f"{rel} has no num_warps= launch argument"
    (tree / rel).write_text(text[:m.start(1)] + str(int(m.group(1)) * 2) + text[m.end(1):])
    book = [v for v, i in OPS[op].impls.items() if i.origin == "book"]
    before = {v: OPS[op].impls[v].source_hash() for v in book}
    after = hashes(tree, [(op, v) for v in book])
    assert all(after[(op, v)] != before[v] for v in book)


def test_a_header_include_and_a_header_edit_stale_the_kernel(tree):
    targets = [("sgemm", "v11")]
    base = hashes(tree, targets)
    cu = next((tree / "csrc/part3/sgemm").glob("v11_*.cu"))
    (cu.parent / "extra_km_test.cuh").write_text("#define KM_TEST 1\n")
    cu.write_text('#include "extra_km_test.cuh"\n' + cu.read_text())
    with_header = hashes(tree, targets)
    assert with_header != base
    (cu.parent / "extra_km_test.cuh").write_text("#define KM_TEST 2\n")
    assert hashes(tree, targets) != with_header


def test_docstrings_comments_and_wrapping_change_nothing(tree):
    targets = [("layernorm", "v3"), ("rmsnorm", "v3"), ("sgemm", "v11"), ("softmax", "v5")]
    base = hashes(tree, targets)
    edit(tree, "snippets/part4/layernorm.py", r'^"""', '"""A new first line of the module docstring.\n\n')
    edit(tree, "snippets/part4/layernorm.py", r"^CONFIGS = \{", "# a new comment\nCONFIGS = {")
    edit(tree, "snippets/part4/layernorm.py", r"^CONFIGS = \{", "CONFIGS = {  ")  # spacing only
    cu = next((tree / "csrc/part3/sgemm").glob("v11_*.cu"))
    cu.write_text("// a new comment\n/* and a block\n   comment */\n" + cu.read_text().replace("\n", "\n\n", 3))
    assert hashes(tree, targets) == base
    edit(tree, "snippets/part4/layernorm.py", r"^CONFIGS = \{", "CONFIGS: dict = {")  # code: stale
    assert hashes(tree, targets)[("layernorm", "v3")] != base[("layernorm", "v3")]


def test_every_version_hash_covers_the_timer_and_its_module(tree):
    for op in ("vector_add", "matmul", "flash_attention_fwd"):
        for v, impl in OPS[op].impls.items():
            mods = hashing.closure([impl.home, *hashing.ALWAYS])
            assert "snippets.bench.timing" in mods and impl.home in mods, (op, v)


def test_the_normalised_code_is_the_same_on_every_python():
    """Python 3.12 added fields (``type_params``) that ``ast.dump`` prints even when empty: a hash taken on the
    GPU runner's Python must equal the one a 3.11 CI machine computes, so empty fields are left out."""
    import ast

    text = hashing._dump(ast.parse("def f(x):\n    return x + 1\n"))
    assert "type_params" not in text and "decorator_list" not in text and "returns" not in text
    assert text.startswith("Module(body=[FunctionDef(name='f'")


def _tokens(tmp_path: Path, text: str) -> str:
    f = tmp_path / "k.cu"
    f.write_text(text)
    return hashing.cuda_text(f)


@pytest.mark.parametrize("a, b", [
    ("#define SUM(a, b) ((a) + (b))\nint x;\n", "#define SUM(a, b) \\\n    ((a) +   \\\n (b))\nint x;\n"),
    ('printf("n = %d, t = %f\\n", n, t);', 'printf("n = %d, "\n       "t = %f\\n", n, t);'),
    ("a[i] = b[i]+c; // sum\n", "a[i] =\n  b[i] /* the load */ + c;\n"),
])
def test_cuda_layout_changes_nothing(tmp_path, a, b):
    assert _tokens(tmp_path, a) == _tokens(tmp_path, b)


@pytest.mark.parametrize("a, b", [
    ("#define N 1\nint x = N;\n", "#define N 1 int x = N;\n"),   # code moved into the directive's line
    ("y = a - -b;", "y = a--b;"),                                # two tokens become one
    ("x = 1.0f;", "x = 1.5f;"),
    ('printf("%d", n);', 'printf("%d ", n);'),                   # inside a literal, spaces count
    ("if (i < n) k<<<g, b>>>(p);", "if (i <= n) k<<<g, b>>>(p);"),
])
def test_cuda_token_changes_count(tmp_path, a, b):
    assert _tokens(tmp_path, a) != _tokens(tmp_path, b)


def test_a_script_block_is_not_what_is_measured(tmp_path):
    pkg = tmp_path / "snippets"
    pkg.mkdir()
    body = "import torch\n\ndef f(x):\n    return x + 1\n"
    (pkg / "m.py").write_text(body + '\nif __name__ == "__main__":\n    print(f(1))\n')
    with_script = hashing._module_facts(pkg / "m.py")[0]
    (pkg / "m.py").write_text(body + '\nif __name__ == "__main__":\n    print(f(2), "changed")\n')
    hashing.clear_cache()
    assert hashing._module_facts(pkg / "m.py")[0] == with_script
    (pkg / "m.py").write_text(body.replace("x + 1", "x + 2"))
    hashing.clear_cache()
    assert hashing._module_facts(pkg / "m.py")[0] != with_script


def test_fstring_parts_hash_alike_on_every_python():
    """Python 3.12 (the GPU runner's) parses the format spec of ``f"{x:<{w}}"`` with a trailing
    empty string constant that 3.11 (CI's) leaves out, so a capture recorded on the runner once
    looked stale here. Both shapes, built by hand, must dump alike; a changed constant must not."""
    import ast

    tree = ast.parse('f"{x:<{w}} and {y}"')
    spec = tree.body[0].value.values[0].format_spec
    plain = hashing._dump(tree)
    spec.values.append(ast.Constant(value=""))  # 3.12's shape
    assert hashing._dump(tree) == plain
    spec.values[0] = ast.Constant(value="<")
    spec.values.insert(0, ast.Constant(value=""))
    assert hashing._dump(tree) == plain
    tree.body[0].value.values[1] = ast.Constant(value=" or ")  # a real change of the text
    assert hashing._dump(tree) != plain
