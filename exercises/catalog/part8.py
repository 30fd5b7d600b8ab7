"""Part 8's exercises: inference. Models of a decode step's bytes, the paged cache's bookkeeping,
the split-KV merge, int4 packing, the speculative acceptance rule, a continuous-batching
scheduler and the model's head as an ONNX graph (run by onnxruntime), all checked on a CPU
against the book's own functions (snippets/part8/)."""

from __future__ import annotations

import math
import random

import torch

from exercises import compare
from exercises.catalog.helpers import close, require
from exercises.engine import Exercise, Failure, Run


# --------------------------------------------------------------------------------------- kv-cache.1
def _check_waste(run: Run) -> None:
    from snippets.part8.kv_cache import paged_waste

    mine = run.module()
    cases = [(n, b) for b in (1, 2, 16, 5) for n in range(1, 3 * b + 2)]
    with run.case(f"wasted_slots() on {len(cases)} lengths and block sizes, against the book's "
                  "paged_waste", hint="the blocks hold b * ceil(n / b) slots; a length that b "
                                      "divides wastes nothing"):
        compare.functions("wasted_slots", getattr(mine, "wasted_slots", None),
                          lambda n, b: paged_waste([n], b).wasted, cases)
    sizes = [(1,), (2,), (16,), (7,), (64,)]
    with run.case("expected_waste() against the mean over one length of each residue",
                  hint="average wasted_slots(r, b) over r = 0 .. b - 1: the residues 1 .. b - 1 "
                       "waste b - 1 .. 1, residue 0 wastes nothing"):
        compare.functions("expected_waste", getattr(mine, "expected_waste", None),
                          lambda b: sum(-r % b for r in range(b)) / b, sizes)


block_waste = Exercise(
    id="part8.kv-cache.1", title="Slots a paged cache wastes", difficulty=1, kind="model",
    files=("part8/block_waste.py",),
    task="A sequence of n tokens in a paged cache with blocks of b tokens holds ceil(n / b) "
         "blocks. Write wasted_slots(n, b), the slots of its blocks that hold no token, and "
         "expected_waste(b), its mean over lengths spread evenly over the residues modulo b.",
    hint="-n % b is b * ceil(n / b) - n in Python; the mean of 0, b - 1, b - 2, ..., 1 is (b - 1) "
         "/ 2",
    check=_check_waste,
    planted={"full_block_when_divisible": "wasted_slots(1, 1) = 1, expected 0",
             "half_a_block": "expected_waste("},
)


# ---------------------------------------------------------------------------- decode-memory-bound.6
def _configs():
    from snippets.part8 import decode_model as dm

    base = dm.LLAMA3_8B
    return [
        base,
        dm.DecoderConfig(layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672,
                         vocab=128256),                                   # Llama 3 70B's shape
        dm.DecoderConfig(**{**base.__dict__, "kv_dtype_bytes": 1}),       # an fp8 cache
        dm.DecoderConfig(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=160, vocab=100,
                         dtype_bytes=4, kv_dtype_bytes=4),
    ]


def _check_decode_bytes(run: Run) -> None:
    from snippets.part8 import decode_model as dm

    mine, cfgs = run.module(), _configs()
    with run.case("kv_bytes_per_token() against the book's, on Llama 3 8B, 70B, an fp8 cache and a "
                  "tiny "
                  "model", hint="K and V (2) per layer, per KV head (not query head), head_dim "
                                "elements of kv_dtype_bytes each"):
        compare.functions("kv_bytes_per_token", getattr(mine, "kv_bytes_per_token", None),
                          dm.kv_bytes_per_token, [(c,) for c in cfgs])
    steps = [(c, b, n) for c in cfgs for b in (1, 3, 64) for n in (0, 1, 4095)]
    with run.case(f"step_bytes() on {len(steps)} (model, batch, context) sets, against the book's "
                  "decode_step_bytes", hint="the weights are read once whatever the batch; each "
                                            "sequence reads its context and writes one new token's "
                                            "K and V: (context + 1) tokens of cache"):
        compare.functions("step_bytes", getattr(mine, "step_bytes", None), dm.decode_step_bytes,
                          steps)
    with run.case("bytes_per_token()", hint="a step decodes one token per sequence"):
        compare.functions("bytes_per_token", getattr(mine, "bytes_per_token", None),
                          lambda c, b, n: dm.decode_step_bytes(c, b, n) / b, steps)
    with run.case(f"step_flops() on {len(steps)} sets, against the book's decode_step_flops",
                  hint="2 FLOPs per matmul weight per token; attention's q.k and p.v are 4 * "
                       "head_dim per query head (not KV head) and attended token, context + 1 of "
                       "them"):
        compare.functions("step_flops", getattr(mine, "step_flops", None), dm.decode_step_flops,
                          steps)
    machines = [(3e12, 8e14), (4.8e12, 9.9e14), (1e12, 1e15)]
    cases = [(c, n, bw, pk) for c in cfgs for n in (0, 512, 4096, 100000) for bw, pk in machines]
    with run.case(f"compute_bound_batch() on {len(cases)} (model, context, machine) sets, against "
                  "the "
                  "book's", hint="B f / peak >= (W + B k) / bw with W the weights' bytes and, per "
                                 "sequence, k bytes and f FLOPs: none when f / peak <= k / bw; "
                                 "settle the boundary with the exact counts, not the rounded "
                                 "closed form"):
        compare.functions("compute_bound_batch", getattr(mine, "compute_bound_batch", None),
                          dm.compute_bound_batch, cases)


