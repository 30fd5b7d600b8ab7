"""The serving loop: how one GPU serves many requests at once.

Three pieces, all deterministic for a seed:

- a request trace: arrival times from a Poisson process, prompt and output lengths drawn from
  given distributions (:func:`make_trace`);
- a step-level simulator of a serving engine (:func:`simulate`). Each step is one forward pass:
  a prefill of new prompts, a decode of the running batch, or (chunked prefill, Sarathi-style)
  both at once. Its time comes from the roofline of ``decode_model.py`` for the step's tokens,
  with the bandwidth and the peak rate passed in, never typed here. Schedulers: static batching,
  continuous batching, preemption by recompute when the paged cache runs out of blocks;
- a real engine loop on the CPU (:func:`generate`): a tiny random-weight decoder whose K and V live
  in a :class:`~snippets.part8.kv_cache.PagedKVCache`, several requests batched continuously, the
  same greedy tokens as each request generated alone. And the padding a CUDA-graph decode step
  needs (:class:`GraphedDecode`): a graph per captured batch size, a batch padded up to the next.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from snippets._checks import check_int, check_scalar
from snippets.part8 import decode_model as dm
from snippets.part8.kv_cache import BlockAllocator, OutOfBlocks, PagedKVCache


# --8<-- [start:trace]
@dataclass(frozen=True)
class Request:
    """One request: it arrives at ``arrival`` seconds with ``prompt`` tokens and wants ``output``
    tokens back."""

    rid: int
    arrival: float
    prompt: int
    output: int


def uniform_lengths(lo: int, hi: int) -> Callable[[random.Random], int]:
    """A length distribution: uniform on the integers ``lo .. hi``."""
    check_int("uniform_lengths: lo", lo, 1)
    check_int("uniform_lengths: hi", hi, lo)
    return lambda rng: rng.randint(lo, hi)


def make_trace(n: int, rate: float, prompt_len: Callable[[random.Random], int],
               output_len: Callable[[random.Random], int], seed: int = 0) -> list[Request]:
    """``n`` requests of a Poisson process of ``rate`` requests per second: the gaps between
    arrivals are exponential with mean 1 / rate. Lengths come from the two distributions (a
    function of a ``random.Random``), all from one generator seeded with ``seed``."""
    check_int("make_trace: n", n, 1)
    rate = check_scalar("make_trace: rate", rate)
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"make_trace: rate must be positive and finite, got {rate}")
    for name, fn in (("prompt_len", prompt_len), ("output_len", output_len)):
        if not callable(fn):
            raise TypeError(f"make_trace: {name} must be a function of a random.Random, got "
                            f"{type(fn).__name__}")
    rng, t, out = random.Random(seed), 0.0, []
    for rid in range(n):
        t += rng.expovariate(rate)
        p, o = prompt_len(rng), output_len(rng)
        check_int(f"make_trace: prompt length of request {rid}", p, 1)
        check_int(f"make_trace: output length of request {rid}", o, 1)
        out.append(Request(rid, t, p, o))
    return out
# --8<-- [end:trace]


# --8<-- [start:step_time]
def step_time(cfg: dm.DecoderConfig, decode_contexts: Sequence[int],
              prefill_chunks: Sequence[tuple[int, int]], bandwidth: float, peak_flops: float,
              overhead: float = 0.0) -> float:
    """Roofline time of one forward pass over a mixed batch: one new token for each sequence
    whose cache holds ``decode_contexts[i]`` tokens, and for each ``(start, n)`` in
    ``prefill_chunks`` the ``n`` prompt tokens from position ``start`` on. The weights are read
    once for all the step's tokens; each sequence reads its own cache and writes its new tokens'
    K and V. ``overhead`` (seconds) is added per step: launches, the scheduler's own work.

    A decode-only step is ``dm.decode_step_bytes``/``flops`` summed over its sequences, a single
    chunk from 0 is ``dm.prefill_bytes``/``flops`` (both checked in the tests)."""
    for name, x in (("bandwidth", bandwidth), ("peak_flops", peak_flops)):
        if not (check_scalar(f"step_time: {name}", x) > 0 and math.isfinite(x)):
            raise ValueError(f"step_time: {name} must be positive and finite, got {x}")
    overhead = check_scalar("step_time: overhead", overhead)
    if overhead < 0:
        raise ValueError(f"step_time: overhead must be >= 0, got {overhead}")
    if not decode_contexts and not prefill_chunks:
        raise ValueError("step_time: the step has no tokens (no decode, no prefill chunk)")
    kv, e = dm.kv_bytes_per_token(cfg), cfg.dtype_bytes
    per_pair = 4 * cfg.layers * cfg.heads * cfg.head_dim   # q.k and p.v of one (query, key)
    tokens, nbytes, flops = 0, 0, 0
    for c in decode_contexts:
        check_int("step_time: decode context", c, 0)
        tokens += 1
        nbytes += (c + 1) * kv
        flops += per_pair * (c + 1)
    for start, n in prefill_chunks:
        check_int("step_time: chunk start", start, 0)
        check_int("step_time: chunk length", n, 1)
        tokens += n
        nbytes += (start + n) * kv                        # read the earlier cache, write the chunk
        flops += per_pair * (n * start + n * (n + 1) // 2)  # causal: query i sees start + i + 1
    nbytes += dm.matmul_params(cfg) * e + tokens * cfg.hidden * e
    flops += 2 * dm.matmul_params(cfg) * tokens
    return max(nbytes / bandwidth, flops / peak_flops) + overhead
# --8<-- [end:step_time]


@dataclass
class _Seq:
    req: Request
    generated: int = 0          # tokens emitted so far
    cached: int = 0             # tokens whose K and V are in the cache
    target: int = 0             # tokens to prefill before the next emission (prompt + generated)
    blocks: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    preempted: int = 0

    @property
    def prefilling(self) -> bool:
        return self.cached < self.target


@dataclass
class RequestStats:
    """What one request saw: time to first token, the gaps between its tokens, end to end."""

    rid: int
    ttft: float
    itl: list[float]
    e2e: float
    preempted: int


@dataclass
class SimResult:
    requests: list[RequestStats]
    steps: int
    preemptions: int
    makespan: float                       # first arrival to last token
    output_tokens: int
    cache_use: list[tuple[float, float]]  # (time at the end of a step, share of blocks in use)

    @property
    def throughput(self) -> float:
        """Output tokens per second over the whole trace."""
        return self.output_tokens / self.makespan


# --8<-- [start:simulate]
def simulate(trace: Sequence[Request], policy: str, cfg: dm.DecoderConfig, bandwidth: float,
             peak_flops: float, num_blocks: int, block_size: int = 16, max_batch: int = 64,
             chunk: int | None = None, overhead: float = 0.0) -> SimResult:
    """Serve ``trace`` step by step and record what each request saw.

    ``policy``:

    - ``"static"``: wait for ``max_batch`` requests (or the last ones), reserve their whole
      length, prefill them together, decode until the longest is done (finished ones stay in
      the batch as padding), then take the next batch;
    - ``"continuous"``: iteration-level scheduling (Orca): each step admits waiting requests
      (first come, first served) while there is a batch slot and blocks for the prompt, and
      a finished request leaves at once. A step that has prompts to prefill runs them and
      stalls the decodes; with ``chunk`` (a token budget per step, Sarathi) every step runs
      all decodes plus prompt chunks up to the budget. When a decode needs a block and none
      is free, the latest admitted request is preempted: its blocks are freed and it is
      prefilled again later over its prompt and the tokens it already emitted (recompute).
    """
    if policy not in ("static", "continuous"):
        raise ValueError(f"simulate: policy must be 'static' or 'continuous', got {policy!r}")
    if not trace:
        raise ValueError("simulate: the trace is empty")
    check_int("simulate: block_size", block_size, 1)
    check_int("simulate: max_batch", max_batch, 1)
    alloc = BlockAllocator(num_blocks)
    if chunk is not None:
        check_int("simulate: chunk", chunk, 1)
        if policy == "static":
            raise ValueError("simulate: chunk (chunked prefill) needs policy='continuous'")
    for r in trace:
        if -(-(r.prompt + r.output) // block_size) > num_blocks:
            raise ValueError(f"simulate: request {r.rid} ({r.prompt} + {r.output} tokens) does "
                             f"not fit in {num_blocks} blocks of {block_size} even alone")
    step_time(cfg, [0], [], bandwidth, peak_flops, overhead)         # checks the machine
    pending = sorted(trace, key=lambda r: (r.arrival, r.rid))
    waiting: list[_Seq] = []
    running: list[_Seq] = []
    done: list[_Seq] = []
    t, steps, preemptions, cache_use = pending[0].arrival, 0, 0, []
    nxt = 0

    def grow(s: _Seq, tokens: int) -> None:               # blocks for `tokens` cached tokens
        while len(s.blocks) * block_size < tokens:
            s.blocks.append(alloc.allocate())             # OutOfBlocks: nothing changed

    def release(s: _Seq) -> None:
        for b in s.blocks:
            alloc.free(b)
        s.blocks = []

    while nxt < len(pending) or waiting or running:
        while nxt < len(pending) and pending[nxt].arrival <= t:
            r = pending[nxt]
            waiting.append(_Seq(r, target=r.prompt))
            nxt += 1
        # admission
        if policy == "static":
            if not running and waiting and (len(waiting) >= max_batch or nxt == len(pending)):
                while waiting and len(running) < max_batch:
                    s = waiting[0]
                    need = -(-(s.req.prompt + s.req.output) // block_size)
                    if need > alloc.num_free:
                        break
                    grow(s, need * block_size)
                    running.append(waiting.pop(0))
        else:
            while waiting and len(running) < max_batch:
                s = waiting[0]
                if -(-s.target // block_size) > alloc.num_free:
                    break                                 # first come, first served
                grow(s, s.target)
                running.append(waiting.pop(0))
        if not running:
            t = max(t, pending[nxt].arrival)              # idle until the next arrival
            continue
        # what this step runs
        prefills = [s for s in running if s.prefilling]
        if policy == "continuous" and chunk is None and prefills:
            decodes, chunks = [], [(s, s.target - s.cached) for s in prefills]
        else:
            decodes = [s for s in running if not s.prefilling]
            if policy == "continuous":                    # a new block when the last is full
                for s in list(decodes):
                    while s in running:
                        try:
                            grow(s, s.cached + 1)
                            break
                        except OutOfBlocks:
                            victim = running.pop()        # the latest admitted
                            release(victim)
                            victim.cached, victim.target = 0, victim.req.prompt + victim.generated
                            victim.preempted += 1
                            preemptions += 1
                            waiting.insert(0, victim)
                            if victim in decodes:
                                decodes.remove(victim)
                prefills = [s for s in running if s.prefilling]
            budget = math.inf if chunk is None else max(0, chunk - len(decodes))
            chunks = []
            for s in prefills:
                n = int(min(s.target - s.cached, budget))
                if n > 0:
                    chunks.append((s, n))
                    budget -= n
        dt = step_time(cfg, [s.cached for s in decodes], [(s.cached, n) for s, n in chunks],
                       bandwidth, peak_flops, overhead)
        t += dt
        steps += 1
        for s in decodes:
            if s.generated < s.req.output:                # static's padding rows emit nothing
                s.cached += 1
                s.generated += 1
                s.token_times.append(t)
        for s, n in chunks:
            s.cached += n
            if not s.prefilling:                          # the prompt is in: its next token
                s.generated += 1
                s.token_times.append(t)
        finished = [s for s in running if s.generated == s.req.output]
        if policy == "continuous" or len(finished) == len(running):
            for s in finished:
                running.remove(s)
                release(s)
                done.append(s)
        cache_use.append((t, 1 - alloc.num_free / num_blocks))
    stats = [RequestStats(s.req.rid, s.token_times[0] - s.req.arrival,
                          [b - a for a, b in zip(s.token_times, s.token_times[1:])],
                          s.token_times[-1] - s.req.arrival, s.preempted)
             for s in sorted(done, key=lambda s: s.req.rid)]
    makespan = max(s.token_times[-1] for s in done) - pending[0].arrival
    return SimResult(stats, steps, preemptions, makespan, sum(r.output for r in trace),
                     cache_use)
# --8<-- [end:simulate]


# --8<-- [start:summary]
def percentile(xs: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of a non-empty list."""
    if not xs:
        raise ValueError("percentile: empty list")
    if not 0 < q <= 100:
        raise ValueError(f"percentile: q must be in (0, 100], got {q}")
    ys = sorted(xs)
    return ys[max(0, math.ceil(q / 100 * len(ys)) - 1)]


