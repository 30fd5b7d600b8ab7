"""Streams and launch overhead: the chunking helper, the compute stage, the refusals (on any machine), and on a
GPU every pipeline against the exact fp32 result, stream ordering with the caller's stream, every launch version
against the reference, the persistent kernel's exactly-once claim of every item, and graph replay."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import HAS_GPU
from snippets.part3 import streams as st
from snippets.registry import CEILING_MEASURES, CEILINGS

PIPELINES = {"v0": st.pipeline_serial, "v1": st.pipeline_chunked, "v2": st.pipeline_2_streams,
             "v3": st.pipeline_4_streams}
LAUNCHERS = {"v1": st.launches_torch, "v2": st.launches_cupy, "v3": st.launches_triton, "v4": st.launches_graph,
             "v5": st.launches_persistent}


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _pinned(n: int, seed: int = 0, fill: float | None = None) -> torch.Tensor:
    t = torch.empty(n, dtype=torch.float32, pin_memory=True)
    if fill is None:
        t.copy_(torch.randn(n, generator=_gen(seed)))
    else:
        t.fill_(fill)
    return t


# ---------------------------------------------------------------- chunking (pure Python)

@pytest.mark.op("stream_overlap")
@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 17, 100, 1023])
def test_chunk_spans_cover_the_range_in_order(n):
    for chunks in sorted({1, 2, 3, 4, 5, 16, n - 1, n} - {0}):
        if chunks > n:
            continue
        spans = st.chunk_spans(n, chunks)
        assert len(spans) == chunks
        assert spans[0][0] == 0 and spans[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), "contiguous, in order, no gap or overlap"
        lengths = [hi - lo for lo, hi in spans]
        assert min(lengths) >= 1 and max(lengths) - min(lengths) <= 1, lengths
        assert lengths == sorted(lengths, reverse=True), "the longer spans come first"
        assert sum(lengths) == n


@pytest.mark.op("stream_overlap")
def test_chunk_spans_ragged_example():
    assert st.chunk_spans(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert st.chunk_spans(5, 5) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    assert st.chunk_spans(64 * 2**20 + 5, 16)[:6] == [(k * (4 * 2**20 + 1), (k + 1) * (4 * 2**20 + 1))
                                                     for k in range(5)] + [(5 * (4 * 2**20 + 1),
                                                                            5 * (4 * 2**20 + 1) + 4 * 2**20)]


@pytest.mark.op("stream_overlap")
@pytest.mark.parametrize("n, chunks, exc, words", [
    (10, 0, ValueError, "chunks"), (10, -3, ValueError, "chunks"), (10, 11, ValueError, "more than"),
    (0, 1, ValueError, "n"), (-1, 1, ValueError, "n"), (10, 2.0, TypeError, "chunks"), (10, True, TypeError, "chunks"),
    (10.0, 2, TypeError, "n")])
def test_chunk_spans_refuse_bad_counts(n, chunks, exc, words):
    with pytest.raises(exc, match=words):
        st.chunk_spans(n, chunks)


# ---------------------------------------------------------------- the compute stage (Triton: GPU or interpreter)

@pytest.mark.op("stream_overlap")
@pytest.mark.parametrize("n", [1, 17, 1024, 1025, 3000])
@pytest.mark.parametrize("fmas", [0, 1, 5, 40])
def test_fma_chain_is_exactly_the_loop(device, n, fmas):
    x = torch.randn(n, generator=_gen(n + fmas)).to(device)
    y = st.fma_chain(x, fmas)
    assert y.shape == x.shape and y.dtype == torch.float32 and y.data_ptr() != x.data_ptr()
    assert torch.equal(y, st.fma_chain_ref(x, fmas)), "multiplying by 0.5 is exact: fused or not, same bits"
    # and the loop is x * S, which the reference computes in closed form (float64)
    closed = st.stream_overlap_ref(x.double(), None, fmas, 1)
    torch.testing.assert_close(y.double(), closed, rtol=1e-6, atol=1e-6)
    if fmas == 0:
        assert torch.equal(y, x)


@pytest.mark.op("stream_overlap")
def test_chain_factor_is_the_geometric_sum():
    for fmas in (0, 1, 2, 10, 60, 2048):
        assert st.chain_factor(fmas) == pytest.approx(sum(st.C**j for j in range(fmas + 1)), rel=1e-15)
    assert st.chain_factor(2048) == 2.0


@pytest.mark.op("stream_overlap")
def test_fma_chain_refuses_bad_input(device):
    x = torch.randn(64, device=device)
    with pytest.raises(TypeError, match="dtype"):
        st.fma_chain(x.double(), 3)
    with pytest.raises(ValueError, match="fmas"):
        st.fma_chain(x, -1)
    with pytest.raises(ValueError, match="empty"):
        st.fma_chain(x[:0], 3)
    with pytest.raises(TypeError, match="fmas"):
        st.fma_chain(x, 3.0)


# ---------------------------------------------------------------- pipelines: registration and refusals (any machine)

@pytest.mark.op("stream_overlap")
def test_pipeline_op_is_declared_as_host_timed_from_pinned_memory():
    op = st.stream_overlap
    assert set(op.impls) == {"v0", "v1", "v2", "v3"}
    assert all(i.timer == "host" and i.inputs_on == "cpu" and i.device == "cuda" for i in op.impls.values())
    assert op.ceiling == "host_link" and "host_link" in CEILINGS and "host_link" in CEILING_MEASURES
    size = {"n": 1000, "fmas": 7, "chunks": 3}
    assert op.bytes_moved(size, torch.float32) == 8000  # 4000 bytes up, 4000 down
    assert op.flops(size, torch.float32) == 14000
    assert op.sweep_axis == "chunks" and all(s["chunks"] <= s["n"] for s in [op.headline, *op.sweep])
    assert all(s["chunks"] <= s["n"] for s in op.test_sizes) and {"n": 1} in [{"n": s["n"]} for s in op.test_sizes]
    with pytest.raises(ValueError, match="pinned host memory"):
        st._pipeline_inputs({"n": 8, "fmas": 1, "chunks": 1}, torch.float32, "cuda", _gen())


@pytest.mark.op("stream_overlap")
@pytest.mark.parametrize("version", sorted(PIPELINES))
def test_pipelines_refuse_bad_input(version):
    """Checked before pinning or the GPU is needed, so these refusals hold on any machine (plain CPU tensors)."""
    fn = PIPELINES[version]
    x, out = torch.randn(64), torch.empty(64)
    with pytest.raises(TypeError, match="dtype"):
        fn(x.double(), out.double(), 3, 2)
    with pytest.raises(TypeError, match="dtype"):
        fn(x, out.half(), 3, 2)
    with pytest.raises(ValueError, match="cpu device"):  # device memory where pinned host memory is needed
        fn(torch.empty(64, device="meta"), out, 3, 2)
    with pytest.raises(ValueError, match="shape"):
        fn(x, torch.empty(65), 3, 2)
    with pytest.raises(ValueError, match="empty"):
        fn(x[:0], out[:0], 3, 1)
    with pytest.raises(ValueError, match="contiguous"):
        fn(x[::2], out[::2], 3, 2)
    with pytest.raises(TypeError, match="torch.Tensor"):
        fn(x.tolist(), out, 3, 2)
    for chunks in (0, -1):
        with pytest.raises(ValueError, match="chunks"):
            fn(x, out, 3, chunks)
    with pytest.raises(ValueError, match="more than the 64 elements"):
        fn(x, out, 3, 65)
    with pytest.raises(TypeError, match="chunks"):
        fn(x, out, 3, 2.5)
    with pytest.raises(ValueError, match="fmas"):
        fn(x, out, -1, 2)
    with pytest.raises(ValueError, match="pinned"):  # everything else is right: only the pinning is missing
        fn(x, out, 3, 2)


@pytest.mark.op("stream_overlap")
def test_run_pipeline_refuses_bad_stream_counts():
    x, out = torch.randn(64), torch.empty(64)
    for streams in (0, -2):
        with pytest.raises(ValueError, match="streams"):
            st.run_pipeline(x, out, 3, 4, streams)
    with pytest.raises(TypeError, match="streams"):
        st.run_pipeline(x, out, 3, 4, None)


# ---------------------------------------------------------------- launch_overhead: registration and refusals

@pytest.mark.op("launch_overhead")
def test_launch_op_is_a_host_timed_latency():
    op = st.launch_overhead
    assert set(op.impls) == {"v1", "v2", "v3", "v4", "v5"} and op.kind == "micro" and op.ceiling is None
    assert op.metric == "ns/launch" and op.lower_is_better
    assert all(i.timer == "host" for i in op.impls.values())
    assert op.impls["v3"].device == "any" and op.impls["v3"].lang == "Triton"
    assert op.accesses({"launches": 1000}, torch.int32) == 1000
    assert op.rate({"launches": 1000}, torch.int32, 2.0) == pytest.approx(2000.0)  # 2 ms / 1000 = 2000 ns
    assert op.tolerance(torch.int32) == (0.0, 0.0)


@pytest.mark.op("launch_overhead")
def test_launch_reference_adds_one_per_item():
    base = torch.tensor([5, -3, 0, 2**30], dtype=torch.int32)
    out = st.launch_overhead_ref(base, 4)
    assert out.dtype == torch.int32 and out.tolist() == [6, -2, 1, 2**30 + 1]
    assert base.tolist() == [5, -3, 0, 2**30], "the reference does not modify its input"


@pytest.mark.op("launch_overhead")
def test_launch_inputs_are_random_and_seeded():
    a, n = st._launch_inputs({"launches": 1000}, torch.int32, "cpu", _gen(1))
    b, _ = st._launch_inputs({"launches": 1000}, torch.int32, "cpu", _gen(1))
    assert n == 1000 and a.dtype == torch.int32 and torch.equal(a, b)
    assert a.unique().numel() > 990, "not zeros, nor a few repeated values"


@pytest.mark.op("launch_overhead")
@pytest.mark.parametrize("version", sorted(LAUNCHERS))
def test_launchers_refuse_bad_counts(version, device):
    """Wrong launch counts and shapes, on the device each version accepts (on a CPU machine only the Triton
    version runs; the others refuse the CPU tensor itself)."""
    fn = LAUNCHERS[version]
    dev = device if version == "v3" else "cuda"
    if dev == "cuda" and not HAS_GPU:
        base = torch.zeros(8, dtype=torch.int32)
        with pytest.raises(ValueError, match="cuda device"):
            fn(base, 8)
        return
    base = torch.arange(8, dtype=torch.int32, device=dev)
    for launches in (0, -1):
        with pytest.raises(ValueError, match="launches"):
            fn(base, launches)
    with pytest.raises(ValueError, match="one element per launch"):
        fn(base, 7)
    with pytest.raises(TypeError, match="launches"):
        fn(base, 8.0)
    with pytest.raises(TypeError, match="dtype"):
        fn(base.float(), 8)
    with pytest.raises(ValueError, match="one-dimensional"):
        fn(base.view(2, 4), 8)
    with pytest.raises(ValueError, match="empty"):
        fn(base[:0], 1)
    with pytest.raises(ValueError, match="contiguous"):
        fn(base[::2], 4)


@pytest.mark.op("launch_overhead")
@pytest.mark.parametrize("n", [1, 7, 33])
def test_triton_launches_each_item_once(device, n):
    base = torch.randint(-100, 100, (n,), generator=_gen(n), dtype=torch.int32).to(device)
    keep = base.clone()
    out = st.launches_triton(base, n)
    assert torch.equal(out, keep + 1) and torch.equal(base, keep)


# ---------------------------------------------------------------- the trace extraction (pure Python)

def _chrome(events):
    return [{"ph": "X", "pid": 0, **e} for e in events]


@pytest.mark.op("stream_overlap")
def test_gpu_events_keeps_copies_and_kernels_only():
    trace = _chrome([
        {"cat": "cpu_op", "name": "aten::copy_", "tid": 1, "ts": 90.0, "dur": 30.0},
        {"cat": "cuda_runtime", "name": "cudaMemcpyAsync", "tid": 1, "ts": 95.0, "dur": 4.0},
        {"cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "tid": 7, "ts": 100.5, "dur": 50.0,
         "args": {"stream": 7, "bytes": 4096}},
        {"cat": "kernel", "name": "_fma_chain_kernel", "tid": 13, "ts": 151.0, "dur": 20.25,
         "args": {"stream": 13}},
        {"cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "tid": 7, "ts": 172.0, "dur": 48.0},
        {"cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "tid": 7, "ts": 180.0, "dur": 2.0},
        {"cat": "gpu_memset", "name": "Memset (Device)", "tid": 7, "ts": 99.0, "dur": 1.0},
    ])
    trace.append({"ph": "i", "cat": "kernel", "name": "an instant, not a span", "ts": 1.0})
    events = st.gpu_events(trace)
    assert [(e["kind"], e["stream"]) for e in events] == [("h2d", 7), ("kernel", 13), ("d2h", 7)]
    assert [e["start_us"] for e in events] == [0.0, 50.5, 71.5], "relative to the first copy or kernel"
    assert [e["dur_us"] for e in events] == [50.0, 20.25, 48.0]
    assert events[1]["name"] == "_fma_chain_kernel"
    assert st.gpu_events(trace[:2]) == []


@pytest.mark.op("stream_overlap")
def test_gpu_events_needs_a_stream():
    bad = _chrome([{"cat": "kernel", "name": "k", "tid": "GPU thread", "ts": 1.0, "dur": 1.0}])
    with pytest.raises(ValueError, match="stream"):
        st.gpu_events(bad)


# ---------------------------------------------------------------- GPU: the pipelines

@pytest.mark.gpu
@pytest.mark.op("stream_overlap")
@pytest.mark.parametrize("version", sorted(PIPELINES))
@pytest.mark.parametrize("n, fmas, chunks", [(1, 3, 1), (17, 0, 5), (4097, 40, 3), (65536 + 3, 8, 16),
                                             (2**20 + 5, 64, 7), (2**20 + 5, 2, 64)])
def test_pipelines_give_exactly_the_fp32_result(version, n, fmas, chunks):
    x = _pinned(n, seed=n)
    out = _pinned(n, fill=float("nan"))
    result = PIPELINES[version](x, out, fmas, chunks)
    # no synchronize here: the pipeline must return only once out holds the result
    assert result is out and out.is_pinned() and not out.is_cuda
    assert not out.isnan().any(), "an element was never written"
    assert torch.equal(out, st.fma_chain_ref(x, fmas)), "chunking and streams must not change a single bit"


@pytest.mark.gpu
@pytest.mark.op("stream_overlap")
@pytest.mark.parametrize("chunks, streams", [(7, 3), (16, 8), (5, 7), (1, 2)])
def test_run_pipeline_any_stream_count(chunks, streams):
    n = 100_003
    x, out = _pinned(n, seed=3), _pinned(n, fill=float("nan"))
    st.run_pipeline(x, out, 12, chunks, streams)
    assert torch.equal(out, st.fma_chain_ref(x, 12))


@pytest.mark.gpu
@pytest.mark.op("stream_overlap")
@pytest.mark.parametrize("version", ["v2", "v3"])
def test_side_streams_wait_for_the_callers_stream(version):
    """The caller queues a slow write of x on its stream and calls the pipeline at once: the side streams must
    wait for it (wait_stream), or they would read x before the write lands (here: NaN)."""
    n = 2**20 + 1
    x = _pinned(n, fill=float("nan"))
    fresh = torch.randn(n, generator=_gen(9)).cuda()
    out = _pinned(n, fill=float("nan"))
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # tens of milliseconds of GPU time on the caller's stream
    x.copy_(fresh, non_blocking=True)  # D2H into pinned x, queued behind the sleep
    PIPELINES[version](x, out, 4, 8)
    assert torch.equal(out, st.fma_chain_ref(fresh.cpu(), 4))


@pytest.mark.gpu
@pytest.mark.op("stream_overlap")
def test_caller_stream_sees_the_pipelines_work():
    """After the join, work the caller queues on its stream reads what the pipeline's streams wrote."""
    n = 2**18 + 3
    x, out = _pinned(n, seed=4), _pinned(n, fill=float("nan"))
    st.pipeline_4_streams(x, out, 6, 9)
    back = out.to("cuda", non_blocking=True).double().sum()  # on the caller's stream, no extra synchronize
    assert back.item() == pytest.approx(st.fma_chain_ref(x, 6).double().sum().item(), rel=1e-12)


