"""The goal lines of Part 7's scaling table (snippets/site/distributed.py) when the machine
measured has fewer GPUs than the goals are set for: the verdict is given for the world size
measured, says so, and says the goal's own world size is not measured yet; at that world size the
line is the plain verdict. A stale run's numbers show, but its verdicts read stale. The committed
results carry a verdict (or a stale mark) for every goal they measure.

The pipeline's table: 1F1B's goal, its measured bubble within 10% of (p - 1) / (m + p - 1) on
either side, met or not met on hand-made records; no recorded run renders as not measured yet."""

from __future__ import annotations

import json
import re

import pytest

from snippets.bench import distributed as dr
from snippets.registry import REPO_ROOT
from snippets.site.distributed import (
    PIPELINE_GOAL,
    SCALING_GOAL_GPUS,
    pipeline_goal_met,
    render_dist,
)


def _file_scaling(tmp_path, world: int, book_tps: float, fsdp_mfu: float):
    out = tmp_path / "out"
    out.mkdir()
    base = {"config": "1b", "batch_per_rank": 4, "seq": 2048, "torch": "2.11",
            "gpu": "NVIDIA H200", "date": "2026-11-26T00:00:00Z", "flops_per_token": 7e9,
            "peak_from": "measured cuBLAS bf16"}
    runs = {"single": (1, 10000.0, None), "ddp_book": (world, book_tps, None),
            "fsdp2": (world, 1.1 * book_tps, fsdp_mfu)}
    for mode, (w, tps, mfu) in runs.items():
        rec = {**base, "mode": mode, "world_size": w, "tokens_per_s": tps,
               "seconds_per_step": w * 4 * 2048 / tps, "mfu": mfu}
        (out / f"scaling_{mode}.json").write_text(json.dumps(rec))
    dr.record(out, "abc", REPO_ROOT, tmp_path / "r" / "distributed")
    return render_dist(["scaling"], tmp_path / "r")


@pytest.mark.parametrize("book_tps, weak, verdict", [(17400.0, "87.0%", "not met"),
                                                     (18600.0, "93.0%", "met")])
def test_two_gpus_give_a_verdict_for_two(tmp_path, book_tps, weak, verdict):
    text = _file_scaling(tmp_path, 2, book_tps, 0.45 if verdict == "met" else 0.35)
    assert SCALING_GOAL_GPUS == 4
    assert (f"from 1 to 2 GPUs: {weak}, **{verdict} on 2 GPUs**; 4 GPUs not measured yet."
            in text)
    mfu = "45.0%" if verdict == "met" else "35.0%"
    assert f"on 2 GPUs: {mfu}, **{verdict} on 2 GPUs**; 4 GPUs not measured yet." in text
    assert "Not measured yet on 4 GPUs" in text


def test_four_gpus_give_the_plain_verdict(tmp_path):
    text = _file_scaling(tmp_path, 4, 35000.0, 0.41)     # 35000 / (4 x 10000)
    assert "GPUs at \\(\\ge\\) 90%: 87.5%, **not met**." in text
    assert "40% MFU: 41.0%, **met**." in text
    assert "not measured yet." not in text.split("Not measured yet")[0]


def test_a_stale_run_judges_nothing(tmp_path):
    """The same filed run, once its code's hash no longer matches: the value stays, the verdict
    becomes stale (saying what it was), for the plain and the fewer-GPUs forms alike."""
    for world, book_tps in ((4, 35000.0), (2, 18600.0)):
        (tmp_path / f"w{world}").mkdir()
        fresh_text = _file_scaling(tmp_path / f"w{world}", world, book_tps, 0.41)
        path = tmp_path / f"w{world}" / "r" / "distributed" / f"nvidia-h200-x{world}.json"
        data = json.loads(path.read_text())
        data["runs"]["scaling"]["source_hash"] = "0" * 16
        path.write_text(json.dumps(data))
        text = render_dist(["scaling"], tmp_path / f"w{world}" / "r")
        assert "**met" in fresh_text and "**stale**" not in fresh_text
        assert "**stale** (" in text and not re.search(r"\*\*(not )?met", text)
        where = "" if world == 4 else " on 2 GPUs"
        assert f"41.0%, **stale** (met{where} when measured)" in text


def test_committed_results_state_every_goal():
    results = REPO_ROOT / "benchmarks" / "results"
    machines = dr.load(results / "distributed")
    for what, run in ((["sweep", "all_reduce"], "sweep"), (["ring"], "fast_allreduce"),
                      (["one_shot"], "fast_allreduce"), (["scaling"], "scaling"),
                      (["tp_overlap"], "tp_overlap"), (["pipeline"], "pipeline")):
        if any(run in m["runs"] for m in machines):
            text = render_dist(what, results)
            assert re.search(r"\*\*((not )?met\b|stale\*\*)", text), what


