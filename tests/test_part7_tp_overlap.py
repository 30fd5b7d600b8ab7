"""Tensor parallelism with overlapped communication (snippets/part7/tp_overlap.py), on 2 and 4
gloo ranks: the chunked MLP block gives the output and the gradients (input and weights) of
tensor_parallel.py's TensorParallelMLP and of the single-process MLP, for chunk counts 1, 2 and
5 (5 divides no token count used: the chunks are uneven), with and without sequence parallelism;
it trains 10 steps exactly as one process does; every chunk's collective is posted before the
previous chunk's is waited for; bad input is refused before anything is sent; ranks that
disagree on the shape all raise. The timeline model and the hidden-fraction arithmetic are
checked against hand-computed values. PyTorch's async-TP runs on GPUs only (``gpu`` test); its
autograd wrapper is checked here with stand-ins for the fused operators.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from snippets.part7 import tp_overlap as tpo
from snippets.part7.launch import run_world
from snippets.part7.tensor_parallel import (
    TensorParallelMLP,
    full_parameters,
    sync_sequence_parallel_grads,
)

DIM, FFN = 16, 32
BATCH, SEQ = 3, 8          # 24 tokens; with sp, 12 or 6 local tokens on 2 or 4 ranks
CHUNKS = (1, 2, 5)         # 5 divides none of 24, 12, 6: uneven chunks
TOL = {torch.float32: 1e-6, torch.float64: 1e-12}
DTYPES = (torch.float32, torch.float64)
STEPS = 10
NAMES = ("up.weight", "up.bias", "down.weight", "down.bias")


def full_mlp(dtype) -> tuple[nn.Linear, nn.Linear]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        return nn.Linear(DIM, FFN).to(dtype), nn.Linear(FFN, DIM).to(dtype)


def data(dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """An input (BATCH, SEQ, DIM) and the weights of the loss sum(y * w), small enough that the
    weights' gradients (sums over the 24 tokens) stay below 1, where float32's rounding of a
    differently ordered sum is well under 1e-6."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(BATCH, SEQ, DIM, generator=g, dtype=dtype),
            0.1 * torch.randn(BATCH, SEQ, DIM, generator=g, dtype=dtype))


def gather(t: torch.Tensor, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim)


def run_block(block, sp: bool, dtype) -> dict:
    """Output, input gradient and full weight gradients of ``block`` on data(dtype)."""
    rank, p = dist.get_rank(), dist.get_world_size()
    x, w = data(dtype)
    xin = (x.tensor_split(p, 1)[rank] if sp else x).clone().requires_grad_()
    y = block(xin)
    (y * (w.tensor_split(p, 1)[rank] if sp else w)).sum().backward()
    grads = {}
    for name, t in block.named_parameters():
        g = t.grad
        if getattr(t, "tp_dim", None) is not None:
            g = gather(g, t.tp_dim)
        elif getattr(t, "sequence_parallel", False):
            g = g.clone()
            dist.all_reduce(g)
        grads[name] = g
    return {"y": gather(y.detach(), 1) if sp else y.detach(),
            "x grad": gather(xin.grad, 1) if sp else xin.grad, "grads": grads}


def train(rank: int, world: int, dtype, sp: bool, chunks: int) -> dict:
    """10 SGD steps (momentum 0.9) of the MLP on the loss mean((y - target)^2); one process when
    world is 1, else the overlapped block (with sp, each rank holds its share of the sequence)."""
    up, down = full_mlp(dtype)
    if world == 1:
        model = nn.Sequential(up, nn.GELU(), down)
    else:
        model = tpo.OverlappedTensorParallelMLP(up, down, sp=sp, chunks=chunks)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(STEPS):
        x, target = data(dtype, seed=100 + step)
        if world > 1 and sp:
            x, target = (t.tensor_split(world, 1)[rank] for t in (x, target))
        opt.zero_grad()
        loss = ((model(x) - target) ** 2).sum() / (BATCH * SEQ * DIM)   # this rank's share
        loss.backward()
        if world > 1 and sp:
            sync_sequence_parallel_grads(model)
            loss = loss.detach().clone()
            dist.all_reduce(loss)
        opt.step()
        losses.append(loss.item())
    params = (full_parameters(model) if world > 1
              else [t.detach().clone() for t in model.parameters()])
    return {"loss": losses, "params": params}


