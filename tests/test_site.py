"""The site: a strict MkDocs build, every internal link resolving, the companion notebooks executing (slow), and
the directives this module's tests own: ``bench:sweep``, ``bench:versus`` (with the line counting behind
it) and ``bench:goal``.

The numbers in the fixtures are test data for the code paths only; nothing here is published."""

from __future__ import annotations

import json
import os
import re
from urllib.parse import unquote, urlparse

import pytest
import torch

from snippets import site
from snippets.bench import harness, loc
from snippets.op_index import load_all
from snippets.registry import REPO_ROOT, Impl, size_key

OPS = load_all()


@pytest.mark.slow
def test_strict_build_has_every_chapter(site_dir):
    for page in ("index.html", "part1/elementwise/index.html", "benchmarks/index.html",
                 "part1/notebook/index.html"):
        assert (site_dir / page).is_file(), page


HREF = re.compile(r'(?:href|src)="([^"#?]+)')


@pytest.mark.slow
def test_internal_links_resolve(site_dir):
    broken = []
    for html in site_dir.glob("**/*.html"):
        for link in HREF.findall(html.read_text(errors="replace")):
            url = urlparse(link)
            if url.scheme or link.startswith(("//", "/", "mailto:", "data:")):
                continue  # external, or site-absolute (only 404.html uses those, built from site_url)
            target = (html.parent / unquote(url.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{html.relative_to(site_dir)} -> {link}")
    assert not broken, "broken internal links:\n" + "\n".join(sorted(set(broken))[:50])


@pytest.mark.slow
def test_no_bench_directive_left_unrendered(site_dir):
    left = [str(p.relative_to(site_dir)) for p in site_dir.glob("**/*.html") if "<!-- bench:" in p.read_text()]
    assert not left, f"unrendered bench directives in {left}"


NOTEBOOKS = sorted((REPO_ROOT / "docs").glob("**/*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_notebook_executes(path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    nb = nbformat.read(path, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit notebooks without outputs"
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO_ROOT)}}
                            ).execute()


# ------------------------------------------------------------------------------------------ bench:sweep

PROV = {"gpu": "Test GPU", "sm_count": 1, "compute_capability": "9.0", "driver": "0", "cuda_runtime": "0",
        "torch": "0", "triton": "0", "cupy": None, "date": "2026-01-01T00:00:00+00:00", "commit": "0" * 40,
        "dirty": False}


def _config(bm, bn, warps, stages, status="ok", ms=None):
    rec = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": warps, "num_stages": stages,
           "smem_bytes": stages * (bm + bn) * 64 * 2, "fits": True, "status": status}
    if status == "ok":
        rec.update(ms=ms, tflops=2 * 1024**3 / (ms * 1e-3) / 1e12)
    else:
        rec["error"] = "OutOfResources: out of resource: shared memory"
    return rec


def fake_sweep(tmp_path, name="autotune_test", gpu="test-gpu", source_hash=None):
    """A sweep file as scripts/capture_autotune.py writes it: a 2 x 2 BLOCK_M x BLOCK_N grid with one failed
    cell and a stages x warps pair at the best tile."""
    configs = [_config(64, 64, 4, 3, ms=4.0), _config(64, 128, 4, 3, ms=2.0), _config(128, 64, 4, 3, ms=3.0),
               _config(128, 128, 4, 3, ms=1.0), _config(128, 128, 8, 3, ms=1.25),
               _config(128, 128, 8, 6, status="failed"), _config(64, 64, 8, 3, status="wrong")]
    data = {"schema": 1, "kind": "autotune_sweep", "kernel": "snippets.common.gemm:matmul_kernel",
            "source_hash": source_hash or site._resolve_hash("snippets.common.gemm:matmul_kernel"),
            "problem": {"m": 1024, "n": 1024, "k": 1024, "dtype": "bfloat16"}, "metric": "TFLOP/s",
            "cublas": {"ms": 0.5, "tflops": 2 * 1024**3 / 0.5e-3 / 1e12, "how": "test"},
            "tuning_cost": {"space": 24, "pruned": 20, "cache_results": True, "first_call_s": 12.5,
                            "second_call_s": 0.0002, "new_key_s": 2.5, "fresh_autotuner_s": 0.002},
            "provenance": PROV, "configs": configs}
    path = tmp_path / "outputs" / gpu / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return data