decode_bytes = Exercise(
    id="part8.decode-memory-bound.6", title="Bytes per decoded token, and where decode turns "
                                            "compute-bound",
    difficulty=2, kind="model", files=("part8/decode_bytes.py",),
    task="Write the chapter's decode model for a DecoderConfig: the bytes one token adds to the KV "
         "cache, the bytes of one decode step (weights once, the batch's embedding rows, each "
         "sequence's cache read and its new token's K and V written), the bytes per decoded token, "
         "the step's FLOPs, and the smallest batch at which the FLOPs take at least as long as the "
         "bytes (None if none does).",
    hint="matmul_params(cfg) is given; only the KV cache grows with the batch as well as the FLOPs",
    check=_check_decode_bytes,
    planted={"no_new_token": "step_bytes(", "weights_per_sequence": "step_bytes(",
             "flops_per_kv_head": "step_flops("},
)


# ------------------------------------------------------------------------------- decode-attention.6
def _attention_ref(q, k, v):
    s = (k @ q) / math.sqrt(q.shape[0])
    return torch.softmax(s, 0) @ v, torch.logsumexp(s, 0)


def _chunks(n: int, splits: int, tile: int) -> list[tuple[int, int]]:
    """The split kernel's chunks: ceil(ceil(n / splits) / tile) tiles each, some empty at the
    end."""
    c = tile * math.ceil(math.ceil(n / splits) / tile)
    return [(min(s * c, n), min((s + 1) * c, n)) for s in range(splits)]


def _check_split_merge(run: Run) -> None:
    mine = run.module()
    g = torch.Generator().manual_seed(86)
    require(mine, "partial", "merge")
    with run.case("partial() on one chunk of 37 tokens: its softmax output and its log-sum-exp",
                  hint="o_s is the chunk's own softmax (normalised by the chunk's sum) times its V "
                       "rows; lse_s = m + log(sum exp(s - m)) with m the chunk's largest score"):
        q, k, v = (torch.randn(*s, generator=g, dtype=torch.float64)
                   for s in ((32,), (50, 32), (50, 32)))
        o, lse = mine.partial(q, k, v, 5, 42)
        o_ref, lse_ref = _attention_ref(q, k[5:42], v[5:42])
        close("o_s", o, o_ref, 1e-10, 1e-12)
        compare.number("lse_s", float(lse), float(lse_ref), 1e-10, 1e-12)
    with run.case("partial() on an empty "
                  "chunk", hint="an empty chunk has no scores: return zeros and -inf, which the "
                                "merge weighs by exp(-inf) = 0"):
        o, lse = mine.partial(q, k, v, 50, 50)
        close("o_s of an empty chunk", o, torch.zeros(32, dtype=torch.float64), 0, 0)
        compare.number("lse_s of an empty chunk", float(lse), -math.inf)
    for n, splits, tile, d, scale in ((100, 8, 64, 32, 1.0), (257, 4, 16, 64, 1.0),
                                      (1, 3, 16, 16, 1.0), (300, 5, 16, 64, 6.0)):
        chunks = _chunks(n, splits, tile)
        empty = sum(a == b for a, b in chunks)
        what = (f"{n} tokens in {splits} chunks of tiles of {tile} ({empty} empty), scores of size "
                f"{scale**2:g}")
        with run.case(what, hint="weigh each chunk's o_s by exp(lse_s - M) / sum of them, M the "
                                 "largest lse_s: a chunk's share of the whole softmax sum"):
            q = torch.randn(d, generator=g, dtype=torch.float64) * scale
            k = torch.randn(n, d, generator=g, dtype=torch.float64) * scale
            v = torch.randn(n, d, generator=g, dtype=torch.float64)
            parts = [mine.partial(q, k, v, a, b) for a, b in chunks]
            o = torch.stack([p[0] for p in parts])
            lse = torch.stack([torch.as_tensor(p[1], dtype=torch.float64) for p in parts])
            close("merged", mine.merge(o, lse), _attention_ref(q, k, v)[0], 1e-9, 1e-12)


split_merge = Exercise(
    id="part8.decode-attention.6", title="Split-KV: merge partial results by "
                                         "log-sum-exp", difficulty=2,
    kind="python", files=("part8/split_merge.py",),
    task="Write partial(q, k, v, start, end), one chunk's normalised attention output and "
         "log-sum-exp (0 and -inf for an empty chunk), and merge(o, lse), which combines the "
         "chunks into softmax(q K^T / sqrt(D)) V over all tokens.",
    hint="in a chunk: m = max score, e = exp(s - m), o_s = e V / sum e, lse_s = m + log(sum e); "
         "merging: w_s = exp(lse_s - max lse), o = sum w_s o_s / sum w_s",
    check=_check_split_merge,
    planted={"weights_not_normalised": "merged[", "lse_without_max": "lse_s ="},
)


