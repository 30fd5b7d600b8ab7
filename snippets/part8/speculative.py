"""Speculative decoding: a small draft model guesses ``k`` tokens, the target model scores all of
them in one pass, and a rejection sampler keeps a prefix of the guesses, so that the tokens that
come out are distributed exactly as if the target had sampled them one by one (Leviathan et al.,
*Fast Inference from Transformers via Speculative Decoding*, 2023; Chen et al., *Accelerating
Large Language Model Decoding with Speculative Sampling*, 2023).

- :func:`verify`: the sampler. Draft token x at position i is kept with probability
  ``min(1, p_i(x) / q_i(x))``; at the first rejection a token is drawn from the residual
  ``normalize(max(0, p_i - q_i))`` and the pass ends; if all ``k`` are kept, a bonus token is
  drawn from ``p_k``, the target's distribution after the last guess.
- :func:`pass_distribution`: the exact distribution of what one pass emits, by walking every
  branch of the sampler with the same acceptance and residual functions; and the same for the
  first two emitted tokens, against the target's own.
- :func:`expected_tokens`: tokens per target pass, ``(1 - alpha^(k+1)) / (1 - alpha)``, and a cost
  model of when speculation stops paying as the batch grows (``serving.step_time``).

``variant`` plants the bugs the tests must catch: ``"no_min"`` (the acceptance probability p/q
without the min), ``"resample_from_p"`` (drawing from p at a rejection instead of the residual),
``"bonus_off_by_one"`` (the bonus drawn from p at the last guess's position, not after it).
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Sequence

import torch

from snippets._checks import check_int, check_scalar
from snippets.part8 import decode_model as dm
from snippets.part8.serving import TinyDecoder, step_time

VARIANTS = ("exact", "no_min", "resample_from_p", "bonus_off_by_one")


# --8<-- [start:models]
class LM:
    """A model as a sampler sees it: the next-token distribution after any context, at a
    temperature. ``dists(context, new)`` is one forward pass over ``context + new`` that returns
    the distributions after ``context`` and after each prefix of ``new``: (len(new) + 1, vocab).
    Distributions are remembered per context (the tests ask for the same ones many times)."""

    def __init__(self, model: TinyDecoder, temperature: float = 1.0) -> None:
        if not isinstance(model, TinyDecoder):
            raise TypeError(f"LM: model must be a TinyDecoder, got {type(model).__name__}")
        t = check_scalar("LM: temperature", temperature)
        if not (t > 0 and math.isfinite(t)):
            raise ValueError(f"LM: temperature must be positive and finite, got {temperature}")
        self.model, self.temperature, self.vocab = model, t, model.vocab
        self.passes = 0
        self._memo: dict[tuple[int, ...], torch.Tensor] = {}

    def dists(self, context: Sequence[int], new: Sequence[int] = ()) -> torch.Tensor:
        seq = tuple(context) + tuple(new)
        if not context:
            raise ValueError("LM.dists: the context is empty")
        keys = [seq[:len(context) + j] for j in range(len(new) + 1)]
        self.passes += 1
        if any(key not in self._memo for key in keys):
            empty = self.model.empty_kv()
            logits, _ = self.model.forward([list(seq)], [(empty, empty)], all_positions=True)
            probs = torch.softmax(logits.double() / self.temperature, -1)
            for j in range(len(seq)):                   # every prefix's, for free
                self._memo[seq[:j + 1]] = probs[j]
        return torch.stack([self._memo[key] for key in keys])


def noisy_copy(model: TinyDecoder, noise: float, seed: int = 1) -> TinyDecoder:
    """A draft model: the target's weights plus Gaussian noise of ``noise`` times each weight's
    scale. noise = 0 is the target itself (every guess accepted)."""
    noise = check_scalar("noisy_copy: noise", noise)
    if noise < 0:
        raise ValueError(f"noisy_copy: noise must be >= 0, got {noise}")
    g = torch.Generator().manual_seed(seed)
    out = copy.copy(model)                                # shares nothing it then changes
    for name in ("embed", "wq", "wk", "wv", "wo", "up", "down", "head"):
        w = getattr(model, name)
        eps = torch.randn(w.shape, generator=g, dtype=torch.float64).to(w)
        setattr(out, name, w + noise * w.std() * eps)
    return out
# --8<-- [end:models]


# --8<-- [start:sampler]
def accept_prob(p: torch.Tensor, q: torch.Tensor, variant: str = "exact") -> torch.Tensor:
    """The probability of keeping a guess whose target and draft probabilities are p and q.
    Where q = 0 (never guessed) the value is p: anything, as it is only ever multiplied by q."""
    ratio = p / torch.where(q > 0, q, torch.ones_like(q))
    return ratio if variant == "no_min" else torch.clamp(ratio, max=1.0)


def residual(p: torch.Tensor, q: torch.Tensor, variant: str = "exact") -> torch.Tensor:
    """Where a rejected guess's probability goes: p minus what acceptance already gave each
    token, a(x) q(x) = min(p(x), q(x)), normalised. Written with a(x), so that the min in the
    acceptance shows up here too."""
    if variant == "resample_from_p":
        return p
    r = torch.clamp(p - accept_prob(p, q, variant) * q, min=0.0)
    total = float(r.sum())
    if not total > 0:
        raise ValueError(f"residual: no mass left (sum {total}); an acceptance probability "
                         "above 1 gave away more than p?")
    return r / total


def _sample(dist: torch.Tensor, gen: torch.Generator) -> int:
    return int(torch.multinomial(dist, 1, generator=gen))


def verify(p: torch.Tensor, q: torch.Tensor, drafts: Sequence[int], gen: torch.Generator,
           variant: str = "exact") -> list[int]:
    """The tokens one pass emits. ``p`` (k + 1, vocab): the target's distributions after the
    context and after each guess; ``q`` (k, vocab): the draft's, from which ``drafts`` (k) were
    drawn. Keeps guesses while a uniform draw is below the acceptance probability, then draws
    from the residual; if every guess is kept, a bonus token from p[k]. 1 to k + 1 tokens."""
    k = len(drafts)
    if variant not in VARIANTS:
        raise ValueError(f"verify: variant must be one of {VARIANTS}, got {variant!r}")
    if p.shape[0] != k + 1 or q.shape[0] != k or p.shape[1:] != q.shape[1:] or p.dim() != 2:
        raise ValueError(f"verify: need p (k + 1, vocab) and q (k, vocab) for k = {k} drafts, "
                         f"got p {tuple(p.shape)}, q {tuple(q.shape)}")
    out = []
    for i, x in enumerate(drafts):
        a = accept_prob(p[i, x], q[i, x], variant)
        if float(torch.rand((), generator=gen, dtype=torch.float64)) < float(a):
            out.append(int(x))
            continue
        out.append(_sample(residual(p[i], q[i], variant), gen))
        return out
    out.append(_sample(p[k - 1] if variant == "bonus_off_by_one" and k else p[k], gen))
    return out


def speculative_generate(target: LM, draft: LM, prompt: Sequence[int], n: int, k: int,
                         gen: torch.Generator, variant: str = "exact") -> tuple[list[int], int]:
    """At least ``n`` new tokens (the last pass may overshoot; the caller keeps the first n):
    each pass draws k guesses from the draft one at a time, scores them with one target pass
    and verifies. Returns the tokens and the number of target passes."""
    check_int("speculative_generate: n", n, 1)
    check_int("speculative_generate: k", k, 1)
    if target.vocab != draft.vocab:
        raise ValueError(f"speculative_generate: vocabularies differ ({target.vocab} and "
                         f"{draft.vocab})")
    seq, passes = list(prompt), 0
    while len(seq) - len(prompt) < n:
        drafts, qs = [], []
        for _ in range(k):
            qs.append(draft.dists(seq + drafts)[0])
            drafts.append(_sample(qs[-1], gen))
        p = target.dists(seq, drafts)                    # one pass: k + 1 distributions
        seq += verify(p, torch.stack(qs), drafts, gen, variant)
        passes += 1
    return seq[len(prompt):], passes
# --8<-- [end:sampler]


# --8<-- [start:exact]
def pass_distribution(target: LM, draft: LM, context: Sequence[int], k: int,
                      variant: str = "exact") -> dict[tuple[int, ...], float]:
    """The exact distribution of what one pass emits from ``context``: a probability for every
    tuple of 1 to k + 1 tokens, by walking every branch of :func:`verify` (vocab^k draft paths)
    with its own acceptance and residual functions."""
    out: dict[tuple[int, ...], float] = {}

    def walk(drafts: tuple[int, ...], prob: float) -> None:
        p = target.dists(list(context) + list(drafts))[0]
        if len(drafts) == k:                              # all kept: the bonus token
            bonus = target.dists(list(context) + list(drafts[:-1]))[0] if (
                variant == "bonus_off_by_one") else p
            for y in range(target.vocab):
                out[drafts + (y,)] = out.get(drafts + (y,), 0.0) + prob * float(bonus[y])
            return
        q = draft.dists(list(context) + list(drafts))[0]
        a = accept_prob(p, q, variant)
        if float(a.max()) > 1:
            raise ValueError(f"pass_distribution: acceptance probability {float(a.max()):.3f} > 1 "
                             "(p/q without the min is not a probability)")
        for x in range(target.vocab):
            if float(q[x] * a[x]) > 0:
                walk(drafts + (x,), prob * float(q[x] * a[x]))
        rejected = float((q * (1 - a)).sum())
        if rejected > 0:
            r = residual(p, q, variant)
            for y in range(target.vocab):
                out[drafts + (y,)] = out.get(drafts + (y,), 0.0) + prob * rejected * float(r[y])

    walk((), 1.0)
    return out


def first_two_tokens(target: LM, draft: LM, context: Sequence[int], k: int,
                     variant: str = "exact") -> torch.Tensor:
    """The exact joint distribution (vocab, vocab) of the first two tokens speculative decoding
    emits from ``context``: from one pass when it emits two or more, else the first token of the
    next pass from the longer context."""
    V = target.vocab
    joint = torch.zeros(V, V, dtype=torch.float64)
    for toks, w in pass_distribution(target, draft, context, k, variant).items():
        if len(toks) >= 2:
            joint[toks[0], toks[1]] += w
        else:
            nxt = pass_distribution(target, draft, list(context) + list(toks), k, variant)
            for more, w2 in nxt.items():
                joint[toks[0], more[0]] += w * w2
    return joint


def target_two_tokens(target: LM, context: Sequence[int]) -> torch.Tensor:
    """What the target alone would emit: p(x | context) p(y | context, x)."""
    p1 = target.dists(context)[0]
    return torch.stack([p1[x] * target.dists(list(context) + [x])[0] for x in range(target.vocab)])
# --8<-- [end:exact]


# --8<-- [start:chi2]
def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic of observed ``counts`` against expected ``probs`` (same shape), over
    the cells with positive probability, and its degrees of freedom (cells - 1). A count in a
    cell of probability zero is an impossible outcome: infinity."""
    n = float(counts.sum())
    pos = probs > 0
    if bool((counts[~pos] > 0).any()):
        return math.inf, int(pos.sum()) - 1
    e = n * probs[pos]
    return float(((counts[pos] - e) ** 2 / e).sum()), int(pos.sum()) - 1