def _file_pipeline(tmp_path, world: int, one_f_one_b: float, gpipe: float = 0.2) -> str:
    out = tmp_path / "out"
    out.mkdir()
    m = 8
    formula = (world - 1) / (m + world - 1)
    shape = {"p": world, "m": m, "dim": 2048, "blocks": 8 * world, "seq_len": 512,
             "micro_batch_size": 4, "dtype": "float32", "steps": 6, "warmup_steps": 1,
             "delay_ms": 0.0, "formula": formula, "seconds_per_step_median": 1.25}
    recs = [{**shape, "schedule": name, "bubble_median": b, "bubble_all": [0.5] + [b] * 5}
            for name, b in (("gpipe", gpipe), ("1f1b", one_f_one_b))]
    prov = {"backend": "nccl", "world_size": world, "gpu": "NVIDIA H200", "torch": "2.11.0",
            "nccl": "2.28.9", "python": "3.12", "topology": "GPU0\tX\n",
            "date": "2026-11-26T00:00:00Z"}
    (out / "pipeline.json").write_text(json.dumps({"records": recs, "provenance": prov}))
    dr.record(out, "abc", REPO_ROOT, tmp_path / "r" / "distributed")
    return render_dist(["pipeline"], tmp_path / "r")


@pytest.mark.parametrize("bubble, shown, verdict", [
    (0.120, "0.120 against 0.111, +8.0%, **met**", "met"),            # 1/9 + 8%
    (0.105, "0.105 against 0.111, -5.5%, **met**", "met"),            # below the formula
    (0.125, "0.125 against 0.111, +12.5%, **not met**", "not met"),
    (0.095, "0.095 against 0.111, -14.5%, **not met**", "not met")])
def test_pipeline_goal_on_either_side_of_the_formula(tmp_path, bubble, shown, verdict):
    text = _file_pipeline(tmp_path, 2, bubble)
    assert PIPELINE_GOAL == 0.10
    assert pipeline_goal_met(bubble, 1 / 9) == (verdict == "met")
    assert f"Goal: 1F1B's bubble within 10% of its formula (p = 2, m = 8): {shown}." in text
    assert text.count("Goal:") == 1                       # GPipe has no goal
    assert f"| 1f1b | 2 | 8 | 1250.0 | {bubble:.3f} | 0.111 |" in text
    assert "| gpipe | 2 | 8 | 1250.0 | 0.200 | 0.111 | 1.80 |" in text
    assert "16 transformer blocks of width 2048, 8 per stage" in text
    assert "Medians over steps 2 to 6 (the first is a warm-up)" in text
    assert "[^dist-pipeline-nvidia-h200-x2]: Measured by `python -m snippets.part7.pipeline`" \
        in text
    assert "Not measured yet on 4 GPUs" in text


def test_pipeline_goal_at_its_edge():
    assert pipeline_goal_met(0.1099, 0.10) and pipeline_goal_met(0.0901, 0.10)
    assert not pipeline_goal_met(0.1101, 0.10) and not pipeline_goal_met(0.0899, 0.10)