# ------------------------------------------------------------------------------------- capstone.8
def _check_split_norm(run: Run) -> None:
    from snippets.part5.rmsnorm import EPS, rmsnorm_ref

    mine = run.module()
    g = torch.Generator().manual_seed(88)
    require(mine, "slice_partials", "combine")
    x, gw, w = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((3, 64), (64,), (10, 64)))
    with run.case("slice_partials() on columns 5 to 37 of K = 64: the slice's product and squares",
                  hint="p: (x * g) of the slice's columns times those columns of W, transposed; ss: the "
                       "sum of x^2 over the slice, of x before g scales it (the norm's mean is of x)"):
        p, ss = mine.slice_partials(x, gw, w, 5, 37)
        close("p", p, (x[:, 5:37] * gw[5:37]) @ w[:, 5:37].T, 1e-12, 1e-12)
        close("ss", ss, (x[:, 5:37] ** 2).sum(1), 1e-12, 1e-12)
    with run.case("slice_partials() on an empty slice", hint="a slice with no columns adds nothing: "
                                                              "zeros of shape (B, N) and (B,)"):
        p, ss = mine.slice_partials(x, gw, w, 64, 64)
        close("p of an empty slice", p, torch.zeros(3, 10, dtype=torch.float64), 0, 0)
        close("ss of an empty slice", ss, torch.zeros(3, dtype=torch.float64), 0, 0)
    for b, n, k, splits, tile, scale in ((3, 10, 64, 4, 16, 1.0), (5, 7, 100, 3, 16, 1.0),
                                         (2, 9, 24, 3, 16, 1.0), (4, 6, 256, 8, 32, 1e-3)):
        chunks = _chunks(k, splits, tile)
        empty = sum(a == c for a, c in chunks)
        what = (f"K = {k} in {splits} slices of whole {tile}-column steps ({empty} empty), rows of "
                f"size {scale:g}" + (": their mean square comparable with eps" if scale < 1 else ""))
        with run.case(what, hint="add the slices' p and their ss first, then r = 1 / sqrt(ss / K + "
                                 "eps) from the whole row's squares, applied once to the summed p"):
            x = torch.randn(b, k, generator=g, dtype=torch.float64) * scale
            gw = torch.randn(k, generator=g, dtype=torch.float64)
            w = torch.randn(n, k, generator=g, dtype=torch.float64)
            parts = [mine.slice_partials(x, gw, w, lo, hi) for lo, hi in chunks]
            close("combined", mine.combine(parts, k, EPS), rmsnorm_ref(x, gw, EPS) @ w.T, 1e-9, 1e-12)


split_norm = Exercise(
    id="part8.capstone.8", title="Split-K with RMSNorm as the prologue", difficulty=2,
    kind="python", files=("part8/split_norm.py",),
    task="Write slice_partials(x, g, w, k_lo, k_hi), one slice of K's partial product of x * g "
         "with W and its partial sum of x^2, and combine(parts, k, eps), which adds the slices into "
         "rmsnorm(x, g) @ W^T.",
    hint="r = 1 / sqrt(mean(x^2) + eps) is one number per row: it factors out of every slice's sum, "
         "but it needs the whole row's squares, so the slices carry their sums of squares and r is "
         "applied where they are added",
    check=_check_split_norm,
    planted={"squares_of_normed_x": "ss[", "r_per_slice": "combined[", "eps_outside_sqrt": "combined["},
)


# ---------------------------------------------------------------------------------- quantisation.11
def _check_int4(run: Run) -> None:
    from snippets.part8 import quant as qt

    mine = run.module()
    g = torch.Generator().manual_seed(87)
    require(mine, "int4_params", "quantize", "dequantize", "pack", "unpack")
    for n, k, gs in ((5, 64, 16), (3, 256, 128), (4, 96, 32)):
        w = torch.randn(n, k, generator=g) * 0.05
        w[0, :gs] = 0.0                                     # a group of zeros: scale 1
        w[1, gs:2 * gs] = w[1, gs:2 * gs].abs() + 0.01      # a group with no negative weight
        w[2, :gs] = -w[2, :gs].abs() - 0.01                 # and one with no positive weight
        for zp in (False, True):
            kind = "with zero points" if zp else "symmetric"
            with run.case(f"a {n} x {k} weight in groups of {gs}, {kind}: scales and zero points",
                          hint="symmetric: max|w| / 7 (not 8); with zero points: widen [min, max] "
                               "to include 0, scale (max - min) / 15, zero round(-min / scale)"):
                scales, zeros = mine.int4_params(w, gs, zp)
                ref_s, ref_z = qt.int4_params(w, gs, zp)
                close("scales", scales, ref_s, 0, 0)
                if zp:
                    close("zeros", zeros, ref_z, 0, 0)
                elif zeros is not None:
                    raise Failure("symmetric int4_params should return zeros = None")
            with run.case(f"the codes and the dequantised weight ({kind})",
                          hint="round(w / scale) + zero (8 when symmetric), clamped to 0..15"):
                codes = mine.quantize(w, ref_s, ref_z)
                close("codes", codes, qt.quantize_int4(w, ref_s, ref_z), 0, 0)
                close("dequantised", mine.dequantize(codes, ref_s, ref_z),
                      qt.dequantize_int4(codes, ref_s.double(), ref_z), 1e-12, 0)
            with run.case(f"pack and unpack ({kind})",
                          hint="byte j holds code 2j in bits 0-3 and code 2j + 1 in bits 4-7"):
                ref_codes = qt.quantize_int4(w, ref_s, ref_z)
                close("packed", mine.pack(ref_codes), qt.pack_int4(ref_codes), 0, 0)
                close("unpacked", mine.unpack(qt.pack_int4(ref_codes)), ref_codes, 0, 0)