def test_sweep_renders_heatmap_table_and_cost(tmp_path):
    fake_sweep(tmp_path)
    md = site.render_page("# T\n\n<!-- bench:sweep autotune_test -->\n", "p.md", tmp_path)
    assert "<!-- bench:" not in md and md.count("<svg") == 1  # one figure of two heatmaps
    assert "Stale" not in md
    rows = [line for line in md.splitlines() if line.startswith("    | ") and "BLOCK_M" not in line]
    assert len(rows) == 7  # every config, the failed and the wrong ones included
    assert "| 128 | 128 | 64 | 8 | 4 | 3 | 96 KiB | 1.000 ms |" in rows[0] and "100.0%" in rows[0]
    assert "| 64 | 128 |" in rows[2] and "50.0%" in rows[2]  # 2 ms against the best 1 ms
    assert any("failed</span>: OutOfResources" in r for r in rows[-2:])
    assert any("wrong</span>" in r for r in rows[-2:])
    assert "Best: BLOCK_M = 128, BLOCK_N = 128" in md and "50.0% of cuBLAS" in md
    assert "| first call (compile and time every config) | 12.50 |" in md
    assert "[^sweep-autotune-test-test-gpu]:" in md and "Test GPU" in md


def test_sweep_marks_a_changed_kernel_stale(tmp_path):
    fake_sweep(tmp_path, source_hash="0123456789abcdef")
    assert "Stale" in site.render_sweep("autotune_test", tmp_path)


def test_sweep_source_hash_is_the_registry_hash():
    from snippets.common.gemm import matmul_kernel

    # scripts/capture_autotune.py writes Impl(..., matmul_kernel, ...).source_hash(); the page recomputes it
    expected = Impl("x", matmul_kernel, "Triton", "").source_hash()
    assert site._resolve_hash("snippets.common.gemm:matmul_kernel") == expected
    assert site._resolve_hash("snippets.common.gemm:no_such_kernel") is None
    assert site._resolve_hash("snippets.no_such_module:k") is None


def test_sweep_without_a_file_says_so(tmp_path):
    assert "Not measured yet" in site.render_page("<!-- bench:sweep autotune_none -->\n", "p.md", tmp_path)
    with pytest.raises(ValueError, match="plain file stem"):
        site.render_sweep("../x", tmp_path)


def test_sweep_with_no_working_config(tmp_path):
    data = fake_sweep(tmp_path)
    path = tmp_path / "outputs" / "test-gpu" / "autotune_test.json"
    data["configs"] = [_config(64, 64, 4, 3, status="failed")]
    path.write_text(json.dumps(data))
    md = site.render_sweep("autotune_test", tmp_path)
    assert "No configuration of this sweep" in md and "<svg" not in md


# ------------------------------------------------------------------------------------------ bench:versus

def fake_results(tmp_path, op_name, stale=(), gpu="Test GPU", date="2026-01-01T00:00:00+00:00", edit=None):
    """Headline records of every version of an op (v0 slowest), in the harness's format; ``edit`` may change
    the list of records (in place) before it is written."""
    op = OPS[op_name]
    records = []
    for k, (name, impl) in enumerate(op.impls.items()):
        records.append({"impl": name, "lang": impl.lang, "desc": impl.desc, "dtype": str(op.timed_dtypes()[0])[6:],
                        "size": dict(op.headline), "size_key": size_key(op.headline), "headline": True,
                        "ms": 1.0 / (k + 1), "source_hash": "old" if name in stale else impl.source_hash()})
    ceiling = {"name": op.ceiling, "value": 1e6, "unit": op.metric, "how": "test"}
    harness.derive(op, records, ceiling["value"])
    if edit is not None:
        edit(records)
    entry = {"part": op.part, "title": op.title, "metric": op.metric, "ceiling": ceiling,
             "provenance": {**PROV, "gpu": gpu, "date": date}, "records": records}
    harness.merge(tmp_path / f"{harness.slug(gpu)}.json", gpu, {op_name: entry}, {op.ceiling: ceiling})


def _row(md, op, ver):
    return next(line for line in md.splitlines() if line.startswith(f"| `{op}` | {ver}"))