@pytest.mark.gpu
@pytest.mark.op("stream_overlap")
@pytest.mark.parametrize("version", sorted(PIPELINES))
def test_pipelines_in_place(version):
    n = 50_001
    x = _pinned(n, seed=5)
    expected = st.fma_chain_ref(x.clone(), 9)
    assert PIPELINES[version](x, x, 9, 6) is x
    assert torch.equal(x, expected)


@pytest.mark.gpu
@pytest.mark.op("stream_overlap")
def test_pipelines_refuse_gpu_unpinned_and_overlapping_buffers():
    x, out = _pinned(1000, seed=6), _pinned(1000, fill=0.0)
    with pytest.raises(ValueError, match="cpu device"):
        st.pipeline_4_streams(x.cuda(), out, 3, 4)
    with pytest.raises(ValueError, match="cpu device"):
        st.pipeline_serial(x, out.cuda(), 3, 4)
    with pytest.raises(ValueError, match="pinned"):
        st.pipeline_2_streams(x.clone(), out, 3, 4)  # clone(): ordinary pageable memory
    with pytest.raises(ValueError, match="pinned"):
        st.pipeline_chunked(x, torch.empty(1000), 3, 4)
    buf = _pinned(1001, fill=0.0)
    with pytest.raises(ValueError, match="overlaps"):
        st.pipeline_4_streams(buf[:1000], buf[1:], 3, 4)


