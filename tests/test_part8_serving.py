"""The serving loop: the trace generator (seeded, Poisson gaps), the step-time model against the
decode and prefill counts of decode_model.py, the simulator's schedulers (static waits for a full
batch and runs to the longest, continuous admits as blocks allow, preemption by recompute when the
cache runs out, chunked prefill keeps each step under its token budget), the real engine loop on
the CPU (continuous batching over a paged cache gives the tokens of each request generated alone,
with and without preemption), and the CUDA-graph padding (size selection, padded rows that change
no real row; replay against eager on a GPU)."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from snippets.part8 import decode_model as dm
from snippets.part8 import serving as sv
from snippets.part8.kv_cache import PagedKVCache

CFG, BW, PEAK = dm.LLAMA3_8B, 3e12, 8e14           # nominal machine: parameters, not measurements


def _trace(n=60, rate=40.0, seed=0):
    return sv.make_trace(n, rate, sv.uniform_lengths(16, 600), sv.uniform_lengths(4, 300), seed)


def _sim(trace, policy, **kw):
    kw = {"num_blocks": 3000, "block_size": 16, "max_batch": 16, **kw}
    return sv.simulate(trace, policy, CFG, BW, PEAK, **kw)


# ---------------------------------------------------------------- trace and step time

def test_trace_seeded_and_poisson():
    a, b = _trace(seed=3), _trace(seed=3)
    assert a == b and a != _trace(seed=4)
    big = sv.make_trace(4000, 10.0, sv.uniform_lengths(1, 1), sv.uniform_lengths(1, 1), seed=1)
    gaps = [y.arrival - x.arrival for x, y in zip(big, big[1:])]
    assert all(g > 0 for g in gaps)
    mean = sum(gaps) / len(gaps)                      # exponential: mean 1/rate, sd 1/rate
    assert abs(mean - 0.1) < 5 * 0.1 / math.sqrt(len(gaps))
    assert all(16 <= r.prompt <= 600 and 4 <= r.output <= 300 for r in a)


def test_trace_errors():
    with pytest.raises(ValueError, match="make_trace: rate"):
        sv.make_trace(3, 0.0, sv.uniform_lengths(1, 2), sv.uniform_lengths(1, 2))
    with pytest.raises(TypeError, match="make_trace: prompt_len"):
        sv.make_trace(3, 1.0, 5, sv.uniform_lengths(1, 2))
    with pytest.raises(ValueError, match="output length of request"):
        sv.make_trace(3, 1.0, sv.uniform_lengths(1, 2), lambda rng: 0)


def test_step_time_matches_decode_model():
    for b, c in [(1, 0), (8, 100), (64, 4096)]:
        assert sv.step_time(CFG, [c] * b, [], BW, PEAK) == pytest.approx(
            dm.roofline_step_time(CFG, b, c, BW, PEAK), rel=1e-12)
    for s in (1, 128, 2048):
        want = max(dm.prefill_bytes(CFG, s) / BW, dm.prefill_flops(CFG, s) / PEAK)
        assert sv.step_time(CFG, [], [(0, s)], BW, PEAK) == pytest.approx(want, rel=1e-12)
    # a prompt in two chunks does the same FLOPs as in one (causal pairs add up), and reads the
    # weights twice
    one = sv.step_time(CFG, [], [(0, 1000)], 1e30, PEAK)
    two = sv.step_time(CFG, [], [(0, 600)], 1e30, PEAK) + sv.step_time(CFG, [], [(600, 400)],
                                                                      1e30, PEAK)
    assert two == pytest.approx(one, rel=1e-12)
    assert sv.step_time(CFG, [5], [], BW, PEAK, overhead=1e-3) == pytest.approx(
        sv.step_time(CFG, [5], [], BW, PEAK) + 1e-3)
    with pytest.raises(ValueError, match="no tokens"):
        sv.step_time(CFG, [], [], BW, PEAK)
    with pytest.raises(ValueError, match="step_time: bandwidth"):
        sv.step_time(CFG, [1], [], 0.0, PEAK)
    with pytest.raises(ValueError, match="chunk length"):
        sv.step_time(CFG, [], [(0, 0)], BW, PEAK)


# ---------------------------------------------------------------- the simulator

def test_every_request_gets_its_tokens_deterministically():
    tr = _trace()
    for policy, kw in [("static", {}), ("continuous", {}), ("continuous", {"chunk": 256}),
                       ("continuous", {"num_blocks": 120})]:
        res = _sim(tr, policy, **kw)
        assert [r.rid for r in res.requests] == [r.rid for r in tr]
        for r, s in zip(tr, res.requests):
            assert len(s.itl) == r.output - 1
            assert s.ttft > 0 and all(g > 0 for g in s.itl)
            assert s.e2e == pytest.approx(s.ttft + sum(s.itl))
        assert res.output_tokens == sum(r.output for r in tr)
        assert all(0 <= u <= 1 for _, u in res.cache_use)
        assert res.cache_use[-1][1] == 0                # every block freed at the end
        again = _sim(tr, policy, **kw)
        assert sv.summarise(again) == sv.summarise(res)


def test_static_waits_for_a_full_batch_and_runs_to_the_longest():
    # four requests at once, batch of 2: the second pair starts only when the longer of the
    # first pair is done
    tr = [sv.Request(i, 0.0, 10, out) for i, out in enumerate([3, 9, 2, 2])]
    res = _sim(tr, "static", max_batch=2)
    ends = [r.e2e for r in res.requests]
    assert ends[0] < ends[1] and min(ends[2:]) > ends[1]
    assert res.steps == (1 + 8) + (1 + 1)               # each batch: a prefill, then decodes
    cont = _sim(tr, "continuous", max_batch=2)
    assert cont.requests[2].ttft < res.requests[2].ttft  # joins when request 0 leaves
    # static does not start a batch until max_batch have arrived (or no more will come)
    late = [sv.Request(0, 0.0, 10, 2), sv.Request(1, 1.0, 10, 2)]
    st = _sim(late, "static", max_batch=2)
    assert st.requests[0].ttft > 1.0 > _sim(late, "continuous", max_batch=2).requests[0].ttft


def test_continuous_beats_static_on_a_loaded_trace():
    tr = _trace(n=80, rate=200.0)
    st, co = sv.summarise(_sim(tr, "static")), sv.summarise(_sim(tr, "continuous"))
    assert co["tokens_per_s"] > st["tokens_per_s"]
    assert co["ttft_mean"] < st["ttft_mean"] and co["e2e_mean"] < st["e2e_mean"]


def test_preemption_recomputes_and_never_overfills():
    tr = _trace(n=60, rate=200.0)
    tight = _sim(tr, "continuous", num_blocks=80)
    assert tight.preemptions > 0
    assert sum(r.preempted for r in tight.requests) == tight.preemptions
    assert max(u for _, u in tight.cache_use) <= 1
    roomy = _sim(tr, "continuous", num_blocks=5000)
    assert roomy.preemptions == 0 and roomy.steps < tight.steps   # recompute costs steps


def test_chunked_prefill_bounds_each_step():
    # one long prompt arrives while a request decodes: without chunks the decode stalls for the
    # whole prefill; with chunks of 128 tokens no gap is longer than a 128-token step
    tr = [sv.Request(0, 0.0, 16, 40), sv.Request(1, 0.01, 4000, 2)]
    whole = _sim(tr, "continuous", num_blocks=1000)
    chunked = _sim(tr, "continuous", num_blocks=1000, chunk=128)
    longest = sv.step_time(CFG, [60], [(3872, 127)], BW, PEAK)
    assert max(whole.requests[0].itl) > sv.step_time(CFG, [], [(0, 4000)], BW, PEAK) * 0.99
    assert max(chunked.requests[0].itl) <= longest * 1.0001
    assert chunked.requests[1].ttft > whole.requests[1].ttft        # the prompt takes longer


def test_simulate_errors():
    tr = _trace(n=3)
    with pytest.raises(ValueError, match="policy"):
        _sim(tr, "fifo")
    with pytest.raises(ValueError, match="even alone"):
        _sim(tr, "continuous", num_blocks=2)
    with pytest.raises(ValueError, match="chunk"):
        _sim(tr, "static", chunk=64)
    with pytest.raises(ValueError, match="empty"):
        _sim([], "static")


# ---------------------------------------------------------------- throughput at equal latency

def test_summarise_p50_is_the_median_end_to_end_latency():
    for n in (61, 60):                                 # odd: the median; even: the lower middle
        res = _sim(_trace(n=n, rate=100.0), "continuous")
        s = sv.summarise(res)
        e2e = sorted(r.e2e for r in res.requests)
        assert s["e2e_p50"] == e2e[(n - 1) // 2] == sv.percentile(e2e, 50)
        if n % 2:
            assert s["e2e_p50"] == statistics.median(e2e)
        assert s["e2e_p50"] != s["e2e_mean"]           # not the mean under another name
        assert s["e2e_mean"] == pytest.approx(sum(e2e) / n, rel=1e-12)


def test_at_rate_scales_arrivals_only():
    tr = _trace(n=40, rate=40.0)
    slow = sv.at_rate(tr, 40.0, 10.0)
    assert [(r.rid, r.prompt, r.output) for r in slow] == [(r.rid, r.prompt, r.output)
                                                           for r in tr]
    assert [r.arrival for r in slow] == pytest.approx([4 * r.arrival for r in tr], rel=1e-12)
    assert sv.at_rate(tr, 40.0, 40.0) == tr
    # the same requests make_trace draws at the new rate: one uniform draw per gap, over the rate
    drawn = _trace(n=40, rate=10.0)
    assert [(r.rid, r.prompt, r.output) for r in drawn] == [(r.rid, r.prompt, r.output)
                                                            for r in slow]
    assert [r.arrival for r in drawn] == pytest.approx([r.arrival for r in slow], rel=1e-12)
    for bad in (0.0, -5.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="at_rate: new_rate"):
            sv.at_rate(tr, 40.0, bad)
    with pytest.raises(ValueError, match="at_rate: rate"):
        sv.at_rate(tr, 0.0, 10.0)
    with pytest.raises(TypeError, match="at_rate: new_rate"):
        sv.at_rate(tr, 40.0, "10")


def test_load_curve_points_are_the_simulator_at_each_rate():
    tr = _trace(n=30, rate=40.0)
    rates = [5.0, 20.0, 80.0]
    for policy, kw in [("static", {}), ("continuous", {"chunk": 256})]:
        curve = sv.load_curve(tr, 40.0, rates, policy, CFG, BW, PEAK, num_blocks=3000,
                              max_batch=16, **kw)
        assert [p.rate for p in curve] == rates
        for p in curve:
            s = sv.summarise(_sim(sv.at_rate(tr, 40.0, p.rate), policy, **kw))
            assert (p.tokens_per_s, p.e2e_p50) == (s["tokens_per_s"], s["e2e_p50"])
        assert len({p.e2e_p50 for p in curve}) == 3     # the rate did change the arrivals
    for bad, msg in [([], "none given"), ([20.0, 5.0], "increasing"), ([5.0, 5.0], "increasing"),
                     ([0.0, 5.0], "positive"), ([5.0, math.nan], "positive")]:
        with pytest.raises(ValueError, match=f"load_curve: rates.*{msg}"):
            sv.load_curve(tr, 40.0, bad, "static", CFG, BW, PEAK, num_blocks=3000)
    with pytest.raises(ValueError, match="load_curve: rate must be positive"):
        sv.load_curve(tr, -1.0, rates, "static", CFG, BW, PEAK, num_blocks=3000)
    with pytest.raises(ValueError, match="chunk"):              # simulate's own check
        sv.load_curve(tr, 40.0, rates, "static", CFG, BW, PEAK, num_blocks=3000, chunk=64)


def _pts(*xs):
    return [sv.CurvePoint(float(i + 1), tp, lat) for i, (tp, lat) in enumerate(xs)]


def test_throughput_at_latency_interpolates_exactly():
    # latency falls, then rises (static batching's shape): 3.5 s is met twice, the larger wins
    curve = _pts((100.0, 5.0), (200.0, 3.0), (300.0, 4.0), (400.0, 8.0))
    at = sv.throughput_at_latency
    assert at(curve, 3.5) == 250.0                      # 175 on the way down, 250 on the way up
    assert at(curve, 6.0) == 350.0
    assert at(curve, 5.0) == 325.0                      # a point (100) and a segment (325)
    assert at(curve, 3.0) == 200.0 and at(curve, 8.0) == 400.0   # the ends of the range
    assert at(curve, 2.999) is None and at(curve, 8.001) is None
    assert at(curve[:2], 4.5) == 125.0 and at(curve[:2], 3.5) == 175.0
    assert at(_pts((100.0, 5.0)), 5.0) == 100.0 and at(_pts((100.0, 5.0)), 4.0) is None
    assert at(_pts((100.0, 5.0), (200.0, 5.0)), 5.0) == 200.0      # flat: the larger end
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="throughput_at_latency: target"):
            at(curve, bad)
    with pytest.raises(TypeError, match="throughput_at_latency: target"):
        at(curve, "5")
    with pytest.raises(ValueError, match="none given"):
        at([], 5.0)
    with pytest.raises(ValueError, match="increasing"):
        at(curve[::-1], 5.0)


SCHEDULERS = [("static", None), ("continuous", None), ("continuous", 512)]   # (policy, chunk)


def test_equal_latency_goal_as_the_chapter_reads_it():
    """The chapter's comparison at a median latency of 5 s, with only the rates that bracket
    5 s on each curve (the same neighbouring points as the chapter's grid, so the same
    interpolation): plain continuous batching stays under 2x static's tokens/s, chunks of 512
    reach it; with every answer of one length the ratio falls far below."""
    def at_5s(trace, rates):
        return [sv.throughput_at_latency(sv.load_curve(
            trace, 50.0, r, policy, CFG, BW, PEAK, num_blocks=4096, max_batch=32, chunk=chunk),
            5.0) for r, (policy, chunk) in zip(rates, SCHEDULERS)]

    trace = sv.make_trace(200, 50.0, sv.uniform_lengths(32, 1024), sv.uniform_lengths(8, 512),
                          seed=0)
    static, cont, chunked = at_5s(trace, [[12, 14], [50, 100], [50, 100]])
    assert (round(cont / static, 2), round(chunked / static, 2)) == (1.86, 2.08)
    assert cont < 2 * static <= chunked
    one_length = [sv.Request(r.rid, r.arrival, r.prompt, 263) for r in trace]
    static, cont, chunked = at_5s(one_length, [[30, 40], [40, 50], [50, 100]])
    assert (round(cont / static, 2), round(chunked / static, 2)) == (1.07, 1.19)


# ---------------------------------------------------------------- the real engine loop

MODEL = sv.TinyDecoder(seed=1)


def _requests(n=7, seed=0):
    rng = random.Random(seed)
    prompts = [[rng.randrange(MODEL.vocab) for _ in range(rng.randint(1, 9))] for _ in range(n)]
    return prompts, [rng.randint(1, 10) for _ in range(n)], [rng.randint(0, 6) for _ in range(n)]


PROMPTS, NEW, ARRIVALS = _requests()
ALONE = [sv.generate_alone(MODEL, p, m) for p, m in zip(PROMPTS, NEW)]


@pytest.mark.parametrize("num_blocks,max_batch", [(60, 4), (60, 1), (9, 4), (6, 7)])
def test_engine_equals_each_request_alone(num_blocks, max_batch):
    res = sv.generate(MODEL, PROMPTS, NEW, num_blocks=num_blocks, block_size=4,
                      max_batch=max_batch, arrivals=ARRIVALS)
    assert res.tokens == ALONE
    assert 1 <= res.max_running <= max_batch
    if num_blocks < 10:
        assert res.preemptions > 0                     # the tight caches did preempt
    if max_batch > 1 and num_blocks == 60:
        assert res.max_running > 1 and res.preemptions == 0


def test_engine_batches_fewer_steps_than_one_at_a_time():
    batched = sv.generate(MODEL, PROMPTS, NEW, num_blocks=60, max_batch=7)
    serial = sv.generate(MODEL, PROMPTS, NEW, num_blocks=60, max_batch=1)
    assert batched.steps == max(NEW) and serial.steps == sum(NEW)


def test_engine_errors():
    with pytest.raises(ValueError, match="one new_tokens per prompt"):
        sv.generate(MODEL, PROMPTS, NEW[:-1], num_blocks=60)
    with pytest.raises(ValueError, match="even alone"):
        sv.generate(MODEL, PROMPTS, NEW, num_blocks=3)
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        sv.generate(MODEL, [[]], [2], num_blocks=60)
    with pytest.raises(ValueError, match="token ids"):
        sv.generate(MODEL, [[MODEL.vocab]], [2], num_blocks=60)


# ---------------------------------------------------------------- CUDA-graph padding

def test_capture_sizes_and_selection():
    assert sv.capture_sizes(16) == [1, 2, 4, 8, 16]
    assert sv.capture_sizes(12) == [1, 2, 4, 8, 12]
    assert sv.capture_sizes(1) == [1]
    sizes = sv.capture_sizes(16)
    assert [sv.select_size(n, sizes) for n in (1, 2, 3, 5, 8, 9, 16)] == [1, 2, 4, 8, 8, 16, 16]
    assert sv.select_size(17, sizes) is None
    with pytest.raises(ValueError, match="select_size: n"):
        sv.select_size(0, sizes)


def test_pad_batch():
    tok, tab, lens = torch.tensor([5, 6, 7]), torch.ones(3, 2, dtype=torch.int32), torch.tensor(
        [3, 4, 5], dtype=torch.int32)
    t, b, n = sv.pad_batch(tok, tab, lens, 8)
    assert t.tolist() == [5, 6, 7] + [0] * 5 and n.tolist() == [3, 4, 5] + [0] * 5
    assert b.shape == (8, 2) and b[3:].abs().sum() == 0
    with pytest.raises(ValueError, match="smaller than the batch"):
        sv.pad_batch(tok, tab, lens, 2)
    with pytest.raises(ValueError, match="one row per sequence"):
        sv.pad_batch(tok, tab[:2], lens, 4)


def _filled_cache(model, device="cpu"):
    """A paged cache with three sequences of ragged lengths, through the engine's own forward."""
    L, H, d = model.layers, model.heads, model.head_dim
    cache = PagedKVCache(40, 4, L * H, d, max_blocks_per_seq=6, dtype=model.dtype, device=device)
    seqs = [[1, 2, 3], [4] * 9, [7, 8, 9, 10, 11, 12, 13]]
    for i, s in enumerate(seqs):
        cache.add_sequence(i)
        _, kv = model.forward([s], [(model.empty_kv(), model.empty_kv())])
        for kt, vt in zip(*kv[0]):
            cache.append(i, kt.reshape(L * H, d), vt.reshape(L * H, d))
    return cache, seqs


