"""Managing memory: host-device transfers (host_transfer), the footprint helper, and unified memory."""

from __future__ import annotations

import pytest
import torch

from snippets.common.inputs import block_pattern
from snippets.part2 import host_transfer as ht
from snippets.registry import CEILING_MEASURES, CEILINGS

MiB = 1 << 20
VERSIONS = {"v0": ht.h2d_pageable, "v1": ht.h2d_pinned, "v2": ht.d2h_pageable, "v3": ht.d2h_pinned}
LANDS_ON = {"v0": "cuda", "v1": "cuda", "v2": "cpu", "v3": "cpu"}


# ---------------------------------------------------------------- CPU: the op's shape, inputs and refusals

@pytest.mark.op("host_transfer")
def test_reference_is_a_copy():
    x = torch.randn(100)
    out = ht.transfer_ref(x, None)
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()


@pytest.mark.op("host_transfer")
def test_timers_match_what_each_copy_is():
    """Pageable copies involve the CPU and block it: host clock. Pinned copies are DMA on the stream: events."""
    op = ht.host_transfer
    assert {name: impl.timer for name, impl in op.impls.items()} == {"v0": "host", "v1": "device",
                                                                    "v2": "host", "v3": "device"}
    assert op.ceiling == "host_link" and "host_link" in CEILINGS and "host_link" in CEILING_MEASURES
    assert op.bytes_moved({"bytes": 4 * MiB}, torch.float32) == 4 * MiB
    assert op.tolerance(torch.float32) == (0.0, 0.0), "a copy is exact"


@pytest.mark.op("host_transfer")
@pytest.mark.parametrize("n", [1, 17, MiB - 1, MiB, MiB + 5, 3 * MiB])
def test_pattern_blocks_differ(n):
    gen = torch.Generator().manual_seed(0)
    x = block_pattern(n, gen)
    assert x.shape == (n,) and x.dtype == torch.float32 and x.is_contiguous()
    again = block_pattern(n, torch.Generator().manual_seed(0))
    assert torch.equal(x, again), "deterministic for a seed"
    if n > MiB:  # block b is block 0 shifted by b: a block copied to the wrong place would not match
        torch.testing.assert_close(x[MiB : 2 * MiB][: n - MiB] - 1.0, x[: min(MiB, n - MiB)], rtol=0, atol=1e-5)
        assert not torch.equal(x[MiB : 2 * MiB][: n - MiB], x[: min(MiB, n - MiB)])


@pytest.mark.op("host_transfer")
def test_make_inputs_refuses_partial_elements():
    with pytest.raises(ValueError, match="whole number"):
        ht._make_inputs({"bytes": 6}, torch.float32, "cuda", torch.Generator())


@pytest.mark.op("host_transfer")
@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_versions_refuse_bad_input(version):
    """Checked before anything touches the GPU, so these refusals hold on any machine."""
    fn = VERSIONS[version]
    x = torch.randn(64)
    with pytest.raises(TypeError, match="TransferBuffers"):
        fn(x, None)
    with pytest.raises(TypeError, match="dtype"):
        fn(x.double(), None)
    with pytest.raises(ValueError, match="empty"):
        fn(x[:0], None)
    with pytest.raises(ValueError, match="contiguous"):
        fn(x[::2], None)
    with pytest.raises(TypeError, match="torch.Tensor"):
        fn(x.tolist(), None)


def test_footprint_without_gpu_is_clear(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        ht.footprint(lambda: None)


# ---------------------------------------------------------------- GPU: the transfers

@pytest.mark.gpu
@pytest.mark.op("host_transfer")
def test_buffers_are_what_they_say():
    x = block_pattern(1000, torch.Generator().manual_seed(1))
    b = ht.TransferBuffers.like(x)
    assert b.pinned.is_pinned() and b.to_pinned.is_pinned() and not b.to_pageable.is_pinned()
    assert not b.pinned.is_cuda and b.device.is_cuda
    assert torch.equal(b.pinned, x) and torch.equal(b.device.cpu(), x)
    assert b.to_pageable.isnan().all() and b.to_pinned.isnan().all(), "destinations start poisoned"


@pytest.mark.gpu
@pytest.mark.op("host_transfer")
@pytest.mark.parametrize("version", sorted(VERSIONS))
@pytest.mark.parametrize("nbytes", [4, 4 * 17, 4 * 65_539, 4 * MiB])
def test_versions_move_the_data_exactly(version, nbytes):
    x, bufs = ht._make_inputs({"bytes": nbytes}, torch.float32, "cuda", torch.Generator().manual_seed(nbytes))
    out = VERSIONS[version](x, bufs)
    assert out.device.type == LANDS_ON[version] and out.shape == x.shape and out.dtype == x.dtype
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), x)
    if version == "v3":
        assert out.is_pinned()


