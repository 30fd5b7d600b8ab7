"""Speculative decoding: the rejection sampler emits exactly the target's distribution. Checked two
ways for a vocabulary of 6 and fixed contexts: analytically (every branch of the sampler walked,
the first and second emitted tokens' joint distribution equal to the target's within 1e-12) and
by seeded sampling (Pearson's chi-square under a bound a correct sampler does not reach). Three
planted bugs fail both: p/q without the min, drawing from p instead of the residual at a
rejection, and the bonus token from the wrong position (visible only in the second token). Then
tokens per target pass against (1 - alpha^(k+1)) / (1 - alpha), by coin flips and through the
real sampler, and the cost model's break-even batch."""

from __future__ import annotations

import math

import pytest
import torch

from snippets.part8 import decode_model as dm
from snippets.part8 import speculative as sp
from snippets.part8.serving import TinyDecoder

BASE = TinyDecoder(vocab=6, hidden=16, layers=2, heads=2, ffn=32, seed=3)
TARGET = sp.LM(BASE)
DRAFT = sp.LM(sp.noisy_copy(BASE, 0.5))
CONTEXTS = [[1, 4, 2], [0]]
N = 10000     # samples per sampling check: well under a second each on a CPU


def _sample_two(k, variant, context, seed=0):
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(6, 6, dtype=torch.float64)
    for _ in range(N):
        toks, _ = sp.speculative_generate(TARGET, DRAFT, context, 2, k, g, variant)
        counts[toks[0], toks[1]] += 1
    return counts


# ---------------------------------------------------------------- the distribution, exactly

@pytest.mark.parametrize("k", [1, 2])     # k = 3: 6^3 paths per pass, slow on a CPU
@pytest.mark.parametrize("context", CONTEXTS)
def test_exact_distribution_is_the_targets(k, context):
    want = sp.target_two_tokens(TARGET, context)
    got = sp.first_two_tokens(TARGET, DRAFT, context, k)
    assert float(got.sum()) == pytest.approx(1.0, abs=1e-12)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    first = sp.pass_distribution(TARGET, DRAFT, context, k)
    assert max(len(t) for t in first) == k + 1 and min(len(t) for t in first) == 1


def test_the_draft_is_not_the_target():
    """Otherwise every check above would pass with any acceptance rule."""
    for context in CONTEXTS:
        p, q = TARGET.dists(context)[0], DRAFT.dists(context)[0]
        assert 0.5 < sp.acceptance_rate(p, q) < 0.99
        assert float((p / q).max()) > 1.4 and float((p / q).min()) < 0.7


@pytest.mark.parametrize("variant,k", [("resample_from_p", 1), ("resample_from_p", 2),
                                       ("bonus_off_by_one", 1)])
def test_exact_distribution_catches_planted_bugs(variant, k):
    want = sp.target_two_tokens(TARGET, CONTEXTS[0])
    got = sp.first_two_tokens(TARGET, DRAFT, CONTEXTS[0], k, variant)
    assert float((got - want).abs().max()) > 1e-2
    if variant == "bonus_off_by_one":                 # the first token alone looks right
        torch.testing.assert_close(got.sum(1), want.sum(1), rtol=0, atol=1e-12)


def test_no_min_is_refused():
    with pytest.raises(ValueError, match="without the min"):
        sp.first_two_tokens(TARGET, DRAFT, CONTEXTS[0], 2, "no_min")
    with pytest.raises(ValueError, match="no mass left"):
        _sample_two(2, "no_min", CONTEXTS[0])


# ---------------------------------------------------------------- the distribution, sampled

@pytest.mark.parametrize("k", [1, 2])
def test_sampled_distribution_passes_chi_square(k):
    want = sp.target_two_tokens(TARGET, CONTEXTS[0])
    stat, df = sp.chi_square(_sample_two(k, "exact", CONTEXTS[0]), want)
    assert df == 35 and stat < sp.chi_square_bound(df)


@pytest.mark.parametrize("variant,k", [("resample_from_p", 2), ("bonus_off_by_one", 1)])
def test_sampled_distribution_catches_planted_bugs(variant, k):
    want = sp.target_two_tokens(TARGET, CONTEXTS[0])
    stat, df = sp.chi_square(_sample_two(k, variant, CONTEXTS[0]), want)
    assert stat > 5 * sp.chi_square_bound(df)       # far past the bound, not near it


def test_chi_square_helpers():
    probs = torch.tensor([0.5, 0.5, 0.0])
    assert sp.chi_square(torch.tensor([50.0, 50.0, 0.0]), probs) == (0.0, 1)
    assert sp.chi_square(torch.tensor([50.0, 49.0, 1.0]), probs)[0] == math.inf
    assert sp.chi_square_bound(35) == pytest.approx(35 + 8 * math.sqrt(70))