@pytest.mark.gpu
@pytest.mark.op("stream_overlap")
def test_pipeline_frees_its_device_buffers():
    n = 2**20
    x, out = _pinned(n, seed=7), _pinned(n, fill=0.0)
    st.pipeline_4_streams(x, out, 3, 8)  # first call: streams created, pools filled
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    st.pipeline_4_streams(x, out, 3, 8)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before, "chunk buffers outlived the call"


@pytest.mark.gpu
@pytest.mark.op("stream_overlap")
def test_trace_of_serial_and_four_streams():
    trace = st.trace_pipelines({"n": 2**20, "fmas": 64, "chunks": 8})
    assert set(trace["runs"]) == {"serial", "4 streams"} and trace["gpu"] == torch.cuda.get_device_name()
    serial, four = trace["runs"]["serial"], trace["runs"]["4 streams"]
    assert sorted(e["kind"] for e in serial) == ["d2h", "h2d", "kernel"]
    assert len({e["stream"] for e in serial}) == 1
    assert [sum(e["kind"] == k for e in four) for k in ("h2d", "kernel", "d2h")] == [8, 8, 8]
    assert len({e["stream"] for e in four}) == 4
    for stream in {e["stream"] for e in four}:  # within one stream, work runs in order and never overlaps
        evs = sorted((e for e in four if e["stream"] == stream), key=lambda e: e["start_us"])
        assert [e["kind"] for e in evs] == ["h2d", "kernel", "d2h"] * 2
        # (half a microsecond of slack for the profiler's timestamps; each stage here takes several)
        assert all(a["start_us"] + a["dur_us"] <= b["start_us"] + 0.5 for a, b in zip(evs, evs[1:]))
    assert min(e["start_us"] for e in four) == 0.0
    assert len(json.dumps(trace, indent=1)) < 200_000


