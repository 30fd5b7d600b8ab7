"""The benchmark harness, the report and the docs rendering, on CPU with a results file built here.

The numbers in these fixtures are test data for the code paths only; nothing here is published. The GPU test at
the end runs the real harness end to end on one op.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from snippets import site
from snippets.bench import harness, report
from snippets.bench.timing import Timing, reps_for, rotation, time_host
from snippets.op_index import load_all
from snippets.registry import REPO_ROOT, size_key

OPS = load_all()


def test_timing_median_and_spread():
    t = Timing.of([5.0, 1.0, 3.0, 2.0, 4.0])
    assert t.median == 3.0 and t.p10 == 1.0 and t.p90 == 5.0 and t.reps == 5
    with pytest.raises(ValueError):
        Timing.of([])


def test_reps_for_budget():
    assert reps_for(1.0, 100.0) == 100
    assert reps_for(1000.0, 100.0) == 10  # never fewer than lo
    assert reps_for(1e-6, 100.0) == 500  # never more than hi
    assert reps_for(0.0, 100.0) == 500


def test_rotation_spans_l2():
    l2 = 50 * 2**20
    assert rotation(2**30, l2) == (1, False)  # one 1 GiB set already dwarfs L2
    sets, flush = rotation(20 * 2**20, l2)
    assert sets == 10 and not flush and sets * 20 * 2**20 >= 4 * l2
    assert rotation(4096, l2) == (16, True)  # tiny: rotate and flush
    with pytest.raises(ValueError):
        rotation(0, l2)


def test_time_host_measures_sleep():
    import time

    t = time_host(lambda: time.sleep(0.002), [()], budget_ms=30)
    assert 1.5 < t.median < 50 and t.reps >= 5


def test_check_impl_catches_a_wrong_kernel(device):
    op = OPS["vector_add"]
    x, y = torch.randn(100, device=device), torch.randn(100, device=device)
    good = op.impls["v4"]
    assert harness.check_impl(op, good, (x, y), torch.float32) < 1e-6
    wrong = type(good)("v9", lambda a, b: a - b, "PyTorch", "wrong on purpose")
    with pytest.raises(AssertionError, match="max abs error"):
        harness.check_impl(op, wrong, (x, y), torch.float32)


def test_compare_outputs_names_the_first_element_off():
    op = OPS["vector_add"]
    ref = torch.arange(10, dtype=torch.float64)
    out = ref.float().clone()
    out[7] += 1
    with pytest.raises(AssertionError, match=r"1 of 10 elements off, the first at index \(7,\): got 8, expected 7"):
        harness.compare_outputs(op, "v9", out, ref, torch.float32)
    out[7] = float("nan")
    with pytest.raises(AssertionError, match=r"NaN outputs, the first at \(7,\)"):
        harness.compare_outputs(op, "v9", out, ref, torch.float32)
    with pytest.raises(AssertionError, match="output dtype torch.float16"):
        harness.compare_outputs(op, "v9", ref.half(), ref, torch.float32, check_dtype=True)
    with pytest.raises(AssertionError, match="2 outputs, reference has 1"):
        harness.compare_outputs(op, "v9", (ref, ref), ref, torch.float32)
    assert harness.compare_outputs(op, "v4", ref.float(), ref, torch.float32) == 0.0


def _toy_op(**kw):
    """A throwaway op (not registered) for the harness's tuple, check and availability paths."""
    from snippets.registry import Op

    base = dict(name="toy", part=0, chapter="index.md", title="toy", reference=lambda x: (2 * x, x + 1),
                make_inputs=lambda size, dtype, device, gen: (torch.randn(size["n"], dtype=dtype, device=device),),
                bytes_moved=lambda size, dtype: 1, flops=lambda size, dtype: 1, metric="GB/s", ceiling="copy",
                headline={"n": 8}, sweep=[], dtypes=(torch.float32,), test_sizes=[{"n": 8}])
    return Op(**{**base, **kw})


