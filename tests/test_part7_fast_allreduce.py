"""The fast all-reduces of snippets/part7/fast_allreduce.py: the pipelined in-place ring equals
torch.distributed's all-reduce on gloo for every world size and piece count (integer-valued
inputs: exact), refuses a tensor it was not built for, and refuses to be built for different
shapes on different ranks. The one-shot all-reduce needs GPUs with peer-to-peer access: it runs
in the multi-GPU measurements (python -m snippets.part7.fast_allreduce under torchrun)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from snippets.part7.fast_allreduce import OneShotAllReduce, RingAllReduce
from snippets.part7.launch import run_world

SHAPES = ((1,), (7,), (5, 3), (1000,), (4097,))
PIECES = (1, 3, 8)


def _rank_checks(rank: int, world: int) -> list[str]:
    failures = []
    for shape in SHAPES:
        for pieces in PIECES:
            g = torch.Generator().manual_seed(100 * rank + len(shape))
            x = torch.randint(-50, 50, shape, generator=g).double()
            want = x.clone()
            dist.all_reduce(want)
            ring = RingAllReduce(shape, torch.float64, "cpu", pieces=pieces)
            y = x.clone()
            got = ring(y)
            if got.data_ptr() != y.data_ptr():
                failures.append(f"{shape} pieces={pieces}: not in place")
            if not torch.equal(got, want):
                failures.append(f"{shape} pieces={pieces}: max diff {(got - want).abs().max()}")
            if not torch.equal(ring(x.clone()), want):          # a second call, same buffers
                failures.append(f"{shape} pieces={pieces}: second call differs")
    ring = RingAllReduce((4,), torch.float32, "cpu")
    for bad in (torch.zeros(5), torch.zeros(4, dtype=torch.float64), torch.zeros(8)[::2]):
        try:
            ring(bad)
            failures.append(f"accepted {tuple(bad.shape)} {bad.dtype} contiguous="
                            f"{bad.is_contiguous()}")
        except ValueError:
            pass
    return failures


def _rank_mismatch(rank: int, world: int) -> None:
    RingAllReduce((4 + rank,), torch.float32, "cpu")


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_equals_all_reduce(world):
    for rank, failures in enumerate(run_world(_rank_checks, world, backend="gloo")):
        assert failures == [], f"rank {rank}: {failures}"


def test_ring_built_for_different_shapes_raises_on_every_rank():
    with pytest.raises(RuntimeError, match="same shape"):
        run_world(_rank_mismatch, 2, backend="gloo", timeout_s=60)


def test_ring_rejects_bad_pieces_before_any_communication():
    with pytest.raises(ValueError, match="pieces"):
        RingAllReduce((4,), torch.float32, "cpu", pieces=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without GPUs")
def test_one_shot_needs_gpus():
    with pytest.raises(RuntimeError, match="peer-to-peer"):
        OneShotAllReduce(16, torch.float32)
