"""Two all-reduces built to be timed against NCCL's: the ring of collectives.py made fast for big
messages, and a one-shot all-reduce over peer-to-peer memory for small ones.

- ``RingAllReduce``: the same ring (reduce-scatter, then all-gather), in place, with the shape
  agreed once when it is built (as NCCL's plans are) instead of on every call, and each step's
  chunk cut into ``pieces`` so that the addition of one piece runs while the next is on the wire.
- ``OneShotAllReduce``: every rank copies its input into a buffer that every other GPU can read
  (PyTorch's symmetric memory), the ranks meet at a barrier, and each reads all the buffers over
  NVLink and adds them: one step instead of the ring's 2 (p - 1), for messages small enough that
  latency, not bandwidth, sets the time. GPUs only (peer-to-peer access between them).

``python -m snippets.part7.fast_allreduce --out fast.json`` under torchrun times both against
``dist.all_reduce`` (NCCL) in one run; it is what the multi-GPU measurements of Part 7 run.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from snippets.part7.collectives import SUM_DTYPES, agree, describe_input
from snippets.part7.cost import algorithm_bandwidth, bus_bandwidth
from snippets.part7.sweep import TIMINGS, timed


def _check_input(name: str, x, shape: tuple, dtype: torch.dtype, device: torch.device) -> None:
    """The local checks of a call: the tensor the collective was built for (no communication)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor, got {type(x).__name__}")
    if tuple(x.shape) != shape or x.dtype != dtype or x.device != device:
        raise ValueError(f"{name} was built for shape {shape}, {dtype} on {device}; got shape "
                         f"{tuple(x.shape)}, {x.dtype} on {x.device}")
    if not x.is_contiguous():
        raise ValueError(f"{name}: the tensor must be contiguous (it is reduced in place)")