def test_versus_rows_lines_and_rates(tmp_path):
    fake_results(tmp_path, "vector_add")
    fake_results(tmp_path, "reduce_sum", stale=("v8",))
    md = site.render_page("<!-- bench:versus vector_add:v5, vector_add:v4 reduce_sum:v7,reduce_sum:v8 -->\n",
                          "p.md", tmp_path)
    for op, ver in (("vector_add", "v5"), ("vector_add", "v4"), ("reduce_sum", "v7"), ("reduce_sum", "v8")):
        count = loc.impl_lines(OPS[op].impls[ver])
        assert count.kernel > 0 and count.host > 0
        cells = [c.strip() for c in _row(md, op, ver).split("|")[1:-1]]
        assert cells[2] == OPS[op].impls[ver].lang and cells[4:6] == [str(count.kernel), str(count.host)]
        assert cells[6].startswith("Test GPU[^versus-") and cells[7].endswith("GB/s")
    v4 = OPS["vector_add"]
    rate = v4.rate(v4.headline, torch.float32, 1.0 / (list(v4.impls).index("v4") + 1))
    assert f"{rate:,.1f} GB/s" in _row(md, "vector_add", "v4")
    assert "stale" in _row(md, "reduce_sum", "v8") and "stale" not in _row(md, "reduce_sum", "v7")
    assert "vector_add_v5 in csrc/part1/elementwise.cu" in md and "_add_kernel (Triton)" in md
    assert md.count("]: Measured by") == 2  # one footnote per op and GPU


def test_versus_takes_the_latest_gpu_and_says_when_unmeasured(tmp_path):
    fake_results(tmp_path, "vector_add", gpu="Old GPU", date="2025-01-01T00:00:00+00:00")
    fake_results(tmp_path, "vector_add", gpu="New GPU", date="2026-06-01T00:00:00+00:00")
    md = site.render_page("<!-- bench:versus vector_add:v4 reduce_sum:v8 -->\n", "p.md", tmp_path)
    assert "New GPU[^" in _row(md, "vector_add", "v4") and "Old GPU" not in md
    assert "not measured" in _row(md, "reduce_sum", "v8")


def test_versus_compares_rows_on_one_gpu(tmp_path):
    # reduce_sum was measured last on "New GPU" only; vector_add on both, most recently on "Old GPU": the
    # table must not set one GPU's rate beside another's, so every row comes from the latest GPU with both
    fake_results(tmp_path, "vector_add", gpu="New GPU", date="2026-01-01T00:00:00+00:00")
    fake_results(tmp_path, "vector_add", gpu="Old GPU", date="2026-09-01T00:00:00+00:00")
    fake_results(tmp_path, "reduce_sum", gpu="New GPU", date="2026-06-01T00:00:00+00:00")
    md = site.render_page("<!-- bench:versus vector_add:v4 reduce_sum:v8 -->\n", "p.md", tmp_path)
    assert "New GPU[^" in _row(md, "vector_add", "v4") and "New GPU[^" in _row(md, "reduce_sum", "v8")
    assert "Old GPU" not in md


def test_versus_refuses_unknown_items(tmp_path):
    with pytest.raises(ValueError, match="unknown op"):
        site.render_page("<!-- bench:versus nope:v1 -->\n", "p.md", tmp_path)
    with pytest.raises(ValueError, match="no version v99"):
        site.render_page("<!-- bench:versus vector_add:v99 -->\n", "p.md", tmp_path)
    with pytest.raises(ValueError, match="is not OP:VERSION"):
        site.parse_versus("vector_add v4")
    assert site.parse_versus("a:v1,b:v2@k_one+k_two") == [("a", "v1", None), ("b", "v2", ["k_one", "k_two"])]


# ------------------------------------------------------------------------------------------ line counting

def test_python_code_lines_skip_blank_comments_and_docstrings():
    src = ('    def f(x):\n        """Doc\n        string."""\n\n        # a comment\n        y = (x +\n'
           '             1)  # trailing\n        s = """not a\n        docstring"""\n        return y\n')
    # def, y = ... (2 lines), s = ... (2 lines: a string, not a docstring), return
    assert loc.python_code_lines(src) == 6
    assert loc.python_code_lines("x = 1\n\n# c\n") == 1


def test_strip_c_comments_keeps_strings_and_lines():
    text = 'int a; // gone\n/* gone\n gone */ int b;\nconst char* s = "// kept";\n'
    out = loc.strip_c_comments(text)
    assert out.count("\n") == text.count("\n") and "gone" not in out and '"// kept"' in out
    assert loc.c_code_lines(text) == 3


