"""Part 7's exercises: the alpha-beta model of the ring collectives, the ring reduce-scatter on real
ranks (torch.distributed's gloo backend, several processes on a CPU), DDP's gradient buckets, ZeRO's
memory per rank, a tensor-parallel MLP simulated in one process, the 1F1B schedule and async-TP's
all-gather and multiply as a ring on gloo ranks, checked against the book's own functions
(snippets/part7/) or plain torch."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from exercises import compare
from exercises.catalog.helpers import close, require
from exercises.engine import Exercise, Failure, Run


# -------------------------------------------------------------------------------- cost-of-talking.7
def _check_ring_costs(run: Run) -> None:
    from snippets.part7 import cost

    mine = run.module()
    cases = [(n, p, a, b) for n in (1.0, 4096.0, 2.0**30) for p in (2, 3, 8, 64)
             for a, b in ((5e-6, 4.5e11), (2e-5, 2.5e10))]
    for name, hint in (("ring_reduce_scatter_time", "p - 1 steps of alpha, and each rank sends p - "
                                                    "1 chunks of n / p bytes"),
                       ("ring_all_gather_time", "the same traffic as the reduce-scatter, in the "
                                                "other direction of the data flow"),
                       ("ring_all_reduce_time", "a reduce-scatter and then an all-gather of the "
                                                "same n bytes: twice each term")):
        with run.case(f"{name}() on {len(cases)} (bytes, ranks, alpha, beta) sets, against the "
                      "book's cost.py", hint=hint):
            compare.functions(name, getattr(mine, name, None), getattr(cost, name), cases,
                              rel=1e-12)


ring_costs = Exercise(
    id="part7.cost-of-talking.7", title="The alpha-beta cost of the ring collectives", difficulty=1,
    kind="model", files=("part7/ring_costs.py",),
    task="Write the alpha-beta time of the ring reduce-scatter of n bytes per rank, of the ring "
         "all-gather of an output of n bytes, and of the ring all-reduce of n bytes per rank (a "
         "reduce-scatter, then an all-gather), for p ranks, latency alpha and bandwidth beta.",
    hint="(p - 1) alpha + (p - 1) / p * n / beta for each half; the all-reduce pays both",
    check=_check_ring_costs,
    planted={"all_reduce_once": "ring_all_reduce_time(",
             "whole_message_per_step": "ring_reduce_scatter_time("},
)


# --------------------------------------------------------------------------------------- sharding.7
def _check_zero_memory(run: Run) -> None:
    from snippets.part7.zero import zero_memory

    mine = run.module()
    cases = [(n, p, s) for n in (7_500_000_000, 21056, 1001) for p in (1, 3, 8, 64)
             for s in (0, 1, 2, 3)]
    with run.case(f"zero_memory() on {len(cases)} (parameters, ranks, stage) sets, against the "
                  "book's "
                  "zero.py", hint="stage 1 shards the optimizer state, stage 2 also the gradients, "
                                  "stage 3 also the parameters; a shard is ceil(n / ranks) "
                                  "elements"):
        compare.functions("zero_memory", getattr(mine, "zero_memory", None), zero_memory, cases)
    other = [(10**9, 8, s, 4, 4, 8) for s in range(4)]
    with run.case("zero_memory() with fp32 parameters and gradients and 8 bytes of state",
                  hint="use the byte counts passed in, not the defaults"):
        compare.functions("zero_memory", getattr(mine, "zero_memory", None), zero_memory, other)


zero_mem = Exercise(
    id="part7.sharding.7", title="Memory per rank under ZeRO and FSDP", difficulty=1, kind="model",
    files=("part7/zero_memory.py",),
    task="Write zero_memory(n_params, world_size, stage): the bytes per rank of the parameters, "
         "the gradients and the optimizer state under ZeRO stage 0 to 3 (stage 3 is FSDP's full "
         "sharding), for mixed-precision Adam (2 + 2 + 12 bytes per parameter), with shards of "
         "ceil(n / world_size).",
    hint="each of the three is either n_params or the shard, times its bytes; the stage decides "
         "which",
    check=_check_zero_memory,
    planted={"grads_replicated_at_stage_2": "zero_memory(", "floor_shard": "zero_memory("},
)


# ---------------------------------------------------------------------------------- data-parallel.7
MIXED_DTYPES = [torch.float32] * 6 + [torch.bfloat16, torch.float64]


def _random_params(rng: random.Random, n: int, dtypes=MIXED_DTYPES) -> list[torch.Tensor]:
    return [torch.zeros(rng.choice([1, 3, 16, 64, 100, 256, 1000]), dtype=rng.choice(dtypes))
            for _ in range(n)]


def _describe(params: list[torch.Tensor]) -> str:
    return "[" + ", ".join(f"{p.numel()} x "
                           f"{str(p.dtype).removeprefix('torch.')}" for p in params) + "]"


def _compare_buckets(fn, cases, reference=None, name: str = "assign_buckets") -> None:
    """``fn(params, cap)`` against ``reference`` (default: the book's assign_buckets) on every
    case, the failure naming the learner's function ``name``."""
    from snippets.part7.ddp import assign_buckets

    reference = reference or assign_buckets
    if not callable(fn):
        raise Failure(f"{name} is missing or not a function")
    for params, cap in cases:
        want = reference(params, cap)
        got = fn(params, cap)
        if not isinstance(got, list) or [list(b) for b in got] != want:
            raise Failure(f"{name}(params {_describe(params)}, bucket_bytes={cap}) = "
                          f"{got}, expected {want}")


def _check_buckets(run: Run) -> None:
    fn = getattr(run.module(), "assign_buckets", None)
    same = [torch.zeros(n) for n in (10, 20, 30, 40, 50)]                       # 4 bytes an element
    fixed = [(same, 200), (same, 160), (same, 1), (same, 10**6), ([torch.zeros(25)] * 4, 100)]
    with run.case("five float32 parameters of 10 .. 50 elements, caps that fit some exactly",
                  hint="go from the last parameter to the first; a parameter that would take the "
                       "bucket past the cap starts a new one, one that brings it exactly to the "
                       "cap does not"):
        _compare_buckets(fn, fixed)
    rng = random.Random(71)
    cases = [(_random_params(rng, rng.randint(1, 30)), rng.choice([64, 400, 1024, 4096, 10**5]))
             for _ in range(200)]
    with run.case(f"{len(cases)} random models with mixed dtypes, against the book's ddp.py",
                  hint="a change of dtype also starts a new bucket (one all-reduce per dtype)"):
        _compare_buckets(fn, cases)


buckets = Exercise(
    id="part7.data-parallel.7", title="Gradient buckets, in the order of the "
                                      "backward", difficulty=2,
    kind="python", files=("part7/buckets.py",),
    task="Write assign_buckets(params, bucket_bytes): parameter indices grouped into buckets in "
         "the reverse of the given order; a new bucket starts when the next parameter would take "
         "the current one past bucket_bytes, or when its dtype differs; a parameter larger than "
         "the cap gets a bucket of its own.",
    hint="one loop over reversed(range(len(params))), keeping the current bucket's bytes and "
         "dtype; numel() * element_size() is a parameter's bytes",
    check=_check_buckets,
    planted={"forward_order": "assign_buckets(", "cap_inclusive": "assign_buckets(",
             "ignores_dtype": "assign_buckets("},
)


# ---------------------------------------------------------------------------------- data-parallel.9
def _check_torch_buckets(run: Run) -> None:
    import torch.distributed as dist

    from snippets.part7.ddp import assign_buckets

    fn = getattr(run.module(), "torch_buckets", None)
    same = [torch.zeros(n) for n in (10, 20, 30, 5, 5, 100)]        # 40, 80, 120, 20, 20, 400 B
    fixed = [(same, 128), (same, 120), (same, 400), (same, 1), (same, 10**6)]
    with run.case("six float32 parameters, caps that some buckets reach exactly",
                  hint="close a bucket once its bytes have reached the cap (>=), not before a "
                       "parameter would pass it; the parameter that reaches it stays in"):
        _compare_buckets(fn, fixed, lambda params, cap: assign_buckets(params, cap, "after"),
                         "torch_buckets")

    def torchs(params, cap):
        got, _ = dist._compute_bucket_assignment_by_size(params[::-1], [cap], [False] * len(params))
        return [[len(params) - 1 - i for i in b] for b in got]

    rng = random.Random(91)
    cases = [(_random_params(rng, rng.randint(1, 30), [torch.float32]),
              rng.choice([4, 64, 400, 1024, 4096])) for _ in range(200)]
    with run.case(f"{len(cases)} random float32 models, against torch's own assignment function",
                  hint="the last parameter comes first: the backward produces its gradient first"):
        _compare_buckets(fn, cases, torchs, "torch_buckets")


torch_buckets = Exercise(
    id="part7.data-parallel.9", title="torch's bucket rule", difficulty=2,
    kind="python", files=("part7/torch_buckets.py",),
    task="Write torch_buckets(params, bucket_bytes) for parameters of one dtype: indices in the "
         "reverse of the given order; a parameter joins the current bucket, and the bucket is "
         "closed once its bytes have reached bucket_bytes, so it may pass the cap by its last "
         "parameter (torch's DDP's rule).",
    hint="keep the current bucket's bytes; open a new bucket when they have reached the cap, "
         "before adding the next parameter",
    check=_check_torch_buckets,
    planted={"forward_order": "torch_buckets(", "strictly_past": "torch_buckets(",
             "closes_before": "torch_buckets("},
)


# -------------------------------------------------------------------------------- tensor-parallel.8
def _check_tp(run: Run) -> None:
    import torch.nn.functional as F

    mod = run.module()
    require(mod, "column_shard", "row_shard", "rank_forward", "tp_mlp")
    g = torch.Generator().manual_seed(72)
    for b, h, f, t in ((5, 8, 32, 4), (3, 6, 12, 3), (2, 4, 16, 1), (7, 16, 64, 8)):
        w1 = torch.randn(f, h, generator=g, dtype=torch.float64)
        b1 = torch.randn(f, generator=g, dtype=torch.float64)
        w2 = torch.randn(h, f, generator=g, dtype=torch.float64)
        b2 = torch.randn(h, generator=g, dtype=torch.float64)
        x = torch.randn(b, h, generator=g, dtype=torch.float64)
        with run.case(f"the shards of W1 ({f} x {h}) and W2 ({h} x {f}) on {t} ranks",
                      hint="nn.Linear's weight is (out, in): column parallel splits the rows of W1 "
                           "and of b1, row parallel the columns of W2"):
            for r in range(t):
                w1_r, b1_r = mod.column_shard(w1, b1, t, r)
                k = f // t
                close(f"rank {r}'s rows of W1", w1_r, w1[r * k:(r + 1) * k], 0, 0)
                close(f"rank {r}'s part of b1", b1_r, b1[r * k:(r + 1) * k], 0, 0)
                close(f"rank {r}'s columns of "
                      "W2", mod.row_shard(w2, t, r), w2[:, r * k:(r + 1) * k], 0, 0)
        with run.case(f"a batch of {b}, hidden {h}, MLP width {f} on {t} ranks against the "
                      "unsharded MLP",
                      hint="the partial outputs are summed (the all-reduce g) and b2 is added "
                           "once, after the sum, not on every rank"):
            want = F.gelu(x @ w1.T + b1) @ w2.T + b2
            close("out", mod.tp_mlp(x, w1, b1, w2, b2, t), want, 1e-12, 1e-12)


tp_linear = Exercise(
    id="part7.tensor-parallel.8", title="Column- then row-parallel, simulated in one "
                                        "process", difficulty=2,
    kind="python", files=("part7/tp_linear.py",),
    task="Shard an MLP y = W2 gelu(W1 x + b1) + b2 over t ranks: W1 and b1 column parallel, W2 row "
         "parallel. Write the shards, one rank's partial output and the whole forward with the "
         "all-reduce as a sum over the ranks; it must equal the unsharded MLP.",
    hint="rank r keeps rows r f/t .. (r+1) f/t of W1 (and b1) and the same columns of W2; gelu is "
         "applied to each rank's slice of hidden features, which needs no communication",
    check=_check_tp,
    planted={"bias_on_every_rank": "out[", "row_shard_rows": "columns of W2"},
)


# ------------------------------------------------------------------------------ pipeline-parallel.9
def _check_1f1b(run: Run) -> None:
    from snippets.part7 import pipeline as pp

    mod = run.module()
    require(mod, "one_f_one_b_schedule", "bubble", "peak_in_flight")
    sizes = [(p, m) for p in (1, 2, 4, 8) for m in (1, 2, 3, 8, 16)]
    with run.case(f"one_f_one_b_schedule() on {len(sizes)} (stages, micro-batches) pairs, against "
                  "the "
                  "book's", hint="warm-up min(p - s - 1, m) forwards; then F(i + w), B(i) for i < "
                                 "m - w; then the remaining backwards"):
        for p, m in sizes:
            got, want = mod.one_f_one_b_schedule(p, m), pp.one_f_one_b_schedule(p, m)
            if not isinstance(got, list) or len(got) != p:
                raise Failure(f"one_f_one_b_schedule({p}, {m}) should be a list of {p} stages, got "
                              f"{compare._fmt(got)}")
            for s in range(p):
                acts = [tuple(a) for a in got[s]]
                if acts != want[s]:
                    raise Failure(f"one_f_one_b_schedule({p}, {m}): stage {s} runs {acts}, "
                                  f"expected {want[s]}")
    with run.case("the schedules run through the book's simulate: no deadlock, and the bubble",
                  hint="a stage that waits for a backward it has not yet made possible deadlocks"):
        for p, m in sizes:
            tl = pp.simulate(mod.one_f_one_b_schedule(p, m))
            compare.number(f"the simulated bubble of one_f_one_b_schedule({p}, "
                           f"{m})", float(tl.bubble),
                           float(pp.bubble_formula(p, m)))
    with run.case("bubble()", hint="(p - 1) / (m + p - 1): the idle time over p times the "
                                   "makespan"):
        compare.functions("bubble", lambda p, m: float(mod.bubble(p, m)),
                          lambda p, m: float(pp.bubble_formula(p, m)), sizes)
    with run.case("peak_in_flight() of every stage's 1F1B and GPipe actions",
                  hint="count up on a forward, down on a backward, and keep the maximum"):
        cases = [(acts,) for p, m in sizes for sched in (pp.one_f_one_b_schedule(p, m),
                                                         pp.gpipe_schedule(p, m)) for acts in sched]
        compare.functions("peak_in_flight", mod.peak_in_flight, pp.peak_in_flight, cases)


one_f_one_b = Exercise(
    id="part7.pipeline-parallel.9", title="The 1F1B schedule and its "
                                          "bubble", difficulty=3, kind="python",
    files=("part7/one_f_one_b.py",),
    task="Write one_f_one_b_schedule(p, m), each stage's list of ('F', i) and ('B', i) under 1F1B "
         "(a warm-up of min(p - s - 1, m) forwards, then one forward and one backward in turn, "
         "then the remaining backwards), bubble(p, m) for equal action times, and "
         "peak_in_flight(actions). The check compares the schedules with the book's and runs them "
         "through the book's simulate.",
    hint="stage s's warm-up covers the micro-batches in flight below it before its first backward "
         "can arrive from the last stage",
    check=_check_1f1b,
    planted={"warmup_off_by_one": "one_f_one_b_schedule(",
             "backward_first": "one_f_one_b_schedule("},
)


# ------------------------------------------------------------------------------------ collectives.7
def _on_ranks(fn, p: int, *args) -> list:
    """``fn(rank, p, *args)`` on p gloo processes; a rank's exception becomes the check's failure,
    its first line with the failing rank's last line."""
    from snippets.part7.launch import run_world

    try:
        return run_world(fn, p, *args, backend="gloo", timeout_s=90)
    except RuntimeError as exc:
        text = str(exc)
        tail = text.split("--- rank", 1)[1] if "--- rank" in text else ""
        detail = tail.strip().splitlines()[-1] if tail.strip() else ""
        first = text.splitlines()[0]
        extra = f" ({detail})" if detail and detail.split(": ", 1)[-1] not in first else ""
        raise Failure(first + extra) from exc


def _ring_world(rank: int, p: int, path: str, numel: int, seed: int):
    """One rank of the check (top level: run_world pickles it into new processes): the learner's
    reduce-scatter and all-reduce on this rank's vector, and dist.all_reduce's answer."""
    import torch.distributed as dist

    from exercises.engine import load_module

    mod = load_module(Path(path))
    g = torch.Generator().manual_seed(seed + rank)
    x = torch.randint(-50, 50, (numel,), generator=g).double()  # integers: any order sums exactly
    chunks = list(x.clone().tensor_split(p))
    mod.reduce_scatter_chunks(chunks, rank, p)
    rs = chunks[rank].clone()
    ar = mod.ring_all_reduce(x.view(numel // 2, 2) if numel % 2 == 0 else x).reshape(-1)
    ref = x.clone()
    dist.all_reduce(ref)
    return rs, ar, ref


def _check_ring(run: Run) -> None:
    mod = run.module()
    require(mod, "reduce_scatter_chunks", "ring_all_reduce")
    with run.case("one rank alone (no step to take): its chunk is its own",
                  hint="a ring of p ranks takes p - 1 steps"):
        x = torch.arange(5.0)
        chunks = [x.clone()]
        mod.reduce_scatter_chunks(chunks, 0, 1)
        close("chunk 0", chunks[0], x, 0, 0)
    for p, numel in ((4, 10), (3, 12)):
        with run.case(f"{p} gloo ranks, vectors of {numel} elements (chunks of unequal sizes), "
                      "against "
                      "dist.all_reduce", hint="in step s rank r sends chunk (r - s - 1) mod p to "
                                              "the right and adds what comes from the left into "
                                              "chunk (r - s - 2) mod p"):
            results = _on_ranks(_ring_world, p, str(run.path()), numel, 70)
            for r, (rs, ar, ref) in enumerate(results):
                close(f"rank {r}'s reduce-scatter chunk", rs, ref.tensor_split(p)[r], 0, 0)
                close(f"rank {r}'s all-reduce", ar, ref, 0, 0)


ring = Exercise(
    id="part7.collectives.7", title="The ring reduce-scatter, on real "
                                    "ranks", difficulty=3, kind="python",
    files=("part7/ring_reduce_scatter.py",),
    task="Write reduce_scatter_chunks(chunks, rank, p), the ring reduce-scatter in place on this "
         "rank's p chunks, with the given exchange(send, recv, right, left). The check runs it "
         "with the given all-gather on 4 and 3 processes joined by torch.distributed's gloo "
         "backend and compares every rank's chunk and all-reduce with dist.all_reduce.",
    hint="p - 1 steps; in step s rank r sends chunk (r - s - 1) mod p to rank r + 1 and adds the "
         "chunk it receives from rank r - 1 into its chunk (r - s - 2) mod p; receive into a fresh "
         "buffer, not into the chunk being sent",
    check=_check_ring,
    planted={"sends_own_chunk": "reduce-scatter chunk|chunk index",
             "overwrites": "reduce-scatter chunk"},
    gpu="",
)

# ------------------------------------------------------------------------------------ collectives.4
def _any_p_world(rank: int, p: int, path: str, seed: int):
    """One rank of the check: the learner's all-reduce of this rank's vector (10 elements, so that
    the chunks are of unequal sizes), and dist.all_reduce's answer."""
    import torch.distributed as dist

    from exercises.engine import load_module

    mod = load_module(Path(path))
    g = torch.Generator().manual_seed(seed + rank)
    x = torch.randint(-50, 50, (5, 2), generator=g).double()   # integers: any order sums exactly
    got = mod.all_reduce_any_p(x)
    ref = x.clone()
    dist.all_reduce(ref)
    return got, ref


def _check_any_p(run: Run) -> None:
    mod = run.module()
    require(mod, "all_reduce_any_p")
    for p, what in ((1, "one rank: nothing to fold, nothing to exchange"),
                    (4, "a power of two: nothing to fold"),
                    (3, "one rank folded into rank 0"),
                    (6, "two ranks folded into ranks 0 and 1")):
        with run.case(f"{p} gloo ranks ({what}), against dist.all_reduce",
                      hint="q = 1 << (p.bit_length() - 1); rank r >= q sends its vector to r - q "
                           "and receives the sum back; rank r < p - q receives from r + q and adds "
                           "before halving_doubling, and sends the sum to r + q after it"):
            for r, (got, ref) in enumerate(_on_ranks(_any_p_world, p, str(run.path()), 40)):
                close(f"rank {r}'s all-reduce", got, ref, 0, 0)


any_p = Exercise(
    id="part7.collectives.4", title="Halving and doubling for any number of ranks", difficulty=2,
    kind="python", files=("part7/halving_any_p.py",),
    task="Write all_reduce_any_p(x), the sum of x over any number of ranks p: with q the largest "
         "power of two at most p, ranks q, ..., p - 1 first send their vectors to ranks 0, ..., "
         "p - q - 1, which add them; the q ranks run the given halving_doubling; then the results "
         "go back. The check runs it on 1, 4, 3 and 6 gloo processes against dist.all_reduce.",
    hint="rank r >= q: send to r - q, then receive the sum from r - q; rank r < p - q: receive "
         "from r + q and add, run halving_doubling(flat, rank, q), then send to r + q",
    check=_check_any_p,
    planted={"no_unfold": "rank 2's all-reduce", "copies": "all-reduce",
             "q_is_p": "power of two"},
    gpu="",
)


# ------------------------------------------------------------------------------------- tp-overlap.7
_AGMM_SHAPES = ((3, 5, 4, torch.float64), (1, 8, 2, torch.float64), (6, 4, 7, torch.float32))


def _agmm_inputs(rank: int, shape: tuple, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s shard x (n, d) and weight slice w (k, d): small integers, so that every
    product and sum is exact in float32 and float64 and any order of the work gives the same."""
    n, d, k, dtype = shape
    g = torch.Generator().manual_seed(seed + rank)
    return (torch.randint(-9, 10, (n, d), generator=g).to(dtype),
            torch.randint(-9, 10, (k, d), generator=g).to(dtype))


def _agmm_world(rank: int, p: int, path: str, shapes: tuple, seed: int) -> list:
    """One rank of the check: the learner's all_gather_matmul on this rank's shard for each shape,
    with post_exchange wrapped to log each post and each wait together with the blocks of out
    (one per source rank) written so far."""
    from exercises.engine import load_module

    mod = load_module(Path(path))
    given = mod.post_exchange
    results = []
    for i, shape in enumerate(shapes):
        n, k = shape[0], shape[2]
        x, w = _agmm_inputs(rank, shape, seed + 100 * i)
        out = torch.full((p * n, k), float("nan"), dtype=x.dtype)
        log: list[tuple[str, int, tuple[int, ...]]] = []

        def written(out=out, n=n) -> tuple[int, ...]:
            return tuple(j for j in range(p) if not bool(out[j * n:(j + 1) * n].isnan().all()))

        class Logged:
            def __init__(self, work, k: int, log=log, written=written):
                self.work, self.k, self.log, self.written = work, k, log, written

            def wait(self) -> None:
                self.log.append(("wait", self.k, self.written()))
                self.work.wait()

        def logged(send, recv, right, left, log=log, written=written, Logged=Logged):
            k = sum(e[0] == "post" for e in log)
            log.append(("post", k, written()))
            return Logged(given(send, recv, right, left), k)

        mod.post_exchange = logged
        x0 = x.clone()
        mod.all_gather_matmul(x, w, out, rank, p)
        results.append((x0, x, w, out, log))
    return results


def _agmm_compare(who: str, out: torch.Tensor, want: torch.Tensor, p: int, n: int) -> None:
    """``out`` against the gathered shards times w, block by block: a block never written, or one
    that holds another rank's shard times w, is named as such."""
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(want.shape):
        close(f"{who} out", out, want, 0, 0)
    blocks = [want[q * n:(q + 1) * n] for q in range(p)]
    for j in range(p):
        got = out[j * n:(j + 1) * n]
        if torch.equal(got, blocks[j]):
            continue
        rows = f"rows {j * n}..{(j + 1) * n - 1} of out (rank {j}'s shard times w)"
        if bool(got.isnan().all()):
            raise Failure(f"{who} {rows} were never written")
        other = [q for q in range(p) if q != j and torch.equal(got, blocks[q])]
        if other:
            raise Failure(f"{who} {rows} hold rank {other[0]}'s shard times w instead")
        close(f"{who} out", out, want, 0, 0)


def _agmm_schedule(who: str, log: list, rank: int, p: int) -> None:
    """Each shard multiplied while the next one travels: exchange k is posted before the shard of
    step k is multiplied and waited for after, and there are p - 1 of them, each waited for."""
    posts = [e for e in log if e[0] == "post"]
    if len(posts) != p - 1:
        raise Failure(f"{who} posted {len(posts)} exchange(s); a ring of {p} ranks passes each "
                      f"rank's shard on {p - 1} time(s) (none in the last step)")
    for kind, k, done in log:
        src = (rank - k) % p
        if kind == "post" and src in done:
            raise Failure(f"{who} multiplied the shard of step {k} (rank {src}'s) before posting "
                          "the exchange that passes it on: nothing was in flight while it ran")
        if kind == "wait" and src not in done:
            raise Failure(f"{who} waited for the shard of step {k + 1} before multiplying the one "
                          f"it held in step {k} (rank {src}'s): the transfer had nothing to hide "
                          "behind")
    waited = sorted(k for kind, k, _ in log if kind == "wait")
    if waited != list(range(p - 1)):
        raise Failure(f"{who} waited for exchanges {waited}, expected each of 0..{p - 2} once: "
                      "a receive buffer is not to be read before its exchange is waited for")


def _check_agmm(run: Run) -> None:
    mod = run.module()
    require(mod, "all_gather_matmul", "post_exchange")
    with run.case("one rank alone (no process group): out is x times w, nothing is sent",
                  hint="p steps, an exchange in every step but the last: with p = 1 one multiply "
                       "and no exchange"):
        def nobody(*_args):
            raise Failure("post_exchange was called with one rank: there is nobody to send to "
                          "(p - 1 exchanges)")

        mod.post_exchange = nobody
        for i, shape in enumerate(_AGMM_SHAPES):
            x, w = _agmm_inputs(0, shape, 730 + 100 * i)
            out = torch.full((shape[0], shape[2]), float("nan"), dtype=x.dtype)
            mod.all_gather_matmul(x.clone(), w, out, 0, 1)
            _agmm_compare("rank 0's", out, x @ w.T, 1, shape[0])
    what = ", ".join(f"{n} x {d} ({str(dt).removeprefix('torch.')})" for n, d, _k, dt in _AGMM_SHAPES)
    for p in (2, 3, 4):
        with run.case(f"{p} gloo ranks, shards of {what}, against the gathered shards times each "
                      "rank's w",
                      hint="in step s rank r holds rank (r - s) mod p's shard (its own first, then "
                           "its left neighbour's, ...) and writes it into that rank's rows, "
                           "(r - s) mod p times n onwards; p steps in all; receive into a new "
                           "buffer, never into x"):
            worlds = _on_ranks(_agmm_world, p, str(run.path()), _AGMM_SHAPES, 730)
            for i, (n, _d, _k, _dt) in enumerate(_AGMM_SHAPES):
                xs = [worlds[r][i][0] for r in range(p)]
                for r in range(p):
                    x0, x, w, out, _log = worlds[r][i]
                    who = f"shards of {n} token(s): rank {r}'s"
                    _agmm_compare(who, out, torch.cat(xs) @ w.T, p, n)
                    if not torch.equal(x, x0):
                        raise Failure(f"{who} x was changed: the shards must be received into "
                                      "buffers of their own")
        with run.case(f"{p} gloo ranks: every shard multiplied while the next one travels "
                      "(each post and wait logged)",
                      hint="post the exchange, then multiply the shard you hold, then wait: the "
                           "multiply runs while the shard is in flight"):
            for i, (n, *_rest) in enumerate(_AGMM_SHAPES):
                for r in range(p):
                    _agmm_schedule(f"shards of {n} token(s): rank {r}", worlds[r][i][4], r, p)


all_gather_mm = Exercise(
    id="part7.tp-overlap.7", title="All-gather and multiply, each shard as it arrives",
    difficulty=3, kind="python", files=("part7/all_gather_matmul.py",),
    task="Write all_gather_matmul(x, w, out, rank, p), the all-gather then multiply of async-TP's "
         "fused_all_gather_matmul done as the shards arrive: the p ranks pass their n tokens "
         "around a ring, and in step s rank r holds rank (r - s) mod p's shard; it posts the "
         "exchange that sends it to rank r + 1 and receives the next from rank r - 1 (the given "
         "post_exchange), multiplies the shard it holds by w into that rank's rows of out while "
         "the exchange travels, then waits for it. The check runs it on one rank and on 2, 3 and "
         "4 gloo processes, compares every rank's out with the gathered shards times w, and logs "
         "every post and wait.",
    hint="held = x; for s in range(p): src = (rank - s) % p; if s < p - 1, post the exchange of "
         "held into a new buffer; multiply held into out[src n:(src + 1) n]; then wait and hold "
         "the new buffer",
    check=_check_agmm,
    planted={"held_off_by_one": "hold rank", "arrival_order": "hold rank",
             "missing_last_step": "never written", "waits_before_multiply": "before multiplying",
             "multiplies_before_posting": "before posting"},
    gpu="",
)

# ---------------------------------------------------------------------- context-expert-parallel.8
_ORDINAL = ("first", "second", "third", "fourth", "fifth", "sixth")


def _moe_reference(logits: torch.Tensor, k: int, factor: float | None):
    """The chapter's routing as a plain loop: each token's k experts of highest probability (ties
    to the lower index) and their gates; the arrivals, every first choice in token order before any
    second; an expert keeps the first C that arrive. Returns the choices (T lists of k), the gates
    (T lists), the capacity, each expert's arrivals [(token, rank)] and each expert's kept ones."""
    import math

    tokens, experts = logits.shape
    probs = logits.softmax(-1).tolist()
    choices = [sorted(range(experts), key=lambda e: (-probs[t][e], e))[:k] for t in range(tokens)]
    gates = []
    for t in range(tokens):
        top = [probs[t][e] for e in choices[t]]
        gates.append([q / sum(top) for q in top] if k > 1 else top)
    cap = tokens if factor is None else math.ceil(factor * k * tokens / experts)
    arrivals: list[list[tuple[int, int]]] = [[] for _ in range(experts)]
    for j in range(k):
        for t in range(tokens):
            arrivals[choices[t][j]].append((t, j))
    kept = [a[:cap] for a in arrivals]
    return choices, gates, cap, arrivals, kept


def _moe_routing_parts(got, pre: str):
    """(token list, expert list, gate tensor, dropped int) from what route returned."""
    if not isinstance(got, tuple) or len(got) != 4:
        raise Failure(f"{pre}route returned {type(got).__name__}, expected a Routing (token, "
                      "expert, gate, dropped)")
    token, expert, gate, dropped = got
    for name, t in (("token", token), ("expert", expert)):
        if (not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype.is_floating_point
                or t.dtype == torch.bool):
            raise Failure(f"{pre}{name} should be a 1-D tensor of integers, got "
                          f"{getattr(t, 'dtype', type(t).__name__)} of shape "
                          f"{tuple(getattr(t, 'shape', ()))}")
    if not isinstance(gate, torch.Tensor) or tuple(gate.shape) != tuple(token.shape):
        raise Failure(f"{pre}gate should be a tensor of one gate per kept assignment, shape "
                      f"{tuple(token.shape)}, got {tuple(getattr(gate, 'shape', ()))}")
    if tuple(expert.shape) != tuple(token.shape):
        raise Failure(f"{pre}token and expert should have one entry per kept assignment, got "
                      f"shapes {tuple(token.shape)} and {tuple(expert.shape)}")
    if isinstance(dropped, torch.Tensor) and dropped.numel() == 1:
        dropped = dropped.item()
    if not isinstance(dropped, int) or isinstance(dropped, bool):
        raise Failure(f"{pre}dropped should be an int, got {type(dropped).__name__}")
    return token.tolist(), expert.tolist(), gate.detach().to(torch.float64), dropped


def _moe_check_route(what: str, got, logits: torch.Tensor, k: int, factor: float | None) -> None:
    """route's answer against the loop, saying which rule it breaks."""
    choices, gates, cap, arrivals, kept = _moe_reference(logits, k, factor)
    tokens, experts = logits.shape
    pre = f"{what}: " if what else ""
    token, expert, gate, dropped = _moe_routing_parts(got, pre)
    seen = set()
    for t, e in zip(token, expert):
        if not (0 <= t < tokens and 0 <= e < experts):
            raise Failure(f"{pre}an assignment (token {t}, expert {e}) is out of range "
                          f"({tokens} tokens, {experts} experts)")
        if e not in choices[t]:
            row = logits[t]
            tie = (" (its scores tie: ties go to the lower expert index)"
                   if len(set(row.tolist())) < experts else "")
            raise Failure(f"{pre}token {t} went to expert {e}, which is not among its top {k} "
                          f"{choices[t]}{tie}")
        if (t, e) in seen:
            raise Failure(f"{pre}the assignment (token {t}, expert {e}) is there twice")
        seen.add((t, e))
    if expert != sorted(expert):
        raise Failure(f"{pre}the kept assignments are not packed by expert: experts {expert} "
                      "(all of expert 0's first, then expert 1's, ...)")
    for e in range(experts):
        mine = [t for t, x in zip(token, expert) if x == e]
        want = [t for t, _ in kept[e]]
        if mine == want:
            continue
        arrived = [t for t, _ in arrivals[e]]
        rank = dict(arrivals[e])
        head = f"{pre}expert {e} (capacity {cap}, arrivals {arrived}) kept tokens {mine}"
        if sorted(mine) == sorted(want):
            raise Failure(f"{head}, expected {want}: the same tokens, not in arrival order (every "
                          "token's first choice, in token order, before any token's second)")
        by_token = [t for t, _ in sorted(arrivals[e])]
        if sorted(mine) == sorted(by_token[:cap]):
            raise Failure(f"{head}, expected {want}: it kept the first {cap} taken token by token; "
                          "every token's first choice arrives before any token's second, so a "
                          "full expert turns away second choices first")
        if len(arrived) > cap and sorted(mine) == sorted(arrived[-cap:]):
            raise Failure(f"{head}, expected {want}: it kept the last {cap} arrivals and dropped the "
                          "first; an expert keeps the first C that arrive")
        if len(mine) != len(want):
            raise Failure(f"{head}, expected {want}: {len(mine)} kept, expected min(capacity, "
                          f"arrivals) = {len(want)}")
        x = next(t for t in arrived if t not in mine)
        y = next((t for t in mine if t not in want), mine[-1])
        raise Failure(f"{head}, expected {want}: token {y}'s {_ORDINAL[rank[y]]} choice was kept "
                      f"and token {x}'s {_ORDINAL[rank[x]]} choice, which arrives before it, dropped")
    want_gate = torch.tensor([gates[t][choices[t].index(e)] for t, e in zip(token, expert)],
                             dtype=torch.float64)
    bad = ((gate - want_gate).abs() > 1e-12 + 1e-12 * want_gate.abs()).nonzero()
    if len(bad):
        i = int(bad[0])
        t, e, g, w = token[i], expert[i], float(gate[i]), float(want_gate[i])
        p = float(logits[t].softmax(-1)[e])
        head = (f"{pre}the gate of token {t} at expert {e} (its {_ORDINAL[choices[t].index(e)]} "
                f"choice) = {g:.6g}, expected {w:.6g}")
        others = [float(v) for j, v in enumerate(want_gate) if j != i]
        if k > 1 and abs(g - p) < 1e-12:
            raise Failure(f"{head}: the softmax probability, not renormalised to sum to 1 over the "
                          f"token's top {k}")
        if k == 1 and abs(g - 1) < 1e-12:
            raise Failure(f"{head}: with k = 1 the gate is the probability itself, not "
                          "renormalised to 1")
        if any(abs(g - v) < 1e-12 for v in others):
            raise Failure(f"{head}: that is another kept assignment's gate; the gates must go "
                          "through the same permutation as the tokens")
        raise Failure(head)
    want_dropped = sum(len(a) - len(c) for a, c in zip(arrivals, kept))
    if dropped != want_dropped:
        raise Failure(f"{pre}dropped = {dropped}, expected {want_dropped} (assignments beyond "
                      f"their expert's capacity {cap})")


def _moe_cases() -> list[tuple[str, torch.Tensor, int, float | None]]:
    """(what, logits, k, capacity factor): random, and adversarial (one expert wanted by all,
    identical tokens, tied scores, second choices competing with first choices)."""
    g = torch.Generator().manual_seed(78)
    rnd = [(16, 4, 1, 1.0), (16, 4, 2, 1.0), (24, 8, 2, 1.25), (13, 4, 2, 0.5),
           (20, 6, 3, 0.75), (10, 4, 2, None), (1, 4, 2, 0.5), (9, 2, 2, 1.0), (32, 8, 1, 1.5)]
    cases = [(f"random scores, T = {t}, E = {e}, k = {k}, capacity factor {f}",
              2 * torch.randn(t, e, generator=g, dtype=torch.float64), k, f)
             for t, e, k, f in rnd]
    one = 0.1 * torch.randn(8, 4, generator=g, dtype=torch.float64)
    one[:, 2] += 5
    cases += [("every token's first choice is expert 2, k = 1, capacity factor 1", one, 1, 1.0),
              ("every token's first choice is expert 2, k = 2, capacity factor 1", one, 2, 1.0),
              ("every token's first choice is expert 2, no capacity limit", one, 2, None)]
    same = torch.randn(1, 4, generator=g, dtype=torch.float64).repeat(8, 1)
    cases += [("8 identical tokens, k = 2, capacity factor 1.25", same, 2, 1.25)]
    crafted = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    cases += [("token 0 prefers expert 1, tokens 1..3 expert 0, k = 2, capacity factor 0.5",
               crafted, 2, 0.5)]
    ties = torch.randint(0, 3, (12, 8), generator=g).to(torch.float64)
    cases += [("tied scores: all zero, E = 4, k = 1, capacity factor 2",
               torch.zeros(6, 4, dtype=torch.float64), 1, 2.0),
              ("tied scores: all zero, E = 8, k = 2, capacity factor 1",
               torch.zeros(8, 8, dtype=torch.float64), 2, 1.0),
              ("tied scores: integers 0..2, E = 8, k = 3, capacity factor 1", ties, 3, 1.0),
              ("tied scores: integers 0..2, E = 8, k = 2, no capacity limit", ties, 2, None)]
    return cases


class _RecordingExpert:
    """An expert, tanh(rows W), that keeps the rows of every call."""

    def __init__(self, w: torch.Tensor):
        self.w, self.calls = w, []

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        self.calls.append(rows.detach().clone())
        return torch.tanh(rows @ self.w)


def _moe_check_forward(mod, what: str, logits: torch.Tensor, k: int, factor, seed: int) -> None:
    tokens, experts = logits.shape
    pre, d = f"{what}: " if what else "", 5
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, d, generator=g, dtype=torch.float64)
    ws = [torch.randn(d, d, generator=g, dtype=torch.float64) for _ in range(experts)]
    fs = [_RecordingExpert(w) for w in ws]
    out = mod.moe_forward(x.clone(), logits.clone(), fs, k, factor)
    choices, gates, cap, _arrivals, kept = _moe_reference(logits, k, factor)
    for e, f in enumerate(fs):
        want = [t for t, _ in kept[e]]
        if len(f.calls) > 1:
            raise Failure(f"{pre}expert {e} was called {len(f.calls)} times; call each expert "
                          "once, on all its rows")
        if not f.calls:
            if want:
                raise Failure(f"{pre}expert {e} was never called; it should receive the rows of "
                              f"tokens {want}")
            continue
        rows = f.calls[0]
        if rows.dim() != 2 or rows.shape[1] != d:
            raise Failure(f"{pre}expert {e} received rows of shape {tuple(rows.shape)}, expected "
                          f"({len(want)}, {d})")
        match = (rows[:, None, :] == x[None]).all(-1)
        got = [int(m.nonzero()[0]) if bool(m.any()) else "?" for m in match]
        if got != want:
            raise Failure(f"{pre}expert {e} received the rows of tokens {got}, expected {want} "
                          "(its kept assignments in arrival order; '?': not a row of x)")
    parts = [[] for _ in range(tokens)]
    for e in range(experts):
        for t, j in kept[e]:
            parts[t].append(gates[t][j] * torch.tanh(x[t] @ ws[e]))
    want = torch.stack([sum(p) if p else torch.zeros(d, dtype=torch.float64) for p in parts])
    if isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(want.shape):
        bad = ((out.detach().double() - want).abs() > 1e-10).any(1).nonzero()
        if len(bad):
            t = int(bad[0])
            row = out[t].detach().double()
            if not parts[t] and torch.allclose(row, x[t], rtol=0, atol=1e-12):
                raise Failure(f"{pre}out row {t} is x[{t}]; every assignment of token {t} was "
                              "dropped, and its row must be zeros (the residual is added outside "
                              "the layer)")
            if torch.allclose(row, want[t] + x[t], rtol=0, atol=1e-10):
                raise Failure(f"{pre}out row {t} includes x[{t}]: the layer returns the experts' "
                              "weighted sum only, the residual is added outside it")
            if len(parts[t]) > 1 and any(torch.allclose(row, q, rtol=0, atol=1e-10)
                                         for q in parts[t]):
                raise Failure(f"{pre}out row {t} holds one of token {t}'s {len(parts[t])} "
                              "weighted results, not their sum (out[token] += ... keeps one value "
                              "of a repeated index; index_add_ sums them)")
    close(f"{pre}out", out, want, 1e-10, 1e-10)


def _check_moe(run: Run) -> None:
    import math

    mod = run.module()
    require(mod, "expert_capacity", "route", "moe_forward")
    sizes = [(4096, 64, 2, 1.25), (10, 4, 1, 1.0), (6, 4, 2, 0.5), (12, 8, 2, 1.25),
             (8, 8, 1, 1.0), (7, 2, 1, None), (5, 4, 2, 2.0), (3, 8, 1, 1.0), (16, 4, 1, 0.75),
             (9, 6, 3, 1.0)]
    with run.case(f"expert_capacity() on {len(sizes)} (tokens, experts, k, factor) sets",
                  hint="C = ceil(capacity_factor * k * tokens / experts), rounded up (math.ceil); "
                       "tokens when the factor is None"):
        compare.functions("expert_capacity", getattr(mod, "expert_capacity", None),
                          lambda t, e, k, f: t if f is None else math.ceil(f * k * t / e), sizes)
    chapter = torch.tensor([[2.0, 0.0], [3.0, 1.0], [1.0, 0.0], [5.0, 0.0]], dtype=torch.float64)
    with run.case("route() on the chapter's example (every token prefers expert 0), k = 1 with "
                  "capacity factor 1 and k = 2 with 0.5",
                  hint="an expert keeps the first C assignments that arrive; the gate is the "
                       "softmax probability for k = 1, renormalised over the token's k for k > 1"):
        for k, f in ((1, 1.0), (2, 0.5)):
            _moe_check_route(f"k = {k}, capacity factor {f}", mod.route(chapter.clone(), k, f),
                             chapter, k, f)
    cases = _moe_cases()
    for what, logits, k, f in cases:
        tied = "tied" in what
        with run.case(f"route() with {what}, against a loop over the arrivals",
                      hint=("ties go to the lower expert index: torch.sort(probs, dim=-1, "
                            "descending=True, stable=True); torch.topk promises no order among "
                            "equal values") if tied else
                           ("arrivals: every token's first choice in token order, then every "
                            "token's second; a token's slot is the number of earlier arrivals at "
                            "its expert, kept when below C; a stable sort by expert packs them")):
            _moe_check_route("", mod.route(logits.clone(), k, f), logits, k, f)
    picks = [cases[i] for i in (2, 3, 4, 9, 10, 13, 16)]
    for i, (what, logits, k, f) in enumerate(picks):
        with run.case(f"moe_forward() with {what}, experts that record their rows",
                      hint="dispatch: x[token], split by each expert's count (bincount with "
                           "minlength E), each expert called once on its rows; combine: "
                           "out.index_add_(0, token, gate[:, None] * y), zeros where nothing was "
                           "kept"):
            _moe_check_forward(mod, "", logits, k, f, 780 + i)


moe_routing = Exercise(
    id="part7.context-expert-parallel.8", title="Top-k routing with a capacity, dispatch and "
                                                "combine", difficulty=3, kind="python",
    files=("part7/moe_routing.py",),
    task="Write expert_capacity (C = ceil(capacity_factor * k * T / E), no limit for None); "
         "route(logits, k, capacity_factor): each token's top k experts by softmax probability "
         "(ties to the lower expert index), the gates (the probabilities, renormalised over the k "
         "when k > 1), every token's first choice arriving before any token's second, an expert "
         "keeping the first C that arrive; the kept assignments packed by expert in arrival order "
         "and the number dropped; and moe_forward, the dispatch of x's rows to the experts (each "
         "called once) and the gate-weighted combine. The check compares them with a loop over "
         "the arrivals on random and adversarial scores and records each expert's rows.",
    hint="sort the probabilities with stable=True and take k; the arrivals are the (T, k) choices "
         "transposed and flattened; a slot is the number of earlier arrivals at the same expert "
         "(a cumulative sum of one-hot rows); keep slot < C; a stable sort by expert packs the "
         "kept; combine with index_add_",
    check=_check_moe,
    planted={"floor_capacity": "expert_capacity(", "token_major": "token by token",
             "keeps_last_arrivals": "dropped the first", "not_renormalised": "not renormalised",
             "renormalised_k1": "with k = 1", "topk_ties": "lower expert index",
             "not_packed": "not packed by expert", "gates_not_permuted": "same permutation",
             "combine_overwrites": "not their sum"},
    gpu="",
)

# ------------------------------------------------------------------------------- putting-it-together.8
def _gpt_block(h: int, f: int, kv_dim: int, t: int = 1) -> torch.nn.Module:
    """A GPT-style block's parameters as torch.nn modules on the meta device (no memory): one rank's
    shard of t-way tensor parallelism, q, k, v and fc1 split by columns (outputs), out and fc2 by rows
    (inputs; their biases, added after the all-reduce, whole on every rank), LayerNorms whole."""
    nn = torch.nn
    with torch.device("meta"):
        return nn.ModuleDict({
            "ln1": nn.LayerNorm(h), "ln2": nn.LayerNorm(h),
            "q": nn.Linear(h, h // t), "k": nn.Linear(h, kv_dim // t), "v": nn.Linear(h, kv_dim // t),
            "out": nn.Linear(h // t, h), "fc1": nn.Linear(h, f // t), "fc2": nn.Linear(f // t, h)})


def _llama_block(h: int, f: int, kv_dim: int, t: int = 1) -> torch.nn.Module:
    """The same for a Llama-style block: RMSNorms (a weight only), no biases, gate, up and down."""
    nn = torch.nn
    with torch.device("meta"):
        return nn.ModuleDict({
            "norm1": nn.RMSNorm(h), "norm2": nn.RMSNorm(h),
            "q": nn.Linear(h, h // t, bias=False), "k": nn.Linear(h, kv_dim // t, bias=False),
            "v": nn.Linear(h, kv_dim // t, bias=False), "out": nn.Linear(h // t, h, bias=False),
            "gate": nn.Linear(h, f // t, bias=False), "up": nn.Linear(h, f // t, bias=False),
            "down": nn.Linear(f // t, h, bias=False)})


def _numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _check_block_params(run: Run) -> None:
    mod = run.module()
    require(mod, "gpt_block_params", "llama_block_params", "tp_block_params")
    # (h, f, kv_dim): the chapter's two small blocks, GPT-2 small's, a block of width 4096 (its exercise 1)
    gpt_mha = [(32, 128, 32), (48, 192, 48), (768, 3072, 768), (4096, 16384, 4096)]
    with run.case("gpt_block_params() with f = 4h and K/V as wide as Q (12h^2 + 13h), against sum(p.numel()) "
                  "of the block built with torch.nn",
                  hint="attention: four h x h matrices and four biases of h; MLP: h x f and f x h with biases "
                       "f and h; two LayerNorms, a weight and a bias each"):
        compare.functions("gpt_block_params", mod.gpt_block_params,
                          lambda h, f, kv: _numel(_gpt_block(h, f, kv)), gpt_mha)
    gpt_gqa = [(64, 256, 16), (96, 200, 24), (4096, 11008, 1024)]
    with run.case("gpt_block_params() with grouped K/V heads (kv_dim < h) and f != 4h",
                  hint="k and v are h x kv_dim with biases of kv_dim; only q and the output projection are "
                       "h x h"):
        compare.functions("gpt_block_params", mod.gpt_block_params,
                          lambda h, f, kv: _numel(_gpt_block(h, f, kv)), gpt_gqa)
    llama = [(4096, 14336, 1024), (64, 172, 16), (32, 96, 32), (8192, 28672, 1024)]
    with run.case("llama_block_params() for Llama 3 8B's and 70B's blocks and small ones, against torch.nn",
                  hint="no biases; the SwiGLU MLP has three h x f matrices (gate, up, down); an RMSNorm has a "
                       "weight only"):
        compare.functions("llama_block_params", mod.llama_block_params,
                          lambda h, f, kv: _numel(_llama_block(h, f, kv)), llama)
    tp = [(h, f, kv, t, arch) for arch, shapes in (("gpt", gpt_mha[:3] + gpt_gqa[:1]), ("llama", llama[:3]))
          for h, f, kv in shapes for t in (2, 4, 8) if h % t == 0 and f % t == 0 and kv % t == 0]
    with run.case(f"tp_block_params() on {len(tp)} (shape, t, arch) sets, against one rank's shard built with "
                  "torch.nn",
                  hint="the matrices are split t ways; the column-split biases (q, k, v, the MLP's first) too; "
                       "the row-split biases (out, fc2) and every norm are whole on every rank"):
        compare.functions("tp_block_params", mod.tp_block_params,
                          lambda h, f, kv, t, arch: _numel((_gpt_block if arch == "gpt" else _llama_block)
                                                           (h, f, kv, t)), tp)


block_params = Exercise(
    id="part7.putting-it-together.8", title="The parameters of a block, whole and on one "
                                            "tensor-parallel rank", difficulty=2, kind="model",
    files=("part7/block_params.py",),
    task="Count exactly, with h the width, f the MLP's width and kv_dim = n_kv h / a the width of "
         "K and V: gpt_block_params (LayerNorms with a bias, a bias on every Linear, q, k, v and the "
         "output projection, a GELU MLP of two matrices), llama_block_params (two RMSNorms with a "
         "weight only, no biases, a SwiGLU MLP of three matrices), and tp_block_params(h, f, kv_dim, "
         "t, arch), what one rank of t-way tensor parallelism holds of a block under Megatron's split. "
         "The check counts the parameters of the same blocks, and of one rank's shard, built with "
         "torch.nn on the meta device.",
    hint="GPT: 2h^2 + 2h kv_dim + 2h + 2kv_dim + 2hf + f + h + 4h; Llama: 2h^2 + 2h kv_dim + 3hf + "
         "2h. One rank: the matrices and the column-split biases over t, the row-split biases and "
         "the norms whole",
    check=_check_block_params,
    planted={"kv_as_wide_as_q": "grouped K/V", "layernorm_weight_only": "12h^2 + 13h",
             "swiglu_two_matrices": "llama_block_params(", "tp_everything_split": "tp_block_params(",
             "tp_row_bias_split": "tp_block_params("},
)


EXERCISES = [ring_costs, zero_mem, buckets, torch_buckets, tp_linear, one_f_one_b, any_p, ring,
             all_gather_mm, moe_routing, block_params]