# ---------------------------------------------------------------- the sampler's contract

def test_verify_shapes_and_edge_cases():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.0, 1.0, 0.0]] * 3, dtype=torch.float64)
    q = torch.tensor([[0.0, 1.0, 0.0]] * 2, dtype=torch.float64)
    assert sp.verify(p, q, [1, 1], g) == [1, 1, 1]     # p == q: all kept, plus the bonus
    q_wrong = torch.tensor([[1.0, 0.0, 0.0]] * 2, dtype=torch.float64)
    assert sp.verify(p, q_wrong, [0, 0], g) == [1]      # p(0) = 0: rejected, residual is p
    with pytest.raises(ValueError, match="need p"):
        sp.verify(p[:2], q, [1, 1], g)
    with pytest.raises(ValueError, match="variant"):
        sp.verify(p, q, [1, 1], g, "fast")


def test_speculative_generate_with_the_target_as_draft_keeps_everything():
    g = torch.Generator().manual_seed(1)
    toks, passes = sp.speculative_generate(TARGET, TARGET, [2, 3], 12, 3, g)
    assert passes == 3 and len(toks) == 12             # k + 1 tokens every pass
    with pytest.raises(ValueError, match="vocabularies differ"):
        sp.speculative_generate(TARGET, sp.LM(TinyDecoder(vocab=7)), [1], 2, 2, g)


# ---------------------------------------------------------------- tokens per pass, cost

@pytest.mark.parametrize("alpha,k", [(0.0, 4), (0.5, 1), (0.8, 4), (0.9, 7), (1.0, 3)])
def test_expected_tokens_against_simulation(alpha, k):
    want = sp.expected_tokens(alpha, k)
    assert want == pytest.approx(sum(alpha ** i for i in range(k + 1)))
    passes = 20000
    got = sp.simulate_tokens_per_pass(alpha, k, passes, seed=2)
    assert abs(got - want) < 6 * (k + 1) / 2 / math.sqrt(passes) + 1e-12   # sd <= (k + 1) / 2


def test_tokens_per_pass_through_the_real_sampler():
    """Context-free p and q: every guess is kept with probability alpha = sum min(p, q),
    independently, so the real sampler's mean must match the formula."""
    p = torch.tensor([0.5, 0.2, 0.2, 0.1], dtype=torch.float64)
    q = torch.tensor([0.3, 0.4, 0.1, 0.2], dtype=torch.float64)
    alpha, k, passes = sp.acceptance_rate(p, q), 3, 20000
    assert alpha == pytest.approx(0.7)
    g, total = torch.Generator().manual_seed(5), 0
    for _ in range(passes):
        drafts = torch.multinomial(q, k, replacement=True, generator=g).tolist()
        total += len(sp.verify(p.expand(k + 1, 4), q.expand(k, 4), drafts, g))
    assert abs(total / passes - sp.expected_tokens(alpha, k)) < 6 * 2 / math.sqrt(passes)


def test_expected_tokens_errors():
    with pytest.raises(ValueError, match="alpha"):
        sp.expected_tokens(1.5, 2)
    with pytest.raises(TypeError, match="expected_tokens: k"):
        sp.expected_tokens(0.5, 2.0)


DRAFT_CFG = dm.DecoderConfig(layers=16, hidden=2048, heads=32, kv_heads=8, head_dim=64,
                             ffn=8192, vocab=128256)


def test_speedup_falls_with_the_batch():
    bw, peak = 3e12, 8e14                               # nominal, not measured
    s = [sp.speculative_speedup(dm.LLAMA3_8B, DRAFT_CFG, b, 512, 4, 0.8, bw, peak)
         for b in (1, 16, 256, 1024)]
    assert s[0] > 2 and s == sorted(s, reverse=True) and s[-1] < 1
    b = sp.breakeven_batch(dm.LLAMA3_8B, DRAFT_CFG, 512, 4, 0.8, bw, peak)
    assert b is not None
    assert sp.speculative_speedup(dm.LLAMA3_8B, DRAFT_CFG, b, 512, 4, 0.8, bw, peak) <= 1
    assert sp.speculative_speedup(dm.LLAMA3_8B, DRAFT_CFG, b // 2, 512, 4, 0.8, bw, peak) > 1
    # a guess that is never kept costs k draft steps for one token: never pays
    assert sp.speculative_speedup(dm.LLAMA3_8B, DRAFT_CFG, 1, 512, 4, 0.0, bw, peak) < 1
