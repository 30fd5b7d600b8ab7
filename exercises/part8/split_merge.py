"""part8.decode-attention.6: Split-KV decode: partial results merged by log-sum-exp

Chapter: docs/part8/decode-attention.md, exercise 6. Difficulty 2 of 4 (write a few lines).

Split-KV decoding cuts a sequence's n cached tokens into chunks; each chunk's program writes its
normalised output o_s = softmax(scores of the chunk) V_chunk and its log-sum-exp lse_s (natural
log), and a merge combines them. Write partial(q, k, v, start, end) for one chunk (an empty chunk
gives o_s = 0 and lse_s = -inf) and merge(o, lse), which must equal softmax(q K^T * scale) V over
all n tokens.

Check it:  python -m snippets exercise check part8.decode-attention.6
"""

import math  # noqa: F401 (for your code)

import torch


def partial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, end: int):
    """Chunk [start, end) of one query's attention. q (D,), k and v (n, D). Returns (o_s (D,),
    lse_s: a 0-d tensor): o_s the softmax over the chunk's tokens applied to their V rows, lse_s =
    log(sum over the chunk of exp(score)), with score = q . k_t / sqrt(D). Empty: (0, -inf)."""
    raise NotImplementedError("YOUR CODE HERE")


def merge(o: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """o (S, D) normalised chunk outputs, lse (S,) their log-sum-exps (-inf for an empty chunk, at
    least one chunk not empty). Each chunk's weight is its share of the whole softmax sum,
    exp(lse_s - M) / sum_s exp(lse_s - M) with M the largest lse (so no exp overflows)."""
    raise NotImplementedError("YOUR CODE HERE")
