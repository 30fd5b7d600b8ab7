"""snippets/part7/p2p_patterns.py: one ring step's traffic timed alone. On 2 and 4 gloo ranks
(CPU): each pattern moves the bytes it names (a receive buffer holds the sender's rank), every
rank records the same slowest-rank times, the 2-rank communicator appears on 4 ranks only; odd
worlds and bad sizes are refused before any communication. The table renders from filed records,
with the ring step's ratio to a pair's exchange."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from snippets.bench import distributed as dr
from snippets.part7 import p2p_patterns as pp
from snippets.part7.launch import run_world
from snippets.registry import REPO_ROOT
from snippets.site.distributed import render_dist


def _moved(rank: int, world: int) -> dict:
    """What each pattern's one call leaves in the receive buffer (-1: nothing arrived)."""
    out = {}
    group = [dist.new_group([r, r + 1]) for r in range(0, world, 2)] if world > 2 else [None]
    for pattern in pp.PATTERNS:
        if pattern == "pair_exchange_2rank" and world == 2:
            continue
        send = torch.full((8,), float(rank))
        recv = torch.full((8,), -1.0)
        pp.pattern_call(pattern, send, recv, rank, world, group[rank // 2])()
        out[pattern] = recv.tolist()
    return out


def world_main(rank: int, world: int) -> dict:
    out = {"moved": _moved(rank, world),
           "measure": pp.measure([64, 256], iters=2, warmup=1, timing="graph", repeats=1)}
    for sizes in ([], [3], [0]):
        try:
            pp.measure(sizes)
        except ValueError as exc:
            out.setdefault("refused", []).append(str(exc))
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=lambda p: f"world{p}")
def world(request):
    return request.param, run_world(world_main, request.param, backend="gloo", timeout_s=120)


def test_each_pattern_moves_what_it_names(world):
    p, results = world
    for rank, r in enumerate(results):
        m = r["moved"]
        assert m["ring_shift"] == [float((rank - 1) % p)] * 8
        assert m["pair_exchange"] == [float(rank ^ 1)] * 8
        assert m["one_way"] == ([-1.0] * 8 if rank % 2 == 0 else [float(rank - 1)] * 8)
        if p > 2:
            assert m["pair_exchange_2rank"] == [float(rank ^ 1)] * 8
        else:
            assert "pair_exchange_2rank" not in m


def test_records_agree_across_ranks(world):
    p, results = world
    recs = results[0]["measure"]["records"]
    want = {pat for pat in pp.PATTERNS if p > 2 or pat != "pair_exchange_2rank"}
    assert {r["pattern"] for r in recs} == want
    assert {r["bytes"] for r in recs} == {64, 256}
    for r in recs:
        assert r["timing"] == "eager"          # gloo: no graphs
        assert r["seconds"] > 0 and r["per_direction"] == pytest.approx(r["bytes"] / r["seconds"])
        assert r["world_size"] == p
    assert all(res["measure"] == results[0]["measure"] for res in results)


def test_bad_sizes_refused(world):
    _, results = world
    for r in results:
        assert len(r["refused"]) == 3 and all("multiples of 2 bytes" in e for e in r["refused"])


def _odd(rank: int, world: int) -> str:
    # every rank joined before any returns: a rank that returned and left while another was still
    # connecting would fail that one's init (gloo's full mesh), not the check under test
    dist.barrier()
    try:
        pp.measure([64])
    except ValueError as exc:
        return str(exc)
    return "accepted"


def test_odd_world_refused():
    assert run_world(_odd, 3, backend="gloo", timeout_s=60) == [
        "p2p_patterns: needs an even number of ranks, got 3"] * 3


def test_unknown_pattern_refused():
    with pytest.raises(ValueError, match="pattern must be one of"):
        pp.pattern_call("ring", torch.ones(1), torch.ones(1), 0, 2)


def test_table_renders_from_filed_records(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    recs = [{"pattern": pat, "bytes": 64 << 20, "world_size": 4, "timing": "graph",
             "seconds": s, "per_direction": (64 << 20) / s}
            for pat, s in (("ring_shift", 4e-4), ("pair_exchange", 2e-4), ("one_way", 1e-4),
                           ("pair_exchange_2rank", 2e-4))]
    prov = {"backend": "nccl", "world_size": 4, "gpu": "NVIDIA H200", "torch": "2.11",
            "nccl": "2.28.9", "date": "2026-11-28T00:00:00Z"}
    (out / "p2p_patterns.json").write_text(json.dumps({"records": recs, "provenance": prov}))
    dr.record(out, "abc", REPO_ROOT, tmp_path / "r" / "distributed")
    text = render_dist(["p2p_patterns"], tmp_path / "r")
    row = next(line for line in text.splitlines() if line.startswith("| 64 MiB"))
    # ring step, exchange, exchange on 2 ranks, one way (GB/s), then ring / exchange
    assert row == "| 64 MiB | 168 | 336 | 336 | 671 | 0.50 |"
    assert "4 x NVIDIA H200" in text and "Not measured yet on 2 GPUs" in text
