"""Recursive halving and doubling (collectives.py's teaching version) built to be timed against
NCCL's all-reduce, for the machine where the book's ring is slow: four GPUs or more.

``p2p_patterns`` shows why the ring is slow there: a ring step sends to one peer and receives
from another, and NCCL's point-to-point moves that pattern at tens of MiB well below an exchange
with a single peer. Halving and doubling is made of such exchanges only (rank r with r XOR 2^k),
its messages are larger than the ring's (n/2, n/4, ... against the ring's n/p every step), and it
moves the same bytes per rank: (p - 1)/p of the vector each way, for p a power of two.

``HalvingDoublingAllReduce`` works in place, agrees on the shape once when it is built (as
``RingAllReduce`` does) and keeps one receive buffer of half the vector. ``python -m
snippets.part7.fast_halving --out halving.json`` under torchrun times it against NCCL's all-reduce
and the book's ring in one run; ``scripts/part7_gpus.sh`` runs it.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch
import torch.distributed as dist

from snippets.part7.collectives import agree, describe_input
from snippets.part7.cost import algorithm_bandwidth, bus_bandwidth
from snippets.part7.fast_allreduce import RingAllReduce
from snippets.part7.sweep import TIMINGS, timed

# NCCL splits a point-to-point message over its channels in chunks of NCCL_P2P_NVL_CHUNKSIZE bytes
# (over NVLink), so a message of a few tens of MiB fills every channel only with chunks smaller
# than NCCL's default; p2p_patterns measures the default, this run sets the smaller chunk
P2P_CHUNK_BYTES = 1 << 16


# --8<-- [start:halving]
class HalvingDoublingAllReduce:
    """An in-place all-reduce (sum) for tensors of one shape, dtype and device, agreed by every
    rank when it is built, on a power-of-two number of ranks. Halving: in step k rank r exchanges
    with r XOR p/2^(k+1), keeps half of the chunks it is responsible for and adds the partner's
    copy of that half. Doubling: the same exchanges in reverse order, each rank sending all the
    summed chunks it holds, received straight into place."""

    def __init__(self, shape, dtype: torch.dtype, device, group=None):
        self.shape, self.dtype, self.device = tuple(shape), dtype, torch.device(device)
        self.group = group
        self.rank, self.p = dist.get_rank(group), dist.get_world_size(group)
        if self.p & (self.p - 1):
            raise ValueError(f"HalvingDoublingAllReduce: needs a power-of-two number of ranks, "
                             f"got {self.p} (use RingAllReduce)")
        probe = torch.empty(self.shape, dtype=dtype, device="meta")   # a shape, no memory
        everyone = agree("HalvingDoublingAllReduce", group, describe_input(probe))
        if len({d[2] for d in everyone}) > 1:
            raise ValueError("HalvingDoublingAllReduce: every rank must build it for the same "
                             "shape, got " + ", ".join(f"rank {r}: {d[2]}"
                                                       for r, d in enumerate(everyone)))
        numel = probe.numel()
        self.at = [numel * k // self.p for k in range(self.p + 1)]       # p chunks
        self.steps = []                 # (partner, chunks kept, chunks given), largest first
        lo, hi, mask = 0, self.p, self.p // 2
        while mask:
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if self.rank & mask == 0 else ((mid, hi), (lo, mid))
            self.steps.append((self.rank ^ mask, keep, give))
            lo, hi = keep
            mask //= 2
        biggest = max((self.at[k[1]] - self.at[k[0]] for _, k, _ in self.steps), default=0)
        self.incoming = torch.empty(biggest, dtype=dtype, device=self.device)

    def _exchange(self, send: torch.Tensor, recv: torch.Tensor, peer: int) -> None:
        ops = [dist.P2POp(op, t, group=self.group, group_peer=peer)
               for op, t in ((dist.isend, send), (dist.irecv, recv)) if t.numel()]
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()

    def _check(self, x) -> None:
        """The local checks of a call: the tensor it was built for (no communication)."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"HalvingDoublingAllReduce: expected a tensor, got {type(x).__name__}")
        if (tuple(x.shape), x.dtype, x.device) != (self.shape, self.dtype, self.device):
            raise ValueError(f"HalvingDoublingAllReduce was built for shape {self.shape}, "
                             f"{self.dtype} on {self.device}; got shape {tuple(x.shape)}, "
                             f"{x.dtype} on {x.device}")
        if not x.is_contiguous():
            raise ValueError("HalvingDoublingAllReduce: the tensor must be contiguous (it is "
                             "reduced in place)")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x)
        flat, at = x.view(-1), self.at
        for peer, keep, give in self.steps:                  # halving: a reduce-scatter
            mine = flat[at[keep[0]]:at[keep[1]]]
            buf = self.incoming[:mine.numel()]
            self._exchange(flat[at[give[0]]:at[give[1]]], buf, peer)
            mine += buf
        for peer, keep, give in reversed(self.steps):        # doubling: an all-gather
            # this rank holds the sum of the chunks it kept at this step, the partner those it gave
            self._exchange(flat[at[keep[0]]:at[keep[1]]], flat[at[give[0]]:at[give[1]]], peer)
        return x