def summarise(res: SimResult) -> dict[str, float]:
    """The numbers a serving team watches: time to first token (mean, p99), inter-token
    latency (mean over all gaps, p99), end-to-end latency (mean, and the median ``e2e_p50``:
    nearest rank, so for an even count the lower of the two middle values), throughput, mean
    cache use."""
    ttft = [r.ttft for r in res.requests]
    itl = [g for r in res.requests for g in r.itl]
    e2e = [r.e2e for r in res.requests]
    return dict(ttft_mean=sum(ttft) / len(ttft), ttft_p99=percentile(ttft, 99),
                itl_mean=sum(itl) / len(itl) if itl else 0.0,
                itl_p99=percentile(itl, 99) if itl else 0.0,
                e2e_mean=sum(e2e) / len(e2e), e2e_p50=percentile(e2e, 50),
                tokens_per_s=res.throughput, steps=res.steps, preemptions=res.preemptions,
                cache_use_mean=sum(u for _, u in res.cache_use) / len(res.cache_use))
# --8<-- [end:summary]


# --8<-- [start:equal_latency]
class CurvePoint(NamedTuple):
    """One point of a scheduler's load curve: the arrival rate (requests/s), the output tokens
    per second over the trace, and the median end-to-end latency (s)."""

    rate: float
    tokens_per_s: float
    e2e_p50: float