CU = """
#include <cuda_fp16.h>
constexpr int BLOCK = 256;  // threads
template <typename T> struct Acc { T v; };
__device__ float helper(float x) { return x * 2.f; }
__device__ float unused(float x) {
    return x;
}
template <int N, class F>
__device__ __forceinline__ float apply(float x, F f) {
    // a comment inside
    return f(helper(x)) * N;
}
extern "C" __global__ void __launch_bounds__(BLOCK) scale_v1(float* x) {
    Acc<float> a{apply<2>(x[threadIdx.x], [](float y) { return y; })};
    x[threadIdx.x] = a.v;
}
#define KERNEL(NAME, K) \\
    extern "C" __global__ void NAME(float* x) { x[0] = unused(K); }
KERNEL(scale_v2_f32, 1.f)
KERNEL(scale_v21, 2.f)
"""


def test_c_definitions_and_kernel_closure():
    defs = {d.name: d for d in loc.c_definitions(CU)}
    assert {"BLOCK", "Acc", "helper", "unused", "apply", "scale_v1", "KERNEL", "scale_v2_f32", "scale_v21"} <= set(defs)
    assert defs["scale_v1"].is_kernel and defs["scale_v2_f32"].is_kernel and not defs["helper"].is_kernel
    used = {d.name for d in loc.kernel_closure(CU, ["scale_v1"])}
    assert used == {"scale_v1", "apply", "helper", "Acc", "BLOCK"}
    assert {d.name for d in loc.kernel_closure(CU, ["scale_v2_f32"])} == {"scale_v2_f32", "KERNEL", "unused"}
    # scale_v1: 4 lines; apply: 4 of 5 (the comment is not code); helper, Acc, BLOCK: 1 each
    assert loc.cuda_kernel_lines(CU, ["scale_v1"]) == 4 + 4 + 3
    with pytest.raises(ValueError, match="no definition of"):
        loc.kernel_closure(CU, ["nope"])


def test_kernels_of_a_version():
    assert loc.kernels_of_version(CU, "v1") == ["scale_v1"]
    assert loc.kernels_of_version(CU, "v2") == ["scale_v2_f32"]  # not scale_v21
    # A quoted kernel name in the launcher wins; the version's own among several quoted ones.
    assert loc.launched_kernels(CU, "v9", ['launch("scale_v21")']) == ["scale_v21"]
    assert loc.launched_kernels(CU, "v2", ['k = "scale_v1" if odd else "scale_v2_f32"']) == ["scale_v2_f32"]
    # Nothing quoted, no kernel named for the version: the macros that stamp out kernels
    assert loc.launched_kernels(CU, "v7", []) == ["KERNEL"]
    assert loc.launched_kernels('extern "C" __global__ void k(float* x) { x[0] = 0.f; }\n', "v7", []) == []


def test_impl_lines_of_a_cuda_file_and_a_triton_kernel(tmp_path):
    cu = tmp_path / "k.cu"
    cu.write_text(CU)

    def host(x):
        """Launch."""
        return x  # the launch would be here

    cuda_impl = Impl("v1", host, "CUDA", "test", (cu,))
    count = loc.impl_lines(cuda_impl)
    assert (count.kernel, count.host) == (11, 2) and "scale_v1" in count.what
    by_macro = loc.impl_lines(Impl("v7", host, "CUDA", "test", (cu,)))
    assert by_macro.kernel == 2 + 3 and "KERNEL in" in by_macro.what  # the two-line macro, unused
    other = tmp_path / "other.cu"
    other.write_text('// one kernel\nextern "C" __global__ void k(float* x) {\n    x[0] = 0.f;\n}\n')
    whole = loc.impl_lines(Impl("v7", host, "CUDA", "test", (other, "snippets/part4/autotune.py")))
    assert whole.kernel == 3 and "all of" in whole.what  # the .py file in sources is not counted
    named = loc.impl_lines(Impl("v7", host, "CUDA", "test", (cu,)), kernels=["scale_v2_f32"])
    assert named.kernel == 1 + 2 + 3  # the invocation, the two-line macro, unused
    triton_impl = OPS["vector_add"].impls["v4"]
    t = loc.impl_lines(triton_impl)
    assert t.kernel == loc.python_code_lines(__import__("inspect").getsource(triton_impl.sources[0].fn))
    assert loc.impl_lines(OPS["vector_add"].impls["v0"]) == loc.LineCount(0, 0, "")


# ------------------------------------------------------------------------------------------ bench:goal

def _goal_rows(md):
    return [line for line in md.splitlines() if line.startswith("| v")]


