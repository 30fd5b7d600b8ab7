"""Captured outputs are held to the rule of measured results (snippets.bench.captures): each records the hash of
the code that produced it, an edit of that code makes it stale, the site marks a stale capture (or one with no
record) where it shows it, and the report lists them. The edits are made in a temporary copy of the tree, as
tests/test_hashing.py does."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from snippets import hashing, site
from snippets.bench import captures
from snippets.registry import REPO_ROOT
from snippets.site.page import directives
from snippets.site.sweep import render_sweep
from snippets.site.timeline import render_timeline

OUTPUTS = REPO_ROOT / "benchmarks" / "results" / "outputs"
DOCS = sorted([*(REPO_ROOT / "docs").glob("**/*.md"), REPO_ROOT / "README.md"])
STALE = '<span class="bench-stale">stale</span>'
NO_RECORD = '<span class="bench-stale">no provenance</span>'


@pytest.fixture
def tree(tmp_path) -> Path:
    """A copy of what captures depend on: the package, the CUDA sources, the scripts and the tests."""
    for d in ("snippets", "csrc", "scripts", "tests"):
        shutil.copytree(REPO_ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(REPO_ROOT / "conftest.py", tmp_path / "conftest.py")
    hashing.clear_cache()
    yield tmp_path
    hashing.clear_cache()


def _edit(root: Path, rel: str, pattern: str, repl: str) -> None:
    path = root / rel
    text = path.read_text()
    new, n = re.subn(pattern, repl, text, count=1, flags=re.M)
    assert n, f"{rel}: {pattern!r} not found (the test's edit no longer applies: update it)"
    path.write_text(new)
    hashing.clear_cache()


def _capture(root: Path, name: str, ext: str = "txt", text: str = "captured\n") -> Path:
    path = root / "out" / "test-gpu" / f"{name}.{ext}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    captures.record(path, root=root)
    return path


# ------------------------------------------------------------------------------ what is declared and committed

def test_every_committed_capture_has_a_producer_and_a_record():
    files = captures.captured_files()
    assert files, "no captured outputs found"
    for path in files:
        name = path.name.split(".", 1)[0]
        assert captures.producer(name) is not None, f"{path}: no producer declared in snippets.bench.captures"
        assert captures.meta_path(path).is_file(), f"{path}: no record ({captures.meta_path(path).name})"
    orphans = [p for p in OUTPUTS.glob("*/*.meta.json") if not (p.parent / json.loads(p.read_text())["file"]).is_file()]
    assert not orphans, f"records of files that are not there: {orphans}"


def test_every_capture_the_book_shows_has_a_producer():
    """A new bench:output, bench:timeline or bench:sweep name must be declared with the code that writes it."""
    missing = set()
    for page in DOCS:
        for kind, args in directives(page.read_text()):
            if kind in ("output", "timeline", "sweep") and args and captures.producer(args[0]) is None:
                missing.add(f"{page.relative_to(REPO_ROOT)}: {kind} {args[0]}")
    assert not missing, sorted(missing)


def test_producers_name_files_that_exist():
    for name, prod in captures.PRODUCERS.items():
        for rel in (*prod.scripts, *prod.files):
            assert (REPO_ROOT / rel).is_file(), f"{name}: {rel} does not exist"
        for mod in prod.modules:
            assert hashing.module_path(mod) is not None, f"{name}: no module {mod}"


def test_triton_metadata_names_the_modules_its_script_imports_by_name():
    from helpers import load_script

    assert set(load_script("capture_triton").MODULES) <= set(captures.TRITON_METADATA_MODULES)


def test_a_record_from_before_hashing_is_stale():
    path = OUTPUTS / "nvidia-h200" / "ptxas_spill.txt"
    meta = json.loads(captures.meta_path(path).read_text())
    if meta["source_hash"] is not None:
        pytest.skip("re-captured since captures were hashed")
    s = captures.status(path)
    assert s.state == "stale" and s.why == captures.UNHASHED


# ------------------------------------------------------------------------------ an edit stales what it produced

EDITS = [
    # (what, file, pattern, replacement, captures that go stale, captures that stay fresh)
    ("the spill kernels' source", "csrc/part2/spill.cu", r"__global__", "__global__ __noinline__",
     ["ptxas_spill"], ["dropout_memory", "hello"]),  # (every Part 2 module that loads CUDA hashes csrc/part2)
    ("the shell step that captures them", "scripts/capture_outputs.sh", r"-Xptxas -v", "-Xptxas -v -O2",
     ["ptxas_spill", "ncu_banks", "unified_memory", "timing_pitfalls"], ["dropout_memory"]),
    ("the module a Python capture script imports", "snippets/part2/banks.py", r"^import ", "import os as _os\nimport ",
     ["ncu_banks"], ["ptxas_spill"]),
    ("the module a heredoc runs", "snippets/part2/host_transfer.py", r"^import ", "import os as _os\nimport ",
     ["unified_memory"], ["ncu_banks"]),
    ("a version an Nsight Compute target runs", "snippets/part3/scan.py", r"^import ", "import os as _os\nimport ",
     ["ncu_scan_v5", "ncu_summary"], ["ncu_transpose_v3"]),
    ("a module the Triton metadata script imports by name", "snippets/part4/softmax.py", r"^import ",
     "import os as _os\nimport ", ["triton_metadata"], ["inductor_softmax"]),
    ("the blocks torch.compile is shown on", "snippets/part5/inductor.py", r"^import ", "import os as _os\nimport ",
     [f"inductor_{n}" for n in ("softmax", "summary", "lora")], ["linear_ce_chunks"]),
    ("a Part 1 program", "csrc/part1/device_query.cu", r"int main", "static int unused_ = 0;\nint main",
     ["device_query"], ["hello", "vector_add"]),
    ("a capture script itself", "scripts/capture_autotune.py", r"^def main", "X = 1\n\n\ndef main",
     ["autotune_matmul"], ["matmul_shapes"]),
]


@pytest.mark.parametrize("what,rel,pattern,repl,stale,fresh", EDITS, ids=[e[0] for e in EDITS])
def test_an_edit_stales_the_captures_it_produced(tree, what, rel, pattern, repl, stale, fresh):
    paths = {name: _capture(tree, name) for name in (*stale, *fresh)}
    assert all(captures.status(p, tree).fresh for p in paths.values()), "fresh when just recorded"
    _edit(tree, rel, pattern, repl)
    still = [n for n in stale if captures.status(paths[n], tree).fresh]
    assert not still, f"{what}: still fresh: {still}"
    moved = [n for n in fresh if not captures.status(paths[n], tree).fresh]
    assert not moved, f"{what}: stale though it does not run it: {moved}"
    s = captures.status(paths[stale[0]], tree)
    assert s.state == "stale" and s.recorded != s.current and "changed" in s.why


def test_a_comment_stales_nothing(tree):
    path = _capture(tree, "ptxas_spill")
    _edit(tree, "csrc/part2/spill.cu", r"^// Every kernel", "// A comment.\n// Every kernel")
    _edit(tree, "snippets/part2/banks.py", r"^import ", "# a comment\nimport ")
    assert captures.status(path, tree).fresh and captures.status(_capture(tree, "ncu_banks"), tree).fresh


def test_no_record_is_no_provenance_and_an_unknown_name_cannot_be_recorded(tmp_path):
    path = tmp_path / "outputs" / "gpu" / "hello.txt"
    path.parent.mkdir(parents=True)
    path.write_text("x\n")
    s = captures.status(path)
    assert s.state == "no provenance" and not s.fresh
    with pytest.raises(ValueError, match="no producer"):
        captures.record(path.with_name("not_a_capture.txt"))


# ------------------------------------------------------------------------------ the site and the report

def _results_with(tmp_path: Path, name: str, ext: str, text: str, source_hash: str | None | bool) -> Path:
    """``outputs/test-gpu/NAME.EXT`` under a results folder, with a record of the current code (True), of other
    code (a hash), of code before hashing (None), or none at all (False)."""
    path = tmp_path / "outputs" / "test-gpu" / f"{name}.{ext}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if source_hash is True:
        captures.record(path)
    elif source_hash is not False:
        captures.meta_path(path).write_text(json.dumps({"name": name, "file": path.name, "params": {},
                                                        "source_hash": source_hash}))
    return path


@pytest.mark.parametrize("lines", [3, 100], ids=["short", "folded"])
def test_output_marks_a_stale_capture(tmp_path, lines):
    text = "\n".join(f"line {i}" for i in range(lines)) + "\n"
    _results_with(tmp_path, "hello", "txt", text, True)
    fresh = site.render_page("<!-- bench:output hello -->\n", "p.md", tmp_path)
    assert "line 2" in fresh and "bench-stale" not in fresh
    _results_with(tmp_path, "hello", "txt", text, "0123456789abcdef")
    stale = site.render_page("<!-- bench:output hello -->\n", "p.md", tmp_path)
    assert STALE in stale and "has changed since it was captured" in stale and "line 2" in stale
    _results_with(tmp_path, "hello", "txt", text, None)
    assert captures.UNHASHED in site.render_page("<!-- bench:output hello -->\n", "p.md", tmp_path)
    captures.meta_path(tmp_path / "outputs" / "test-gpu" / "hello.txt").unlink()
    bare = site.render_page("<!-- bench:output hello -->\n", "p.md", tmp_path)
    assert NO_RECORD in bare and STALE not in bare


def test_timeline_marks_a_stale_capture(tmp_path):
    ev = {"name": "k", "kind": "kernel", "stream": 7, "start_us": 0.0, "dur_us": 5.0}
    trace = json.dumps({"gpu": "Test GPU", "runs": {"serial": [ev]}})
    _results_with(tmp_path, "stream_overlap", "json", trace, True)
    assert "bench-stale" not in render_timeline("stream_overlap", tmp_path)
    _results_with(tmp_path, "stream_overlap", "json", trace, "0123456789abcdef")
    html = render_timeline("stream_overlap", tmp_path)
    assert STALE in html[html.index("<figcaption>"):]
    captures.meta_path(tmp_path / "outputs" / "test-gpu" / "stream_overlap.json").unlink()
    assert NO_RECORD in render_timeline("stream_overlap", tmp_path)


def test_sweep_marks_a_stale_capture(tmp_path):
    from test_site import fake_sweep

    fake_sweep(tmp_path, name="autotune_matmul")
    path = tmp_path / "outputs" / "test-gpu" / "autotune_matmul.json"
    assert NO_RECORD in render_sweep("autotune_matmul", tmp_path)
    captures.record(path)
    assert "bench-stale\">stale" not in render_sweep("autotune_matmul", tmp_path)
    _results_with(tmp_path, "autotune_matmul", "json", path.read_text(), None)
    assert STALE in render_sweep("autotune_matmul", tmp_path)


def test_report_lists_stale_captures(tmp_path):
    _results_with(tmp_path, "hello", "txt", "x\n", True)
    _results_with(tmp_path, "ptxas_spill", "txt", "x\n", "0123456789abcdef")
    _results_with(tmp_path, "vector_add", "txt", "x\n", False)
    listed = {c["name"]: c for c in captures.stale_captures(tmp_path)}
    assert set(listed) == {"ptxas_spill", "vector_add"}
    assert listed["ptxas_spill"]["state"] == "stale" and listed["vector_add"]["state"] == "no provenance"
    out = subprocess.run([sys.executable, "-m", "snippets", "report", "--json", "--results", str(tmp_path)],
                         capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert {c["file"] for c in json.loads(out.stdout)["stale_captures"]} == {"ptxas_spill.txt", "vector_add.txt"}


def test_record_cli_skips_what_was_not_written(tmp_path):
    (tmp_path / "hello.txt").write_text("x\n")
    (tmp_path / "ptxas_spill.txt").write_text("")  # a step that failed before writing
    out = subprocess.run([sys.executable, "-m", "snippets.bench.captures", "record", str(tmp_path / "hello.txt"),
                          str(tmp_path / "ptxas_spill.txt")], capture_output=True, text=True, cwd=REPO_ROOT,
                         check=True)
    assert "ptxas_spill.txt was not written" in out.stderr
    assert captures.status(tmp_path / "hello.txt").fresh and not (tmp_path / "ptxas_spill.meta.json").exists()


def test_merged_gpu_test_shards_keep_one_hash(tmp_path):
    parts = []
    for i in (1, 2):
        p = tmp_path / f"s{i}" / "gpu_tests.txt"
        p.parent.mkdir()
        p.write_text(f"shard {i}/2\ntest_x: 1 passed\n")
        captures.record(p)
        parts.append(p)
    out = captures.merge_tests(parts, tmp_path / "gpu_tests.txt")
    assert "shard 1/2" in out.read_text() and "shard 2/2" in out.read_text()
    assert captures.status(out).fresh
    # merged under another name (before it is copied into place): the record still names the summary,
    # and keeps what produced the shards
    other = captures.merge_tests(parts, tmp_path / "merged" / "h100_gpu_tests.txt")
    meta = json.loads(captures.meta_path(other).read_text())
    shard = json.loads(captures.meta_path(parts[0]).read_text())
    assert meta["file"] == "gpu_tests.txt" and meta["producer"] == shard["producer"]
    meta = json.loads(parts[1].with_name("gpu_tests.meta.json").read_text())
    meta["source_hash"] = "0123456789abcdef"  # one shard ran other code
    parts[1].with_name("gpu_tests.meta.json").write_text(json.dumps(meta))
    out = captures.merge_tests(parts, tmp_path / "gpu_tests.txt")
    assert not captures.status(out).fresh


def test_the_gpu_suites_hash_covers_what_the_tests_read_without_importing():
    """A change to an exercise's solution or planted variant, to a script a test runs, or to pytest's
    configuration stales the GPU suite's summary (test_exercises and the capture tests run them on the
    GPU), as a change to a test or a module does."""
    prod = captures.producer(captures.GPU_TESTS)
    for f in ("exercises/solutions/part8/split_merge.py", "exercises/planted/part8/split_merge.py.planted.json",
              "exercises/part8/split_merge.py", "scripts/mutate.py", "scripts/capture_profiles.sh",
              "pyproject.toml", "csrc/part1/vector_add_main.cu"):
        assert f in prod.files, f