def _check_rates(where: str, rates: Sequence[float]) -> list[float]:
    """Arrival rates: at least one, each positive and finite, strictly increasing."""
    rates = [check_scalar(where, r) for r in rates]
    if not rates:
        raise ValueError(f"{where}: none given")
    bad = [r for r in rates if not (r > 0 and math.isfinite(r))]
    if bad:
        raise ValueError(f"{where} must be positive and finite, got {bad[0]}")
    if any(b <= a for a, b in zip(rates, rates[1:])):
        raise ValueError(f"{where} must be strictly increasing, got {rates}")
    return rates


def at_rate(trace: Sequence[Request], rate: float, new_rate: float) -> list[Request]:
    """The requests of ``trace`` (a Poisson trace of ``rate`` requests/s) arriving at
    ``new_rate``: every arrival time times ``rate / new_rate``; ids, lengths and order kept. A
    Poisson process with its time axis scaled by c is a Poisson process of rate / c."""
    rate = _check_rates("at_rate: rate", [rate])[0]
    new_rate = _check_rates("at_rate: new_rate", [new_rate])[0]
    return [Request(r.rid, r.arrival * (rate / new_rate), r.prompt, r.output) for r in trace]


def load_curve(trace: Sequence[Request], rate: float, rates: Sequence[float], policy: str,
               cfg: dm.DecoderConfig, bandwidth: float, peak_flops: float,
               **simulate_kw) -> list[CurvePoint]:
    """Serve the same requests at each arrival rate of ``rates`` (increasing; ``trace`` was
    drawn at ``rate``) and record, at each, the throughput and the median end-to-end latency.
    ``simulate_kw`` goes to :func:`simulate` (num_blocks, max_batch, chunk, ...)."""
    rate = _check_rates("load_curve: rate", [rate])[0]
    rates = _check_rates("load_curve: rates", rates)
    curve = []
    for r in rates:
        s = summarise(simulate(at_rate(trace, rate, r), policy, cfg, bandwidth, peak_flops,
                               **simulate_kw))
        curve.append(CurvePoint(r, s["tokens_per_s"], s["e2e_p50"]))
    return curve