def test_goal_verdicts_from_the_results(tmp_path):
    # fake_results: version k takes 1 / (k + 1) ms, so a later version is faster
    fake_results(tmp_path, "reduce_sum")
    md = site.render_page("<!-- bench:goal reduce_sum v3 v0:2 v0:5 v7:1 ceiling:0.000001 ceiling:0.99 -->\n",
                          "p.md", tmp_path)
    rows = _goal_rows(md)
    assert len(rows) == 5 and "Goal check" in md and "]: Measured by" in md
    assert "| 4x (250.0 µs against 1.000 ms) | **met** |" in rows[0]
    assert rows[1].endswith("**not met** |")  # 4x is short of 5x
    assert "0.5x" in rows[2] and rows[2].endswith("**not met** |")  # v7 is twice as fast as v3
    assert rows[3].endswith("**met** |") and rows[4].endswith("**not met** |")


def test_goal_of_the_books_best_version(tmp_path):
    # version k takes 1 / (k + 1) ms: the last book version is the fastest; a library version never counts
    fake_results(tmp_path, "reduce_sum")
    op = OPS["reduce_sum"]
    book = [v for v, impl in op.impls.items() if impl.origin == "book"]
    fastest = max(book, key=lambda v: int(v[1:]))
    md = site.render_page("<!-- bench:goal reduce_sum best v0:2 ceiling:0.000001 -->\n", "p.md", tmp_path)
    rows = [line for line in md.splitlines() if line.startswith("| the book's best version")]
    assert len(rows) == 2, md
    assert all(f"| {fastest}: " in r for r in rows) and rows[0].endswith("**met** |"), rows


def test_goal_marks_stale_and_unmeasured_terms(tmp_path):
    fake_results(tmp_path, "reduce_sum", stale=("v0",))
    md = site.render_page("<!-- bench:goal reduce_sum v3 v0:1 v1:1 memory-v1:1 -->\n", "p.md", tmp_path)
    rows = _goal_rows(md)
    assert "stale (v0 changed since)" in rows[0] and rows[1].endswith("**met** |")
    assert "not measured (v3, v1)" in rows[2]  # no peak memory in these records
    assert "Goal not checked yet" in site.render_page("<!-- bench:goal vector_add v4 v0:1 -->\n", "p.md",
                                                      tmp_path)


def test_goal_memory_term(tmp_path):
    def peaks(records):
        for r in records:
            r["peak_extra_bytes"] = {"v1": 2**31, "v3": 2**20}.get(r["impl"], 2**30)

    fake_results(tmp_path, "cross_entropy", edit=peaks)
    rows = _goal_rows(site.render_page("<!-- bench:goal cross_entropy v3 memory-v1:0.25 memory-v0:0.0001 -->\n",
                                       "p.md", tmp_path))
    assert "(1.0 MiB against 2.00 GiB)" in rows[0] and rows[0].endswith("**met** |")
    assert rows[1].endswith("**not met** |")


def test_goal_rate_term(tmp_path):
    # fake_results: version k takes 1 / (k + 1) ms; the rate is the op's bytes over that time
    fake_results(tmp_path, "reduce_sum")
    results = json.loads(next(tmp_path.glob("*.json")).read_text())
    rate = next(r["value"] for r in results["ops"]["reduce_sum"]["records"] if r["impl"] == "v3")
    rows = _goal_rows(site.render_page(f"<!-- bench:goal reduce_sum v3 rate:{rate * 0.99:.6f} "
                                       f"rate:{rate * 1.01:.6f} -->\n", "p.md", tmp_path))
    assert len(rows) == 2 and f"{rate:,.1f} GB/s" in rows[0]
    assert rows[0].endswith("**met** |") and rows[1].endswith("**not met** |")
    assert "at least" in rows[0] and "GB/s" in rows[0].split(" | ")[0]