# ---------------------------------------------------------------- GPU: launches

@pytest.mark.gpu
@pytest.mark.op("launch_overhead")
@pytest.mark.parametrize("version", sorted(LAUNCHERS))
@pytest.mark.parametrize("n", [1, 7, 1000, 4099])
def test_launchers_add_one_to_every_item(version, n):
    base = torch.randint(-(2**30), 2**30, (n,), generator=_gen(n), dtype=torch.int32).cuda()
    keep = base.clone()
    out = LAUNCHERS[version](base, n)
    assert out.dtype == torch.int32 and out.shape == (n,) and out.data_ptr() != base.data_ptr()
    assert torch.equal(out, keep + 1)
    assert torch.equal(base, keep), "the input is not modified"


@pytest.mark.gpu
@pytest.mark.op("launch_overhead")
@pytest.mark.parametrize("n, blocks", [(2**20 + 3, None), (65536 + 1, 1), (10_007, 3), (5, 64)])
def test_persistent_kernel_claims_every_item_exactly_once(n, blocks):
    """out - base counts how often each item was done: a skipped item shows 0, a doubly claimed one 2."""
    base = torch.randint(-1000, 1000, (n,), generator=_gen(n), dtype=torch.int32).cuda()
    for _ in range(2):  # the work counter starts from zero on every call
        counts = st.launches_persistent(base, n, blocks) - base
        assert int(counts.min()) == 1 and int(counts.max()) == 1
        assert int(counts.sum()) == n


