"""The sequence-parallel MLP as rings of messages (snippets/part7/ring_tp.py), on 2 and 4 gloo
ranks: RingTPMLP gives the output and the gradients (input and weights) of tensor_parallel.py's
TensorParallelMLP and of the single-process MLP; the two rings gather and reduce-scatter what the
collectives would, and post each hop before the product that hides it; bad input is refused
before any message; ranks that disagree on the shape all raise. On GPUs the block is checked in
tests/test_part7_tp_overlap.py's async-TP test, beside PyTorch's."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from test_part7_tp_overlap import DTYPES, TOL, assert_same, data, full_mlp, run_block, single

from snippets.part7 import ring_tp
from snippets.part7.launch import run_world
from snippets.part7.tensor_parallel import TensorParallelMLP


class HopLog:
    """Wraps ring_tp._hop: records ("post", step) and ("wait", step) in order, with the user's
    own events in between."""

    def __init__(self):
        self.events, self._saved, self._posted = [], None, 0

    def __enter__(self):
        self._saved = ring_tp._hop

        def hop(send, recv, group):
            i = self._posted
            self._posted += 1
            self.events.append(("post", i))
            works = self._saved(send, recv, group)
            log = self.events

            class Logged:
                def wait(self):
                    for w in works:
                        w.wait()
                    log.append(("wait", i))
            return [Logged()]

        ring_tp._hop = hop
        return self

    def __exit__(self, *exc):
        ring_tp._hop = self._saved


def rings(rank: int, world: int) -> dict:
    """The two rings alone on small tensors, with their event logs."""
    x = torch.arange(6, dtype=torch.float64).reshape(2, 3) + 10 * rank
    gathered = x.new_empty((2 * world, 3))
    with HopLog() as log:
        ring_tp.ring_gather_mm(x, gathered, lambda k, rows: log.events.append(("use", k)))
    want = torch.cat([torch.arange(6, dtype=torch.float64).reshape(2, 3) + 10 * k
                      for k in range(world)])
    # partial(d): this rank's contribution to rank d's rows, distinct per (rank, d)
    with HopLog() as rs_log:
        def partial(d):
            rs_log.events.append(("partial", d))
            return torch.full((2, 3), float(100 * rank + d), dtype=torch.float64)
        between = tuple((lambda i=i: rs_log.events.append(("between", i))) for i in range(world))
        out = ring_tp.ring_mm_reduce_scatter(partial, between=between)
    return {"gathered": gathered, "gather want": want, "gather log": log.events,
            "rs": out, "rs want": torch.full((2, 3), float(sum(100 * k + rank
                                                                for k in range(world))),
                                             dtype=torch.float64),
            "rs log": rs_log.events}


def refusals(rank: int, world: int) -> dict:
    up, down = full_mlp(torch.float64)
    block = ring_tp.RingTPMLP(up, down)
    x, _ = data(torch.float64)
    x = x.tensor_split(world, 1)[rank]

    def tripwire(*a, **k):
        raise AssertionError("communicated before refusing")

    saved = (ring_tp.agree_same_shape, ring_tp._hop)
    ring_tp.agree_same_shape = ring_tp._hop = tripwire
    out = {}
    try:
        for key, bad in {"float32": x.float(), "features": x[..., :-1], "1-d": x[0, 0],
                         "list": x.tolist(), "empty": x[:, :0]}.items():
            try:
                block(bad)
            except (ValueError, TypeError) as exc:
                out[key] = f"{type(exc).__name__}: {exc}"
    finally:
        ring_tp.agree_same_shape, ring_tp._hop = saved
    try:
        block(x[:, :x.shape[1] - rank % 2])       # odd ranks one token short
    except ValueError as exc:
        out["shapes"] = str(exc)
    return out


def world_main(rank: int, world: int) -> dict:
    out = {}
    for dtype in DTYPES:
        up, down = full_mlp(dtype)
        out["tp", dtype] = run_block(TensorParallelMLP(up, down, sp=True), True, dtype)
        out["ring", dtype] = run_block(ring_tp.RingTPMLP(up, down), True, dtype)
    out["rings"] = rings(rank, world)
    out["refusals"] = refusals(rank, world)
    out["hop group"] = ring_tp.hop_group(None) is None     # gloo: the messages use the group given
    dist.barrier()
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=lambda p: f"world{p}")
def world(request):
    return request.param, run_world(world_main, request.param, backend="gloo", timeout_s=240)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ring_block_equals_tp_block_and_one_process(world, dtype):
    _, results = world
    for rank, r in enumerate(results):
        assert_same(r["ring", dtype], r["tp", dtype], TOL[dtype], f"rank {rank} vs TP block")
        assert_same(r["ring", dtype], single(dtype), TOL[dtype], f"rank {rank} vs one process")


def test_the_rings_move_what_the_collectives_would(world):
    p, results = world
    for rank, r in enumerate(results):
        assert torch.equal(r["rings"]["gathered"], r["rings"]["gather want"]), rank
        assert torch.equal(r["rings"]["rs"], r["rings"]["rs want"]), rank


def test_each_hop_is_posted_before_the_product_that_hides_it(world):
    """all-gather: in step s < p - 1 the hop is posted, then rank r - s's rows are used, then
    the hop is waited for; reduce-scatter: the partial of step s + 1 (and a piece of the work
    between) runs after hop s is posted and before it is waited for, and the last partial is
    this rank's own rows."""
    p, results = world
    for rank, r in enumerate(results):
        want = []
        for s in range(p):
            k = (rank - s) % p
            want += [("post", s), ("use", k), ("wait", s)] if s < p - 1 else [("use", k)]
        assert r["rings"]["gather log"] == want, rank
        want = [("partial", (rank - 1) % p), ("post", 0), ("between", 0)]
        for s in range(1, p):
            want.append(("partial", (rank - s - 1) % p))
            if s == p - 1:
                want.append(("between", p - 1))
            want.append(("wait", s - 1))
            if s < p - 1:
                want += [("post", s), ("between", s)]
        assert r["rings"]["rs log"] == want, rank
        assert want[-2] == ("partial", rank) or want[-3] == ("partial", rank)


def test_off_nccl_the_messages_use_the_group_given(world):
    _, results = world
    assert all(r["hop group"] for r in results)


def test_refusals_before_any_message(world):
    _, results = world
    for r in results:
        e = r["refusals"]
        assert "TypeError" in e["float32"] and "torch.float32" in e["float32"]
        assert "ValueError" in e["features"] and "(..., 16)" in e["features"]
        assert "ValueError" in e["1-d"] and "ValueError" in e["empty"]
        assert "TypeError" in e["list"]
        assert "same shape" in e["shapes"] and "rank 1" in e["shapes"]   # on every rank
