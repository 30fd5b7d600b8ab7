"""One step of a ring all-reduce, timed alone: what NCCL's point-to-point moves per direction when
every rank sends a message to one peer and receives one from another (the ring's step), against
the same bytes exchanged with a single peer, and sent one way only.

Part 7's ring (``fast_allreduce.RingAllReduce``) is a chain of such steps. On two GPUs the ring's
two neighbours are the same GPU; on four they are two different ones. This run separates the
traffic pattern from everything else the ring does (the additions, the Python between calls):

- ``ring_shift``: every rank sends to rank + 1 and receives from rank - 1, in one batch;
- ``pair_exchange``: ranks 2k and 2k + 1 send to and receive from each other, in one batch;
- ``one_way``: rank 2k sends to 2k + 1, which receives (half the ranks send, one direction);
- ``pair_exchange_2rank``: the pair exchange on a communicator of the two ranks alone (four or
  more ranks only), to tell the pattern apart from the communicator's size.

Every rank's message has ``bytes`` bytes; the bandwidth recorded is per direction (bytes over the
slowest rank's time). Needs an even number of ranks. Run under ``torchrun``::

    torchrun --nproc-per-node 4 -m snippets.part7.p2p_patterns --out p2p_patterns.json
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import torch.distributed as dist

from snippets.part7.sweep import TIMINGS, timed

PATTERNS = ("ring_shift", "pair_exchange", "one_way", "pair_exchange_2rank")
SIZES_MIB = (4, 16, 64, 256)


def _batch(ops: list) -> None:
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def pattern_call(pattern: str, send: torch.Tensor, recv: torch.Tensor, rank: int, p: int,
                 pair_group=None):
    """The function one timed call of ``pattern`` runs on this rank (module docstring)."""
    right, left, mate = (rank + 1) % p, (rank - 1) % p, rank ^ 1
    if pattern == "ring_shift":
        return lambda: _batch([dist.P2POp(dist.isend, send, right),
                               dist.P2POp(dist.irecv, recv, left)])
    if pattern == "pair_exchange":
        return lambda: _batch([dist.P2POp(dist.isend, send, mate),
                               dist.P2POp(dist.irecv, recv, mate)])
    if pattern == "one_way":
        op = dist.P2POp(dist.isend, send, mate) if rank % 2 == 0 else \
            dist.P2POp(dist.irecv, recv, mate)
        return lambda: _batch([op])
    if pattern == "pair_exchange_2rank":
        if pair_group is None:
            raise ValueError("pattern_call: pair_exchange_2rank needs the pair's group")
        return lambda: _batch([dist.P2POp(dist.isend, send, mate, group=pair_group),
                               dist.P2POp(dist.irecv, recv, mate, group=pair_group)])
    raise ValueError(f"pattern_call: pattern must be one of {PATTERNS}, got {pattern!r}")


def measure(sizes: list[int], iters: int = 20, warmup: int = 5, timing: str = "graph",
            repeats: int = 3, dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """Every pattern at every size (bytes per rank's message) on the initialised process group:
    one record each, the same on every rank (the slowest rank's time)."""
    p, rank = dist.get_world_size(), dist.get_rank()
    if p < 2 or p % 2:
        raise ValueError(f"p2p_patterns: needs an even number of ranks, got {p}")
    if timing not in TIMINGS:
        raise ValueError(f"p2p_patterns: timing must be one of {TIMINGS}, got {timing!r}")
    esize = torch.tensor([], dtype=dtype).element_size()
    bad = [s for s in sizes if not isinstance(s, int) or s < esize or s % esize]
    if bad or not sizes:
        raise ValueError(f"p2p_patterns: sizes must be positive multiples of {esize} bytes, "
                         f"got {sizes!r}")
    # every rank creates every pair's group, in the same order (new_group is collective)
    pairs = [dist.new_group([r, r + 1]) for r in range(0, p, 2)] if p > 2 else []
    pair_group = pairs[rank // 2] if pairs else None
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device, timing = torch.device("cpu"), "eager"     # graphs need GPUs
    records = []
    for nbytes in sizes:
        send = torch.ones(nbytes // esize, dtype=dtype, device=device)
        recv = torch.empty_like(send)
        for pattern in PATTERNS:
            if pattern == "pair_exchange_2rank" and pair_group is None:
                continue
            fn = pattern_call(pattern, send, recv, rank, p, pair_group)
            t = timed(fn, device, iters, warmup, timing, repeats)
            records.append({"pattern": pattern, "bytes": nbytes, "world_size": p,
                            "dtype": str(dtype).removeprefix("torch."), **t,
                            "per_direction": nbytes / t["seconds"]})
    return {"records": records}


def main(argv: list[str] | None = None) -> int:
    from snippets.part7.launch import init_from_env
    from snippets.part7.sweep import provenance

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes-mib", default=",".join(map(str, SIZES_MIB)),
                    help="message sizes per rank, MiB, comma-separated")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    rank, world = init_from_env(timeout_s=300)
    sizes = [int(float(s) * (1 << 20)) for s in args.sizes_mib.split(",") if s]
    result = measure(sizes, args.iters, args.warmup, repeats=args.repeats)
    result["provenance"] = provenance(dist.get_backend(), world)
    dist.destroy_process_group()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        for r in result["records"]:
            print(f"{r['pattern']:>20} {r['bytes'] >> 10:>9} KiB {r['seconds'] * 1e6:10.1f} us "
                  f"{r['per_direction'] / 1e9:7.1f} GB/s per direction ({r['timing']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
