"""The fast all-reduces of snippets/part7/fast_allreduce.py: the pipelined in-place ring equals
torch.distributed's all-reduce on gloo for every world size and piece count (integer-valued
inputs: exact), refuses a tensor it was not built for, and refuses to be built for different
shapes on different ranks. The one-shot all-reduces need GPUs with peer-to-peer access: they run
in the multi-GPU measurements (python -m snippets.part7.fast_allreduce under torchrun). The fused
one-shot's kernel is also run here, under the Triton interpreter, with the ranks' buffers and flags
in one process: one rank alone, and two ranks one after the other with the first one's peer signal
already in place, which checks the copy, the flag indexing and handshake states, and the sum."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist

from snippets._checks import triton_interpreting
from snippets.part7.fast_allreduce import (
    FusedOneShotAllReduce,
    OneShotAllReduce,
    RingAllReduce,
    one_shot_kernel,
)
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
    with pytest.raises(RuntimeError, match="peer-to-peer"):
        FusedOneShotAllReduce(16, torch.float32)


try:   # the interpreter's bounds checks (root conftest.py) must know the buffers behind the tables
    from interpreter_guard import reachable
except ImportError:  # checks off, or no interpreter
    def reachable(*tensors):
        return contextlib.nullcontext()

# the kernel on CPU tensors: under the interpreter only (on a GPU it runs in the multi-GPU step)
interpreted = pytest.mark.skipif(not triton_interpreting(), reason="runs the kernel on the CPU")


def _ptrs(*tensors: torch.Tensor) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)


BLOCK = 128


@interpreted
@pytest.mark.parametrize("n", [1, 127, 128, 300])
@pytest.mark.parametrize("turn", [0, 1])
def test_fused_one_shot_kernel_on_one_rank(n, turn):
    """World size 1: the kernel copies into its buffer half ``turn`` and sums that one buffer."""
    cap = 384
    x = torch.randn(n)
    buf = torch.full((2 * cap,), float("nan"))
    flags = torch.zeros(3, dtype=torch.int32)
    out = torch.full((n,), float("nan"))
    with reachable(buf, flags):
        one_shot_kernel[(-(-n // BLOCK),)](x, out, _ptrs(buf), _ptrs(flags), n, 0, turn * cap,
                                           WORLD=1, BLOCK=BLOCK)
    assert torch.equal(out, x)
    assert torch.equal(buf[turn * cap:turn * cap + n], x)
    assert buf[(1 - turn) * cap:(1 - turn) * cap + n].isnan().all()   # the other half untouched
    assert flags.eq(0).all()                                            # no peer, no signal


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_one_shot_kernel_handshake_on_two_ranks(dtype):
    """Two ranks run one after the other in one process. Rank 0 runs first, so rank 1's slice and
    its signal to rank 0 are put in place beforehand (what rank 1 would have done concurrently);
    then rank 1 runs. Each rank's output is the sum; each flag ends in the state the protocol says:
    rank 0's signals to rank 1 taken back to 0, rank 1's signal to rank 0 set (for rank 0 to take
    in its next call)."""
    n, cap, turn = 300, 384, 1
    blocks = -(-n // BLOCK)
    xs = [torch.randint(-8, 8, (n,)).to(dtype) for _ in range(2)]
    want = xs[0] + xs[1]
    bufs = [torch.zeros(2 * cap, dtype=dtype) for _ in range(2)]
    flags = [torch.zeros(blocks * 2, dtype=torch.int32) for _ in range(2)]
    bufs[1][turn * cap:turn * cap + n] = xs[1]          # rank 1's copy has landed ...
    flags[0][1::2] = 1                                  # ... and it has told rank 0, block by block
    outs = [torch.empty(n, dtype=dtype) for _ in range(2)]
    for rank in (0, 1):
        with reachable(*bufs, *flags):
            one_shot_kernel[(blocks,)](xs[rank], outs[rank], _ptrs(*bufs), _ptrs(*flags), n,
                                       rank, turn * cap, WORLD=2, BLOCK=BLOCK)
        if rank == 0:
            # rank 0 took rank 1's signals and left its own for rank 1, one per block
            assert flags[0].tolist() == [0] * (2 * blocks)
            assert flags[1][0::2].tolist() == [1] * blocks and flags[1][1::2].eq(0).all()
    for rank in (0, 1):
        assert torch.equal(outs[rank], want), rank
    assert flags[1].eq(0).all()                         # rank 1 took rank 0's signals
    assert flags[0][1::2].tolist() == [1] * blocks      # and left one for rank 0's next call
    assert flags[0][0::2].eq(0).all()                   # a rank never signals itself


def test_one_shot_calls_are_checked_before_any_copy():
    """The checks both one-shot all-reduces run on every call, without GPUs: the dtype and device
    they were built for, and no more elements than their buffers hold."""
    from snippets.part7.fast_allreduce import check_one_shot_call

    cpu = torch.device("cpu")
    assert check_one_shot_call("f", torch.zeros(4, 3), torch.float32, cpu, 12) == 12
    for bad, match in ((torch.zeros(4, dtype=torch.float64), "expected a torch.float32"),
                       ([0.0] * 4, "got list"),
                       (torch.zeros(13), "13 elements, built for at most 12")):
        with pytest.raises(ValueError, match=match):
            check_one_shot_call("f", bad, torch.float32, cpu, 12)
