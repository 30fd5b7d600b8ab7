"""The roofline: intensities from the cost models, the ridge point, the points placed from results
(snippets.bench.roofline), and the rendering with the committed results and with none
(snippets.site.roofline)."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from snippets.bench import roofline as rl
from snippets.bench.report import load_results
from snippets.op_index import get_op, load_all
from snippets.registry import dtype_name, size_key
from snippets.site import roofline as site_rl

OPS = load_all()


# ---------------------------------------------------------------- the model

def test_intensity_of_vector_add():
    """One add per element; two 4-byte reads and one 4-byte write: 1/12 FLOP per byte, at any n."""
    for n in (1, 1000, 2**28):
        assert rl.arithmetic_intensity(OPS["vector_add"], {"n": n}, torch.float32) == pytest.approx(1 / 12)
    assert rl.arithmetic_intensity("vector_add") == pytest.approx(1 / 12)  # by name, at the headline size


def test_intensity_of_sgemm_4096():
    n = 4096
    expected = 2 * n**3 / (3 * n**2 * 4)  # 2 N^3 FLOPs over A, B and C crossing memory once: N / 6
    assert rl.arithmetic_intensity(OPS["sgemm"], {"m": n, "n": n, "k": n}, torch.float32) == pytest.approx(expected)
    assert expected == pytest.approx(n / 6)


def test_intensity_is_flops_over_bytes_for_every_op():
    for op in OPS.values():
        dtype = op.timed_dtypes()[0]
        ai = rl.arithmetic_intensity(op)
        assert ai == op.flops(op.headline, dtype) / op.bytes_moved(op.headline, dtype), op.name
        assert ai >= 0


def test_ridge_point_and_roof():
    peak, bw = 50e12, 4e12  # 50 TFLOP/s, 4 TB/s
    ridge = rl.ridge_point(peak, bw)
    assert ridge == pytest.approx(12.5)
    assert rl.attainable(ridge, peak, bw) == pytest.approx(peak)  # the two roofs meet at the ridge
    assert rl.attainable(1 / 12, peak, bw) == pytest.approx(bw / 12)  # below it: bandwidth x intensity
    assert rl.attainable(1000, peak, bw) == peak  # above it: the compute roof
    assert rl.attainable(ridge / 2, peak, bw) == pytest.approx(peak / 2)


def test_compute_roof_follows_the_dtype_or_the_ops_own_gemm_ceiling():
    assert rl.compute_roof(OPS["vector_add"], "float32") == "gemm_fp32"
    assert rl.compute_roof(OPS["vector_add"], "float16") == "gemm_fp16"
    assert rl.compute_roof(OPS["vector_add"], "bfloat16") == "gemm_bf16"
    assert rl.compute_roof(OPS["vector_add"], "int32") is None
    assert rl.compute_roof(OPS["sgemm"], "float32") == "gemm_fp32"


# ---------------------------------------------------------------- points from (synthetic) results

def _record(op, impl, ms, dtype=None, size=None):
    dtype = dtype or op.timed_dtypes()[0]
    size = size or op.headline
    return {"impl": impl, "lang": op.impls[impl].lang, "desc": op.impls[impl].desc, "dtype": dtype_name(dtype),
            "size": dict(size), "size_key": size_key(size), "headline": size_key(size) == size_key(op.headline),
            "ms": ms, "timer": op.impls[impl].timer, "source_hash": op.impls[impl].source_hash(),
            "value": op.rate(size, dtype, ms), "unit": op.metric, "fraction_of_ceiling": 0.5, "speedup_vs_v0": 1.0}


def _entry(op, records, ceiling="copy"):
    prov = {"gpu": "Test GPU", "date": "2026-01-01T00:00:00+00:00", "commit": "0" * 40}
    return {"part": op.part, "title": op.title, "metric": op.metric, "provenance": prov, "records": records,
            "ceiling": {"name": ceiling, "value": 1.0, "unit": "GB/s", "how": "test"} if ceiling else None}


def synthetic_results():
    va, sg, tr, pc = OPS["vector_add"], OPS["sgemm"], OPS["transpose"], OPS["pointer_chase"]
    ceilings = {"copy": {"value": 4000.0, "unit": "GB/s", "how": "test"},
                "gemm_fp32": {"value": 50.0, "unit": "TFLOP/s", "how": "test"},
                "gemm_tf32": {"value": 400.0, "unit": "TFLOP/s", "how": "test"}}
    va_bytes = va.bytes_moved(va.headline, torch.float32)
    ops = {
        # v0 is the fastest, but the point is the book's own best (v3 here); an off-headline record is ignored.
        "vector_add": _entry(va, [_record(va, "v0", 0.5), _record(va, "v1", 2.0), _record(va, "v3", va_bytes / 2e9),
                                  _record(va, "v3", 1e-6, size={"n": 2**20})]),
        # the CPU version v10 is faster than nothing here: it must never be the point
        "sgemm": _entry(sg, [_record(sg, "v0", 2.0), _record(sg, "v8", 4.0), _record(sg, "v10", 1.0)],
                        ceiling="gemm_fp32"),
        "transpose": _entry(tr, [_record(tr, "v0", 1.0), _record(tr, "v6", 0.8)]),
        "pointer_chase": _entry(pc, [_record(pc, "v1", 100.0)], ceiling=None),
        "no_such_op": {"records": []},  # an op removed from the registry since it was measured
    }
    return {"Test GPU": {"schema": 1, "gpu": "Test GPU", "ceilings": ceilings, "ops": ops}}


def test_points_from_synthetic_results():
    g = rl.roofline_points(synthetic_results())["Test GPU"]
    assert g["bandwidth"] == pytest.approx(4000e9)
    assert g["roofs"] == {"gemm_fp32": pytest.approx(50e12), "gemm_tf32": pytest.approx(400e12)}
    by_op = {p["op"]: p for p in g["points"]}
    assert set(by_op) == {"vector_add", "sgemm"}  # transpose: no FLOPs; pointer_chase: a latency

    va = by_op["vector_add"]
    assert va["impl"] == "v3"
    assert va["ai"] == pytest.approx(1 / 12)
    assert va["bytes_per_s"] == pytest.approx(2e12)  # bytes / (bytes / 2e9 ms)
    assert va["flops_per_s"] == pytest.approx(2e12 / 12)
    assert va["roof"] == "gemm_fp32" and va["ridge"] == pytest.approx(12.5)
    assert va["bound"] == "memory"
    assert va["fraction_of_roof"] == pytest.approx(0.5)  # 2 TB/s of a 4 TB/s roof

    sg = by_op["sgemm"]
    assert sg["impl"] == "v8"  # not v0 (the library), not v10 (the CPU)
    n = OPS["sgemm"].headline["m"]
    assert sg["ai"] == pytest.approx(n / 6)
    assert sg["flops_per_s"] == pytest.approx(2 * n**3 / 4e-3)
    assert sg["bound"] == "compute"
    assert sg["fraction_of_roof"] == pytest.approx(2 * n**3 / 4e-3 / 50e12)


def test_zero_flop_ops_are_listed_apart():
    g = rl.roofline_points(synthetic_results())["Test GPU"]
    assert [p["op"] for p in g["bandwidth_only"]] == ["transpose"]
    tr = g["bandwidth_only"][0]
    assert tr["impl"] == "v6" and tr["ai"] == 0
    assert tr["bytes_per_s"] == pytest.approx(OPS["transpose"].bytes_moved(OPS["transpose"].headline,
                                                                              torch.float32) / 0.8e-3)


def test_missing_roofs_leave_the_bound_open():
    results = synthetic_results()
    del results["Test GPU"]["ceilings"]["gemm_fp32"]
    g = rl.roofline_points(results)["Test GPU"]
    va = next(p for p in g["points"] if p["op"] == "vector_add")
    assert va["roof"] == "gemm_fp32" and va["peak"] is None and va["bound"] is None and va["fraction_of_roof"] is None
    text = site_rl.render_roofline(results)
    assert "cuBLAS fp32 (not measured)" in text


def test_render_synthetic_results():
    text = site_rl.render_roofline(synthetic_results())
    assert text.count("<svg") == 1
    assert "[`vector_add`](../part1/elementwise.md)" in text
    assert "[`transpose`](../part2/transpose.md)" in text  # in the bandwidth-only list
    assert "off the device-memory roofline" in text
    row = next(line for line in text.splitlines() if line.startswith("| 1 | [`vector_add`]"))
    assert "| memory |" in row and "50.0%" in row


# ---------------------------------------------------------------- the committed results

COMMITTED = load_results()


def _measured_rate_ops(results):
    names = set()
    for data in results.values():
        for name, entry in data["ops"].items():
            op = OPS.get(name)
            if op is None or op.metric not in rl.RATE_METRICS:
                continue
            if any(r["headline"] and r["impl"] in op.impls and op.impls[r["impl"]].device != "cpu"
                   and r["dtype"] == dtype_name(op.timed_dtypes()[0]) for r in entry["records"]):
                names.add(name)
    return names


@pytest.mark.skipif(not COMMITTED, reason="no committed results in benchmarks/results")
def test_render_committed_results_names_every_measured_op():
    text = site_rl.render_roofline(COMMITTED)
    measured = _measured_rate_ops(COMMITTED)
    assert measured, "the committed results hold no rate measurement"
    assert text.count("<svg") == len([g for g in rl.roofline_points(COMMITTED).values() if g["points"]])
    plotted = {p["op"] for g in rl.roofline_points(COMMITTED).values() for p in g["points"] + g["bandwidth_only"]}
    assert plotted == measured
    body = text.split("**Arithmetic intensity of every op")[0]  # the per-GPU part, not the intensity table
    for name in measured:
        assert f"[`{name}`]" in body, name
    assert "Not measured yet" not in text
    # Every percentage of a roof is a number a reader can check against the table's own columns.
    for p in (p for g in rl.roofline_points(COMMITTED).values() for p in g["points"]):
        assert p["fraction_of_roof"] is None or 0 < p["fraction_of_roof"] < 1.5, p


def test_render_without_results():
    text = site_rl.render_roofline({})
    assert "Not measured yet" in text
    assert "<svg" not in text
    for name, op in OPS.items():
        assert f"[`{name}`](../{op.chapter})" in text, name


def test_intensity_table_lists_every_op_with_its_intensity():
    table = site_rl.render_intensity_table()
    rows = [line for line in table.splitlines() if line.startswith("| [`")]
    assert len(rows) == len(OPS)
    for row in rows:
        name = re.match(r"\| \[`(\w+)`\]", row).group(1)
        ai = rl.arithmetic_intensity(OPS[name])
        cell = row.split("|")[6].strip()
        if ai == 0:
            assert cell == "0", row
        else:
            assert float(cell) == pytest.approx(ai, rel=5e-3), row


def test_results_are_not_modified():
    results = synthetic_results()
    before = copy.deepcopy(results)
    site_rl.render_roofline(results)
    assert results == before


def test_op_by_name_must_exist():
    with pytest.raises(KeyError, match="unknown op"):
        rl.arithmetic_intensity("no_such_op")
    assert get_op("sgemm") is OPS["sgemm"]