int4_pack = Exercise(
    id="part8.quantisation.11", title="int4 with group scales: round, pack, unpack", difficulty=3,
    kind="python", files=("part8/int4_pack.py",),
    task="Quantise an (N, K) weight to int4 codes 0..15 in groups along K, round to nearest, "
         "symmetric (scale max|w| / 7, zero point 8) and with zero points ([min, max] widened to "
         "include 0 over codes 0..15); dequantise; pack two codes per byte (code 2j low nibble, 2j "
         "+ 1 high) and unpack. The check compares every step with the book's "
         "snippets/part8/quant.py bit for bit.",
    hint="compute in float64 and round the scales to float32 at the end; reshape (N, K) to (N, K / "
         "g, g) for the per-group max and min",
    check=_check_int4,
    planted={"scale_over_8": "scales[", "no_widen_to_zero": "scales[",
             "nibbles_swapped": "packed["},
)


# ---------------------------------------------------------------------------------- quantisation.16
_BASES = {"bf16": 128.0, "fp16": 1024.0}


def _half_value(half: int, kind: str) -> float:
    """A 16-bit pattern's value as bf16 or fp16 (the checker's own decoder)."""
    import numpy as np

    if kind == "bf16":
        return float(np.array([half << 16], dtype=np.uint32).view(np.float32)[0])
    return float(np.array([half], dtype=np.uint16).view(np.float16)[0])


def _check_int4_magic(run: Run) -> None:
    mine = run.module()
    require(mine, "registers", "values")
    rng = random.Random(16)
    # every code at every position of a word, then random words
    words = [sum(c << (4 * i) for i in range(8)) for c in range(16)]
    words += [rng.getrandbits(32) for _ in range(300)]
    for kind, base in _BASES.items():
        with run.case(f"{kind}: registers(word) of {len(words)} words: each half is {base:g} plus "
                      "the code (even registers) or a fixed power-of-two multiple of it (odd ones)",
                      hint="bf16 has 7 mantissa bits: a code at bits 4..7 of a byte would reach bit "
                           "7, the exponent's lowest; shift it right by one first"):
            factors = set()
            for w in words:
                regs = [int(r) for r in mine.registers(w, kind)]
                if len(regs) != 4:
                    raise Failure(f"registers({w:#010x}) should return 4 registers, got {len(regs)}")
                codes = [(w >> (4 * i)) & 0xF for i in range(8)]
                for r, reg in enumerate(regs):
                    for h, c in enumerate((codes[r], codes[r + 4])):
                        v = _half_value((reg >> (16 * h)) & 0xFFFF, kind)
                        f = (v - base) / c if c else None
                        ok = v - base == c if r % 2 == 0 else (c == 0 and v == base) or f in (8, 16)
                        if not ok:
                            raise Failure(f"registers[{r}] of word {w:#010x}, half {h}: {v!r}, "
                                          f"which is not {base:g} + {'' if r % 2 == 0 else 'k x '}"
                                          f"code {c} (code {r + 4 * h} of the word)")
                        if r % 2 and c:
                            factors.add(f)
            if len(factors) > 1:
                raise Failure(f"registers: the odd codes come out as {sorted(factors)} times the "
                              "code; one factor for every register, so one multiply-add undoes it")
        with run.case(f"{kind}: values(registers, zero) is every code minus the zero point, in "
                      "the pairs (c0, c4), (c1, c5), (c2, c6), (c3, c7)",
                      hint="even registers: value - (BASE + zero); odd: value / factor - (BASE / "
                           "factor + zero)"):
            ref = run.solution()
            for zero in (0, 3, 8, 15):
                for w in words[:80]:
                    got = mine.values(ref.registers(w, kind), zero, kind)
                    codes = [(w >> (4 * i)) & 0xF for i in range(8)]
                    want = [(codes[r] - zero, codes[r + 4] - zero) for r in range(4)]
                    if [tuple(float(v) for v in p) for p in got] != [tuple(map(float, p)) for p in want]:
                        raise Failure(f"values[...] of word {w:#010x}, zero {zero}: {got}, want {want}")


int4_magic = Exercise(
    id="part8.quantisation.16", title="Two int4 codes into two floats with one AND-OR",
    difficulty=2, kind="python", files=("part8/int4_magic.py",),
    task="Fill in TYPES (the magic number of bf16 and fp16, and how the odd code of each byte goes "
         "in), registers(word, kind) (the four registers of a word's eight codes, (c0, c4) .. (c3, "
         "c7), built with AND, OR and shifts only) and values(regs, zero, kind) (code minus zero "
         "point, as the kernel's one packed subtraction or multiply-add leaves it).",
    hint="a bf16 with exponent 2^7 has 7 mantissa bits each worth 1: 0x4300 | c is 128 + c; fp16 "
         "1024.0 = 0x6400 has 10",
    check=_check_int4_magic,
    planted={"bf16_code_into_exponent": "registers[", "zero_point_forgotten": "values["},
)


# --------------------------------------------------------------------------- speculative-decoding.7
_SPEC_N = 6000  # passes per sampling case: a few seconds on a CPU


def _spec_models():
    from snippets.part8 import speculative as sp
    from snippets.part8.serving import TinyDecoder

    # the models of tests/test_part8_speculative.py
    base = TinyDecoder(vocab=6, hidden=16, layers=2, heads=2, ffn=32, seed=3)
    return sp.LM(base), sp.LM(sp.noisy_copy(base, 0.5))


def _emitted(out, k: int) -> list[int]:
    if not isinstance(out, (list, tuple)) or not 1 <= len(out) <= k + 1:
        raise Failure(f"verify should return a list of 1 to k + 1 = {k + 1} tokens, got {out!r}")
    return [int(t) for t in out]