def test_check_impl_compares_tuples_part_by_part():
    op = _toy_op()
    impl = type(OPS["vector_add"].impls["v0"])
    x = torch.randn(16)
    assert harness.check_impl(op, impl("v1", lambda t: (2 * t, t + 1), "PyTorch", "right"), (x,), torch.float32) < 1e-6
    with pytest.raises(AssertionError, match="output 1"):
        harness.check_impl(op, impl("v2", lambda t: (2 * t, t), "PyTorch", "second part wrong"), (x,),
                           torch.float32)
    with pytest.raises(AssertionError, match="1 outputs, reference has 2"):
        harness.check_impl(op, impl("v3", lambda t: 2 * t, "PyTorch", "one part missing"), (x,), torch.float32)


def test_check_impl_uses_the_ops_own_check():
    def nonnegative(out, args, dtype):
        if (out < 0).any():
            raise AssertionError("negative output")

    op = _toy_op(check=nonnegative)
    impl = type(OPS["vector_add"].impls["v0"])
    x = torch.randn(64)
    assert harness.check_impl(op, impl("v1", lambda t: t.abs(), "PyTorch", "valid"), (x,), torch.float32) == 0.0
    with pytest.raises(AssertionError, match="negative output"):
        harness.check_impl(op, impl("v2", lambda t: -t.abs(), "PyTorch", "invalid"), (x,), torch.float32)


def test_plan_leaves_out_unavailable_versions():
    op = _toy_op(reference=lambda x: x)
    impl = type(OPS["vector_add"].impls["v0"])
    op.add(impl("v0", lambda t: t, "PyTorch", "runs", device="any"))
    op.add(impl("v1", lambda t: t, "PyTorch", "cannot run", device="any", requires=lambda: "needs a thing"))
    assert op.impls["v1"].unavailable() == "needs a thing" and op.impls["v0"].unavailable() is None
    assert [i.name for _, _, _, i in harness.plan([op], quick=True)] == ["v0"]


def test_plan_covers_headline_and_sweep():
    op = OPS["vector_add"]
    full = harness.plan([op], quick=False)
    quick = harness.plan([op], quick=True)
    assert len(quick) == len(op.impls)  # fp32: every version once at the headline size
    keys = {size_key(s) for _, _, s, _ in full}
    assert keys == {size_key(op.headline)} | {size_key(s) for s in op.sweep}


def test_source_hash_same_with_and_without_interpreter():
    code = ("import sys; sys.path.insert(0, '.'); from snippets.registry import load_all; "
            "print(load_all()['vector_add'].impls['v4'].source_hash())")
    hashes = {subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True,
                             env={**__import__("os").environ, "TRITON_INTERPRET": flag}).stdout for flag in "01"}
    assert len(hashes) == 1, hashes


def test_library_functions_hash_by_name_and_the_book_by_its_modules():
    """A library's Python function (its text changes with the library's version, which provenance records)
    counts by name; the book's own functions by the modules they come from (snippets.hashing)."""
    import torch.nn.functional as F

    from snippets.part4.layernorm import config_for
    from snippets.registry import Impl

    a = Impl("v0", F.layer_norm, "PyTorch", "", ())
    b = Impl("v0", F.layer_norm, "PyTorch", "", (config_for,))  # a module outside the timer's closure
    c = Impl("v0", F.rms_norm, "PyTorch", "", ())
    assert a.source_hash() != b.source_hash() != c.source_hash() and a.source_hash() != c.source_hash()


def test_slug():
    assert harness.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def fake_results(tmp_path, op_name="vector_add", stale=(), gpu="Test GPU"):
    """A results file in the harness's format, with the current source hashes (except ``stale``)."""
    op = OPS[op_name]
    prov = {"gpu": gpu, "sm_count": 1, "compute_capability": "9.0", "driver": "0", "cuda_runtime": "0",
            "torch": torch.__version__, "triton": "0", "cupy": None, "date": "2026-01-01T00:00:00+00:00",
            "commit": "0" * 40, "dirty": False}
    records = []
    for size in [op.headline, *op.sweep]:
        for k, (name, impl) in enumerate(op.impls.items()):
            records.append({"impl": name, "lang": impl.lang, "desc": impl.desc, "dtype": "float32",
                            "size": dict(size), "size_key": size_key(size),
                            "headline": size_key(size) == size_key(op.headline), "ms": 1.0 / (k + 1),
                            "source_hash": "old" if name in stale else impl.source_hash()})
    ceiling = {"name": op.ceiling, "value": 1000.0, "unit": op.metric, "how": "test"}
    harness.derive(op, records, ceiling["value"])
    entry = {"part": op.part, "title": op.title, "metric": op.metric, "ceiling": ceiling, "provenance": prov,
             "records": records}
    path = tmp_path / f"{harness.slug(gpu)}.json"
    harness.merge(path, gpu, {op_name: entry}, {op.ceiling: ceiling})
    return path