class Log:
    """Replaces the collectives tp_overlap calls: records each post and each wait, in order."""

    def __init__(self):
        self.events: list[tuple[str, str, int]] = []
        self.saved = (tpo.dist.all_reduce, tpo.all_gather_tensor, tpo.reduce_scatter_tensor)

    def wrap(self, name, fn, which):
        def logged(*args, **kwargs):
            n = which(*args).numel()
            assert kwargs.get("async_op") is True, f"{name} called without async_op=True"
            work = fn(*args, **kwargs)
            self.events.append(("post", name, n))
            log = self

            class Work:
                def wait(self):
                    log.events.append(("wait", name, n))
                    return work.wait()
            return Work()
        return logged

    def __enter__(self):
        all_reduce, ag, rs = self.saved
        tpo.dist.all_reduce = self.wrap("all_reduce", all_reduce, lambda t, *a: t)
        tpo.all_gather_tensor = self.wrap("all_gather", ag, lambda out, inp: out)
        tpo.reduce_scatter_tensor = self.wrap("reduce_scatter", rs, lambda out, inp: inp)
        return self

    def __exit__(self, *exc):
        tpo.dist.all_reduce, tpo.all_gather_tensor, tpo.reduce_scatter_tensor = self.saved


def schedule(sp: bool, chunks: int) -> list[tuple[str, str, int]]:
    up, down = full_mlp(torch.float64)
    block = tpo.OverlappedTensorParallelMLP(up, down, sp=sp, chunks=chunks)
    x, w = data(torch.float64)
    if sp:
        x, w = (t.tensor_split(dist.get_world_size(), 1)[dist.get_rank()] for t in (x, w))
    x.requires_grad_()
    with Log() as log:
        (block(x) * w).sum().backward()
    return log.events


def refusals(rank: int, world: int) -> dict:
    """Bad input on every rank (before any collective: they are replaced by a tripwire), and
    shapes that differ between ranks (every rank must raise)."""
    out = {}
    up, down = full_mlp(torch.float64)
    block = tpo.OverlappedTensorParallelMLP(up, down, chunks=2)
    x, _ = data(torch.float64)

    def tripwire(*a, **k):
        raise AssertionError("communicated before refusing")

    saved = (tpo.agree_same_shape, tpo.dist.all_reduce, tpo.all_gather_tensor,
             tpo.reduce_scatter_tensor)
    tpo.agree_same_shape = tpo.dist.all_reduce = tpo.all_gather_tensor = tripwire
    tpo.reduce_scatter_tensor = tripwire
    try:
        cases = {"float32": lambda: block(x.float()),
                 "features": lambda: block(x[..., :DIM - 1]),
                 "1-d": lambda: block(x[0, 0]),
                 "list": lambda: block(x.tolist())}
        for chunks in (0, BATCH * SEQ + 1, 2.0, True):
            block.chunks = chunks
            cases[f"chunks {chunks!r}"] = functools.partial(block, x)
            try:
                block(x)
            except (ValueError, TypeError) as exc:
                out[f"chunks {chunks!r}"] = f"{type(exc).__name__}: {exc}"
        block.chunks = 2
        for key, fn in cases.items():
            if key.startswith("chunks"):
                continue
            try:
                fn()
            except (ValueError, TypeError) as exc:
                out[key] = f"{type(exc).__name__}: {exc}"
    finally:
        (tpo.agree_same_shape, tpo.dist.all_reduce, tpo.all_gather_tensor,
         tpo.reduce_scatter_tensor) = saved
    try:
        block(x[:, :SEQ - rank % 2])            # odd ranks one token short
    except ValueError as exc:
        out["shapes"] = str(exc)
    try:
        tpo.OverlappedTensorParallelMLP(up, down, chunks=0)
    except ValueError as exc:
        out["init"] = str(exc)
    return out