def _check_verify(run: Run) -> None:
    from snippets.part8 import speculative as sp

    verify = getattr(run.module(), "verify", None)
    if not callable(verify):
        raise Failure("verify is missing or not a function")
    g = torch.Generator().manual_seed(88)
    with run.case("p equal to q: every guess is kept, then a bonus token",
                  hint="keep guess i when a uniform draw is below min(1, p_i(x) / q_i(x)): 1 when "
                       "p = q"):
        for _ in range(50):
            p = torch.softmax(torch.randn(3, 6, generator=g, dtype=torch.float64), 1)
            drafts = [int(torch.multinomial(p[i], 1, generator=g)) for i in range(2)]
            out = _emitted(verify(p, p[:2].clone(), drafts, g), 2)
            if len(out) != 3 or out[:2] != drafts:
                raise Failure(f"with p = q and guesses {drafts}, verify returned {out}: all "
                              "guesses should be kept and a bonus token added")
    with run.case("a guess the target never emits (p = 0) is always rejected and replaced",
                  hint="at a rejection, draw from max(0, p - q) normalised: never a token with p = "
                       "0"):
        p = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25] * 4], dtype=torch.float64)
        q = torch.tensor([[0.7, 0.1, 0.1, 0.1]], dtype=torch.float64)
        for _ in range(100):
            out = _emitted(verify(p, q, [0], g), 1)
            if out[0] not in (1, 2) or len(out) != 1:
                raise Failure(f"guess 0 has p = 0 but verify returned {out}: it must be rejected, "
                              "and the replacement drawn where p > q (tokens 1 or 2)")
    target, draft = _spec_models()
    context = [1, 4, 2]
    want = sp.target_two_tokens(target, context)
    for k in (1, 2):
        with run.case(f"{_SPEC_N} passes with k = {k} guesses: the first two tokens against the "
                      "target's distribution (chi-square)",
                      hint="the residual is max(0, p - q), not p; the bonus token comes from p[k], "
                           "the row after the last guess; keep with min(1, p / q), not q / p"):
            gen = torch.Generator().manual_seed(89 + k)
            counts = torch.zeros(6, 6, dtype=torch.float64)
            for _ in range(_SPEC_N):
                seq = list(context)
                while len(seq) - len(context) < 2:
                    drafts, qs = [], []
                    for _ in range(k):
                        qs.append(draft.dists(seq + drafts)[0])
                        drafts.append(int(torch.multinomial(qs[-1], 1, generator=gen)))
                    out = verify(target.dists(seq, drafts), torch.stack(qs), drafts, gen)
                    seq += _emitted(out, k)
                counts[seq[3], seq[4]] += 1
            stat, df = sp.chi_square(counts, want)
            bound = sp.chi_square_bound(df)
            if not stat < bound:
                expected = _SPEC_N * want
                cell = ((counts - expected).abs() / expected.clamp(min=1e-9).sqrt()).argmax()
                x, y = divmod(int(cell), 6)
                raise Failure("the first two tokens do not follow the target: chi-square "
                              f"{stat:.1f} > bound {bound:.1f} ({df} degrees of freedom); tokens "
                              f"({x}, {y}) came {int(counts[x, y])} times, the target gives "
                              f"{_SPEC_N * float(want[x, y]):.0f}")


spec_verify = Exercise(
    id="part8.speculative-decoding.7", title="The acceptance rule of speculative "
                                             "decoding", difficulty=3,
    kind="python", files=("part8/spec_verify.py",),
    task="Write verify(p, q, drafts, gen): keep guess i with probability min(1, p_i(x) / q_i(x)); "
         "at the first rejection emit a token from the residual max(0, p_i - q_i) normalised, and "
         "stop; if all k are kept, emit a bonus token from p_k. The check samples many passes with "
         "the book's tiny models and tests the first two tokens' distribution against the target's "
         "(chi-square, fixed seed).",
    hint="uniform(gen) and sample(dist, gen) are given; a pass emits between 1 and k + 1 tokens",
    check=_check_verify,
    planted={"resample_from_p": "chi-square", "bonus_from_last_guess": "chi-square",
             "accept_q_over_p": "must be rejected"},
)


# --------------------------------------------------------------------------------------- kv-cache.6
def _check_paged_fork(run: Run) -> None:
    from snippets.part8.kv_cache import OutOfBlocks, PagedKVCache

    mod = run.module()
    for name in ("PagedTables",):
        if not callable(getattr(mod, name, None)):
            raise Failure(f"{name} is missing")
    for seed, num_blocks, block_size, ops in ((90, 64, 4, 400), (91, 12, 3, 400), (92, 40, 1, 300)):
        what = f"{ops} random operations on {num_blocks} blocks of {block_size} (seed {seed})"
        with run.case(what, hint="fork: share each of the parent's blocks and copy its table; "
                                 "append: a new block when the slot is 0, else a private copy of "
                                 "the last block first when its count is above 1 (allocate the "
                                 "copy before freeing the shared one)"):
            _replay(mod, PagedKVCache, OutOfBlocks, seed, num_blocks, block_size, ops)