def test_goal_versus_term(tmp_path):
    """``OP.vK:R`` / ``OP.best:R``: at least R times another op's rate at the same size on the same GPU (the FP8
    GEMM against the book's best bf16 GEMM: fp8 records in e4m3, the bf16 op's in its own headline dtype)."""
    fake_results(tmp_path, "fp8_gemm")
    fake_results(tmp_path, "hopper_gemm", stale=("v1",))
    results = json.loads(next(tmp_path.glob("*.json")).read_text())["ops"]
    mine = next(r for r in results["fp8_gemm"]["records"] if r["impl"] == "v6")
    theirs = {r["impl"]: r for r in results["hopper_gemm"]["records"]}
    best = min((r["ms"], v) for v, r in theirs.items() if OPS["hopper_gemm"].impls[v].origin == "book")[1]
    ratio = mine["value"] / theirs[best]["value"]
    rows = _goal_rows(site.render_page(f"<!-- bench:goal fp8_gemm v6 hopper_gemm.best:{ratio * 0.99:.6f} "
                                       f"hopper_gemm.best:{ratio * 1.01:.6f} -->\n", "p.md", tmp_path))
    assert len(rows) == 2 and rows[0].endswith("**met** |") and rows[1].endswith("**not met** |")
    assert f"{ratio:.3g}x" in rows[0] and f"against {best}'s" in rows[0] and "the book's best `hopper_gemm`" in rows[0]
    v2 = theirs["v2"]["value"]
    two = _goal_rows(site.render_page(f"<!-- bench:goal fp8_gemm v6 hopper_gemm.v2:{mine['value'] / v2 * 0.99:.6f} "
                                      "hopper_gemm.v1:0.1 -->\n", "p.md", tmp_path))
    assert two[0].endswith("**met** |") and "stale (hopper_gemm.v1 changed since)" in two[1]
    for text, match in (("fp8_gemm v6 nope.v1:2", "unknown op 'nope'"),
                        ("fp8_gemm v6 hopper_gemm.v99:2", "no version v99"),
                        ("fp8_gemm v6 reduce_sum.v1:2", "not both rates in one metric")):
        with pytest.raises(ValueError, match=match):
            site.render_page(f"<!-- bench:goal {text} -->\n", "p.md", tmp_path)


def test_goal_refuses_malformed_directives(tmp_path):
    for text, match in (("reduce_sum v3", "at least one term"), ("nope v1 v0:1", "unknown op"),
                        ("reduce_sum v99 v0:1", "no version v99"), ("reduce_sum v3 v99:1", "no version v99"),
                        ("reduce_sum v3 faster", "is not vK:R"), ("reduce_sum v3 rate:fast", "is not vK:R"),
                        ("pointer_chase v1 ceiling:0.5", "no ceiling")):
        with pytest.raises(ValueError, match=match):
            site.render_page(f"<!-- bench:goal {text} -->\n", "p.md", tmp_path)


def test_goal_at_a_sweep_size(tmp_path):
    op = OPS["reduce_sum"]
    other = next(sz for sz in op.sweep if size_key(sz) != size_key(op.headline))
    def add_sweep_size(records):  # the same versions at a sweep size, v3 now the slowest
        records += [{**r, "size": other, "size_key": size_key(other), "headline": False,
                     "ms": 9.0 if r["impl"] == "v3" else 1.0} for r in list(records)]

    fake_results(tmp_path, "reduce_sum", edit=add_sweep_size)
    head = _goal_rows(site.render_page("<!-- bench:goal reduce_sum v3 v0:1 -->\n", "p.md", tmp_path))
    swept = _goal_rows(site.render_page(f"<!-- bench:goal reduce_sum v3 v0:1 size={size_key(other)} -->\n",
                                        "p.md", tmp_path))
    assert head[0].endswith("**met** |") and swept[0].endswith("**not met** |")
    with pytest.raises(ValueError, match="has no size"):
        site.render_page("<!-- bench:goal reduce_sum v3 v0:1 size=n=3 -->\n", "p.md", tmp_path)


def test_goal_says_when_a_miss_is_inside_the_spread(tmp_path):
    def spreads(records):  # v3 takes 1/4 ms, v4 1/5 ms
        for r in records:
            r["ms_p10"], r["ms_p90"] = r["ms"] * 0.7, r["ms"] * 1.3

    fake_results(tmp_path, "reduce_sum", edit=spreads)
    rows = _goal_rows(site.render_page("<!-- bench:goal reduce_sum v3 v4:1 v8:1 -->\n", "p.md", tmp_path))
    assert rows[0].endswith("**not met** (within the timings' 10th-90th percentile spread) |")  # 0.26 / 0.175
    assert rows[1].endswith("**not met** |")  # v8: 1/9 ms * 1.3 is still below 1/4 ms * 0.7
    # a goal met by the medians but not by the spreads says so; one clear of them does not
    rows = _goal_rows(site.render_page("<!-- bench:goal reduce_sum v4 v3:1 -->\n<!-- bench:goal reduce_sum "
                                       "v8 v3:1 -->\n", "p.md", tmp_path))
    assert rows[0].endswith("**met** (but not across the timings' 10th-90th percentile spread) |")
    assert rows[1].endswith("**met** |")  # 1/4 ms * 0.7 against 1/9 ms * 1.3