# --8<-- [start:ring]
class RingAllReduce:
    """An in-place ring all-reduce for tensors of one shape, dtype and device, agreed by every
    rank when it is built. Each of the ring's steps sends its chunk as ``pieces`` messages, and
    adds each piece as soon as it has arrived, while the later pieces are still in flight."""

    def __init__(self, shape, dtype: torch.dtype, device, group=None, pieces: int = 4):
        if not isinstance(pieces, int) or pieces < 1:
            raise ValueError(f"RingAllReduce: pieces must be a positive int, got {pieces!r}")
        self.shape, self.dtype, self.device = tuple(shape), dtype, torch.device(device)
        self.group, self.pieces = group, pieces
        self.rank, self.p = dist.get_rank(group), dist.get_world_size(group)
        probe = torch.empty(self.shape, dtype=dtype, device="meta")   # a shape, no memory
        everyone = agree("RingAllReduce", group, describe_input(probe))
        if len({d[2] for d in everyone}) > 1:
            raise ValueError("RingAllReduce: every rank must build it for the same shape, got "
                             + ", ".join(f"rank {r}: {d[2]}" for r, d in enumerate(everyone)))
        numel = probe.numel()
        self.bounds = [numel * k // self.p for k in range(self.p + 1)]     # p chunks
        biggest = max(b - a for a, b in zip(self.bounds, self.bounds[1:]))
        self.incoming = torch.empty(biggest, dtype=dtype, device=self.device)

    def _chunk(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        k %= self.p
        return flat[self.bounds[k]:self.bounds[k + 1]]

    def _exchange(self, send: torch.Tensor, recv: torch.Tensor) -> list:
        right, left = (self.rank + 1) % self.p, (self.rank - 1) % self.p
        ops = [dist.P2POp(op, t, group=self.group, group_peer=peer)
               for op, t, peer in ((dist.isend, send, right), (dist.irecv, recv, left))
               if t.numel()]           # an empty chunk's partner is empty too: both skip it
        return dist.batch_isend_irecv(ops) if ops else []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        _check_input("RingAllReduce", x, self.shape, self.dtype, self.device)
        flat, r = x.view(-1), self.rank
        for step in range(self.p - 1):                 # reduce-scatter: chunk r - s - 2 grows
            send, mine = self._chunk(flat, r - step - 1), self._chunk(flat, r - step - 2)
            sends, recvs = send.tensor_split(self.pieces), mine.tensor_split(self.pieces)
            bufs = self.incoming[:mine.numel()].tensor_split(self.pieces)
            posted = [self._exchange(s, b) for s, b in zip(sends, bufs)]
            for works, piece, buf in zip(posted, recvs, bufs):
                for work in works:
                    work.wait()                        # this piece has arrived: add it while
                piece += buf                           # the next ones are still on the wire
        for step in range(self.p - 1):                 # all-gather: the sums travel round
            mine, theirs = self._chunk(flat, r - step), self._chunk(flat, r - step - 1)
            for work in self._exchange(mine, theirs):
                work.wait()
        return x
# --8<-- [end:ring]


def check_one_shot_build(name: str, max_numel, dtype: torch.dtype) -> None:
    """What both one-shot all-reduces need to be built: GPUs, a dtype the sums take, a size."""
    if not torch.cuda.is_available():
        raise RuntimeError(f"{name}: needs GPUs with peer-to-peer access")
    if dtype not in SUM_DTYPES:
        raise TypeError(f"{name}: dtype {dtype} is not one the sums take")
    if not isinstance(max_numel, int) or isinstance(max_numel, bool) or max_numel < 1:
        raise ValueError(f"{name}: max_numel must be a positive int, got {max_numel!r}")


def check_one_shot_call(name: str, x, dtype: torch.dtype, device: torch.device,
                        max_numel: int) -> int:
    """A call's input: a tensor of the dtype and device it was built for, not too large; its
    number of elements."""
    if not isinstance(x, torch.Tensor) or x.dtype != dtype or x.device != device:
        raise ValueError(f"{name}: expected a {dtype} tensor on {device}, got "
                         f"{getattr(x, 'dtype', type(x).__name__)} on {getattr(x, 'device', '?')}")
    if x.numel() > max_numel:
        raise ValueError(f"{name}: {x.numel()} elements, built for at most {max_numel}")
    return x.numel()


# --8<-- [start:one_shot]
class OneShotAllReduce:
    """An all-reduce of up to ``max_numel`` elements in one step over peer-to-peer memory. Two
    symmetric buffers are used in turn: call i writes buffer i % 2 and meets the other ranks at
    a barrier before reading; the barrier of call i + 1 comes after every rank has finished
    reading in call i (each GPU runs its calls in order), so call i + 2 may overwrite buffer
    i % 2 without a second barrier."""

    def __init__(self, max_numel: int, dtype: torch.dtype, group=None):
        check_one_shot_build("OneShotAllReduce", max_numel, dtype)
        import torch.distributed._symmetric_memory as symm_mem

        group = group or dist.group.WORLD
        self.p, self.rank, self.dtype = dist.get_world_size(group), dist.get_rank(group), dtype
        self.max_numel, self.calls = max_numel, 0
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.handles, self.peers = [], []
        for _ in range(2):
            buf = symm_mem.empty(max_numel, dtype=dtype, device=self.device)
            handle = symm_mem.rendezvous(buf, group.group_name)
            self.handles.append(handle)
            self.peers.append([handle.get_buffer(r, (max_numel,), dtype) for r in range(self.p)])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n = check_one_shot_call("OneShotAllReduce", x, self.dtype, self.device, self.max_numel)
        turn = self.calls % 2
        self.calls += 1
        peers = [b[:n] for b in self.peers[turn]]
        peers[self.rank].copy_(x.reshape(-1))          # my contribution, readable by every GPU
        self.handles[turn].barrier(channel=turn)       # every rank's copy has landed
        out = peers[0] + peers[1] if self.p > 1 else peers[0].clone()
        for b in peers[2:]:                            # reads over NVLink, adds locally
            out += b
        return out.view(x.shape)
# --8<-- [end:one_shot]


# --8<-- [start:fused_kernel]
@triton.jit
def one_shot_kernel(x_ptr, out_ptr, buf_ptrs, flag_ptrs, n, rank, turn_offset,
                    WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """One call of the fused one-shot all-reduce, on one rank. Program ``b`` owns elements
    [b * BLOCK, (b + 1) * BLOCK): it copies them into this rank's symmetric buffer, tells every
    peer's program ``b`` that they are there, waits until every peer's program ``b`` has said the
    same, and sums the slices of all the buffers. ``buf_ptrs`` and ``flag_ptrs`` hold every rank's
    buffer and flag addresses (int64); flag ``b * WORLD + r`` of rank q is "rank r's slice b has
    landed on rank r's buffer": 1 set by r, taken back to 0 by q."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dtype = x_ptr.dtype.element_ty
    # symmetric buffers start on allocation boundaries: tell the compiler, so copies are 16-byte
    mine = tl.multiple_of(tl.load(buf_ptrs + rank).to(tl.pointer_type(dtype)), 16) + turn_offset
    tl.store(mine + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)
    tl.debug_barrier()                   # every thread's store is done before the signal
    for r in tl.static_range(WORLD):
        if r != rank:
            slot = tl.load(flag_ptrs + r).to(tl.pointer_type(tl.int32)) + pid * WORLD + rank
            # 0 -> 1 once the peer has taken the previous call's signal; release: the stores
            # above are visible on every GPU before the flag is
            while tl.atomic_cas(slot, 0, 1, sem="release", scope="sys") != 0:
                pass
    flags = tl.load(flag_ptrs + rank).to(tl.pointer_type(tl.int32)) + pid * WORLD
    for r in tl.static_range(WORLD):
        if r != rank:
            # 1 -> 0: take rank r's signal; acquire: its slice is visible after this
            while tl.atomic_cas(flags + r, 1, 0, sem="acquire", scope="sys") != 1:
                pass
    tl.debug_barrier()                   # no thread reads before the signals are in
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for r in tl.static_range(WORLD):
        peer = tl.multiple_of(tl.load(buf_ptrs + r).to(tl.pointer_type(dtype)), 16) + turn_offset
        acc += tl.load(peer + offs, mask=mask, other=0.0, cache_modifier=".cv").to(tl.float32)
    tl.store(out_ptr + offs, acc.to(dtype), mask=mask)
# --8<-- [end:fused_kernel]


# --8<-- [start:fused]
class FusedOneShotAllReduce:
    """The one-shot all-reduce as one kernel per call (:func:`one_shot_kernel`): the copy, the
    signals and the sum, with no barrier kernel and no host work between them. Each block of
    ``block`` elements meets the same block of the other ranks through flags in symmetric
    memory, so no rank waits for a whole grid. Two buffers in turn, as OneShotAllReduce: a rank can
    only be one call ahead of another (its signals wait until the peer took the previous ones)."""

    def __init__(self, max_numel: int, dtype: torch.dtype, group=None, block: int = 4096):
        check_one_shot_build("FusedOneShotAllReduce", max_numel, dtype)
        if not isinstance(block, int) or block < 128 or block & (block - 1):
            raise ValueError(f"FusedOneShotAllReduce: block must be a power of two >= 128, got "
                             f"{block!r}")
        import torch.distributed._symmetric_memory as symm_mem

        group = group or dist.group.WORLD
        self.p, self.rank, self.dtype = dist.get_world_size(group), dist.get_rank(group), dtype
        self.max_numel, self.block, self.calls = max_numel, block, 0
        self.device = torch.device("cuda", torch.cuda.current_device())
        blocks = triton.cdiv(max_numel, block)
        self.buf = symm_mem.empty(2 * max_numel, dtype=dtype, device=self.device)
        self.flags = symm_mem.empty(blocks * self.p, dtype=torch.int32, device=self.device)
        self.flags.zero_()
        handles = [symm_mem.rendezvous(t, group.group_name) for t in (self.buf, self.flags)]
        self.buf_ptrs, self.flag_ptrs = (
            torch.tensor(list(h.buffer_ptrs), dtype=torch.int64, device=self.device)
            for h in handles)
        torch.cuda.synchronize(self.device)
        dist.barrier(group)                   # every rank's flags are zero before any signal

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n = check_one_shot_call("FusedOneShotAllReduce", x, self.dtype, self.device,
                                self.max_numel)
        turn = self.calls % 2
        self.calls += 1
        src = x.reshape(-1).contiguous()
        out = torch.empty_like(src)
        one_shot_kernel[(triton.cdiv(n, self.block),)](
            src, out, self.buf_ptrs, self.flag_ptrs, n, self.rank, turn * self.max_numel,
            WORLD=self.p, BLOCK=self.block, num_warps=8)
        return out.view(x.shape)
# --8<-- [end:fused]


def _library_one_shot(x: torch.Tensor, group_name: str):
    """PyTorch's own one-shot all-reduce kernel on symmetric memory (a library baseline), or None
    when this torch has none."""
    op = getattr(getattr(torch.ops, "symm_mem", None), "one_shot_all_reduce", None)
    if op is None:
        return None
    import torch.distributed._symmetric_memory as symm_mem

    buf = symm_mem.empty(x.numel(), dtype=x.dtype, device=x.device)
    symm_mem.rendezvous(buf, group_name)
    buf.copy_(x)
    return lambda: op(buf, "sum", group_name)


def measure(big: list[int], small: list[int], iters: int, warmup: int,
            dtype: torch.dtype = torch.bfloat16,
            pieces: tuple[int, ...] = (1, 4), timings: tuple[str, ...] = ("eager",),
            repeats: int = 1, fused: bool = False) -> dict[str, Any]:
    """Time NCCL's all-reduce, the ring (``big`` sizes, bytes; once per count of ``pieces``) and
    the one-shot (``small``; with ``fused``, the one-kernel one-shot too) in one run, checking
    each result against NCCL's first. Each is timed once per timing of ``timings``
    (``sweep.timed``: eager calls, or the calls replayed from a CUDA graph), each record saying
    which."""
    if any(t not in TIMINGS for t in timings) or not timings:
        raise ValueError(f"measure: timings must be some of {TIMINGS}, got {timings!r}")
    if "graph" in timings and iters % 2:
        # a replay repeats the captured calls: the one-shot's buffers alternate from one replay to
        # the next only if a replay holds an even number of calls
        raise ValueError(f"measure: graph timing needs an even iters, got {iters}")
    p, rank = dist.get_world_size(), dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device())
    records: list[dict[str, Any]] = []
    esize = torch.tensor([], dtype=dtype).element_size()

    def inputs(nbytes: int) -> torch.Tensor:
        g = torch.Generator(device=device).manual_seed(rank)
        return torch.randint(-8, 8, (nbytes // esize,), generator=g, device=device).to(dtype)

    def record(impl: str, origin: str, nbytes: int, fn) -> None:
        for timing in timings:
            t = timed(fn, device, iters, warmup, timing, repeats)
            algbw = algorithm_bandwidth(nbytes, t["seconds"])
            records.append({"impl": impl, "origin": origin, "bytes": nbytes, "world_size": p,
                            "dtype": str(dtype).removeprefix("torch."), **t,
                            "algbw": algbw, "busbw": bus_bandwidth(algbw, "all_reduce", p)})

    for nbytes in big:
        x = inputs(nbytes)
        want = x.clone()
        dist.all_reduce(want)
        y = x.clone()
        record("nccl", "library", nbytes, lambda y=y: dist.all_reduce(y))
        for k in pieces:
            ring = RingAllReduce(x.shape, dtype, device, pieces=k)
            if not torch.equal(ring(x.clone()), want):   # small integers: every order is exact
                raise AssertionError(f"RingAllReduce differs from NCCL at {nbytes} bytes")
            record(f"ring/pieces={k}", "book", nbytes, lambda ring=ring, y=y: ring(y))
    for nbytes in small:
        x = inputs(nbytes)
        want = x.clone()
        dist.all_reduce(want)
        one = OneShotAllReduce(x.numel(), dtype)
        for _ in range(3):                 # both buffers, and the first reused
            if not torch.equal(one(x), want):
                raise AssertionError(f"OneShotAllReduce differs from NCCL at {nbytes} bytes")
        y = x.clone()
        record("nccl", "library", nbytes, lambda y=y: dist.all_reduce(y))
        record("one_shot", "book", nbytes, lambda one=one, x=x: one(x))
        if fused:
            one = FusedOneShotAllReduce(x.numel(), dtype)
            for _ in range(3):
                if not torch.equal(one(x), want):
                    raise AssertionError(f"FusedOneShotAllReduce differs from NCCL at {nbytes} "
                                         "bytes")
            record("fused_one_shot", "book", nbytes, lambda one=one, x=x: one(x))
        try:
            lib = _library_one_shot(x, dist.group.WORLD.group_name)
        except Exception as exc:           # noqa: BLE001 - a baseline this torch cannot run
            lib, why = None, f"{type(exc).__name__}: {exc}"
        else:
            why = "torch.ops.symm_mem.one_shot_all_reduce is missing"
        if lib is None:
            records.append({"impl": "torch_one_shot", "bytes": nbytes, "skipped": why})
        else:
            record("torch_one_shot", "library", nbytes, lib)
    return {"records": records}


def smoke_fused(sizes: list[int], calls: int = 20, dtype: torch.dtype = torch.bfloat16) -> None:
    """The fused one-shot checked against NCCL at each size over ``calls`` calls (both buffers,
    flags reused many times), with a ragged size too: run alone before any timing, so that a kernel
    that hangs or is wrong costs this step only."""
    device = torch.device("cuda", torch.cuda.current_device())
    rank = dist.get_rank()
    esize = torch.tensor([], dtype=dtype).element_size()
    one = FusedOneShotAllReduce(max(sizes) // esize, dtype)
    for nbytes in sizes:
        for numel in (nbytes // esize, nbytes // esize - 3):
            g = torch.Generator(device=device).manual_seed(rank + numel)
            x = torch.randint(-8, 8, (numel,), generator=g, device=device).to(dtype)
            want = x.clone()
            dist.all_reduce(want)
            for i in range(calls):
                if not torch.equal(one(x), want):
                    raise AssertionError(f"FusedOneShotAllReduce differs from NCCL at {numel} "
                                         f"elements, call {i}")
    torch.cuda.synchronize(device)


def profile_ring(nbytes: int, pieces: int, calls: int = 10,
                 dtype: torch.dtype = torch.bfloat16) -> str:
    """Where a ring all-reduce's time goes: torch.profiler over ``calls`` calls at ``nbytes``, the
    host-side and GPU-side totals per operation, as a table (run on every rank; rank 0 prints)."""
    from torch.profiler import ProfilerActivity, profile

    device = torch.device("cuda", torch.cuda.current_device())
    x = torch.ones(nbytes // torch.tensor([], dtype=dtype).element_size(), dtype=dtype,
                   device=device)
    ring = RingAllReduce(x.shape, dtype, device, pieces=pieces)
    for _ in range(3):
        ring(x)
    torch.cuda.synchronize()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            ring(x)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cpu_time_total", row_limit=15)


def main(argv: list[str] | None = None) -> int:
    from snippets.part7.launch import init_from_env
    from snippets.part7.sweep import provenance, sizes_between

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--pieces", default="1,2,4,8", help="the ring's piece counts to time")
    ap.add_argument("--timing", default="eager,graph", help="eager, graph or both")
    ap.add_argument("--fused", action="store_true", help="time the one-kernel one-shot too")
    ap.add_argument("--smoke-fused", action="store_true",
                    help="only check the one-kernel one-shot against NCCL, then exit")
    ap.add_argument("--repeats", type=int, default=3, help="separate timed runs per size")
    ap.add_argument("--profile", action="store_true",
                    help="first print where a 1 MiB ring all-reduce spends its time")
    args = ap.parse_args(argv)
    rank, world = init_from_env(timeout_s=600)
    if args.smoke_fused:
        smoke_fused(sizes_between(1 << 10, 1 << 21))
        dist.destroy_process_group()
        if rank == 0:
            print("FusedOneShotAllReduce equals NCCL at every size", flush=True)
        return 0
    if args.profile:
        table = profile_ring(1 << 20, pieces=4)
        if rank == 0:
            print(table, flush=True)
    result = measure(sizes_between(1 << 20, 1 << 30), sizes_between(1 << 10, 1 << 21),
                     args.iters, args.warmup,
                     pieces=tuple(int(k) for k in args.pieces.split(",") if k),
                     timings=tuple(t for t in args.timing.split(",") if t), repeats=args.repeats,
                     fused=args.fused)
    result["provenance"] = provenance(dist.get_backend(), world)
    dist.destroy_process_group()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        for r in result["records"]:
            if "skipped" in r:
                print(f"{r['impl']:>15} {r['bytes']:>11} skipped: {r['skipped']}")
            else:
                print(f"{r['impl']:>15} {r['timing']:>5} {r['bytes']:>11} "
                      f"{r['seconds'] * 1e6:10.1f} us busbw {r['busbw'] / 1e9:7.1f} GB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