@pytest.mark.gpu
@pytest.mark.op("launch_overhead")
def test_persistent_kernel_refuses_a_bad_grid():
    base = torch.zeros(8, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="blocks"):
        st.launches_persistent(base, 8, 0)


@pytest.mark.gpu
@pytest.mark.op("launch_overhead")
def test_graph_replay_matches_eager_launches():
    n = 1000
    a = torch.randint(-50, 50, (n,), generator=_gen(1), dtype=torch.int32).cuda()
    b = torch.randint(-50, 50, (n,), generator=_gen(2), dtype=torch.int32).cuda()
    first = st.launches_graph(a, n)
    assert torch.equal(first, st.launches_torch(a, n))
    second = st.launches_graph(b, n)  # the same graph, replayed on new input copied into its buffer
    assert torch.equal(second, st.launches_torch(b, n)) and torch.equal(second, b + 1)
    assert torch.equal(first, a + 1), "an earlier result is a copy: the next replay does not overwrite it"
    graph, static = st._launch_graph(torch.cuda.current_device(), n)
    assert st._launch_graph(torch.cuda.current_device(), n)[0] is graph, "captured once, then reused"
    assert first.data_ptr() != static.data_ptr() and second.data_ptr() != static.data_ptr()


@pytest.mark.gpu
@pytest.mark.op("launch_overhead")
def test_round_trip_and_summary():
    rt = st.launch_round_trip(reps=20, warmup=3)
    assert len(rt) == 5 and all(math.isfinite(v) and v > 0 for v in rt.values()), rt
    text = st.launch_summary(launches=100, reps=20)
    for name in st.launch_overhead.impls:
        assert f"  {name} " in text
    assert "replay alone" in text and "us" in text