def chi_square_bound(df: int, sigmas: float = 8.0) -> float:
    """A threshold the statistic of a correct sampler stays under for any seed we would pick:
    mean df plus ``sigmas`` standard deviations sqrt(2 df). At the 35 degrees of freedom of the
    tests a correct sampler exceeds it with probability about 2e-8 (the regularised upper
    incomplete gamma function, torch.special.gammaincc(df / 2, bound / 2))."""
    return df + sigmas * math.sqrt(2 * df)
# --8<-- [end:chi2]


# --8<-- [start:expected]
def acceptance_rate(p: torch.Tensor, q: torch.Tensor) -> float:
    """The probability that a guess drawn from q is kept: sum_x q(x) min(1, p(x)/q(x)) =
    sum_x min(p(x), q(x)) = 1 - the total-variation distance between p and q."""
    return float(torch.minimum(p, q).sum())


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens emitted per target pass when each guess is kept with probability ``alpha``
    independently: 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)."""
    alpha = check_scalar("expected_tokens: alpha", alpha)
    check_int("expected_tokens: k", k, 0)
    if not 0 <= alpha <= 1:
        raise ValueError(f"expected_tokens: alpha must be in [0, 1], got {alpha}")
    return k + 1.0 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def simulate_tokens_per_pass(alpha: float, k: int, passes: int, seed: int = 0) -> float:
    """The same count by simulation: per pass, keep guesses while a coin of ``alpha`` says yes,
    plus the one token every pass emits (the residual draw or the bonus)."""
    expected_tokens(alpha, k)                              # checks alpha and k
    check_int("simulate_tokens_per_pass: passes", passes, 1)
    rng, total = random.Random(seed), 0
    for _ in range(passes):
        kept = 0
        while kept < k and rng.random() < alpha:
            kept += 1
        total += kept + 1
    return total / passes
# --8<-- [end:expected]


# --8<-- [start:cost]
def speculative_speedup(target: dm.DecoderConfig, draft: dm.DecoderConfig, batch: int,
                        context: int, k: int, alpha: float, bandwidth: float,
                        peak_flops: float) -> float:
    """Tokens per second with speculation over tokens per second without, for ``batch``
    sequences of ``context`` tokens, on the roofline of :func:`serving.step_time`. Without:
    one target decode step per token. With: k draft decode steps, one target pass over k + 1
    tokens per sequence (a chunk from ``context``), and ``expected_tokens(alpha, k)`` tokens."""
    check_int("speculative_speedup: batch", batch, 1)
    check_int("speculative_speedup: context", context, 0)
    plain = step_time(target, [context] * batch, [], bandwidth, peak_flops)
    verify_t = step_time(target, [], [(context, k + 1)] * batch, bandwidth, peak_flops)
    drafting = sum(step_time(draft, [context + j] * batch, [], bandwidth, peak_flops)
                   for j in range(k))
    return expected_tokens(alpha, k) * plain / (verify_t + drafting)


def breakeven_batch(target: dm.DecoderConfig, draft: dm.DecoderConfig, context: int, k: int,
                    alpha: float, bandwidth: float, peak_flops: float,
                    batches: Sequence[int] = tuple(2 ** i for i in range(11))) -> int | None:
    """The first batch in ``batches`` at which speculation no longer pays (speedup <= 1), or
    None if it pays at all of them."""
    for b in batches:
        if speculative_speedup(target, draft, b, context, k, alpha, bandwidth, peak_flops) <= 1:
            return b
    return None
# --8<-- [end:cost]