def async_tp_stand_ins(rank: int, world: int) -> dict:
    """AsyncTPMLP with the fused operators replaced by what they compute (all-gather then matmul;
    matmul then reduce-scatter), against the reference block."""
    p = world

    def ag_mm(a, bs, gather_dim, group_name):
        full = a.new_empty((p * a.shape[0], *a.shape[1:]))
        tpo.all_gather_tensor(full, a.contiguous())
        return full, [full @ b for b in bs]

    def mm_rs(a, b, op, scatter_dim, group_name):
        prod = (a @ b).contiguous()
        out = prod.new_empty((prod.shape[0] // p, *prod.shape[1:]))
        tpo.reduce_scatter_tensor(out, prod)
        return out

    up, down = full_mlp(torch.float64)
    return run_block(tpo.AsyncTPMLP(up, down, ops=(ag_mm, mm_rs)), True, torch.float64)


def world_main(rank: int, world: int) -> dict:
    out = {}
    for dtype in DTYPES:
        up, down = full_mlp(dtype)
        for sp in (False, True):
            out["tp", sp, dtype] = run_block(TensorParallelMLP(up, down, sp=sp), sp, dtype)
            for c in CHUNKS:
                block = tpo.OverlappedTensorParallelMLP(up, down, sp=sp, chunks=c)
                out["overlap", sp, dtype, c] = run_block(block, sp, dtype)
            out["train", sp, dtype] = train(rank, world, dtype, sp, chunks=5)
    out["schedule"] = {(sp, c): schedule(sp, c) for sp in (False, True) for c in (1, 3)}
    out["refusals"] = refusals(rank, world)
    out["async stand-ins"] = async_tp_stand_ins(rank, world)
    if world == 2:              # the measurement's dry run, tiny, on gloo
        out["measure"] = tpo.measure(tokens=16, hidden=8, ffn=16, dtype=torch.float32,
                                     chunk_counts=(2, 3), iters=1, warmup=0)
    dist.barrier()
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=lambda p: f"world{p}")
def world(request):
    return request.param, run_world(world_main, request.param, backend="gloo", timeout_s=240)


@functools.lru_cache(maxsize=None)
def single(dtype) -> dict:
    """The single-process MLP's output and gradients on data(dtype)."""
    up, down = full_mlp(dtype)
    x, w = data(dtype)
    x.requires_grad_()
    y = down(F.gelu(up(x)))
    (y * w).sum().backward()
    grads = {"up.weight": up.weight.grad, "up.bias": up.bias.grad,
             "down.weight": down.weight.grad, "down.bias": down.bias.grad}
    return {"y": y.detach(), "x grad": x.grad, "grads": grads}


def assert_same(got: dict, want: dict, tol: float, what: str) -> None:
    torch.testing.assert_close(got["y"], want["y"], atol=tol, rtol=0,
                               msg=lambda m: f"{what} y: {m}")
    torch.testing.assert_close(got["x grad"], want["x grad"], atol=tol, rtol=0,
                               msg=lambda m: f"{what} x grad: {m}")
    assert set(got["grads"]) == set(NAMES)
    for name in NAMES:
        torch.testing.assert_close(got["grads"][name], want["grads"][name], atol=tol, rtol=0,
                                   msg=lambda m: f"{what} {name}: {m}")


@pytest.mark.parametrize("chunks", CHUNKS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_overlapped_block_equals_tp_block_and_one_process(world, sp, dtype, chunks):
    _, results = world
    for rank, r in enumerate(results):
        got = r["overlap", sp, dtype, chunks]
        assert_same(got, r["tp", sp, dtype], TOL[dtype], f"rank {rank} vs TensorParallelMLP")
        assert_same(got, single(dtype), TOL[dtype], f"rank {rank} vs one process")


@functools.lru_cache(maxsize=None)
def reference_training(dtype) -> dict:
    return train(0, 1, dtype, False, 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_ten_steps_equal_one_process(world, sp, dtype):
    _, results = world
    ref, tol = reference_training(dtype), TOL[dtype]
    for rank, r in enumerate(results):
        run = r["train", sp, dtype]
        torch.testing.assert_close(torch.tensor(run["loss"]), torch.tensor(ref["loss"]),
                                   atol=tol, rtol=0, msg=lambda m: f"rank {rank} loss: {m}")
        assert len(run["params"]) == 4
        for a, b in zip(run["params"], ref["params"]):
            assert a.dtype == dtype
            torch.testing.assert_close(a, b, atol=tol, rtol=0, msg=lambda m: f"rank {rank}: {m}")
    # the test can fail: the parameters moved away from their start by far more than tol
    start = [t.detach() for m in full_mlp(dtype) for t in m.parameters()]
    assert max((a - b).abs().max().item() for a, b in zip(ref["params"], start)) > 1e3 * tol


def test_each_chunk_is_posted_before_the_previous_is_waited_for(world):
    """Without sp, chunk i's all-reduce is in flight while chunk i + 1 computes: all c posts come
    before the first wait, forward and backward, the chunk sizes summing to the whole activation.
    With sp, all-gather i + 1 is posted before all-gather i is waited for, and the reduce-scatters
    are waited for only after the last is posted."""
    p, results = world
    n = BATCH * SEQ
    for r in results:
        for c in (1, 3):
            events = r["schedule"][False, c]
            assert [e[:2] for e in events] == (
                [("post", "all_reduce")] * c + [("wait", "all_reduce")] * c) * 2
            sizes = [e[2] for e in events if e[0] == "post"]
            assert sizes[:c] == sizes[c:] and sum(sizes[:c]) == n * DIM
            events = r["schedule"][True, c]
            posts = [e for e in events if e[0] == "post"]
            assert len(posts) == 4 * c and len(events) == 8 * c
            ag = [i for i, e in enumerate(events) if e[1] == "all_gather"]
            rs = [i for i, e in enumerate(events) if e[1] == "reduce_scatter"]
            for half in (slice(0, 2 * c), slice(2 * c, 4 * c)):     # forward, backward
                g, s = ag[half], rs[half]
                assert events[g[0]][0] == "post"
                if c > 1:           # post 0, post 1, wait 0: chunk 1 travels while 0 computes
                    assert [events[i][0] for i in g[:3]] == ["post", "post", "wait"]
                assert [events[i][0] for i in s] == ["post"] * c + ["wait"] * c
            gathered = [e[2] for e in events if e[:2] == ("post", "all_gather")]
            assert sum(gathered) == 2 * n * DIM             # the whole sequence, twice


def test_refusals_before_any_communication(world):
    p, results = world
    for r in results:
        e = r["refusals"]
        assert "TypeError" in e["float32"] and "torch.float32" in e["float32"]
        assert "ValueError" in e["features"] and f"(..., {DIM})" in e["features"]
        assert "ValueError" in e["1-d"]
        assert "TypeError" in e["list"]
        for chunks in (0, BATCH * SEQ + 1, 2.0, True):
            assert f"got {chunks!r}" in e[f"chunks {chunks!r}"]
            assert "OverlappedTensorParallelMLP: chunks" in e[f"chunks {chunks!r}"]
        assert "same shape" in e["shapes"] and "rank 1" in e["shapes"]   # on every rank
        assert "chunks must be an int >= 1" in e["init"]


def test_async_tp_wrapper_with_stand_ins(world):
    """AsyncTPMLP's forward and backward, the fused operators replaced by what they compute."""
    _, results = world
    for rank, r in enumerate(results):
        assert_same(r["async stand-ins"], single(torch.float64), 1e-12, f"rank {rank}")


def test_measurement_dry_run(world):
    p, results = world
    if p != 2:
        pytest.skip("the dry run is made on 2 ranks only")
    m = results[0]["measure"]
    timed = [r for r in m["records"] if "seconds" in r]
    for sp in (False, True):
        kinds = {(r["variant"], r["chunks"]) for r in timed if r["sp"] == sp}
        assert kinds >= {("compute", 1), ("comm", 1), ("comm", 2), ("tp", 1), ("overlap", 1),
                         ("overlap", 2), ("overlap", 3)}
        assert (("ring", 1) in kinds) == sp               # the ring block is sequence-parallel
    skipped = [r for r in m["records"] if r["variant"] == "async_tp"]
    assert len(skipped) == 1 and "CUDA" in skipped[0]["skipped"]
    assert all(r["seconds"] > 0 for r in timed)
    assert len(m["hidden"]) == 2 * 4 + 1             # tp and overlap 1, 2, 3, per layout; ring
    assert m == results[1]["measure"]                # the slowest rank's times, on every rank


def test_hidden_fraction_arithmetic():
    assert tpo.hidden_fraction(10.0, 4.0, 14.0) == 0.0         # one after the other
    assert tpo.hidden_fraction(10.0, 4.0, 10.0) == 1.0         # all hidden
    assert tpo.hidden_fraction(10.0, 4.0, 11.0) == 0.75
    assert tpo.hidden_fraction(10.0, 4.0, 16.0) == -0.5        # overlap made it slower
    for bad in ((0.0, 4.0, 1.0), (1.0, 0.0, 1.0), (1.0, 1.0, -1.0), (float("nan"), 1.0, 1.0)):
        with pytest.raises(ValueError, match="hidden_fraction"):
            tpo.hidden_fraction(*bad)
    records = [{"variant": "compute", "sp": False, "chunks": 1, "seconds": 10.0},
               {"variant": "comm", "sp": False, "chunks": 1, "seconds": 4.0},
               {"variant": "comm", "sp": False, "chunks": 2, "seconds": 5.0},
               {"variant": "tp", "sp": False, "chunks": 1, "seconds": 14.0},
               {"variant": "overlap", "sp": False, "chunks": 2, "seconds": 12.0},
               {"variant": "async_tp", "sp": True, "chunks": 1, "skipped": "no GPU"}]
    assert tpo.hidden_fractions(records) == [
        {"variant": "tp", "sp": False, "chunks": 1, "hidden_fraction": 0.0},
        {"variant": "overlap", "sp": False, "chunks": 2, "hidden_fraction": 0.5}]


def test_timeline_model():
    # c = 1: compute then communication
    assert tpo.chunk_timeline(8.0, 4.0, 1) == 12.0
    # no latency, no overhead: t_comp = 8/c, t_comm = 4/c; T = 12/c + (c - 1) 8/c
    for c in (2, 4, 8):
        assert tpo.chunk_timeline(8.0, 4.0, c) == pytest.approx(8 + 4 / c)
    # hidden fraction (8 + 4 - T) / 4 = 1 - 1/c: 1/2, 3/4, ... never all of it
    hidden = [tpo.hidden_fraction(8.0, 4.0, tpo.chunk_timeline(8.0, 4.0, c)) for c in (2, 4)]
    assert hidden == pytest.approx([0.5, 0.75])
    # a latency paid per chunk: t_comm = (4 - 1)/c + 1; at c = 8 the collectives cost 11 in all
    assert tpo.chunk_timeline(8.0, 4.0, 8, latency_s=1.0) == pytest.approx(1 + 11 / 8 + 7 * 1.375)
    # communication longer than compute: it sets the pace
    assert tpo.chunk_timeline(2.0, 8.0, 4) == pytest.approx(0.5 + 2 + 3 * 2)
    # the SMs a collective takes slow every chunk's compute when they overlap
    assert tpo.chunk_timeline(8.0, 4.0, 2, sm_share=0.2) == pytest.approx(5 + 2 + 5)
    assert tpo.chunk_timeline(8.0, 4.0, 1, sm_share=0.2) == 12.0
    # the backward's weight gradients (half its compute) follow each post: even c = 1 hides it
    assert tpo.chunk_timeline(8.0, 4.0, 1, after_s=4.0) == 8.0
    assert tpo.chunk_timeline(8.0, 6.0, 1, after_s=4.0) == 10.0
    # chunk 0: input gradient 0..2, sent 2..5, weight gradients 2..4; chunk 1: 4..6, sent
    # 6..9 while its weight gradients run 6..8
    assert tpo.chunk_timeline(8.0, 6.0, 2, after_s=4.0) == 9.0
    for kw in ({"chunks": 0}, {"latency_s": 5.0}, {"sm_share": 1.0}, {"chunk_overhead_s": -1},
               {"after_s": 9.0}):
        with pytest.raises(ValueError, match="chunk_timeline"):
            tpo.chunk_timeline(8.0, 4.0, **{"chunks": 2, **kw})


def test_measure_refuses_bad_input_before_any_collective():
    with pytest.raises(ValueError, match="measure: tokens must be an int >= 1, got 0"):
        tpo.measure(tokens=0)
    with pytest.raises(ValueError, match="measure: ffn"):
        tpo.measure(ffn=2.5)
    with pytest.raises(RuntimeError, match="measure: no process group"):
        tpo.measure()


@pytest.mark.gpu
def test_async_tp_on_gpus():
    """PyTorch's fused async-TP operators, the chunked block and the ring block (NCCL's sends and
    receives) give the reference block's output and gradients."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    results = run_world(_async_tp_gpu, 2, backend="nccl", timeout_s=240)
    for rank, r in enumerate(results):
        # float32 on GPUs: NCCL and the fused operators add in another order than gloo
        assert_same(r["async"], r["tp"], 1e-5, f"rank {rank} async-TP vs TensorParallelMLP")
        assert_same(r["overlap"], r["tp"], 1e-5, f"rank {rank} overlap vs TensorParallelMLP")
        assert_same(r["ring"], r["tp"], 1e-5, f"rank {rank} ring vs TensorParallelMLP")


def _async_tp_gpu(rank: int, world: int) -> dict:
    device = torch.device("cuda", rank)
    torch.backends.cuda.matmul.allow_tf32 = False      # float32 products, not TF32's
    up, down = (m.to(device) for m in full_mlp(torch.float32))
    x, w = (t.to(device) for t in data(torch.float32))
    out = {}
    blocks = {"tp": TensorParallelMLP(up, down, sp=True),
              "overlap": tpo.OverlappedTensorParallelMLP(up, down, sp=True, chunks=2),
              "ring": tpo.RingTPMLP(up, down)}
    why = tpo.async_tp_unavailable(device)
    if why is not None:
        raise RuntimeError(why)
    blocks["async"] = tpo.AsyncTPMLP(up, down)
    for name, block in blocks.items():
        xin = x.tensor_split(world, 1)[rank].clone().requires_grad_()
        y = block(xin)
        (y * w.tensor_split(world, 1)[rank]).sum().backward()
        grads = {}
        for pname, t in block.named_parameters():
            g = t.grad
            if getattr(t, "tp_dim", None) is not None:
                g = gather(g, t.tp_dim)
            else:
                g = g.clone()
                dist.all_reduce(g)
            grads[pname] = g.cpu()
        out[name] = {"y": gather(y.detach(), 1).cpu(),
                     "x grad": gather(xin.grad, 1).cpu(), "grads": grads}
    return out
