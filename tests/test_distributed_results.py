"""Part 7's multi-GPU results (snippets/bench/distributed.py) and their rendering on the site
(snippets/site/distributed.py): a run is filed with its provenance and the hash of its code, goes
stale when that code changes, refuses a CPU dry run, and renders its tables, goals and the world
sizes not measured yet. The committed results render too."""

from __future__ import annotations

import json
import re

import pytest

from snippets.bench import distributed as dr
from snippets.registry import REPO_ROOT
from snippets.site.distributed import render_dist
from snippets.site.page import render_page

GIB, MIB, KIB = 1 << 30, 1 << 20, 1 << 10


def _prov(gpu="NVIDIA H200", world=2):
    return {"backend": "nccl", "world_size": world, "gpu": gpu, "torch": "2.11.0", "nccl": "2.28.9",
            "python": "3.12", "topology": "GPU0\tX\tNV18\n", "date": "2026-11-26T00:00:00Z"}


def _sweep(alpha=20e-6, beta=300e9):
    recs = [{"op": "all_reduce", "bytes": n, "world_size": 2, "seconds": alpha + n / beta,
             "algbw": n / (alpha + n / beta), "busbw": n / (alpha + n / beta)}
            for n in (KIB, MIB, GIB)]
    fits = [{"op": "all_reduce", "alpha_s": alpha, "beta_bytes_per_s": beta, "max_rel_error": 0.0}]
    return {"provenance": _prov(), "records": recs, "fits": fits}


def _fast(ring_ratio=0.95, one_shot_ratio=0.5):
    recs = []
    for n in (MIB, 256 * MIB):
        t = 1e-3 * n / (256 * MIB)
        recs.append({"impl": "nccl", "bytes": n, "seconds": t, "busbw": n / t})
        recs.append({"impl": "ring/pieces=4", "bytes": n, "seconds": t / ring_ratio,
                     "busbw": ring_ratio * n / t})
    for n in (4 * KIB, 256 * KIB):
        recs.append({"impl": "nccl", "bytes": n, "seconds": 20e-6, "busbw": n / 20e-6})
        recs.append({"impl": "one_shot", "bytes": n, "seconds": 20e-6 * one_shot_ratio,
                     "busbw": n / (20e-6 * one_shot_ratio)})
        recs.append({"impl": "torch_one_shot", "bytes": n, "skipped": "missing"})
    return {"provenance": _prov(), "records": recs}


@pytest.fixture
def filed(tmp_path):
    out, results = tmp_path / "out", tmp_path / "results"
    out.mkdir()
    (out / "sweep.json").write_text(json.dumps(_sweep()))
    (out / "fast_allreduce.json").write_text(json.dumps(_fast()))
    (out / "topology.txt").write_text("\x1b[4mGPU0\x1b[0m\tX\tNV18\n")
    path = dr.record(out, "abc1234", REPO_ROOT, results / "distributed")
    return path, results


def test_record_files_provenance_and_hash(filed):
    path, _ = filed
    assert path.name == "nvidia-h200-x2.json"
    data = json.loads(path.read_text())
    assert data["world_size"] == 2 and data["topology"] == "GPU0\tX\tNV18\n"   # escapes gone
    assert set(data["runs"]) == {"sweep", "fast_allreduce"}
    for run in data["runs"]:
        assert data["runs"][run]["source_hash"] == dr.source_hash(run)
        assert dr.fresh(run, data["runs"][run])
        assert not dr.fresh(run, {**data["runs"][run], "source_hash": "0" * 16})


def test_a_cpu_dry_run_is_not_a_result(tmp_path):
    (tmp_path / "sweep.json").write_text(json.dumps(
        {**_sweep(), "provenance": {**_prov(), "gpu": None, "backend": "gloo"}}))
    with pytest.raises(ValueError, match="CPU dry run"):
        dr.record(tmp_path, "abc", REPO_ROOT, tmp_path / "d")