def test_static_decode_equals_engine_forward_and_padding_changes_nothing():
    cache, seqs = _filled_cache(MODEL)
    L, H, d = MODEL.layers, MODEL.heads, MODEL.head_dim
    tok = torch.tensor([20, 21, 22])
    tables, lens = cache.block_tables([0, 1, 2])
    logits, k, v = sv.decode_step_paged(MODEL, cache.k, cache.v, tok, tables, lens)
    past = [tuple(t.view(-1, L, H, d) for t in cache.gather(i)) for i in range(3)]
    want, kv = MODEL.forward([[20], [21], [22]], past)
    torch.testing.assert_close(logits, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(k, torch.cat([x[0] for x in kv]), rtol=1e-12, atol=1e-12)
    graphed = sv.GraphedDecode(MODEL, cache, [1, 2, 4, 8], use_graphs=False)
    out = graphed(tok, tables, lens)
    assert graphed.calls == {1: 0, 2: 0, 4: 1, 8: 0}
    for got, ref in zip(out, (logits, k, v)):
        assert got.shape == ref.shape
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    small = sv.GraphedDecode(MODEL, cache, [1, 2], use_graphs=False)
    small(tok, tables, lens)
    assert small.eager_calls == 1                    # larger than any captured size
    with pytest.raises(ValueError, match="CUDA graphs need"):
        sv.GraphedDecode(MODEL, cache, [1], use_graphs=True)


def test_engine_through_padded_decode_equals_alone():
    res = sv.generate(MODEL, PROMPTS, NEW, num_blocks=60, max_batch=4, arrivals=ARRIVALS,
                      graph_sizes=[1, 2, 4], use_graphs=False)
    assert res.tokens == ALONE and res.graph_steps > 0


# ---------------------------------------------------------------- on the GPU

@pytest.mark.gpu
def test_gpu_graph_replay_equals_eager():
    model = sv.TinyDecoder(seed=1, dtype=torch.float32, device="cuda")
    cache, _ = _filled_cache(model, "cuda")
    tables, lens = cache.block_tables([0, 1, 2])
    tok = torch.tensor([20, 21, 22], device="cuda")
    graphed = sv.GraphedDecode(model, cache, [1, 2, 4, 8])
    assert graphed.use_graphs and set(graphed.graphs) == {1, 2, 4, 8}
    for n in (1, 2, 3):
        got = graphed(tok[:n], tables[:n], lens[:n])
        want = sv.decode_step_paged(model, cache.k, cache.v, *sv.pad_batch(
            tok[:n], tables[:n], lens[:n], sv.select_size(n, graphed.sizes)))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w[:n], rtol=1e-5, atol=1e-5)
    # the graph reads the cache at replay time: a new token appended after capture is seen
    L, H, d = model.layers, model.heads, model.head_dim
    cache.append(0, torch.ones(L * H, d, device="cuda"), torch.ones(L * H, d, device="cuda"))
    tables, lens = cache.block_tables([0])
    got = graphed(tok[:1], tables, lens)
    want = sv.decode_step_paged(model, cache.k, cache.v, tok[:1], tables, lens)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_gpu_engine_with_graphs_equals_alone():
    model = sv.TinyDecoder(seed=1, device="cuda")                    # float64: no greedy ties
    alone = [sv.generate_alone(model, p, m) for p, m in zip(PROMPTS, NEW)]
    res = sv.generate(model, PROMPTS, NEW, num_blocks=60, max_batch=4, arrivals=ARRIVALS,
                      graph_sizes=[1, 2, 4])
    assert res.tokens == alone and res.graph_steps > 0