def throughput_at_latency(curve: Sequence[CurvePoint], target: float) -> float | None:
    """The tokens/s at which the curve's median latency equals ``target`` seconds, by linear
    interpolation between neighbouring points (in rate order). Where the curve meets the
    target more than once, the largest: static batching's median first falls as the rate
    rises (batches fill sooner), then climbs (requests queue). None if it never meets it."""
    target = check_scalar("throughput_at_latency: target", target)
    if not (target > 0 and math.isfinite(target)):
        raise ValueError(f"throughput_at_latency: target must be positive and finite, got "
                         f"{target}")
    _check_rates("throughput_at_latency: the curve's rates", [p.rate for p in curve])
    hits = [p.tokens_per_s for p in curve if p.e2e_p50 == target]
    for a, b in zip(curve, curve[1:]):
        if (a.e2e_p50 - target) * (b.e2e_p50 - target) < 0:     # strictly on either side
            f = (target - a.e2e_p50) / (b.e2e_p50 - a.e2e_p50)
            hits.append(a.tokens_per_s + f * (b.tokens_per_s - a.tokens_per_s))
    return max(hits) if hits else None
# --8<-- [end:equal_latency]


# ---------------------------------------------------------------- a real engine loop, on the CPU

# --8<-- [start:tiny_model]
class TinyDecoder:
    """A tiny decoder with random weights: token embedding, ``layers`` pre-norm blocks of causal
    multi-head attention (no positional encoding: the causal mask alone orders the tokens) and
    a GELU MLP, a final norm and an output head. Enough to check that an engine's batching,
    paging and preemption change no token."""

    def __init__(self, vocab: int = 50, hidden: int = 32, layers: int = 2, heads: int = 2,
                 ffn: int = 64, seed: int = 0, dtype: torch.dtype = torch.float64,
                 device: str | torch.device = "cpu") -> None:
        for name, v in (("vocab", vocab), ("hidden", hidden), ("layers", layers),
                        ("heads", heads), ("ffn", ffn)):
            check_int(f"TinyDecoder: {name}", v, 1)
        if hidden % heads:
            raise ValueError(f"TinyDecoder: hidden ({hidden}) must be a multiple of heads "
                             f"({heads})")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"TinyDecoder: dtype must be a floating torch.dtype, got {dtype!r}")
        self.vocab, self.hidden, self.layers, self.heads = vocab, hidden, layers, heads
        self.head_dim = hidden // heads
        g = torch.Generator().manual_seed(seed)

        def w(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=g, dtype=torch.float64) / math.sqrt(shape[-2])
                    ).to(dtype=dtype, device=device)

        self.embed = torch.randn(vocab, hidden, generator=g, dtype=torch.float64).to(dtype=dtype,
                                                                                   device=device)
        self.wq, self.wk, self.wv, self.wo = (w(layers, hidden, hidden) for _ in range(4))
        self.up, self.down = w(layers, hidden, ffn), w(layers, ffn, hidden)
        self.head = w(hidden, vocab)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def empty_kv(self) -> torch.Tensor:
        """The K (or V) of no tokens: (0, layers, heads, head_dim)."""
        return self.embed.new_zeros(0, self.layers, self.heads, self.head_dim)

    def forward(self, chunks: Sequence[Sequence[int]], past: Sequence[tuple[torch.Tensor, ...]],
                all_positions: bool = False):
        """One pass over a flattened batch: ``chunks[i]`` are sequence i's new tokens, ``past[i]``
        its cached (K, V), each (length, layers, heads, head_dim). Every matmul runs once over
        all the new tokens; attention runs per sequence, each new token seeing its sequence's
        cache and the new tokens up to itself. Returns the logits at each sequence's last new
        token (len(chunks), vocab), or at every new token (all of them, vocab) with
        ``all_positions``, and the new tokens' K and V, per sequence."""
        if len(chunks) != len(past) or not chunks or any(len(c) == 0 for c in chunks):
            raise ValueError("TinyDecoder.forward: one non-empty chunk and one past per sequence")
        ids = torch.tensor([t for c in chunks for t in c], device=self.device)
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab:
            raise ValueError(f"TinyDecoder.forward: token ids must be in [0, {self.vocab})")
        ends = torch.tensor([len(c) for c in chunks]).cumsum(0).tolist()
        spans = list(zip([0] + ends[:-1], ends))
        x, H, d = self.embed[ids], self.heads, self.head_dim
        ks, vs = [], []
        for l in range(self.layers):
            h = _rms(x)
            q, k, v = ((h @ w[l]).view(-1, H, d) for w in (self.wq, self.wk, self.wv))
            out = torch.empty_like(q)
            for (a, b), (pk, pv) in zip(spans, past):
                out[a:b] = _attend(q[a:b], torch.cat([pk[:, l], k[a:b]]),
                                   torch.cat([pv[:, l], v[a:b]]))
            x = x + out.reshape(-1, self.hidden) @ self.wo[l]
            x = x + torch.nn.functional.gelu(_rms(x) @ self.up[l]) @ self.down[l]
            ks.append(k)
            vs.append(v)
        logits = (_rms(x) if all_positions else _rms(x)[[b - 1 for _, b in spans]]) @ self.head
        k_new, v_new = torch.stack(ks, 1), torch.stack(vs, 1)           # (T, layers, H, d)
        return logits, [(k_new[a:b], v_new[a:b]) for a, b in spans]


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of n new queries (n, H, d) over m = past + n keys: query i sees keys
    0 .. past + i."""
    n, m = q.shape[0], k.shape[0]
    s = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(q.shape[-1])
    mask = torch.arange(m, device=q.device)[None] > torch.arange(m - n, m, device=q.device)[:, None]
    p = torch.softmax(s.masked_fill(mask, float("-inf")), -1)
    return torch.einsum("hnm,mhd->nhd", p, v)


def generate_alone(model: TinyDecoder, prompt: Sequence[int], new_tokens: int) -> list[int]:
    """The reference: greedy tokens for one request, every step recomputed from the whole
    sequence with no cache at all."""
    check_int("generate_alone: new_tokens", new_tokens, 1)
    seq = list(prompt)
    for _ in range(new_tokens):
        logits, _ = model.forward([seq], [(model.empty_kv(), model.empty_kv())])
        seq.append(int(logits[0].argmax()))
    return seq[len(prompt):]
# --8<-- [end:tiny_model]


@dataclass
class EngineResult:
    tokens: list[list[int]]     # per request, the generated tokens
    steps: int
    preemptions: int
    max_running: int
    graph_steps: int            # decode steps that went through GraphedDecode


# --8<-- [start:engine]
def generate(model: TinyDecoder, prompts: Sequence[Sequence[int]], new_tokens: Sequence[int],
             num_blocks: int, block_size: int = 4, max_batch: int = 4,
             arrivals: Sequence[int] | None = None,
             graph_sizes: Sequence[int] | None = None,
             use_graphs: bool | None = None) -> EngineResult:
    """Greedy generation for several requests with continuous batching over a paged cache.
    Request i joins the queue at step ``arrivals[i]`` (default: all at step 0). Each step admits
    waiting requests while there is a batch slot, then makes sure the step's new tokens have
    blocks: if not, the latest admitted request is preempted (its blocks freed, its tokens kept,
    to be prefilled again later: recompute). Then one forward pass runs every running request:
    a prefill of all its known tokens if it has no cache, else one decode token. A step of
    decodes only goes through a :class:`GraphedDecode` of ``graph_sizes`` when given (CUDA
    graphs where the model is on a GPU, unless ``use_graphs`` says otherwise)."""
    n = len(prompts)
    if n == 0 or len(new_tokens) != n:
        raise ValueError(f"generate: need one new_tokens per prompt, got {len(new_tokens)} for {n}")
    arrivals = [0] * n if arrivals is None else list(arrivals)
    if len(arrivals) != n:
        raise ValueError(f"generate: need one arrival per prompt, got {len(arrivals)} for {n}")
    for i in range(n):
        check_int(f"generate: new_tokens[{i}]", new_tokens[i], 1)
        check_int(f"generate: arrivals[{i}]", arrivals[i], 0)
        if len(prompts[i]) == 0:
            raise ValueError(f"generate: prompt {i} is empty")
    check_int("generate: max_batch", max_batch, 1)
    longest = max(len(p) + m for p, m in zip(prompts, new_tokens))
    cache = PagedKVCache(num_blocks, block_size, model.layers * model.heads, model.head_dim,
                         max_blocks_per_seq=-(-longest // block_size), dtype=model.dtype,
                         device=model.device)
    if -(-longest // block_size) > num_blocks:
        raise ValueError(f"generate: a request of {longest} tokens does not fit in {num_blocks} "
                         f"blocks of {block_size} even alone")
    graphs = None if graph_sizes is None else GraphedDecode(model, cache, graph_sizes, use_graphs)
    seqs = [list(p) for p in prompts]
    out: list[list[int]] = [[] for _ in range(n)]
    order = sorted(range(n), key=lambda i: (arrivals[i], i))
    waiting: list[int] = []
    running: list[int] = []
    step = preemptions = max_running = graph_steps = 0
    L, H, d = model.layers, model.heads, model.head_dim

    while order or waiting or running:
        while order and arrivals[order[0]] <= step:
            waiting.append(order.pop(0))
        while waiting and len(running) < max_batch:
            running.append(waiting.pop(0))
            cache.add_sequence(running[-1])
        if not running:
            step += 1
            continue
        while True:   # blocks for this step's tokens, or preempt the latest admitted
            need = sum(-(-len(seqs[i]) // block_size) - len(cache.tables[i]) for i in running)
            if need <= cache.allocator.num_free:
                break
            victim = running.pop()
            cache.free(victim)
            waiting.insert(0, victim)
            preemptions += 1
        chunks = [seqs[i][cache.length[i]:] for i in running]  # all tokens, or the last one
        if graphs is not None and all(len(c) == 1 for c in chunks):
            tables, lens = cache.block_tables(running)
            tok = torch.tensor([c[0] for c in chunks], device=model.device)
            logits, k, v = graphs(tok, tables, lens)
            new_kv = [(k[j:j + 1], v[j:j + 1]) for j in range(len(running))]
            graph_steps += 1
        else:
            past = [tuple(t.view(-1, L, H, d) for t in cache.gather(i)) for i in running]
            logits, new_kv = model.forward(chunks, past)
        for j, i in enumerate(running):
            for kt, vt in zip(*new_kv[j]):
                cache.append(i, kt.reshape(L * H, d), vt.reshape(L * H, d))
            tok = int(logits[j].argmax())
            seqs[i].append(tok)
            out[i].append(tok)
        max_running = max(max_running, len(running))
        for i in [i for i in running if len(out[i]) == new_tokens[i]]:
            running.remove(i)
            cache.free(i)
        step += 1
    return EngineResult(out, step, preemptions, max_running, graph_steps)
# --8<-- [end:engine]


# ---------------------------------------------------------------- CUDA graphs for decode

# --8<-- [start:static_decode]
def decode_step_paged(model: TinyDecoder, k_store: torch.Tensor, v_store: torch.Tensor,
                      tokens: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor):
    """One decode token for each of B sequences, with shapes fixed by B and the table width
    alone, and no Python decision that depends on the data: what a CUDA graph can capture.
    ``k_store``/``v_store`` are the paged cache's storage (num_blocks, block_size,
    layers * heads, head_dim), read through ``tables`` (B, max_blocks) up to ``lens`` (B,).
    A row of length 0 (padding) attends to its own token only. Returns the logits (B, vocab)
    and the new tokens' K and V (B, layers, heads, head_dim); the caller appends them."""
    B, M = tables.shape
    L, H, d = model.layers, model.heads, model.head_dim
    bs = k_store.shape[1]
    K = k_store[tables.long()].view(B, M * bs, L, H, d)               # gathered, masked below
    V = v_store[tables.long()].view(B, M * bs, L, H, d)
    past = torch.arange(M * bs, device=tokens.device)[None] >= lens[:, None].long()   # (B, M*bs)
    x = model.embed[tokens]
    ks, vs = [], []
    for l in range(L):
        h = _rms(x)
        q, k, v = ((h @ w[l]).view(B, H, d) for w in (model.wq, model.wk, model.wv))
        s_past = torch.einsum("bhd,bmhd->bhm", q, K[:, :, l]) / math.sqrt(d)
        s_past = s_past.masked_fill(past[:, None, :], float("-inf"))
        s_self = (q * k).sum(-1, keepdim=True) / math.sqrt(d)
        p = torch.softmax(torch.cat([s_past, s_self], -1), -1)
        out = torch.einsum("bhm,bmhd->bhd", p[..., :-1], V[:, :, l]) + p[..., -1:] * v
        x = x + out.reshape(B, -1) @ model.wo[l]
        x = x + torch.nn.functional.gelu(_rms(x) @ model.up[l]) @ model.down[l]
        ks.append(k)
        vs.append(v)
    return _rms(x) @ model.head, torch.stack(ks, 1), torch.stack(vs, 1)