def test_stale_only_picks_missing_and_stale_ops(tmp_path):
    """bench --stale-only re-measures an op with a stale version and an op never measured, not a fresh one."""
    path = fake_results(tmp_path, "vector_add")
    fake_results(tmp_path, "scale", stale=("v1",))
    ops = [OPS["vector_add"], OPS["scale"], OPS["saxpy"]]
    assert [op.name for op in harness.stale_ops(ops, "Test GPU", path)] == ["scale", "saxpy"]
    assert [op.name for op in harness.stale_ops(ops, "Test GPU", tmp_path / "none.json")] == ["vector_add", "scale",
                                                                                  "saxpy"]
    # fresh in either file (a run's own --out, or the committed results) is fresh
    assert [op.name for op in harness.stale_ops(ops, "Test GPU", tmp_path / "none.json", path)] == ["scale",
                                                                                              "saxpy"]
    # another GPU's results do not count
    assert len(harness.stale_ops(ops, "Other GPU", path)) == 3


def test_claims_split_ops_between_processes(tmp_path):
    """Two bench processes sharing a claim folder: each op is taken by exactly one of them."""
    import concurrent.futures as cf

    names = [f"op{i}" for i in range(40)]
    with cf.ProcessPoolExecutor(2) as pool:
        taken = list(pool.map(_claim_all, [(tmp_path, names)] * 2))
    assert sorted(taken[0] + taken[1]) == sorted(names)
    assert harness.claim(None, "op0")  # no folder: every op is this process's


def _claim_all(args):
    folder, names = args
    return [n for n in names if harness.claim(folder, n)]


def test_derive_rates_and_speedups(tmp_path):
    data = json.loads(fake_results(tmp_path).read_text())
    rec = {r["impl"]: r for r in data["ops"]["vector_add"]["records"] if r["headline"]}
    op = OPS["vector_add"]
    expected = op.bytes_moved(op.headline, torch.float32) / 1e-3 / 1e9  # 1 ms
    assert rec["v0"]["value"] == pytest.approx(expected)
    assert rec["v1"]["speedup_vs_v0"] == pytest.approx(2.0)
    assert rec["v0"]["fraction_of_ceiling"] == pytest.approx(expected / 1000.0)


def test_merge_replaces_an_op_and_keeps_others(tmp_path):
    fake_results(tmp_path, "vector_add")
    path = fake_results(tmp_path, "scale")
    data = json.loads(path.read_text())
    assert set(data["ops"]) == {"vector_add", "scale"}
    with pytest.raises(ValueError, match="not 'Other GPU'"):
        harness.merge(path, "Other GPU", {}, {})


def test_report_fresh_and_stale(tmp_path):
    fake_results(tmp_path, "vector_add")
    fake_results(tmp_path, "scale", stale=("v1",))
    recs = {r["op"]: r for r in report.report(tmp_path)}
    assert recs["vector_add"]["fresh"] and recs["vector_add"]["device"] == "Test GPU"
    impls = list(OPS["vector_add"].impls)  # fake_results makes the last version the fastest
    assert recs["vector_add"]["best_impl"] == impls[-1]
    assert recs["vector_add"]["speedup_vs_baseline"] == pytest.approx(len(impls))
    assert not recs["scale"]["fresh"] and recs["scale"]["stale_impls"] == ["v1"]
    assert recs["relu"]["device"] is None and not recs["relu"]["fresh"]
    keys = {"op", "part", "device", "headline_size", "best_impl", "value", "unit", "fraction_of_ceiling",
            "baseline_impl", "speedup_vs_baseline", "fresh"}
    assert keys <= set(recs["relu"])


