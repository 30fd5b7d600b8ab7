"""BucketedDDP on GPUs over NCCL (snippets/part7/ddp.py), where each .grad is a view of its bucket
that NCCL's stream averages in place: the same steps as torch's DDP. Its own file,
so that tests/test_part7_ddp.py (gloo ranks on the CPU) stays on the GPU suite's CPU-only list."""

from __future__ import annotations

import pytest
import torch
from test_part7_ddp import TOL, assert_float64_steps_equal_torchs, train

from snippets.part7.launch import run_world


def ddp_gpu_world(rank: int, world: int) -> dict:
    device = f"cuda:{rank}"
    torch.backends.cuda.matmul.allow_tf32 = False
    out = {(wrapper, dtype): train(rank, world, dtype, wrapper, device=device)
           for dtype in (torch.float64, torch.float32) for wrapper in ("ours", "torch")}
    out["no_sync"] = train(rank, world, torch.float64, "ours", steps=4, micro=2, device=device)
    out["torch no_sync"] = train(rank, world, torch.float64, "torch", steps=4, micro=2,
                                 device=device)
    return out


@pytest.mark.gpu
def test_bucketed_ddp_on_nccl_equals_torchs_ddp():
    """On GPUs over NCCL (two if there are two, else one rank), where the optimizer reads buckets that
    NCCL's stream has averaged: BucketedDDP takes the same steps as torch's DDP (in float64 bit
    for bit: both multiply by 1/p on the way into the bucket, and a sum of two is the same in any
    order)."""
    results = run_world(ddp_gpu_world, min(2, torch.cuda.device_count()), backend="nccl",
                        timeout_s=240)
    for rank, r in enumerate(results):
        assert_float64_steps_equal_torchs(r, rank)
        for a, b in zip(r["ours", torch.float32][1], r["torch", torch.float32][1]):
            torch.testing.assert_close(a, b, atol=TOL[torch.float32], rtol=0)
        assert r["ours", torch.float64][3], rank        # every .grad a view of its bucket
        log = r["ours", torch.float64][2]
        last_grad = max(i for i, (kind, _) in enumerate(log) if kind == "grad")
        assert log.index(("launch", 0)) < last_grad, log
