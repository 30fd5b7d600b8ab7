"""snippets/part7/fast_halving.py: the in-place halving-doubling all-reduce equals
torch.distributed's all-reduce on gloo for 1, 2, 4 and 8 ranks and shapes whose size the ranks do
not divide (integer-valued inputs: exact), twice in a row on one build (the receive buffer reused);
it refuses a non-power-of-two world, different shapes on different ranks and a tensor it was not
built for, before any exchange. The measurement's dry run records NCCL's stand-in, the ring and
halving-doubling at each size, the same on every rank. The command lines part7_gpus.sh runs
(fast_halving and p2p_patterns) run under torchrun on 2 CPU processes and write what
``snippets.bench.distributed record`` files, with the NCCL point-to-point chunk the run set (its
default, none, or the environment's value)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from snippets.part7.fast_halving import HalvingDoublingAllReduce, measure
from snippets.part7.launch import run_world

SHAPES = ((1,), (3,), (7,), (5, 3), (1000,), (4097,))


def _checks(rank: int, world: int) -> dict:
    failures = []
    for shape in SHAPES:
        hd = HalvingDoublingAllReduce(shape, torch.float64, "cpu")
        for call in range(2):
            g = torch.Generator().manual_seed(100 * rank + 10 * call + len(shape))
            x = torch.randint(-50, 50, shape, generator=g).double()
            want = x.clone()
            dist.all_reduce(want)
            y = x.clone()
            out = hd(y)
            if out is not y or not torch.equal(y, want):
                failures.append(f"shape {shape} call {call}")
    refused = []
    hd = HalvingDoublingAllReduce((5, 3), torch.float64, "cpu")
    for bad in (torch.zeros(4), torch.zeros(5, 3, dtype=torch.float32),
                torch.zeros(3, 5, dtype=torch.float64).t(), [0.0] * 15):
        try:
            hd(bad)
        except (TypeError, ValueError) as exc:
            refused.append(str(exc))
    result = {"failures": failures, "refused": refused}
    if world in (2, 4):
        result["measure"] = measure([64, 256], iters=2, warmup=1, repeats=1)
    return result


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_equals_all_reduce(world):
    for rank, r in enumerate(run_world(_checks, world, backend="gloo", timeout_s=180)):
        assert r["failures"] == [], f"rank {rank}"
        assert len(r["refused"]) == 4
        assert all("was built for shape (5, 3)" in e for e in r["refused"][:2])
        assert "must be contiguous" in r["refused"][2] and "expected a tensor" in r["refused"][3]
        if world in (2, 4):
            recs = r["measure"]["records"]
            assert {(x["impl"], x["bytes"]) for x in recs} == {
                (i, b) for i in ("nccl", "ring/pieces=1", "halving_doubling") for b in (64, 256)}
            assert all(x["timing"] == "eager" and x["seconds"] > 0 for x in recs)


def _three(rank: int, world: int) -> list[str]:
    dist.barrier()   # every rank joined before any returns (a rank leaving early fails another's init)
    out = []
    for fn in (lambda: HalvingDoublingAllReduce((4,), torch.float32, "cpu"),
               lambda: measure([64])):
        try:
            fn()
        except ValueError as exc:
            out.append(str(exc))
    return out


def test_non_power_of_two_refused():
    for r in run_world(_three, 3, backend="gloo", timeout_s=60):
        assert len(r) == 2 and all("power-of-two number of ranks, got 3" in e for e in r)


def _shapes(rank: int, world: int) -> str:
    try:
        HalvingDoublingAllReduce((4 + rank,), torch.float32, "cpu")
    except ValueError as exc:
        return str(exc)
    return "built"


def test_different_shapes_refused_on_every_rank():
    for msg in run_world(_shapes, 2, backend="gloo", timeout_s=60):
        assert "every rank must build it for the same shape" in msg


def test_table_and_verdict_render_from_filed_records(tmp_path):
    import json

    from snippets.bench import distributed as dr
    from snippets.registry import REPO_ROOT
    from snippets.site.distributed import render_dist

    out = tmp_path / "out"
    out.mkdir()
    n = 256 << 20
    recs = [{"impl": impl, "bytes": n, "world_size": 4, "timing": "graph", "seconds": 1e-3,
             "busbw": bw} for impl, bw in (("nccl", 300e9), ("ring/pieces=1", 150e9),
                                           ("halving_doubling", 240e9))]
    prov = {"backend": "nccl", "world_size": 4, "gpu": "NVIDIA H200", "torch": "2.11",
            "nccl": "2.28.9", "date": "2026-11-28T00:00:00Z"}
    (out / "halving.json").write_text(json.dumps({"records": recs, "provenance": prov}))
    dr.record(out, "abc", REPO_ROOT, tmp_path / "r" / "distributed")
    text = render_dist(["halving"], tmp_path / "r")
    assert "| 256 MiB | 300 | 150 | 240 | 0.80 |" in text
    assert ("the book's ring 50.0%, **not met**; halving-doubling 80.0%, **not met**." in text)
    assert "NCCL's default." in text                 # no chunk recorded


def _cli(module: str, out, *args: str, env_extra: dict | None = None):
    """``module``'s command line under torchrun on 2 CPU processes (gloo), as part7_gpus.sh runs it
    on GPUs."""
    import os
    import subprocess
    import sys

    from snippets.registry import REPO_ROOT

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("NCCL_P2P_NVL_CHUNKSIZE", None)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", module, "--out", str(out), *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("chunk_args, env_extra, want", [
    ((), None, 1 << 16),                                     # the run's default chunk, recorded
    (("--p2p-chunk-bytes", "0"), None, None),                # NCCL's default: nothing set
    ((), {"NCCL_P2P_NVL_CHUNKSIZE": "131072"}, 131072),      # the environment's value wins
])
def test_command_line_records_what_part7_gpus_files(tmp_path, chunk_args, env_extra, want):
    import json

    out = tmp_path / "halving.json"
    proc = _cli("snippets.part7.fast_halving", out, "--min-bytes", "1024", "--max-bytes", "2048",
                "--iters", "2", "--warmup", "1", "--repeats", "1", *chunk_args,
                env_extra=env_extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["nccl_p2p_chunk_bytes"] == want
    assert data["provenance"]["backend"] == "gloo" and data["provenance"]["gpu"] is None
    assert {(r["impl"], r["bytes"]) for r in data["records"]} == {
        (i, b) for i in ("nccl", "ring/pieces=1", "halving_doubling") for b in (1024, 2048)}
    assert "halving_doubling" in proc.stdout


def test_command_line_refuses_a_negative_chunk(tmp_path):
    proc = _cli("snippets.part7.fast_halving", tmp_path / "h.json", "--p2p-chunk-bytes", "-1")
    assert proc.returncode != 0 and "--p2p-chunk-bytes must be >= 0, got -1" in proc.stderr


def test_p2p_patterns_command_line(tmp_path):
    import json

    out = tmp_path / "p2p.json"
    proc = _cli("snippets.part7.p2p_patterns", out, "--sizes-mib", "0.001953125",
                "--iters", "2", "--warmup", "1", "--repeats", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert {r["pattern"] for r in data["records"]} == {"ring_shift", "pair_exchange", "one_way"}
    assert {r["bytes"] for r in data["records"]} == {2048}
    assert data["provenance"]["world_size"] == 2
