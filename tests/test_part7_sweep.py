"""The collective sweep (snippets/part7/sweep.py) that the multi-GPU runs will make, dry-run on a CPU with gloo:
every record has its time and both bandwidths in NCCL's convention, the message sizes are what NCCL's tests
report, the fit is written (or says why a sweep is too noisy to fit), and bad arguments are refused."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from snippets.part7 import sweep
from snippets.part7.cost import bus_bandwidth
from snippets.part7.launch import default_backend, run_world
from snippets.registry import REPO_ROOT


def test_sizes_are_powers_of_two_from_lo_to_hi():
    assert sweep.sizes_between(1024, 8192) == [1024, 2048, 4096, 8192]
    for lo, hi in ((1000, 8192), (1024, 1000), (0, 8)):
        with pytest.raises(ValueError, match="powers of two"):
            sweep.sizes_between(lo, hi)


def _messages(rank: int, world: int) -> dict:
    """The bytes each collective's tensors hold, and one sweep, on a world of gloo processes."""
    p = dist.get_world_size()
    out = {}
    for op in ("all_reduce", "all_gather", "all_to_all"):
        fn = sweep.collective(op, 4096, p, torch.device("cpu"), torch.float32)
        fn()
        out[op] = True
    with pytest.raises(ValueError, match="op must be one of"):
        sweep.collective("broadcast", 4096, p, torch.device("cpu"), torch.float32)
    out["records"] = sweep.sweep(("all_reduce", "all_gather", "reduce_scatter", "all_to_all"),
                                 [1024, 4096], iters=3, warmup=1)
    # both timings asked for on gloo: graph needs GPUs and is left out; three runs, their median
    fn = sweep.collective("all_reduce", 4096, p, torch.device("cpu"), torch.float32)
    out["timed"] = sweep.timed(fn, torch.device("cpu"), 2, 1, "eager", repeats=3)
    out["both"] = sweep.sweep(("all_reduce",), [1024], iters=2, warmup=1,
                              timings=("eager", "graph"), repeats=2)
    for bad in (dict(timings=("fast",)), dict(timings=()), dict(repeats=0)):
        with pytest.raises(ValueError):
            sweep.sweep(("all_reduce",), [1024], iters=1, warmup=0, **bad)
    with pytest.raises(ValueError, match="CUDA"):
        sweep.timed(fn, torch.device("cpu"), 2, 1, "graph")
    return out


def test_a_sweep_on_gloo_gives_every_rank_the_same_records():
    results = run_world(_messages, 2, backend="gloo")
    assert results[0]["records"] == results[1]["records"]  # the slowest rank's time, on every rank
    recs = results[0]["records"]
    # gloo has no reduce-scatter of tensors: left out, the others at both sizes
    assert [(r["op"], r["bytes"]) for r in recs] == [(op, n) for op in ("all_reduce", "all_gather", "all_to_all")
                                                      for n in (1024, 4096)]
    t = results[0]["timed"]
    assert t["timing"] == "eager" and len(t["runs"]) == 3
    assert t["seconds"] == sorted(t["runs"])[1]              # the median of the three runs
    assert results[0]["timed"] == results[1]["timed"]         # the slowest rank's, on every rank
    assert [(r["op"], r["timing"], len(r["runs"])) for r in results[0]["both"]] == [
        ("all_reduce", "eager", 2)]
    for r in recs:
        assert r["seconds"] > 0 and r["world_size"] == 2 and r["timing"] == "eager"
        assert r["algbw"] == pytest.approx(r["bytes"] / r["seconds"])
        assert r["busbw"] == pytest.approx(bus_bandwidth(r["algbw"], r["op"], 2))


def test_the_command_line_writes_records_fits_and_provenance(tmp_path):
    out = tmp_path / "sweep.json"
    proc = subprocess.run([sys.executable, "-m", "snippets.part7.sweep", "--world", "2", "--max-bytes", "8192",
                           "--iters", "3", "--warmup", "1", "--ops", "all_reduce,all_to_all", "--out", str(out)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    # NCCL where there are two GPUs, gloo otherwise (the command line's default)
    assert data["provenance"]["backend"] == default_backend(2) and data["provenance"]["world_size"] == 2
    assert {r["op"] for r in data["records"]} == {"all_reduce", "all_to_all"}
    # 1, 2, 4 and 8 KiB, timed eagerly and (NCCL only: a CUDA graph needs GPUs) as a graph
    assert len(data["records"]) == 2 * 4 * (2 if default_backend(2) == "nccl" else 1)
    for fit in data["fits"]:
        assert ("error" in fit) or (fit["alpha_s"] >= 0 and fit["beta_bytes_per_s"] > 0)
    bad = subprocess.run([sys.executable, "-m", "snippets.part7.sweep", "--world", "2", "--ops", "gather",
                          "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "unknown op" in bad.stderr


@pytest.mark.gpu
def test_graph_timing_on_one_gpu():
    """Graph timing without a process group: the calls replayed from a CUDA graph, every run
    recorded; a call the capture cannot take (it waits for the host) falls back to eager timing,
    and the record says why."""
    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.ones(1 << 20, device=dev)
    t = sweep.timed(lambda: x.mul_(1.0), dev, 10, 2, "graph", repeats=2)
    assert t["timing"] == "graph" and len(t["runs"]) == 2 and all(s > 0 for s in t["runs"])
    assert "graph_error" not in t
    t = sweep.timed(lambda: x.sum().item(), dev, 4, 1, "graph")
    assert t["timing"] == "eager" and t["graph_error"] and t["seconds"] > 0
    # the capture that failed left the stream usable
    assert float(x.sum()) == x.numel()