# --8<-- [end:static_decode]


# --8<-- [start:graphs]
def capture_sizes(max_batch: int) -> list[int]:
    """The batch sizes to capture a graph for: powers of two up to ``max_batch``, and
    ``max_batch`` itself. Each graph holds its own memory, so not every size gets one; a batch
    is padded up to the next captured size (at most twice its rows)."""
    check_int("capture_sizes: max_batch", max_batch, 1)
    sizes = [1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch]
    return sizes + ([max_batch] if sizes[-1] != max_batch else [])


def select_size(n: int, sizes: Sequence[int]) -> int | None:
    """The smallest captured size that holds ``n`` rows, or None (run eagerly) if none does."""
    check_int("select_size: n", n, 1)
    fits = [s for s in sizes if s >= n]
    return min(fits) if fits else None


def pad_batch(tokens: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor, size: int):
    """The batch padded to ``size`` rows: token 0, a table of block 0 and length 0 per padding
    row (it reads no cache, and its outputs are thrown away)."""
    n = tokens.shape[0]
    if not (tables.shape[0] == lens.shape[0] == n):
        raise ValueError(f"pad_batch: tokens, tables and lens must have one row per sequence, "
                         f"got {n}, {tables.shape[0]}, {lens.shape[0]}")
    if size < n:
        raise ValueError(f"pad_batch: size {size} is smaller than the batch ({n})")
    extra = size - n
    return (torch.cat([tokens, tokens.new_zeros(extra)]),
            torch.cat([tables, tables.new_zeros(extra, tables.shape[1])]),
            torch.cat([lens, lens.new_zeros(extra)]))


