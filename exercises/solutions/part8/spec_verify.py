"""part8.speculative-decoding.7: The acceptance rule

The reference solution.

Chapter: docs/part8/speculative-decoding.md, exercise 7. Difficulty 3 of 4 (write most of it).

Write verify(p, q, drafts, gen), the rejection sampler of one speculative pass: keep guess i with
probability min(1, p_i(x) / q_i(x)); at the first rejection emit a token drawn from the residual
max(0, p_i - q_i), normalised, and stop; if all k guesses are kept, emit a bonus token drawn from
p_k. The check draws many passes with the book's tiny target and draft models and tests that the
first two emitted tokens follow the target's own distribution (Pearson's chi-square, fixed seed).

Check it:  python -m snippets exercise check part8.speculative-decoding.7
"""

import torch


def sample(dist: torch.Tensor, gen: torch.Generator) -> int:
    """One token drawn from the distribution ``dist`` (vocab,). Given."""
    return int(torch.multinomial(dist, 1, generator=gen))


def uniform(gen: torch.Generator) -> float:
    """A uniform draw in [0, 1). Given."""
    return float(torch.rand((), generator=gen, dtype=torch.float64))


def verify(p: torch.Tensor, q: torch.Tensor, drafts: list[int], gen: torch.Generator) -> list[int]:
    """The tokens one pass emits (1 to k + 1 of them). p (k + 1, vocab): the target's distributions
    after the context and after each guess; q (k, vocab): the draft's, from which drafts (k tokens)
    were drawn."""
    out = []
    for i, x in enumerate(drafts):
        if uniform(gen) < min(1.0, float(p[i, x] / q[i, x])):      # q[i, x] > 0: x was drawn
            out.append(int(x))
            continue
        r = torch.clamp(p[i] - q[i], min=0.0)                        # what acceptance did not give
        out.append(sample(r / r.sum(), gen))
        return out
    out.append(sample(p[len(drafts)], gen))                          # all kept: the bonus token
    return out