def _replay(mod, PagedKVCache, OutOfBlocks, seed, num_blocks, block_size, ops) -> None:
    rng = random.Random(seed)
    mine = mod.PagedTables(num_blocks, block_size, 8)
    book = PagedKVCache(num_blocks, block_size, 1, 1, 8, dtype=torch.float64)
    live, nxt, log = [], 0, []
    for step in range(ops):
        r = rng.random()
        if not live or r < 0.1:
            op = ("add", nxt)
            nxt += 1
        elif r < 0.25:
            op = ("fork", rng.choice(live), nxt)
            nxt += 1
        elif r < 0.32:
            op = ("free", rng.choice(live))
        else:
            op = ("append", rng.choice(live), float(rng.randrange(1000)))
        log.append(op)
        if op[0] == "add":
            book.add_sequence(op[1])
            mine.add_sequence(op[1])
            live.append(op[1])
        elif op[0] == "fork":
            book.fork(op[1], op[2])
            mine.fork(op[1], op[2])
            live.append(op[2])
        elif op[0] == "free":
            book.free(op[1])
            mine.free(op[1])
            live.remove(op[1])
        else:
            seq, tok = op[1], op[2]
            try:
                book.append(seq, torch.full((1, 1), tok, dtype=torch.float64),
                            torch.full((1, 1), tok, dtype=torch.float64))
                expected = None
            except (OutOfBlocks, ValueError) as exc:
                expected = type(exc)
            got = None
            try:
                mine.append(seq, tok)
            except (OutOfBlocks, ValueError) as exc:
                got = type(exc)
            if got is not expected:
                what = "returned" if got is None else f"raised {got.__name__}"
                want = "succeed" if expected is None else f"raise {expected.__name__}"
                raise Failure(f"operation {step} ({_fmt_op(op)}): append {what}, the book's cache "
                              f"would {want} ({book.allocator.num_free} block(s) free, sequence "
                              f"{seq} has {book.length[seq]} tokens)")
        _compare_state(mine, book, step, op, live)


def _fmt_op(op) -> str:
    return {"add": lambda: f"add_sequence({op[1]})", "fork": lambda: f"fork({op[1]}, {op[2]})",
            "free": lambda: f"free({op[1]})", "append": lambda: f"append({op[1]}, "
                                                                f"{op[2]:g})"}[op[0]]()


def _compare_state(mine, book, step, op, live) -> None:
    where = f"after operation {step} ({_fmt_op(op)})"
    for s in live:
        if mine.tables.get(s) != book.tables[s] or mine.length.get(s) != book.length[s]:
            raise Failure(f"{where}: sequence {s} has block table {mine.tables.get(s)} and length "
                          f"{mine.length.get(s)}; the book's cache has {book.tables[s]} and "
                          f"{book.length[s]}")
        toks = [float(t) for t in book.gather(s)[0].flatten()]
        got = mine.tokens(s)
        if got != toks:
            raise Failure(f"{where}: tokens(seq {s}) = {got}, the book's cache holds {toks} (a "
                          "write into a block another sequence shares, or a copy that lost "
                          "tokens)")
    for b in range(book.allocator.num_blocks):
        if mine.allocator.refcount(b) != book.allocator.refcount(b):
            raise Failure(f"{where}: block {b} has refcount {mine.allocator.refcount(b)}, the "
                          f"book's cache has {book.allocator.refcount(b)}")


paged_fork = Exercise(
    id="part8.kv-cache.6", title="Fork and copy-on-write in a paged "
                                 "cache", difficulty=3, kind="python",
    files=("part8/paged_fork.py",),
    task="Write fork(parent, child) and append(seq, token) of a paged cache's bookkeeping on the "
         "book's BlockAllocator: fork shares every block of the parent (counts up, no copy); "
         "append writes at position length, taking a new block when the last is full and copying a "
         "shared last block first (copy-on-write); OutOfBlocks leaves everything unchanged. The "
         "check runs random traces of add, fork, append and free against the book's PagedKVCache.",
    hint="slot = length % block_size; slot 0 needs a new block; otherwise a last block with "
         "refcount > 1 is shared: allocate a fresh one, copy the first slot tokens, free the "
         "shared one, replace it",
    check=_check_paged_fork,
    planted={"no_copy_on_write": "block table", "fork_without_share": "refcount",
             "copy_keeps_shared": "refcount"},
)


# ---------------------------------------------------------------------------------------- serving.7
def _book_token_steps(trace, num_blocks, block_size, max_batch):
    from snippets.part8 import decode_model as dm
    from snippets.part8.serving import simulate

    res = simulate(trace, "continuous", dm.LLAMA3_8B, 3e12, 8e14, num_blocks, block_size, max_batch)
    times = torch.tensor([t for t, _ in res.cache_use], dtype=torch.float64)
    out = {}
    for st in res.requests:
        ts = [st.ttft]
        for gap in st.itl:
            ts.append(ts[-1] + gap)
        out[st.rid] = ([int((times - t).abs().argmin()) for t in ts], st.preempted)
    return out, res.steps, res.preemptions