class GraphedDecode:
    """Decode steps through CUDA graphs: one graph per size in ``sizes``, captured over static
    input buffers; a call pads its batch to the next captured size, copies it into that
    graph's buffers, replays, and returns the first rows of the outputs. A batch larger than
    every captured size runs eagerly. ``use_graphs=False`` runs the same padding eagerly: on
    a CPU (no graphs there), it tests everything but the capture."""

    def __init__(self, model: TinyDecoder, cache: PagedKVCache, sizes: Sequence[int],
                 use_graphs: bool | None = None) -> None:
        sizes = sorted({check_int("GraphedDecode: size", s, 1) for s in sizes})
        if not sizes:
            raise ValueError("GraphedDecode: sizes is empty")
        self.model, self.cache, self.sizes = model, cache, sizes
        self.use_graphs = cache.k.is_cuda if use_graphs is None else use_graphs
        if self.use_graphs and not cache.k.is_cuda:
            raise ValueError("GraphedDecode: CUDA graphs need the cache on a CUDA device")
        self.calls = {s: 0 for s in sizes}
        self.eager_calls = 0
        self.graphs: dict[int, tuple] = {}
        if self.use_graphs:
            self._capture()

    def _capture(self) -> None:
        dev, M = self.cache.k.device, self.cache.max_blocks_per_seq
        pool = None
        for s in reversed(self.sizes):               # largest first: the rest reuse its pool
            tok = torch.zeros(s, dtype=torch.long, device=dev)
            tab = torch.zeros(s, M, dtype=torch.int32, device=dev)
            lens = torch.zeros(s, dtype=torch.int32, device=dev)
            args = (self.model, self.cache.k, self.cache.v, tok, tab, lens)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):            # warm up outside the graph (allocator,
                for _ in range(2):                   # lazy library init)
                    decode_step_paged(*args)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                outs = decode_step_paged(*args)
            pool = g.pool()
            self.graphs[s] = (g, (tok, tab, lens), outs)

    def __call__(self, tokens: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor):
        n = tokens.shape[0]
        size = select_size(n, self.sizes)
        if size is None:
            self.eager_calls += 1
            return decode_step_paged(self.model, self.cache.k, self.cache.v, tokens, tables,
                                     lens)
        self.calls[size] += 1
        padded = pad_batch(tokens, tables, lens, size)
        if not self.use_graphs:
            outs = decode_step_paged(self.model, self.cache.k, self.cache.v, *padded)
        else:
            g, static, outs = self.graphs[size]
            for buf, x in zip(static, padded):
                buf.copy_(x)
            g.replay()
        return tuple(o[:n].clone() for o in outs)
# --8<-- [end:graphs]