def test_report_cli_json_runs_without_gpu(tmp_path):
    fake_results(tmp_path)
    out = subprocess.run([sys.executable, "-m", "snippets", "report", "--json", "--results", str(tmp_path)],
                         capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    data = json.loads(out.stdout)
    assert {r["op"] for r in data["results"]} == set(OPS)
    assert data["stale_captures"] == []  # no outputs/ in this results folder


def test_bench_without_gpu_says_why(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        harness.run(["vector_add"])


def test_render_table_and_stale_mark(tmp_path):
    fake_results(tmp_path, "scale", stale=("v1",))
    md = site.render_page("x\n\n<!-- bench:table scale -->\n\ny\n", "p.md", tmp_path)
    assert "| **v0**&nbsp;PyTorch" in md and 'bench-lib">library</span>' in md  # v0 is marked a library's
    rows = {line.split("&nbsp;")[0]: line for line in md.splitlines() if line.startswith("| **v")}
    assert 'bench-stale">stale</span>' in rows["| **v1**"] and "bench-stale" not in rows["| **v0**"]
    # the provenance footnote goes to the end of the page, after the paragraph that follows the table
    assert md.index("[^bench-scale-test-gpu]:") > md.index("\ny\n")
    missing = site.render_page("<!-- bench:table relu -->\n", "p.md", tmp_path)
    assert "Not measured yet" in missing


def test_render_table_other_dtype_and_peak_memory(tmp_path):
    path = fake_results(tmp_path, "scale")
    data = json.loads(path.read_text())
    recs = data["ops"]["scale"]["records"]
    extra = [{**r, "dtype": "bfloat16", "ms": r["ms"] * 2, "peak_extra_bytes": 3 * 2**20} for r in recs]
    data["ops"]["scale"]["records"] = recs + extra
    path.write_text(json.dumps(data))
    default = site.render_page("<!-- bench:table scale -->\n", "p.md", tmp_path)
    assert "float32" in default and "bfloat16" not in default and "extra memory" not in default
    bf16 = site.render_page("<!-- bench:table scale dtype=bfloat16 -->\n", "p.md", tmp_path)
    assert "bfloat16" in bf16 and "| extra memory |" in bf16 and "| 3.0 MiB |" in bf16
    none = site.render_page("<!-- bench:table scale dtype=float16 -->\n", "p.md", tmp_path)
    assert "Not measured yet" in none
    plot = site.render_page("<!-- bench:plot scale dtype=bfloat16 -->\n", "p.md", tmp_path)
    assert "<svg" in plot and "bfloat16" in plot


def test_render_table_sets_a_versions_memory_apart(tmp_path):
    """memory-apart=: a version whose peak-memory measure does not compare (a CUDA graph keeps its pool
    between calls) shows no number, with a note saying why; a name the op does not have is refused."""
    path = fake_results(tmp_path, "scale")
    data = json.loads(path.read_text())
    data["ops"]["scale"]["records"] = [{**r, "peak_extra_bytes": (i + 1) * 2**20}
                                       for i, r in enumerate(data["ops"]["scale"]["records"])]
    path.write_text(json.dumps(data))
    md = site.render_page("<!-- bench:table scale memory-apart=v1 -->\n", "p.md", tmp_path)
    rows = {line.split("&nbsp;")[0]: line for line in md.splitlines() if line.startswith("| **v")}
    assert rows["| **v1**"].endswith("| not comparable |") and rows["| **v0**"].endswith(" MiB |")
    assert "Extra memory of v1: not comparable" in md and "this version keeps" in md
    with pytest.raises(ValueError, match="memory-apart= names versions scale does not have: v9"):
        site.render_page("<!-- bench:table scale memory-apart=v9 -->\n", "p.md", tmp_path)


def test_plot_draws_one_line_per_series_of_the_sweep(tmp_path):
    op = OPS["flash_attention_fwd"]
    assert site._series_keys(op) == ["causal", "d"]
    assert site._series_keys(OPS["softmax"]) == [] and site._series_keys(OPS["vector_add"]) == []
    assert "causal = False" in site._fmt_size({"causal": False, "s": 4096})
    fake_results(tmp_path, "flash_attention_fwd")
    plot = site.render_page("<!-- bench:plot flash_attention_fwd dtype=float32 -->\n", "p.md", tmp_path)
    assert "<svg" in plot
    table = site.render_page("<!-- bench:table flash_attention_fwd sizes=all dtype=float32 -->\n", "p.md", tmp_path)
    # the sweep's pivot labels a size the way a paper writes it: a set flag by its name, never as a number
    pivot = table[table.index("Every size measured"):]
    assert "| B4 H32 S4096 D128 causal |" in pivot and "| B4 H32 S4096 D128 |" in pivot
    assert "causal = 1" not in table and "causal=1" not in table


@pytest.mark.gpu
def test_time_device_hides_host_gaps_inside_a_call():
    """A call of two launches with 2 ms of host work between them: the GPU does microseconds of work, and the
    device timer must report that, not the host's gap (the host queues calls ahead of the GPU)."""
    import time

    from snippets.bench.timing import time_device

    x = torch.zeros(1024, device="cuda")

    def two_launches_and_host_work(x):
        x.add_(1)
        time.sleep(0.002)
        x.add_(1)

    t = time_device(two_launches_and_host_work, [(x,)], budget_ms=50)
    assert t.median < 0.5, t  # the gap is 2 ms; two tiny kernels take a few microseconds
    assert x[0].item() == 2 * (t.reps + 4)  # every call ran (3 warm-up calls and the probe, then the timed ones)


@pytest.mark.gpu
def test_peak_extra_bytes_counts_temporaries():
    x = torch.randn(2**20, device="cuda")  # 4 MiB input
    assert harness.peak_extra_bytes(lambda t: t * 2, (x,)) >= x.nbytes  # the output
    assert harness.peak_extra_bytes(lambda t: (t * 2 + 1).sum(), (x,)) >= x.nbytes  # a temporary


def test_render_plot_is_inline_svg(tmp_path):
    fake_results(tmp_path, "vector_add")
    md = site.render_page("<!-- bench:plot vector_add -->\n", "p.md", tmp_path)
    body = md.strip("\n")
    assert body.startswith('<figure class="bench-plot">') and "<svg" in body and "\n\n" not in body


def test_render_summary_and_unknown(tmp_path):
    fake_results(tmp_path, "vector_add")
    md = site.render_page("<!-- bench:summary -->\n", "p.md", tmp_path)
    assert "[`vector_add`](part1/elementwise.md)" in md and "not measured" in md
    with pytest.raises(ValueError, match="unknown op"):
        site.render_page("<!-- bench:table nope -->\n", "p.md", tmp_path)


def test_render_output(tmp_path):
    (tmp_path / "outputs" / "test-gpu").mkdir(parents=True)
    (tmp_path / "outputs" / "test-gpu" / "device_query.txt").write_text("sm_count: 1\n")
    md = site.render_page("<!-- bench:output device_query -->\n", "p.md", tmp_path)
    assert "sm_count: 1" in md and "test-gpu" in md


def _cells(line: str) -> list[str]:
    return [c for c in re.split(r"  +", line.strip()) if c]


def test_wide_capture_tables_are_cut_into_column_groups(tmp_path):
    from snippets.site.tables import split_wide_tables

    cols = [f"launch {i}" for i in range(12)]
    header = "counter   " + "  ".join(c.rjust(12) for c in cols)
    rule = "-" * 8 + "  " + "  ".join("-" * 12 for _ in cols)
    rows = [f"row {r}     " + "  ".join(f"{r * 100 + i:>12}" for i in range(12)) for r in range(3)]
    cmd = "$ ncu " + " ".join(f"--section S{i}" for i in range(20)) + " python3 x.py"
    text = "\n".join(["title", cmd, "", rule, header, rule, *rows, rule, "total: 1 ms", "", "narrow  table",
                      "------  -----", "a       b"])
    out = split_wide_tables(text, width=60).splitlines()
    assert max(len(line) for line in out) <= 60
    # the command: continuation lines, the same words in order
    wrapped = out[1:out.index("")]
    assert all(line.endswith(" \\") for line in wrapped[:-1]) and len(wrapped) > 2
    assert " ".join(w for line in wrapped for w in line.split() if w != "\\") == cmd
    # the table: every part repeats the first column, and the parts' cells in order are the row's
    heads = [i for i, line in enumerate(out) if line.startswith("counter")]
    assert len(heads) == 4  # 12 columns of 14 characters in 60: 3 per part (plus the first column)
    for r, row in enumerate(rows):
        got = [c for line in out if line.startswith(f"row {r}") for c in _cells(line)[1:]]
        assert got == _cells(row)[1:] and sum(line.startswith(f"row {r}") for line in out) == 4
    assert out.count("total: 1 ms") == 1  # after the closing rule: once, whole
    assert out[out.index("total: 1 ms") - 1] == "-" * 8 + "  " + "  ".join("-" * 12 for _ in range(3))
    assert out[-3:] == ["narrow  table", "------  -----", "a       b"]  # narrow: untouched
    # a committed capture keeps every cell of every row
    path = next(iter(sorted(Path("benchmarks/results/outputs").glob("*/ncu_counters_rows.txt"))), None)
    if path is not None:
        orig = path.read_text().splitlines()
        cut = split_wide_tables(path.read_text()).splitlines()
        for line in orig:
            if line.startswith(("time (us)", "registers per thread")):
                label = line[:32].strip()
                parts = [c for ln in cut if ln.startswith(label) for c in _cells(ln[32:])]
                assert parts == _cells(line[32:])


@pytest.mark.gpu
@pytest.mark.op("vector_add")
def test_bench_end_to_end_on_gpu(tmp_path):
    import io

    from rich.console import Console

    out, log = tmp_path / "r.json", io.StringIO()
    harness.run(["vector_add"], quick=True, out=out, console=Console(file=log, width=200))
    data = json.loads(out.read_text())
    recs = data["ops"]["vector_add"]["records"]
    assert {r["impl"] for r in recs} == set(OPS["vector_add"].impls)
    for r in recs:  # one line per job
        assert f"vector_add {r['impl']} {r['dtype']} {r['size_key']}: " in log.getvalue()
    assert all(r["value"] > 0 and 0 < r["fraction_of_ceiling"] < 2 for r in recs)
    assert data["ceilings"]["copy"]["value"] > 100
    # measured now, so fresh: --stale-only finds nothing left to do
    harness.run(["vector_add"], quick=True, out=out, console=Console(file=log, width=200), stale_only=True)
    assert "stale or missing in r.json: none" in log.getvalue()
    assert json.loads(out.read_text())["ops"]["vector_add"]["records"] == recs


def test_latency_metric_has_no_ceiling_and_lower_is_better(tmp_path):
    """An ns/access micro-benchmark: value = time / accesses, no ceiling, the smallest value is the best."""
    from snippets.registry import Op

    chase = Op(name="fake_chase", part=9, chapter="x.md", title="Fake chase", reference=lambda x: x,
               make_inputs=lambda s, d, dev, g: (torch.zeros(1),), bytes_moved=lambda s, d: 8 * s["iters"],
               flops=lambda s, d: 0, metric="ns/access", ceiling=None, headline={"iters": 1000},
               sweep=[{"iters": 1000}], dtypes=(torch.float32,), test_sizes=[{"iters": 1}],
               accesses=lambda s, d: s["iters"], kind="micro")
    records = [{"impl": name, "lang": "CUDA", "desc": name, "dtype": "float32", "size": {"iters": 1000},
                "size_key": "iters=1000", "headline": True, "ms": ms, "source_hash": "h"}
               for name, ms in (("v1", 0.5), ("v2", 0.25))]
    harness.derive(chase, records, None)
    assert records[0]["value"] == pytest.approx(500.0) and records[1]["value"] == pytest.approx(250.0)
    assert records[0]["fraction_of_ceiling"] is None and records[0]["speedup_vs_v0"] is None
    entry = {"part": 9, "title": "Fake chase", "metric": "ns/access", "ceiling": None, "records": records,
             "provenance": {"date": "d", "commit": "c"}}
    rec = report.summarise(chase, "Test GPU", entry)
    assert rec["best_impl"] == "v2" and rec["fraction_of_ceiling"] is None
    with pytest.raises(ValueError, match="latency"):
        Op(**{**chase.__dict__, "metric": "GB/s", "impls": {}})
    with pytest.raises(ValueError, match="accesses"):
        Op(**{**chase.__dict__, "accesses": None, "impls": {}})