def test_tables_goals_and_missing_world_sizes(filed):
    _, results = filed
    sweep = render_dist(["sweep", "all_reduce"], results)
    assert sweep.count("\n| ") == 4 and "**met**" in sweep and "(stale)" not in sweep
    assert "Not measured yet on 4 GPUs" in sweep
    ring = render_dist(["ring"], results)
    assert "95.0%, **met**" in ring
    one = render_dist(["one_shot"], results)
    assert "0.50x, **met**" in one and "| – |" in one     # the skipped library baseline
    assert "NV18" in render_dist(["topology"], results)
    with pytest.raises(ValueError, match="topology, sweep OP"):
        render_dist(["nope"], results)


def test_a_missed_goal_says_so(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "fast_allreduce.json").write_text(json.dumps(_fast(ring_ratio=0.8,
                                                              one_shot_ratio=1.2)))
    dr.record(out, "abc", REPO_ROOT, tmp_path / "r" / "distributed")
    assert "80.0%, **not met**" in render_dist(["ring"], tmp_path / "r")
    assert "1.20x, **not met**" in render_dist(["one_shot"], tmp_path / "r")


def test_footnotes_are_unique_per_directive_on_a_page(filed):
    _, results = filed
    page = render_page("<!-- bench:dist ring -->\n\n<!-- bench:dist one_shot -->\n", "p.md",
                       results)
    labels = re.findall(r"^\[\^([\w-]+)\]:", page, re.M)
    assert len(labels) == 2 and len(set(labels)) == 2


def test_committed_results_render():
    for what in (["topology"], ["sweep", "all_reduce"], ["ring"], ["one_shot"], ["pipeline"]):
        assert render_dist(what, REPO_ROOT / "benchmarks" / "results").strip()


def test_scaling_runs_filed_and_rendered(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    base = {"config": "1b", "batch_per_rank": 4, "seq": 2048, "torch": "2.11",
            "gpu": "NVIDIA H200", "date": "2026-11-26T00:00:00Z", "flops_per_token": 7e9,
            "peak_from": "measured cuBLAS bf16"}
    runs = {"single": (1, 10000.0, None), "ddp_book": (4, 37000.0, None),
            "ddp_torch": (4, 38000.0, None), "fsdp2": (4, 30000.0, 0.45)}
    for mode, (world, tps, mfu) in runs.items():
        rec = {**base, "mode": mode, "world_size": world, "tokens_per_s": tps,
               "seconds_per_step": world * 4 * 2048 / tps, "mfu": mfu}
        (out / f"scaling_{mode}.json").write_text(json.dumps(rec))
    path = dr.record(out, "abc", REPO_ROOT, tmp_path / "r" / "distributed")
    assert path.name == "nvidia-h200-x4.json"
    text = render_dist(["scaling"], tmp_path / "r")
    assert "92.5%, **met**" in text          # 37000 / (4 x 10000)
    assert "45.0%, **met**" in text and "FSDP2 (library)" in text
    assert "Not measured yet on 2 GPUs" in text


def test_tp_overlap_filed_and_rendered(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    recs = [{"sp": False, "variant": v, "chunks": c, "seconds": t}
            for v, c, t in (("compute", 1, 4e-3), ("comm", 1, 2e-3), ("tp", 1, 6e-3),
                            ("overlap", 4, 4.8e-3))]
    recs.append({"sp": False, "variant": "async_tp", "chunks": 1, "skipped": "needs CUDA"})
    hidden = [{"sp": False, "variant": "tp", "chunks": 1, "hidden_fraction": 0.0},
              {"sp": False, "variant": "overlap", "chunks": 4, "hidden_fraction": 0.6}]
    data = {"provenance": _prov(), "records": recs, "hidden": hidden,
            "config": {"tokens": 8192, "hidden": 8192, "ffn": 28672, "dtype": "bfloat16"}}
    (out / "tp_overlap.json").write_text(json.dumps(data))
    dr.record(out, "abc", REPO_ROOT, tmp_path / "r" / "distributed")
    text = render_dist(["tp_overlap"], tmp_path / "r")
    assert "best 60% (chunked overlap (book), TP, 4 chunks), **met**." in text
    assert "| 60% |" in text and "needs CUDA" in text
    assert "no better than no overlap" not in text      # the unoverlapped block hides 0%