def test_pipeline_not_measured_yet(tmp_path):
    """No machine filed, or machines filed without the pipeline run: the form every other
    directive uses."""
    assert render_dist(["pipeline"], tmp_path) == render_dist(["tp_overlap"], tmp_path)
    assert "Not measured yet on 2 GPUs and 4 GPUs" in render_dist(["pipeline"], tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    prov = {"backend": "nccl", "world_size": 2, "gpu": "NVIDIA H200", "torch": "2.11.0",
            "nccl": "2.28.9", "date": "2026-11-26T00:00:00Z"}
    (out / "sweep.json").write_text(json.dumps({"provenance": prov, "records": [], "fits": []}))
    dr.record(out, "abc", REPO_ROOT, tmp_path / "r" / "distributed")
    text = render_dist(["pipeline"], tmp_path / "r")
    assert text.startswith("Not measured yet on 2 GPUs and 4 GPUs") and "**met" not in text


def _file_sweep(tmp_path, records: list[dict]) -> str:
    from snippets.part7.sweep import fit_records

    out = tmp_path / "out"
    out.mkdir()
    prov = {"backend": "nccl", "world_size": 2, "gpu": "NVIDIA H200", "torch": "2.11.0",
            "nccl": "2.28.9", "date": "2026-11-26T00:00:00Z"}
    fits = [fit_records(records, "all_reduce")]
    (out / "sweep.json").write_text(json.dumps({"provenance": prov, "records": records,
                                                "fits": fits}))
    dr.record(out, "abc", REPO_ROOT, tmp_path / "r" / "distributed")
    return render_dist(["sweep", "all_reduce"], tmp_path / "r")


def _rec(n: int, seconds: float, timing: str | None) -> dict:
    r = {"op": "all_reduce", "bytes": n, "world_size": 2, "seconds": seconds,
         "algbw": n / seconds, "busbw": n / seconds}
    return r if timing is None else {**r, "timing": timing, "runs": [seconds]}


def test_the_sweep_fits_and_shows_the_graph_timing(tmp_path):
    """Graph and eager records of one sweep: the table shows the graph times with the eager ones
    beside them, the model is fitted to the graph times, one line and one line per range, and the
    goal is judged on the per-range model."""
    sizes = [2**k for k in range(10, 31)]
    graph = [8e-6 if n <= 2**20 else 4e-6 + n / 3e11 for n in sizes]   # two exact ranges
    eager = [max(35e-6, t) for t in graph]                            # the host's floor
    recs = [_rec(n, t, "graph") for n, t in zip(sizes, graph, strict=True)]
    recs += [_rec(n, t, "eager") for n, t in zip(sizes, eager, strict=True)]
    text = _file_sweep(tmp_path, recs)
    assert "| message | time (µs) | eager (µs) | algbw (GB/s) |" in text
    assert "| 1 KiB | 8.0 | 35.0 |" in text and "CUDA-graph replays" in text
    assert "One line per range of sizes (1 KiB to 1 MiB:" in text
    assert "none (flat)" in text and "worst error 0%." in text
    assert "Goal: the model (one line per range of sizes) within 15%" in text
    assert text.count("**met**") == 1


def test_an_eager_only_sweep_is_judged_as_before(tmp_path):
    """Records from before the timings were kept (no "timing"): eager, no eager column."""
    sizes = [2**k for k in range(10, 31)]
    times = [35e-6 + n / 3e11 for n in sizes]
    text = _file_sweep(tmp_path, [_rec(n, t, None) for n, t in zip(sizes, times, strict=True)])
    assert "eager (µs)" not in text and "issued back to back from Python" in text
    assert "**met**" in text


def test_the_one_shot_goal_takes_the_best_book_version(tmp_path):
    """The fused one-shot beside the three-launch one: the goal is judged on the faster of the two,
    from the graph-timed records where the run has them."""
    out = tmp_path / "out"
    out.mkdir()
    prov = {"backend": "nccl", "world_size": 2, "gpu": "NVIDIA H200", "torch": "2.11.0",
            "nccl": "2.28.9", "date": "2026-11-26T00:00:00Z"}
    n = 256 << 10
    times = {("nccl", "graph"): 10e-6, ("one_shot", "graph"): 12e-6,
             ("fused_one_shot", "graph"): 6e-6, ("nccl", "eager"): 30e-6,
             ("one_shot", "eager"): 50e-6, ("fused_one_shot", "eager"): 20e-6}
    recs = [{"impl": impl, "origin": "library" if impl == "nccl" else "book", "bytes": n,
             "world_size": 2, "timing": timing, "seconds": t, "runs": [t], "algbw": n / t,
             "busbw": n / t} for (impl, timing), t in times.items()]
    (out / "fast_allreduce.json").write_text(json.dumps({"provenance": prov, "records": recs}))
    dr.record(out, "abc", REPO_ROOT, tmp_path / "r" / "distributed")
    text = render_dist(["one_shot"], tmp_path / "r")
    assert "| book, one kernel (µs) |" in text and "| 256 KiB | 10.0 | 12.0 | 6.0 | – | 0.60 |" in text
    assert "0.7x NCCL's latency: 0.60x, **met**." in text and "CUDA-graph replays" in text


def _file_tp_overlap(tmp_path, plain_s: float, ring_s: float) -> str:
    """One layout (TP + SP) of hand-made records: compute 10 ms, communication 1 ms, the
    unoverlapped block ``plain_s`` and the ring block ``ring_s``."""
    from snippets.part7.tp_overlap import hidden_fractions

    out = tmp_path / "out"
    out.mkdir()
    recs = [{"variant": v, "sp": True, "chunks": 1, "seconds": t}
            for v, t in (("compute", 10e-3), ("comm", 1e-3), ("tp", plain_s), ("ring", ring_s))]
    prov = {"backend": "nccl", "world_size": 2, "gpu": "NVIDIA H200", "torch": "2.11.0",
            "nccl": "2.28.9", "python": "3.12", "topology": "GPU0\tX\n",
            "date": "2026-11-26T00:00:00Z"}
    data = {"records": recs, "hidden": hidden_fractions(recs), "provenance": prov,
            "config": {"tokens": 8192, "hidden": 8192, "ffn": 28672, "dtype": "bfloat16"},
            "nccl_p2p_chunk_bytes": 65536}
    (out / "tp_overlap.json").write_text(json.dumps(data))
    dr.record(out, "abc", REPO_ROOT, tmp_path / "r" / "distributed")
    return render_dist(["tp_overlap"], tmp_path / "r")


@pytest.mark.parametrize("plain_s, ring_s, shown, flagged", [
    (10.8e-3, 10.2e-3, "best 80% (ring of messages (book), TP + SP), **met**.", False),
    (10.5e-3, 10.45e-3, "best 55% (ring of messages (book), TP + SP), **met**.", True),
    (10.95e-3, 10.7e-3, "best 30% (ring of messages (book), TP + SP), **not met**.", False)])
def test_tp_goal_names_the_best_book_version_and_flags_a_tie_with_no_overlap(
        tmp_path, plain_s, ring_s, shown, flagged):
    """The goal judges the best of the book's versions and names it; when the block that overlaps
    nothing scores within the noise margin of it, the line says so."""
    text = _file_tp_overlap(tmp_path, plain_s, ring_s)
    assert shown in text
    assert ("no better than no overlap" in text) == flagged
    assert "| TP + SP | ring of messages (book) | 1 |" in text
    assert "which only the ring's messages use: 64 KiB" in text
