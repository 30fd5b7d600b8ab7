"""The goal lines of Part 7's scaling table (snippets/site/distributed.py) when the machine
measured has fewer GPUs than the goals are set for: the verdict is given for the world size
measured, says so, and says the goal's own world size is not measured yet; at that world size the
line is the plain verdict. The committed results carry a verdict for every goal they measure."""

from __future__ import annotations

import json
import re

import pytest

from snippets.bench import distributed as dr
from snippets.registry import REPO_ROOT
from snippets.site.distributed import SCALING_GOAL_GPUS, render_dist


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


def test_committed_results_state_every_goal():
    results = REPO_ROOT / "benchmarks" / "results"
    machines = dr.load(results / "distributed")
    for what, run in ((["sweep", "all_reduce"], "sweep"), (["ring"], "fast_allreduce"),
                      (["one_shot"], "fast_allreduce"), (["scaling"], "scaling"),
                      (["tp_overlap"], "tp_overlap")):
        if any(run in m["runs"] for m in machines):
            text = render_dist(what, results)
            assert re.search(r"\*\*(not )?met\b", text), what