# --8<-- [end:halving]


def measure(sizes: list[int], iters: int = 20, warmup: int = 5,
            dtype: torch.dtype = torch.bfloat16, timings: tuple[str, ...] = ("graph",),
            repeats: int = 3) -> dict[str, Any]:
    """Time NCCL's all-reduce, the book's ring (one piece per step) and halving-doubling at each
    of ``sizes`` (bytes) in one run, checking each book version against NCCL's result first."""
    if not timings or any(t not in TIMINGS for t in timings):
        raise ValueError(f"measure: timings must be some of {TIMINGS}, got {timings!r}")
    p, rank = dist.get_world_size(), dist.get_rank()
    if p & (p - 1):
        raise ValueError(f"measure: halving-doubling needs a power-of-two number of ranks, got {p}")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device, timings = torch.device("cpu"), ("eager",)      # graphs need GPUs
    esize = torch.tensor([], dtype=dtype).element_size()
    records: list[dict[str, Any]] = []
    for nbytes in sizes:
        g = torch.Generator(device=device).manual_seed(rank)
        x = torch.randint(-8, 8, (nbytes // esize,), generator=g, device=device).to(dtype)
        want = x.clone()
        dist.all_reduce(want)
        y = x.clone()
        versions = [("nccl", "library", lambda y=y: dist.all_reduce(y))]
        for impl, algo in (("ring/pieces=1", RingAllReduce(x.shape, dtype, device, pieces=1)),
                           ("halving_doubling", HalvingDoublingAllReduce(x.shape, dtype, device))):
            if not torch.equal(algo(x.clone()), want):       # small integers: every order is exact
                raise AssertionError(f"{impl} differs from NCCL at {nbytes} bytes")
            versions.append((impl, "book", lambda algo=algo, y=y: algo(y)))
        for impl, origin, fn in versions:
            for timing in timings:
                t = timed(fn, device, iters, warmup, timing, repeats)
                algbw = algorithm_bandwidth(nbytes, t["seconds"])
                records.append({"impl": impl, "origin": origin, "bytes": nbytes, "world_size": p,
                                "dtype": str(dtype).removeprefix("torch."), **t, "algbw": algbw,
                                "busbw": bus_bandwidth(algbw, "all_reduce", p)})
    return {"records": records}


def main(argv: list[str] | None = None) -> int:
    from snippets.part7.launch import init_from_env
    from snippets.part7.sweep import provenance, sizes_between

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--min-bytes", type=int, default=1 << 20)
    ap.add_argument("--max-bytes", type=int, default=1 << 30)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--p2p-chunk-bytes", type=int, default=P2P_CHUNK_BYTES,
                    help="NCCL_P2P_NVL_CHUNKSIZE for this process, set before NCCL starts unless "
                         "the environment sets it (0: NCCL's default)")
    args = ap.parse_args(argv)
    if args.p2p_chunk_bytes < 0:
        raise ValueError(f"--p2p-chunk-bytes must be >= 0, got {args.p2p_chunk_bytes}")
    if args.p2p_chunk_bytes:
        os.environ.setdefault("NCCL_P2P_NVL_CHUNKSIZE", str(args.p2p_chunk_bytes))
    rank, world = init_from_env(timeout_s=600)
    result = measure(sizes_between(args.min_bytes, args.max_bytes), args.iters, args.warmup,
                     repeats=args.repeats)
    result["provenance"] = provenance(dist.get_backend(), world)
    chunk = os.environ.get("NCCL_P2P_NVL_CHUNKSIZE")       # None: NCCL's default
    result["nccl_p2p_chunk_bytes"] = int(chunk) if chunk else None
    dist.destroy_process_group()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        for r in result["records"]:
            print(f"{r['impl']:>17} {r['timing']:>5} {r['bytes']:>11} "
                  f"{r['seconds'] * 1e6:10.1f} us busbw {r['busbw'] / 1e9:7.1f} GB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