@pytest.mark.gpu
@pytest.mark.op("host_transfer")
def test_pinned_upload_is_stream_ordered():
    """v1 returns before the copy is done; work queued after it on the same stream still sees the data."""
    x, bufs = ht._make_inputs({"bytes": 64 * MiB}, torch.float32, "cuda", torch.Generator().manual_seed(0))
    total = ht.h2d_pinned(x, bufs).double().sum()  # queued behind the copy: no synchronize in between
    assert total.item() == pytest.approx(x.double().sum().item(), rel=1e-12)


@pytest.mark.gpu
@pytest.mark.op("host_transfer")
def test_host_link_ceiling_measures_something():
    c = CEILING_MEASURES["host_link"](True)
    assert c["unit"] == "GB/s" and 0.5 < c["value"] < 2000, c
    assert "H2D" in c["how"] and "D2H" in c["how"]


# ---------------------------------------------------------------- GPU: footprint

@pytest.mark.gpu
def test_footprint_sees_a_temporary_and_the_cache():
    """torch's view (allocated, reserved) is this process's own; the driver's (free memory) counts every process on
    the GPU, so the driver-side checks hold only while no other process allocates or frees: scripts/gpu_tests.sh
    runs this file alone, after the files it runs in parallel (KM_ALONE)."""
    nbytes = 256 * MiB
    torch.cuda.empty_cache()

    def temporary():
        torch.empty(nbytes // 4, device="cuda").fill_(1.0)  # allocated, then freed on return

    s = ht.footprint(temporary)
    assert s["peak_allocated_delta"] >= nbytes
    assert s["retained"] == 0, "nothing outlives the call"
    assert s["device_total"] >= s["device_free_before"]
    # Earlier work in this process can leave torch a segment with free room inside (a live tensor keeps the
    # segment): the allocation may then be carved from it, and neither torch's pool nor the driver's count
    # grows. Only when the pool had no such room must both grow by the whole block.
    headroom = s["reserved_before"] - s["allocated_before"]
    if headroom < nbytes:
        # The freed block stays in torch's cache: reserved by torch, used as far as the driver can tell.
        assert s["reserved_delta"] >= nbytes and s["peak_reserved_delta"] >= nbytes
        assert s["device_used_delta"] >= nbytes
        free_cached, _ = torch.cuda.mem_get_info()
        torch.cuda.empty_cache()  # hand the cached block back to the driver
        free_emptied, _ = torch.cuda.mem_get_info()
        assert free_emptied - free_cached >= nbytes
    else:
        assert s["reserved_delta"] >= 0


@pytest.mark.gpu
def test_footprint_counts_what_fn_keeps():
    keep = []
    s = ht.footprint(lambda: keep.append(torch.ones(16 * MiB // 4, device="cuda")))  # noqa: F821
    assert s["retained"] >= 16 * MiB and s["peak_allocated_delta"] >= 16 * MiB
    del keep


# ---------------------------------------------------------------- GPU: unified memory

@pytest.mark.gpu
def test_unified_memory_prefetch_beats_page_faults():
    nbytes = 64 * MiB
    t = ht.unified_memory_timings(nbytes)
    n = nbytes // 4
    assert t["on_demand_sum"] == n * 0.5, "the GPU read what the CPU wrote"
    assert t["after_prefetch_sum"] == n * 0.25, "and, after the prefetch, what the CPU wrote next"
    assert t["on_demand_ms"] > 0 and t["prefetch_ms"] > 0 and t["after_prefetch_ms"] > 0
    # Reading 64 MiB of device memory takes tens of microseconds; faulting it over from the host, milliseconds.
    assert t["after_prefetch_ms"] < t["on_demand_ms"]


@pytest.mark.gpu
def test_unified_memory_refuses_unsafe_sizes():
    with pytest.raises(ValueError, match="1 GiB"):
        ht.unified_memory_timings(2 << 30)
    with pytest.raises(ValueError, match="multiple of 4"):
        ht.unified_memory_timings(6)
    with pytest.raises(ValueError, match="positive"):
        ht.unified_memory_timings(0)
    with pytest.raises(TypeError, match="int"):
        ht.unified_memory_timings(1.5e6)