def _check_scheduler(run: Run) -> None:
    from snippets.part8.serving import Request

    mod = run.module()
    require(mod, "admit", "make_room", "serve")
    for seed, n, num_blocks, block_size, max_batch in ((93, 12, 400, 16, 4), (94, 16, 30, 8, 8),
                                                      (95, 20, 24, 4, 6), (96, 10, 12, 16, 16)):
        rng = random.Random(seed)
        reqs = [(rng.randint(1, 40), rng.randint(1, 30)) for _ in range(n)]
        reqs = [(p, o) for p, o in reqs if -(-(p + o) // block_size) <= num_blocks]
        what = (f"{len(reqs)} requests, {num_blocks} blocks of {block_size}, batch {max_batch} "
                f"(seed {seed})")
        with run.case(what, hint="admit: while a slot is free and the head of the queue's blocks "
                                 "for its target fit, move it (break at the first that does not: "
                                 "first come, first served); make_room: on OutOfBlocks pop the "
                                 "last of running, free its blocks, set cached = 0 and target = "
                                 "prompt + generated, put it at the front of waiting"):
            trace = [Request(i, 0.0, p, o) for i, (p, o) in enumerate(reqs)]
            want, steps, preemptions = _book_token_steps(trace, num_blocks, block_size, max_batch)
            seqs, got_steps, got_pre = mod.serve(reqs, num_blocks, block_size, max_batch)
            for s in seqs:
                w_steps, w_pre = want[s.rid]
                if s.token_steps != w_steps:
                    pairs = enumerate(zip(s.token_steps, w_steps))
                    first = next((i for i, (a, b) in pairs if a != b),
                                 min(len(s.token_steps), len(w_steps)))
                    raise Failure(f"request {s.rid} (prompt {s.prompt}, output {s.output}): token "
                                  f"{first} at step {_at(s.token_steps, first)}, the book's "
                                  f"scheduler emits it at step {_at(w_steps, first)} (preempted "
                                  f"{s.preempted} time(s), the book: {w_pre})")
            compare.number("steps", got_steps, steps)
            compare.number("preemptions", got_pre, preemptions)


def _at(xs, i):
    return xs[i] if i < len(xs) else "(never)"


scheduler = Exercise(
    id="part8.serving.7", title="Continuous batching: admission and "
                                "preemption", difficulty=3, kind="python",
    files=("part8/scheduler.py",),
    task="Write the two decisions of a continuous-batching engine's step (the loop is given): "
         "admit, first come, first served, while a batch slot is free and the free blocks hold the "
         "waiting request's tokens to prefill; make_room, which gives each running sequence the "
         "block for its next token and, when none is free, preempts the latest admitted "
         "(recompute). The check replays traces through the book's simulator and compares the step "
         "of every token.",
    hint="grow(s, tokens, alloc, block_size) and release(s, alloc) are given; a preempted sequence "
         "is prefilled again over prompt + generated tokens",
    check=_check_scheduler,
    planted={"preempt_earliest": "the book's scheduler "
                                 "emits", "admit_skips_ahead": "the book's scheduler emits"},
)


# -------------------------------------------------------------------------------- leaving-python.6
def _onnx_error(exc: BaseException) -> str:
    """onnx's or onnxruntime's message on one line, without the source paths and C++ signatures."""
    import re

    text = " ".join(str(exc).split()).split(" ==> Context:")[0]
    return re.sub(r"/onnxruntime_src/\S+ (?:[\w:<>]+ )?[\w:<>]+\([^)]*\) ", "", text)[:500]


def _session(graph, optimised: bool):
    """An onnxruntime session on the CPU: the graph as written (every graph optimisation off), or
    as onnxruntime serves it by default (all of them on, fusions included)."""
    import onnx
    import onnxruntime as ort

    # onnx's make_model stamps the newest file format (IR version) the installed onnx knows, which an older
    # onnxruntime may refuse although it runs the opset; the graph needs no more than its opsets' minimum
    graph = onnx.ModelProto.FromString(graph.SerializeToString())
    graph.ir_version = min(graph.ir_version, onnx.helper.find_min_ir_version_for(list(graph.opset_import)))
    opts = ort.SessionOptions()
    opts.log_severity_level = 4                      # its errors come back as exceptions
    if not optimised:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    what = "optimised" if optimised else "as written, optimisations off"
    try:
        return ort.InferenceSession(graph.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"]), what
    except Exception as exc:  # noqa: BLE001 (the learner's graph: the message says why)
        raise Failure(f"onnxruntime ({what}) cannot load the graph: {_onnx_error(exc)}") from exc


def _run_head(session, what: str, x: torch.Tensor) -> torch.Tensor:
    try:
        return torch.from_numpy(session.run(["logits"], {"x": x.numpy()})[0])
    except Exception as exc:  # noqa: BLE001
        raise Failure(f"onnxruntime ({what}) fails on a batch of {x.shape[0]}: "
                      f"{_onnx_error(exc)}") from exc


def _dims(info) -> list:
    """A graph input's or output's declared dimensions: a number where fixed, else its name."""
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
            for d in info.type.tensor_type.shape.dim]


def _check_onnx_head(run: Run) -> None:
    from snippets.part8 import capstone as cp
    from snippets.part8.export_onnx import OPSET, missing

    if missing() is not None:
        raise Failure(f"{missing()}: this exercise builds its graph with onnx and runs it with "
                      "onnxruntime", hint='both are in the test extra: pip install -e ".[test]"')
    import onnx

    mod = run.module()
    require(mod, "head_graph")
    dim, vocab = cp.TINY.dim, cp.TINY.vocab
    models = [(cp.Llama(cp.TINY, seed=0), cp.EPS), (cp.Llama(cp.TINY, seed=1), 1e-3)]

    def book(m, eps, x):                     # the capstone's own head: its norm, its LM head
        return cp.OPS["torch"]["norm"](x, m.norm, eps) @ m.lm_head.T

    with run.case(f"head_graph() of the capstone's tiny model (dim {dim}, vocab {vocab}): a "
                  f"ModelProto at opset {OPSET} that onnx.checker accepts, shape inference "
                  "included",
                  hint=f"opset {OPSET}'s ReduceMean takes its axes as an attribute (opset 18 made "
                       "them an input); MatMul is x @ B, and lm_head is (vocab, dim) like a "
                       "Linear's weight: store its transpose"):
        graphs = [mod.head_graph(m.norm, m.lm_head, eps) for m, eps in models]
        for graph in graphs:
            if not isinstance(graph, onnx.ModelProto):
                raise Failure(f"head_graph returned a {type(graph).__name__}, not an "
                              "onnx.ModelProto (helper.make_model makes one)")
            opsets = {o.domain or "ai.onnx": o.version for o in graph.opset_import}
            if opsets.get("ai.onnx") != OPSET:
                raise Failure(f"the model imports opset {opsets.get('ai.onnx')} of the default "
                              f"domain, the book's is OPSET = {OPSET}")
            try:
                onnx.checker.check_model(graph, full_check=True)
            except Exception as exc:  # noqa: BLE001
                raise Failure(f"onnx.checker rejects the graph: {_onnx_error(exc)}") from exc
    graph = graphs[0].graph
    with run.case(f"the graph's boundary: x (batch, {dim}) in, logits (batch, {vocab}) out, "
                  "float32, the batch symbolic, the weights initializers",
                  hint="in make_tensor_value_info a string names a symbolic dimension and a "
                       "number fixes it: ['batch', dim]; a weight goes in the graph's initializer "
                       "list, not its inputs"):
        stored = {t.name for t in graph.initializer}
        inputs = [i for i in graph.input if i.name not in stored]
        if [i.name for i in inputs] != ["x"] or [o.name for o in graph.output] != ["logits"]:
            raise Failure(f"the graph's inputs are {[i.name for i in inputs]} and its outputs "
                          f"{[o.name for o in graph.output]}; expected ['x'] and ['logits'] (the "
                          "weights are stored in the file as initializers)")
        for info, size in ((inputs[0], dim), (graph.output[0], vocab)):
            kind = info.type.tensor_type.elem_type
            if kind != onnx.TensorProto.FLOAT:
                name = onnx.TensorProto.DataType.Name(kind)
                raise Failure(f"{info.name} has element type {name}, expected FLOAT (float32)")
            dims = _dims(info)
            if len(dims) != 2 or dims[1] != size:
                raise Failure(f"{info.name} is declared with shape {dims}, expected "
                              f"['batch', {size}]")
            if isinstance(dims[0], int):
                raise Failure(f"dimension 0 of {info.name} is fixed at {dims[0]}: the graph runs "
                              "for that batch only; a name (dim_param) makes it symbolic")
    g = torch.Generator().manual_seed(66)
    with run.case(f"as written (onnxruntime, optimisations off): batches of 1, 3 and {dim} rows "
                  "of size 1, the logits within 1e-5 of the capstone's norm and LM head",
                  hint="ReduceMean with keepdims=1 leaves (batch, 1), which broadcasts against "
                       "(batch, dim); keepdims=0 leaves (batch,), which broadcasts against the "
                       "last axis, the wrong one"):
        written = [_session(gr, optimised=False) for gr in graphs]
        for b in (1, 3, dim):
            x = torch.randn(b, dim, generator=g)
            close("logits", _run_head(*written[0], x), book(models[0][0], cp.EPS, x), 0, 1e-5)
    with run.case("as written: rows of size 1e-3 with eps 1e-6, and of size 0.03 with eps 1e-3 "
                  "(another model): their mean square comparable with eps",
                  hint="eps is added to the mean square inside the square root: Add, then Sqrt"):
        for (m, eps), (session, what), scale in zip(models, written, (1e-3, 0.03)):
            x = torch.randn(5, dim, generator=g) * scale
            close("logits", _run_head(session, what, x), book(m, eps, x), 0, 1e-5)
    with run.case("as onnxruntime serves it (all graph optimisations on): the same logits",
                  hint="the optimiser may replace the norm's nodes by one fused kernel: a graph is "
                       "right by what its operators mean, which the run as written checks"):
        for (m, eps), graph_, scale in zip(models, graphs, (1.0, 0.03)):
            session, what = _session(graph_, optimised=True)
            x = torch.randn(7, dim, generator=g) * scale
            close("logits", _run_head(session, what, x), book(m, eps, x), 0, 1e-5)


onnx_head = Exercise(
    id="part8.leaving-python.6", title="The model's head as an ONNX graph, written by hand",
    difficulty=3, kind="python", files=("part8/onnx_head.py",),
    task="Write the capstone's head, rmsnorm(x, model.norm) @ model.lm_head.T, as an ONNX graph "
         "with onnx.helper: input x, float32 (batch, dim) with a symbolic batch, output logits "
         "(batch, vocab), the weights as initializers, opset 17, RMSNorm from the operators the "
         "exporter writes for it (Pow, ReduceMean, Add, Sqrt, Div, Mul). The check runs it with "
         "onnxruntime, as written and optimised, against the capstone's norm and LM head within "
         "1e-5.",
    hint="const(name, value) makes an initializer; nodes are helper.make_node(op, inputs, "
         "outputs, **attributes), wired by tensor names; ReduceMean(axes=[-1], keepdims=1); store "
         "lm_head.T for MatMul; helper.make_graph(nodes, name, [x], [logits], initializer=...) and "
         "helper.make_model(graph, opset_imports=[helper.make_opsetid('', OPSET)])",
    check=_check_onnx_head,
    planted={"fixed_batch": "is fixed at", "lm_head_not_transposed": "matrix multiplication",
             "axes_as_input": "ReduceMean", "keepdims_dropped": "fails on a batch of 3",
             "eps_outside_sqrt": "comparable with eps"},
)

EXERCISES = [block_waste, decode_bytes, split_merge, int4_pack, int4_magic, spec_verify, paged_fork,
             scheduler, split_norm, onnx_head]
